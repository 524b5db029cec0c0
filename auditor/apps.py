from django.apps import AppConfig


class AuditorConfig(AppConfig):
    """The auditor's workspace: the audit record joined with runs, agents and API keys (the admin's audit list and
    metrics, and ``/api/v1/audit/``). It sits above the apps, so the audit core stays a leaf."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "auditor"
