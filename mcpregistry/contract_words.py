"""A tool contract in words, for a reader who did not write it (a version's frozen contracts, an auditor): its
arguments, the result it promises, what happens on failure, and the rest, in the contract editor's terms."""

from __future__ import annotations

from typing import Any

from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from mcpregistry.contract_form import RETRY_REASON_LABELS, TYPE_LABELS, allowed_text
from mcpregistry.contracts import DEFAULT_RETRY
from mcpregistry.models import ToolContract


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _items(n: int) -> str:
    return ngettext("at most %(n)s item", "at most %(n)s items", n) % {"n": n}


def _range(low: Any, high: Any) -> str:
    if low is not None and high is not None:
        return _("%(low)s to %(high)s") % {"low": _number(low), "high": _number(high)}
    if low is not None:
        return _("at least %(n)s") % {"n": _number(low)}
    if high is not None:
        return _("at most %(n)s") % {"n": _number(high)}
    return ""


def argument_words(name: str, spec: Any) -> str:
    """``region: text (str), required, one of: busan, jeju`` — an argument's constraints, in the editor's order."""
    if not isinstance(spec, dict):
        return name
    words = [str(TYPE_LABELS.get(spec["type"], spec["type"]))] if spec.get("type") else []
    words.append(_("required") if spec.get("required") else _("optional"))
    if isinstance(spec.get("allowed"), list):
        words.append(_("one of: %(values)s") % {"values": allowed_text(spec["allowed"])})
    if spec.get("min") is not None or spec.get("max") is not None:
        words.append(_range(spec.get("min"), spec.get("max")))
    if spec.get("min_length") is not None:
        words.append(_("at least %(n)s long") % {"n": spec["min_length"]})
    if spec.get("max_length") is not None:
        words.append(_("at most %(n)s long") % {"n": spec["max_length"]})
    if spec.get("pattern"):
        words.append(_("matches %(pattern)s") % {"pattern": spec["pattern"]})
    if spec.get("allowed_hosts"):
        words.append(_("hosts: %(hosts)s") % {"hosts": ", ".join(map(str, spec["allowed_hosts"]))})
    return f"{name}: {', '.join(words)}"


def result_words(returns: Any) -> list[str]:
    """What the result must be: its type, required keys, not empty, size limits, and each constrained field."""
    if not isinstance(returns, dict) or not returns:
        return [_("no constraint")]
    lines: list[str] = []
    head = [str(TYPE_LABELS.get(returns["type"], returns["type"]))] if returns.get("type") else []
    if returns.get("required"):
        head.append(_("keys %(keys)s required") % {"keys": ", ".join(map(str, returns["required"]))})
    if returns.get("non_empty"):
        head.append(_("not empty"))
    if returns.get("max_items") is not None:
        head.append(_items(returns["max_items"]))
    if returns.get("max_chars") is not None:
        head.append(
            ngettext("at most %(n)s character", "at most %(n)s characters", returns["max_chars"])
            % {"n": returns["max_chars"]}
        )
    if head:
        lines.append(", ".join(head))
    for key, field in (returns.get("fields") or {}).items():
        if not isinstance(field, dict):
            continue
        parts = [str(TYPE_LABELS.get(field["type"], field["type"]))] if field.get("type") else []
        if field.get("non_empty"):
            parts.append(_("not empty"))
        if field.get("max_items") is not None:
            parts.append(_items(field["max_items"]))
        if field.get("min") is not None or field.get("max") is not None:
            parts.append(_range(field.get("min"), field.get("max")))
        lines.append(f"{key}: {', '.join(parts) or _('any')}")
    return lines or [_("no constraint")]


def failure_words(contract: ToolContract) -> list[str]:
    """Retries (attempts, on which failures, backoff), the timeout, and the fallback with its policy."""
    retry = {**DEFAULT_RETRY, **(contract.retry or {})}
    attempts = int(retry["max_attempts"])
    if attempts <= 1:
        lines = [_("one attempt, no retry")]
    else:
        on = ", ".join(str(RETRY_REASON_LABELS.get(r, r)) for r in retry.get("on") or []) or "—"
        lines = [
            _("up to %(n)s attempts on %(on)s (backoff %(base)s–%(cap)s s)")
            % {
                "n": attempts,
                "on": on,
                "base": _number(retry["backoff_base_s"]),
                "cap": _number(retry["backoff_cap_s"]),
            }
        ]
    if contract.timeout_s is not None:
        lines.append(_("timeout %(s)s s") % {"s": _number(contract.timeout_s)})
    else:
        lines.append(_("timeout: the server's"))
    if contract.fallback_tool:
        lines.append(
            _("fallback: %(tool)s (%(policy)s)")
            % {"tool": contract.fallback_tool, "policy": contract.get_fallback_policy_display()}
        )
    return lines


def other_words(contract: ToolContract) -> list[str]:
    """Memo, idempotency, the correction cap and the unknown-argument policy."""
    lines = [_("memoized within a run") if contract.memo else _("not memoized")]
    if contract.memo_ttl_s:
        lines.append(_("reused across runs for %(s)s s") % {"s": contract.memo_ttl_s})
    if contract.idempotency_arg:
        lines.append(_("idempotency key in %(arg)s") % {"arg": contract.idempotency_arg})
    lines.append(_("%(n)s argument corrections per run") % {"n": contract.correction_cap})
    lines.append(_("unknown arguments: %(policy)s") % {"policy": contract.get_unknown_args_display()})
    return lines
