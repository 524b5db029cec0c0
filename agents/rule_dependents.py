"""The enabled rules a tool or server switched off, or deleted, leaves failing: the receiver of
``mcpregistry.signals.tool_rules_check`` (connected in ``AgentsConfig.ready``), which the registry's admin pages ask
(mcpregistry cannot import agents).

A rule is not refused a tool that runs cannot call, and a tool's or server's page does not refuse switching it off
or deleting it for its rules: the deterministic stage fails the runs such a rule decides
(``agents.deterministic_stage``): an admin rule whose tool is disabled or gone, ``deterministic:tool_unknown``, for
each query it matches; one whose server is disabled, ``mcp:not_loaded:<id>``, for each query it matches; a code
rule whose server (its decorator's) is disabled or gone, ``mcp:not_loaded:<id>``, for every run it decides. An
admin rule that asks for its tool (``when.tool_available``) only skips instead, and is not named.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import F
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext

from agent_platform.text import plain_text
from agents.models import DeterministicRule
from mcpregistry.models import McpServer


def rules_left_failing_for_registry(
    *, server_id: Any, tool_names: list[str] | None, deleting: bool, **_signal: Any
) -> list[SafeString]:
    """The enabled rules that fail their runs where the server ``server_id``'s tools ``tool_names`` are disabled
    now (or deleted, with ``deleting``), or where the server itself (``tool_names`` None) is disabled now (or
    deleted): a text each (safe HTML), naming the rule with a link to its page, its agent and the reason code of
    the runs it fails. Nothing for a server not stored."""
    server = McpServer.objects.filter(pk=server_id).first()
    if server is None:
        return []
    # By agent, the rules of every agent bound to the server last (where each database puts NULL otherwise).
    by_agent = F("agent__slug").asc(nulls_last=True)
    rules = DeterministicRule.objects.filter(enabled=True).select_related("agent").order_by(by_agent, "order", "id")
    if tool_names is None:
        if deleting:  # its admin rules keep it (PROTECT: the page lists them and refuses); its code rules do not
            return _code_rules_naming(rules, server, deleting=True)
        if server.enabled:
            return []
        admin_rules = [r for r in rules.filter(server=server, code="") if not _asks_for_a_tool(r, any_tool=True)]
        return [_server_off_text(r, server) for r in admin_rules] + _code_rules_naming(rules, server, deleting=False)
    named = rules.filter(server=server, code="", tool_name__in=tool_names)
    if deleting:
        return [_tool_text(r, deleting=True) for r in named if not _asks_for_a_tool(r, any_tool=False)]
    if not server.enabled:
        return [_server_off_text(r, server) for r in named if not _asks_for_a_tool(r, any_tool=True)]
    callable_now = {tool.name for tool in server.tools.filter(name__in=tool_names) if tool.callable}
    return [
        _tool_text(r, deleting=False)
        for r in named
        if r.tool_name not in callable_now and not _asks_for_a_tool(r, any_tool=False)
    ]


def rules_failing_for_want_of_a_tool() -> dict[int, str]:
    """Every enabled rule that fails the runs it decides for want of a tool now, as ``rules_left_failing_for_registry``
    names it (plain text, without its link), keyed by the rule's id: an admin rule whose tool runs cannot call
    (disabled, waiting for a review, vanished, not listed) on an enabled server, or whose server is disabled; a code
    rule whose server is disabled. What an import compares before and after itself (``agents.configuration``): the
    rules it leaves failing are named in its report, as the tool's and the server's pages name them.

    Not the rules of an enabled server never discovered: it has no tools listed yet (an import names them before
    discovery lists them, and discovery is the step after an import of a new server)."""
    from mcpregistry.models import McpTool

    rules = list(DeterministicRule.objects.filter(enabled=True).select_related("agent", "server").order_by("id"))
    tools = McpTool.objects.filter(server__enabled=True).only(
        "server_id", "name", "enabled", "review_required", "available", "schema_error", "discovered_at"
    )
    callable_tools, discovered = set(), set()
    for tool in tools:
        if tool.callable:
            callable_tools.add((tool.server_id, tool.name))
        if tool.discovered_at is not None:
            discovered.add(tool.server_id)
    found: dict[int, SafeString] = {}
    for rule in rules:
        if rule.code or rule.server is None:
            continue
        if not rule.server.enabled:
            if not _asks_for_a_tool(rule, any_tool=True):
                found[rule.pk] = _server_off_text(rule, rule.server)
        elif (
            rule.server_id in discovered
            and (rule.server_id, rule.tool_name) not in callable_tools
            and not _asks_for_a_tool(rule, any_tool=False)
        ):
            found[rule.pk] = _tool_text(rule, deleting=False)
    servers_off = {server.mcp_id: server for server in McpServer.objects.filter(enabled=False)}
    for rule, mcp_id in _code_rules_with_server([rule for rule in rules if rule.code]):
        if mcp_id in servers_off:
            found[rule.pk] = _code_rule_text(rule, servers_off[mcp_id], deleting=False)
    return {pk: plain_text(text) for pk, text in found.items()}


def _asks_for_a_tool(rule: DeterministicRule, *, any_tool: bool) -> bool:
    """Whether ``rule`` matches only while a tool is callable (``when.tool_available``): its own tool, or, with
    ``any_tool`` (its server is off: none is), any tool. Such a rule skips its runs; it does not fail them."""
    wanted = rule.when.get("tool_available") if isinstance(rule.when, dict) else None
    return bool(wanted) and (any_tool or wanted == rule.tool_name)


def _code_rules_naming(rules: Any, server: McpServer, *, deleting: bool) -> list[SafeString]:
    """The code rules among ``rules`` whose decorator names ``server`` (one that cannot be loaded fails its runs
    already, ``deterministic:rule_error``, and is not named)."""
    return [
        _code_rule_text(rule, server, deleting=deleting)
        for rule, mcp_id in _code_rules_with_server(rules.exclude(code=""))
        if mcp_id == server.mcp_id
    ]


def _code_rules_with_server(rules: Iterable[DeterministicRule]) -> list[tuple[DeterministicRule, str]]:
    """Each of the code ``rules`` that loads, with the server its decorator names. ``agents.tools`` is read here,
    where a code rule is loaded: at module level it took LangChain into Django's start (this module is connected
    at start)."""
    from agents.tools import CodeRuleError, load_code_rule

    found = []
    for rule in rules:
        try:
            _fn, mcp_id = load_code_rule(rule.code)
        except CodeRuleError:
            continue
        found.append((rule, mcp_id))
    return found


def _tool_text(rule: DeterministicRule, *, deleting: bool) -> SafeString:
    if deleting:
        text = gettext(
            "Rule '{rule}' ({agent}) calls {tool}: once the tool is deleted, every run the rule matches fails "
            "deterministic:tool_unknown until the rule is changed or switched off."
        )
    else:
        text = gettext(
            "Rule '{rule}' ({agent}) calls {tool}, which runs cannot call now: every run the rule matches fails "
            "deterministic:tool_unknown until the rule is changed or switched off, or the tool enabled again."
        )
    return format_html(text, rule=_rule_link(rule), agent=_owner(rule), tool=rule.tool_name)


def _server_off_text(rule: DeterministicRule, server: McpServer) -> SafeString:
    text = gettext(
        "Rule '{rule}' ({agent}) calls {tool} of the disabled server {server}: every run the rule matches fails "
        "mcp:not_loaded:{server} until the rule is changed or switched off, or the server enabled again."
    )
    return format_html(text, rule=_rule_link(rule), agent=_owner(rule), tool=rule.tool_name, server=server.mcp_id)


def _code_rule_text(rule: DeterministicRule, server: McpServer, *, deleting: bool) -> SafeString:
    if deleting:
        text = gettext(
            "Code rule '{rule}' ({agent}) names the server {server}: once it is deleted, every run the rule decides "
            "fails mcp:not_loaded:{server} until the rule is changed or switched off."
        )
    else:
        text = gettext(
            "Code rule '{rule}' ({agent}) names the disabled server {server}: every run the rule decides fails "
            "mcp:not_loaded:{server} until the rule is changed or switched off, or the server enabled again."
        )
    return format_html(text, rule=_rule_link(rule), agent=_owner(rule), server=server.mcp_id)


def _owner(rule: DeterministicRule) -> str:
    return rule.agent.slug if rule.agent is not None else gettext("every agent bound to its server")


def _rule_link(rule: DeterministicRule) -> SafeString:
    """The rule's name linked to its admin page (without a link where the admin is not installed)."""
    try:
        url = reverse("admin:agents_deterministicrule_change", args=[rule.pk])
    except NoReverseMatch:
        return format_html("{}", rule.name)
    return format_html('<a href="{}">{}</a>', url, rule.name)
