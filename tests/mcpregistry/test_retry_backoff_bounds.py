"""A contract's retry backoff base above its cap is refused, naming both (reviewer's defect 7): it was accepted
and never used, since the cap wins from the first wait on."""

from __future__ import annotations

import pytest
from pydantic import ValidationError as PydanticValidationError

from mcpregistry.contracts import RetrySpec, spec_problems


def test_a_base_above_the_cap_is_refused_naming_both() -> None:
    with pytest.raises(PydanticValidationError) as caught:
        RetrySpec.model_validate({"backoff_base_s": 30, "backoff_cap_s": 5})
    [problem] = spec_problems(caught.value, RetrySpec, prefix="retry")
    assert problem == (
        "retry: backoff_base_s (30 s) is greater than backoff_cap_s (5 s): every wait would be the cap; lower the "
        "base or raise the cap"
    )


def test_a_base_above_the_default_cap_names_the_default() -> None:
    with pytest.raises(PydanticValidationError, match=r"backoff_base_s \(10 s\) is greater than backoff_cap_s \(8 s\)"):
        RetrySpec.model_validate({"backoff_base_s": 10})


@pytest.mark.parametrize("retry", [{"backoff_base_s": 4, "backoff_cap_s": 4}, {"backoff_base_s": 0.01}, {}])
def test_a_base_within_the_cap_is_taken(retry: dict[str, float]) -> None:
    RetrySpec.model_validate(retry)
