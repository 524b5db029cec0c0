from django.apps import AppConfig


class McpregistryConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "mcpregistry"
