"""The MCP SDK's client session, with its check of a tool's structured result made once per output schema.

``mcp.ClientSession.call_tool`` checks a result's ``structuredContent`` against the tool's ``outputSchema`` with
``jsonschema.validate``, which first checks the schema itself against the JSON Schema metaschema: about 3 ms of
CPU on every call, more than the call itself over a live session. :class:`ClientSession` here does the same check
with a validator made once per schema (the schema checked then), so each call costs only the check of its result.
What is refused is what the SDK refuses; the error raised is a ``RuntimeError`` as the SDK's, of the kind
:class:`ToolResultInvalid`, with a short message (the SDK's repeats the whole result and schema). Where the tools
list that the check reads first cannot be had, the answer is taken unchecked rather than failed: the call was
answered, and its failure would read as a request never sent.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from typing import Any

from jsonschema import SchemaError, ValidationError
from jsonschema.exceptions import best_match
from jsonschema.validators import validator_for
from mcp import ClientSession as SdkClientSession
from mcp import types
from referencing import Registry
from referencing.exceptions import Unresolvable

logger = logging.getLogger(__name__)

_MAX_VALIDATORS = 512
_validators: OrderedDict[str, Any] = OrderedDict()
_validators_lock = threading.Lock()


def output_validator(schema: dict[str, Any]) -> Any:
    """A validator for ``schema`` (its own draft, or the latest; ``$ref``s resolve within the schema document and
    the bundled metaschemas, as in the SDK), made once per schema and kept (up to ``_MAX_VALIDATORS``). Raises
    ``SchemaError`` for a schema that is not valid JSON Schema, each time it is asked for."""
    key = json.dumps(schema, sort_keys=True, ensure_ascii=False, default=str)
    with _validators_lock:
        validator = _validators.get(key)
        if validator is not None:
            _validators.move_to_end(key)
            return validator
    cls = validator_for(schema)
    cls.check_schema(schema)
    validator = cls(schema, registry=Registry())
    with _validators_lock:
        _validators[key] = validator
        while len(_validators) > _MAX_VALIDATORS:
            _validators.popitem(last=False)
    return validator


class ToolResultInvalid(RuntimeError):
    """A tool answered with structured content its own ``outputSchema`` refuses (or without the structured content
    it promised, or under a schema that is no JSON Schema): the tool answered, its answer is not what it said. A
    ``RuntimeError`` as the SDK raises it; the gate reads it as ``result:shape``."""


class ClientSession(SdkClientSession):
    async def _validate_tool_result(self, name: str, result: types.CallToolResult) -> None:
        """The SDK's check (``mcp.ClientSession._validate_tool_result``) with a validator kept per schema."""
        if name not in self._tool_output_schemas:
            try:
                await self.list_tools()  # refresh output schema cache, as the SDK does
            except Exception as exc:  # noqa: BLE001 - the call was answered whatever befalls this second request
                # The server ended the session (a 404), or its stream closed, after it answered the call: that must
                # not read as the call's own failure, which the pool would take for a request never sent (and send
                # a write again). The answer stands, unchecked against a schema that could not be read; the
                # contract's own result checks still apply.
                logger.warning("Tool %s answered; its output schema could not be read to check it (%s)", name, exc)
                return
        output_schema = None
        if name in self._tool_output_schemas:
            output_schema = self._tool_output_schemas.get(name)
        else:
            logger.warning(f"Tool {name} not listed by server, cannot validate any structured content")
        if output_schema is None:
            return
        if result.structuredContent is None:
            raise ToolResultInvalid(f"Tool {name} has an output schema but did not return structured content")
        try:
            error = best_match(output_validator(output_schema).iter_errors(result.structuredContent))
            if error is not None:
                raise error
        except ValidationError as e:
            # The error's own message and where it is (not its whole text, which repeats the result and the schema).
            where = "/".join(str(step) for step in e.absolute_path) or "(the result)"
            raise ToolResultInvalid(
                f"Invalid structured content returned by tool {name}: {e.message} (at {where})"
            ) from e
        except SchemaError as e:
            raise ToolResultInvalid(f"Invalid schema for tool {name}: {e.message}") from e
        except Unresolvable as e:
            raise ToolResultInvalid(f"Invalid schema for tool {name}: {e}") from e
