from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class EvalsConfig(AppConfig):
    """Eval sets (fixed questions scored by the tools a run called) and their runs. It sits above agents: an eval
    case runs through the normal run path (``agents.services.run_create``) with ``purpose="eval"``."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "evals"
    verbose_name = _("Evaluations")
