"""The runs API: one class per operation."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.utils.translation import gettext as _
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agent_platform.errors import ApplicationError
from agents.api.auth import caller_of
from agents.approvals import approval_decide
from agents.models import Approval, Run
from agents.selectors import run_get, run_tool_calls, run_wait
from agents.services import run_create


class StrictCharField(serializers.CharField):
    """A string, and only a string: DRF's CharField would turn 123 into "123"."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)  # type: ignore[no-any-return]


class RunOutputSerializer(serializers.ModelSerializer):
    agent = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    error = serializers.SerializerMethodField()
    tool_calls = serializers.SerializerMethodField()
    approvals = serializers.SerializerMethodField()

    class Meta:
        model = Run
        fields = [
            "id",
            "agent",
            "status",
            "query",
            "context",
            "answer",
            "error",
            "deterministic_results",
            "tool_calls",
            "approvals",
            "timings",
            "token_usage",
            "created_at",
            "started_at",
            "finished_at",
        ]

    def to_representation(self, instance: Run) -> dict[str, Any]:
        data = super().to_representation(instance)
        data["deterministic_results"] = [
            {k: v for k, v in r.items() if k != "answer_template"} for r in data.get("deterministic_results") or []
        ]
        return data

    def get_error(self, run: Run) -> dict[str, str] | None:
        if not run.error_code:
            return None
        return {"code": run.error_code, "message": run.error_message}

    def get_tool_calls(self, run: Run) -> list[dict[str, Any]]:
        return run_tool_calls(run=run)

    def get_approvals(self, run: Run) -> list[dict[str, Any]]:
        return [ApprovalOutputSerializer(a).data for a in run.approvals.order_by("created_at")]


class ApprovalOutputSerializer(serializers.ModelSerializer):
    class Meta:
        model = Approval
        fields = [
            "id",
            "mcp_id",
            "tool",
            "args",
            "status",
            "requested_by",
            "decided_by",
            "decided_at",
            "reason",
            "expires_at",
            "created_at",
        ]


class RunCreateApi(APIView):
    class InputSerializer(serializers.Serializer):
        agent = StrictCharField(max_length=64)
        query = StrictCharField(trim_whitespace=True, allow_blank=False)
        context = serializers.DictField(required=False, default=dict)
        data = serializers.ListField(child=serializers.DictField(), required=False, default=list)
        files = serializers.ListField(child=serializers.DictField(), required=False, default=list)

    def post(self, request: Request) -> Response:
        if not isinstance(request.data, dict):
            raise ApplicationError(_("The body must be a JSON object."), code="invalid_input", status=400)
        query = request.data.get("query")
        if isinstance(query, str) and len(query) > settings.PLATFORM_RUN_QUERY_MAX_CHARS:
            raise ApplicationError(
                _("The query is longer than %(max)d characters.") % {"max": settings.PLATFORM_RUN_QUERY_MAX_CHARS},
                code="query_too_long",
                status=413,
            )
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        run = run_create(
            agent_slug=data["agent"],
            query=data["query"],
            api_key=caller_of(request),
            context=data["context"],
            a2a_data=data["data"],
            a2a_files=data["files"],
            idempotency_key=request.headers.get("Idempotency-Key", "")[:200],
        )
        wait_s = _wait_seconds(request)
        if wait_s:
            run = run_wait(run=run, timeout_s=wait_s)
            if run.is_finished:
                return Response(RunOutputSerializer(run).data, status=status.HTTP_200_OK)
        return Response(RunOutputSerializer(run).data, status=status.HTTP_202_ACCEPTED)


MAX_WAIT_S = 60.0


def _wait_seconds(request: Request) -> float:
    raw = request.query_params.get("wait")
    if raw in (None, ""):
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise ApplicationError(
            _("'wait' must be a number of seconds."), code="invalid_input", status=400, fields={"wait": [raw]}
        ) from None
    if not 0 <= value <= MAX_WAIT_S:
        raise ApplicationError(
            _("'wait' must be between 0 and %(max)d seconds.") % {"max": MAX_WAIT_S},
            code="invalid_input",
            status=400,
            fields={"wait": [raw]},
        )
    return value


class RunDetailApi(APIView):
    def get(self, request: Request, run_id: str) -> Response:
        run = run_get(run_id=run_id, api_key=caller_of(request))
        return Response(RunOutputSerializer(run).data)


class RunApprovalDecideApi(APIView):
    class InputSerializer(serializers.Serializer):
        decision = serializers.ChoiceField(choices=["approve", "reject"])
        reason = StrictCharField(required=False, allow_blank=True, max_length=2000, default="")

    def post(self, request: Request, run_id: str, approval_id: str) -> Response:
        run = run_get(run_id=run_id, api_key=caller_of(request))
        if not isinstance(request.data, dict):
            raise ApplicationError(_("The body must be a JSON object."), code="invalid_input", status=400)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        approval = approval_decide(
            run=run,
            approval_id=approval_id,
            decision=serializer.validated_data["decision"],
            actor=f"api_key:{caller_of(request).prefix}",
            reason=serializer.validated_data["reason"],
        )
        return Response(ApprovalOutputSerializer(approval).data)
