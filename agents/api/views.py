"""The runs API: one class per operation, each with its own input serializer nested; the shapes they share
(strict fields, the A2A message, the outputs) are in ``agents/api/serializers.py``."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import re
import time
import unicodedata
import uuid
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from django.db.models import Q, QuerySet
from django.http import QueryDict
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import ngettext
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_serializer,
)
from rest_framework import exceptions, serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import remove_query_param, replace_query_param
from rest_framework.views import APIView

from agent_platform.errors import ApplicationError
from agent_platform.text import nfc_value
from agents.api.a2a import RunInput, run_input_from_body
from agents.api.auth import caller_of
from agents.api.config import api_setting
from agents.api.protocol_http import KeyRecheck
from agents.api.schema import ERROR_DESCRIPTIONS, RETRY_AFTER, ErrorSerializer, error_responses
from agents.api.serializers import (
    A2AFileSerializer,
    A2AMessageSerializer,
    ApprovalOutputSerializer,
    AsciiIntegerField,
    BoundedListField,
    RunContextField,
    RunOutputSerializer,
    RunPageSerializer,
    RunSummarySerializer,
    StrictCharField,
    StrictSerializer,
    UsageSerializer,
)
from agents.api.throttling import ApiKeyRateThrottle
from agents.approvals import approval_decide
from agents.budgets import api_key_usage
from agents.models import ApiKey, Run
from agents.selectors import run_get, run_list, run_seen_finished, run_wait
from agents.services import request_digest, run_cancel, run_feedback_record, run_query_check, run_submit

IDEMPOTENCY_KEY_MAX_CHARS = 200


class ApiView(APIView):
    """Every endpoint counts against the caller's rate limit (per API key)."""

    throttle_classes = [ApiKeyRateThrottle]

    def get_view_description(self, html: bool = False) -> str:
        """What ``OPTIONS`` (DRF's metadata) says of an endpoint: a pointer to the schema. DRF would answer the
        class's docstring, a note for this code's readers."""
        return _("Described in the OpenAPI schema: %(url)s") % {"url": reverse("api-schema")}


def query_params_check(query_params: Iterable[str], *, accepted: Collection[str] = ()) -> None:
    """Refuses (``400 invalid_input``) every query parameter an endpoint does not take, each named in ``fields``
    and the ones it takes named in the message. Ignored, a misspelt ``?wiat=30`` would answer at once, without the
    wait the caller asked for, and nothing would tell them why. A parameter given more than once (``?wait=5&wait=6``)
    is refused too, naming it: one of its values would be read and the others silently dropped. Raises
    ``ApplicationError``: the REST views and the event stream (``agents.api.events``) answer it in the one error
    shape."""
    unknown = [name for name in query_params if name not in accepted]
    if not unknown:
        query_params_once_check(query_params)
        return
    named = ngettext("Unknown query parameter: %(names)s.", "Unknown query parameters: %(names)s.", len(unknown)) % {
        "names": _quoted(unknown)
    }
    if accepted:
        takes = _("This endpoint takes: %(names)s.") % {"names": _quoted(accepted)}
    else:
        takes = _("This endpoint takes no query parameters.")
    raise ApplicationError(
        f"{named} {takes}",
        code="invalid_input",
        status=400,
        fields={name: [_("Unknown query parameter.")] for name in unknown},
    )


def query_params_once_check(query_params: Iterable[str]) -> None:
    """Refuses (``400 invalid_input``, raising ``ApplicationError``) a query parameter given more than once
    (``?ok=false&ok=true``), each named in ``fields`` and the message: one of its values would be read and the
    others silently dropped. Also the auditors' API's check (``auditor.api``), in the same words."""
    repeated = (
        [name for name, values in query_params.lists() if len(values) > 1]
        if isinstance(query_params, QueryDict)
        else []
    )
    if repeated:
        raise ApplicationError(
            ngettext(
                "This query parameter was given more than once: %(names)s. Give it once.",
                "These query parameters were given more than once: %(names)s. Give each once.",
                len(repeated),
            )
            % {"names": _quoted(repeated)},
            code="invalid_input",
            status=400,
            fields={name: [_("Given more than once.")] for name in repeated},
        )


def _quoted(names: Iterable[str]) -> str:
    return ", ".join(f"'{name}'" for name in names)


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
        context = RunContextField(
            required=False,
            default=dict,
            help_text="A2A context: userId, sessionId, chatbotId, …; `contextId` (the conversation) is text.",
        )
        data = BoundedListField(
            child=serializers.DictField(), required=False, default=list, max_length=100, help_text="A2A data objects."
        )
        files = BoundedListField(
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
                _check_one_context_id(message=attrs["message"], context=attrs.get("context") or {})
            return attrs

    @extend_schema(
        operation_id="runs_create",
        summary="Submit a query to an agent",
        description=(
            "Queues a run and answers `202` with it. The body is either plain (`query`, optional `context`, "
            "`data`, `files`) or an A2A message (`message`, optional `context`): text parts joined become the "
            "query, data parts `a2a_data`, file parts `a2a_files` (metadata only). Unknown fields are refused. "
            "`?wait=N` (up to `PLATFORM_API_MAX_WAIT_S`, 60 s by default) answers `200` with the finished run if "
            "it ends in time. With an `Idempotency-Key` header (or, without one, the message's `messageId`), the "
            "same key and body (from the same API key) answer `200` with the run the first request created "
            "(header `Idempotent-Replayed: true`); the same key with another body is a `409`. The message's "
            "`contextId` is the run's `context.contextId`."
        ),
        tags=["runs"],
        request=InputSerializer,
        parameters=[
            OpenApiParameter(
                "wait",
                # The maximum is the deployment's PLATFORM_API_MAX_WAIT_S (schema.declare_setting_limits).
                {"type": "number", "minimum": 0},
                OpenApiParameter.QUERY,
                description=(
                    "Seconds to wait for the run to finish (or park on an approval), in decimal notation (`5`, "
                    "`0.5`; an exponent such as `1e-05` is refused)."
                ),
            ),
            OpenApiParameter(
                "Idempotency-Key",
                {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": IDEMPOTENCY_KEY_MAX_CHARS,
                    # Printable ASCII but the comma (repeated headers arrive joined by commas).
                    "pattern": f"^[!-+\\--~]{{1,{IDEMPOTENCY_KEY_MAX_CHARS}}}$",
                },
                OpenApiParameter.HEADER,
                description="At most 200 printable ASCII characters, no spaces or commas; scoped to the API key.",
            ),
            RETRY_AFTER,
            # Described here with the submission's own 503 (the shared one is added where an operation has none).
            OpenApiParameter(
                "Retry-After",
                int,
                OpenApiParameter.HEADER,
                response=[503],
                required=True,
                description="Seconds to wait before sending the request again.",
            ),
            OpenApiParameter(
                "Idempotent-Replayed",
                OpenApiTypes.STR,
                OpenApiParameter.HEADER,
                response=[200],
                enum=["true"],
                description="Present when an earlier request with the same Idempotency-Key (or messageId) created this run.",
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
                conflicts=(
                    "`agent_disabled`, `idempotency_key_reused` (same key, another body), or `budget_misconfigured` "
                    "(a budget reserves more tokens per run than can be counted: an admin must lower it)."
                ),
            ),
            503: OpenApiResponse(
                ErrorSerializer,
                description=(
                    f"{ERROR_DESCRIPTIONS[503]} Or `config:secret_unreadable`: a secret stored in the platform's "
                    "configuration (an agent's model key, an MCP server's environment or headers) cannot be "
                    "decrypted with the server's `SECRETS_ENCRYPTION_KEYS`; an operator must fix the keys."
                ),
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
        query_params_check(request.query_params, accepted=("wait",))
        if not isinstance(request.data, dict):
            raise ApplicationError(_("The body must be a JSON object."), code="invalid_input", status=400)
        run_query_check(request.data.get("query"))
        idempotency_key = _idempotency_key(request)
        wait_s = _wait_seconds(request)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        run_input = run_input_from_body(serializer.validated_data)
        run_query_check(run_input.query)
        message_id = (serializer.validated_data.get("message") or {}).get("messageId", "")
        try:
            submission = run_submit(
                agent_slug=serializer.validated_data["agent"],
                query=run_input.query,
                api_key=caller_of(request),
                context=run_input.context,
                a2a_data=run_input.a2a_data,
                a2a_files=run_input.a2a_files,
                idempotency_key=idempotency_key or _message_idempotency_key(message_id),
                digest=_submission_digest(serializer.validated_data["agent"], run_input),
                # A retry of a request stored before the digest was of the run's input (it was of the body).
                former_digests=(request_digest(request.data),),
            )
        except ApplicationError as exc:
            if exc.code != "idempotency_key_reused":
                raise
            if idempotency_key:  # named, as the messageId is below
                raise ApplicationError(
                    exc.message,
                    code=exc.code,
                    status=exc.status,
                    fields={"Idempotency-Key": [_("Used with another request body.")]},
                ) from None
            raise ApplicationError(  # the caller sent no Idempotency-Key: name what they did send
                _("This messageId was used with another request body."),
                code=exc.code,
                status=exc.status,
                fields={"message": {"messageId": [_("Used with another request body.")]}},
            ) from None
        run = submission.run
        headers = {"Idempotent-Replayed": "true"} if submission.replayed else None
        if wait_s:
            run = _run_waited(run=run, api_key=caller_of(request), wait_s=wait_s)
        # A run cancelled while its worker held it reads cancelled at once, its worker's last events still to come
        # (the call it was making, its end): not finished for the caller yet (202: read it again).
        done = submission.replayed or run_seen_finished(run)
        return Response(
            RunOutputSerializer(run).data,
            status=status.HTTP_200_OK if done else status.HTTP_202_ACCEPTED,
            headers=headers,
        )


def _submission_digest(agent_slug: str, run_input: RunInput) -> str:
    """The digest an Idempotency-Key (or ``messageId``) is held to: of the run the request asks for (its agent,
    query, context, data and files, composed and with their defaults, as the run stores them), not of the body's
    bytes. A resent request that means the same (its query typed decomposed, a trailing space the query loses, an
    empty ``context`` given or left out) is the same request, replayed, not a ``409 idempotency_key_reused``."""
    return request_digest(
        nfc_value(
            {
                "agent": agent_slug,
                "query": run_input.query,
                "context": run_input.context,
                "data": run_input.a2a_data,
                "files": run_input.a2a_files,
            }
        )
    )


def _run_waited(*, run: Run, api_key: ApiKey, wait_s: float) -> Run:
    """``run_wait`` for ``?wait=N``, its key checked again as an open stream's is (``KeyRecheck``'s questions, every
    ``PLATFORM_SSE_AUTH_RECHECK_S`` and once more before the run is answered). Raises ``AuthenticationFailed`` (401)
    for a key revoked while it waited and ApplicationError 404 ``run_not_found`` for one that may no longer read the
    run (taken off its agent, the agent disabled), as the key's next request is answered: never the run's answer.
    The run goes on."""
    recheck = KeyRecheck(api_key, None, run_id=run.pk)
    deadline = time.monotonic() + wait_s
    while True:
        part_s = max(0.0, min(deadline - time.monotonic(), recheck.recheck_s))
        part_ends = time.monotonic() + part_s
        run = run_wait(run=run, timeout_s=part_s)
        if not recheck.still_authorized():
            raise exceptions.AuthenticationFailed(_("The API key was revoked while the request waited for the run."))
        if not recheck.still_readable():
            raise ApplicationError(_("Run not found."), code="run_not_found", status=404)
        # ``run_wait`` ended before its time: the run stopped (finished, parked on an approval).
        if time.monotonic() < part_ends or part_ends >= deadline:
            return run


def _idempotency_key(request: Request) -> str:
    """The request's ``Idempotency-Key`` as sent, less the spaces and tabs HTTP allows around a header's value;
    anything else outside printable ASCII is refused, not stripped: Python's ``strip`` also took a no-break space or
    a NEL (bytes 0xA0 and 0x85 of the header) off its ends, so a key with one of them replayed the run of the key
    without it, and a client's two keys made one run."""
    raw = request.headers.get("Idempotency-Key")
    if raw is None:
        return ""
    key = raw.strip(" \t")
    if not key or len(key) > IDEMPOTENCY_KEY_MAX_CHARS or not all(33 <= ord(c) <= 126 for c in key):
        raise ApplicationError(
            _("'Idempotency-Key' must be 1 to %(max)d printable ASCII characters without spaces.")
            % {"max": IDEMPOTENCY_KEY_MAX_CHARS},
            code="invalid_input",
            status=400,
            fields={"Idempotency-Key": [_("Invalid value.")]},
        )
    if "," in key:
        # Headers sent more than once arrive joined by commas: two keys would be taken for a third, one the
        # client never sent (and a later request sending that one would replay this run).
        raise ApplicationError(
            _(
                "'Idempotency-Key' must be sent once and hold no comma: headers sent more than once arrive "
                "joined by commas, as one key the client never sent."
            ),
            code="invalid_input",
            status=400,
            fields={"Idempotency-Key": [_("Invalid value.")]},
        )
    return key


def _message_idempotency_key(message_id: str) -> str:
    """The idempotency key of a message's ``messageId`` (none without one): ``message `` and the id, or
    ``message-sha256 `` and the id's SHA-256 where that would not fit. The space keeps it apart from every
    ``Idempotency-Key`` header (which has none), and the prefix from the A2A endpoint's keys (``a2a …``): that
    endpoint digests another body, so the same message sent both ways would only ever meet a 409."""
    if not message_id:
        return ""
    key = f"message {message_id}"
    if len(key) <= IDEMPOTENCY_KEY_MAX_CHARS:
        return key
    return f"message-sha256 {hashlib.sha256(message_id.encode()).hexdigest()}"


def _check_one_context_id(*, message: Mapping[str, Any], context: Mapping[str, Any]) -> None:
    """A message's ``contextId`` is the run's ``context.contextId``: one given in ``context`` too must be the same
    (compared composed, as the run stores them), else which conversation the run is in is a guess."""
    if "contextId" not in message or "contextId" not in context:
        return
    given = context["contextId"]
    if isinstance(given, str) and unicodedata.normalize("NFC", given) == unicodedata.normalize(
        "NFC", message["contextId"]
    ):
        return
    both = [_("'message.contextId' and 'context.contextId' differ: send one of them, or the same value in both.")]
    raise ValidationError({"message": {"contextId": both}, "context": {"contextId": both}})


_SECONDS = re.compile(r"[0-9]+(?:\.[0-9]+)?", re.ASCII)


def _wait_seconds(request: Request) -> float:
    raw = request.query_params.get("wait")
    if raw in (None, ""):
        return 0.0
    limit = float(api_setting("PLATFORM_API_MAX_WAIT_S"))
    # What was wrong, in words (the value itself, the caller's, is theirs to see: echoed, it could be any length).
    # The limit as set (2.5 read "2"), and an example within it.
    told = {
        "wait": [
            _("A number of seconds from 0 to %(max)s, such as %(example)s.")
            % {"max": f"{limit:g}", "example": _("5 or 0.5") if limit >= 5 else f"{limit / 2:g}"}
        ]
    }
    if not _SECONDS.fullmatch(raw):  # float() would also take "1_0", " 5", "1e1" and "nan"
        raise ApplicationError(_("'wait' must be a number of seconds."), code="invalid_input", status=400, fields=told)
    value = float(raw)
    if not 0 <= value <= limit:  # NaN fails both
        raise ApplicationError(
            _("'wait' must be between 0 and %(max)s seconds.") % {"max": f"{limit:g}"},
            code="invalid_input",
            status=400,
            fields=told,
        )
    return value


# --- GET /runs -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunPosition:
    """Where a cursor points: just past the run ``(created_at, id)``, older runs (``next``) or newer (``previous``)."""

    older: bool
    created_at: dt.datetime
    run_id: uuid.UUID


class RunCursorPagination:
    """Newest first, by ``(created_at, id)``: a page's ``next`` link continues after its last run, ``previous``
    before its first, unaffected by runs created since, and exact where runs share a ``created_at`` (DRF's
    ``CursorPagination`` positions on its first ordering field alone, so its ``previous`` went wrong there). The
    cursor is opaque: base64 of ``n|p``, the run's ``created_at`` and its id."""

    page_size = 20
    page_size_query_param = "page_size"
    max_page_size = 100
    cursor_query_param = "cursor"

    def __init__(self, page_size: int | None = None) -> None:
        """``page_size``: the caller's, as ``RunListApi.FilterSerializer`` validated it (1-100; None: 20)."""
        self.size = page_size or self.page_size
        self.request: Request | None = None
        self.next_position: RunPosition | None = None
        self.previous_position: RunPosition | None = None
        self.previous_is_first_page = False

    def paginate_queryset(self, queryset: QuerySet[Run], request: Request, view: Any = None) -> list[Run]:
        self.request = request
        size = self.size
        position = self._decode(request.query_params.get(self.cursor_query_param))
        if position is None:
            runs = list(queryset.order_by("-created_at", "-id")[: size + 1])
            page = runs[:size]
            self.next_position = self._at(page[-1], older=True) if len(runs) > size else None
            return page
        at, run_id = position.created_at, position.run_id
        if position.older:
            runs = list(
                queryset.filter(Q(created_at__lt=at) | Q(created_at=at, id__lt=run_id)).order_by("-created_at", "-id")[
                    : size + 1
                ]
            )
            page = runs[:size]
            self.next_position = self._at(page[-1], older=True) if len(runs) > size else None
            # Runs newer than the cursor's position exist (the run it names, at least).
            self.previous_position = self._at(page[0], older=False) if page else None
            self.previous_is_first_page = not page
            return page
        runs = list(
            queryset.filter(Q(created_at__gt=at) | Q(created_at=at, id__gt=run_id)).order_by("created_at", "id")[
                : size + 1
            ]
        )
        page = runs[:size][::-1]
        self.previous_position = self._at(page[0], older=False) if len(runs) > size else None
        self.next_position = self._at(page[-1], older=True) if page else position_older(position)
        return page

    def get_next_link(self) -> str | None:
        return self._link(self.next_position) if self.next_position else None

    def get_previous_link(self) -> str | None:
        if self.previous_position is not None:
            return self._link(self.previous_position)
        return self._link(None) if self.previous_is_first_page else None

    @staticmethod
    def _at(run: Run, *, older: bool) -> RunPosition:
        return RunPosition(older=older, created_at=run.created_at, run_id=run.id)

    def _link(self, position: RunPosition | None) -> str:
        assert self.request is not None
        url = self.request.build_absolute_uri()
        if position is None:
            return remove_query_param(url, self.cursor_query_param)  # type: ignore[no-any-return]
        text = "|".join(
            ("n" if position.older else "p", position.created_at.astimezone(dt.UTC).isoformat(), str(position.run_id))
        )
        cursor = base64.urlsafe_b64encode(text.encode()).decode()
        return replace_query_param(url, self.cursor_query_param, cursor)  # type: ignore[no-any-return]

    @staticmethod
    def _decode(raw: str | None) -> RunPosition | None:
        """The cursor's position; anything but a cursor this API wrote (a moment the database can compare with,
        and a run id) is a 400 on ``cursor``. A cursor of DRF's (``p=<moment>&r=1``, written before this one, and
        perhaps kept by a caller) still pages: from just past its moment."""
        if raw is None:
            return None
        try:
            text = base64.urlsafe_b64decode(raw.encode("ascii")).decode("ascii")
            if "|" in text:
                direction, moment, run_id = text.split("|")
            else:
                legacy = parse_qs(text, keep_blank_values=True)
                if "p" not in legacy:  # text that decodes ("YWJj" is "abc") but holds no position at all
                    raise ValueError(raw)
                (moment,) = legacy["p"]
                direction = "p" if legacy.get("r") == ["1"] else "n"
                run_id = str(uuid.UUID(int=0) if direction == "n" else uuid.UUID(int=2**128 - 1))
            created_at = dt.datetime.fromisoformat(moment)
            if direction not in ("n", "p") or timezone.is_naive(created_at):
                raise ValueError(raw)
            return RunPosition(
                older=direction == "n", created_at=created_at.astimezone(dt.UTC), run_id=uuid.UUID(run_id)
            )
        except (binascii.Error, UnicodeError, ValueError, OverflowError):
            raise ValidationError({"cursor": [_("Invalid cursor.")]}) from None


def position_older(position: RunPosition) -> RunPosition:
    """An empty ``previous`` page (its runs deleted since): its ``next`` goes on from where its cursor pointed."""
    return RunPosition(older=True, created_at=position.created_at, run_id=position.run_id)


class RunListApi(ApiView):
    @extend_schema_serializer(component_name="RunListFilters")
    class FilterSerializer(StrictSerializer):
        """The list's query parameters."""

        agent = StrictCharField(required=False, max_length=64)
        status = serializers.ChoiceField(choices=Run.Status.choices, required=False)
        page_size = AsciiIntegerField(required=False, min_value=1, max_value=100)
        cursor = StrictCharField(required=False, max_length=1000)

    @extend_schema(
        operation_id="runs_list",
        summary="The caller's runs",
        description=(
            "The runs this API key submitted to the agents it may use now, newest first, optionally of one "
            "`agent` (slug) and/or in one `status`. A run of an agent taken off the key, or disabled, is no "
            "longer listed, read, cancelled, approved, rated or followed: a `404` as another key's run. Cursor "
            "pagination: follow `next` (older runs) and `previous` (newer runs); `page_size` is 1–100 (20 by "
            "default). Runs created while paging never shift a page. Unknown query parameters are refused (`400`)."
        ),
        tags=["runs"],
        parameters=[
            OpenApiParameter(
                "agent", {"type": "string", "maxLength": 64}, OpenApiParameter.QUERY, description="An agent's slug."
            ),
            OpenApiParameter("status", OpenApiTypes.STR, OpenApiParameter.QUERY, enum=Run.Status.values),
            OpenApiParameter(
                "page_size",
                {"type": "integer", "minimum": 1, "maximum": RunCursorPagination.max_page_size},
                OpenApiParameter.QUERY,
                description="1–100 (20 by default).",
            ),
            OpenApiParameter(
                "cursor",
                {"type": "string", "maxLength": 1000},
                OpenApiParameter.QUERY,
                description="From `next`/`previous`.",
            ),
            RETRY_AFTER,
        ],
        responses={200: RunPageSerializer, **error_responses(400, 401, 429)},
    )
    def get(self, request: Request) -> Response:
        query_params_check(request.query_params, accepted=tuple(self.FilterSerializer().fields))
        filters = self.FilterSerializer(data=request.query_params.dict())
        filters.is_valid(raise_exception=True)
        runs = run_list(
            api_key=caller_of(request),
            agent_slug=filters.validated_data.get("agent"),
            status=filters.validated_data.get("status"),
        )
        # The size validated above (``2.0``, ``+2`` and `` 2`` read as 2 there), not the query's text read again.
        paginator = RunCursorPagination(page_size=filters.validated_data.get("page_size"))
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
        responses={200: RunOutputSerializer, **error_responses(400, 401, 404, 429)},
    )
    def get(self, request: Request, run_id: str) -> Response:
        query_params_check(request.query_params)
        run = run_get(run_id=run_id, api_key=caller_of(request))
        return Response(RunOutputSerializer(run).data)


class RunCancelApi(ApiView):
    @extend_schema(
        operation_id="runs_cancel",
        summary="Cancel a run",
        description=(
            "A queued run never starts; a run awaiting approval stops there (its pending approvals expire); a "
            "running run stops at its next step (a tool call under way finishes first). Answers the run, "
            "`cancelled`. A finished run is a `409` (`run_finished`); so is a run whose status kept changing while "
            "it was being cancelled (`run_busy`: send the request again)."
        ),
        tags=["runs"],
        request=None,
        parameters=[RETRY_AFTER],
        responses={
            200: RunOutputSerializer,
            **error_responses(
                400,
                401,
                404,
                409,
                413,
                429,
                conflicts=(
                    "`run_finished`: the run has already finished; `run_busy`: its status kept changing while it "
                    "was being cancelled (send the request again)."
                ),
            ),
        },
    )
    def post(self, request: Request, run_id: str) -> Response:
        query_params_check(request.query_params)
        # No body, or an empty object: a field sent here would be ignored (a reason, say), so it is refused, named,
        # as every other endpoint refuses what it does not take.
        if not isinstance(request.data, dict):
            raise ApplicationError(_("The body must be a JSON object."), code="invalid_input", status=400)
        if request.data:
            raise ApplicationError(
                _("A cancellation takes no fields."),
                code="invalid_input",
                status=400,
                fields={str(name): [_("Unknown field.")] for name in request.data},
            )
        run = run_get(run_id=run_id, api_key=caller_of(request))
        run = run_cancel(run=run, actor=f"api_key:{caller_of(request).prefix}", source="api")
        return Response(RunOutputSerializer(run).data)


class RunApprovalDecideApi(ApiView):
    @extend_schema_serializer(component_name="ApprovalDecision")
    class InputSerializer(StrictSerializer):
        """A decision on a pending write call, with an optional reason."""

        decision = serializers.ChoiceField(choices=["approve", "reject"])
        reason = StrictCharField(required=False, allow_blank=True, max_length=2000, default="")

    @extend_schema(
        operation_id="runs_approvals_decide",
        summary="Approve or reject a pending write call",
        description=(
            "The run resumes at once. A decision is taken once: a decided or expired approval is a `409`, and so is "
            "an approval of a run that has finished."
        ),
        tags=["runs"],
        request=InputSerializer,
        parameters=[
            RETRY_AFTER,
            # Described here with the decision's own 503 (the shared one is added where an operation has none).
            OpenApiParameter(
                "Retry-After",
                int,
                OpenApiParameter.HEADER,
                response=[503],
                required=True,
                description="Seconds to wait before sending the request again.",
            ),
        ],
        responses={
            200: ApprovalOutputSerializer,
            **error_responses(
                400,
                401,
                403,
                404,
                409,
                413,
                415,
                429,
                conflicts=(
                    "`approval_decided` (already decided), `approval_expired`, or `run_finished` (the run has "
                    "finished: its calls are no longer decided)."
                ),
            ),
            503: OpenApiResponse(
                ErrorSerializer,
                description=(
                    f"{ERROR_DESCRIPTIONS[503]} Or, approving, `config:secret_unreadable`: a secret the call needs "
                    "(the agent's model key, an MCP server's environment or headers, the call's exact arguments) "
                    "cannot be decrypted with the server's `SECRETS_ENCRYPTION_KEYS`; the approval stays pending, "
                    "and may still be rejected."
                ),
            ),
        },
    )
    def post(self, request: Request, run_id: str, approval_id: str) -> Response:
        query_params_check(request.query_params)
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


# --- GET /usage -------------------------------------------------------------------------------------------


class UsageApi(ApiView):
    @extend_schema(
        operation_id="usage_get",
        summary="The calling key's tokens, cost and budgets",
        description=(
            "Tokens and cost (USD, from the admin's price table) of the key's runs today and this month (UTC), per "
            "agent this month and per day over the last 30 days, and the budgets that apply to the key (its own, "
            "and those of the agents it may use): limit, used, reserved by runs in flight, and when it resets. A "
            "run that would exceed a budget is refused with `429 budget_exceeded` and `Retry-After`."
        ),
        tags=["usage"],
        parameters=[RETRY_AFTER],
        responses={200: UsageSerializer, **error_responses(401, 429)},
    )
    def get(self, request: Request) -> Response:
        query_params_check(request.query_params)
        return Response(api_key_usage(api_key=caller_of(request)))


# --- POST /runs/{id}/feedback ----------------------------------------------------------------------------


class StrictNumberField(serializers.FloatField):
    """A JSON number: a bool or a numeric string is refused (``true`` is not a score)."""

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        return super().to_internal_value(data)


class RunFeedbackApi(ApiView):
    @extend_schema_serializer(component_name="RunFeedback")
    class InputSerializer(StrictSerializer):
        """How satisfied the caller was with the run's answer: a score, its scale, and an optional comment."""

        score = StrictNumberField(help_text="-1..1 (thumbs down..up), or a whole number 1..5.")
        scale = serializers.ChoiceField(
            choices=["signed", "five"],
            required=False,
            help_text="Which scale `score` is on; without it, -1..1 is `signed` and 2..5 is `five`.",
        )
        comment = StrictCharField(required=False, allow_blank=True, max_length=4000, default="")

    @extend_schema(
        operation_id="runs_feedback",
        summary="Say how satisfied the caller was with a run's answer",
        description=(
            "Recorded on the run (normalized to -1..1) and counted in its A/B arm's metrics. A later score "
            "replaces an earlier one. A run that has not finished is a `409`."
        ),
        tags=["runs"],
        request=InputSerializer,
        parameters=[RETRY_AFTER],
        responses={200: RunOutputSerializer, **error_responses(400, 401, 404, 409, 413, 415, 429)},
    )
    def post(self, request: Request, run_id: str) -> Response:
        query_params_check(request.query_params)
        run = run_get(run_id=run_id, api_key=caller_of(request))
        if not isinstance(request.data, dict):
            raise ApplicationError(_("The body must be a JSON object."), code="invalid_input", status=400)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        run = run_feedback_record(
            run=run,
            score=serializer.validated_data["score"],
            scale=serializer.validated_data.get("scale"),
            comment=serializer.validated_data["comment"],
            actor=f"api_key:{caller_of(request).prefix}",
        )
        return Response(RunOutputSerializer(run).data)
