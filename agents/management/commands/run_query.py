from __future__ import annotations

import json
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.urls import reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop
from rest_framework.exceptions import ParseError

from agent_platform.command_args import timeout_seconds
from agent_platform.errors import ApplicationError
from agent_platform.json import BoundedJSONDecoder, json_error_text
from agents.admin_runs import run_provider_is_offline
from agents.api.config import api_setting
from agents.api.parsers import json_parse_bounded
from agents.approvals import approvals_waiting
from agents.conversations import context_id_problem, context_without_null_id
from agents.decision_reasons import reason_text
from agents.error_texts import error_message_text
from agents.execution import run_execute
from agents.models import Run
from agents.selectors import run_tool_calls
from agents.services import run_create, secrets_readable_or_refused
from mcpregistry.pool import shutdown_default_pool

# A run left waiting for a person's approval exits with this (a failed or cancelled one with 1): a script tells
# "decide, then read the run again" from "it went wrong".
AWAITING_APPROVAL_EXIT = 3


def context_parsed(text: str) -> Any:
    """``--context`` read as the API reads a body (``json_parse_bounded``), so that what a POST would refuse is refused
    here too: NaN, Infinity and 1e999 (no JSON column stores them: the insert failed its CHECK, a traceback), integers
    beyond 64 bits, NUL, unpaired surrogates, nesting past ``PLATFORM_API_MAX_JSON_DEPTH``. Text that is no JSON at
    all is first said as ``json_error_text`` says it (what is wrong and where). Raises CommandError."""
    try:
        json.loads(text, cls=BoundedJSONDecoder)
    except ValueError as exc:
        raise CommandError(_("--context is not JSON: %(error)s") % {"error": json_error_text(exc)}) from exc
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:  # bytes of the command line that were no UTF-8 (Python keeps them as surrogates)
        raise CommandError(_("--context is not UTF-8 text")) from None
    try:
        return json_parse_bounded(raw, max_depth=int(api_setting("PLATFORM_API_MAX_JSON_DEPTH")))
    except ParseError as exc:
        raise CommandError(_("--context is not JSON: %(error)s") % {"error": exc.detail}) from None


class Command(BaseCommand):
    help = gettext_noop(
        "Submit a query to an agent through the same path as the API, wait, and print the answer, trace and audit."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.description = _(self.help)  # marked above, translated now: argparse takes no lazy string
        parser.add_argument("agent")
        parser.add_argument("query")
        parser.add_argument("--context", default="{}", help=_("A2A context as a JSON object"))
        parser.add_argument("--json", action="store_true", help=_("print the run as JSON"))
        parser.add_argument("--timeout", type=timeout_seconds, default=120.0, help=_("seconds to wait for a worker"))
        parser.add_argument(
            "--inline", action="store_true", help=_("execute in this process instead of waiting for a worker")
        )

    def handle(self, *args: Any, **options: Any) -> None:
        context = context_parsed(options["context"])
        if not isinstance(context, dict):
            raise CommandError(_("--context must be a JSON object"))
        # Its contextId read as every door reads one (text; null: none, the run its own conversation): a number was
        # kept as it came, and no later run of the conversation was given this one's turn.
        context = context_without_null_id(context)
        problem = context_id_problem(context, field="context.contextId")
        if problem is not None:
            raise CommandError(problem)
        # Stripped, and refused when nothing is left, as the API's and MCP's query is (run_create takes an empty one:
        # an A2A message of data parts alone has none).
        query = options["query"].strip()
        if not query:
            raise CommandError(_("The query is empty."))
        try:
            with secrets_readable_or_refused():
                run = run_create(
                    agent_slug=options["agent"],
                    query=query,
                    api_key=None,
                    context=context,
                    dispatch=not options["inline"],  # executed here, not by whichever worker takes it first
                )
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc
        self.stderr.write(_("run %(id)s queued") % {"id": run.id})
        if options["inline"]:
            try:
                run_execute(run_id=str(run.id))
            finally:
                shutdown_default_pool()
        deadline = time.monotonic() + options["timeout"]
        last_status = ""
        while True:
            run.refresh_from_db()
            if run.status != last_status:
                self.stderr.write(f"  {run.get_status_display()}")
                last_status = run.status
            if run.is_finished or run.status == Run.Status.AWAITING_APPROVAL:
                break
            if time.monotonic() > deadline:
                raise CommandError(
                    _("run %(id)s is still %(status)s after %(timeout)s: is a worker running?")
                    % {"id": run.id, "status": run.get_status_display(), "timeout": f"{options['timeout']:g}s"}
                )
            time.sleep(0.2)
        self._print(run, as_json=options["json"])
        if run.status == Run.Status.FAILED:
            raise CommandError(f"{run.error_code}: {error_message_text(run.error_code, run.error_message)}")
        if run.status == Run.Status.CANCELLED:
            raise CommandError(
                _("run %(id)s was cancelled: %(reason)s")
                % {"id": run.id, "reason": error_message_text(run.error_code, run.error_message)}
            )
        if run.status == Run.Status.AWAITING_APPROVAL:
            # Not an answer and not a failure: its own exit status, so that a script can tell it apart.
            pending = approvals_waiting(run)
            raise CommandError(
                _(
                    "run %(id)s is waiting for a person to approve %(calls)s: approve or reject it in the admin "
                    "(%(admin)s); a worker carries the run on once it is decided"
                )
                % {
                    "id": run.id,
                    "calls": ", ".join(f"{a.mcp_id}.{a.tool} ({a.id})" for a in pending) or "—",
                    "admin": reverse("admin:agents_approval_changelist"),
                },
                returncode=AWAITING_APPROVAL_EXIT,
            )

    def _print(self, run: Run, *, as_json: bool) -> None:
        calls = run_tool_calls(run=run)
        if as_json:
            payload = {
                "id": str(run.id),
                "status": run.status,
                "answer": run.answer,
                "error": {"code": run.error_code, "message": run.error_message} if run.error_code else None,
                "deterministic_results": run.deterministic_results,
                "tool_calls": calls,
                "trace": run.messages,
                "timings": run.timings,
                "token_usage": run.token_usage,
            }
            self.stdout.write(json.dumps(payload, ensure_ascii=False, indent=2))
            return
        self.stdout.write(self.style.MIGRATE_HEADING(_("answer")))
        # Without an answer, the status, and its code and message where it has one: a run parked for an approval
        # has neither (it printed "(awaiting approval:  )").
        failure = error_message_text(run.error_code, run.error_message)
        why = " ".join(part for part in (run.error_code, failure) if part)
        self.stdout.write(run.answer or f"({run.get_status_display()}{f': {why}' if why else ''})")
        self.stdout.write(self.style.MIGRATE_HEADING(_("trace")))
        # The offline provider's turn is no model's, as the run page says (``admin_runs._Timeline.offline_turn``):
        # its one turn, which calls no tool and is the answer.
        offline, turns = run_provider_is_offline(run), 0
        for step in run.messages:
            kind = step.get("type")
            if kind == "rule":
                rule = {
                    "rule": step.get("rule"),
                    "reason": reason_text(str(step.get("reason") or "")),
                    "params": json.dumps(step.get("params"), ensure_ascii=False) if step.get("params") else "",
                }
                if step.get("matched"):
                    self.stdout.write("  " + _("rule %(rule)s: matched %(params)s") % rule)
                else:
                    self.stdout.write("  " + _("rule %(rule)s: skipped (%(reason)s) %(params)s") % rule)
            elif kind == "deterministic_call":
                self.stdout.write(
                    "  "
                    + _("deterministic %(call)s ok=%(ok)s %(error)s")
                    % {
                        "call": f"{step['tool']}({json.dumps(step['args'], ensure_ascii=False)})",
                        "ok": step["ok"],
                        "error": step.get("error") or "",
                    }
                    + (
                        " " + _("(fallback for %(tool)s, which failed)") % {"tool": step["fallback_for"]}
                        if step.get("fallback_for")
                        else ""
                    )
                )
            elif kind == "ai":
                turns += 0 if step.get("history") else 1
                for call in step.get("tool_calls") or []:
                    self.stdout.write(
                        "  "
                        + _("model → %(call)s")
                        % {"call": f"{call['name']}({json.dumps(call['args'], ensure_ascii=False)})"}
                    )
                if step.get("content"):
                    content = str(step["content"])
                    if offline and turns == 1 and not step.get("tool_calls") and run.answer and content == run.answer:
                        self.stdout.write(f"  {_('answer without a model (offline provider)')}: {content[:200]}")
                    else:
                        self.stdout.write("  " + _("model: %(content)s") % {"content": content[:200]})
            elif kind == "tool":
                self.stdout.write(
                    "  "
                    + _("tool %(name)s: %(content)s")
                    % {"name": step.get("name"), "content": str(step.get("content"))[:200]}
                )
        self.stdout.write(self.style.MIGRATE_HEADING(_("audit")))
        for call in calls:
            # A call never sent (refused, a memo hit, the circuit open) has no latency.
            latency = "—" if call["latency_ms"] is None else f"{call['latency_ms']:.1f} ms"
            self.stdout.write(
                f"  [{call['source']}] {call['mcp_id']}.{call['name']} ok={call['ok']} {call['reason']} {latency}"
            )
        self.stdout.write(_("timings: %(timings)s") % {"timings": json.dumps(run.timings)})
