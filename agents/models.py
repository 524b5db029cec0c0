"""Agents, their deterministic rules, runs and the API keys that submit them."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import QuerySet
from django.utils.translation import gettext_lazy as _

from agent_platform.json import UnicodeJSONEncoder
from audit.change_guard import AuditedModel, ChangeAudit, NotConfiguration
from audit.models import AuditEvent
from mcpregistry.crypto import EncryptedJSONField
from mcpregistry.models import McpServer

DEFAULT_DETERMINISTIC_INSTRUCTION = (
    '제공된 "확정 호출 결과"가 있으면 그 내용을 우선 사용하여 답변하고, 추가 도구 호출은 필요한 경우에만 하세요.'
)


def scripted_model_allowed() -> bool:
    """Whether the ``scripted`` model provider may be chosen and run here (tests, ``DEBUG``, or the setting)."""
    return bool(getattr(settings, "PLATFORM_ALLOW_SCRIPTED_MODEL", False))


FLOW_TEMPLATES = (
    "agents.flows.sequential.build_graph",
    "agents.flows.parallel.build_graph",
    "agents.flows.conditional.build_graph",
    "agents.flows.http_pipeline.build_graph",
)


def registered_flow_graphs() -> list[str]:
    """The flow graphs an admin may choose: the shipped templates and ``PLATFORM_FLOW_GRAPHS`` (dotted paths)."""
    extra = getattr(settings, "PLATFORM_FLOW_GRAPHS", [])
    return list(dict.fromkeys([*FLOW_TEMPLATES, *extra]))


class Agent(AuditedModel):
    """An agent: a system prompt, a model, the MCP servers whose tools it may call, and its rules."""

    class Provider(models.TextChoices):
        OFFLINE = "offline", _("offline (answers from deterministic results, no network)")
        BEDROCK = "bedrock", _("Amazon Bedrock (ChatBedrockConverse)")
        SCRIPTED = "scripted", _("scripted (replays model turns from model parameters; for tests and demos)")

    class Mode(models.TextChoices):
        REACT = "react", _("ReAct loop")
        FLOW = "flow", _("Flow graph")

    slug = models.SlugField(_("slug"), max_length=64, unique=True)
    name = models.CharField(_("name"), max_length=200)
    enabled = models.BooleanField(_("enabled"), default=True)
    system_prompt = models.TextField(_("system prompt"), blank=True)
    deterministic_instruction = models.TextField(
        _("instruction for deterministic results"),
        default=DEFAULT_DETERMINISTIC_INSTRUCTION,
        help_text=_("Added to the system message together with the deterministic results."),
    )
    answer_template = models.TextField(
        _("offline answer template"),
        blank=True,
        help_text=_(
            "Used by the offline provider. Placeholders: {query}, {results} (each deterministic result, one per "
            "line). Empty: the rules' own answer templates, else a plain list of results."
        ),
    )
    model_provider = models.CharField(
        _("model provider"), max_length=20, choices=Provider.choices, default=Provider.OFFLINE
    )
    model_id = models.CharField(_("model id"), max_length=200, blank=True)
    model_params = models.JSONField(
        encoder=UnicodeJSONEncoder, verbose_name=_("model parameters"), default=dict, blank=True
    )
    servers = models.ManyToManyField(McpServer, blank=True, related_name="agents", verbose_name=_("MCP servers"))
    max_iterations = models.PositiveIntegerField(_("max iterations"), default=6)
    time_limit_s = models.PositiveIntegerField(
        _("time limit (seconds)"), default=300, help_text=_("A run still going after this long is stopped and fails.")
    )
    answer_from_deterministic = models.BooleanField(
        _("answer from deterministic results"),
        default=False,
        help_text=_(
            "When every matched deterministic call succeeded, compose the answer from them (the answer templates) "
            "without a model round trip."
        ),
    )
    caller_approves_model_writes = models.BooleanField(
        _("the API caller may approve the model's write calls"),
        default=False,
        help_text=_(
            "Off: a write call the model asked for waits for an admin or a member of the reviewer group, because "
            "text a tool returned may have steered the model. A write made by a deterministic rule or a flow (an "
            "admin configured it) may always be approved by the caller."
        ),
    )
    language = models.CharField(
        _("language"),
        max_length=10,
        default="ko",
        help_text=_("Language of the short texts an end user reads (a failed call, no rule matched), e.g. ko, en."),
    )
    no_match_answer = models.TextField(
        _("answer when no rule matched"),
        blank=True,
        help_text=_(
            "Offline provider: the answer when no deterministic rule matched (say what this agent can answer). "
            "Empty: a generic text in the agent's language."
        ),
    )
    mode = models.CharField(_("mode"), max_length=10, choices=Mode.choices, default=Mode.REACT)
    flow_graph = models.CharField(
        _("flow graph"),
        max_length=300,
        blank=True,
        help_text=_("Flow mode: dotted path of the function that builds the LangGraph graph."),
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    change_audit = ChangeAudit(entity="agent", operational_fields=frozenset({"updated_at"}))

    class Meta:
        verbose_name = _("agent")
        verbose_name_plural = _("agents")
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug

    def clean(self) -> None:
        """The scripted provider replays canned model turns: offered only where ``PLATFORM_ALLOW_SCRIPTED_MODEL``
        (tests, ``DEBUG``) allows it, never to admins in production."""
        from django.core.exceptions import ValidationError

        from agents.flow_runner import load_flow_builder
        from agents.tools import CodeRuleError

        if self.mode == self.Mode.FLOW:
            if not self.flow_graph:
                raise ValidationError(
                    {
                        "flow_graph": _("Flow mode needs a flow graph; the registered ones are: %(graphs)s")
                        % {"graphs": ", ".join(registered_flow_graphs())}
                    }
                )
            try:
                load_flow_builder(self.flow_graph)
            except CodeRuleError as exc:
                raise ValidationError({"flow_graph": str(exc)}) from None
        if self.model_provider == self.Provider.SCRIPTED and not scripted_model_allowed():
            raise ValidationError(
                {
                    "model_provider": _(
                        "The scripted provider is for tests and demos; set PLATFORM_ALLOW_SCRIPTED_MODEL=1 (or "
                        "DEBUG) to use it."
                    )
                }
            )


class DeterministicRule(AuditedModel):
    """A routing rule evaluated before the model: when its conditions hold, its tool is called.

    ``when`` holds the conditions (all must hold): ``all_keywords`` and ``any_keywords`` (lists of strings)
    and ``regex`` (named groups usable in ``params`` as ``{match.NAME}``). ``params`` is a JSON object whose
    string values may use ``{query}``, ``{context.KEY}``, ``{data.PATH}`` and ``{match.NAME}``.
    """

    agent = models.ForeignKey(
        Agent,
        on_delete=models.CASCADE,
        related_name="rules",
        null=True,
        blank=True,
        verbose_name=_("agent"),
        help_text=_("Empty: the rule applies to every agent bound to its server."),
    )
    name = models.CharField(_("name"), max_length=200)
    order = models.IntegerField(_("order"), default=100)
    enabled = models.BooleanField(_("enabled"), default=True)
    server = models.ForeignKey(
        McpServer,
        on_delete=models.PROTECT,
        related_name="rules",
        verbose_name=_("server"),
        null=True,
        blank=True,
        help_text=_("Empty for a code rule: its decorator names the server."),
    )
    tool_name = models.CharField(_("tool"), max_length=200, blank=True)
    code = models.CharField(
        _("code rule"),
        max_length=300,
        blank=True,
        help_text=_("Dotted path of a @deterministic_tool function; then conditions and parameters are its own."),
    )
    when = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("conditions"), default=dict, blank=True)
    params = models.JSONField(
        encoder=UnicodeJSONEncoder, verbose_name=_("parameters template"), default=dict, blank=True
    )
    answer_template = models.TextField(
        _("offline answer template"),
        blank=True,
        help_text=_(
            "How the offline provider phrases this rule's result: {query}, {match.NAME}, {params.NAME}, "
            "{result} (the tool's text) and {result.KEY} (a key of a JSON result)."
        ),
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    change_audit = ChangeAudit(entity="deterministic_rule", operational_fields=frozenset({"updated_at"}))

    class Meta:
        verbose_name = _("deterministic rule")
        verbose_name_plural = _("deterministic rules")
        ordering = ["order", "id"]

    def __str__(self) -> str:
        return self.name

    def audit_target(self) -> tuple[str, str]:
        return (self.server.mcp_id if self.server_id else ""), self.tool_name

    def clean(self) -> None:
        """A code rule must be importable, decorated, and name a server bound to its agent; an admin rule needs a
        known tool on its server, valid conditions, and a params template that fits the tool's contract."""
        from django.core.exceptions import ValidationError
        from pydantic import ValidationError as PydanticValidationError

        from agents.deterministic import WhenSpec, template_problems
        from agents.tools import CodeRuleError, load_code_rule
        from mcpregistry.contracts import argument_constraints, spec_problems

        errors: dict[str, list[str]] = {}
        if self.code:
            try:
                _fn, mcp_id = load_code_rule(self.code)
            except CodeRuleError as exc:
                raise ValidationError({"code": [str(exc)]}) from None
            if self.agent_id and not self.agent.servers.filter(mcp_id=mcp_id).exists():
                errors["code"] = [
                    str(_("The rule is for MCP '%(id)s', which this agent does not bind.") % {"id": mcp_id})
                ]
        else:
            if self.server_id is None:
                errors["server"] = [str(_("Choose the server (or give a code rule)."))]
            if not self.tool_name:
                errors["tool_name"] = [str(_("Name the tool to call (or give a code rule)."))]
            try:
                WhenSpec.model_validate(self.when or {})
            except PydanticValidationError as exc:
                errors["when"] = spec_problems(exc, WhenSpec)
            if self.server_id and self.tool_name:
                tool = self.server.tools.filter(name=self.tool_name).select_related("contract").first()
                if tool is None and self.server.tools.filter(discovered_at__isnull=False).exists():
                    names = sorted(self.server.tools.filter(available=True).values_list("name", flat=True))
                    errors["tool_name"] = [
                        str(
                            _("'%(tool)s' is not a tool of this server; its tools are: %(names)s")
                            % {"tool": self.tool_name, "names": ", ".join(names) or "—"}
                        )
                    ]
                elif tool is not None:
                    contract = getattr(tool, "contract", None)
                    constraints = contract.args if contract is not None else argument_constraints(tool.input_schema)
                    refuse = contract is None or contract.unknown_args == "refuse"
                    problems = template_problems(constraints or {}, self.params or {}, refuse_unknown=refuse)
                    if problems:
                        errors["params"] = problems
        if errors:
            raise ValidationError(errors)


class ApiKey(AuditedModel):
    """A key an API caller presents as ``Authorization: Bearer <key>``. Only its SHA-256 digest is stored."""

    name = models.CharField(_("name"), max_length=200)
    prefix = models.CharField(_("prefix"), max_length=16, db_index=True, editable=False)
    digest = models.CharField(_("digest"), max_length=64, unique=True, editable=False)
    agents = models.ManyToManyField(
        Agent, blank=True, related_name="api_keys", verbose_name=_("agents"), help_text=_("Empty: every agent.")
    )
    rate = models.CharField(
        _("rate limit"),
        max_length=20,
        blank=True,
        help_text=_("Requests per period for this key, e.g. 60/min or 1000/hour. Empty: the platform default."),
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(_("last used"), null=True, blank=True)
    revoked_at = models.DateTimeField(_("revoked"), null=True, blank=True)

    change_audit = ChangeAudit(
        entity="api_key", operational_fields=frozenset({"last_used_at"}), unrecorded_fields=frozenset({"digest"})
    )

    class Meta:
        verbose_name = _("API key")
        verbose_name_plural = _("API keys")
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    def audit_actor_label(self) -> str:
        return f"api_key:{self.prefix}"

    # DRF asks these of request.user.
    @property
    def is_authenticated(self) -> bool:
        return self.revoked_at is None


class Run(models.Model):
    """One query to one agent, executed by a worker: its input, trace, outcome and timings."""

    class Status(models.TextChoices):
        QUEUED = "queued", _("queued")
        RUNNING = "running", _("running")
        SUCCEEDED = "succeeded", _("succeeded")
        FAILED = "failed", _("failed")
        AWAITING_APPROVAL = "awaiting_approval", _("awaiting approval")
        CANCELLED = "cancelled", _("cancelled")

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="runs", verbose_name=_("agent"))
    api_key = models.ForeignKey(
        ApiKey, on_delete=models.SET_NULL, null=True, blank=True, related_name="runs", verbose_name=_("API key")
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="runs"
    )
    query = models.TextField(_("query"))
    context = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("context"), default=dict, blank=True)
    a2a_data = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("A2A data"), default=list, blank=True)
    a2a_files = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("A2A files"), default=list, blank=True)
    status = models.CharField(_("status"), max_length=20, choices=Status.choices, default=Status.QUEUED, db_index=True)
    answer = models.TextField(_("answer"), blank=True)
    error_code = models.CharField(_("error code"), max_length=100, blank=True)
    error_message = models.TextField(_("error message"), blank=True)
    deterministic_results = models.JSONField(
        encoder=UnicodeJSONEncoder, verbose_name=_("deterministic results"), default=list, blank=True
    )
    messages = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("trace"), default=list, blank=True)
    timings = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("timings (ms)"), default=dict, blank=True)
    conversation = models.JSONField(
        encoder=UnicodeJSONEncoder,
        verbose_name=_("conversation (masked, for resuming)"),
        default=list,
        blank=True,
        editable=False,
    )
    token_usage = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("token usage"), default=dict, blank=True)
    tool_failures = models.PositiveIntegerField(
        _("tool failures"), default=0, help_text=_("Tool calls of the run that failed (deterministic and the model's).")
    )
    idempotency_key = models.CharField(_("idempotency key"), max_length=200, blank=True)
    request_digest = models.CharField(_("request digest"), max_length=64, blank=True, editable=False)
    delivery_count = models.PositiveIntegerField(_("deliveries"), default=0, editable=False)
    worker = models.CharField(_("worker"), max_length=200, blank=True, editable=False)
    heartbeat_at = models.DateTimeField(_("last heartbeat"), null=True, blank=True, editable=False)
    lease_expires_at = models.DateTimeField(_("lease expires"), null=True, blank=True, editable=False)
    created_at = models.DateTimeField(_("created"), auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(_("started"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished"), null=True, blank=True)

    change_audit = NotConfiguration(
        "a run is a caller's request and its outcome; its tool calls are audited as they happen"
    )

    class Meta:
        verbose_name = _("run")
        verbose_name_plural = _("runs")
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.agent.slug} {self.id}"

    @property
    def audit_events(self) -> QuerySet[AuditEvent]:
        """The run's audit events (they refer to it by id, and outlive it under retention)."""
        return AuditEvent.objects.filter(run_id=self.pk)

    @property
    def is_finished(self) -> bool:
        return self.status in {self.Status.SUCCEEDED, self.Status.FAILED, self.Status.CANCELLED}


class Approval(models.Model):
    """A person's decision on one write call: bound to a hash of the exact tool and arguments, single-use,
    expiring. Its life: pending → approved | rejected | expired; approved → executing → executed |
    outcome_unknown. ``outcome_unknown``: the call was sent and no answer came (a timeout, a dropped session, a
    worker that died mid-call); it may or may not have taken effect, and it is never sent again."""

    class Status(models.TextChoices):
        PENDING = "pending", _("pending")
        APPROVED = "approved", _("approved")
        REJECTED = "rejected", _("rejected")
        EXPIRED = "expired", _("expired")
        EXECUTING = "executing", _("executing")
        EXECUTED = "executed", _("executed")
        OUTCOME_UNKNOWN = "outcome_unknown", _("outcome unknown")

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="approvals", verbose_name=_("run"))
    mcp_id = models.CharField(_("server"), max_length=64)
    tool = models.CharField(_("tool"), max_length=200)
    args = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("arguments (masked)"), default=dict)
    # The exact arguments, encrypted: what an approved call is executed with (the stored conversation is masked).
    exact_args = EncryptedJSONField(_("exact arguments (encrypted)"), default=dict, blank=True, editable=False)
    call_hash = models.CharField(_("call hash"), max_length=64, db_index=True)
    call_id = models.CharField(_("call id"), max_length=100, blank=True)
    status = models.CharField(_("status"), max_length=20, choices=Status.choices, default=Status.PENDING, db_index=True)
    requested_by = models.CharField(_("requested by"), max_length=200, blank=True)
    decided_by = models.CharField(_("decided by"), max_length=200, blank=True)
    decided_at = models.DateTimeField(_("decided"), null=True, blank=True)
    reason = models.TextField(_("reason"), blank=True)
    expires_at = models.DateTimeField(_("expires"))
    result = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("result (masked)"), null=True, blank=True)
    created_at = models.DateTimeField(_("requested"), auto_now_add=True)

    change_audit = NotConfiguration(
        "decisions are audited by the approval services (requested, approved/rejected, executed)"
    )

    class Meta:
        verbose_name = _("approval")
        verbose_name_plural = _("approvals")
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.mcp_id}.{self.tool} ({self.status})"


class RunEvent(models.Model):
    """What a run did, as it happened, in order: what ``GET /api/v1/runs/{id}/events`` streams."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events", verbose_name=_("run"))
    seq = models.PositiveIntegerField(_("sequence"))
    kind = models.CharField(_("kind"), max_length=40)
    data = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("data (masked)"), default=dict)
    created_at = models.DateTimeField(_("time"), auto_now_add=True)

    change_audit = NotConfiguration("a run's progress stream, derived from the run")

    class Meta:
        verbose_name = _("run event")
        verbose_name_plural = _("run events")
        ordering = ["run", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="runevent_unique_run_seq")]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.kind}"
