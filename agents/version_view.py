"""A published version's frozen content as a reviewer reads it: the agent's settings by their labels, the bound
servers, the rules in order (in ``agents.rule_summary``'s words) and each tool's contract in words
(``mcpregistry.contract_words``); the content as frozen (JSON) folded beneath. Characters that do not show
themselves are written out everywhere on it (``⟦U+202E⟧``, ``audit.visible``), as on the run page. Also which of
its tools' frozen contracts no longer fit what their servers take now (``version_stale_tools``), which its page
warns of and its runs are not offered (``agents.engine``)."""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import FieldDoesNotExist
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import capfirst
from django.utils.translation import gettext as _
from django.utils.translation import pgettext

from agents.models import Agent
from agents.rule_summary import conditions_html, parameters_html, summary_lines, target_html
from agents.versions import flatten_leaves, version_contracts, version_rules
from audit.visible import visible_text
from mcpregistry.contract_words import argument_words, failure_words, other_words, result_words
from mcpregistry.contracts import contract_out_of_date
from mcpregistry.list_fields import value_text
from mcpregistry.models import McpTool, ToolContract


def version_stale_tools(content: Any) -> list[str]:
    """The tools of a version's ``content`` (``server/tool``, as its contracts are keyed) whose frozen contract no
    longer fits the tool's input schema (``contract_out_of_date``), sorted: its runs are not offered them. A tool
    its servers no longer have is none of them (no run is offered it either)."""
    contracts = content.get("contracts") if isinstance(content, dict) else None
    if not isinstance(contracts, dict) or not contracts:
        return []
    servers = [str(mcp_id) for mcp_id in content.get("servers") or []]
    stale = []
    for tool in McpTool.objects.filter(server__mcp_id__in=servers).select_related("server"):
        frozen = contracts.get(f"{tool.server.mcp_id}/{tool.name}")
        if isinstance(frozen, dict) and contract_out_of_date(frozen.get("args"), tool.input_schema):
            stale.append(f"{tool.server.mcp_id}/{tool.name}")
    return sorted(stale)


def visible_content(value: Any) -> Any:
    """``value`` (a version's content, or a part of it) as a reviewer is shown it: each text in it, keys included,
    with the characters that do not show themselves written out (``audit.visible.visible_text``). A prompt ending
    in tag characters otherwise reads as the one before it, and a direction override turns a rule's name or
    template around. For showing only: the stored content, its digest and the diff keep the characters."""
    if isinstance(value, str):
        return visible_text(value)
    if isinstance(value, dict):
        return {visible_content(key): visible_content(child) for key, child in value.items()}
    if isinstance(value, list):
        return [visible_content(child) for child in value]
    return value


def setting_html(name: str, value: Any) -> SafeString | str:
    """One frozen setting: a choice by its label (with its code), a switch in words, text as written (lines
    kept), an object as ``key = value`` lines; ``—`` when empty."""
    try:
        field = Agent._meta.get_field(name)
    except FieldDoesNotExist:
        field = None
    if value in (None, "", {}, []):
        return "—"
    if isinstance(value, bool):
        return _("yes") if value else _("no")
    if isinstance(value, dict):
        return summary_lines([("", f"{key} = {value_text(child)}") for key, child in flatten_leaves(value).items()])
    if not isinstance(value, str):
        return value_text(value)
    choices = dict(field.flatchoices) if field is not None and getattr(field, "choices", None) else {}
    if value in choices and str(choices[value]) != value:
        return format_html("{} <code>{}</code>", choices[value], value)
    return format_html('<div class="version-text">{}</div>', value)


def _label(name: str) -> str:
    try:
        return str(capfirst(Agent._meta.get_field(name).verbose_name))
    except FieldDoesNotExist:
        return name


def _contract_lines(contract: ToolContract) -> SafeString:
    """A frozen contract as labelled lines: arguments (one each), result, on failure, and the rest."""
    arguments = [argument_words(name, spec) for name, spec in (contract.args or {}).items()]
    groups = [
        (_("arguments:"), arguments or [_("none")]),
        (_("result:"), result_words(contract.returns)),
        (_("on failure:"), failure_words(contract)),
        (_("also:"), other_words(contract)),
    ]
    return summary_lines([(label, " · ".join(lines)) for label, lines in groups])


def _frozen_json(content: Any) -> str:
    return visible_text(json.dumps(content, ensure_ascii=False, indent=2, sort_keys=True, default=str))


def content_html(frozen: Any) -> SafeString:
    """The version page's content: ``frozen`` (a version's content) in words, every text as ``visible_content``
    shows it, and its JSON, with the same characters written out, folded beneath."""
    if not isinstance(frozen, dict):
        return format_html("<pre>{}</pre>", _frozen_json(frozen))
    content = visible_content(frozen)
    settings = content.get("agent") if isinstance(content.get("agent"), dict) else {}
    settings_rows = format_html_join(
        "", "<tr><th>{}</th><td>{}</td></tr>", ((_label(name), setting_html(name, v)) for name, v in settings.items())
    )
    servers = ", ".join(content.get("servers") or []) or "—"
    rules = version_rules(content)
    rule_rows = format_html_join(
        "",
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        (
            (i, rule.name, target_html(rule), conditions_html(rule), parameters_html(rule))
            for i, rule in enumerate(rules, start=1)
        ),
    )
    contracts = version_contracts(content)
    contract_rows = format_html_join(
        "",
        "<tr><td><code>{}</code><br>{}</td><td>{}</td></tr>",
        ((key, contract.get_risk_display(), _contract_lines(contract)) for key, contract in contracts.items()),
    )
    return format_html(
        '<div class="version-content">'
        '<h3>{}</h3><table class="version-table">{}</table>'
        "<h3>{}</h3><p>{}</p>"
        '<h3>{}</h3><table class="version-table version-rules"><thead><tr><th>#</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th>'
        "</tr></thead><tbody>{}</tbody></table>"
        '<h3>{}</h3><table class="version-table version-contracts"><thead><tr><th>{}</th><th>{}</th></tr></thead>'
        "<tbody>{}</tbody></table>"
        '<details class="version-json"><summary>{}</summary><pre>{}</pre></details></div>',
        _("settings"),
        settings_rows,
        _("MCP servers"),
        servers,
        _("rules, in order"),
        _("name"),
        pgettext("what a rule calls", "calls"),
        _("when"),
        _("with"),
        rule_rows or format_html('<tr><td colspan="5">{}</td></tr>', _("no rules")),
        _("tool contracts"),
        _("tool and risk"),
        _("contract"),
        contract_rows or format_html('<tr><td colspan="2">{}</td></tr>', _("no tools")),
        _("the content as frozen (JSON)"),
        _frozen_json(frozen),
    )
