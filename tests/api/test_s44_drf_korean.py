"""Django REST framework's own messages read in Korean with the particle a quoted value takes either way
(``은(는)``): DRF's catalogue glued 은 to any value ("APPROVE"은, "PUT"은)."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.conftest import ApiCaller

pytestmark = pytest.mark.django_db


def korean(caller: ApiCaller) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {caller.raw_key}", HTTP_ACCEPT_LANGUAGE="ko")


def test_a_choice_the_api_does_not_know_is_named_with_its_particle_in_korean(api_caller: ApiCaller) -> None:
    answer = korean(api_caller).get("/api/v1/runs", {"status": "FINISHED"})

    assert answer.status_code == 400, answer.content
    assert answer.json()["error"]["fields"]["status"] == ['"FINISHED"은(는) 유효한 선택지가 아닙니다.']


def test_a_method_the_api_does_not_take_is_named_with_its_particle_in_korean(api_caller: ApiCaller) -> None:
    answer = korean(api_caller).put("/api/v1/runs", "{}", content_type="application/json")

    assert answer.status_code == 405, answer.content
    assert answer.json()["error"]["message"] == '메서드 "PUT"은(는) 허용되지 않습니다.'
