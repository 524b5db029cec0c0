"""``/api/v1/evals/``: eval sets and eval runs, for admin keys only (``ApiKey.admin``). One class per operation.

A caller's key (not an admin key) gets a 403; no key, a 401. Bad input is a 400 naming what is wrong. An admin key
scoped to agents (``ApiKey.agents``) starts and reads eval runs of those agents only, and of the sets it may read
(``_sets_in_scope``): any other agent, and any eval run against one or of another agent's set (the set's cases
are its questions), is a 404 as for ``POST /runs``, so the key learns nothing of them.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from django.db.models import Count, Q
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from rest_framework import permissions, serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.reverse import reverse
from rest_framework.utils.urls import replace_query_param
from rest_framework.views import APIView

from agent_platform.errors import ApplicationError
from agents.api.serializers import StrictCharField, StrictSerializer
from agents.api.throttling import ApiKeyRateThrottle
from agents.api.views import query_params_check
from agents.models import Agent, ApiKey
from evals.models import EvalCaseResult, EvalRun, EvalSet
from evals.services import (
    eval_run_cancel,
    eval_run_compare,
    eval_run_refresh,
    eval_run_start,
    eval_runs_for,
    eval_set_apply,
    eval_set_document,
)


class IsAdminKey(permissions.BasePermission):
    """An API key marked ``admin``; a caller's key is refused."""

    message = gettext_lazy("Only admin API keys may use the evals API.")

    def has_permission(self, request: Request, view: Any) -> bool:
        return isinstance(request.user, ApiKey) and request.user.is_authenticated and request.user.admin


class EvalsApi(APIView):
    permission_classes = [permissions.IsAuthenticated, IsAdminKey]
    throttle_classes = [ApiKeyRateThrottle]
    # Like the auditors' API: for admins' tools, not part of the callers' OpenAPI schema.
    schema = None


def _not_found(what: str) -> ApplicationError:
    return ApplicationError(_("%(what)s not found.") % {"what": what}, code="not_found", status=404)


def _agent_scope(key: ApiKey) -> list[Agent] | None:
    """The agents an admin key may run evals against and read the eval runs of; None: every agent."""
    agents = list(key.agents.all())
    return agents or None


def _in_scope(key: ApiKey, agent: Agent) -> bool:
    scope = _agent_scope(key)
    return scope is None or agent.pk in {a.pk for a in scope}


def _sets_in_scope(key: ApiKey) -> Any:
    """The eval sets a key may read and replace: every set, or for a key scoped to agents, those whose agent is
    one of them and those with no agent of their own."""
    scope = _agent_scope(key)
    sets = EvalSet.objects.all()
    return sets if scope is None else sets.filter(Q(agent__isnull=True) | Q(agent__in=scope))


def _agent_not_found(slug: str) -> ApplicationError:
    return ApplicationError(_("Agent '%(slug)s' not found.") % {"slug": slug}, code="agent_not_found", status=404)


def _set_summary(eval_set: EvalSet) -> dict[str, Any]:
    return {
        "name": eval_set.name,
        "description": eval_set.description,
        "agent": eval_set.agent.slug if eval_set.agent else None,
        "cases": total if (total := getattr(eval_set, "case_total", None)) is not None else eval_set.cases.count(),
        "thresholds": eval_set.thresholds,
        "sandbox_servers": eval_set.sandbox_servers,
    }


def _result(r: EvalCaseResult) -> dict[str, Any]:
    case = r.case_as_run()  # as its eval run asked it (the case may have been edited since)
    return {
        "case": case.key,
        "type": case.case_type,
        "query": case.query,
        "run": str(r.run_id) if r.run_id else None,
        # A case its eval run's cancellation ended has no score: not scored, neither passed nor failed.
        "scored": r.scored and not r.cancelled,
        "cancelled": r.cancelled,
        "passed": r.passed if r.scored and not r.cancelled else None,
        "called_tools": r.called_tools,
        "scores": r.scores,
        "answer": r.answer,
    }


def _run(eval_run: EvalRun) -> dict[str, Any]:
    return {
        "id": str(eval_run.id),
        "set": eval_run.eval_set.name,
        "agent": eval_run.agent.slug,
        "version": eval_run.version,
        "label": eval_run.label,
        "status": eval_run.status,
        "progress": {"done": eval_run.done, "total": eval_run.total},
        "summary": eval_run.summary,
        "thresholds": eval_run.thresholds,
        "failed_thresholds": eval_run.failed_thresholds,
        # null once finished too where the set had no threshold (``verdict`` ``no_thresholds``): nothing judged it.
        "passed": eval_run.passed,
        "verdict": eval_run.verdict,
        "sandbox_servers": eval_run.sandbox_servers,
        "created_at": eval_run.created_at.isoformat(),
        "finished_at": eval_run.finished_at.isoformat() if eval_run.finished_at else None,
    }


# A page of an eval run's cases: as many as a set usually has, so that a client written before the cases were
# paged (which reads ``cases`` alone) still gets every case of such a set.
CASES_PAGE_SIZE = 100


def _cases_cursor(result_id: int) -> str:
    return base64.urlsafe_b64encode(f"c|{result_id}".encode()).decode()


def _after_cursor(raw: str | None) -> int | None:
    """The result id a cursor this API wrote continues after; anything else is a 400 on ``cursor``."""
    if raw is None:
        return None
    try:
        kind, result_id = base64.urlsafe_b64decode(raw.encode("ascii")).decode("ascii").split("|")
        if kind != "c" or not result_id.isdigit():
            raise ValueError(raw)
        return int(result_id)
    except (binascii.Error, UnicodeError, ValueError):
        raise ValidationError({"cursor": [_("Invalid cursor.")]}) from None


def _eval_run_get(run_id: str, *, api_key: ApiKey) -> EvalRun:
    """An eval run ``api_key`` may read; any other id (unknown, against an agent out of the key's scope, or of a
    set out of it: an unscoped key may run another agent's set against the key's agent) is a 404."""
    import uuid

    try:
        key = uuid.UUID(str(run_id))
    except ValueError:
        raise _not_found(_("Eval run")) from None
    eval_run = EvalRun.objects.select_related("eval_set", "agent").filter(pk=key).first()
    scope = _agent_scope(api_key)
    ids = None if scope is None else {a.pk for a in scope}
    # As ``_in_scope`` (the run's agent) and ``_sets_in_scope`` (its set's agent, or none) decide, in one query.
    if eval_run is None or (
        ids is not None and (eval_run.agent_id not in ids or eval_run.eval_set.agent_id not in {None, *ids})
    ):
        raise _not_found(_("Eval run"))
    return eval_run


class EvalSetCollectionApi(EvalsApi):
    """``GET``: the sets. ``POST``: create or replace a set from its document (cases by key; ``expected_source``
    in any of seed 001's notations)."""

    def get(self, request: Request) -> Response:
        query_params_check(request.query_params)
        # Each set's case count read with the sets (a COUNT per set otherwise).
        sets = _sets_in_scope(request.user).select_related("agent").annotate(case_total=Count("cases")).order_by("name")
        return Response({"results": [_set_summary(s) for s in sets]})

    def post(self, request: Request) -> Response:
        query_params_check(request.query_params)
        if not isinstance(request.data, dict):
            raise ApplicationError(_("Send the eval set as a JSON object."), code="invalid_eval_set")
        slug = request.data.get("agent")
        agent = Agent.objects.filter(slug=slug).first() if isinstance(slug, str) and slug else None
        if agent is not None and not _in_scope(request.user, agent):
            # As an unknown agent is refused (eval_set_apply): the key learns nothing of agents out of its scope.
            raise ApplicationError(
                _("The eval set is not valid: %(problems)s")
                % {"problems": _("agent: unknown agent '%(slug)s'") % {"slug": slug}},
                code="invalid_eval_set",
            )
        name = request.data.get("name")
        if (
            isinstance(name, str)
            and EvalSet.objects.filter(name=name).exists()
            and not _sets_in_scope(request.user).filter(name=name).exists()
        ):
            raise _not_found(_("Eval set"))  # another agent's, out of the key's scope: not replaced, not named
        applied = eval_set_apply(document=request.data, actor=request.user, via="api", replace=True)
        body = eval_set_document(applied.eval_set)
        return Response(body, status=status.HTTP_201_CREATED if applied.created else status.HTTP_200_OK)


class EvalSetDetailApi(EvalsApi):
    def get(self, request: Request, name: str) -> Response:
        query_params_check(request.query_params)
        eval_set = _sets_in_scope(request.user).select_related("agent").filter(name=name).first()
        if eval_set is None:
            raise _not_found(_("Eval set"))
        return Response(eval_set_document(eval_set))


class StrictIntegerField(serializers.IntegerField):
    """A JSON number, and only a number: DRF's IntegerField would take ``"1"`` as 1 and ``true`` as 1, where a value
    of the wrong JSON type is a 400 naming its field (as a set document's are)."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        return super().to_internal_value(data)  # type: ignore[no-any-return]


class EvalRunCollectionApi(EvalsApi):
    """``GET``: eval runs, newest first (``?set=``, ``?agent=``). ``POST``: start one; ``202`` with its id."""

    class InputSerializer(StrictSerializer):
        set = StrictCharField(max_length=100)
        agent = StrictCharField(max_length=64, required=False)
        version = StrictIntegerField(min_value=1, required=False)
        label = StrictCharField(max_length=200, required=False, allow_blank=True)

    class FilterSerializer(StrictSerializer):
        set = StrictCharField(max_length=100, required=False, allow_blank=True)
        agent = StrictCharField(max_length=64, required=False, allow_blank=True)

    def get(self, request: Request) -> Response:
        # Filters as the runs and audit APIs take theirs: an unknown or misspelt one is a 400, not ignored, and so is
        # one given twice (``.dict()`` read the last: ?set=nope&set=s1 answered s1's runs).
        query_params_check(request.query_params, accepted=tuple(self.FilterSerializer().fields))
        self.FilterSerializer(data=request.query_params.dict()).is_valid(raise_exception=True)
        eval_set = agent = None
        if name := request.query_params.get("set"):
            eval_set = _sets_in_scope(request.user).filter(name=name).first()
            if eval_set is None:
                raise _not_found(_("Eval set"))
        if slug := request.query_params.get("agent"):
            agent = Agent.objects.filter(slug=slug).first()
            if agent is None or not _in_scope(request.user, agent):
                raise _not_found(_("Agent"))
        scope = _agent_scope(request.user)
        sets = None if scope is None else _sets_in_scope(request.user)
        runs = list(eval_runs_for(eval_set=eval_set, agent=agent, agents=scope, eval_sets=sets)[:100])
        return Response({"results": [_run(r) for r in runs]})

    def post(self, request: Request) -> Response:
        query_params_check(request.query_params)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        eval_set = _sets_in_scope(request.user).select_related("agent").filter(name=values["set"]).first()
        if eval_set is None:
            raise _not_found(_("Eval set"))
        agent = Agent.objects.filter(slug=values["agent"]).first() if "agent" in values else eval_set.agent
        if agent is not None and not _in_scope(request.user, agent):
            raise _agent_not_found(agent.slug)  # named or the set's default: out of the key's scope
        if agent is None:
            raise ApplicationError(
                _("Name the agent: the eval set has no default agent.")
                if "agent" not in values
                else _("Agent '%(slug)s' not found.") % {"slug": values["agent"]},
                code="agent_not_found",
                status=404 if "agent" in values else 400,
            )
        eval_run = eval_run_start(
            eval_set=eval_set,
            agent=agent,
            actor=request.user.audit_actor_label(),
            version=values.get("version"),
            label=values.get("label", ""),
        )
        return Response(_run(eval_run), status=status.HTTP_202_ACCEPTED)


class EvalRunDetailApi(EvalsApi):
    """An eval run with its progress, its scores and its cases' (cases scored as their runs finish), a page of
    cases at a time in the set's order: ``cases`` (``?page_size=``, 1–100, default 100) and ``cases_next``, the
    URL of the next page (null on the last). A client that reads ``cases`` alone still gets every case of a set of
    up to 100. The cursor is opaque (base64 of ``c|`` and the last result's id); unknown parameters are a 400, as
    the other lists' are."""

    class FilterSerializer(StrictSerializer):
        page_size = serializers.IntegerField(min_value=1, max_value=CASES_PAGE_SIZE, required=False)
        cursor = StrictCharField(max_length=1000, required=False)

    def get(self, request: Request, run_id: str) -> Response:
        eval_run = _eval_run_get(run_id, api_key=request.user)
        query_params_check(request.query_params, accepted=tuple(self.FilterSerializer().fields))
        filters = self.FilterSerializer(data=request.query_params.dict())
        filters.is_valid(raise_exception=True)
        size = filters.validated_data.get("page_size", CASES_PAGE_SIZE)
        after = _after_cursor(filters.validated_data.get("cursor"))
        if eval_run.status == EvalRun.Status.RUNNING:
            eval_run = eval_run_refresh(eval_run=eval_run)
        return Response(_run_with_cases(eval_run, detail_url=request.build_absolute_uri(), size=size, after=after))


def _run_with_cases(eval_run: EvalRun, *, detail_url: str, size: int, after: int | None) -> dict[str, Any]:
    """The eval run as ``GET /evals/runs/{id}`` answers it: ``_run`` with a page of ``size`` cases after result
    ``after`` and ``cases_next``, ``detail_url`` (the detail's address, with its query) for the next page."""
    results = eval_run.results.select_related("case").order_by("pk")
    if after is not None:
        results = results.filter(pk__gt=after)
    page = list(results[: size + 1])
    more = len(page) > size
    page = page[:size]
    next_url = replace_query_param(detail_url, "cursor", _cases_cursor(page[-1].pk)) if more else None
    return {**_run(eval_run), "cases": [_result(r) for r in page], "cases_next": next_url}


class EvalRunCancelApi(EvalsApi):
    """``POST``: cancel a running eval run (``evals.services.eval_run_cancel``): its unfinished runs are cancelled
    (their pending approvals expire, their budget reservations are released), its cases not yet scored end
    unscored (``eval:cancelled``) and are never submitted; cases already scored keep their scores. Answers the eval
    run as ``GET /evals/runs/{id}`` does (its first page of cases), ``cancelled``. An eval run the key may not read
    is a 404, as for ``GET``; one that has already finished or been cancelled, a 409 ``eval_run_finished``. The
    body is not read."""

    def post(self, request: Request, run_id: str) -> Response:
        query_params_check(request.query_params)
        eval_run = _eval_run_get(run_id, api_key=request.user)
        eval_run = eval_run_cancel(eval_run=eval_run, actor=request.user.audit_actor_label(), via="api")
        detail = reverse("eval-run-detail", kwargs={"run_id": str(eval_run.pk)}, request=request)
        return Response(_run_with_cases(eval_run, detail_url=detail, size=CASES_PAGE_SIZE, after=None))


class EvalRunCompareApi(EvalsApi):
    """Two eval runs of one set side by side, the cases that changed outcome first; runs of two sets are a 400
    ``eval_runs_not_comparable`` (``eval_run_compare``), either one out of the key's scope a 404."""

    def get(self, request: Request, run_id: str, other_id: str) -> Response:
        query_params_check(request.query_params)
        a, b = _eval_run_get(run_id, api_key=request.user), _eval_run_get(other_id, api_key=request.user)
        rows = eval_run_compare(a=a, b=b)
        return Response(
            {
                "a": _run(a),
                "b": _run(b),
                "changed": sum(1 for r in rows if r.changed),
                "cases": [
                    {
                        "case": row.case.key,
                        "changed": row.changed,
                        "a": _result(row.a) if row.a else None,
                        "b": _result(row.b) if row.b else None,
                    }
                    for row in rows
                ],
            }
        )
