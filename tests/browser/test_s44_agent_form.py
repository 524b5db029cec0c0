"""The agent form in Chromium shows the inputs of the chosen provider: Bedrock and the offline model take no model
API key (Bedrock signs with the worker's AWS credentials), the offline model no model id; switching the provider
shows and hides them, and a row with an error stays shown."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.navigation import submit

pytestmark = pytest.mark.browser

KEY_ROWS = ("new_model_api_key", "model_api_key_from_env")


def _shown(browser: Any, name: str) -> bool:
    from selenium.webdriver.common.by import By

    return bool(browser.find_element(By.CSS_SELECTOR, f".form-row.field-{name}").is_displayed())


def test_the_key_and_model_id_show_for_the_providers_that_read_them(admin_in_browser: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser = admin_in_browser
    browser.get(f"{browser.base_url}/admin/agents/agent/add/")
    provider = Select(browser.find_element(By.NAME, "model_provider"))
    assert provider.first_selected_option.get_attribute("value") == "offline"
    assert not any(_shown(browser, name) for name in (*KEY_ROWS, "model_id"))
    assert _shown(browser, "model_params") and _shown(browser, "clear_model_api_key")

    provider.select_by_value("openai_compatible")
    assert all(_shown(browser, name) for name in (*KEY_ROWS, "model_id"))

    provider.select_by_value("bedrock")
    assert _shown(browser, "model_id") and not any(_shown(browser, name) for name in KEY_ROWS)

    # A key typed for OpenAI-compatible and the provider switched to Bedrock: refused, its row shown with why.
    provider.select_by_value("openai_compatible")
    browser.find_element(By.NAME, "slug").send_keys("keyed")
    browser.find_element(By.NAME, "name").send_keys("keyed")
    browser.find_element(By.NAME, "new_model_api_key").send_keys("sk-new-fedcba9876543210")
    provider.select_by_value("bedrock")
    submit(browser, browser.find_element(By.NAME, "_save"))
    assert "Bedrock takes no model API key" in browser.page_source
    assert _shown(browser, "new_model_api_key") and not _shown(browser, "model_api_key_from_env")


def test_the_model_parameters_example_is_a_flows_option_in_flow_mode(admin_in_browser: Any) -> None:
    """A flow reads only its options of the model parameters: the box showed a model's temperature as its example."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser = admin_in_browser
    browser.get(f"{browser.base_url}/admin/agents/agent/add/")
    box = browser.find_element(By.NAME, "model_params__lines")
    assert box.get_attribute("placeholder").startswith("temperature=0.2")
    mode = Select(browser.find_element(By.NAME, "mode"))
    mode.select_by_value("flow")
    assert box.get_attribute("placeholder") == "flow.mcp_id=sds-company-data"
    mode.select_by_value("react")
    assert box.get_attribute("placeholder").startswith("temperature=0.2")
