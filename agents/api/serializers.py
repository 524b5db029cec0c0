"""The runs API's shared shapes: strict input fields, the A2A message, and the output serializers.

Only shapes live here (no logic, per the style guide): each operation's own ``InputSerializer`` or
``FilterSerializer`` stays nested in its API class in ``agents/api/views.py``. Component names
(``extend_schema_serializer``) are the OpenAPI schema's and callers' code generators rely on them: keep them.
"""

from __future__ import annotations

import copy
import unicodedata
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from drf_spectacular.utils import PolymorphicProxySerializer, extend_schema_field, extend_schema_serializer
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.fields import SkipField
from rest_framework.relations import PKOnlyObject

from agents.api.a2a import decoded_size
from agents.config_cache import shown_secrets
from agents.conversations import CONTEXT_ID_MAX_CHARS, context_id_problem, context_without_null_id
from agents.decision_reasons import approval_reason_text
from agents.error_texts import error_message_text
from agents.models import Approval, Run
from agents.selectors import run_approvals, run_tool_calls
from audit.masking import mask_known

# --- fields and input shapes -----------------------------------------------------------------------------


class StrictCharField(serializers.CharField):
    """A string, and only a string: DRF's CharField would turn 123 into "123"."""

    # DRF's Korean for these reads "blank일 수 없습니다": the platform's own wording, translated with the rest.
    default_error_messages = {
        **serializers.CharField.default_error_messages,
        "blank": gettext_lazy("This field may not be blank."),
    }

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)  # type: ignore[no-any-return]


class BoundedListField(serializers.ListField):
    """DRF's ListField, its ``max_length`` checked before any element is: DRF validates every element first and
    only then counts them, so 100,000 parts cost seconds of validation before the "no more than 100" answer. Same
    message and code (``max_length``) as DRF's."""

    def to_internal_value(self, data: Any) -> Any:
        if self.max_length is not None and isinstance(data, list) and len(data) > self.max_length:
            self.fail("max_length", max_length=self.max_length)
        return super().to_internal_value(data)


class AsciiIntegerField(serializers.IntegerField):
    """DRF's IntegerField, written in ASCII digits: DRF (Python's ``int``) reads full-width and other Unicode digits
    (``?page_size=５``) and digits grouped by underscores (``?page_size=1_0`` as 10) as a number, which the other
    numbers of the query (``wait``, ``after``) refuse."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, str) and (not data.isascii() or "_" in data):
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


# The schemes a file's ``uri`` may have: a file a client can fetch (on the web or in an object store), or one it
# carries (RFC 2397). Not ``javascript:`` (a screen that shows the run's files as links would run it).
FILE_URI_SCHEMES = ("http", "https", "s3", "gs", "data")


@extend_schema_serializer(component_name="A2AFile")
class A2AFileSerializer(StrictSerializer):
    """An A2A file: `uri` or base64 `bytes` (exactly one). Only metadata is kept: never the bytes."""

    name = StrictCharField(required=False, allow_blank=True, max_length=255)
    mimeType = StrictCharField(required=False, allow_blank=True, max_length=255)
    uri = StrictCharField(
        required=False,
        max_length=2048,
        help_text="Where the file is (kept with the run): an http, https, s3, gs or data URI.",
    )
    bytes = StrictCharField(
        required=False, trim_whitespace=False, help_text="Base64 content: counted (size), never stored."
    )

    def validate_uri(self, value: str) -> str:
        if any(char.isspace() or unicodedata.category(char) == "Cc" for char in value):
            # urlsplit takes "http://x/ a" (and drops a tab or a newline): not a URI, and not the one a reader sees.
            raise ValidationError(_("Enter a URI without spaces or control characters."))
        try:
            parts = urlsplit(value)
        except ValueError:  # "http://[::1", or a host NFKC changes ("a\uff03b"): not a URI, and not a 500
            raise ValidationError(_("Enter a valid URL.")) from None
        if parts.scheme not in FILE_URI_SCHEMES:  # "javascript:…", "no-scheme": not a file a run can be given
            raise ValidationError(
                _("Enter a URI of one of the schemes %(schemes)s.") % {"schemes": ", ".join(FILE_URI_SCHEMES)}
            )
        if parts.scheme != "data" and not parts.hostname:  # "https://", "http:x"
            raise ValidationError(_("Enter a valid URL."))
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
    """An A2A 0.3 text part: joined with the other text parts, the query."""

    kind = serializers.ChoiceField(choices=["text"])
    text = StrictCharField(allow_blank=True, trim_whitespace=False)
    metadata = serializers.DictField(required=False)


DATA_PART_HELP = (
    "Structured input: one entry of the run's a2a_data. Any JSON value, as A2A 1.0's `Part.data` is: one that is "
    'not an object is kept as `{"value": <it>}`.'
)


@extend_schema_field({"description": DATA_PART_HELP})
class DataPartField(serializers.DictField):
    """A data part's ``data``: any JSON value, as the A2A endpoint takes it; one that is not an object (a list,
    a number, null) is kept as ``{"value": ...}``, which rules and tools read as an object."""

    def run_validation(self, data: Any = serializers.empty) -> Any:
        if data is not serializers.empty and not isinstance(data, Mapping):
            data = {"value": data}
        return super().run_validation(data)


@extend_schema_serializer(component_name="A2ADataPart")
class A2ADataPartSerializer(StrictSerializer):
    """An A2A 0.3 data part: one entry of the run's a2a_data."""

    kind = serializers.ChoiceField(choices=["data"])
    data = DataPartField(help_text=DATA_PART_HELP)
    metadata = serializers.DictField(required=False)


@extend_schema_serializer(component_name="A2AFilePart")
class A2AFilePartSerializer(StrictSerializer):
    """An A2A 0.3 file part: one entry of the run's a2a_files (metadata only)."""

    kind = serializers.ChoiceField(choices=["file"])
    file = A2AFileSerializer()
    metadata = serializers.DictField(required=False)


A2A_PARTS: dict[str, type[serializers.Serializer]] = {
    "text": A2ATextPartSerializer,
    "data": A2ADataPartSerializer,
    "file": A2AFilePartSerializer,
}


PART_CONTENTS = ("text", "data", "url", "raw")
# The members an A2A 1.0 part may have (``Part``: its content, and ``filename``, ``mediaType``, ``metadata``).
PART_MEMBERS = frozenset({*PART_CONTENTS, "filename", "mediaType", "metadata"})


def part_contents_message() -> str:
    return str(_("A part has one of 'text', 'data', 'url' or 'raw', not several."))


class A2APartMembersSerializer(serializers.Serializer):
    """The members any A2A 1.0 part may carry beside its content (``filename``, ``mediaType``, ``metadata``): checked
    as a 0.3 part's are, under the caller's own names, before ``kind_shaped_part`` drops those a text or data part
    has. Null is taken as absent (ProtoJSON's reading of it)."""

    filename = StrictCharField(required=False, allow_blank=True, allow_null=True, max_length=255)
    mediaType = StrictCharField(required=False, allow_blank=True, allow_null=True, max_length=255)
    metadata = serializers.DictField(required=False, allow_null=True)


# The A2A 1.0 member a kind-shaped file's member came from (``kind_shaped_part``).
V1_FILE_MEMBERS = {"uri": "url", "bytes": "raw", "name": "filename", "mimeType": "mediaType"}


def v1_part_errors(errors: Mapping[str, Any]) -> dict[str, Any]:
    """A kind-shaped part's errors under the members of the A2A 1.0 part the caller sent: ``url``, not
    ``file.uri`` (a name the caller never used)."""
    named = {name: problems for name, problems in errors.items() if name != "file"}
    file_errors = errors.get("file")
    if isinstance(file_errors, Mapping):
        named.update({V1_FILE_MEMBERS.get(str(name), str(name)): problems for name, problems in file_errors.items()})
    elif file_errors is not None:
        named["non_field_errors"] = file_errors
    return named


def kind_shaped_part(part: Mapping[str, Any]) -> dict[str, Any] | None:
    """An A2A 1.0 part (``{"text"}``, ``{"data"}``, ``{"url"|"raw", "mediaType"?, "filename"?}``, no ``kind``) in the
    ``kind``-shaped form this API validates (A2A 0.3's); None when it has none of those members. The REST API and
    the A2A endpoint take both forms through this one mapping."""
    if "text" in part:
        return {"kind": "text", "text": part["text"]}
    if "data" in part:
        return {"kind": "data", "data": part["data"]}
    if "url" in part or "raw" in part:
        file: dict[str, Any] = {"uri": part["url"]} if "url" in part else {"bytes": part["raw"]}
        if part.get("filename"):
            file["name"] = part["filename"]
        if part.get("mediaType"):
            file["mimeType"] = part["mediaType"]
        return {"kind": "file", "file": file}
    return None


# A conversation's id where a schema states it (the run's ``context.contextId``): what ``context_id_problem`` takes,
# ``null`` (no conversation: the run is its own) included.
CONTEXT_ID_SCHEMA: dict[str, Any] = {
    "type": "string",
    "nullable": True,
    "minLength": 1,
    "maxLength": CONTEXT_ID_MAX_CHARS,
    "pattern": r"\S",
}


@extend_schema_field({"type": "object", "additionalProperties": {}, "properties": {"contextId": CONTEXT_ID_SCHEMA}})
class RunContextField(serializers.DictField):
    """A run's ``context`` (``userId``, ``sessionId``, ``chatbotId``, …): any object, whose ``contextId`` (the
    conversation) is text where it is given (``context_id_problem``), as a message's ``contextId`` is. A ``null``
    one is none, left out (``context_without_null_id``): the run is its own conversation, as before it was checked."""

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        context = context_without_null_id(super().to_internal_value(data))
        problem = context_id_problem(context, field="context.contextId")
        if problem is not None:
            raise ValidationError({"contextId": [problem]})
        return context


@extend_schema_field(
    PolymorphicProxySerializer(
        component_name="A2APart", serializers=A2A_PARTS, resource_type_field_name="kind", many=False
    )
)
class A2APartField(serializers.Field):
    """One part of an A2A message, validated by its ``kind``."""

    default_error_messages = {
        "invalid": gettext_lazy(
            "Expected an object: a part with 'text', 'data', 'url' or 'raw' (or a 'kind' of text, data or file)."
        )
    }

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, Mapping):
            self.fail("invalid")
        if "kind" not in data:
            if sum(1 for key in PART_CONTENTS if key in data) > 1:
                # A2A 1.0: a part's content is one of them (a oneof); with two, one was dropped without a word.
                raise ValidationError({"non_field_errors": [part_contents_message()]})
            unknown = {str(name): [_("Unknown field.")] for name in data if name not in PART_MEMBERS}
            if unknown:  # as a 0.3 part (a StrictSerializer) refuses them: kind_shaped_part would drop them
                raise ValidationError(unknown)
            members = A2APartMembersSerializer(data=data)
            if not members.is_valid():
                raise ValidationError(members.errors)
            shaped = kind_shaped_part(data)  # an A2A 1.0 part: {"text"}, {"data"}, {"url"|"raw"}
            if shaped is None:
                raise ValidationError({"non_field_errors": [_("A part needs one of 'text', 'data', 'url' or 'raw'.")]})
            v1_part = A2A_PARTS[shaped["kind"]](data=shaped)
            if not v1_part.is_valid():
                raise ValidationError(v1_part_errors(v1_part.errors))
            return dict(v1_part.validated_data)
        kind = data.get("kind")
        part_serializer = A2A_PARTS.get(kind) if isinstance(kind, str) else None
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
    """An A2A `Message` from the user. Its text parts (joined) are the query; its `contextId` is the run's
    conversation and its `messageId` the submission's idempotency key. The other envelope members are accepted
    (an A2A client's message is taken as it is) and not used."""

    role = serializers.ChoiceField(choices=["user", "ROLE_USER"], help_text="user (A2A 0.3) or ROLE_USER (A2A 1.0)")
    # min_length as well as allow_empty: the schema says minItems; allow_empty's own message is the one answered.
    parts = BoundedListField(child=A2APartField(), allow_empty=False, min_length=1, max_length=100)
    kind = serializers.ChoiceField(choices=["message"], required=False)
    # Ids are kept exactly as sent (DRF trims a CharField's spaces): " conv " from a REST message was "conv",
    # another conversation than the same id sent to A2A or in ``context``, and said to differ from the latter.
    messageId = StrictCharField(
        required=False,
        trim_whitespace=False,
        max_length=200,
        help_text=(
            "Without an `Idempotency-Key` header, the submission's idempotency key: the same messageId and body "
            "answer `200` with the run it created (`Idempotent-Replayed: true`); another body is a `409` "
            "(`idempotency_key_reused`). The header wins where both are sent."
        ),
    )
    contextId = StrictCharField(
        required=False,
        trim_whitespace=False,
        max_length=200,
        help_text=(
            "The conversation: the run's `context.contextId` (runs with the same one are one conversation, here "
            "and on the A2A endpoint). A different `context.contextId` in the same request is a `400`."
        ),
    )
    taskId = StrictCharField(
        required=False,
        trim_whitespace=False,
        max_length=200,
        help_text=(
            "Accepted and not used here (the A2A endpoint `/a2a/{slug}/` reads it: the task a reply answers); "
            "decide a pending approval with `POST /runs/{run_id}/approvals/{approval_id}`."
        ),
    )
    referenceTaskIds = BoundedListField(
        child=StrictCharField(max_length=200), required=False, max_length=100, help_text="Accepted and not used."
    )
    extensions = BoundedListField(
        child=StrictCharField(max_length=2048), required=False, max_length=100, help_text="Accepted and not used."
    )
    metadata = serializers.DictField(
        required=False, help_text="Accepted and not used: the run's context is the request's `context`."
    )

    def validate_role(self, role: str) -> str:
        return "user"

    def validate_contextId(self, context_id: str) -> str:  # DRF names it after the field
        """As every door checks a conversation's id (``context_id_problem``): a blank one names no conversation."""
        problem = context_id_problem({"contextId": context_id}, field="message.contextId")
        if problem:
            raise ValidationError(problem)
        return context_id

    def validate_parts(self, parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
        has_text = any(p["kind"] == "text" and p["text"].strip() for p in parts)
        has_data = any(p["kind"] == "data" for p in parts)
        if not (has_text or has_data):
            raise ValidationError(_("The message needs a text part (the query) or a data part."))
        return parts


# --- output shapes ---------------------------------------------------------------------------------------


@extend_schema_serializer(component_name="RunError")
class RunErrorSerializer(serializers.Serializer):
    """Why the run failed (or was cancelled): a stable `code` and a `message` for people."""

    code = serializers.CharField()
    message = serializers.CharField()


@extend_schema_serializer(component_name="ToolCall")
class ToolCallSerializer(serializers.Serializer):
    """One call of an MCP tool the run made, its arguments masked."""

    source = serializers.CharField(help_text="deterministic, agent, flow or admin")
    mcp_id = serializers.CharField()
    name = serializers.CharField()
    args = serializers.JSONField(help_text="Masked.")
    ok = serializers.BooleanField()
    reason = serializers.CharField(help_text="Empty, or the failure's reason code.")
    attempt = serializers.IntegerField()
    latency_ms = serializers.FloatField(allow_null=True)


class MaskedAsServed(serializers.BaseSerializer):  # type: ignore[type-arg]
    """A run, or an approval (a decision's answer, or one of its run's), served masked again with the credentials
    bound now (``shown_secrets``, read once per answer, a list's runs alike): the run's records were masked with
    those known when they were written, and a value bound as a secret since (a token the caller typed, then given
    to a server) was in none of them."""

    def to_representation(self, instance: Any) -> dict[str, Any]:
        data = super().to_representation(instance)
        if _SHOWN_SECRETS not in self.context:
            self.context[_SHOWN_SECRETS] = shown_secrets()
        shown: dict[str, Any] = mask_known(data, secrets=self.context[_SHOWN_SECRETS])
        return shown


_SHOWN_SECRETS = "shown_secrets"  # the serializer context's key of the secrets a run is masked with


@extend_schema_serializer(component_name="Approval")
class ApprovalOutputSerializer(MaskedAsServed, serializers.ModelSerializer):
    """A write call that waits (or waited) for a person's decision before it runs. Its `reason` is for programs:
    the platform's own reasons (a cancelled run, a call the run did not make) in stable English, the same in every
    language; `reason_text` is for people: the same reason in the caller's language. One that waits past its
    `expires_at` is `expired`, whether or not the periodic expiry has reached it yet (a decision would be refused
    as expired)."""

    reason_text = serializers.SerializerMethodField(
        help_text=(
            "`reason` in the caller's language (`Accept-Language`) where the platform wrote it (a cancelled run, "
            "a call the run did not make); a person's reason as they wrote it."
        )
    )

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
            "reason_text",
            "expires_at",
            "created_at",
        ]
        read_only_fields = fields  # output only: each field is in every answer (required in the schema)
        extra_kwargs = {
            "reason": {
                "help_text": (
                    "Empty, the decider's own words, or the platform's reason in stable English (the same in "
                    "every language: compare this one, show `reason_text`)."
                )
            }
        }

    def get_reason_text(self, approval: Approval) -> str:
        return approval_reason_text(approval.reason)

    def to_representation(self, instance: Approval) -> dict[str, Any]:
        data = super().to_representation(instance)
        if instance.status == Approval.Status.PENDING and instance.expires_at <= timezone.now():
            # Past its expiry, not yet reached by the periodic expiry: expired, as a decision would find it (409)
            # and as the dashboard and the approval's page show it.
            data["status"] = Approval.Status.EXPIRED.value
        return data


@extend_schema_serializer(component_name="RunFeedbackRecorded")
class RunFeedbackOutputSerializer(serializers.Serializer):
    """The caller's satisfaction with the run's answer, as recorded."""

    score = serializers.FloatField(help_text="Normalized to -1..1.")
    scale = serializers.CharField()
    comment = serializers.CharField()


class BuiltOnceFields:
    """An output-only model serializer whose fields are built from the model once per process: DRF builds them
    anew for every instance (about 0.5 ms of introspection here for a run, on every answer of ``POST /runs`` and
    ``GET /runs/{id}``), then copies and binds each one for each answer (another 0.4 ms). Here an answer is
    written by fields built and bound once per class (to a serializer of their own, used for nothing else):
    reading a value changes nothing of a field, and a method field's method is the answering serializer's. Where
    DRF asks for ``fields`` itself (the schema, the browsable API), it gets shallow copies of the fields built
    once, which ``bind`` sets on its own. Never for a serializer that validates input (its validators would be
    shared)."""

    _built_fields: dict[type, dict[str, serializers.Field]] = {}
    _answer_fields: dict[type, list[tuple[str, serializers.Field, str | None]]] = {}

    def get_fields(self) -> dict[str, serializers.Field]:
        built = BuiltOnceFields._built_fields.get(type(self))
        if built is None:
            built = BuiltOnceFields._built_fields[type(self)] = super().get_fields()  # type: ignore[misc]
        return {name: copy.copy(field) for name, field in built.items()}

    def _bound_once(self) -> list[tuple[str, serializers.Field, str | None]]:
        """(name, field bound to a serializer of this class's own, the method of a method field)."""
        answer = BuiltOnceFields._answer_fields.get(type(self))
        if answer is None:
            answer = [
                (name, field, field.method_name if isinstance(field, serializers.SerializerMethodField) else None)
                for name, field in type(self)().fields.items()
                if not field.write_only
            ]
            BuiltOnceFields._answer_fields[type(self)] = answer
        return answer

    def to_representation(self, instance: Any) -> dict[str, Any]:
        """What DRF's ``Serializer.to_representation`` gives, field by field (``tests/api/test_runs_api.py``)."""
        answer: dict[str, Any] = {}
        for name, field, method in self._bound_once():
            if method is not None:
                answer[name] = getattr(self, method)(instance)
                continue
            try:
                value = field.get_attribute(instance)
            except SkipField:
                continue
            empty = value.pk if isinstance(value, PKOnlyObject) else value
            answer[name] = None if empty is None else field.to_representation(value)
        return answer


# RunTimings and TokenUsage describe the run's two JSON fields in the schema; the fields are written as stored.
@extend_schema_serializer(component_name="RunTimings")
class RunTimingsSerializer(serializers.Serializer):
    """How long the run's stages took, in milliseconds (empty until a worker has run it; a
    resumed run's passes added up). A stage the run did not go through is absent."""

    queue_wait_ms = serializers.FloatField(required=False, help_text="From submission until a worker took the run.")
    deterministic_ms = serializers.FloatField(required=False, help_text="Deterministic rules and their tool calls.")
    model_ms = serializers.FloatField(required=False, help_text="Waiting for the model.")
    tools_ms = serializers.FloatField(required=False, help_text="Tool calls the model or the flow made.")
    flow_ms = serializers.FloatField(required=False, help_text="A flow agent's flow.")
    total_ms = serializers.FloatField(required=False)


@extend_schema_serializer(component_name="TokenUsage")
class TokenUsageSerializer(serializers.Serializer):
    """The tokens the run's model calls used (empty until a worker has run it). The cache
    counts are present where the provider reports them."""

    input_tokens = serializers.IntegerField(required=False)
    output_tokens = serializers.IntegerField(required=False)
    total_tokens = serializers.IntegerField(required=False)
    model_calls = serializers.IntegerField(required=False)
    model_calls_saved = serializers.IntegerField(
        required=False, help_text="1 where the deterministic results answered without the model."
    )
    cache_read_tokens = serializers.IntegerField(required=False)
    cache_creation_tokens = serializers.IntegerField(required=False)


@extend_schema_field(RunTimingsSerializer)
class RunTimingsField(serializers.JSONField):
    """The run's ``timings`` as stored (the schema names their keys)."""


@extend_schema_field(TokenUsageSerializer)
class TokenUsageField(serializers.JSONField):
    """The run's ``token_usage`` as stored (the schema names their keys)."""


@extend_schema_serializer(component_name="Run")
class RunOutputSerializer(MaskedAsServed, BuiltOnceFields, serializers.ModelSerializer):
    """A run: its input, its status and outcome, what it did (deterministic results, tool calls, approvals) and
    what it cost."""

    agent = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    version = serializers.SlugRelatedField(
        slug_field="number",
        read_only=True,
        allow_null=True,
        help_text="The published agent version the run ran (null: the agent was never published).",
    )
    arm = serializers.CharField(read_only=True, help_text="The A/B arm the run was assigned to (empty: none).")
    feedback = serializers.SerializerMethodField()
    error = serializers.SerializerMethodField()
    tool_calls = serializers.SerializerMethodField()
    approvals = serializers.SerializerMethodField()
    cost_usd = serializers.SerializerMethodField(help_text="The run's cost at the admin's price table (0: unpriced).")
    timings = RunTimingsField(read_only=True)
    token_usage = TokenUsageField(read_only=True)

    class Meta:
        model = Run
        fields = [
            "id",
            "agent",
            "version",
            "arm",
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
            "cost_usd",
            "tool_failures",
            "feedback",
            "created_at",
            "started_at",
            "finished_at",
        ]
        # Output only: read-only, every field is in every answer, and the schema marks each one required.
        read_only_fields = fields

    @extend_schema_field(RunFeedbackOutputSerializer(allow_null=True))
    def get_feedback(self, run: Run) -> dict[str, Any] | None:
        if run.feedback_at is None:
            return None
        return {"score": run.feedback_score, "scale": run.feedback_scale, "comment": run.feedback_comment}

    def to_representation(self, instance: Run) -> dict[str, Any]:
        data = super().to_representation(instance)
        data["deterministic_results"] = [
            {k: v for k, v in r.items() if k != "answer_template"} if isinstance(r, dict) else r
            for r in data.get("deterministic_results") or []
        ]
        return data

    @extend_schema_field(RunErrorSerializer(allow_null=True))
    def get_error(self, run: Run) -> dict[str, str] | None:
        if not run.error_code:
            return None
        return {"code": run.error_code, "message": error_message_text(run.error_code, run.error_message)}

    def get_cost_usd(self, run: Run) -> float:
        return round(run.cost_micros / 1_000_000, 6)

    @extend_schema_field(ToolCallSerializer(many=True))
    def get_tool_calls(self, run: Run) -> list[dict[str, Any]]:
        if _never_started(run):
            return []
        return run_tool_calls(run=run)

    @extend_schema_field(ApprovalOutputSerializer(many=True))
    def get_approvals(self, run: Run) -> list[dict[str, Any]]:
        if _never_started(run):
            return []
        # The answer's context: its secrets, read once for the run, mask each approval (``MaskedAsServed``).
        return [ApprovalOutputSerializer(a, context=self.context).data for a in run_approvals(run=run)]


def _never_started(run: Run) -> bool:
    """A run no worker has claimed yet has called no tool and asked for no approval (two queries saved on the
    answer to ``POST /runs``)."""
    return run.status == Run.Status.QUEUED and run.started_at is None and not run.delivery_count


@extend_schema_serializer(component_name="RunSummary")
class RunSummarySerializer(MaskedAsServed, BuiltOnceFields, serializers.ModelSerializer):
    """A run in a list: no trace, tool calls or approvals (`GET /runs/{id}` has them)."""

    agent = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    version = serializers.SlugRelatedField(slug_field="number", read_only=True, allow_null=True)
    arm = serializers.CharField(read_only=True)
    error = serializers.SerializerMethodField()

    class Meta:
        model = Run
        fields = [
            "id",
            "agent",
            "version",
            "arm",
            "status",
            "query",
            "answer",
            "error",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields  # output only: each field is in every answer (required in the schema)

    @extend_schema_field(RunErrorSerializer(allow_null=True))
    def get_error(self, run: Run) -> dict[str, str] | None:
        if not run.error_code:
            return None
        return {"code": run.error_code, "message": error_message_text(run.error_code, run.error_message)}


@extend_schema_serializer(component_name="RunPage")
class RunPageSerializer(serializers.Serializer):
    """A page of the caller's runs, newest first."""

    next = serializers.URLField(allow_null=True, help_text="The next (older) page, or null.")
    previous = serializers.URLField(allow_null=True, help_text="The previous (newer) page, or null.")
    results = RunSummarySerializer(many=True)


# --- GET /usage (documentation only: ``agents.budgets.api_key_usage`` writes the answer) ----------------------


@extend_schema_serializer(component_name="UsageTotals")
class UsageTotalsSerializer(serializers.Serializer):
    """The key's runs, tokens and cost over a period."""

    runs = serializers.IntegerField()
    tokens = serializers.IntegerField()
    cost_usd = serializers.FloatField(help_text="At the admin's price table.")


@extend_schema_serializer(component_name="UsagePeriodStarts")
class UsagePeriodStartsSerializer(serializers.Serializer):
    """Where the periods of `today` and `this_month` began: midnight UTC."""

    today = serializers.DateTimeField()
    this_month = serializers.DateTimeField()


@extend_schema_serializer(component_name="AgentUsage")
class AgentUsageSerializer(UsageTotalsSerializer):
    """The key's runs, tokens and cost with one agent this month."""

    agent = serializers.CharField(help_text="The agent's slug.")


@extend_schema_serializer(component_name="DailyUsage")
class DailyUsageSerializer(UsageTotalsSerializer):
    """The key's runs, tokens and cost on one UTC day (a day without runs is zeros)."""

    day = serializers.DateField()


@extend_schema_serializer(component_name="BudgetState")
class BudgetStateSerializer(serializers.Serializer):
    """A budget that applies to the key, and its use in the current period."""

    id = serializers.IntegerField()
    scope = serializers.ChoiceField(choices=["api_key", "agent"], help_text="The key's own budget, or an agent's.")
    agent = serializers.CharField(allow_null=True, help_text="The agent's slug (null: the key's own budget).")
    period = serializers.ChoiceField(choices=["day", "month"], help_text="UTC days or months.")
    period_start = serializers.DateTimeField()
    resets_at = serializers.DateTimeField()
    max_tokens = serializers.IntegerField(allow_null=True, help_text="Null: no token limit.")
    max_cost_usd = serializers.FloatField(allow_null=True, help_text="Null: no cost limit.")
    used_tokens = serializers.IntegerField()
    used_cost_usd = serializers.FloatField()
    reserved_tokens = serializers.IntegerField(help_text="Held by runs in flight.")
    reserved_cost_usd = serializers.FloatField(help_text="Held by runs in flight.")
    run_reservation_tokens = serializers.IntegerField(help_text="What each new run reserves.")


@extend_schema_serializer(component_name="Usage")
class UsageSerializer(serializers.Serializer):
    """The calling key's tokens, cost and budgets (UTC periods)."""

    api_key = serializers.CharField(help_text="The key's prefix.")
    day_boundary = serializers.ChoiceField(
        choices=["UTC"],
        help_text="Where a day starts for `today`, `this_month`, `by_day` and the budgets' periods: midnight UTC "
        "(run times elsewhere in the API are in the server's time zone).",
    )
    period_starts = UsagePeriodStartsSerializer()
    today = UsageTotalsSerializer()
    this_month = UsageTotalsSerializer()
    by_agent = AgentUsageSerializer(many=True, help_text="This month, per agent.")
    by_day = DailyUsageSerializer(many=True, help_text="The last 30 days, oldest first.")
    budgets = BudgetStateSerializer(many=True)
