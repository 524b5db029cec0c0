"""A run's stored error message (English, as the engine and the workers write it) in the reader's language: the
admin's run pages, ``run_query``, and the A2A and MCP servers' failure texts read it through
:func:`error_message_text`."""

from __future__ import annotations

import re
from typing import Any

from django.utils.translation import gettext

from agents.answers import all_calls_failed_text_again
from agents.model_texts import model_failure_text_again
from agents.run_state import CONFIGURATION_UNREADABLE_MESSAGE
from audit.labels import actor_in_words

# Stored error messages of known codes (English, written by the engine and the workers), read back into the
# reader's language where their parameters can be; a cancellation's actor (stored as its code, ``admin:boss``) in
# words.
_KNOWN_MESSAGES: list[tuple[str, re.Pattern[str], Any]] = [
    (
        "cancelled",
        re.compile(r"cancelled by (?P<actor>.+)", re.S),
        lambda m: gettext("cancelled by %(actor)s") % {"actor": actor_in_words(m["actor"])},
    ),
    ("cancelled", re.compile(r"the run was cancelled"), lambda m: gettext("the run was cancelled")),
    (
        "max_iterations",
        re.compile(r"the agent did not finish within (?P<n>\d+) iterations"),
        lambda m: gettext("the agent did not finish within %(n)s iterations") % {"n": m["n"]},
    ),
    (
        "time_limit",
        re.compile(r"the run did not finish within its time limit \((?P<s>\d+) s\)"),
        lambda m: gettext("the run did not finish within its time limit (%(s)s s)") % {"s": m["s"]},
    ),
    (
        "time_limit",
        re.compile(r"the run did not finish within its time limit"),
        lambda m: gettext("the run did not finish within its time limit"),
    ),
    (
        "config:tool_name_conflict",
        re.compile(r"the agent's servers expose the same tool name\(s\): (?P<names>.+); set a tool name prefix", re.S),
        lambda m: (
            gettext("the agent's servers expose the same tool name(s): %(names)s; set a tool name prefix")
            % {"names": m["names"]}
        ),
    ),
    (
        "config:secret_unreadable",
        re.compile(re.escape(CONFIGURATION_UNREADABLE_MESSAGE)),
        lambda m: gettext(
            "a stored secret of the run's configuration cannot be decrypted: check SECRETS_ENCRYPTION_KEYS"
        ),
    ),
    (
        "worker_lost",
        re.compile(r"the worker running it was lost (?P<n>\d+) times"),
        lambda m: gettext("the worker running it was lost %(n)s times") % {"n": m["n"]},
    ),
    (
        "budget:run_ceiling",
        re.compile(r"the run used (?P<used>\d+) tokens, its budget reservation is (?P<ceiling>\d+)"),
        lambda m: (
            gettext("the run used %(used)s tokens, its budget reservation is %(ceiling)s")
            % {"used": m["used"], "ceiling": m["ceiling"]}
        ),
    ),
    (
        "budget:run_ceiling",
        re.compile(
            r"the run used (?P<used>\d+) tokens and its next model call may read (?P<bound>\d+); its budget "
            r"reservation is (?P<ceiling>\d+)"
        ),
        lambda m: (
            gettext(
                "the run used %(used)s tokens and its next model call may read %(bound)s; its budget reservation "
                "is %(ceiling)s"
            )
            % {"used": m["used"], "bound": m["bound"], "ceiling": m["ceiling"]}
        ),
    ),
    (
        "retries_exhausted",
        re.compile(r"(?P<n>\d+) passes met an error a retry can fix \(the last: (?P<error>\w+)\); not retried again"),
        lambda m: (
            gettext("%(n)s passes met an error a retry can fix (the last: %(error)s); not retried again")
            % {"n": m["n"], "error": m["error"]}
        ),
    ),
]


def error_message_text(code: str, message: str) -> str:
    """A run's stored error message in the reader's language where its code is known and its parameters can be
    read back from it; as stored otherwise. A rule run's ``deterministic:tool_failed`` is stored in the run's
    language, as its answer is said (``agents.answers.all_calls_failed_text``), and read back from any; so is a
    model failure's (``model:<kind>``: a failed call's, its provider's words kept, and a turn's its provider said was
    unfinished or that held nothing: ``agents.model_texts.model_failure_text_again``)."""
    code = code or ""
    if not isinstance(message, str):
        return message
    if code == "deterministic:tool_failed":
        return all_calls_failed_text_again(message or "") or message
    if code.startswith("model:"):
        return model_failure_text_again(code.removeprefix("model:"), message or "") or message
    for known, pattern, words in _KNOWN_MESSAGES:
        if code == known and (found := pattern.fullmatch(message or "")):
            return str(words(found))
    return message
