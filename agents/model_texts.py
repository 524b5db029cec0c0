"""The words of a model failure, apart from the providers' SDKs: what a failure of each kind means, how many
times its call was sent, and the stored text read back in a reader's language. The web's error texts
(``agents.error_texts``) read them without loading the SDKs (a test walks the web's imports)."""

from __future__ import annotations

import functools
import re
from typing import Literal, get_args

from django.conf import settings
from django.utils import translation
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

ModelErrorKind = Literal["throttled", "timeout", "connection", "unavailable", "validation", "auth", "error"]
# A failure's kind: one a retry policy may name, or the conversation too long for the model's context window
# (``model:context_window``, as the same overflow told as a stop reason is), which is never sent again.
ModelFailureKind = Literal[ModelErrorKind, "context_window"]


def model_failure_text(kind: ModelFailureKind) -> str:
    """What a model failure of ``kind`` means, in the active language (the run's): the platform's sentence that
    comes before the provider's own words, which are in English, its SDK's."""
    texts: dict[str, str] = {
        "throttled": _("The model provider refused the call for its rate limit or quota."),
        "timeout": _("The model did not answer in time."),
        "connection": _("The model server could not be reached, or the connection to it broke off."),
        "unavailable": _("The model provider is unavailable: it answered with a server error."),
        "validation": _("The model provider refused the request: check the model id and the model parameters."),
        "auth": _(
            "The model provider refused the credentials: check the model's API key, or the worker's AWS "
            "credentials and their access to the model."
        ),
    }
    return texts.get(kind) or _("The model call failed.")


def attempts_text(attempts: int) -> str:
    """How many times the failed call was sent, in the active language: "(after 2 attempts)"."""
    return ngettext("(after %(count)d attempt)", "(after %(count)d attempts)", attempts) % {"count": attempts}


def model_failure_text_again(kind: str, message: str) -> str | None:
    """A message ``agents.engine.model_failure_message`` wrote for a failure of ``kind`` (in the run's language, any
    of ``settings.LANGUAGES``: ``model_failure_text``'s sentence, the provider's words, ``attempts_text``'s tail), in
    the active language: a reader of the run's error (``agents.error_texts``) reads it in theirs. The provider's
    words are kept as stored. None where ``message`` is no text it writes for ``kind``."""
    for language, sentence, said_kind in _stored_failure_sentences():
        if said_kind != kind or (message != sentence and not message.startswith(sentence + " ")):
            continue
        detail, after = message[len(sentence) + 1 :], ""
        # The tail's count is its last number (the only one in each language's words for it).
        if counts := re.findall(r"\d+", detail):
            with translation.override(language):
                tail = attempts_text(int(counts[-1]))
            if detail == tail or detail.endswith(" " + tail):
                detail, after = detail[: -len(tail) - 1], attempts_text(int(counts[-1]))
        return " ".join(part for part in (model_failure_text(said_kind), detail, after) if part)
    return None


@functools.cache
def _stored_failure_sentences() -> list[tuple[str, str, ModelErrorKind]]:
    """Each sentence ``model_failure_text`` says for a failure ``model_failure_message`` words with it (not
    ``context_window``'s, said as an unfinished turn is), in each of the platform's languages, as (language,
    sentence, kind)."""
    found: list[tuple[str, str, ModelErrorKind]] = []
    for language, _name in settings.LANGUAGES:
        with translation.override(language):
            found += [(language, model_failure_text(kind), kind) for kind in get_args(ModelErrorKind)]
    return found
