"""Eval sets, their cases, and eval runs with one result per case.

An ``EvalSet`` and its ``EvalCase`` rows are configuration (audited through ``evals.services``). An ``EvalRun``
is one execution of a set against an agent: each case becomes an ordinary run (``agents.Run``, ``purpose="eval"``)
and, once finished, an ``EvalCaseResult`` scored from the run's audited tool calls.
"""

from __future__ import annotations

import copy
import uuid
from typing import Any, Literal, TypedDict

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext_lazy

from agent_platform.json import UnicodeJSONEncoder
from agent_platform.slugs import validate_ascii_slug
from agents.models import Agent, Run
from audit.change_guard import AuditedModel, ChangeAudit, NotConfiguration

# ``rag``: a question answered from a document (the seed's ``expected_source`` path), no tool expected, any allowed.
CASE_TYPES = ("single_tool", "multi_tool", "no_tool", "no_answer", "guardrail", "rag")
# A case's order: what an integer column holds on every database (SQLite's takes 64 bits, PostgreSQL's 32), the
# bounds a document's order is read within too, so that whatever a set holds its export imports again.
CASE_ORDER_MIN, CASE_ORDER_MAX = -(2**31), 2**31 - 1

# A set's name is an ASCII slug: it is a path segment of the API (/api/v1/evals/sets/<name>), an argument of
# ``run_eval`` and a key of configuration documents, checked by the platform's one slug check (not SlugField's).


class EvalSet(AuditedModel):
    """A fixed question set. ``thresholds`` gate a deploy: ``run_eval`` exits non-zero when a score of the run is
    below its minimum (``pass_rate``, ``precision``, ``recall``, ``sequence_match``, ``argument_match``,
    ``answer_checks``) or above its maximum (``forbidden_violations``, ``latency_p95_ms``)."""

    name = models.CharField(
        _("name"),
        max_length=100,
        unique=True,
        validators=[validate_ascii_slug],
        help_text=_(
            "ASCII letters (a–z, A–Z), digits, _ and - only, e.g. seed-001-tools: the name is used in API URLs, "
            "in run_eval and in configuration documents."
        ),
    )
    description = models.TextField(_("description"), blank=True)
    agent = models.ForeignKey(
        Agent,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="eval_sets",
        verbose_name=_("default agent"),
        help_text=_("The agent the admin action runs the set against."),
    )
    sandbox_servers = models.JSONField(
        encoder=UnicodeJSONEncoder,
        verbose_name=_("sandbox servers"),
        default=list,
        blank=True,
        help_text=_(
            "MCP server ids whose write tools the eval may really call. Every other write call is refused "
            "(eval:write_blocked) and scored as attempted."
        ),
    )
    thresholds = models.JSONField(
        encoder=UnicodeJSONEncoder,
        verbose_name=_("thresholds"),
        default=dict,
        blank=True,
        help_text=_(
            'e.g. {"pass_rate": 0.9, "recall": 1.0, "forbidden_violations": 0}: run_eval exits non-zero when a '
            "score falls below a minimum (or rises above a maximum)."
        ),
    )
    created_at = models.DateTimeField(_("created"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated"), auto_now=True)

    change_audit = ChangeAudit(entity="eval_set", operational_fields=frozenset({"updated_at"}))

    class Meta:
        verbose_name = _("eval set")
        verbose_name_plural = _("eval sets")
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        from evals.scoring import threshold_problems

        problems = threshold_problems(self.thresholds)
        if problems:
            raise ValidationError({"thresholds": problems})
        if not isinstance(self.sandbox_servers, list) or not all(isinstance(s, str) for s in self.sandbox_servers):
            raise ValidationError({"sandbox_servers": _("A list of MCP server ids.")})


class EvalCase(AuditedModel):
    """One question and what a right run does with it.

    ``expected_tools``: ``[{"name": ..., "args": {...}?}]`` (args: a subset the call's arguments must contain);
    ``ordered``: the calls must come in that order; ``forbidden_tools``: names that must not be called (``"*"``:
    no tool at all, what a ``no_tool`` case means); ``answer_checks``: ``[{"contains": ...}``, ``{"regex": ...}``,
    ``{"dont_know": true}]``; ``alternatives``: other tool lists that are also right, with a note (``[{"tools":
    [...], "note": "FAILURE_MODE=timeout: the backup tool"}]``)."""

    eval_set = models.ForeignKey(EvalSet, on_delete=models.CASCADE, related_name="cases", verbose_name=_("eval set"))
    key = models.CharField(_("key"), max_length=100, help_text=_("Stable name of the case within its set."))
    order = models.IntegerField(
        _("order"),
        default=0,
        validators=[MinValueValidator(CASE_ORDER_MIN), MaxValueValidator(CASE_ORDER_MAX)],
    )
    case_type = models.CharField(_("type"), max_length=40, default="single_tool")
    query = models.TextField(_("query"))
    context = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("A2A context"), default=dict, blank=True)
    data = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("A2A data"), default=list, blank=True)
    expected_tools = models.JSONField(
        encoder=UnicodeJSONEncoder, verbose_name=_("expected tools"), default=list, blank=True
    )
    ordered = models.BooleanField(_("in this order"), default=False)
    forbidden_tools = models.JSONField(
        encoder=UnicodeJSONEncoder, verbose_name=_("forbidden tools"), default=list, blank=True
    )
    answer_checks = models.JSONField(
        encoder=UnicodeJSONEncoder, verbose_name=_("answer checks"), default=list, blank=True
    )
    alternatives = models.JSONField(
        encoder=UnicodeJSONEncoder, verbose_name=_("alternatives"), default=list, blank=True
    )
    note = models.TextField(_("note"), blank=True)

    change_audit = ChangeAudit(entity="eval_case")

    class Meta:
        verbose_name = _("eval case")
        verbose_name_plural = _("eval cases")
        ordering = ["eval_set", "order", "id"]
        constraints = [models.UniqueConstraint(fields=["eval_set", "key"], name="evalcase_unique_set_key")]

    def __str__(self) -> str:
        return f"{self.key}: {self.query[:60]}"

    def clean(self) -> None:
        from evals.scoring import case_problems

        problems = case_problems(
            expected_tools=self.expected_tools,
            forbidden_tools=self.forbidden_tools,
            answer_checks=self.answer_checks,
            alternatives=self.alternatives,
            context=self.context,
            data=self.data,
        )
        if self.query and not self.query.strip():  # an empty one is refused as blank already
            # A run of it would be refused as any caller's blank query is.
            problems.setdefault("query", []).append(str(_("The query is empty.")))
        if len(self.query or "") > settings.PLATFORM_RUN_QUERY_MAX_CHARS:
            # Its runs are refused as any caller's are (a model's cost grows with the query).
            problems.setdefault("query", []).append(
                str(_("The query is longer than %(max)d characters.") % {"max": settings.PLATFORM_RUN_QUERY_MAX_CHARS})
            )
        if problems:
            raise ValidationError(problems)


class EvalRun(models.Model):
    """One execution of a set against an agent (optionally a published version of it)."""

    class Status(models.TextChoices):
        RUNNING = "running", _("running")
        FINISHED = "finished", pgettext_lazy("an eval run's status", "finished")
        # Stopped by a person or ``run_eval`` interrupted (``evals.services.eval_run_cancel``): its cases not yet
        # scored were ended unscored, and it never passes.
        CANCELLED = "cancelled", pgettext_lazy("an eval run's status", "cancelled")

    id = models.UUIDField(_("ID"), primary_key=True, default=uuid.uuid4, editable=False)
    eval_set = models.ForeignKey(EvalSet, on_delete=models.PROTECT, related_name="runs", verbose_name=_("eval set"))
    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="eval_runs", verbose_name=_("agent"))
    version = models.PositiveIntegerField(_("agent version"), null=True, blank=True)
    label = models.CharField(_("label"), max_length=200, blank=True)
    # At most this many of its cases in flight at once (``run_eval --workers``, else ``PLATFORM_EVAL_WINDOW``), so
    # that an eval does not crowd out live traffic; every refresh tops it up to this. None: an eval run started
    # before the window was stored, topped up one case at a time.
    window = models.PositiveIntegerField(_("cases in flight at once"), null=True, blank=True)
    status = models.CharField(_("status"), max_length=20, choices=Status.choices, default=Status.RUNNING)
    total = models.PositiveIntegerField(_("cases"), default=0)
    done = models.PositiveIntegerField(_("cases scored"), default=0)
    summary = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("scores"), default=dict, blank=True)
    thresholds = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("thresholds"), default=dict, blank=True)
    failed_thresholds = models.JSONField(
        encoder=UnicodeJSONEncoder, verbose_name=_("thresholds not met"), default=list, blank=True
    )
    # The set's sandbox servers as the eval run started (``evals.services.eval_run_start``), which its cases' runs
    # may really write to, as ``thresholds`` are kept: the set edited meanwhile changes neither. An eval run stored
    # before they were kept has none: its later cases' writes are refused (``eval:write_blocked``).
    sandbox_servers = models.JSONField(
        encoder=UnicodeJSONEncoder, verbose_name=_("sandbox servers"), default=list, blank=True
    )
    started_by = models.CharField(_("started by"), max_length=200, blank=True)
    created_at = models.DateTimeField(_("started"), auto_now_add=True, db_index=True)
    finished_at = models.DateTimeField(_("finished"), null=True, blank=True)

    change_audit = NotConfiguration("an eval run is a measurement; its cases' tool calls are audited as eval")

    class Meta:
        verbose_name = _("eval run")
        verbose_name_plural = _("eval runs")
        ordering = ["-created_at"]

    def __str__(self) -> str:
        version = f" v{self.version}" if self.version is not None else ""
        started = timezone.localtime(self.created_at) if self.created_at else None  # as the page's times: local
        return f"{self.eval_set.name} × {self.agent.slug}{version} ({started:%Y-%m-%d %H:%M %Z})"

    @property
    def passed(self) -> bool | None:
        """Whether it met every threshold: None while it runs, and when it finished with no threshold to judge it
        by (``verdict`` ``no_thresholds``: not "met", whatever its cases did); a cancelled eval run never passes
        (what was scored before it was stopped is no measure of the set). A threshold whose score was not measured
        is among ``failed_thresholds`` (``evals.scoring.NOT_JUDGED``): not met."""
        if self.status == self.Status.CANCELLED:
            return False
        if self.status != self.Status.FINISHED or not self.thresholds:
            return None
        return not self.failed_thresholds

    @property
    def verdict(self) -> Literal["running", "cancelled", "no_thresholds", "met", "not_met"]:
        """What its thresholds say of it, as its pages tell it: ``no_thresholds`` for a finished eval run of a set
        that had none (nothing judged it), never ``met``."""
        if self.status == self.Status.CANCELLED:
            return "cancelled"
        if self.status != self.Status.FINISHED:
            return "running"
        if self.failed_thresholds:
            return "not_met"
        return "met" if self.thresholds else "no_thresholds"


# What a case's result keeps of the case as it was when its eval run started: what its run was asked and what it
# is scored against, whatever the case says after an edit.
SNAPSHOT_FIELDS = (
    "case_type",
    "query",
    "context",
    "data",
    "expected_tools",
    "ordered",
    "forbidden_tools",
    "answer_checks",
    "alternatives",
)


class CaseSnapshot(TypedDict):
    """``EvalCaseResult.case_snapshot``: the case's ``SNAPSHOT_FIELDS``, taken from the stored (validated) case."""

    case_type: str
    query: str
    context: dict[str, Any]
    data: list[Any]
    expected_tools: list[Any]
    ordered: bool
    forbidden_tools: list[str]
    answer_checks: list[Any]
    alternatives: list[Any]


def case_snapshot(case: EvalCase) -> CaseSnapshot:
    return copy.deepcopy(
        CaseSnapshot(
            case_type=case.case_type,
            query=case.query,
            context=case.context,
            data=case.data,
            expected_tools=case.expected_tools,
            ordered=case.ordered,
            forbidden_tools=case.forbidden_tools,
            answer_checks=case.answer_checks,
            alternatives=case.alternatives,
        )
    )


class EvalCaseResult(models.Model):
    """A case of an eval run: its run, then (once the run finished) its scores. ``case_snapshot`` is the case as
    the eval run started with it (``case_as_run``): its run is asked that query and scored against those
    expectations, and they are what the result shows, however the case is edited meanwhile."""

    eval_run = models.ForeignKey(EvalRun, on_delete=models.CASCADE, related_name="results", verbose_name=_("eval run"))
    case = models.ForeignKey(EvalCase, on_delete=models.PROTECT, related_name="results", verbose_name=_("case"))
    run = models.ForeignKey(
        Run, on_delete=models.SET_NULL, null=True, blank=True, related_name="eval_results", verbose_name=_("run")
    )
    # Settled: scored, or ended without a score (``cancelled``); a compare-and-swap on it settles a case once.
    scored = models.BooleanField(_("scored"), default=False)
    passed = models.BooleanField(_("passed"), default=False)
    scores = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("scores"), default=dict, blank=True)
    called_tools = models.JSONField(
        encoder=UnicodeJSONEncoder, verbose_name=_("called tools"), default=list, blank=True
    )
    answer = models.TextField(_("answer"), blank=True)
    case_snapshot = models.JSONField(
        encoder=UnicodeJSONEncoder, verbose_name=_("case as run"), default=dict, blank=True, editable=False
    )

    change_audit = NotConfiguration("a case's outcome in an eval run, derived from its run")

    class Meta:
        verbose_name = _("eval case result")
        verbose_name_plural = _("eval case results")
        ordering = ["eval_run", "case__order", "case__id"]
        constraints = [models.UniqueConstraint(fields=["eval_run", "case"], name="evalresult_unique_run_case")]

    def __str__(self) -> str:
        return f"{self.case.key} ({'pass' if self.passed else 'fail'})"

    @property
    def cancelled(self) -> bool:
        """Ended unscored because its eval run was cancelled (``evals.services.eval_run_cancel``): ``scored`` is set
        (nothing scores it any more) but it has no score, and its eval run's summary leaves it out."""
        return isinstance(self.scores, dict) and self.scores.get("cancelled") is True

    def case_as_run(self) -> EvalCase:
        """The case as its eval run started with it: a copy of the case (never saved) carrying the snapshot's
        fields. A result stored before snapshots were kept has none: the case as it is now."""
        snapshot = self.case_snapshot
        if not isinstance(snapshot, dict) or not snapshot:
            return self.case
        as_run = copy.copy(self.case)
        for name in SNAPSHOT_FIELDS:
            if name in snapshot:
                setattr(as_run, name, snapshot[name])
        return as_run
