"""A tool contract as an entry of the configuration document: what ``export_config`` writes, ``import_config``
reads and the contract editor's JSON view shows. One shape, defined once, so the three cannot drift apart."""

from __future__ import annotations

from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidatorFunctionWrapHandler, model_validator

from mcpregistry.contracts import ArgSpec, RetrySpec, ReturnsSpec
from mcpregistry.models import CORRECTION_CAP_MAX, INT32_MAX, ToolContract


class ContractSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mcp_id: str
    tool: str
    args: dict[str, ArgSpec] = Field(default_factory=dict)
    unknown_args: Literal["refuse", "drop"] = "refuse"
    returns: ReturnsSpec = Field(default_factory=ReturnsSpec)
    retry: RetrySpec | None = None
    timeout_s: float | None = Field(default=None, gt=0, le=3600)
    fallback: str | None = None
    fallback_policy: Literal["suggest", "call"] = "suggest"
    risk: Literal["read", "write"] = "read"
    memo: bool = True
    memo_ttl_s: int | None = Field(default=None, ge=0, le=INT32_MAX)  # what every database column holds
    idempotency_arg: str = ""
    correction_cap: int = Field(default=3, ge=0, le=CORRECTION_CAP_MAX)
    # The entry as given (``contract_fields`` keeps its numbers as written).
    _given: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _keep_given(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> ContractSpec:
        spec = cast(ContractSpec, handler(data))
        if isinstance(data, dict):
            spec._given = data
        return spec


def contract_entry(contract: ToolContract) -> dict[str, Any]:
    """The contract as a document entry (``export_config``'s ``contracts[]``)."""
    return {
        "mcp_id": contract.tool.server.mcp_id,
        "tool": contract.tool.name,
        "args": contract.args,
        "unknown_args": contract.unknown_args,
        "returns": contract.returns,
        "retry": contract.retry,
        "timeout_s": contract.timeout_s,
        "fallback": contract.fallback_tool or None,
        "fallback_policy": contract.fallback_policy,
        "risk": contract.risk,
        "memo": contract.memo,
        "memo_ttl_s": contract.memo_ttl_s,
        "idempotency_arg": contract.idempotency_arg,
        "correction_cap": contract.correction_cap,
    }


def contract_fields(spec: ContractSpec) -> dict[str, Any]:
    """The contract's field values a document entry sets (``import_config`` and the editor's JSON view)."""

    def as_written(name: str, dumped: Any) -> Any:
        return _numbers_as_given(dumped, spec._given.get(name))

    return {
        # What the entry gives, no more: a key left out stays out ("required": false was added to every argument
        # that lacked it), as does a null (no limit).
        "args": as_written(
            "args", {k: v.model_dump(exclude_unset=True, exclude_none=True) for k, v in spec.args.items()}
        ),
        "unknown_args": spec.unknown_args,
        "returns": as_written("returns", spec.returns.model_dump(exclude_unset=True, exclude_none=True)),
        "retry": as_written("retry", spec.retry.model_dump(exclude_unset=True) if spec.retry else {}),
        "timeout_s": spec.timeout_s,
        "fallback_tool": spec.fallback or "",
        "fallback_policy": spec.fallback_policy,
        "risk": spec.risk,
        "memo": spec.memo,
        "memo_ttl_s": spec.memo_ttl_s,
        "idempotency_arg": spec.idempotency_arg,
        "correction_cap": spec.correction_cap,
    }


def _numbers_as_given(dumped: Any, given: Any) -> Any:
    """``dumped`` (a validated value) with each whole number as ``given`` wrote it: a limit is a float field
    (``min``, ``max``, ``backoff_base_s``), so 1 came back as 1.0, and an installation's own export changed its text
    on a round trip (the schema's ``minimum: 1``, typed in the editor as 1)."""
    if isinstance(dumped, dict) and isinstance(given, dict):
        return {key: _numbers_as_given(value, given.get(key)) for key, value in dumped.items()}
    if isinstance(dumped, list) and isinstance(given, list) and len(dumped) == len(given):
        return [_numbers_as_given(value, item) for value, item in zip(dumped, given, strict=True)]
    if isinstance(dumped, float) and type(given) is int and dumped == given:
        return given
    return dumped
