"""``manage.py run_eval AGENT SET [--version N] [--workers K]``: run an eval set through the normal run path.

Each case is an ordinary run (``purpose="eval"``) executed by the Celery workers; at most ``--workers`` cases
(default ``PLATFORM_EVAL_WINDOW``) are in flight at once, so an eval does not crowd out live traffic. Prints a
progress bar, the scores per case and for the set, and exits non-zero when a score misses one of the set's
thresholds (so it can gate a deploy), a threshold whose score no case measured included (not judged: not met).
A set with no thresholds exits 0, and says that no threshold judged the eval run: its exit status then tells that
the eval ran, not that it passed.

Interrupted while it waits (Ctrl-C), it cancels the eval run (``eval_run_cancel``, actor ``system:run_eval``: its
unfinished runs cancelled, its cases not yet scored never submitted), says so and exits 130; an eval run cancelled
elsewhere (the admin, the API) while it waits ends it with exit status 1. A cancelled eval run never passes.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from agent_platform.command_args import timeout_seconds, whole_number
from agent_platform.errors import ApplicationError
from agents.models import Agent, Run
from evals.models import EvalRun, EvalSet
from evals.services import eval_run_cancel, eval_run_refresh, eval_run_start

BAR_WIDTH = 30
ACTOR = "system:run_eval"
# The exit status of a run_eval interrupted with Ctrl-C (its eval run cancelled): 128 + SIGINT, as a shell reports it.
INTERRUPTED_EXIT = 130


def progress_bar(done: int, total: int) -> str:
    filled = BAR_WIDTH * done // total if total else BAR_WIDTH
    bar = f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}]"
    return _("%(bar)s %(done)s/%(total)s cases") % {"bar": bar, "done": done, "total": total}


class Command(BaseCommand):
    help = gettext_noop(
        "Run an eval set against an agent through the normal run path; non-zero exit below the set's thresholds."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.description = _(self.help)  # marked above, translated now: argparse takes no lazy string
        # ``--version`` is the agent's version here (DESIGN.md names it so), not Django's "print the version".
        parser.conflict_handler = parser._optionals.conflict_handler = "resolve"
        parser.add_argument("agent")
        parser.add_argument("set", help=_("the eval set's name"))
        parser.add_argument("--version", type=int, default=None, help=_("a published version of the agent"))
        parser.add_argument(
            "--workers",
            type=whole_number(1),
            default=None,
            help=_("cases in flight at once (default: PLATFORM_EVAL_WINDOW, %(window)s)")
            % {"window": settings.PLATFORM_EVAL_WINDOW},
        )
        parser.add_argument(
            "--timeout", type=timeout_seconds, default=600.0, help=_("seconds to wait for the whole set")
        )
        parser.add_argument("--label", default="", help=_("a label for the eval run (e.g. the change it measures)"))
        parser.add_argument("--json", action="store_true", help=_("print the eval run as JSON"))
        parser.add_argument(
            "--inline",
            action="store_true",
            help=_("execute the cases in this process instead of waiting for workers"),
        )

    def handle(self, *args: Any, **options: Any) -> None:
        agent = Agent.objects.filter(slug=options["agent"]).first()
        if agent is None:
            raise CommandError(_("unknown agent '%(agent)s'") % {"agent": options["agent"]})
        eval_set = EvalSet.objects.filter(name=options["set"]).first()
        if eval_set is None:
            raise CommandError(_("unknown eval set '%(set)s'") % {"set": options["set"]})
        try:
            eval_run = eval_run_start(
                eval_set=eval_set,
                agent=agent,
                actor=ACTOR,
                version=options["version"],
                label=options["label"],
                window=options["workers"],
            )
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc
        window = eval_run.window
        self.stderr.write(
            _("eval run %(id)s: %(total)s cases of %(set)s against %(agent)s")
            % {"id": eval_run.id, "total": eval_run.total, "set": eval_set.name, "agent": agent.slug}
        )
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
                        _("eval run %(id)s: %(done)s/%(total)s cases scored after %(timeout)s: are workers running?")
                        % {
                            "id": eval_run.id,
                            "done": eval_run.done,
                            "total": eval_run.total,
                            "timeout": f"{options['timeout']:g}s",
                        }
                    )
                time.sleep(0.2)
        except KeyboardInterrupt:
            self._cancel(eval_run)
        finally:
            if options["inline"]:
                from mcpregistry.pool import shutdown_default_pool

                shutdown_default_pool()
        if sys.stderr.isatty():
            self.stderr.write("")
        self._print(eval_run, as_json=options["json"])
        if eval_run.status == EvalRun.Status.CANCELLED:
            raise CommandError(
                _("eval run %(id)s was cancelled: %(cancelled)s cases not scored")
                % {"id": eval_run.id, "cancelled": eval_run.summary.get("cancelled", 0)}
            )
        if eval_run.failed_thresholds:
            raise CommandError(
                _("below the set's thresholds: %(thresholds)s") % {"thresholds": "; ".join(eval_run.failed_thresholds)}
            )
        if eval_run.verdict == "no_thresholds":
            self.stderr.write(
                self.style.WARNING(
                    _("no thresholds set: no threshold judged eval run %(id)s; exit status 0 says only that it ran")
                    % {"id": eval_run.id}
                )
            )

    def _cancel(self, eval_run: EvalRun) -> None:
        """Ctrl-C: cancel the eval run (unless it ended meanwhile), say so, and stop with ``INTERRUPTED_EXIT``."""
        if sys.stderr.isatty():
            self.stderr.write("")
        try:
            eval_run = eval_run_cancel(eval_run=eval_run, actor=ACTOR, via="run_eval")
        except ApplicationError as exc:  # it finished (or was cancelled elsewhere) first
            self.stderr.write(_("interrupted: eval run %(id)s: %(why)s") % {"id": eval_run.id, "why": exc.message})
            raise CommandError(_("interrupted"), returncode=INTERRUPTED_EXIT) from None
        self.stderr.write(
            _("interrupted: eval run %(id)s cancelled: %(done)s/%(total)s cases scored, %(cancelled)s not scored")
            % {
                "id": eval_run.id,
                "done": eval_run.done,
                "total": eval_run.total,
                "cancelled": eval_run.summary.get("cancelled", 0),
            }
        )
        raise CommandError(_("eval run %(id)s cancelled") % {"id": eval_run.id}, returncode=INTERRUPTED_EXIT)

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
        cases = [r.case_as_run() for r in results]  # as the eval run asked them (edited since or not)
        if as_json:
            payload = {
                "id": str(eval_run.id),
                "set": eval_run.eval_set.name,
                "agent": eval_run.agent.slug,
                "version": eval_run.version,
                "status": eval_run.status,
                "summary": eval_run.summary,
                "thresholds": eval_run.thresholds,
                "failed_thresholds": eval_run.failed_thresholds,
                "passed": eval_run.passed,
                "verdict": eval_run.verdict,
                "cases": [
                    {
                        "key": case.key,
                        "type": case.case_type,
                        "passed": None if r.cancelled else r.passed,
                        "cancelled": r.cancelled,
                        "called_tools": [c["name"] for c in r.called_tools],
                        "scores": r.scores,
                    }
                    for r, case in zip(results, cases, strict=True)
                ],
            }
            self.stdout.write(json.dumps(payload, ensure_ascii=False, indent=2))
            return
        for r, case in zip(results, cases, strict=True):
            mark = self.style.SUCCESS("PASS") if r.passed else self.style.ERROR("FAIL")
            if r.cancelled:
                mark = self.style.WARNING("STOP")
            called = ", ".join(c["name"] for c in r.called_tools) or "-"
            why = " ".join(r.scores.get("failed_checks") or [])
            line = _("%(mark)s %(key)s [%(type)s] called: %(called)s %(why)s") % {
                "mark": mark,
                "key": case.key,
                "type": case.case_type,
                "called": called,
                "why": why,
            }
            self.stdout.write(line.rstrip())
        s = {k: ("—" if v is None else v) for k, v in eval_run.summary.items()}
        self.stdout.write(
            _(
                "passed %(passed)s/%(cases)s  precision %(precision)s  recall %(recall)s  sequence %(sequence)s  "
                "forbidden %(forbidden)s  args %(args)s  answers %(answers)s"
            )
            % {
                "passed": s.get("passed"),
                "cases": s.get("cases"),
                "precision": s.get("precision"),
                "recall": s.get("recall"),
                "sequence": s.get("sequence_match"),
                "forbidden": s.get("forbidden_violations"),
                "args": s.get("argument_match"),
                "answers": s.get("answer_checks"),
            }
        )
        self.stdout.write(
            _(
                "latency p50 %(p50)s ms  p95 %(p95)s ms  tokens %(tokens)s  model calls %(model_calls)s  "
                "saved by rules %(saved)s"
            )
            % {
                "p50": s.get("latency_p50_ms"),
                "p95": s.get("latency_p95_ms"),
                "tokens": s.get("tokens"),
                "model_calls": s.get("model_calls"),
                "saved": s.get("model_calls_saved"),
            }
        )
