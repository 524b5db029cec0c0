"""What the admin saves, import_config reads back (reviewer's defect 1): an agent's max iterations is held to
``MAX_ITERATIONS_LIMIT`` and a rule's order to 32 bits in the admin as in the import. The database (SQLite:
64 bits) took 99999999999, and the admin's own configuration then no longer imported."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.test import Client

from agents.configuration import config_export, config_import
from agents.models import MAX_ITERATIONS_LIMIT, TIME_LIMIT_MAX_S, Agent, DeterministicRule
from mcpregistry.models import CORRECTION_CAP_MAX, INT32_MAX, McpServer, ToolContract
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


def test_the_admin_refuses_a_time_limit_longer_than_an_import_takes(admin_client: Client) -> None:
    page = admin_client.post("/admin/agents/agent/add/", agent_post(time_limit_s="99999999999")).content.decode()
    assert f"Ensure this value is less than or equal to {TIME_LIMIT_MAX_S}." in _errors(page)
    assert not Agent.objects.exists()


@pytest.mark.parametrize(
    ("model", "field", "value", "bound"),
    [
        ("server", "breaker_threshold", 99_999_999_999, INT32_MAX),
        ("contract", "memo_ttl_s", 99_999_999_999, INT32_MAX),
        ("contract", "correction_cap", 101, CORRECTION_CAP_MAX),
    ],
)
def test_the_registrys_numbers_are_held_to_what_an_import_takes(
    demo_server: McpServer, model: str, field: str, value: int, bound: int
) -> None:
    # Every path that saves them validates the model (the admin's forms, the services): SQLite took 64 bits.
    target = demo_server if model == "server" else ToolContract.objects.get(tool__name="search_employee")
    setattr(target, field, value)
    with pytest.raises(ValidationError) as refused:
        target.full_clean()
    assert f"Ensure this value is less than or equal to {bound}." in refused.value.message_dict[field]
