"""The audit record: one append-only event per deterministic call, tool call attempt or admin change."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from agent_platform.json import UnicodeJSONEncoder


class AuditEventQuerySet(models.QuerySet["AuditEvent"]):
    def update(self, **kwargs: object) -> int:
        raise PermissionError("audit events are append-only")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise PermissionError("audit events are append-only")


class AuditEvent(models.Model):
    """What was called, with what (masked), by whom, and how it ended. Never updated or deleted."""

    class Source(models.TextChoices):
        DETERMINISTIC = "deterministic", _("deterministic rule")
        AGENT = "agent", _("agent (model)")
        FLOW = "flow", _("flow node")
        ADMIN = "admin", _("admin")

    run = models.ForeignKey("agents.Run", on_delete=models.PROTECT, null=True, blank=True, related_name="audit_events")
    source = models.CharField(_("source"), max_length=20, choices=Source.choices, db_index=True)
    action = models.CharField(_("action"), max_length=100, default="tool.call")
    mcp_id = models.CharField(_("server"), max_length=64, blank=True, db_index=True)
    tool = models.CharField(_("tool"), max_length=200, blank=True, db_index=True)
    call_id = models.CharField(_("call id"), max_length=100, blank=True)
    args = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("arguments (masked)"), default=dict, blank=True)
    result = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("result (masked)"), null=True, blank=True)
    ok = models.BooleanField(_("ok"), default=True)
    reason = models.CharField(_("reason code"), max_length=200, blank=True, db_index=True)
    attempt = models.PositiveIntegerField(_("attempt"), default=1)
    latency_ms = models.FloatField(_("latency (ms)"), null=True, blank=True)
    actor = models.CharField(_("actor"), max_length=200, blank=True)
    created_at = models.DateTimeField(_("time"), auto_now_add=True, db_index=True)

    objects = AuditEventQuerySet.as_manager()

    class Meta:
        verbose_name = _("audit event")
        verbose_name_plural = _("audit events")
        ordering = ["id"]

    def __str__(self) -> str:
        return f"#{self.pk} {self.source} {self.mcp_id}.{self.tool}"

    def save(self, *args: object, **kwargs: object) -> None:
        if self.pk is not None:
            raise PermissionError("audit events are append-only")
        super().save(*args, **kwargs)  # type: ignore[arg-type]

    def delete(self, *args: object, **kwargs: object) -> tuple[int, dict[str, int]]:
        raise PermissionError("audit events are append-only")
