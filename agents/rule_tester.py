"""The rule tester: which of an agent's rules match a query, in which order, with which parameters, and what
the tool's contract says of them — a dry run by default (no tool is called), optionally through the gate.
It runs the same deterministic stage as a run (``agents.deterministic_stage``), so the two cannot disagree."""

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

from agent_platform.json import json_error_text
from agent_platform.json import loads as json_loads
from agents.decision_reasons import reason_text
from agents.models import Agent
from agents.rule_form import key_value_pairs
from agents.selectors import deterministic_rule_specs
from audit.labels import reason_label
from mcpregistry.list_fields import data_parts_from_text


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

    @property
    def reason_text(self) -> str:
        """The decision's reason in the reader's language (``agents/decision_reasons.py``)."""
        return reason_text(self.reason)

    @property
    def params_json(self) -> str:
        """The rendered parameters as JSON (what the tool is sent), Korean as itself."""
        return "" if self.params is None else json.dumps(self.params, ensure_ascii=False)

    @property
    def error_text(self) -> str:
        """A failed call's reason in words with its code (``args:allowed:region``), as the audit pages name it."""
        error = (self.result or {}).get("error") or ""
        return f"{reason_label(error)} · {error}" if error and reason_label(error) != error else error

    @property
    def value_json(self) -> str:
        """What the tool answered, indented, Korean as itself."""
        value = (self.result or {}).get("value")
        return "" if value is None else json.dumps(value, ensure_ascii=False, indent=2, default=str)

    @property
    def result_json(self) -> str:
        """The call's result as JSON, indented: its value, and the gate's outcome (ok, error, attempts, latency)."""
        return "" if self.result is None else json.dumps(self.result, ensure_ascii=False, indent=2, default=str)


def _json_field(label: str) -> forms.CharField:
    return forms.CharField(label=label, required=False, widget=forms.Textarea(attrs={"rows": 3, "cols": 60}))


class RuleTesterForm(forms.Form):
    agent = forms.ModelChoiceField(queryset=Agent.objects.order_by("slug"), label=_("agent"))
    query = forms.CharField(label=_("query"), widget=forms.TextInput(attrs={"size": 80}))
    context = _json_field(_("A2A context (KEY=value lines, as in the rule editor, or a JSON object)"))
    a2a_data = _json_field(
        _("A2A data parts (PATH=value lines as in the rule editor, a blank line between parts, or a JSON list)")
    )
    execute = forms.BooleanField(label=_("also call the matched tools through the gate (audited)"), required=False)

    def _parse(self, name: str, expected: type) -> Any:
        raw = (self.cleaned_data.get(name) or "").strip()
        if not raw:
            return expected()
        if expected is dict and not raw.startswith("{"):
            return self._key_value_lines(name, raw)
        if expected is list and not raw.startswith("["):
            try:
                return data_parts_from_text(raw)
            except ValueError as exc:
                self.add_error(name, str(exc))
                return []
        try:
            value = json_loads(raw)
        except ValueError as exc:
            self.add_error(name, _("Not valid JSON: %(error)s") % {"error": json_error_text(exc)})
            return expected()
        if not isinstance(value, expected):
            self.add_error(name, _("Expected a JSON %(kind)s.") % {"kind": expected.__name__})
            return expected()
        return value

    def _key_value_lines(self, name: str, raw: str) -> dict[str, Any]:
        """``KEY=value`` lines, read as the rule editor reads a context condition (values typed the same way, so
        ``tier=3`` meets a rule's ``tier=3``)."""
        try:
            return key_value_pairs(raw, str(self.fields[name].label))
        except forms.ValidationError as exc:
            self.add_error(name, exc)
            return {}

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        # Each field's problem is told at its field, both at once.
        cleaned["context"] = self._parse("context", dict)
        cleaned["a2a_data"] = self._parse("a2a_data", list)
        return cleaned


def rules_trial(
    *, agent: Agent, query: str, context: dict[str, Any], a2a_data: list[Any], execute: bool, actor: str
) -> list[RuleTrial]:
    """Evaluate the rules of ``agent`` against the input, in order, with the run's own deterministic stage
    (``agents.deterministic_stage``): a dry run by default, through the gate when ``execute`` (audited, source
    ``admin``). A failure that would end a run (``deterministic:rule_error``, ``mcp:not_loaded:<id>``,
    ``deterministic:tool_unknown``) ends the trial list at that rule, with the run's reason code and text."""
    # The stage and the gate load the MCP SDK and LangChain: a process that serves the admin pays for them when
    # a rule is first tried, not when it starts (this module is the URLconf's).
    from agents.deterministic_stage import StageInput, deterministic_stage
    from mcpregistry import gate

    servers = list(agent.servers.prefetch_related("tools"))

    def who(call_id: str) -> gate.GateCall:
        return gate.GateCall(
            source="admin",
            actor=actor,
            call_id=call_id.replace("rule:", "rule-tester:", 1),
            follow_fallback=agent.model_provider == "offline",  # as the agent's runs do
        )

    stage = deterministic_stage(
        StageInput(
            query=query,
            context=context,
            a2a_data=a2a_data,
            a2a_files=[],
            servers=servers,
            rules=deterministic_rule_specs(agent=agent),
        ),
        mode="execute" if execute else "dry_run",
        who=who,
        check_contracts=True,
    )
    trials: list[RuleTrial] = []
    for position, step in enumerate(stage.steps, start=1):
        rule = step.rule
        trial = RuleTrial(position, rule.name, "code" if rule.code else "admin", step.mcp_id, step.tool, False, "")
        trial.verdict, trial.notes = step.verdict, list(step.notes)
        if step.failure is not None:
            trial.reason = f"{step.failure.code}: {step.failure.message}"
        if step.decision is not None:
            trial.matched = step.decision.matched
            trial.reason = trial.reason or step.decision.reason
            trial.params = step.decision.params
        if step.result is not None:
            trial.result = step.result.as_dict()
        trials.append(trial)
    return trials


@permission_required("agents.change_deterministicrule", raise_exception=True)
def rule_tester_view(request: HttpRequest) -> HttpResponse:
    # The agent chosen: the one named (?agent=, the link on a rule's page), else the only one there is.
    agents = Agent.objects.order_by("slug")
    chosen = agents.filter(slug=request.GET.get("agent", "")).first() or (
        agents.first() if agents.count() == 1 else None
    )
    form = RuleTesterForm(request.POST or None, initial={"agent": chosen} if chosen else None)
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
