"""How far the audit chain trails the events written: the one function ``/metrics`` asks
(``platform_audit_chain_lag_seconds``, ``platform_audit_chain_pending_events``). With deferred chaining
(``AUDIT_CHAIN_MODE``, PostgreSQL's default) events wait in ``AuditPendingEvent`` until the single chainer links
them (``audit.services.chain_lag``); inline, every event is chained in the transaction that writes it."""

from __future__ import annotations

from audit.services import ChainLag, chain_lag


def audit_chain_lag() -> ChainLag:
    """The events written but not chained yet: how many, and the oldest one's age in seconds (0 when none)."""
    return chain_lag()


def audit_chain_lag_s() -> float:
    """Seconds since the oldest event written but not yet chained, or 0.0 when every event is chained."""
    return chain_lag().oldest_age_s
