"""The audit record: one append-only event per deterministic call, tool call attempt or admin change.

Events form a hash chain (``audit/chain.py``): each carries a gap-free ``seq``, the previous event's hash and
its own, and a MAC of its hash under a key kept outside the database (``audit/chain_keys.py``). The chain's head
(last seq, hash and its MAC) is kept outside the events table in :class:`AuditChainHead`, and what was archived
is recorded in :class:`AuditCheckpoint` (MAC'd too). Only ``audit.services`` and ``audit.archive`` write them.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from agent_platform.json import UnicodeJSONEncoder
from audit.chain import GENESIS_HASH
from audit.change_guard import NotConfiguration


class AuditEventQuerySet(models.QuerySet["AuditEvent"]):
    def update(self, **kwargs: object) -> int:
        raise PermissionError("audit events are append-only")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise PermissionError("audit events are append-only")


class AuditEvent(models.Model):
    """What was called, with what (masked), by whom, and how it ended. Never updated or deleted.

    Written only by ``audit.services.audit_event_record``, which assigns ``seq``, ``prev_hash`` and ``hash``.
    On PostgreSQL a trigger refuses UPDATE, DELETE and TRUNCATE of the table, on SQLite triggers refuse UPDATE
    and DELETE (only ``archive_audit`` may delete, inside its own transaction). ``seq``, not ``id``, is the
    event's place in the chain; ``mac`` (``<key id>:<hex>``) authenticates ``hash``.
    """

    class Source(models.TextChoices):
        DETERMINISTIC = "deterministic", _("deterministic rule")
        AGENT = "agent", _("agent (model)")
        FLOW = "flow", _("flow node")
        ADMIN = "admin", _("admin")
        # Acts of an API caller that are not tool calls (feedback on a run, cancelling it): the API key is the actor.
        API = "api", _("API caller")
        # Tool calls of runs that are not live traffic (agents.Run.purpose): kept apart from production metrics.
        EVAL = "eval", _("eval run")
        SHADOW = "shadow", _("shadow run")

    # The run by its id, not a foreign key: audit events outlive runs (retention), and the audit core names no
    # model of the apps that write to it.
    run_id = models.UUIDField(_("run"), null=True, blank=True, db_index=True)
    source = models.CharField(_("source"), max_length=20, choices=Source.choices)
    action = models.CharField(_("action"), max_length=100, default="tool.call")
    mcp_id = models.CharField(_("server"), max_length=64, blank=True)
    tool = models.CharField(_("tool"), max_length=200, blank=True)
    call_id = models.CharField(_("call id"), max_length=100, blank=True)
    args = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("arguments (masked)"), default=dict, blank=True)
    result = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("result (masked)"), null=True, blank=True)
    ok = models.BooleanField(_("ok"), default=True)
    reason = models.CharField(_("reason code"), max_length=200, blank=True, db_index=True)
    attempt = models.PositiveIntegerField(_("attempt"), default=1)
    latency_ms = models.FloatField(_("latency (ms)"), null=True, blank=True)
    actor = models.CharField(_("actor"), max_length=200, blank=True)
    # Set by the service while it holds the chain head, so that it is part of the hash (auto_now_add would
    # overwrite it at insert time).
    created_at = models.DateTimeField(_("time"), default=timezone.now, editable=False, db_index=True)
    seq = models.BigIntegerField(_("sequence number"), unique=True, editable=False)
    prev_hash = models.CharField(_("previous hash"), max_length=64, editable=False)
    hash = models.CharField(_("hash"), max_length=64, editable=False)
    mac = models.CharField(_("MAC"), max_length=80, editable=False, default="")
    # The one-time nonce of the pending row this event was chained from (deferred chaining; null inline and before
    # nonces existed): covered by the hash where set, unique (below), so a pending row is chained once at most.
    nonce = models.CharField(_("nonce"), max_length=32, null=True, blank=True, editable=False)

    objects = AuditEventQuerySet.as_manager()

    change_audit = NotConfiguration("the audit record itself: append-only, written only by audit.services")

    class Meta:
        verbose_name = _("audit event")
        verbose_name_plural = _("audit events")
        ordering = ["id"]
        # Plain indexes for the auditors' filters by equality. Not ``db_index``, which on PostgreSQL adds a second
        # (``varchar_pattern_ops``) index for prefix matches that no query of these fields makes: one index less
        # to write per event (migration 0014). ``reason`` keeps both (``auditor.selectors`` filters by prefix).
        # ``tool`` with ``action`` and ``action`` alone also answer the list's tool and action filters' choices
        # (distinct values) from the index, not the table (migration 0017).
        indexes = [
            models.Index(fields=["source"], name="audit_event_source_idx"),
            models.Index(fields=["mcp_id"], name="audit_event_mcp_id_idx"),
            models.Index(fields=["tool", "action"], name="audit_event_tool_action_idx"),
            models.Index(fields=["action"], name="audit_event_action_idx"),
        ]
        # A partial unique index: only events that have a nonce are in it (none inline), so inline appends write
        # no extra index entry; SQLite makes it without remaking the append-only table (migration 0015).
        constraints = [
            models.UniqueConstraint(
                fields=["nonce"], condition=models.Q(nonce__isnull=False), name="audit_event_nonce_unique"
            ),
        ]

    def __str__(self) -> str:
        # The event's number, what happened and to which tool when there is one (a change of configuration
        # names no tool: "#1 config.agent.create", not "#1 admin .").
        tool = f"{self.mcp_id}.{self.tool}" if self.mcp_id and self.tool else (self.tool or self.mcp_id)
        return f"#{self.pk} {self.action}" + (f" · {tool}" if tool else "")

    def save(self, *args: object, **kwargs: object) -> None:
        if self.pk is not None:
            raise PermissionError("audit events are append-only")
        super().save(*args, **kwargs)  # type: ignore[arg-type]

    def delete(self, *args: object, **kwargs: object) -> tuple[int, dict[str, int]]:
        raise PermissionError("audit events are append-only")


class ConfigGeneration(models.Model):
    """The configuration's generation: one row (id 1) whose token every write of a configuration model replaces,
    in the same transaction (``audit.change_guard.config_generation_bump``). What a worker caches of the
    configuration is good while the token is the one it was read under."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1, editable=False)
    token = models.CharField(max_length=32)

    change_audit = NotConfiguration("a token that moves with every configuration change; no configuration itself")

    class Meta:
        verbose_name = _("configuration generation")
        verbose_name_plural = _("configuration generations")

    def __str__(self) -> str:
        return self.token


class AuditChainHead(models.Model):
    """The chain's last ``seq`` and ``hash``: one row (id 1), kept apart from the events it vouches for.

    Created by the migrations (seq 0, the genesis hash) and never again: an append finds it missing and refuses
    (``audit.services.AuditChainHeadMissing``). Every append locks it (``SELECT ... FOR UPDATE`` on PostgreSQL;
    SQLite's ``BEGIN IMMEDIATE`` serializes writers already) and moves it forward, with a fresh ``mac``, in the
    same transaction as the event's insert, so seq numbers are gap-free and a removed tail or a forged extra
    event shows when ``verify_audit`` compares the two. Triggers refuse to delete it or to move it anywhere but
    forward onto an event that exists with that hash.
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1, editable=False)
    seq = models.BigIntegerField(_("last sequence number"), default=0)
    hash = models.CharField(_("last hash"), max_length=64, default=GENESIS_HASH)
    mac = models.CharField(_("MAC"), max_length=80, default="")

    change_audit = NotConfiguration("the chain's head, moved by every append")

    class Meta:
        verbose_name = _("audit chain head")
        verbose_name_plural = _("audit chain head")

    def __str__(self) -> str:
        return f"seq {self.seq} {self.hash}"


class AuditPendingEvent(models.Model):
    """An event appended but not chained yet (the deferred chain, ``audit.services``): what the writer stored,
    with ``mac``, a MAC of its content hash (:func:`audit.chain.pending_hash`) under the chain key.

    Writers only insert here (no lock on anything shared); the single chainer (:func:`audit.services.
    audit_chain_pending`) moves rows in ``id`` order into :class:`AuditEvent`, with their ``seq``, ``prev_hash``,
    ``hash`` and event MAC, and deletes them in the same short transaction. A row whose MAC does not verify is
    never chained (it was written without the key) and ``verify_audit`` names it. ``nonce``: 32 random hex digits
    drawn by the writer, covered by ``mac`` and copied into the event, whose nonce is unique: a copy of a row put
    back after it was chained (from a backup, a replica) is never chained again. Rows waiting here are the
    chain's lag (:func:`audit.services.chain_lag`).
    """

    run_id = models.UUIDField(null=True, blank=True)
    source = models.CharField(max_length=20)
    action = models.CharField(max_length=100)
    mcp_id = models.CharField(max_length=64, blank=True)
    tool = models.CharField(max_length=200, blank=True)
    call_id = models.CharField(max_length=100, blank=True)
    args = models.JSONField(encoder=UnicodeJSONEncoder, default=dict, blank=True)
    result = models.JSONField(encoder=UnicodeJSONEncoder, null=True, blank=True)
    ok = models.BooleanField(default=True)
    reason = models.CharField(max_length=200, blank=True)
    attempt = models.PositiveIntegerField(default=1)
    latency_ms = models.FloatField(null=True, blank=True)
    actor = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    mac = models.CharField(max_length=80, default="")
    nonce = models.CharField(max_length=32, default="")

    change_audit = NotConfiguration("events on their way into the audit chain, written only by audit.services")

    class Meta:
        verbose_name = _("pending audit event")
        verbose_name_plural = _("pending audit events")
        ordering = ["id"]

    def __str__(self) -> str:
        return f"pending #{self.pk} {self.source} {self.mcp_id}.{self.tool}"


class AuditCheckpoint(models.Model):
    """Where an archive ended: events up to ``seq`` went to ``file_name`` and were deleted from the table.

    The first event left in the table links to the latest checkpoint's ``hash``; ``verify_audit`` starts there,
    after checking each checkpoint's ``mac`` and its archive file.

    ``tool_calls`` is what ``/metrics`` counted of every event archived up to here (``audit.archive``'s tool-call
    figures, cumulative: the latest checkpoint's holds all), so that its counters never go down when events
    leave the table. Figures, not evidence: outside the MAC (the events themselves are in the archive files).
    """

    seq = models.BigIntegerField(_("last archived sequence number"), unique=True)
    hash = models.CharField(_("hash of the last archived event"), max_length=64)
    archived_at = models.DateTimeField(_("archived at"), default=timezone.now)
    file_name = models.CharField(_("archive file"), max_length=1000)
    count = models.PositiveIntegerField(_("events archived"))
    mac = models.CharField(_("MAC"), max_length=80, default="")
    tool_calls = models.JSONField(_("tool calls archived so far (metrics)"), null=True, blank=True)

    change_audit = NotConfiguration("written by archive_audit, which is itself recorded")

    class Meta:
        verbose_name = _("audit checkpoint")
        verbose_name_plural = _("audit checkpoints")
        ordering = ["seq"]

    def __str__(self) -> str:
        return f"seq {self.seq} {self.hash} ({self.file_name})"
