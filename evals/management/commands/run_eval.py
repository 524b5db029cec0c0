"""``manage.py run_eval AGENT SET [--version N] [--workers K]``: run an eval set through the normal run path.

Each case is an ordinary run (``purpose="eval"``) executed by the Celery workers; at most ``--workers`` cases
are in flight at once, so an eval does not crowd out live traffic. Prints a progress bar, the scores per case
and for the set, and exits non-zero when a score misses one of the set's thresholds (so it can gate a deploy).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agent_platform.errors import ApplicationError
from agents.models import Agent, Run
from evals.models import EvalRun, EvalSet
from evals.services import eval_run_refresh, eval_run_start

BAR_WIDTH = 30


def progress_bar(done: int, total: int) -> str:
    filled = BAR_WIDTH * done // total if total else BAR_WIDTH
    return f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done}/{total} cases"


class Command(BaseCommand):
    help = "Run an eval set against an agent through the normal run path; non-zero exit below the set's thresholds."

    def add_arguments(self, parser: CommandParser) -> None:
        # ``--version`` is the agent's version here (DESIGN.md names it so), not Django's "print the version".
        parser.conflict_handler = parser._optionals.conflict_handler = "resolve"
        parser.add_argument("agent")
        parser.add_argument("set", help="the eval set's name")
        parser.add_argument("--version", type=int, default=None, help="a published version of the agent")
        parser.add_argument("--workers", type=int, default=4, help="cases in flight at once (default 4)")
        parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the whole set")
        parser.add_argument("--label", default="", help="a label for the eval run (e.g. the change it measures)")
        parser.add_argument("--json", action="store_true", help="print the eval run as JSON")
        parser.add_argument(
            "--inline", action="store_true", help="execute the cases in this process instead of waiting for workers"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["workers"] < 1:
            raise CommandError("--workers must be at least 1")
        agent = Agent.objects.filter(slug=options["agent"]).first()
        if agent is None:
            raise CommandError(f"unknown agent '{options['agent']}'")
        eval_set = EvalSet.objects.filter(name=options["set"]).first()
        if eval_set is None:
            raise CommandError(f"unknown eval set '{options['set']}'")
        window = options["workers"]
        try:
            eval_run = eval_run_start(
                eval_set=eval_set,
                agent=agent,
                actor="system:run_eval",
                version=options["version"],
                label=options["label"],
                window=window,
            )
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc
        self.stderr.write(f"eval run {eval_run.id}: {eval_run.total} cases of {eval_set.name} against {agent.slug}")
        deadline = time.monotonic() + options["timeout"]
        shown = -1
        try:
            while eval_run.status == EvalRun.Status.RUNNING:
                if options["inline"]:
                    self._execute_queued(eval_run)
                eval_run = eval_run_refresh(eval_run=eval_run, window=window)
                if eval_run.done != shown:
                    shown = eval_run.done
                    self._progress(eval_run.done, eval_run.total)
                if eval_run.status != EvalRun.Status.RUNNING:
                    break
                if time.monotonic() > deadline:
                    raise CommandError(
                        f"eval run {eval_run.id}: {eval_run.done}/{eval_run.total} cases scored after "
                        f"{options['timeout']:g}s: are workers running?"
                    )
                time.sleep(0.2)
        finally:
            if options["inline"]:
                from mcpregistry.pool import shutdown_default_pool

                shutdown_default_pool()
        if sys.stderr.isatty():
            self.stderr.write("")
        self._print(eval_run, as_json=options["json"])
        if eval_run.failed_thresholds:
            raise CommandError("below the set's thresholds: " + "; ".join(eval_run.failed_thresholds))

    def _execute_queued(self, eval_run: EvalRun) -> None:
        from agents.execution import run_execute

        queued = Run.objects.filter(eval_results__eval_run=eval_run, status=Run.Status.QUEUED).values_list(
            "id", flat=True
        )
        for run_id in list(queued):
            run_execute(run_id=str(run_id))

    def _progress(self, done: int, total: int) -> None:
        if sys.stderr.isatty():
            self.stderr.write("\r" + progress_bar(done, total), ending="")
            self.stderr.flush()
        else:
            self.stderr.write(progress_bar(done, total))

    def _print(self, eval_run: EvalRun, *, as_json: bool) -> None:
        results = list(eval_run.results.select_related("case").order_by("case__order", "case__id"))
        if as_json:
            payload = {
                "id": str(eval_run.id),
                "set": eval_run.eval_set.name,
                "agent": eval_run.agent.slug,
                "version": eval_run.version,
                "summary": eval_run.summary,
                "failed_thresholds": eval_run.failed_thresholds,
                "cases": [
                    {
                        "key": r.case.key,
                        "type": r.case.case_type,
                        "passed": r.passed,
                        "called_tools": [c["name"] for c in r.called_tools],
                        "scores": r.scores,
                    }
                    for r in results
                ],
            }
            self.stdout.write(json.dumps(payload, ensure_ascii=False, indent=2))
            return
        for r in results:
            mark = self.style.SUCCESS("PASS") if r.passed else self.style.ERROR("FAIL")
            called = ", ".join(c["name"] for c in r.called_tools) or "-"
            why = " ".join(r.scores.get("failed_checks") or [])
            self.stdout.write(f"{mark} {r.case.key} [{r.case.case_type}] called: {called} {why}".rstrip())
        s = {k: ("—" if v is None else v) for k, v in eval_run.summary.items()}
        self.stdout.write(
            f"passed {s.get('passed')}/{s.get('cases')}  precision {s.get('precision')}  recall {s.get('recall')}  "
            f"sequence {s.get('sequence_match')}  forbidden {s.get('forbidden_violations')}  "
            f"args {s.get('argument_match')}  answers {s.get('answer_checks')}"
        )
        self.stdout.write(
            f"latency p50 {s.get('latency_p50_ms')} ms  p95 {s.get('latency_p95_ms')} ms  tokens {s.get('tokens')}  "
            f"model calls {s.get('model_calls')}  saved by rules {s.get('model_calls_saved')}"
        )
