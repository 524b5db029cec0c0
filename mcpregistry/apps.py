from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class McpregistryConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "mcpregistry"
    verbose_name = _("MCP registry")
