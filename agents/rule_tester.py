"""The rule tester: which of an agent's rules match a query, in which order, with which parameters, and what
the tool's contract says of them — a dry run by default (no tool is called), optionally through the gate."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.auth.decorators import permission_required
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.translation import gettext_lazy as _

from agents.deterministic import decide
from agents.execution import _rules_for
from agents.models import Agent
from agents.tools import CodeRuleError, DeterministicContext, load_code_rule
from mcpregistry import gate
from mcpregistry.contracts import argument_constraints, check_args
from mcpregistry.models import McpServer, ToolContract


@dataclass
class RuleTrial:
    order: int
    name: str
    kind: str
    mcp_id: str
    tool: str
    matched: bool
    reason: str
    params: dict[str, Any] | None = None
    verdict: str = ""
    result: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)


def _json_field(label: str) -> forms.CharField:
    return forms.CharField(label=label, required=False, widget=forms.Textarea(attrs={"rows": 3, "cols": 60}))


class RuleTesterForm(forms.Form):
    agent = forms.ModelChoiceField(queryset=Agent.objects.order_by("slug"), label=_("agent"))
    query = forms.CharField(label=_("query"), widget=forms.TextInput(attrs={"size": 80}))
    context = _json_field(_("A2A context (JSON object)"))
    a2a_data = _json_field(_("A2A data parts (JSON list of objects)"))
    execute = forms.BooleanField(label=_("also call the matched tools through the gate (audited)"), required=False)

    def _parse(self, name: str, expected: type) -> Any:
        raw = self.cleaned_data.get(name) or ""
        if not raw.strip():
            return expected()
        try:
            value = json.loads(raw)
        except ValueError as exc:
            raise forms.ValidationError({name: _("Not valid JSON: %(error)s") % {"error": exc}}) from exc
        if not isinstance(value, expected):
            raise forms.ValidationError({name: _("Expected a JSON %(kind)s.") % {"kind": expected.__name__}})
        return value

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        cleaned["context"] = self._parse("context", dict)
        cleaned["a2a_data"] = self._parse("a2a_data", list)
        return cleaned


def _contract_verdict(server: McpServer, tool_name: str, params: Any) -> str:
    tool = server.tools.filter(name=tool_name).first()
    if tool is None or not tool.callable:
        return "tool:unknown"
    contract = ToolContract.objects.filter(tool=tool).first()
    constraints = contract.args if contract else argument_constraints(tool.input_schema)
    _clean, verdict = check_args(constraints or {}, params, unknown=contract.unknown_args if contract else "refuse")
    return f"{verdict.reason}: {verdict.detail}" if verdict else "ok"


def rules_trial(
    *, agent: Agent, query: str, context: dict[str, Any], a2a_data: list[Any], execute: bool, actor: str
) -> list[RuleTrial]:
    """Evaluate every rule of ``agent`` against the input, in order, as the engine would."""
    servers = {s.mcp_id: s for s in agent.servers.prefetch_related("tools")}
    trials: list[RuleTrial] = []
    for position, rule in enumerate(_rules_for(agent), start=1):
        trial = RuleTrial(position, rule.name, "code" if rule.code else "admin", rule.mcp_id, rule.tool_name, False, "")
        if rule.code:
            try:
                fn, trial.mcp_id = load_code_rule(rule.code)
            except CodeRuleError as exc:
                trial.reason = f"cannot load: {exc}"
                trials.append(trial)
                continue
        server = servers.get(trial.mcp_id)
        if server is None:
            trial.reason = f"MCP '{trial.mcp_id}'의 tool이 로드되지 않음"
            trials.append(trial)
            continue
        if rule.code:
            ctx = DeterministicContext(
                query=query, context=context, a2a_data=a2a_data or None, a2a_files=None, mcp_tools=[]
            )
            try:
                returned = fn(ctx)
            except Exception as exc:  # noqa: BLE001 - shown to the admin, as the engine would fail the run
                trial.reason = f"raised {type(exc).__name__}: {exc}"
                trials.append(trial)
                continue
            if returned is None:
                trial.reason = "returned None"
            else:
                trial.matched, trial.reason = True, "matched"
                trial.tool, trial.params = str(returned.get("tool_name", "")), returned.get("params") or {}
                trial.notes.append("mcp_tools is empty in a dry run")
        else:
            decision = decide(
                rule,
                query=query,
                context=context,
                a2a_data=a2a_data,
                available_tools={t.name for t in server.tools.all() if t.callable},
            )
            trial.matched, trial.reason, trial.params = decision.matched, decision.reason, decision.params
        if trial.matched:
            trial.verdict = _contract_verdict(server, trial.tool, trial.params)
            if execute:
                result = gate.call(
                    server=server,
                    tool_name=trial.tool,
                    args=trial.params or {},
                    who=gate.GateCall(source="admin", actor=actor, call_id=f"rule-tester:{rule.rule_id}"),
                )
                trial.result = result.as_dict()
        trials.append(trial)
    return trials


@permission_required("agents.change_deterministicrule", raise_exception=True)
def rule_tester_view(request: HttpRequest) -> HttpResponse:
    form = RuleTesterForm(request.POST or None)
    trials: list[RuleTrial] | None = None
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        trials = rules_trial(
            agent=data["agent"],
            query=data["query"],
            context=data["context"],
            a2a_data=data["a2a_data"],
            execute=data["execute"],
            actor=f"rule-tester:{request.user.get_username()}",
        )
    context = {
        **admin.site.each_context(request),
        "title": _("Rule tester"),
        "form": form,
        "trials": trials,
    }
    return TemplateResponse(request, "admin/agents/rule_tester.html", context)
