"""What an eval run's pages say in words: a case's failed checks (``tools:mismatch``, ``contains:팀``) and the
thresholds a run missed (``recall 0.6 < 0.75``), each with its code beside it for whoever searches for it."""

from __future__ import annotations

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext, gettext_lazy

from audit.labels import breakable
from evals.scoring import NOT_JUDGED, NOT_SUBMITTED, REGEX_REFUSED, answer_regex_refusal

# A case's type in words (``CASE_TYPES``): the eval set's page offers each with its code, the run's pages show
# each with its code beneath it.
CASE_TYPE_NAMES = {
    "single_tool": gettext_lazy("one tool"),
    "multi_tool": gettext_lazy("several tools"),
    "no_tool": gettext_lazy("no tool needed"),
    "no_answer": gettext_lazy("no answer exists: it must say it does not know"),
    "guardrail": gettext_lazy("a request it must refuse"),
    "rag": gettext_lazy("answered from a document"),
}

# The scores a summary holds, as the run's page and the comparison name them.
SCORE_LABELS = {
    "pass_rate": gettext_lazy("pass rate"),
    "precision": gettext_lazy("tool precision"),
    "recall": gettext_lazy("tool recall"),
    "sequence_match": gettext_lazy("exact sequence"),
    "forbidden_violations": gettext_lazy("forbidden-tool violations"),
    "argument_match": gettext_lazy("argument match"),
    "answer_checks": gettext_lazy("answer checks"),
    "latency_p50_ms": gettext_lazy("latency p50 (ms)"),
    "latency_p95_ms": gettext_lazy("latency p95 (ms)"),
    "tokens": gettext_lazy("tokens"),
    "model_calls": gettext_lazy("model calls"),
    "model_calls_saved": gettext_lazy("model calls saved by rules"),
}

_CHECKS = {
    "run:failed": gettext_lazy("the run failed"),
    "tools:forbidden": gettext_lazy("called a tool it must not"),
    "tools:mismatch": gettext_lazy("not the expected tools"),
    "tools:order": gettext_lazy("the expected tools in another order"),
    "tools:args": gettext_lazy("not the expected arguments"),
    "eval:timeout": gettext_lazy("stopped at the eval's time limit"),
    "eval:cancelled": gettext_lazy("not scored: its eval run was cancelled"),
    "dont_know": gettext_lazy("the answer does not say it does not know"),
}


def check_label(code: str) -> str:
    """A failed check in words; an answer check names what the answer lacked, or why its regex was refused; an
    unknown code as it is."""
    kind, _colon, detail = code.partition(":")
    if code in _CHECKS:
        return str(_CHECKS[code])
    if kind == "contains" and detail:
        return gettext("the answer lacks “%(text)s”") % {"text": detail}
    if kind == "regex" and detail:
        return gettext("the answer does not match %(pattern)s") % {"pattern": detail}
    if code.startswith(REGEX_REFUSED) and code != REGEX_REFUSED:
        # Why, told again as it is read: the code holds the pattern, not words in the language of its scoring.
        pattern = code[len(REGEX_REFUSED) :]
        return gettext("the check's regex %(pattern)s is refused: %(why)s") % {
            "pattern": pattern,
            "why": answer_regex_refusal(pattern) or gettext("it did not compile when the case was scored"),
        }
    if code.startswith(NOT_SUBMITTED) and code != NOT_SUBMITTED:
        return gettext("the case could not become a run (%(reason)s)") % {"reason": code[len(NOT_SUBMITTED) :]}
    return code


def checks_html(codes: list[str]) -> SafeString:
    """Each failed check in words with its code small beside it, one per line."""
    return format_html_join(
        "",
        '<span class="eval-check">{} <code class="eval-code">{}</code></span>',
        ((check_label(code), breakable(code)) for code in codes),
    )


def threshold_html(failure: str) -> SafeString:
    """``recall 0.6 < 0.75`` as the score's name in words, its value and limit, and the score's key; a threshold
    not judged (``answer_checks not_judged 0.9``: no case measured its score) said so, with its limit."""
    parts = failure.split(" ")
    if len(parts) == 3 and parts[0] in SCORE_LABELS and parts[1] == NOT_JUDGED:
        return format_html(
            '{} <code class="eval-code">{}</code>',
            gettext("%(score)s (limit %(limit)s): not judged, no case measured it")
            % {"score": SCORE_LABELS[parts[0]], "limit": parts[2]},
            parts[0],
        )
    if len(parts) != 4 or parts[0] not in SCORE_LABELS or parts[2] not in ("<", ">"):
        return format_html("{}", failure)
    name, value, relation, limit = parts
    return format_html(
        '{} {} {} {} <code class="eval-code">{}</code>', SCORE_LABELS[name], value, relation, limit, name
    )
