"""The runs API: one class per operation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.utils.translation import gettext as _
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
    extend_schema_field,
    extend_schema_serializer,
)
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agent_platform.errors import ApplicationError
from agents.api.a2a import decoded_size, run_input_from_body
from agents.api.auth import caller_of
from agents.api.config import api_setting
from agents.api.schema import RETRY_AFTER, error_responses
from agents.api.throttling import ApiKeyRateThrottle
from agents.approvals import approval_decide
from agents.models import Approval, Run
from agents.selectors import run_get, run_list, run_tool_calls, run_wait
from agents.services import request_digest, run_cancel, run_submit

IDEMPOTENCY_KEY_MAX_CHARS = 200


class ApiView(APIView):
    """Every endpoint counts against the caller's rate limit (per API key)."""

    throttle_classes = [ApiKeyRateThrottle]


# --- fields and input shapes -----------------------------------------------------------------------------


class StrictCharField(serializers.CharField):
    """A string, and only a string: DRF's CharField would turn 123 into "123"."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)  # type: ignore[no-any-return]


class StrictSerializer(serializers.Serializer):
    """Refuses keys it does not declare (DRF would drop them silently), naming each one."""

    def to_internal_value(self, data: Any) -> Any:
        unknown: dict[str, list[str]] = {}
        if isinstance(data, Mapping):
            unknown = {str(name): [_("Unknown field.")] for name in data if name not in self.fields}
        try:
            value = super().to_internal_value(data)
        except ValidationError as exc:
            if unknown and isinstance(exc.detail, dict):
                raise ValidationError({**exc.detail, **unknown}) from None
            raise
        if unknown:
            raise ValidationError(unknown)
        return value


@extend_schema_serializer(component_name="A2AFile")
class A2AFileSerializer(StrictSerializer):
    """An A2A file: `uri` or base64 `bytes` (exactly one). Only metadata is kept: never the bytes."""

    name = StrictCharField(required=False, allow_blank=True, max_length=255)
    mimeType = StrictCharField(required=False, allow_blank=True, max_length=255)
    uri = StrictCharField(required=False, max_length=2048, help_text="Where the file is (kept with the run).")
    bytes = StrictCharField(
        required=False, trim_whitespace=False, help_text="Base64 content: counted (size), never stored."
    )

    def validate_uri(self, value: str) -> str:
        if not urlsplit(value).scheme:
            raise ValidationError(_("Enter a URI with a scheme, e.g. https://…"))
        return value

    def validate_bytes(self, value: str) -> str:
        if decoded_size(value) is None:
            raise ValidationError(_("Not valid base64."))
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("uri" in attrs) == ("bytes" in attrs):
            raise ValidationError({"uri": [_("Give exactly one of 'uri' and 'bytes'.")]})
        return attrs


@extend_schema_serializer(component_name="A2ATextPart")
class A2ATextPartSerializer(StrictSerializer):
    kind = serializers.ChoiceField(choices=["text"])
    text = StrictCharField(allow_blank=True, trim_whitespace=False)
    metadata = serializers.DictField(required=False)


@extend_schema_serializer(component_name="A2ADataPart")
class A2ADataPartSerializer(StrictSerializer):
    kind = serializers.ChoiceField(choices=["data"])
    data = serializers.DictField(help_text="Structured input: one entry of the run's a2a_data.")
    metadata = serializers.DictField(required=False)


@extend_schema_serializer(component_name="A2AFilePart")
class A2AFilePartSerializer(StrictSerializer):
    kind = serializers.ChoiceField(choices=["file"])
    file = A2AFileSerializer()
    metadata = serializers.DictField(required=False)


A2A_PARTS: dict[str, type[serializers.Serializer]] = {
    "text": A2ATextPartSerializer,
    "data": A2ADataPartSerializer,
    "file": A2AFilePartSerializer,
}


@extend_schema_field(
    PolymorphicProxySerializer(
        component_name="A2APart", serializers=A2A_PARTS, resource_type_field_name="kind", many=False
    )
)
class A2APartField(serializers.Field):
    """One part of an A2A message, validated by its ``kind``."""

    default_error_messages = {"invalid": _("Expected an object with a 'kind' of text, data or file.")}

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, Mapping):
            self.fail("invalid")
        part_serializer = A2A_PARTS.get(data.get("kind")) if isinstance(data.get("kind"), str) else None
        if part_serializer is None:
            raise ValidationError({"kind": [_("Expected one of: text, data, file.")]})
        part = part_serializer(data=data)
        if not part.is_valid():
            raise ValidationError(part.errors)
        return dict(part.validated_data)

    def to_representation(self, value: Any) -> Any:
        return value


@extend_schema_serializer(component_name="A2AMessage")
class A2AMessageSerializer(StrictSerializer):
    """An A2A `Message` from the user. Its text parts (joined) are the query."""

    role = serializers.ChoiceField(choices=["user"])
    parts = serializers.ListField(child=A2APartField(), allow_empty=False, max_length=100)
    kind = serializers.ChoiceField(choices=["message"], required=False)
    messageId = StrictCharField(required=False, max_length=200)
    contextId = StrictCharField(required=False, max_length=200)
    taskId = StrictCharField(required=False, max_length=200)
    referenceTaskIds = serializers.ListField(child=StrictCharField(max_length=200), required=False, max_length=100)
    extensions = serializers.ListField(child=StrictCharField(max_length=2048), required=False, max_length=100)
    metadata = serializers.DictField(required=False)

    def validate_parts(self, parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
        has_text = any(p["kind"] == "text" and p["text"].strip() for p in parts)
        has_data = any(p["kind"] == "data" for p in parts)
        if not (has_text or has_data):
            raise ValidationError(_("The message needs a text part (the query) or a data part."))
        return parts


# --- output shapes ---------------------------------------------------------------------------------------


@extend_schema_serializer(component_name="RunError")
class RunErrorSerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()


@extend_schema_serializer(component_name="ToolCall")
class ToolCallSerializer(serializers.Serializer):
    source = serializers.CharField(help_text="deterministic, agent, flow or admin")
    mcp_id = serializers.CharField()
    name = serializers.CharField()
    args = serializers.JSONField(help_text="Masked.")
    ok = serializers.BooleanField()
    reason = serializers.CharField(help_text="Empty, or the failure's reason code.")
    attempt = serializers.IntegerField()
    latency_ms = serializers.FloatField(allow_null=True)


@extend_schema_serializer(component_name="Approval")
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


@extend_schema_serializer(component_name="Run")
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
            "a2a_data",
            "a2a_files",
            "answer",
            "error",
            "deterministic_results",
            "tool_calls",
            "approvals",
            "timings",
            "token_usage",
            "tool_failures",
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

    @extend_schema_field(RunErrorSerializer(allow_null=True))
    def get_error(self, run: Run) -> dict[str, str] | None:
        if not run.error_code:
            return None
        return {"code": run.error_code, "message": run.error_message}

    @extend_schema_field(ToolCallSerializer(many=True))
    def get_tool_calls(self, run: Run) -> list[dict[str, Any]]:
        return run_tool_calls(run=run)

    @extend_schema_field(ApprovalOutputSerializer(many=True))
    def get_approvals(self, run: Run) -> list[dict[str, Any]]:
        return [ApprovalOutputSerializer(a).data for a in run.approvals.order_by("created_at")]


@extend_schema_serializer(component_name="RunSummary")
class RunSummarySerializer(serializers.ModelSerializer):
    """A run in a list: no trace, tool calls or approvals (`GET /runs/{id}` has them)."""

    agent = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    error = serializers.SerializerMethodField()

    class Meta:
        model = Run
        fields = ["id", "agent", "status", "query", "answer", "error", "created_at", "started_at", "finished_at"]

    @extend_schema_field(RunErrorSerializer(allow_null=True))
    def get_error(self, run: Run) -> dict[str, str] | None:
        if not run.error_code:
            return None
        return {"code": run.error_code, "message": run.error_message}


@extend_schema_serializer(component_name="RunPage")
class RunPageSerializer(serializers.Serializer):
    next = serializers.URLField(allow_null=True, help_text="The next (older) page, or null.")
    previous = serializers.URLField(allow_null=True, help_text="The previous (newer) page, or null.")
    results = RunSummarySerializer(many=True)


# --- POST /runs ------------------------------------------------------------------------------------------

A2A_EXAMPLE = {
    "agent": "company-assistant",
    "message": {
        "role": "user",
        "parts": [
            {"kind": "text", "text": "주문 상태를 알려주세요"},
            {"kind": "data", "data": {"order": {"id": "O-1001"}}},
            {
                "kind": "file",
                "file": {"name": "receipt.pdf", "mimeType": "application/pdf", "uri": "https://example.com/r.pdf"},
            },
        ],
    },
    "context": {"userId": "E-1001", "sessionId": "s-1", "chatbotId": "premium-support"},
}


class RunCreateApi(ApiView):
    @extend_schema_serializer(component_name="RunCreateRequest")
    class InputSerializer(StrictSerializer):
        """Exactly one of `query` (with optional `data` and `files`) and `message` (an A2A message)."""

        agent = StrictCharField(max_length=64, help_text="The agent's slug.")
        query = StrictCharField(
            required=False, trim_whitespace=True, allow_blank=False, help_text="The question. Not with `message`."
        )
        message = A2AMessageSerializer(required=False, help_text="An A2A message instead of `query`/`data`/`files`.")
        context = serializers.DictField(
            required=False, default=dict, help_text="A2A context: userId, sessionId, chatbotId, …"
        )
        data = serializers.ListField(
            child=serializers.DictField(), required=False, default=list, max_length=100, help_text="A2A data objects."
        )
        files = serializers.ListField(
            child=A2AFileSerializer(), required=False, default=list, max_length=100, help_text="A2A files."
        )

        def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
            given = set(self.initial_data) if isinstance(self.initial_data, Mapping) else set()
            if "query" in given and "message" in given:
                both = [_("Give either 'query' or 'message', not both.")]
                raise ValidationError({"query": both, "message": both})
            if "query" not in given and "message" not in given:
                raise ValidationError({"query": [_("Give 'query' (a string) or 'message' (an A2A message).")]})
            if "message" in given:
                extra = {
                    name: [_("With 'message', send this as a part of the message.")]
                    for name in ("data", "files")
                    if name in given
                }
                if extra:
                    raise ValidationError(extra)
            return attrs

    @extend_schema(
        operation_id="runs_create",
        summary="Submit a query to an agent",
        description=(
            "Queues a run and answers `202` with it. The body is either plain (`query`, optional `context`, "
            "`data`, `files`) or an A2A message (`message`, optional `context`): text parts joined become the "
            "query, data parts `a2a_data`, file parts `a2a_files` (metadata only). Unknown fields are refused. "
            "`?wait=N` (≤ 60 s) answers `200` with the finished run if it ends in time. With an "
            "`Idempotency-Key` header, the same key and body (from the same API key) answer `200` with the run "
            "the first request created (header `Idempotent-Replayed: true`); the same key with another body is "
            "a `409`."
        ),
        tags=["runs"],
        request=InputSerializer,
        parameters=[
            OpenApiParameter(
                "wait",
                OpenApiTypes.NUMBER,
                OpenApiParameter.QUERY,
                description="Seconds (0–60) to wait for the run to finish (or park on an approval).",
            ),
            OpenApiParameter(
                "Idempotency-Key",
                OpenApiTypes.STR,
                OpenApiParameter.HEADER,
                description="At most 200 printable ASCII characters; scoped to the API key.",
            ),
            RETRY_AFTER,
            OpenApiParameter(
                "Idempotent-Replayed",
                OpenApiTypes.STR,
                OpenApiParameter.HEADER,
                response=[200],
                enum=["true"],
                description="Present when an earlier request with the same Idempotency-Key created this run.",
            ),
        ],
        responses={
            202: OpenApiResponse(RunOutputSerializer, description="Queued."),
            200: OpenApiResponse(
                RunOutputSerializer, description="Finished within `wait`, or a replay of an Idempotency-Key."
            ),
            **error_responses(
                400,
                401,
                404,
                409,
                413,
                415,
                429,
                conflicts="`agent_disabled`, or `idempotency_key_reused` (same key, another body).",
            ),
        },
        examples=[
            OpenApiExample(
                "plain",
                value={"agent": "company-assistant", "query": "김하늘 님은 어느 팀 소속인가요?"},
                request_only=True,
            ),
            OpenApiExample("A2A message", value=A2A_EXAMPLE, request_only=True),
        ],
    )
    def post(self, request: Request) -> Response:
        _refuse_an_oversized_body(request)
        if not isinstance(request.data, dict):
            raise ApplicationError(_("The body must be a JSON object."), code="invalid_input", status=400)
        _refuse_an_overlong_query(request.data.get("query"))
        idempotency_key = _idempotency_key(request)
        wait_s = _wait_seconds(request)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        run_input = run_input_from_body(serializer.validated_data)
        _refuse_an_overlong_query(run_input.query)
        submission = run_submit(
            agent_slug=serializer.validated_data["agent"],
            query=run_input.query,
            api_key=caller_of(request),
            context=run_input.context,
            a2a_data=run_input.a2a_data,
            a2a_files=run_input.a2a_files,
            idempotency_key=idempotency_key,
            digest=request_digest(request.data),
        )
        run = submission.run
        headers = {"Idempotent-Replayed": "true"} if submission.replayed else None
        if wait_s:
            run = run_wait(run=run, timeout_s=wait_s)
        done = submission.replayed or run.is_finished
        return Response(
            RunOutputSerializer(run).data,
            status=status.HTTP_200_OK if done else status.HTTP_202_ACCEPTED,
            headers=headers,
        )


def _refuse_an_oversized_body(request: Request) -> None:
    limit = int(api_setting("PLATFORM_API_MAX_BODY_BYTES"))
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length > limit:
        raise ApplicationError(
            _("The body is larger than %(max)d bytes.") % {"max": limit}, code="body_too_large", status=413
        )


def _refuse_an_overlong_query(query: Any) -> None:
    if isinstance(query, str) and len(query) > settings.PLATFORM_RUN_QUERY_MAX_CHARS:
        raise ApplicationError(
            _("The query is longer than %(max)d characters.") % {"max": settings.PLATFORM_RUN_QUERY_MAX_CHARS},
            code="query_too_long",
            status=413,
        )


def _idempotency_key(request: Request) -> str:
    raw = request.headers.get("Idempotency-Key")
    if raw is None:
        return ""
    key = raw.strip()
    if not key or len(key) > IDEMPOTENCY_KEY_MAX_CHARS or not all(33 <= ord(c) <= 126 for c in key):
        raise ApplicationError(
            _("'Idempotency-Key' must be 1 to %(max)d printable ASCII characters without spaces.")
            % {"max": IDEMPOTENCY_KEY_MAX_CHARS},
            code="invalid_input",
            status=400,
            fields={"Idempotency-Key": [_("Invalid value.")]},
        )
    return key


def _wait_seconds(request: Request) -> float:
    raw = request.query_params.get("wait")
    if raw in (None, ""):
        return 0.0
    limit = float(api_setting("PLATFORM_API_MAX_WAIT_S"))
    try:
        value = float(raw)
    except ValueError:
        raise ApplicationError(
            _("'wait' must be a number of seconds."), code="invalid_input", status=400, fields={"wait": [raw]}
        ) from None
    if not 0 <= value <= limit:  # NaN fails both
        raise ApplicationError(
            _("'wait' must be between 0 and %(max)d seconds.") % {"max": limit},
            code="invalid_input",
            status=400,
            fields={"wait": [raw]},
        )
    return value


# --- GET /runs -------------------------------------------------------------------------------------------


class RunCursorPagination(CursorPagination):
    """Newest first; a page's ``next`` link continues after its last run, unaffected by runs created since."""

    ordering = ("-created_at",)
    page_size = 20
    page_size_query_param = "page_size"
    max_page_size = 100

    def decode_cursor(self, request: Request) -> Any:
        try:
            return super().decode_cursor(request)
        except NotFound:
            raise ValidationError({"cursor": [_("Invalid cursor.")]}) from None


class RunListApi(ApiView):
    @extend_schema_serializer(component_name="RunListFilters")
    class FilterSerializer(StrictSerializer):
        agent = StrictCharField(required=False, max_length=64)
        status = serializers.ChoiceField(choices=Run.Status.choices, required=False)
        page_size = serializers.IntegerField(required=False, min_value=1, max_value=100)
        cursor = StrictCharField(required=False, max_length=1000)

    @extend_schema(
        operation_id="runs_list",
        summary="The caller's runs",
        description=(
            "The runs this API key submitted, newest first, optionally of one `agent` (slug) and/or in one "
            "`status`. Cursor pagination: follow `next` (older runs) and `previous` (newer runs); `page_size` "
            "is 1–100 (20 by default). Runs created while paging never shift a page."
        ),
        tags=["runs"],
        parameters=[
            OpenApiParameter("agent", OpenApiTypes.STR, OpenApiParameter.QUERY, description="An agent's slug."),
            OpenApiParameter("status", OpenApiTypes.STR, OpenApiParameter.QUERY, enum=Run.Status.values),
            OpenApiParameter("page_size", OpenApiTypes.INT, OpenApiParameter.QUERY, description="1–100."),
            OpenApiParameter("cursor", OpenApiTypes.STR, OpenApiParameter.QUERY, description="From `next`/`previous`."),
            RETRY_AFTER,
        ],
        responses={200: RunPageSerializer, **error_responses(400, 401, 429)},
    )
    def get(self, request: Request) -> Response:
        filters = self.FilterSerializer(data=request.query_params.dict())
        filters.is_valid(raise_exception=True)
        runs = run_list(
            api_key=caller_of(request),
            agent_slug=filters.validated_data.get("agent"),
            status=filters.validated_data.get("status"),
        )
        paginator = RunCursorPagination()
        page = paginator.paginate_queryset(runs, request, view=self)
        return Response(
            {
                "next": paginator.get_next_link(),
                "previous": paginator.get_previous_link(),
                "results": RunSummarySerializer(page, many=True).data,
            }
        )


class RunCollectionApi(RunListApi, RunCreateApi):
    """``/runs`` takes GET (``RunListApi``) and POST (``RunCreateApi``): one URL, each operation its class."""


# --- /runs/{id} ------------------------------------------------------------------------------------------


class RunDetailApi(ApiView):
    @extend_schema(
        operation_id="runs_retrieve",
        summary="A run",
        description="Status, answer, error, deterministic results, tool calls (masked), approvals, timings.",
        tags=["runs"],
        parameters=[RETRY_AFTER],
        responses={200: RunOutputSerializer, **error_responses(401, 404, 429)},
    )
    def get(self, request: Request, run_id: str) -> Response:
        run = run_get(run_id=run_id, api_key=caller_of(request))
        return Response(RunOutputSerializer(run).data)


class RunCancelApi(ApiView):
    @extend_schema(
        operation_id="runs_cancel",
        summary="Cancel a run",
        description=(
            "A queued run never starts; a run awaiting approval stops there (its pending approvals expire); a "
            "running run stops at its next step (a tool call under way finishes first). Answers the run, "
            "`cancelled`. A finished run is a `409` (`run_finished`)."
        ),
        tags=["runs"],
        request=None,
        parameters=[RETRY_AFTER],
        responses={
            200: RunOutputSerializer,
            **error_responses(401, 404, 409, 429, conflicts="`run_finished`: the run has already finished."),
        },
    )
    def post(self, request: Request, run_id: str) -> Response:
        run = run_get(run_id=run_id, api_key=caller_of(request))
        run = run_cancel(run=run, actor=f"api_key:{caller_of(request).prefix}")
        return Response(RunOutputSerializer(run).data)


class RunApprovalDecideApi(ApiView):
    @extend_schema_serializer(component_name="ApprovalDecision")
    class InputSerializer(StrictSerializer):
        decision = serializers.ChoiceField(choices=["approve", "reject"])
        reason = StrictCharField(required=False, allow_blank=True, max_length=2000, default="")

    @extend_schema(
        operation_id="runs_approvals_decide",
        summary="Approve or reject a pending write call",
        description="The run resumes at once. A decision is taken once: a decided or expired approval is a `409`.",
        tags=["runs"],
        request=InputSerializer,
        parameters=[RETRY_AFTER],
        responses={
            200: ApprovalOutputSerializer,
            **error_responses(
                400,
                401,
                404,
                409,
                415,
                429,
                conflicts="`approval_decided` (already decided) or `approval_expired`.",
            ),
        },
    )
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
            by_caller=True,
        )
        return Response(ApprovalOutputSerializer(approval).data)
