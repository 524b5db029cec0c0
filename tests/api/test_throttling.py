"""Per-key rate limits, counted in Django's cache: 429 with Retry-After in the API's error shape."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from rest_framework.test import APIClient

from agents.api import throttling
from agents.api.throttling import Rate, api_key_rate_check, parse_rate
from agents.models import ApiKey
from agents.services import api_key_create

pytestmark = pytest.mark.django_db

URL = "/api/v1/runs"


@pytest.fixture(autouse=True)
def one_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """The windows are fixed, aligned to the clock: a test whose requests straddled a minute's end saw two
    windows (a 404 where a 429 was due). The limiter's clock is held in the middle of a minute (and of an hour)
    for each test; the tests that move through time pass ``now`` themselves."""
    now = time.time()
    held = now - now % 3600 + 1830.5
    monkeypatch.setattr(throttling, "time", SimpleNamespace(time=lambda: held))


def client_for(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def key_with_rate(rate: str, name: str = "limited") -> tuple[ApiKey, APIClient]:
    key, raw = api_key_create(actor="test", via="tests", name=name)
    ApiKey.objects.filter(pk=key.pk).update(rate=rate)
    key.refresh_from_db()
    return key, client_for(raw)


def test_a_key_past_its_own_rate_gets_a_429_with_retry_after() -> None:
    _key, client = key_with_rate("2/min")
    assert [client.get(URL).status_code for _ in range(2)] == [200, 200]
    response = client.get(URL)
    assert response.status_code == 429
    body = response.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == "throttled"
    assert 1 <= int(response["Retry-After"]) <= 60


def test_every_endpoint_counts_against_the_same_key(demo_agent) -> None:
    _key, client = key_with_rate("2/min")
    assert client.post(URL, {"agent": "company-assistant", "query": "hi"}, format="json").status_code == 202
    assert client.get(f"{URL}/00000000-0000-0000-0000-000000000000").status_code == 404
    assert client.get(f"{URL}/00000000-0000-0000-0000-000000000000/events").status_code == 429
    assert client.post(URL, {"agent": "company-assistant", "query": "hi"}, format="json").status_code == 429


def test_the_event_stream_answers_429_in_the_error_shape() -> None:
    _key, client = key_with_rate("1/min")
    client.get(URL)
    response = client.get(f"{URL}/00000000-0000-0000-0000-000000000000/events")
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "throttled"
    assert int(response["Retry-After"]) >= 1


def test_keys_are_counted_apart() -> None:
    _a, first = key_with_rate("1/min", "a")
    _b, second = key_with_rate("1/min", "b")
    assert first.get(URL).status_code == 200
    assert first.get(URL).status_code == 429
    assert second.get(URL).status_code == 200


def test_a_key_without_its_own_rate_gets_the_platform_default(settings) -> None:
    settings.PLATFORM_API_RATE = "1/min"
    _key, client = key_with_rate("")
    assert client.get(URL).status_code == 200
    assert client.get(URL).status_code == 429


def test_a_malformed_key_rate_falls_back_to_the_default(settings) -> None:
    settings.PLATFORM_API_RATE = "3/min"
    key, client = key_with_rate("lots")
    assert throttling.rate_for(key) == Rate(requests=3, period_s=60)
    assert [client.get(URL).status_code for _ in range(4)] == [200, 200, 200, 429]


def test_an_unauthenticated_request_is_a_401_not_a_429() -> None:
    assert APIClient().get(URL).status_code == 401


def test_the_window_ends_and_the_key_may_go_on() -> None:
    key, _client = key_with_rate("1/10s")
    assert api_key_rate_check(key, now=1000.0) is None
    assert api_key_rate_check(key, now=1001.0) == 9
    assert api_key_rate_check(key, now=1010.0) is None


def test_an_unreachable_cache_lets_requests_through(monkeypatch) -> None:
    _key, client = key_with_rate("1/min")

    def down(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise ConnectionError("redis is down")

    monkeypatch.setattr(throttling.cache, "add", down)
    assert [client.get(URL).status_code for _ in range(3)] == [200, 200, 200]


@pytest.mark.parametrize(
    ("text", "rate"),
    [
        ("60/min", Rate(60, 60)),
        ("1000/hour", Rate(1000, 3600)),
        ("5/s", Rate(5, 1)),
        ("5/10s", Rate(5, 10)),
        ("100/day", Rate(100, 86400)),
        (" 7 / minute ", Rate(7, 60)),
        ("0/min", None),
        ("1000/31d", Rate(1000, 31 * 86400)),
        # A window longer than a cache holds (Redis refuses the expiry: the throttle let every request through).
        ("1/32d", None),
        ("1/9999999999999999d", None),
        ("lots", None),
        ("60", None),
        ("", None),
    ],
)
def test_rates_are_parsed(text, rate) -> None:
    assert parse_rate(text) == rate
