"""What the admin saves, import_config reads back (reviewer's defect 1): an agent's max iterations is held to
``MAX_ITERATIONS_LIMIT`` and a rule's order to 32 bits in the admin as in the import. The database (SQLite:
64 bits) took 99999999999, and the admin's own configuration then no longer imported."""

from __future__ import annotations

import pytest
from django.test import Client

from agents.configuration import config_export, config_import
from agents.models import MAX_ITERATIONS_LIMIT, Agent, DeterministicRule
from mcpregistry.models import INT32_MAX
from tests.agents.test_agent_form import _errors, agent_post
from tests.agents.test_rule_editor import errors, ledger, rule_post  # noqa: F401 (ledger: a fixture)

pytestmark = pytest.mark.django_db


def test_the_admin_refuses_more_iterations_than_an_import_takes(admin_client: Client) -> None:
    page = admin_client.post("/admin/agents/agent/add/", agent_post(max_iterations="99999999999")).content.decode()
    assert f"Ensure this value is less than or equal to {MAX_ITERATIONS_LIMIT}." in _errors(page)
    assert not Agent.objects.exists()


@pytest.mark.parametrize(
    ("order", "message"),
    [
        ("99999999999999", f"Ensure this value is less than or equal to {INT32_MAX}."),
        ("-99999999999999", f"Ensure this value is greater than or equal to {-INT32_MAX - 1}."),
    ],
)
def test_the_admin_refuses_a_rule_order_past_32_bits(
    admin_client: Client,
    ledger: Agent,  # noqa: F811 - the fixture
    order: str,
    message: str,
) -> None:
    page = admin_client.post("/admin/agents/deterministicrule/add/", rule_post(ledger, order=order)).content.decode()
    assert message in errors(page)
    assert not DeterministicRule.objects.exists()


def test_the_largest_values_the_admin_saves_export_and_import_again(
    admin_client: Client,
    ledger: Agent,  # noqa: F811 - the fixture
) -> None:
    response = admin_client.post("/admin/agents/deterministicrule/add/", rule_post(ledger, order=str(INT32_MAX)))
    assert response.status_code == 302, errors(response.content.decode())
    Agent.objects.filter(pk=ledger.pk).update(max_iterations=MAX_ITERATIONS_LIMIT)
    config_import(actor="t", document=config_export())  # raises where the import refuses what the admin saved
