"""A deterministic rule at a glance, in the reader's language: what it calls, when (each condition named as the
rule editor names it), with which parameters, and what else it does (answers from a template, steers the
model's first tool). The agent's page and the rules list show rules this way; the rule editor changes them.
"""

from __future__ import annotations

from typing import Any

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext

from agents.deterministic import RuleSpec
from agents.models import DeterministicRule
from agents.rule_form import value_text


def _pairs(mapping: Any) -> str:
    if not isinstance(mapping, dict):
        return value_text(mapping)
    return ", ".join(f"{key} = {value_text(value)}" for key, value in mapping.items())


def _words(value: Any) -> str:
    """A keyword list as the rule editor shows it; anything else stored there as it is."""
    return ", ".join(map(str, value)) if isinstance(value, list) else value_text(value)


def summary_lines(lines: list[tuple[str, Any]]) -> SafeString:
    """``(label, text)`` pairs as the summaries' list, a line each: the label quiet, then the text (a line without
    a label is the text alone)."""
    items = (
        format_html('<li><span class="rule-summary-key">{}</span> {}</li>', key, text)
        if key
        else format_html("<li>{}</li>", text)
        for key, text in lines
    )
    return format_html('<ul class="rule-summary">{}</ul>', format_html_join("", "{}", ((item,) for item in items)))


def target_html(rule: DeterministicRule | RuleSpec) -> SafeString:
    """``sds-company-data · search_employee``, or the code rule's function (a rule row, or a version's frozen
    ``RuleSpec``)."""
    if rule.code:
        return format_html("{} <code>{}</code>", gettext("code rule"), rule.code)
    if isinstance(rule, RuleSpec):
        server = rule.mcp_id or "—"
    else:
        server = rule.server.mcp_id if rule.server_id is not None and rule.server is not None else "—"
    return format_html("{} · {}", server, rule.tool_name or "—")


def conditions_html(rule: DeterministicRule | RuleSpec) -> SafeString:
    """Each condition of ``when`` on a line, all of which must hold; "always" when there is none."""
    when = rule.when if isinstance(rule.when, dict) else {}
    lines: list[tuple[str, Any]] = []
    if when.get("all_keywords"):
        lines.append((gettext("all of these keywords:"), _words(when["all_keywords"])))
    if when.get("any_keywords"):
        lines.append((gettext("any of these keywords:"), _words(when["any_keywords"])))
    if when.get("regex"):
        lines.append((gettext("regex:"), format_html("<code>{}</code>", when["regex"])))
    if when.get("context"):
        lines.append((gettext("context equals:"), _pairs(when["context"])))
    if when.get("data"):
        lines.append((gettext("A2A data:"), _pairs(when["data"])))
    if when.get("tool_available"):
        lines.append((gettext("only when this tool is available:"), when["tool_available"]))
    known = {"all_keywords", "any_keywords", "regex", "context", "data", "tool_available"}
    lines += [(f"{key}:", value_text(value)) for key, value in when.items() if key not in known]
    if rule.code:
        return format_html('<span class="rule-summary-key">{}</span>', gettext("decided by the code rule"))
    if not lines:
        return format_html('<span class="rule-summary-key">{}</span>', gettext("always (no condition)"))
    return summary_lines(lines)


def parameters_html(rule: DeterministicRule | RuleSpec) -> SafeString:
    """The tool's arguments as the rule fills them (``name = {match.name}``), and what else the rule does."""
    params = rule.params
    lines: list[tuple[str, Any]] = []
    if isinstance(params, dict):
        lines += [(f"{name} =", value_text(value)) for name, value in params.items()]
    elif params:
        lines.append(("", value_text(params)))
    if rule.answer_template:
        lines.append((gettext("answers:"), rule.answer_template))
    if rule.force_first_tool:
        lines.append((gettext("the model's first tool:"), rule.force_first_tool))
    if not lines:
        return format_html('<span class="rule-summary-key">{}</span>', "—")
    return summary_lines(lines)
