"""The strict document models of an eval set's parts, and their problems in the platform's words.

One rule for each part, read by everyone who takes it: the import (``evals.services.eval_set_apply``, its
``CaseDocument``), the admin's boxes and a case's own check (``evals.scoring.case_problems``, which the model's
``clean`` runs for the admin's form and the services alike). A case stored past one of them would no longer import
from its own export. No Django models here.
"""

from __future__ import annotations

from typing import Any

from django.utils.translation import gettext as _
from pydantic import BaseModel, ConfigDict, Field
from pydantic import ValidationError as PydanticValidationError


class StrictDocument(BaseModel):
    # ``allow_inf_nan=False``: "inf" and "NaN" (which a float field otherwise reads) are no JSON a column stores.
    # ``strict=True``: a value of the wrong JSON type is refused naming its field, as the admin's form refuses it
    # (its alternatives box by these very models, ``evals.services.alternatives_problems``), never converted (a
    # threshold ``true`` stored 1.0, ``"0.5"`` 0.5, ``"ordered": "yes"`` true, ``"order": true`` 1). A whole number
    # where a number is expected stays accepted (``{"recall": 1}`` is 1.0).
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


def _pydantic_problem(error: Any) -> str:
    """One pydantic error in the active language (the common kinds; any other in pydantic's English)."""
    ctx = error.get("ctx") or {}
    kind = error["type"]
    if kind == "string_too_short" and ctx.get("min_length") == 1:
        return _("must not be empty")
    messages = {
        "missing": _("required"),
        "extra_forbidden": _("not a known field"),
        "string_too_short": _("at least %(min_length)s characters"),
        "string_too_long": _("at most %(max_length)s characters"),
        "string_type": _("must be a text"),
        "int_type": _("must be a whole number"),
        "int_parsing": _("must be a whole number"),
        "int_from_float": _("must be a whole number"),
        "float_type": _("must be a number"),
        "float_parsing": _("must be a number"),
        "finite_number": _("must be a finite number"),
        "bool_type": _("must be true or false"),
        "bool_parsing": _("must be true or false"),
        "list_type": _("must be a list"),
        "dict_type": _("must be an object"),
        "model_type": _("must be an object"),
        "model_attributes_type": _("must be an object"),
        "greater_than_equal": _("must be at least %(ge)s"),
        "less_than_equal": _("must be at most %(le)s"),
    }
    message = messages.get(kind)
    if message is None:
        return str(error["msg"])
    try:
        return message % ctx if "%(" in message else message
    except (KeyError, TypeError, ValueError):
        return str(error["msg"])


def pydantic_problem_list(exc: PydanticValidationError) -> list[str]:
    """A pydantic error as ``where: what`` parts, in the active language."""
    return [f"{'.'.join(str(p) for p in e['loc'])}: {_pydantic_problem(e)}" for e in exc.errors()]


def pydantic_problems(exc: PydanticValidationError) -> str:
    """A pydantic error as ``where: what`` parts joined by ``; ``, in the active language."""
    return "; ".join(pydantic_problem_list(exc))


class CaseInputs(StrictDocument):
    """What a case hands its run besides the query, as an A2A caller gives it: ``context`` an object, ``data`` a
    list of objects (its data parts)."""

    context: dict[str, Any] = Field(default_factory=dict)
    data: list[dict[str, Any]] = Field(default_factory=list)


def case_input_problems(*, context: Any, data: Any) -> dict[str, list[str]]:
    """What ``CaseInputs`` refuses in a case's ``context`` and ``data``, by field, each as the import names it
    (``context: must be an object``, ``data.0: must be an object``), in the active language; empty when nothing."""
    try:
        CaseInputs.model_validate({"context": context, "data": data})
    except PydanticValidationError as exc:
        problems: dict[str, list[str]] = {}
        for error, text in zip(exc.errors(), pydantic_problem_list(exc), strict=True):
            problems.setdefault(str(error["loc"][0]), []).append(text)
        return problems
    return {}
