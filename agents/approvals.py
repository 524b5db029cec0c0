"""Human approval of write calls: the gate's ``ApprovalPort`` for a run, and the decision service."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from datetime import timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone
from django.utils.translation import gettext as _

from agent_platform.errors import ApplicationError
from agent_platform.json import UnicodeJSONEncoder
from agents.config_cache import every_binding_secret, run_configuration
from agents.decision_reasons import ASKED_AGAIN_APPROVAL
from agents.dispatch import repaired_alone
from agents.models import Approval, Run
from agents.run_state import SECRET_UNREADABLE, approvals_unused, run_resume, run_row_lock
from agents.services import secret_unreadable_refusal
from audit.masking import mask_text, mask_value
from audit.services import audit_event_record
from mcpregistry.crypto import SecretDecryptionError, readable
from mcpregistry.gate_records import ApprovalState

logger = logging.getLogger(__name__)

UNREADABLE_ARGS_RESULT: dict[str, Any] = {"ok": False, "reason": SECRET_UNREADABLE, "value": None}
"""The recorded outcome of an approved call whose exact arguments cannot be decrypted: a failure, never sent."""


def _with_args(approvals: Iterable[Approval], masked_args: dict[str, Any]) -> Approval | None:
    """The first of ``approvals`` asked for these masked arguments (compared as the JSON column reads them back)."""
    stored_args = json.loads(json.dumps(masked_args, cls=UnicodeJSONEncoder))
    return next((approval for approval in approvals if approval.args == stored_args), None)


def _the_call_among(same_id: list[Approval], call_id: str, masked_args: dict[str, Any]) -> Approval | None:
    """Of the approvals asked for under ``call_id`` (oldest first), the call's: a model's call is known by its masked
    arguments too; a rule's or a flow's by its id alone (``RunApprovals._approval_of_call`` says why)."""
    if not same_id or not asked_by_the_model_call(call_id):
        return same_id[-1] if same_id else None
    return _with_args(same_id, masked_args)


def _exact_args(approval: Approval) -> dict[str, Any] | None:
    """The approval's exact arguments, or None: none stored, or stored with a key this process lacks. Only an
    approved call is sent with them, and such a one is never sent (``RunApprovals._unreadable_args_failure``); a
    pending, rejected, expired or finished call's outcome needs none of them."""
    if not readable(approval.exact_args):
        return None
    return approval.exact_args or None


class RunApprovals:
    """Approvals of one run's write calls, kept in the database so a resumed run (on any worker) sees them."""

    def __init__(self, *, run_id: Any, actor: str, secrets: list[str], none_yet: bool = False) -> None:
        self.run_id = run_id
        self.actor = actor
        self.secrets = secrets
        self.asked = False  # whether this pass asked for an approval (a call of its own may be left unused)
        self._used: set[Any] = set()  # the approvals this pass's calls stand for
        # The run's approvals, as ``asked_for`` compares them: read once, when the pass first needs them, and
        # joined by those this pass asks for (no one else asks for one of this run while it runs). ``none_yet``: the
        # run's first pass, which has none to read (the run's query budget counts that read).
        self._held: list[Approval] | None = [] if none_yet else None

    def request(
        self, *, mcp_id: str, tool: str, args: dict[str, Any], call_id: str, call_hash: str, approved_by: str = ""
    ) -> ApprovalState:
        self.asked = True
        masked_args = mask_value(args, secrets=self.secrets)
        approval = (
            self._approval_of_call(call_id, masked_args)
            if call_id
            else Approval.objects.filter(run_id=self.run_id, call_hash=call_hash, call_id="").first()
        )
        if approval is None and approved_by and call_id:
            # A sandbox's write is approved as it is asked for, under the model's call id: a pass made again (a
            # retry, a takeover, a redelivery) asks the model again, which names the same call anew. The same write
            # (tool and exact arguments) of this run that no call of this pass stands for yet is that call: found
            # executed, or executing (outcome unknown), never sent twice. (Asked for again within one pass, it is
            # another write.)
            approval = (
                Approval.objects.filter(run_id=self.run_id, call_hash=call_hash, decided_by=approved_by[:200])
                .exclude(pk__in=self._used)
                .order_by("created_at")
                .first()
            )
        if approval is None:
            approval = Approval.objects.create(
                run_id=self.run_id,
                mcp_id=mcp_id,
                tool=tool,
                args=masked_args,
                exact_args=args,
                call_hash=call_hash,
                call_id=call_id,
                requested_by=self.actor,
                expires_at=timezone.now() + timedelta(seconds=settings.PLATFORM_APPROVAL_TTL_S),
                **(
                    {"status": Approval.Status.APPROVED, "decided_by": approved_by[:200], "decided_at": timezone.now()}
                    if approved_by
                    else {}
                ),
            )
        elif approval.status == Approval.Status.PENDING and approval.expires_at <= timezone.now():
            with transaction.atomic():
                if Approval.objects.filter(pk=approval.pk, status=Approval.Status.PENDING).update(
                    status=Approval.Status.EXPIRED
                ):
                    approval_expiry_audit(approval, actor=self.actor)
            approval.refresh_from_db()
        self._used.add(approval.pk)
        if self._held is not None and all(held.pk != approval.pk for held in self._held):
            self._held.append(approval)
        if approval.status == Approval.Status.APPROVED and (
            not readable(approval.exact_args) or approval.result == UNREADABLE_ARGS_RESULT
        ):
            return self._unreadable_args_failure(approval)
        return ApprovalState(
            status=approval.status,  # type: ignore[arg-type]
            approval_id=str(approval.pk),
            reason=approval.reason,
            decided_by=approval.decided_by,
            result=approval.result,
            args=_exact_args(approval),
            call_hash=approval.call_hash,
        )

    def _unreadable_args_failure(self, approval: Approval) -> ApprovalState:
        """An approved call whose exact arguments cannot be decrypted with this process's keys: never sent (the
        masked ones are not what a person approved), and told to the gate as a call that ended with a recorded
        failure, ``config:secret_unreadable``: the model reads why, and does not try again. The approval is never
        claimed: it stays unused, and ends ``expired`` with its run (``approvals_unused``), never "executed".

        The failure is recorded on the approval once, with its audit event (a ``tool.call`` refusal, as the gate
        would write it), so a pass made again (a resumed run replays the call) finds the same answer, audited once,
        even after the key is back: the model was told the call failed, it is not made behind its back."""
        with transaction.atomic():
            recorded = Approval.objects.filter(
                pk=approval.pk, status=Approval.Status.APPROVED, result__isnull=True
            ).update(result=UNREADABLE_ARGS_RESULT)
            if recorded:
                logger.error("approval %s of run %s: its exact arguments cannot be decrypted", approval.pk, self.run_id)
                _unreadable_args_audit(approval, actor=self.actor)
        return ApprovalState(
            status="executed",
            approval_id=str(approval.pk),
            reason=approval.reason,
            decided_by=approval.decided_by,
            result=UNREADABLE_ARGS_RESULT,
            call_hash=approval.call_hash,
        )

    def _approval_of_call(self, call_id: str, masked_args: dict[str, Any]) -> Approval | None:
        """The approval of the call named ``call_id``, or None. A resumed run replays the call from its masked
        conversation: the call is known by its id, and its masked arguments are the approval's even where its exact
        ones hash differently now.

        A model's call under an id that an approval holds with other masked arguments is another call, and gets
        an approval of its own (asked for; in a sandbox, made), found again by its id and arguments. Within a run
        the engine makes call ids unique (``graph.with_unique_call_ids``), but a pass made again (a store that
        failed and was retried, a takeover, a redelivery) asks the model again from a conversation that never
        held the first answer, and a model that numbers its calls per turn (``call_0``) names another write by
        the first one's id. Given the first call's approval, the gate would send the approved arguments while the
        conversation, the run's tool calls and the audit show these, or tell the model these were done with the
        first call's recorded outcome. A call of its own keeps both rules: what a person approved is what is sent
        (these arguments are asked for), and a write is sent at most once (an approval is only ever used for its
        own arguments; the first call's, never made by this pass, ends unused when it parks or the run ends).
        Refusing the call instead (``approval:mismatch``) would tell the model a legitimate write cannot be made.

        A rule's or a flow's call (an admin configured it; a flow numbers its calls in order) keeps the approval
        found under its id, as before: the gate compares the exact arguments and refuses a numbered call that does
        not match (``approval:mismatch``)."""
        same_id = list(Approval.objects.filter(run_id=self.run_id, call_id=call_id).order_by("created_at"))
        return _the_call_among(same_id, call_id, masked_args)

    def asked_for(
        self,
        *,
        mcp_id: str,
        tool: str,
        args: dict[str, Any],
        call_id: str,
        call_hash: str,
        approved_by: str = "",
    ) -> bool:
        """Whether ``request`` would find an approval of ``tool`` for this call; asks for nothing. The gate asks it
        of every read call: a call asked for as a write (its tool marked ``read`` since) is decided by its approval.

        Found as ``request`` finds it, among the run's approvals read once for the pass (``_held``; none on a run's
        first pass, which has none to read): a read call costs no lookup but a list's."""
        held = self._run_approvals()
        if not held:
            return False
        if call_id:
            same_id = [approval for approval in held if approval.call_id == call_id]
            found = _the_call_among(same_id, call_id, mask_value(args, secrets=self.secrets)) if same_id else None
        else:
            found = next((a for a in held if a.call_hash == call_hash and a.call_id == ""), None)
        if found is None and approved_by and call_id:
            found = next(
                (
                    approval
                    for approval in held
                    if approval.call_hash == call_hash
                    and approval.decided_by == approved_by[:200]
                    and approval.pk not in self._used
                ),
                None,
            )
        # Another tool's approval under this id (a read fallback the gate calls under its call's id) is not this
        # call's.
        return found is not None and (found.mcp_id, found.tool) == (mcp_id, tool)

    def _run_approvals(self) -> list[Approval]:
        """The run's approvals, oldest first, with what ``asked_for`` compares (not the exact arguments, which it
        would decrypt): read from the database the first time a pass needs them."""
        if self._held is None:
            self._held = list(
                Approval.objects.filter(run_id=self.run_id)
                .only("id", "mcp_id", "tool", "args", "call_hash", "call_id", "decided_by", "created_at")
                .order_by("created_at")
            )
        return self._held

    def approved_args(self, *, call_id: str, args: dict[str, Any]) -> dict[str, Any] | None:
        """The exact arguments of the approval of the call ``call_id`` whose masked arguments are ``args`` masked,
        or None; asks for nothing. A resumed run replays its calls masked: the gate checks the contract against
        these. Only an approval with these very masked arguments is one (a rule's or a flow's under its number
        too): another call's exact arguments are never checked in place of a call's own."""
        same_id = Approval.objects.filter(run_id=self.run_id, call_id=call_id).order_by("created_at")
        approval = _with_args(same_id, mask_value(args, secrets=self.secrets))
        return _exact_args(approval) if approval is not None else None

    def waiting(self) -> bool:
        """Whether an approval this pass asked for still waits for a person (the run parks), or none does (each
        was decided while the pass ran on: the run is queued again)."""
        return Approval.objects.filter(pk__in=self._used, status=Approval.Status.PENDING).exists()

    def end_unasked(self) -> int:
        """As this pass parks, in the transaction that stores its park (the run's row locked): the run's
        approvals that this pass did not ask for, waiting for a person or approved, end ``expired``
        (``ASKED_AGAIN_APPROVAL``), each audited ``approval.unused`` (why ``asked_again``), as ``approvals_unused``
        ends those of a run that finished. Returns how many.

        They were asked for by an earlier pass whose outcome was never stored (a store that failed and was
        retried, a takeover, a redelivery): this pass asked the model again, and the conversation it stores, which
        a resumed run replays, holds its own calls, not those. Left waiting, they were listed and could be
        approved ("the run resumes and makes the call once") for a call no pass makes, and a decision on this
        pass's own approval taken while it ran found the run still waiting for them and left it parked. Nothing a
        later pass needs is among them: a resumed pass replays the stored calls in order and asks again for the
        approval of each, up to the one it parks on."""
        return approvals_unused(run_id=self.run_id, why="asked_again", keep=self._used, reason=ASKED_AGAIN_APPROVAL)

    def claim_execution(self, approval_id: str) -> bool:
        """Approved → executing, once: a second worker (or a redelivery) cannot execute it again."""
        return (
            Approval.objects.filter(pk=approval_id, status=Approval.Status.APPROVED).update(
                status=Approval.Status.EXECUTING
            )
            == 1
        )

    def record_execution(self, approval_id: str, result: dict[str, Any]) -> None:
        Approval.objects.filter(pk=approval_id, status=Approval.Status.EXECUTING).update(
            status=Approval.Status.EXECUTED, result=result
        )

    def record_outcome_unknown(self, approval_id: str, result: dict[str, Any]) -> None:
        """Executing → outcome_unknown (compare-and-swap): the call went out and no answer came, or the worker that
        claimed it died. It is never executed again; the model and the admin see ``outcome_unknown``."""
        Approval.objects.filter(pk=approval_id, status=Approval.Status.EXECUTING).update(
            status=Approval.Status.OUTCOME_UNKNOWN, result=result
        )


REASON_MAX_CHARS = 2000
"""The longest reason a decision may give (the REST API's and the A2A reply's limit too): a longer one is refused,
never stored cut while its audit event keeps the whole."""

REVIEWER_GROUP = "reviewer"
"""The group whose members may view runs and decide approvals in the admin (migration agents/0006)."""


def approvals_waiting(run: Run) -> QuerySet[Approval]:
    """The run's approvals a person may still decide, oldest first: pending and not past their expiry (one past it
    is expired, whether or not the periodic sweep has marked it yet: it is never offered as waiting)."""
    now = timezone.now()
    waiting = run.approvals.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now), status=Approval.Status.PENDING)
    return waiting.order_by("created_at")


def asked_by_the_model(approval: Approval) -> bool:
    """Whether the call waiting for approval is one the model asked for (not a deterministic rule's or a flow
    node's, which an admin configured)."""
    return asked_by_the_model_call(approval.call_id)


def asked_by_the_model_call(call_id: str) -> bool:
    """Whether ``call_id`` names a call the model asked for (a rule's and a flow's start ``rule:`` and ``flow:``)."""
    return not call_id.startswith(("rule:", "flow:"))


_FINISHED = (Run.Status.SUCCEEDED, Run.Status.FAILED, Run.Status.CANCELLED)


def approval_decide(
    *, run: Run, approval_id: str, decision: str, actor: str, reason: str = "", by_caller: bool = False
) -> Approval:
    """Approve or reject a pending approval and resume the run. Compare-and-swap: a decision is taken once.

    ``by_caller``: the decision comes from the run's own API caller. The caller may reject anything, but may
    approve a write the model asked for only where the agent allows it (``caller_approves_model_writes``):
    the model may have been steered by text a tool returned, so a person who did not ask the question decides.

    Raises ApplicationError 400 (no such decision, a reason over ``REASON_MAX_CHARS``), 404 (no such approval on
    this run), 403 (the caller may not approve this call), 409 (already decided, expired, or its run finished:
    ``run_finished``, the approval then ended unused), 503 ``config:secret_unreadable`` (an approval only: a secret
    the call or its run needs cannot be decrypted, ``_approvable``; a rejection needs none)."""
    if decision not in {"approve", "reject"}:
        raise ApplicationError(_("'decision' must be 'approve' or 'reject'."), code="invalid_input", status=400)
    if len(reason) > REASON_MAX_CHARS:
        raise ApplicationError(
            _("'%(key)s' must be text of at most %(max)d characters.") % {"key": "reason", "max": REASON_MAX_CHARS},
            code="invalid_input",
            status=400,
        )
    approval = Approval.objects.filter(pk=_uuid_or_none(approval_id), run=run).first()
    if approval is None:
        raise ApplicationError(_("Approval not found."), code="approval_not_found", status=404)
    if (
        by_caller
        and decision == "approve"
        and approval.status == Approval.Status.PENDING
        and approval.expires_at > timezone.now()  # an expired one is answered as expired (409), below
        and asked_by_the_model(approval)
        and not run.agent.caller_approves_model_writes
    ):
        raise ApplicationError(
            _(
                "A write call the model asked for is approved by an admin or a reviewer, not by the API caller "
                "whose run it is. Reject it here, or ask a reviewer to approve it in the admin."
            ),
            code="approval_needs_reviewer",
            status=403,
        )
    now = timezone.now()
    # A person's words, stored and shown (the approval's page, the model's message): a secret pasted in is masked
    # as the run's own texts are (its servers' and its agent's, and every secret this process knows).
    secrets, all_readable = _reason_secrets(run)
    reason = mask_text(reason, secrets=secrets)
    with transaction.atomic():
        # The run's row first, as the worker storing the run's park holds it: a decision taken while the pass that
        # asked is still storing waits for it, and so finds the run parked (or the worker finds the approval
        # decided, and queues the run itself). Without it, both could miss each other and the run stay parked.
        run_row_lock(run.pk)
        # A run that finished (cancelled, or failed by the reconciler, while this call waited) will never make the
        # call: the decision is refused and the approval ends unused, not "approved" for a run that never resumes.
        finished = Run.objects.filter(pk=run.pk, status__in=_FINISHED).exists()
        if finished:
            others = Approval.objects.filter(run_id=run.pk).exclude(pk=approval.pk).values_list("pk", flat=True)
            approvals_unused(run_id=run.pk, why="run_finished", keep=list(others))
        expired = (
            not finished
            and approval.status == Approval.Status.PENDING
            and approval.expires_at <= now
            and Approval.objects.filter(pk=approval.pk, status=Approval.Status.PENDING).update(
                status=Approval.Status.EXPIRED
            )
            == 1
        )
        if expired:
            approval_expiry_audit(approval, actor=actor)
            run_resume(run_id=str(run.pk))  # the model is told the call was not made
        elif not finished:
            if decision == "approve" and approval.status == Approval.Status.PENDING:
                _approvable(approval, configuration_readable=all_readable)
            new_status = Approval.Status.APPROVED if decision == "approve" else Approval.Status.REJECTED
            claimed = Approval.objects.filter(pk=approval.pk, status=Approval.Status.PENDING).update(
                status=new_status, decided_by=actor[:200], decided_at=now, reason=reason
            )
            if claimed != 1:
                approval.refresh_from_db()
                raise ApplicationError(
                    _("This approval was already decided (%(status)s).")
                    % {"status": Approval.Status(approval.status).label},
                    code="approval_decided",
                    status=409,
                )
            audit_event_record(
                source="api" if by_caller else "admin",  # the run's API caller (REST, A2A), or a person in the admin
                action=f"approval.{decision}",
                run_id=run.pk,
                mcp_id=approval.mcp_id,
                tool=approval.tool,
                call_id=approval.call_id,
                args=approval.args,
                result={"approval_id": str(approval.pk), "reason": reason},
                ok=decision == "approve",
                reason=f"approval:{'approved' if decision == 'approve' else 'rejected'}",
                actor=actor,
            )
            # Re-queued in the same transaction as the decision; the task is sent once it commits.
            run_resume(run_id=str(run.pk))
    if finished:
        raise ApplicationError(
            _("The run has finished; its calls are no longer decided."), code="run_finished", status=409
        )
    if expired:
        raise ApplicationError(_("This approval has expired."), code="approval_expired", status=409)
    approval.refresh_from_db()
    return approval


def _reason_secrets(run: Run) -> tuple[list[str], bool]:
    """What masks a decision's reason, and whether every secret of the run's configuration could be read.

    The run's servers' and its agent's secrets (and every binding's credentials), as the run masks its own texts.
    Where one of them was stored with a key this process lacks, every secret that can be read masks it
    (``every_binding_secret`` skips the others): a rejection needs none of them and goes through; an approval is
    refused (``_approvable``)."""
    try:
        configuration = run_configuration(agent=run.agent, version=run.version, generation=None)
        return [*configuration.server_secrets, *run.agent.secret_values()], True
    except SecretDecryptionError as exc:
        logger.warning("run %s: a secret of its configuration cannot be decrypted: %s", run.pk, exc)
        return every_binding_secret(), False


def _approvable(approval: Approval, *, configuration_readable: bool) -> None:
    """Refuse to approve a call that cannot be carried out for a secret this process cannot decrypt, as a run
    submission is refused (``agents.services.run_submit``): a 503 ``config:secret_unreadable`` naming the setting
    to check, with ``Retry-After``; the approval stays pending, to be approved once the keys are fixed, or
    rejected. Approved, it would resume a run that fails at once (the agent's model key, a server's env or
    headers), or a call whose exact arguments, what a person approves, cannot be sent."""
    if not configuration_readable:
        message = None  # the configuration's own words
    elif not readable(approval.exact_args):
        message = _(
            "The exact arguments of this call were stored with a key this server lacks, so it cannot be made; an "
            "operator must check SECRETS_ENCRYPTION_KEYS, or reject the call."
        )
    else:
        return
    logger.error(
        "approving approval %s of run %s was refused: a stored secret cannot be decrypted", approval.pk, approval.run_id
    )
    raise secret_unreadable_refusal(message)


def approvals_expire_due() -> int:
    """Expire pending approvals past their time and resume their runs (the model is told). Returns the count.
    Each expiry is audited (the refused call, ``approval:expired``) with it, in one transaction."""
    due = list(
        Approval.objects.filter(status=Approval.Status.PENDING, expires_at__lte=timezone.now()).values_list(
            "pk", "run_id"
        )
    )
    # Each on its own: one that cannot be expired (a row that cannot be read) is logged and left, not a reason to
    # leave every approval after it pending past its time.
    return sum(
        repaired_alone("expire its due approval", partial(_approval_expire, pk, run_id), False, run_id=run_id)
        for pk, run_id in due
    )


def _approval_expire(pk: Any, run_id: Any) -> bool:
    """Expire one due approval: the expiry, its audit event and the run's resumption together (a crash between
    them left the run parked for good), the run's row locked first, as a decision locks it. False where it was
    decided or expired meanwhile."""
    with transaction.atomic():
        run_row_lock(run_id)
        if not Approval.objects.filter(pk=pk, status=Approval.Status.PENDING).update(status=Approval.Status.EXPIRED):
            return False
        approval_expiry_audit(Approval.objects.get(pk=pk), actor="system")
        run_resume(run_id=str(run_id))
        return True


def approval_expiry_audit(approval: Approval, *, actor: str) -> None:
    """The audit event of a write call refused because nobody approved it in time: one ``tool.call`` refusal with
    reason ``approval:expired``, written by whoever expired the approval (the periodic expiry, a decision that came
    too late, the run that found it past its time), in that transaction. The gate's refusal that follows is not
    audited again."""
    audit_event_record(
        source=_requester(approval.call_id),
        action="tool.call",
        run_id=approval.run_id,
        mcp_id=approval.mcp_id,
        tool=approval.tool,
        call_id=approval.call_id,
        args=approval.args,
        result={"approval_id": str(approval.pk), "expires_at": approval.expires_at.isoformat()},
        ok=False,
        reason="approval:expired",
        attempt=0,
        actor=actor,
    )


def _unreadable_args_audit(approval: Approval, *, actor: str) -> None:
    """The audit event of an approved write call never sent because its exact arguments cannot be decrypted: one
    ``tool.call`` refusal with reason ``config:secret_unreadable``, written by the pass that found it. The gate
    tells the model of it as a recorded outcome, which it does not audit again."""
    audit_event_record(
        source=_requester(approval.call_id),
        action="tool.call",
        run_id=approval.run_id,
        mcp_id=approval.mcp_id,
        tool=approval.tool,
        call_id=approval.call_id,
        args=approval.args,
        result={"approval_id": str(approval.pk)},
        ok=False,
        reason=SECRET_UNREADABLE,
        attempt=0,
        actor=actor,
    )


def _requester(call_id: str) -> str:
    """The audit source of the call an approval was asked for: a rule's, a flow's, or the model's."""
    if call_id.startswith("rule:"):
        return "deterministic"
    return "flow" if call_id.startswith("flow:") else "agent"


def _uuid_or_none(value: str) -> Any:
    import uuid

    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None
