"""The schema endpoint's errors in the API's one error shape: rendered as the schema (YAML), their bodies were
replaced by the generic "The request failed (HTTP 405)."; ``?format=xml`` was DRF's bare 404."""

from __future__ import annotations

import pytest
from django.test import Client


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("method", "url", "status", "code"),
    [
        ("post", "/api/v1/schema/", 405, "method_not_allowed"),
        ("get", "/api/v1/schema/?format=xml", 400, "invalid_input"),
        ("get", "/api/v1/schema/?" + "&".join(f"p{i}=1" for i in range(1_100)), 400, "too_many_fields"),
    ],
)
def test_the_schemas_errors_say_what_was_wrong(method: str, url: str, status: int, code: str) -> None:
    response = getattr(Client(), method)(url)
    assert response.status_code == status and response["Content-Type"].startswith("application/json")
    error = response.json()["error"]
    assert error["code"] == code and "The request failed" not in error["message"]


@pytest.mark.django_db
@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_the_schema_is_still_served_in_either_format(fmt: str) -> None:
    response = Client().get(f"/api/v1/schema/?format={fmt}")
    assert response.status_code == 200 and b"openapi" in response.content
