from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class AgentsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "agents"
    verbose_name = _("Agents")

    def ready(self) -> None:
        from agents import (
            checks,  # noqa: F401 - registers the run lifecycle's system checks
            tasks,  # noqa: F401 - registers the Celery tasks, so agents.dispatch publishes them by name in any process
        )
        from agents.config_cache import agents_model_secrets
        from agents.rule_dependents import rules_left_failing_for_registry
        from agents.selectors import (
            agents_tool_name_problems,
            rules_refused_by_tool_contract,
            tool_names_taken_by_agents,
        )
        from agents.services import agents_frozen_before_registry_change, agents_publish_on_registry_change
        from mcpregistry.signals import (
            contract_rules_check,
            registry_contracts_changed,
            registry_contracts_frozen,
            secrets_elsewhere,
            tool_names_check,
            tool_names_taken,
            tool_rules_check,
        )

        # A contract edit publishes the agents that publish on save (mcpregistry cannot import agents).
        registry_contracts_changed.connect(
            agents_publish_on_registry_change, dispatch_uid="agents.publish_on_registry_change"
        )
        # ... only those whose frozen content the edit changed: read before it.
        registry_contracts_frozen.connect(
            agents_frozen_before_registry_change, dispatch_uid="agents.frozen_before_registry_change"
        )
        # A server's prefix changed or a tool switched on is refused where an agent would be offered two tools of
        # one name.
        tool_names_check.connect(agents_tool_name_problems, dispatch_uid="agents.tool_name_problems")
        # Discovery does not switch on a tool another server bound beside it already offers an agent by that name.
        tool_names_taken.connect(tool_names_taken_by_agents, dispatch_uid="agents.tool_names_taken")
        # A contract's save names the stored rules it leaves refused (the rule editor refuses them).
        contract_rules_check.connect(rules_refused_by_tool_contract, dispatch_uid="agents.rules_refused_by_contract")
        # A tool or server switched off, or its deletion's confirmation, names the rules left failing their runs.
        tool_rules_check.connect(rules_left_failing_for_registry, dispatch_uid="agents.rules_left_failing")
        # Discovery masks the agents' model keys as runs do (mcpregistry cannot read agents).
        secrets_elsewhere.connect(agents_model_secrets, dispatch_uid="agents.model_secrets")
