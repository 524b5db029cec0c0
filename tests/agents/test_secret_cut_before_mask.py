"""A model failure's text cut to a length before it was masked: a secret straddling the cut lost its tail, and the
prefix left matched neither the secret's value nor any pattern, so the run's error message (shown on the admin's
run page and by the API) kept it. Held for the three places that cut: a provider's failed call
(``providers._detail``), a provider's refusal of the tools (``graph._bound``) and a Bedrock client that could not
be made (``providers._bedrock_client_problem``). Each now hands the text on whole; the engine masks, then cuts."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ProfileNotFound
from django.utils import translation

from agents import providers
from agents.graph import _bound
from agents.model_texts import attempts_text
from agents.models import Run
from agents.providers import ModelCallFailed, build_provider_model
from audit.masking import mask_text
from tests.agents.test_openai_compatible import openai_agent, submit
from tests.openai_server import ScriptedOpenAIServer

KEY = "gwkey-Zr8Kq2Wm5Tn7Xp4Lb9VdQ3xHj6"
# What a cut 20 characters into the key leaves: no secret's value, no pattern.
KEY_HEAD = KEY[:20]
OLD_CUT = 1000  # where the detail used to be cut, before the engine masked it


def straddling(prefix: str) -> str:
    """Padding and the key, so that after ``prefix`` the key starts 20 characters before the old cut."""
    return "p" * (OLD_CUT - len(prefix) - 20) + KEY


def shown(exc: BaseException) -> str:
    """What the engine stores of a model's failure: masked with the run's secrets, then cut."""
    return mask_text(str(exc), secrets=[KEY])[:2000]


@pytest.mark.slow
@pytest.mark.django_db
def test_a_provider_error_that_quotes_the_model_key_across_the_old_cut_shows_no_part_of_it(demo_server: Any) -> None:
    with ScriptedOpenAIServer([{"status": 400, "error": "MARK"}]).running() as server:
        agent = openai_agent(server, demo_server, retry={"backoff_s": 0})
        agent.model_secrets = {"api_key": KEY}
        agent.save()
        measured = submit(agent, "hi")
    prefix = measured.error_message.split("MARK")[0]  # the SDK's words before the server's message
    assert prefix and measured.error_code == "model:validation"

    with ScriptedOpenAIServer([{"status": 400, "error": straddling(prefix)}]).running() as server:
        agent.model_params = {**agent.model_params, "base_url": server.base_url}
        agent.save()
        run = submit(agent, "hi")
    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:validation")
    assert KEY_HEAD not in run.error_message and KEY_HEAD not in str(run.messages)
    assert "***" in run.error_message
    with translation.override(run.agent.language):  # the run's language: the platform's words in it
        assert run.error_message.endswith(attempts_text(1))


class _RefusesTools:
    """A chat model whose provider refuses the tools, quoting a secret in its refusal."""

    def __init__(self, refusal: str) -> None:
        self.refusal = refusal

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        raise ValueError(self.refusal)


def test_a_refusal_of_the_tools_that_quotes_a_secret_across_the_old_cut_shows_no_part_of_it() -> None:
    spec = {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}
    with pytest.raises(ModelCallFailed) as failed:
        _bound(_RefusesTools(straddling("ValueError: ")), [spec], None)  # type: ignore[arg-type]
    assert failed.value.code == "model:validation"
    assert KEY_HEAD not in shown(failed.value)
    assert "***" in shown(failed.value)


def test_a_bedrock_client_error_that_quotes_a_secret_across_the_old_cut_shows_no_part_of_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_client(*, region_name: str | None, timeout_s: float) -> Any:
        raise ProfileNotFound(profile=straddling("ProfileNotFound: The config profile ("))

    monkeypatch.setattr(providers, "bedrock_runtime_client", no_client)
    with pytest.raises(ValueError, match="could not be made on the worker") as failed:
        build_provider_model(provider="bedrock", model_id="m", params={"region_name": "us-east-1"}, api_key=None)
    assert KEY_HEAD not in shown(failed.value)
    assert "***" in shown(failed.value)
