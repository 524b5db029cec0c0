"""The words of a model failure, apart from the providers' SDKs: what a failure of each kind means, how many
times its call was sent, why a turn its provider said was unfinished (or that held nothing) failed the run, and
the stored text read back in a reader's language. The web's error texts (``agents.error_texts``) read them without
loading the SDKs (a test walks the web's imports)."""

from __future__ import annotations

import functools
import re
from typing import Literal, cast, get_args

from django.conf import settings
from django.utils import translation
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

ModelErrorKind = Literal["throttled", "timeout", "connection", "unavailable", "validation", "auth", "error"]
# A failure's kind: one a retry policy may name, or the conversation too long for the model's context window
# (``model:context_window``, as the same overflow told as a stop reason is), which is never sent again.
ModelFailureKind = Literal[ModelErrorKind, "context_window"]
# A model turn that failed the run though no call did: its provider said it was unfinished (cut off at its token
# limit, filtered, malformed; ``providers.UNFINISHED_TURN_CODES``, whose context window overflow is
# ``context_window``), or it held nothing (``model:empty``).
ModelStopKind = Literal["max_tokens", "content_filter", "malformed", "empty"]


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


def cut_at_token_limit_text() -> str:
    """Why a run whose model turn was cut off at its token limit failed (``model:max_tokens``), in the run's
    language."""
    return _(
        "The model's answer was cut off at its token limit: raise the agent's max_tokens (model parameters), or "
        "the token reservation of the run's budget."
    )


def unfinished_turn_text(code: str) -> str:
    """Why a run whose model turn its provider said was unfinished failed (``providers.UNFINISHED_TURN_CODES``), in
    the run's language."""
    if code == "model:context_window":
        return _(
            "The model's context window was full: the conversation, with the tools' results, and the answer's "
            "max_tokens are more than this model can read. Use a model with a larger context window, ask a "
            "narrower question, or lower max_tokens (model parameters)."
        )
    if code == "model:content_filter":
        return _(
            "The model provider's content filter stopped the model's answer, so none of it is used. Rephrase the "
            "question, or check the provider's content filter settings."
        )
    if code == "model:malformed":
        return _(
            "The model provider could not read the model's answer or tool call (it was malformed), so none of it "
            "was used. Running the query again may succeed; if it recurs, try another model."
        )
    return cut_at_token_limit_text()


def empty_turn_text(*, no_choice: bool) -> str:
    """Why a run whose last model turn held nothing failed (``model:empty``), in the run's language."""
    if no_choice:
        return _(
            "The model server's reply held no choice (its choices list was empty), so there was no answer to read; "
            "the tokens it reported are counted."
        )
    return _("The model gave no answer: its last turn held no text and asked for no tool.")


# The kinds of ``model:<kind>`` whose error message begins with a sentence of this module's: a failed call's, and
# a turn's that its provider said was unfinished or that held nothing.
_READ_BACK_KINDS: tuple[str, ...] = (*get_args(ModelErrorKind), "context_window", *get_args(ModelStopKind))


def _failure_sentences(kind: str) -> list[str]:
    """Every sentence a run's ``model:<kind>`` error message may begin with, in the active language, in the same
    order in every language (a stored one is read back by its place). Empty for a kind none is said for."""
    if kind == "empty":
        return [empty_turn_text(no_choice=True), empty_turn_text(no_choice=False)]
    if kind in {"context_window", *get_args(ModelStopKind)}:
        return [unfinished_turn_text(f"model:{kind}")]
    if kind in get_args(ModelErrorKind):
        return [model_failure_text(cast(ModelErrorKind, kind))]
    return []


def model_failure_text_again(kind: str, message: str) -> str | None:
    """A run's ``model:<kind>`` error message (in the run's language, any of ``settings.LANGUAGES``) in the active
    language: a reader of the run's error (``agents.error_texts``) reads it in theirs. Said so are a failed call's
    (``agents.engine.model_failure_message``: ``model_failure_text``'s sentence, or ``context_window``'s
    ``unfinished_turn_text``, then the provider's words, then ``attempts_text``'s tail) and a turn's that its
    provider said was unfinished or that held nothing (``unfinished_turn_text``, ``empty_turn_text``: the sentence
    alone). The provider's words are kept as stored. None where ``message`` is no text written for ``kind``."""
    for language, sentence, said_kind, place in _stored_failure_sentences():
        if said_kind != kind or (message != sentence and not message.startswith(sentence + " ")):
            continue
        detail, after = message[len(sentence) + 1 :], ""
        # The tail's count is its last number (the only one in each language's words for it).
        if counts := re.findall(r"\d+", detail):
            with translation.override(language):
                tail = attempts_text(int(counts[-1]))
            if detail == tail or detail.endswith(" " + tail):
                detail, after = detail[: -len(tail) - 1], attempts_text(int(counts[-1]))
        return " ".join(part for part in (_failure_sentences(said_kind)[place], detail, after) if part)
    return None


def _stored_failure_sentences() -> list[tuple[str, str, str, int]]:
    return _failure_sentences_in(tuple(code for code, _name in settings.LANGUAGES))


@functools.cache
def _failure_sentences_in(languages: tuple[str, ...]) -> list[tuple[str, str, str, int]]:
    """Each sentence ``_failure_sentences`` says for each of ``_READ_BACK_KINDS``, in each of the platform's
    languages, as (language, sentence, kind, its place in ``_failure_sentences(kind)``): the longest first, so a
    sentence that begins another is tried after it."""
    found: list[tuple[str, str, str, int]] = []
    for language in languages:
        with translation.override(language):
            for kind in _READ_BACK_KINDS:
                found += [(language, sentence, kind, place) for place, sentence in enumerate(_failure_sentences(kind))]
    return sorted(found, key=lambda said: -len(said[1]))
