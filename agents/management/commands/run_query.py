from __future__ import annotations

import json
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agent_platform.errors import ApplicationError
from agents.execution import run_execute
from agents.models import Run
from agents.selectors import run_tool_calls
from agents.services import run_create
from mcpregistry.pool import shutdown_default_pool


class Command(BaseCommand):
    help = "Submit a query to an agent through the same path as the API, wait, and print the answer, trace and audit."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("agent")
        parser.add_argument("query")
        parser.add_argument("--context", default="{}", help="A2A context as a JSON object")
        parser.add_argument("--json", action="store_true", help="print the run as JSON")
        parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for a worker")
        parser.add_argument(
            "--inline", action="store_true", help="execute in this process instead of waiting for a worker"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            context = json.loads(options["context"])
        except ValueError as exc:
            raise CommandError(f"--context is not JSON: {exc}") from exc
        if not isinstance(context, dict):
            raise CommandError("--context must be a JSON object")
        try:
            run = run_create(agent_slug=options["agent"], query=options["query"], api_key=None, context=context)
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc
        self.stderr.write(f"run {run.id} queued")
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
                self.stderr.write(f"  {run.status}")
                last_status = run.status
            if run.is_finished or run.status == Run.Status.AWAITING_APPROVAL:
                break
            if time.monotonic() > deadline:
                raise CommandError(
                    f"run {run.id} is still {run.status} after {options['timeout']:g}s: is a worker running?"
                )
            time.sleep(0.2)
        self._print(run, as_json=options["json"])
        if run.status == Run.Status.FAILED:
            raise CommandError(f"{run.error_code}: {run.error_message}")

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
        self.stdout.write(self.style.MIGRATE_HEADING("answer"))
        self.stdout.write(run.answer or f"({run.status}: {run.error_code} {run.error_message})")
        self.stdout.write(self.style.MIGRATE_HEADING("trace"))
        for step in run.messages:
            kind = step.get("type")
            if kind == "rule":
                verdict = "matched" if step.get("matched") else f"skipped ({step.get('reason')})"
                self.stdout.write(
                    f"  rule {step.get('rule')}: {verdict} {json.dumps(step.get('params'), ensure_ascii=False) if step.get('params') else ''}"
                )
            elif kind == "deterministic_call":
                self.stdout.write(
                    f"  deterministic {step['tool']}({json.dumps(step['args'], ensure_ascii=False)}) ok={step['ok']} {step.get('error') or ''}"
                )
            elif kind == "ai":
                for call in step.get("tool_calls") or []:
                    self.stdout.write(f"  model → {call['name']}({json.dumps(call['args'], ensure_ascii=False)})")
                if step.get("content"):
                    self.stdout.write(f"  model: {str(step['content'])[:200]}")
            elif kind == "tool":
                self.stdout.write(f"  tool {step.get('name')}: {str(step.get('content'))[:200]}")
        self.stdout.write(self.style.MIGRATE_HEADING("audit"))
        for call in calls:
            self.stdout.write(
                f"  [{call['source']}] {call['mcp_id']}.{call['name']} ok={call['ok']} {call['reason']} {call['latency_ms']:.1f} ms"
            )
        self.stdout.write(f"timings: {json.dumps(run.timings)}")
