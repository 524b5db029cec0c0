"""Admin for agent versions (read-only, a diff between two, roll back), A/B arms with their metrics page, and
shadow comparisons (disagreements first). Every change goes through the services (``agents.services``)."""

from __future__ import annotations

import json
import re
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Avg, Count, Exists, OuterRef, Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext, gettext_noop
from django.utils.translation import gettext_lazy as _

from agent_platform.model_choices import key_in_range
from agents.admin_runs import may_view
from agents.error_texts import error_message_text
from agents.experiments import arm_comparisons, arm_metrics
from agents.models import Agent, AgentArm, AgentVersion, Run, ShadowComparison
from agents.services import (
    agent_arm_create,
    agent_arm_delete,
    agent_arm_update,
    agent_version_rollback,
    version_unrunnable_problem,
)
from agents.shadow import ANSWER_AGREEMENT
from agents.version_view import content_html, version_stale_tools
from agents.versions import version_diff
from audit.admin_changes import ADMIN_VIA, ServiceAdminMixin, form_data
from audit.admin_readonly import ReadOnlyAdminMixin, WritesRefusedMixin
from audit.labels import reason_label
from audit.visible import readable_text, visible_text
from mcpregistry.list_fields import value_text


def bars(values: list[float | None], labels: list[str], *, colour: str, unit: str = "") -> SafeString:
    """One horizontal bar per arm, scaled to the largest value, drawn as inline SVG (no JavaScript, no CDN).
    (``auditor.charts`` draws the time series; agents may not import the auditor, which sits above it.)"""
    largest = max((v for v in values if v is not None), default=0.0)
    row, width, label_w = 18, 360, 110
    rects = []
    for index, (value, label) in enumerate(zip(values, labels, strict=True)):
        length = max(0.0, (width - label_w - 70) * (value / largest)) if largest > 0 and value is not None else 0.0
        shown = "—" if value is None else f"{round(value, 2):g}{unit}"
        rects.append(
            (
                index * row + 12,
                label,
                label_w,
                index * row + 2,
                f"{max(length, 0.5 if value else 0.0):.1f}",
                colour,
                f"{label}: {shown}",
                label_w + length + 4,
                index * row + 12,
                shown,
            )
        )
    return format_html(
        '<svg class="chart" viewBox="0 0 {} {}" width="{}" height="{}" role="img">{}</svg>',
        width,
        row * max(len(values), 1),
        width,
        row * max(len(values), 1),
        format_html_join(
            "",
            '<text x="0" y="{}" font-size="11" fill="currentColor">{}</text>'
            '<rect x="{}" y="{}" width="{}" height="13" fill="{}"><title>{}</title></rect>'
            '<text x="{}" y="{}" font-size="11" fill="currentColor">{}</text>',
            rects,
        ),
    )


# The notes the platform itself writes on the versions it publishes. They are stored as written (the audit record
# keeps what was written) and shown in the reader's language; a note an admin typed is shown as typed. Each text
# must stay the one its writer stores: "published on save" (agents.services, agents.configuration) and the eval
# freeze (evals.services.EVAL_FREEZE_NOTE, matched by its text here: evals imports agents, so agents may not import
# evals, ``../shared/tools/import_structure.py``).
SYSTEM_VERSION_NOTES = frozenset(
    {
        gettext_noop("published on save"),
        gettext_noop("frozen for an eval run: the agent was never published"),
    }
)
# ``agent_version_rollback``'s note, f"roll back to v{number}".
ROLLBACK_NOTE = re.compile(r"roll back to v([0-9]{1,9})")


def version_note_text(note: str) -> str:
    """A version's note as a reader takes it: one the platform wrote (``SYSTEM_VERSION_NOTES``, a roll back's) in
    the active language, any other as stored, with what does not show itself written out (``audit.visible``)."""
    if note in SYSTEM_VERSION_NOTES:
        return gettext(note)
    if rollback := ROLLBACK_NOTE.fullmatch(note):
        return gettext("roll back to v%(number)s") % {"number": rollback[1]}
    return visible_text(note)


def _cell(value: Any) -> str:
    """A changed leaf as a reader takes it: text as written (its lines kept; quoted where it would read as a
    number or a switch, so ``"5"`` and ``5`` differ), nothing as ``—``, else JSON; each character that does not
    show itself written out (``⟦U+E0049⟧``, ``audit.visible``), for two leaves that differ only in such characters
    (a prompt with an instruction spelled in tag characters appended) would otherwise look the same."""
    if value is None:
        return "—"
    if isinstance(value, str):
        return visible_text(value_text(value))
    return visible_text(json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True, default=str))


def weighted_arms(agent: Agent) -> str:
    """The agent's A/B arms of positive weight with their versions, ``a (v1), b (v2)``; "" when it has none. They
    take its live traffic before its live version does (``agents.versions.run_version_choice``)."""
    weighted = agent.arms.filter(weight__gt=0).select_related("version").order_by("name")
    return ", ".join(f"{arm.name} (v{arm.version.number})" for arm in weighted)


# Each returns what a publish or a roll back made live, as the admin's actions and ``manage.py agent_version`` say it,
# and whether that is a warning: while arms of positive weight take the live traffic, the live version reaches no
# caller until their weights are 0, and "is live" read as if it did (a caller's run still ran an arm's version).
# Each text starts with a word: the admin capitalizes a message's first letter, and a slug is spelled as is.


def publish_message(*, agent: Agent, number: int) -> tuple[str, bool]:
    words = {"agent": agent.slug, "number": number}
    if arms := weighted_arms(agent):
        text = gettext(
            "Agent %(agent)s: v%(number)s is the live version, but live traffic still follows the A/B arms "
            "%(arms)s until their weights are set to 0."
        )
        return text % {**words, "arms": arms}, True
    return gettext("Agent %(agent)s: v%(number)s is live.") % words, False


def rollback_message(*, agent: Agent, old: int, new: int) -> tuple[str, bool]:
    words = {"agent": agent.slug, "old": old, "new": new}
    if arms := weighted_arms(agent):
        text = gettext(
            "Agent %(agent)s: v%(old)s published again as v%(new)s, the live version, but live traffic still "
            "follows the A/B arms %(arms)s until their weights are set to 0."
        )
        return text % {**words, "arms": arms}, True
    return gettext("Agent %(agent)s: v%(old)s published again as v%(new)s, now live.") % words, False


def nothing_published_message(*, agent: Agent, old: int, live: int) -> str:
    words = {"agent": agent.slug, "old": old, "live": live}
    if old == live:
        return gettext("Agent %(agent)s: v%(old)s is already the live version; nothing was published.") % words
    return (
        gettext("Agent %(agent)s: the live version v%(live)s already has v%(old)s's content; nothing was published.")
        % words
    )


def stale_tools_message(*, version: AgentVersion, stale: list[str]) -> str:
    """What a version's page says of the tools whose frozen contracts no longer fit their servers
    (``agents.version_view.version_stale_tools``): its runs are not offered them, and publishing again is the cure
    (the version's contracts are never fitted for it)."""
    return gettext(
        "Agent %(agent)s: the contracts v%(number)s froze for %(tools)s do not fit the arguments their servers "
        "list now. Runs of v%(number)s are not offered these tools; fit their contracts and publish the agent again."
    ) % {"agent": version.agent.slug, "number": version.number, "tools": ", ".join(map(visible_text, stale))}


@admin.register(AgentVersion)
class AgentVersionAdmin(ReadOnlyAdminMixin, WritesRefusedMixin, admin.ModelAdmin):
    """Versions are immutable: viewed, compared, rolled back to (which publishes a new version)."""

    list_display = ["__str__", "agent", "number", "created_at", "published_by", "note_text", "is_live", "diff_link"]
    list_filter = ["agent"]
    search_fields = ["agent__slug", "note"]  # the stored note: a system note is found by its English words
    readonly_fields = ["agent", "number", "digest", "note_text", "published_by", "created_at", "content_json"]
    fields = readonly_fields
    actions = ["rollback"]

    class Media:
        css = {"all": ["agents/rule_summary.css", "agents/versions.css"]}

    def has_rollback_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("agents.change_agent"))

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The version's page, warning where its frozen contracts no longer fit their tools: its runs are not
        offered those tools (``agents.engine.tools_left_out``), and nothing else tells an admin to publish again."""
        version = self.get_object(request, unquote(object_id)) if request.method == "GET" else None
        if version is not None and (stale := version_stale_tools(version.content)):
            self.message_user(request, stale_tools_message(version=version, stale=stale), messages.WARNING)
        return super().change_view(request, object_id, form_url, extra_context)

    @admin.display(description=_("note"), ordering="note")
    def note_text(self, obj: AgentVersion) -> str:
        return version_note_text(obj.note)

    @admin.display(description=_("live"), boolean=True)
    def is_live(self, obj: AgentVersion) -> bool:
        return obj.agent.live_version_id == obj.pk

    @admin.display(description=_("frozen content"))
    def content_json(self, obj: AgentVersion) -> str:
        return content_html(obj.content)

    @admin.display(description=_("diff"))
    def diff_link(self, obj: AgentVersion) -> str:
        if obj.number == 1:
            return "—"
        url = reverse("admin:agents_agentversion_diff", args=[obj.pk], current_app=self.admin_site.name)
        return format_html('<a href="{}">{}</a>', url, gettext("against the previous version"))

    @admin.action(
        description=_("Roll back to the selected version (publishes it again as a new version)"),
        permissions=["rollback"],
    )
    def rollback(self, request: HttpRequest, queryset: QuerySet[AgentVersion]) -> None:
        if queryset.count() != 1:
            self.message_user(request, gettext("Choose exactly one version to roll back to."), messages.ERROR)
            return
        version = queryset.select_related("agent").get()
        latest = AgentVersion.objects.filter(agent=version.agent).order_by("-number").values_list("number", flat=True)
        before = latest.first()
        try:
            new = agent_version_rollback(version=version, actor=request.user, via=ADMIN_VIA)
        except ValidationError as exc:
            self.message_user(
                request,
                gettext("Agent %(agent)s: v%(old)s cannot be published again: %(problems)s")
                % {"agent": version.agent.slug, "old": version.number, "problems": "; ".join(exc.messages)},
                messages.ERROR,
            )
            return
        if before is not None and new.number <= before:
            # The live version already held this content: publishing it again made no version (and no audit
            # event); "published again as v2" said otherwise.
            self.message_user(
                request, nothing_published_message(agent=version.agent, old=version.number, live=new.number)
            )
            return
        text, warning = rollback_message(agent=version.agent, old=version.number, new=new.number)
        self.message_user(request, text, messages.WARNING if warning else messages.SUCCESS)

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path("<path:object_id>/diff/", wrap(self.diff_view), name="agents_agentversion_diff"),
            *super().get_urls(),
        ]

    def diff_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """``?against=<number>`` (default: the previous version) → this version."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        version = self.get_object(request, object_id)
        if version is None:
            raise Http404(gettext("Version not found."))
        others = AgentVersion.objects.filter(agent=version.agent)
        against_number = request.GET.get("against")
        against = None
        notice = ""
        if against_number and re.fullmatch(r"[0-9]{1,9}", against_number):  # not "²", which isdigit() calls a digit
            against = others.filter(number=int(against_number)).first()
            if against is None:
                numbers = ", ".join(f"v{n}" for n in others.order_by("-number").values_list("number", flat=True))
                notice = gettext("%(agent)s has no version %(number)s; its versions: %(numbers)s.") % {
                    "agent": version.agent.slug,
                    "number": against_number,
                    "numbers": numbers,
                }
        if against is None:
            against = others.filter(number__lt=version.number).order_by("-number").first()
        if against is None and not notice:
            notice = gettext("v%(number)s is the first version: there is none before it to compare with.") % {
                "number": version.number
            }
        rows = version_diff(against.content, version.content) if against is not None else []
        context = {
            **self.admin_site.each_context(request),
            "title": gettext("%(version)s compared with v%(against)s")
            % {"version": version, "against": against.number if against else "—"},
            "version": version,
            "against": against,
            "notice": notice,
            # The versions to compare with, each with its note as the reader takes it (``version_note_text``).
            "choices": [
                {"pk": other.pk, "number": other.number, "note": version_note_text(other.note)}
                for other in others.exclude(pk=version.pk).order_by("-number").only("pk", "number", "note")
            ],
            # The path names a rule by its name, which may hide characters too.
            "rows": [
                {"path": visible_text(row["path"]), "old": _cell(row["old"]), "new": _cell(row["new"])} for row in rows
            ],
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/agents/agentversion/diff.html", context)


class AgentArmForm(forms.ModelForm):
    """An arm's page. A version chosen that can no longer run is refused at its field, as the arm's services refuse
    it (raised by the service it was a server error); an arm saved with its version unchanged is not checked, so
    that its weight can still be set to 0. Its versions are those of its agent (the arm's; on a new arm's page the
    agent posted or given as ``?agent=<id>``), each labelled with its agent: every agent's versions were offered."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        versions = self.fields.get("version")
        if versions is None:
            return
        # The agent as posted, else as the page shows it (the arm's, or ``?agent=``); an id the lookup cannot take
        # (``²``, past 64 bits) is refused at the agent's field, and leaves the versions unfiltered.
        agent_id = str(self["agent"].value() or "") if "agent" in self.fields else ""
        chosen = AgentVersion.objects.select_related("agent").order_by("agent__slug", "-number")
        if agent_id.isascii() and agent_id.isdigit() and key_in_range(Agent.objects.all(), agent_id):
            chosen = chosen.filter(agent_id=int(agent_id))
        versions.queryset = chosen  # type: ignore[attr-defined]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        version, agent = cleaned.get("version"), cleaned.get("agent")
        changed = self.instance.pk is None or "version" in self.changed_data
        # A version of another agent is refused by the model ("Choose a version of this agent").
        ours = version is not None and agent is not None and version.agent_id == agent.pk
        if changed and ours and (problem := version_unrunnable_problem(version)):
            self.add_error("version", problem)
        return cleaned


def agents_with_arm_results() -> QuerySet[Agent]:
    """The agents the A/B results page offers: those with arms, and those whose runs ran under an arm (their arms
    deleted once the experiment stopped, the results stay). Each by an indexed lookup (``Run.arm``), not a join
    that walks every run."""
    armed = Exists(AgentArm.objects.filter(agent=OuterRef("pk")))
    ran_under_arm = Q(pk__in=Run.objects.filter(arm__gt="").values("agent_id"))  # arm is never NULL: "" is none
    return Agent.objects.filter(Q(armed) | ran_under_arm).order_by("slug")


@admin.register(AgentArm)
class AgentArmAdmin(ServiceAdminMixin, admin.ModelAdmin):
    """An agent's A/B arms, and the metrics page that compares them (``metrics/?agent=<slug>``)."""

    form = AgentArmForm
    list_display = ["agent", "name", "version", "weight", "metrics_link"]
    list_filter = ["agent"]
    fields = ["agent", "name", "version", "weight"]

    def service_save(self, *, obj: AgentArm, actor: Any, m2m: dict[str, list[Any]], change: bool) -> None:
        if change:
            agent_arm_update(arm=obj, actor=actor, via=ADMIN_VIA)
        else:
            saved = agent_arm_create(actor=actor, via=ADMIN_VIA, data=form_data(obj))
            obj.pk = saved.pk
            obj._state.adding = False

    def service_delete(self, *, obj: AgentArm, actor: Any) -> None:
        agent_arm_delete(arm=obj, actor=actor, via=ADMIN_VIA)

    @admin.display(description=_("metrics"))
    def metrics_link(self, obj: AgentArm) -> str:
        url = reverse("admin:agents_agentarm_metrics", current_app=self.admin_site.name)
        return format_html('<a href="{}?agent={}">{}</a>', url, obj.agent.slug, gettext("compare the arms"))

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [path("metrics/", wrap(self.metrics_view), name="agents_agentarm_metrics"), *super().get_urls()]

    def metrics_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        agent = Agent.objects.filter(slug=request.GET.get("agent", "")).first()
        agents = agents_with_arm_results()
        if agent is None:
            agent = agents.first()
        arms = arm_metrics(agent=agent) if agent is not None else []
        names = [m.label for m in arms]  # a row per arm and version: "b (v2)", "b (v3)"

        def chart(values: list[float | None], colour: str, unit: str, title: str) -> str:
            return bars(values, names, colour=colour, unit=unit) if arms else ""

        def pct(value: float | None) -> float | None:
            return round(value * 100, 1) if value is not None else None

        context = {
            **self.admin_site.each_context(request),
            "title": gettext("A/B arms of %(agent)s") % {"agent": agent.slug} if agent else gettext("A/B arms"),
            "has_add_permission": self.has_add_permission(request),
            "agent": agent,
            "agents": agents,
            "arms": arms,
            "comparisons": arm_comparisons(arms),
            "charts": [
                (gettext("runs"), chart([float(m.runs) for m in arms], "#447e9b", "", gettext("runs"))),
                (
                    gettext("success rate"),
                    chart([pct(m.success_rate) for m in arms], "#3a8f3a", "%", gettext("success rate")),
                ),
                (
                    gettext("tool-citation rate"),
                    chart([pct(m.citation_rate) for m in arms], "#6a5acd", "%", gettext("tool-citation rate")),
                ),
                (
                    gettext("latency p50"),
                    chart([m.latency(0.5) for m in arms], "#c47c1c", " ms", gettext("latency p50")),
                ),
                (
                    gettext("feedback mean"),
                    chart([m.feedback_mean for m in arms], "#b03a6f", "", gettext("feedback mean")),
                ),
            ],
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/agents/agentarm/metrics.html", context)


def shadow_summary(comparisons: QuerySet[ShadowComparison]) -> list[dict[str, Any]]:
    """Per candidate version of ``comparisons`` (the list as filtered), in one query: how many, the share that
    agrees, and the mean answer similarity, Δ latency and Δ tokens, written as the list writes each comparison's
    ("—" where no comparison has one)."""
    rows = (
        comparisons.order_by()
        .values("candidate", "candidate__agent__slug", "candidate__number")
        .annotate(
            n=Count("id"),
            agreeing=Count("id", filter=Q(agrees=True)),
            similarity=Avg("answer_similarity"),
            latency_ms=Avg("latency_delta_ms"),
            tokens=Avg("tokens_delta"),
        )
        .order_by("candidate__agent__slug", "candidate__number")
    )
    return [
        {
            "candidate": f"{row['candidate__agent__slug']} v{row['candidate__number']}",
            "n": row["n"],
            "agree": f"{100.0 * row['agreeing'] / row['n']:.1f} %",
            "similarity": f"{row['similarity']:.2f}",
            "latency": "—" if row["latency_ms"] is None else f"{row['latency_ms']:+.1f} ms",
            "tokens": "—" if row["tokens"] is None else f"{row['tokens']:+.1f}",
        }
        for row in rows
    ]


def shadow_tool_calls(run: Run, stored: list[Any]) -> list[dict[str, str]]:
    """The tool calls ``run`` made or attempted, as its comparison counted them (``agents.shadow``: its
    ``tool.call`` audit events, a retry once): each ``tool`` (``server.tool``), its masked ``args`` as one line of
    JSON (without the idempotency key the gate adds to a write, which is the run's own) and the ``reason`` a
    refused call was refused for, in words. ``stored`` is the comparison's list of the run's tool names: where the
    events no longer match it (archived), its names are shown without their arguments."""
    gate_key = f"{run.pk}:"
    calls = []
    for event in run.audit_events.filter(action="tool.call", attempt__lte=1).order_by("id"):
        given = event.args or {}
        if isinstance(given, dict):
            given = {k: v for k, v in given.items() if not (isinstance(v, str) and v.startswith(gate_key))}
        calls.append(
            {
                "tool": visible_text(f"{event.mcp_id}.{event.tool}"),
                "args": visible_text(json.dumps(given, ensure_ascii=False, default=str)) if given else "",
                "reason": "" if event.ok else reason_label(event.reason),
            }
        )
    if [call["tool"] for call in calls] != [visible_text(str(name)) for name in stored]:
        return stored_tool_calls(stored)
    return calls


def _list_of(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def stored_tool_calls(stored: list[Any]) -> list[dict[str, str]]:
    """The comparison's stored tool names (``ShadowComparison.live_tools``, ``shadow_tools``) as tool calls
    without their arguments."""
    return [{"tool": visible_text(str(name)), "args": "", "reason": ""} for name in stored]


@admin.register(ShadowComparison)
class ShadowComparisonAdmin(ReadOnlyAdminMixin, WritesRefusedMixin, admin.ModelAdmin):
    """Live runs and their shadows on the candidate, disagreements first (read-only). A comparison's page sets
    the two runs side by side (``comparison_context``), not its stored fields."""

    change_form_template = "admin/agents/shadowcomparison/change_form.html"

    # Narrow enough for the admin's content column beside its filters: what differs is one column.
    list_display = [
        "live_run_link",
        "candidate_version",
        "agrees",
        "differences",
        "similarity",
        "latency_delta",
        "tokens_difference",
    ]
    # The candidate: a shadow version changed mid-way leaves comparisons of two candidates in one list.
    list_filter = ["agrees", "agent", ("candidate", admin.RelatedOnlyFieldListFilter), "same_tools"]
    list_select_related = ["candidate__agent"]
    readonly_fields = [f.name for f in ShadowComparison._meta.fields]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        response = super().changelist_view(request, extra_context)
        context = getattr(response, "context_data", None)
        if context is not None and "cl" in context:
            context["shadow_summary"] = shadow_summary(context["cl"].queryset)
        return response

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        comparison = self.get_object(request, unquote(object_id))
        extra = dict(extra_context or {})
        if comparison is not None and self.has_view_permission(request, comparison):
            extra.update(self.comparison_context(request, comparison))
        return super().change_view(request, object_id, form_url, extra)

    def comparison_context(self, request: HttpRequest, obj: ShadowComparison) -> dict[str, Any]:
        """What a reviewer deciding on the candidate reads: the verdict and its figures, and the two runs side by
        side, each with its answer (masked as stored) and its tool calls. The runs' answers and arguments are shown
        to whoever may view runs, as the run page shows them (the stored tool names to others); a run that no
        longer exists is said to be gone."""
        name = self.admin_site.name
        may_view_runs = may_view(self.admin_site, request, Run)
        runs = Run.objects.select_related("version").in_bulk([obj.live_run_id, obj.shadow_run_id])

        def side(label: str, run_id: Any, stored: list[Any]) -> dict[str, Any]:
            run = runs.get(run_id)
            shown: dict[str, Any] = {"label": label, "short_id": str(run_id)[:8], "run": run, "url": ""}
            if run is None or not may_view_runs:
                return {**shown, "tools": stored_tool_calls(stored)}
            return {
                **shown,
                "url": reverse("admin:agents_run_change", args=[run.pk], current_app=name),
                "version": gettext("version %(number)s") % {"number": f"v{run.version.number}"}
                if run.version is not None
                else "",
                "answer": readable_text(run.answer),
                "error": error_message_text(run.error_code, run.error_message) if run.error_code else "",
                "tools": shadow_tool_calls(run, stored),
            }

        candidate = obj.candidate
        candidate_text = f"{candidate.agent.slug} v{candidate.number}"
        return {
            # Not the row's name, two whole run ids on one line, which ran under the page's history button.
            "subtitle": f"{candidate_text} · {str(obj.live_run_id)[:8]} / {str(obj.shadow_run_id)[:8]}",
            "comparison": obj,
            "differences": self.differences(obj),
            "candidate_text": candidate_text,
            "candidate_url": reverse("admin:agents_agentversion_change", args=[candidate.pk], current_app=name)
            if may_view(self.admin_site, request, AgentVersion)
            else "",
            "similarity_percent": f"{100.0 * obj.answer_similarity:.1f} %",
            "same_answer_percent": f"{100.0 * ANSWER_AGREEMENT:.0f} %",
            "latency_text": self.latency_delta(obj),
            "tokens_text": "—"
            if obj.tokens_delta is None
            else gettext("%(delta)s tokens") % {"delta": f"{obj.tokens_delta:+d}"},
            "may_view_runs": may_view_runs,
            "sides": [
                side(gettext("live run"), obj.live_run_id, _list_of(obj.live_tools)),
                side(gettext("shadow run"), obj.shadow_run_id, _list_of(obj.shadow_tools)),
            ],
        }

    @admin.display(description=_("what differs"))
    def differences(self, obj: ShadowComparison) -> str:
        differing = [
            label
            for same, label in (
                (obj.same_status, gettext("outcome")),
                (obj.same_tools, gettext("tools")),
                (obj.same_args, gettext("arguments")),
                (obj.answer_similarity >= ANSWER_AGREEMENT, gettext("answer")),
            )
            if not same
        ]
        return ", ".join(differing) or "—"

    @admin.display(description=_("candidate"), ordering="candidate__number")
    def candidate_version(self, obj: ShadowComparison) -> str:
        return format_html(
            '<span style="white-space:nowrap">{}</span><br>v{}', obj.candidate.agent.slug, obj.candidate.number
        )

    @admin.display(description=_("answer similarity"), ordering="answer_similarity")
    def similarity(self, obj: ShadowComparison) -> str:
        return f"{obj.answer_similarity:.2f}"

    @admin.display(description=_("Δ latency"), ordering="latency_delta_ms")
    def latency_delta(self, obj: ShadowComparison) -> str:
        return "—" if obj.latency_delta_ms is None else f"{obj.latency_delta_ms:+.1f} ms"

    @admin.display(description=_("Δ tokens"), ordering="tokens_delta")
    def tokens_difference(self, obj: ShadowComparison) -> str:
        return "—" if obj.tokens_delta is None else f"{obj.tokens_delta:+d}"

    @admin.display(description=_("live run"))
    def live_run_link(self, obj: ShadowComparison) -> str:
        live = reverse("admin:agents_run_change", args=[obj.live_run_id], current_app=self.admin_site.name)
        shadow = reverse("admin:agents_run_change", args=[obj.shadow_run_id], current_app=self.admin_site.name)
        return format_html(
            '<a href="{}">{}</a> / <a href="{}">{}</a>',
            live,
            str(obj.live_run_id)[:8],
            shadow,
            gettext("shadow"),
        )
