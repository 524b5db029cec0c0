from django.apps import AppConfig, apps
from django.db.models.signals import m2m_changed


class AuditConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "audit"

    def ready(self) -> None:
        from audit import roles
        from audit.change_guard import ChangeAudit, m2m_changed_guard, policy_of

        roles.connect()
        # Many-to-many changes of a configuration model (an agent's servers, a key's agents) are writes too.
        for model in apps.get_models():
            if isinstance(getattr(model, "change_audit", None), ChangeAudit) and policy_of(model) is not None:
                for m2m in model._meta.many_to_many:
                    m2m_changed.connect(
                        m2m_changed_guard,
                        sender=m2m.remote_field.through,
                        dispatch_uid=f"audit.guard.{model._meta.label}.{m2m.name}",
                    )
