"""The network model providers: ``bedrock`` (ChatBedrockConverse) and ``openai_compatible`` (ChatOpenAI against any
OpenAI-compatible ``/v1/chat/completions``: vLLM, Ollama, LiteLLM, OpenAI itself).

What they share:

- **Failures are values with reason codes.** A provider exception is classified by kind (``model_error_kind``):
  ``throttled``, ``timeout``, ``connection``, ``unavailable`` (5xx), ``validation``, ``auth``, ``error``, and
  ``context_window`` (the conversation is longer than the model can read; never retried). Kinds in
  the agent's retry policy (``model_params["retry"]``, default: throttled, timeout, connection, unavailable, three
  attempts) are retried with exponential backoff and jitter, as the gate retries tool calls by reason; what is
  left becomes ``ModelCallFailed`` with the code ``model:<kind>``, which the engine turns into a failed run. The
  SDKs' own retries are switched off so that this policy is the only one.
- **A turn that is no finished one.** A turn the provider says was cut off (at its token limit or its context
  window), filtered or malformed (``UNFINISHED_TURN_CODES``) fails the run with its own code and none of its calls
  is sent (``agents.engine``); a reply that holds no choice is an empty turn (``model:empty``) with the usage it
  reported; an error object sent with HTTP 200 is the failure its code names (``ModelErrorAnswer``).
- **Forced tool choice.** Both accept ``bind_tools(tools, tool_choice=...)`` (``"auto"``, ``"any"``, or a tool's
  name) and declare it: ``supports_tool_choice(provider=..., model_id=..., kind="any" | "tool")`` (some Bedrock
  models take "any" but no named tool). ``model_params["tool_choice"]`` is read as a word (``tool_choice_name``:
  an object form as the choice it names): ``"auto"`` and ``"none"`` hold for every model turn; a forcing choice
  (``"any"``, a tool's name) is the model's ``first_turn_tool_choice``, which the run's tool offer forces on the
  run's first model turn only, as it forces ``tool_selection.force_first_tool`` (which takes precedence): forced
  on every turn, the model could never answer. Bedrock's Converse API has no ``"none"`` (only auto, any and a
  tool): there the model is given no tools.
- **What a call may be sent again.** A budgeted run's model (``retry_sent_requests=False``) retries a connection
  failure or a timeout only when the request never reached the provider (it could not connect, a connect timeout
  among them): one that timed out or was cut after it was sent (a read or protocol error, a stream that ended
  early) may have been generated and billed, and its tokens are never reported. A streamed turn that ends without
  its finish reason is such a cut (``ModelStreamCutShort``), never a finished answer, and so is one that ends with
  an error event after its HTTP 200 (``stream_error_event``), whatever kind its error names. A reply that arrived but
  that langchain could not read is not asked for again; its failure carries the tokens it reported, which the run
  is charged. Every attempt that timed out or was cut after its request was (or may have been) sent, the ones sent
  again included, is told to the model's ``on_unanswered_call``, which charges the run an estimate of it
  (``agents.engine``); one that never reached the provider costs nothing. No call is sent again once the run is
  cancelled. A call answered with a ``Retry-After`` (a 429, a 503) is sent again no sooner than it asks, not at all
  where it asks for longer than the policy's ``max_backoff_s`` (its failure quotes the wait). An error object's
  code is read as the HTTP status it names, or as OpenAI's words for one (``server_error``: 5xx;
  ``rate_limit_exceeded``, ``rate_limit_error``: 429).
- **A reply that is no JSON** (a web page: the base URL points at a web UI or a login proxy) fails ``model:error``
  naming its content type and the base URL to check, never quoting the page.
- **Redirects are not followed.** The OpenAI-compatible client answers a 3xx as a failure (``model:validation``):
  the model's key and the conversation go only to the base URL that the address policy checked.
- **Tool calls whose arguments are JSON but no object** (``[1, 2]``) are the model's malformed calls, as arguments
  that are no JSON are: langchain's ``invalid_tool_calls`` (the arguments as the model wrote them), which the gate
  refuses with ``args:json`` and the model is told of; the turn and its token usage are kept. Arguments sent as a
  JSON object where their text belongs are the call they write. A streamed call's arguments are read whole, when
  the stream has ended: text cut short (``{"name": "박도``) is refused as it is in the reply's JSON form, never
  "repaired" by langchain into a call the model did not finish.
- **Secrets.** The OpenAI-compatible key is the agent's encrypted ``model_secrets["api_key"]`` (a value, or
  ``{"from_env": NAME}`` read on the worker); it is never in ``model_params``. Bedrock's credentials come from
  boto3's standard chain, never from the database.

Bedrock extras: a Guardrail (``model_params["guardrail"] = {"id", "version"}``; the intervention is in the model
turn's ``response_metadata`` and the engine records it in the run's trace) and cross-region inference profile ids
(``us.anthropic...``, ``apac.anthropic...``), passed through as the model id.
"""

from __future__ import annotations

import copy
import functools
import http.cookiejar
import json
import logging
import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any, Literal

import openai
from botocore.exceptions import BotoCoreError
from django.conf import settings
from django.utils.translation import gettext as _
from langchain_aws import ChatBedrockConverse
from langchain_core.exceptions import ContextOverflowError
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.messages.tool import invalid_tool_call, tool_call_chunk
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import RunnableConfig
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from agents.errors import MUST_PROPAGATE
from agents.model_texts import ModelErrorKind, ModelFailureKind

logger = logging.getLogger(__name__)

RETRYABLE_BY_DEFAULT: tuple[ModelErrorKind, ...] = ("throttled", "timeout", "connection", "unavailable")

# What each provider can do; ``tool_choice``: ``bind_tools(tools, tool_choice=...)`` forces a tool call.
PROVIDER_CAPABILITIES: dict[str, frozenset[str]] = {
    "openai_compatible": frozenset({"tool_choice", "streaming", "token_usage"}),
    "bedrock": frozenset({"tool_choice", "guardrails", "token_usage"}),
    "scripted": frozenset({"tool_choice", "token_usage"}),
    "offline": frozenset(),
}


def supports_tool_choice(*, provider: str, model_id: str = "", kind: Literal["any", "tool"] = "any") -> bool:
    """Whether the provider (and, for Bedrock, the model) honours a forced ``tool_choice`` of ``kind``: ``"any"``
    (some tool) or ``"tool"`` (one named tool). Some Bedrock models take "any" but no named tool (Mistral Large,
    DeepSeek, most GLM models, as langchain-aws lists them): a name forced on them fails every call."""
    if "tool_choice" not in PROVIDER_CAPABILITIES.get(provider, frozenset()):
        return False
    if provider == "bedrock":
        try:
            probe = ChatBedrockConverse(model=model_id or "x", region_name="us-east-1", client=object())
        except Exception:  # noqa: BLE001 - a model id langchain-aws refuses (an ARN): the agent's check says why
            return False
        return kind in (probe.supports_tool_choice_values or ())
    return True


def tool_choice_forms() -> str:
    """The forms tool_choice takes, as its refusal says."""
    return _(
        'tool_choice: write auto, any, none or a tool\'s name, or an object naming the tool ({"type": "tool", '
        '"name": "…"}).'
    )


def tool_choice_name(choice: Any) -> str | None:
    """What ``model_params.tool_choice`` asks of the model, as a word: ``auto``, ``any``, ``none`` or the tool's
    name, given as that text or as an object naming the tool (``{"type": "tool", "name": "lookup"}``, or
    OpenAI's ``{"type": "function", "function": {"name": "lookup"}}``) or the choice (``{"type": "any"}``); None
    when not given. Raises ValueError for an object that names no tool (its provider refused it on every run).

    Each provider is given this word, never the object: Converse and Chat Completions each take their own object
    form only, and langchain builds it from the word."""
    if choice is None or isinstance(choice, str):
        return choice
    if isinstance(choice, dict):
        function = choice.get("function")
        name = choice.get("name", function.get("name") if isinstance(function, dict) else None)
        if isinstance(name, str) and name.strip():
            return name
        if "name" not in choice and function is None and choice.get("type") in ("auto", "any", "none"):
            return str(choice["type"])
    raise ValueError(choice)


class ModelRetryPolicy(BaseModel):
    """``model_params["retry"]``: which failure kinds to retry and how often (attempts include the first)."""

    model_config = ConfigDict(extra="forbid")

    max_attempts: int = Field(default=3, ge=1, le=10)
    on: list[ModelErrorKind] = Field(default_factory=lambda: list(RETRYABLE_BY_DEFAULT))
    backoff_s: float = Field(default=0.5, ge=0, le=30)
    max_backoff_s: float = Field(default=8.0, ge=0, le=120)


class GuardrailSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=200)
    version: str = Field(default="DRAFT", min_length=1, max_length=20)
    trace: Literal["enabled", "disabled", "enabled_full"] = "enabled"


# What ``Agent.model_params`` holds for the other modes: the scripted model's turns and pace (tests, DEBUG) and a
# flow's settings (``agents/flows``).
OTHER_MODE_PARAMS = ("script", "latency_s", "flow")


class ModelParams(BaseModel):
    """What ``Agent.model_params`` may hold for the network providers (others keys belong to the scripted and
    flow modes and are ignored here)."""

    model_config = ConfigDict(extra="allow")

    temperature: float | None = Field(default=None, ge=0, le=2)
    max_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    top_p: float | None = Field(default=None, ge=0, le=1)
    timeout_s: float = Field(default=60.0, gt=0, le=900)
    region_name: str | None = None
    base_url: str | None = None
    stream: bool = False
    tool_choice: str | dict[str, Any] | None = None
    guardrail: GuardrailSpec | None = None
    retry: ModelRetryPolicy = Field(default_factory=ModelRetryPolicy)

    @field_validator("max_tokens", mode="before")
    @classmethod
    def _a_whole_number(cls, value: Any, info: ValidationInfo) -> Any:
        """A token limit is a whole number: ``1024``, or ``1024.0`` as the admin's KEY=value lines read
        ``max_tokens=1024.0`` or ``1e3`` (lax parsing takes it as 1024 and refuses ``1024.5``). A text (``"100"``)
        or a bool is refused where the parameters are saved: lax parsing took them, and a budgeted run read the
        stored value as no limit at all. Parameters stored before (``STORED``) are read as lax parsing reads them,
        so that an agent saved then still runs with the limit its provider was always sent."""
        if isinstance(value, bool | str) and not (info.context or {}).get(_STORED_KEY):
            raise PydanticCustomError("int_type", "Input should be a valid integer")
        return value


_STORED_KEY = "stored"
# The validation context of parameters read back from an agent or a version (``stored_model_params``).
STORED: dict[str, Any] = {_STORED_KEY: True}


def stored_model_params(params: dict[str, Any] | None) -> ModelParams:
    """An agent's stored parameters as a run reads them (``STORED``). Raises pydantic's ValidationError for
    parameters that never validated (the run's model cannot be made)."""
    return ModelParams.model_validate(params or {}, context=STORED)


def saved_model_params(params: dict[str, Any]) -> dict[str, Any]:
    """Valid parameters as they are stored: a ``max_tokens`` given as a whole float (``1024.0``, ``1e3`` from the
    admin's KEY=value lines) as the int it is, so that the stored value, its change record and a version's copy
    say 1024."""
    max_tokens = params.get("max_tokens")
    if isinstance(max_tokens, float) and max_tokens.is_integer():
        return {**params, "max_tokens": int(max_tokens)}
    return params


# The highest temperature each provider's API takes where it is below ``ModelParams``' own bound (2, Chat
# Completions'): Converse's ``InferenceConfiguration.temperature`` is at most 1 (botocore's service model), and a
# higher one fails every call (``model:validation``).
TEMPERATURE_MAX: dict[str, float] = {"bedrock": 1.0}


def provider_param_problems(*, provider: str, parsed: ModelParams) -> list[str]:
    """What ``provider``'s API refuses of parameters that ``ModelParams`` takes for every provider: each a message
    naming the parameter and the provider's range. For the agent's save check, where the value or the provider
    changes (an agent stored with such a value still loads; its runs fail with the provider's refusal)."""
    highest = TEMPERATURE_MAX.get(provider)
    if highest is not None and parsed.temperature is not None and parsed.temperature > highest:
        return [
            _("temperature: the %(provider)s provider takes 0 to %(highest)s.")
            % {"provider": provider, "highest": f"{highest:g}"}
        ]
    return []


class ModelCallFailed(Exception):
    """A model call that failed for good (after the retries its kind allows). ``code`` is ``model:<kind>``. Its
    message holds the provider's text whole, neither masked nor cut: mask it before it is shown or stored, and cut
    it only after."""

    def __init__(
        self, *, kind: ModelFailureKind, detail: str, attempts: int, usage: UsageMetadata | None = None
    ) -> None:
        # Attempts 0: the model refused before any call was sent (the tools or the tool choice, as they were bound).
        super().__init__(f"{detail} (after {attempts} attempt{'s' if attempts != 1 else ''})" if attempts else detail)
        self.kind = kind
        self.code = f"model:{kind}"
        self.attempts = attempts
        self.detail = detail
        # The tokens of a reply that arrived but could not be read (``ModelReplyUnreadable``): spent, and charged.
        self.usage = usage


class ModelReplyUnreadable(Exception):
    """A model's reply that arrived, with the tokens it used, but that langchain could not read (a content block
    it does not know, a tool call of a shape it refuses): raised from langchain's exception, with the reply's
    ``usage``. The call is not sent again (its tokens were spent); its failure carries the usage, which the run is
    charged (``ModelCallFailed.usage``)."""

    def __init__(self, usage: UsageMetadata) -> None:
        super().__init__("the model's reply could not be read")
        self.usage = usage


_BOTO_CODES: dict[str, ModelErrorKind] = {
    "ThrottlingException": "throttled",
    "TooManyRequestsException": "throttled",
    "ServiceQuotaExceededException": "throttled",
    "ModelTimeoutException": "timeout",
    "ServiceUnavailableException": "unavailable",
    "InternalServerException": "unavailable",
    "ModelNotReadyException": "unavailable",
    "ValidationException": "validation",
    "ResourceNotFoundException": "validation",
    "AccessDeniedException": "auth",
    "UnrecognizedClientException": "auth",
    "ExpiredTokenException": "auth",
    # The request's signature or credentials were refused (a wrong secret key, a skewed clock, no token).
    "InvalidSignatureException": "auth",
    "SignatureDoesNotMatch": "auth",
    "IncompleteSignatureException": "auth",
    "MissingAuthenticationTokenException": "auth",
    "InvalidClientTokenId": "auth",
    "ExpiredToken": "auth",
}


class ModelStreamCutShort(ConnectionError):
    """A streamed model turn that ended before the provider said why the model stopped (no ``finish_reason``): the
    connection closed early, and what arrived is the first part of a turn, not a finished one. A connection
    failure (retried by the agent's policy), one whose request reached the provider."""


class ModelReplyNotJson(Exception):
    """A model server's HTTP 200 reply that is no JSON (a web page: the base URL points at a web UI or a login
    proxy, not at the server's API). ``content_type`` is the reply's, as its server said it; the page itself is
    kept out of the failure."""

    def __init__(self, content_type: str) -> None:
        super().__init__(f"the model server's reply is not JSON ({content_type or 'no content type'})")
        self.content_type = content_type


class ModelErrorAnswer(Exception):
    """A model server's reply that is an error object where a completion belongs (``{"error": {"message": "model
    overloaded", "code": 503}}``, with HTTP 200, as some gateways and servers send it). ``status`` is the HTTP status
    its code names (0 where it names none): the failure is the kind that status is (``model_error_kind``), so an
    overloaded server's 503 is ``unavailable`` and retried by the agent's policy, as a 503 response is."""

    def __init__(self, error: Any) -> None:
        super().__init__(f"the model server's reply is an error: {json.dumps(error, ensure_ascii=False, default=str)}")
        self.status = _error_status(error)


# The HTTP status an error object names in words where its ``code`` is no status: OpenAI's ``type`` ``server_error``
# (a stream's error event: ``{"type": "server_error", "code": null}``) and its code ``rate_limit_exceeded``, and the
# type ``rate_limit_error`` of the gateways that write Anthropic's error shape (LiteLLM).
_ERROR_WORDS: dict[str, int] = {"server_error": 500, "rate_limit_exceeded": 429, "rate_limit_error": 429}


def _error_status(error: Any) -> int:
    """The HTTP status an error object's ``code`` names (``503``, ``"503"``), or its words (``_ERROR_WORDS``), or 0
    (``"invalid_api_key"``)."""
    if not isinstance(error, dict):
        return 0
    code = error.get("code")
    if isinstance(code, str) and code.isascii() and code.isdigit():
        code = int(code)
    if type(code) is int and 100 <= code <= 599:
        return code
    words = (error.get("code"), error.get("type"))
    return next((_ERROR_WORDS[word] for word in words if isinstance(word, str) and word in _ERROR_WORDS), 0)


def _status_kind(status: int) -> ModelErrorKind:
    """The kind of a failure answered with the HTTP ``status``."""
    if status in (401, 403):
        return "auth"
    return "throttled" if status == 429 else "unavailable" if status >= 500 else "error"


# What a provider's refusal says of a conversation longer than the model's context window, where its SDK did not
# raise langchain's ``ContextOverflowError`` for it (vLLM's "This model's maximum context length is 8192 tokens",
# Bedrock's "Input is too long for requested model."), lowercase.
_CONTEXT_OVERFLOW_TEXTS = (
    "maximum context length",
    "context_length_exceeded",
    "context window",
    "input is too long",
    "prompt is too long",
    "input tokens exceed",
)


def _context_overflow(exc: BaseException) -> bool:
    """Whether the provider refused the request because the conversation is longer than the model can read."""
    if isinstance(exc, ContextOverflowError):
        return True
    text = str(exc).lower()
    return any(marker in text for marker in _CONTEXT_OVERFLOW_TEXTS)


def model_error_kind(exc: BaseException) -> ModelFailureKind:
    """The kind of a provider failure, from the exception the SDK raised (botocore, openai, httpx) or a plain
    ``TimeoutError``/``ConnectionError``. Anything else is ``error`` (not retried by default). A refusal of a
    conversation longer than the model's context window is ``context_window``, never retried."""
    kind = _provider_error_kind(exc)
    if kind in ("validation", "error") and _context_overflow(exc):
        return "context_window"
    return kind


def _provider_error_kind(exc: BaseException) -> ModelErrorKind:
    import botocore.exceptions as boto
    import httpx

    if isinstance(exc, boto.ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        return _BOTO_CODES.get(code) or _status_kind(status)
    if isinstance(exc, (boto.ReadTimeoutError, boto.ConnectTimeoutError)):
        return "timeout"
    if isinstance(exc, (boto.EndpointConnectionError, boto.ConnectionClosedError)):
        return "connection"
    if isinstance(exc, (boto.NoCredentialsError, boto.PartialCredentialsError)):
        return "auth"
    if isinstance(exc, ModelErrorAnswer):
        return _status_kind(exc.status)
    if isinstance(exc, openai.APITimeoutError):
        return "timeout"
    if isinstance(exc, openai.APIConnectionError):
        return "connection"
    if isinstance(exc, openai.RateLimitError):
        return "throttled"
    if isinstance(exc, (openai.AuthenticationError, openai.PermissionDeniedError)):
        return "auth"
    if isinstance(exc, (openai.BadRequestError, openai.NotFoundError, openai.UnprocessableEntityError)):
        return "validation"
    if isinstance(exc, openai.APIStatusError):
        if 300 <= exc.status_code < 400:
            return "validation"  # a redirect, not followed: the base URL is the one to change
        return "unavailable" if exc.status_code >= 500 else "error"
    if isinstance(exc, openai.APIError) and isinstance(exc.body, dict):
        # An error event in a stream (``data: {"error": {"message": "model overloaded", "code": 503}}``): the kind
        # its code names, as the same error object in a JSON reply is (``ModelErrorAnswer``).
        return _status_kind(_error_status(exc.body))
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        return "timeout"
    if isinstance(exc, httpx.TransportError | ConnectionError):
        return "connection"
    return "error"


def request_never_sent(exc: BaseException) -> bool:
    """Whether the failed call's request never reached the provider: the client could not connect (refused, no
    route, no such host, a connect timeout, the proxy unreachable), as the exception or one it was raised from
    says. Such a call generated nothing and cost nothing; any other failure may have come after the provider took
    the request."""
    import botocore.exceptions as boto
    import httpx
    import httpx2

    not_connected = (
        httpx.ConnectError,
        httpx.ConnectTimeout,
        httpx2.ConnectError,
        httpx2.ConnectTimeout,
        boto.EndpointConnectionError,
        boto.ConnectTimeoutError,
        boto.ProxyConnectionError,
    )
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, not_connected):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def stream_error_event(exc: BaseException) -> bool:
    """Whether ``exc`` is an error event of a model's stream (``data: {"error": {...}}``), which came after the
    provider answered HTTP 200 and began the stream (the OpenAI SDK raises it as a plain ``APIError``): its request
    was sent, and the model may have generated, and been billed for, part of its answer before it failed."""
    return isinstance(exc, openai.APIError) and not isinstance(exc, openai.APIStatusError | openai.APIConnectionError)


def unanswered_after_sending(kind: ModelFailureKind, exc: BaseException) -> bool:
    """Whether a failed call of ``kind`` timed out or was cut after its request was, or may have been, sent (not
    ``request_never_sent``), or failed with an error event in its stream (``stream_error_event``): the provider may
    have read its prompt and generated up to its ``max_tokens``, and billed them, while no answer (nor its usage)
    reached the run. A refusal the provider answered is no such call."""
    return (kind in ("timeout", "connection") and not request_never_sent(exc)) or stream_error_event(exc)


def _retry_after_s(exc: BaseException) -> float | None:
    """How long the model server's HTTP answer asked the client to wait (its ``Retry-After``, in seconds or as an
    HTTP date), or None where it did not say."""
    from mcpregistry.pool import retry_after_seconds

    # The SDK's response (httpx2's) has the headers httpx's has, which is all the function reads.
    return retry_after_seconds(exc.response) if isinstance(exc, openai.APIStatusError) else None  # type: ignore[arg-type]


def _waits_past_the_cap_text(asked: float, cap: float) -> str:
    """Why a call its provider asked to wait for longer than the retry policy lets it wait is not sent again."""
    return _(
        "The model server asked to wait %(seconds)s s before calling again (Retry-After), longer than the retry "
        "policy's max_backoff_s (%(cap)s s), so the call is not sent again."
    ) % {"seconds": f"{asked:g}", "cap": f"{cap:g}"}


def _detail(exc: BaseException) -> str:
    """The provider's failure as text, whole: never cut here. The engine masks it (with the run's secrets, the
    model's key among them) and only then cuts it; a cut first would leave a secret that straddles it as a prefix
    that neither the secret's value nor any pattern matches."""
    if isinstance(exc, ModelReplyUnreadable) and exc.__cause__ is not None:
        return _detail(exc.__cause__)
    if isinstance(exc, openai.APIStatusError) and 300 <= exc.status_code < 400:
        return _(
            "The model server answered with a redirect (HTTP %(status)d to %(location)s), which is not followed: the "
            "model's key and the conversation go only to the base URL the address policy checked. Set "
            "model_params.base_url to the address the server names if it is one to use."
        ) % {"status": exc.status_code, "location": exc.response.headers.get("location") or "-"}
    if isinstance(exc, json.JSONDecodeError) and getattr(exc, "response", None) is not None:
        # A body the OpenAI SDK could not read as the JSON its content type says (langchain attaches the response).
        return _detail(ModelReplyNotJson(str(exc.response.headers.get("content-type", ""))))  # type: ignore[attr-defined]
    if isinstance(exc, ModelReplyNotJson):
        return _(
            "The model server's reply is not JSON (content type %(content_type)s): check that model_params.base_url "
            "is the address of its OpenAI-compatible API (it usually ends in /v1), not of a web page or a login "
            "proxy."
        ) % {"content_type": exc.content_type or "-"}
    return f"{type(exc).__name__}: {exc}"


# A tool call's arguments that are JSON but no object, as the provider's response is read: replaced by an object
# holding their text under this key (langchain would refuse the whole turn), then made the turn's invalid call.
_NOT_AN_OBJECT = "__platform_arguments_not_an_object__"


def _not_an_object(arguments: Any) -> bool:
    """Whether a tool call's arguments, as the model's server sent them, are something other than an object: JSON
    text that parses to none (``[1, 2]``, ``"x"``, ``3``, ``null``), or such a JSON value sent where the text
    belongs. Text that is no JSON is langchain's to refuse, as it does; none (``null``, ``""``) is an empty object,
    as langchain reads it."""
    if arguments is None or isinstance(arguments, dict):
        return False
    if not isinstance(arguments, str):
        return True
    if not arguments.strip():
        return False
    try:
        return not isinstance(json.loads(arguments), dict)
    except ValueError:
        return False


def _marked(written: str) -> str:
    """A call's argument text replaced by the marker object holding it (``_NOT_AN_OBJECT``)."""
    return json.dumps({_NOT_AN_OBJECT: written}, ensure_ascii=False)


def _streamed_arguments(written: str) -> str:
    """A streamed call's argument text, whole, as the turn is given it: the text itself where it is a JSON object
    (read as the reply's JSON form reads it) or nothing (an empty object, as langchain reads it), else marked
    (``_marked``). langchain would read it as JSON cut short and "repair" it (``{"name": "박도`` became
    ``{"name": "박도"}``): a call the model never finished would run."""
    if not written:
        return written
    try:
        return written if isinstance(json.loads(written, strict=False), dict) else _marked(written)
    except ValueError:
        return _marked(written)


def _refused_not_objects(message: AIMessage) -> AIMessage:
    """``message`` with its calls whose arguments were no object (``_NOT_AN_OBJECT``) moved to its invalid tool
    calls, their arguments as the text the model wrote (the gate refuses them: ``args:json``). A content block of
    such a call (Converse's ``tool_use``) is given an empty input, as langchain-aws replays an invalid call: the
    refusal's tool result still answers a tool use the provider accepts."""
    refused = [c for c in message.tool_calls if set(c["args"]) == {_NOT_AN_OBJECT}]
    if not refused:
        return message
    ids = {c["id"] for c in refused}
    content: Any = message.content
    if isinstance(content, list):
        content = [
            {**block, "input": {}}
            if isinstance(block, dict) and block.get("type") == "tool_use" and block.get("id") in ids
            else block
            for block in content
        ]
    invalid = [
        invalid_tool_call(
            name=c["name"], args=str(c["args"][_NOT_AN_OBJECT]), id=c["id"], error="the arguments are no JSON object"
        )
        for c in refused
    ]
    return message.model_copy(
        update={
            "tool_calls": [c for c in message.tool_calls if c["id"] not in ids],
            "invalid_tool_calls": [*message.invalid_tool_calls, *invalid],
            "content": content,
        }
    )


def _with_refused_not_objects(result: ChatResult) -> ChatResult:
    for generation in result.generations:
        if isinstance(generation.message, AIMessage):
            generation.message = _refused_not_objects(generation.message)
    return result


def _arguments_held_back(chunk: ChatGenerationChunk, written: dict[int, str]) -> ChatGenerationChunk:
    """``chunk`` without the argument text of its tool call pieces, which is added to ``written`` (by the call's
    index) instead. A piece with no index is a call of its own, as langchain joins none to it: its text stays,
    checked (``_streamed_arguments``)."""
    message = chunk.message
    if not isinstance(message, AIMessageChunk) or not message.tool_call_chunks:
        return chunk
    pieces = []
    for piece in message.tool_call_chunks:
        text, index = piece.get("args") or "", piece.get("index")
        if index is not None:
            written[index] = written.get(index, "") + text
        args = _streamed_arguments(text) if index is None else ""
        pieces.append(tool_call_chunk(name=piece.get("name"), args=args, id=piece.get("id"), index=index))
    # Made anew, so that its calls are read from the pieces as they are now.
    kept = {name: getattr(message, name) for name in type(message).model_fields if name not in _CALL_FIELDS}
    return ChatGenerationChunk(
        message=AIMessageChunk(**kept, tool_call_chunks=pieces), generation_info=chunk.generation_info
    )


_CALL_FIELDS = ("tool_calls", "invalid_tool_calls", "tool_call_chunks")


def _usage_held_back(
    chunk: ChatGenerationChunk, total: UsageMetadata | None
) -> tuple[ChatGenerationChunk, UsageMetadata | None]:
    """``chunk`` without its usage, and the stream's total so far: the usage it reports where it reports one (each
    report is the total so far), ``total`` otherwise."""
    message = chunk.message
    if not isinstance(message, AIMessageChunk) or message.usage_metadata is None:
        return chunk, total
    without = message.model_copy(update={"usage_metadata": None})
    return ChatGenerationChunk(message=without, generation_info=chunk.generation_info), message.usage_metadata


# The usage of the Converse reply being read (``PlatformChatBedrockConverse._generate``), as the client's
# ``after-call`` hook saw it: langchain-aws may fail to read the reply after its tokens were spent.
_CONVERSE_USAGE: ContextVar[dict[str, Any] | None] = ContextVar("converse_usage", default=None)


def _mark_converse_not_objects(parsed: dict[str, Any] | None = None, **kwargs: Any) -> None:
    """botocore's ``after-call`` hook of Converse: a ``toolUse`` whose input is no object gets the marker object
    (``_NOT_AN_OBJECT``) holding it as JSON text, which ``PlatformChatBedrockConverse`` makes an invalid call. The
    reply's usage is kept aside for the model reading it (``_CONVERSE_USAGE``)."""
    holder = _CONVERSE_USAGE.get()
    usage = (parsed or {}).get("usage")
    if holder is not None and isinstance(usage, dict):
        holder.update(copy.deepcopy(usage))
    message = ((parsed or {}).get("output") or {}).get("message") or {}
    for block in message.get("content") or []:
        tool_use = block.get("toolUse") if isinstance(block, dict) else None
        if isinstance(tool_use, dict) and "input" in tool_use and not isinstance(tool_use["input"], dict):
            tool_use["input"] = {_NOT_AN_OBJECT: json.dumps(tool_use["input"], ensure_ascii=False, default=str)}


# How often a model call's backoff checks its run (``_RetriedByKind._wait``): one query each time.
CANCEL_CHECK_S = 0.5


class _RetriedByKind:
    """Mixed into a chat model: ``invoke`` (also through ``bind_tools``'s binding) retries the failure kinds of
    ``retry_policy`` and raises ``ModelCallFailed`` for the rest. Control-flow exceptions (a cancelled run, the
    task's time limit) are not provider failures and pass through untouched."""

    retry_policy: ModelRetryPolicy
    # False (a budgeted run's model): a connection failure is sent again only if its request never reached the
    # provider (``request_never_sent``); one cut after it was sent may have been generated and billed.
    retry_sent_requests: bool
    # ``model_params["tool_choice"]`` split by when it holds: "auto"/"none" on every turn (``bind_tools``'s default),
    # a forcing choice on the run's first turn (the ReAct graph passes it then).
    default_tool_choice: str | None
    first_turn_tool_choice: str | None
    # The run's check (``build_provider_model``'s ``check_cancelled``), made before each retry and during its
    # backoff: it raises ``RunCancelled`` where the run was cancelled, ran out of time or was taken over, and no
    # call is sent again then.
    check_cancelled: Callable[[], None] | None
    # Told of each attempt that timed out or was cut (its kind) after its request was, or may have been, sent, and
    # that brought no usage back: the provider may have read the prompt and generated its answer, and billed them.
    on_unanswered_call: Callable[[ModelFailureKind], None] | None

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> BaseMessage:
        policy = self.retry_policy
        attempt = 0
        while True:
            attempt += 1
            try:
                message = super().invoke(input, config, **kwargs)  # type: ignore[misc]
                # A streamed turn's calls whose argument text is no JSON object were marked as it ended.
                return _refused_not_objects(message) if isinstance(message, AIMessage) else message
            except MUST_PROPAGATE:
                raise
            except Exception as exc:
                kind = model_error_kind(exc)
                # A reply that arrived but could not be read is not asked for again: its tokens were spent.
                usage = exc.usage if isinstance(exc, ModelReplyUnreadable) else None
                if usage is None and unanswered_after_sending(kind, exc) and self.on_unanswered_call is not None:
                    self.on_unanswered_call(kind)  # before it is sent again or fails: each such attempt is charged
                resend = (
                    usage is None
                    and kind in policy.on
                    and (self.retry_sent_requests or not unanswered_after_sending(kind, exc))
                )
                if not resend or attempt >= policy.max_attempts:
                    raise ModelCallFailed(kind=kind, detail=_detail(exc), attempts=attempt, usage=usage) from exc
                delay = min(policy.max_backoff_s, policy.backoff_s * 2 ** (attempt - 1))
                delay *= 0.5 + random.random() / 2  # noqa: S311 - jitter, not a secret
                # The provider's ``Retry-After`` is waited for: sent sooner, the call is refused again. A wait longer
                # than the policy lets a call wait fails the call now, quoting it.
                asked = _retry_after_s(exc)
                if asked is not None and asked > policy.max_backoff_s:
                    detail = f"{_detail(exc)} {_waits_past_the_cap_text(asked, policy.max_backoff_s)}"
                    raise ModelCallFailed(kind=kind, detail=detail, attempts=attempt) from exc
                delay = max(delay, asked or 0.0)
                logger.info("model call failed (%s), attempt %d; retrying in %.2fs", kind, attempt, delay)
                self._stop_if_cancelled()
                self._wait(delay)

    def _stop_if_cancelled(self) -> None:
        if self.check_cancelled is not None:
            self.check_cancelled()

    def _wait(self, seconds: float) -> None:
        """A backoff (up to ``max_backoff_s``, two minutes at most), checking the run every ``CANCEL_CHECK_S``: a run
        cancelled (or out of time, or taken over) while its model call waits to be sent again ends then, not when
        the wait is over."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, CANCEL_CHECK_S))
            self._stop_if_cancelled()

    def bind_tools(self, tools: Sequence[Any], *, tool_choice: Any = None, **kwargs: Any) -> Any:
        return super().bind_tools(  # type: ignore[misc]
            tools, tool_choice=tool_choice if tool_choice is not None else self.default_tool_choice, **kwargs
        )


class PlatformChatOpenAI(_RetriedByKind, ChatOpenAI):  # type: ignore[misc]
    retry_policy: ModelRetryPolicy = Field(default_factory=ModelRetryPolicy)
    retry_sent_requests: bool = True
    # "none" is the Chat Completions API's own: sent as it is, with the tools, on every turn.
    default_tool_choice: str | None = None
    first_turn_tool_choice: str | None = None
    check_cancelled: Callable[[], None] | None = Field(default=None, exclude=True)
    on_unanswered_call: Callable[[ModelFailureKind], None] | None = Field(default=None, exclude=True)

    def _stream(self, *args: Any, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        # A stream that stops without a finish reason was cut (a server's connection-close framing ends it cleanly):
        # its text is a first part, with no usage, and must not pass as the model's answer. Each tool call's
        # argument text is held back until the stream has ended, then given whole, marked where it is no JSON
        # object (``_streamed_arguments``): the turn's invalid call, as in the reply's JSON form (``invoke``).
        # A server may report the usage on more than one chunk (on the chunk that finishes the choice and again on
        # the usage chunk; on every chunk with vLLM's continuous usage), each time as the total so far, and langchain
        # adds up every chunk's: the last total stands, given once after the stream's last chunk.
        stopped = False
        written: dict[int, str] = {}
        total: UsageMetadata | None = None
        for chunk in super()._stream(*args, **kwargs):
            stopped = stopped or bool((chunk.generation_info or {}).get("finish_reason"))
            chunk, total = _usage_held_back(chunk, total)
            yield _arguments_held_back(chunk, written)
        if total is not None:
            yield ChatGenerationChunk(message=AIMessageChunk(content="", usage_metadata=total))
        if not stopped:
            raise ModelStreamCutShort(
                "the model's stream ended before it said why the model stopped (no finish_reason)"
            )
        if written:
            whole = [
                tool_call_chunk(name=None, args=_streamed_arguments(text), id=None, index=index)
                for index, text in written.items()
            ]
            yield ChatGenerationChunk(message=AIMessageChunk(content="", tool_call_chunks=whole))

    def _create_chat_result(self, response: Any, generation_info: dict[str, Any] | None = None) -> ChatResult:
        # langchain-openai builds the turn's message with the parsed arguments of each call, and a pydantic error
        # fails the whole turn for arguments that are JSON but no object. Marked here, refused as invalid calls.
        if isinstance(response, str):
            # The OpenAI SDK gives the reply's text where its content type is no JSON, and langchain's failure quoted
            # the page: told by its content type (``_REPLY_CONTENT_TYPE``), without it.
            raise ModelReplyNotJson(_REPLY_CONTENT_TYPE.get())
        answer = response.model_dump(warnings=False) if isinstance(response, openai.BaseModel) else response
        if isinstance(answer, dict) and answer.get("error"):
            raise ModelErrorAnswer(answer["error"])  # langchain raised a ValueError, read as no kind of failure
        if isinstance(answer, dict) and answer.get("choices") == []:
            return self._no_choice_result(answer, generation_info)
        changed = marked = False
        for choice in (answer.get("choices") or []) if isinstance(answer, dict) else []:
            message = choice.get("message") if isinstance(choice, dict) else None
            for call in (message.get("tool_calls") or []) if isinstance(message, dict) else []:
                function = call.get("function") if isinstance(call, dict) else None
                arguments = function.get("arguments") if isinstance(function, dict) else None
                if isinstance(function, dict) and isinstance(arguments, dict):
                    # An object where its JSON text belongs (some servers send it so): the call it writes.
                    function["arguments"] = json.dumps(arguments, ensure_ascii=False)
                    changed = True
                elif isinstance(function, dict) and _not_an_object(arguments):
                    written = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
                    function["arguments"] = _marked(written)
                    changed = marked = True
        try:
            result = super()._create_chat_result(answer if changed else response, generation_info)
        except MUST_PROPAGATE:
            raise
        except Exception as exc:
            # The reply arrived, and with it the tokens it used: its failure carries them (the run is charged).
            usage = answer.get("usage") if isinstance(answer, dict) else None
            if not isinstance(usage, dict):
                raise
            raise ModelReplyUnreadable(_openai_usage(usage)) from exc
        return _with_refused_not_objects(result) if marked else result

    def _no_choice_result(self, answer: dict[str, Any], generation_info: dict[str, Any] | None) -> ChatResult:
        """A reply that holds no choice (``"choices": []``): an empty turn marked ``NO_CHOICE``, with the usage the
        server reported, which the run is charged (the engine fails it: ``model:empty``). langchain failed it with
        an IndexError, and its tokens were never counted."""
        empty = {"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": None}
        result = super()._create_chat_result({**answer, "choices": [empty]}, generation_info)
        result.generations[0].message.response_metadata[NO_CHOICE] = True
        return result


class PlatformChatBedrockConverse(_RetriedByKind, ChatBedrockConverse):  # type: ignore[misc]
    retry_policy: ModelRetryPolicy = Field(default_factory=ModelRetryPolicy)
    retry_sent_requests: bool = True
    default_tool_choice: str | None = None
    first_turn_tool_choice: str | None = None
    check_cancelled: Callable[[], None] | None = Field(default=None, exclude=True)
    on_unanswered_call: Callable[[ModelFailureKind], None] | None = Field(default=None, exclude=True)

    def _generate(self, *args: Any, **kwargs: Any) -> ChatResult:
        # The client's Converse hook (``_mark_converse_not_objects``) marked the calls whose input is no object, and
        # kept the reply's usage aside: a reply langchain-aws cannot read (a content block it does not know) fails
        # after its tokens were spent, and its failure carries them.
        usage: dict[str, Any] = {}
        token = _CONVERSE_USAGE.set(usage)
        try:
            result = super()._generate(*args, **kwargs)
        except MUST_PROPAGATE:
            raise
        except Exception as exc:
            if not usage:
                raise
            raise ModelReplyUnreadable(_converse_usage(usage)) from exc
        finally:
            _CONVERSE_USAGE.reset(token)
        return _with_refused_not_objects(result)

    def bind_tools(self, tools: Sequence[Any], *, tool_choice: Any = None, **kwargs: Any) -> Any:
        # Converse's toolChoice is auto, any or a tool: langchain-aws would send "none" as a tool named "none",
        # which every call refuses. A model that may call no tool is given none (a choice made for this turn, a
        # forced first tool, still binds them).
        if (tool_choice if tool_choice is not None else self.default_tool_choice) == "none":
            return self
        return super().bind_tools(tools, tool_choice=tool_choice, **kwargs)


def _openai_usage(usage: dict[str, Any]) -> UsageMetadata:
    """A Chat Completions reply's ``usage`` as langchain-openai reads it."""
    from langchain_openai.chat_models.base import _create_usage_metadata

    return _create_usage_metadata(usage)


def _converse_usage(usage: dict[str, Any]) -> UsageMetadata:
    """A Converse reply's ``usage`` as langchain-aws reads it (its cache reads and writes counted as input)."""
    from langchain_aws.chat_models.bedrock_converse import _extract_usage_metadata

    return _extract_usage_metadata({"usage": usage})


FORCING_NOT = (None, "auto", "none")


def _split_tool_choice(given: str | dict[str, Any] | None) -> dict[str, Any]:
    """``model_params["tool_choice"]`` as the model's every-turn default and its first-turn-only forced choice,
    each as a word (``tool_choice_name``: an object form is read as the choice it names). Raises ValueError for
    an object that names no tool."""
    try:
        choice = tool_choice_name(given)
    except ValueError:
        raise ValueError(tool_choice_forms()) from None
    if choice in FORCING_NOT:
        return {"default_tool_choice": choice, "first_turn_tool_choice": None}
    return {"default_tool_choice": None, "first_turn_tool_choice": choice}


def bedrock_runtime_client(*, region_name: str | None, timeout_s: float = 60.0) -> Any:
    """The ``bedrock-runtime`` client, with credentials from boto3's standard chain (env, profile, role). Its own
    retries are off: the agent's retry policy retries by kind."""
    import boto3
    from botocore.config import Config

    config = Config(retries={"total_max_attempts": 1, "mode": "standard"}, read_timeout=timeout_s, connect_timeout=10)
    return boto3.client("bedrock-runtime", region_name=region_name, config=config)


@functools.cache
def _openai_http_clients() -> tuple[Any, Any]:
    """The OpenAI SDK's own HTTP clients (its default timeout and connection limits) that do not follow redirects,
    one pair per process, shared by every model as langchain shares its default ones (their connections are
    reused across runs). A redirect is answered as a failure: followed, the model's key and the conversation went
    to an address the base URL policy never saw. They keep no cookies: shared by every agent's key, a gateway's
    session cookie set for one agent's requests went with the next agent's (identified, limited or billed as the
    first)."""
    return (
        openai.DefaultHttpxClient(
            follow_redirects=False, cookies=_no_cookies(), event_hooks={"response": [_note_content_type]}
        ),
        openai.DefaultAsyncHttpxClient(follow_redirects=False, cookies=_no_cookies()),
    )


# The content type of the latest answer a model server gave a call in this context (the sync client's hook): the
# OpenAI SDK hands a reply that is no JSON over as its bare text, and ``ModelReplyNotJson`` says what it was.
_REPLY_CONTENT_TYPE: ContextVar[str] = ContextVar("reply_content_type", default="")


def _note_content_type(response: Any) -> None:
    _REPLY_CONTENT_TYPE.set(str(response.headers.get("content-type", "")))


def _no_cookies() -> http.cookiejar.CookieJar:
    """A cookie jar that takes none (its policy allows no domain)."""
    return http.cookiejar.CookieJar(policy=http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))


def build_provider_model(
    *,
    provider: str,
    model_id: str,
    params: dict[str, Any],
    api_key: str | None,
    retry_sent_requests: bool = True,
    check_cancelled: Callable[[], None] | None = None,
    on_unanswered_call: Callable[[ModelFailureKind], None] | None = None,
) -> Any:
    """The chat model of a network provider. Raises ``ValueError`` for parameters it cannot use (the engine fails
    the run with ``model:unavailable``). ``retry_sent_requests=False`` (a budgeted run): a connection failure is
    retried only where the request never reached the provider. ``check_cancelled``: the run's check, made before
    each retry of a failed call: a run cancelled, out of time or taken over sends no call again.
    ``on_unanswered_call``: told of each attempt that timed out or was cut after its request was (or may have been)
    sent (``unanswered_after_sending``), with its kind."""
    from pydantic import ValidationError

    try:
        parsed = stored_model_params(params)
    except ValidationError as exc:
        raise ValueError(f"model parameters are not valid: {exc.errors()[0].get('msg', '')}") from None
    options: dict[str, Any] = {
        k: v for k, v in {"temperature": parsed.temperature, "max_tokens": parsed.max_tokens}.items() if v is not None
    }
    if provider == "openai_compatible":
        if not parsed.base_url:
            raise ValueError("the openai_compatible provider needs model_params.base_url")
        # Again where the model is built: a stored version (an import, one published before the policy changed)
        # must not send the model's key to an address the policy refuses now.
        from mcpregistry.binding_policy import url_problem

        if problem := url_problem(parsed.base_url, settings.PLATFORM_MODEL_ALLOW_PRIVATE_URLS, target="model"):
            raise ValueError(f"model_params.base_url: {problem}")
        if not model_id:
            raise ValueError("the openai_compatible provider needs a model id")
        sync_client, async_client = _openai_http_clients()
        return PlatformChatOpenAI(
            model=model_id,
            base_url=parsed.base_url,
            # A local server (vLLM, Ollama) may need no key; the client still wants a value.
            api_key=api_key or "not-needed",  # type: ignore[arg-type]
            timeout=parsed.timeout_s,
            max_retries=0,
            streaming=parsed.stream,
            stream_usage=True,
            top_p=parsed.top_p,
            http_client=sync_client,
            http_async_client=async_client,
            retry_policy=parsed.retry,
            retry_sent_requests=retry_sent_requests,
            check_cancelled=check_cancelled,
            on_unanswered_call=on_unanswered_call,
            **_split_tool_choice(parsed.tool_choice),
            **options,
        )
    if provider == "bedrock":
        if parsed.top_p is not None:
            options["top_p"] = parsed.top_p
        guardrail = None
        if parsed.guardrail is not None:
            guardrail = {
                "guardrailIdentifier": parsed.guardrail.id,
                "guardrailVersion": parsed.guardrail.version,
                "trace": parsed.guardrail.trace,
            }
        region = parsed.region_name or None
        try:
            client = bedrock_runtime_client(region_name=region, timeout_s=parsed.timeout_s)
        except BotoCoreError as exc:
            raise ValueError(_bedrock_client_problem(exc)) from exc
        client.meta.events.register(
            "after-call.bedrock-runtime.Converse", _mark_converse_not_objects, unique_id="platform-not-objects"
        )
        return PlatformChatBedrockConverse(
            model=model_id,
            region_name=region,
            client=client,
            guardrails=guardrail,
            retry_policy=parsed.retry,
            retry_sent_requests=retry_sent_requests,
            check_cancelled=check_cancelled,
            on_unanswered_call=on_unanswered_call,
            **_split_tool_choice(parsed.tool_choice),
            **options,
        )
    raise ValueError(f"unknown model provider {provider!r}")


def _bedrock_client_problem(exc: BotoCoreError) -> str:
    """Why the worker could not make the Bedrock client (no region, a named AWS profile it does not have...)."""
    from botocore.exceptions import NoRegionError

    if isinstance(exc, NoRegionError):
        return _(
            "The Bedrock model has no AWS region: set model_params.region_name (e.g. us-east-1) on the agent, or "
            "AWS_REGION in the worker's environment."
        )
    return _("The Bedrock client could not be made on the worker: %(error)s") % {"error": _detail(exc)}


def guardrail_intervention(response_metadata: dict[str, Any]) -> dict[str, Any] | None:
    """A Bedrock Guardrail's intervention in one model turn (``stopReason`` ``guardrail_intervened``, with the
    guardrail's trace when it was enabled), or None."""
    if response_metadata.get("stopReason") != "guardrail_intervened":
        return None
    found: dict[str, Any] = {"stop_reason": "guardrail_intervened"}
    trace = response_metadata.get("trace")
    if isinstance(trace, dict) and trace.get("guardrail"):
        found["trace"] = trace["guardrail"]
    return found


# The stop reasons (Converse's ``stopReason``, Chat Completions' ``finish_reason``) of a turn that is no finished
# answer or call, with the reason code its run fails with: none of its calls is sent, its text is no answer. Cut off
# at the token limit, or where the model's context window was full (raising ``max_tokens`` does not help there);
# stopped by the provider's content filter; or written malformed, as the provider read it. Converse's other stop
# reasons end a turn as the model meant to (``end_turn``, ``tool_use``, ``stop_sequence``) or with the guardrail's
# own message, which its admin wrote as the answer (``guardrail_intervened``, recorded in the trace).
UNFINISHED_TURN_CODES: dict[str, str] = {
    "max_tokens": "model:max_tokens",
    "length": "model:max_tokens",
    "model_context_window_exceeded": "model:context_window",
    "content_filtered": "model:content_filter",
    "content_filter": "model:content_filter",
    "malformed_model_output": "model:malformed",
    "malformed_tool_use": "model:malformed",
}


# Marks the empty turn made of a reply that held no choice (``PlatformChatOpenAI``): what the run's failure says.
NO_CHOICE = "platform_no_choice"


def answered_without_choice(response_metadata: dict[str, Any]) -> bool:
    """Whether a model turn stands for a reply that held no choice (``"choices": []``)."""
    return bool(response_metadata.get(NO_CHOICE))


def stop_reason(response_metadata: dict[str, Any]) -> str | None:
    """Why the model stopped its turn, as its provider said: Converse's ``stopReason`` (``end_turn``, ``tool_use``,
    ``max_tokens``, ``guardrail_intervened``...) or Chat Completions' ``finish_reason`` (``stop``, ``tool_calls``,
    ``length``, ``content_filter``...); None where it said nothing (the scripted and offline models)."""
    for key in ("stopReason", "finish_reason"):
        value = response_metadata.get(key)
        if isinstance(value, str) and value:
            return value
    return None
