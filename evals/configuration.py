"""The ``eval_sets`` section of ``import_config`` / ``export_config`` (named in ``PLATFORM_CONFIG_SECTIONS``).

Each entry is a set as ``evals.services.eval_set_apply`` reads it: ``name``, ``agent``, ``sandbox_servers``,
``thresholds`` and ``cases``, where a case may give ``expected_source`` in any of seed 001's four notations.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.utils.translation import gettext as _

from agent_platform.errors import ApplicationError
from evals.models import EvalCase, EvalSet
from evals.services import eval_set_apply, eval_set_document


def section_import(entries: Any, *, actor: Any, via: str, report: Any, problem: Callable[[str, str], None]) -> None:
    """Apply each set (idempotent); a set that is not valid becomes a problem of the import, which then changes
    nothing (the caller rolls the whole import back)."""
    if not isinstance(entries, list):
        problem("eval_sets", _("a list of eval sets"))
        return
    for i, entry in enumerate(entries):
        name = entry.get("name") if isinstance(entry, dict) else None
        where = f"eval_sets[{i}]" + (f" ({name})" if name else "")
        if not isinstance(entry, dict):
            problem(where, _("an object"))
            continue
        existed = EvalSet.objects.filter(name=name).exists() if name else False
        held = set(EvalCase.objects.filter(eval_set__name=name).values_list("key", flat=True)) if existed else set()
        try:
            applied = eval_set_apply(document=entry, actor=actor, via=via)
        except ApplicationError as exc:
            problem(where, exc.message)
            continue
        label = _("eval set %(name)s") % {"name": applied.eval_set.name}
        # A case the document no longer holds is deleted (as an agent's arm is): named, so a dry run shows it.
        deleted = sorted(held - set(applied.eval_set.cases.values_list("key", flat=True)))
        if not existed:
            report.created.append(label)
        elif set(applied.changed) - set(deleted):
            report.updated.append(label)
        else:
            report.unchanged.append(label)
        report.deleted.extend(
            _("eval case %(set)s.%(case)s") % {"set": applied.eval_set.name, "case": key} for key in deleted
        )


def section_export() -> list[dict[str, Any]]:
    return [eval_set_document(s) for s in EvalSet.objects.select_related("agent").prefetch_related("cases")]
