"""Top-K tool selection (seed 003 §5): offer the model the few tools that fit the query, not every schema.

Order of work: hard filters (the agent's ``servers`` and ``tags`` lists), then a ranker scores the remaining
tools against the query and the conversation so far, then the offer is built: pinned tools and the tools a
matched deterministic rule named are always in it, then the best ``top_k`` by score, then what a widening added
(a call to an existing tool that was not offered widens the next turn's offer, a bounded number of times).

Two rankers, one protocol (``score(text) -> {name: score}``):

* :class:`LexicalRanker`: BM25 over the tool's name (snake_case and camelCase split), description, argument
  names, admin-written tags and example queries. What a server wrote about its tool counts less than what an admin
  curated: a description's repeats past the second count for nothing, a tag counts more, and a question that says
  an admin's example query ranks its tool above the tools only server text matched (a wordy server's text must not
  take the offer from them). Korean has no spaces between a noun and its particle
  ("자산의", "자산을", "팀을"), so Hangul runs are indexed as syllables and syllable bigrams; a Hangul run written
  against latin letters or digits ("VPN이", "3월매출") is split from them; latin words as lower-cased words. Text
  is NFKC-normalised first: composed (Korean typed on macOS comes decomposed) and width-folded (a Korean IME's
  full-width mode types "ＶＰＮ" and "３월"). A tool the model knows by an alias (``agents.engine.model_tool_names``:
  ``직원.검색`` is offered as ``tool_66dde059``) is indexed by its own name. No network, no model; building the
  index for 300 tools takes a few milliseconds.
* :class:`EmbeddingRanker`: cosine similarity between the query's vector and the tools' vectors (computed at
  discovery, cached in the database: ``mcpregistry.embeddings``).

No ORM here: the engine hands in :class:`ToolDoc` values.
"""

from __future__ import annotations

import math
import re
import time
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent_platform.text import nfc
from mcpregistry.contracts import spec_message
from mcpregistry.embeddings import EmbeddingVectorError

__all__ = [
    "EmbeddingRanker",
    "LexicalRanker",
    "Ranker",
    "RankingError",
    "Selection",
    "ToolDoc",
    "ToolSelectionSettings",
    "select_tools",
    "tokens",
    "tool_selection_settings",
    "within_filters",
]


class ToolSelectionSettings(BaseModel):
    """An agent's ``tool_selection`` JSON (validated at the service boundary and when a run starts).

    ``enabled`` is off by default; when on, selection applies only when the agent has more than ``top_k``
    tools. ``force_first_tool`` is ``""`` (the model chooses), ``"any"`` (it must call some tool first) or a
    tool's name (it must call that one first); only providers that support ``tool_choice`` accept it.
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    top_k: int = Field(default=5, ge=1, le=64)
    ranker: Literal["lexical", "embedding"] = "lexical"
    pinned: list[str] = Field(default_factory=list)
    servers: list[str] = Field(default_factory=list)
    tags: list[str] = Field(default_factory=list)
    widen_step: int = Field(default=3, ge=1, le=64)
    max_widenings: int = Field(default=2, ge=0, le=10)
    force_first_tool: str = ""


def tool_selection_settings(raw: Any) -> ToolSelectionSettings:
    """The settings from an agent's stored JSON. Raises ``ValueError`` naming the bad field."""
    try:
        return ToolSelectionSettings.model_validate(raw or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "tool_selection"
        raise ValueError(f"{where}: {spec_message(first, ToolSelectionSettings)}") from exc


# The most a term of the server's own text (description, argument names) counts however often it is written
# there: a topic word said twice ("자산 ID로 자산의 상태") still tells, a request word listed over and over does
# not. An admin's tag counts more than that cap, so it outweighs the same word in any server's text.
SERVER_TF_CAP = 2
TAG_WEIGHT = 3
# How close a question must come to an admin's example query to be taken as saying it (see LexicalRanker).
EXAMPLE_MATCH = 0.6


@dataclass(frozen=True)
class ToolDoc:
    """What a ranker knows of one tool: the name the model sees (``name``, by which it is scored and offered) and
    the texts that describe it. ``own_name`` is the tool's own name where the model sees an alias of it."""

    name: str
    mcp_id: str = ""
    description: str = ""
    argument_names: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    example_queries: tuple[str, ...] = ()
    own_name: str = ""

    def weighted_terms(self) -> tuple[Counter[str], int]:
        """The index terms of the tool as the lexical ranker weighs them, and the length it normalises by.

        What the platform does not control is capped: a term of the description or of an argument name counts at
        most :data:`SERVER_TF_CAP` times however often the server wrote it, while the whole text still counts in
        the length, so a description stuffed with request words ("조회, 검색, 알려줘, 확인 …", over and over)
        gains nothing by the repeats and its length lowers what each of them scores. An admin's tag counts
        :data:`TAG_WEIGHT` times; the name's words twice (the tool's own name: an alias, ``tool_66dde059`` for
        ``직원.검색``, carries none of its words). Example queries count once each here, as written: they hold the
        request words too ("… 알려줘"), and weighed more would lift their tool for every question that has them;
        a question that says one is lifted by :class:`LexicalRanker` instead."""
        name_terms = Counter(tokens(split_identifier(self.own_name or self.name)))
        server_terms = tokens(" ".join([self.description, *(split_identifier(a) for a in self.argument_names)]))
        tag_terms = Counter(tokens(" ".join(self.tags)))
        example_terms = Counter(tokens(" ".join(self.example_queries)))
        weighted: Counter[str] = Counter(example_terms)
        for term, tf in name_terms.items():
            weighted[term] += 2 * tf
        for term, tf in Counter(server_terms).items():
            weighted[term] += min(tf, SERVER_TF_CAP)
        for term, tf in tag_terms.items():
            weighted[term] += TAG_WEIGHT * tf
        length = 2 * name_terms.total() + len(server_terms) + TAG_WEIGHT * tag_terms.total() + example_terms.total()
        return weighted, length


_HANGUL = re.compile(r"[\uac00-\ud7a3]+")
# A Hangul run, or a run of other letters and digits: "VPN이" is "VPN" and "이", "A1001번" is "A1001" and "번".
_WORD = re.compile(r"[\uac00-\ud7a3]+|[^\W_\uac00-\ud7a3]+", re.UNICODE)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_STOP = frozenset({"a", "an", "the", "of", "to", "in", "on", "for", "and", "or", "is", "are", "be", "by", "me", "my"})


def folded(text: str) -> str:
    """``text`` as the ranker compares it, queries and tools alike: NFKC, which composes Hangul (NFC's work) and
    folds width and other compatibility forms (full-width "ＶＰＮ" and "３월" as "VPN" and "3월", "①" as "1"). It
    also rewrites what ``agent_platform.text.nfc`` keeps (a compatibility ideograph, a compatibility jamo "ㅋ" as
    its conjoining twin): harmless here, both sides being folded the same way, and nothing folded is stored."""
    return text if unicodedata.is_normalized("NFKC", text) else unicodedata.normalize("NFKC", text)


def split_identifier(name: str) -> str:
    """``get_assetStatus`` → ``get asset status``."""
    return _CAMEL.sub(" ", name).replace("_", " ").replace("-", " ").replace(".", " ")


def tokens(text: str) -> list[str]:
    """Index terms of ``text`` (NFKC first, see :func:`folded`): lower-cased latin words and digits (a trailing
    plural ``s`` dropped, stop words out), split from Hangul written against them, and for each Hangul run its
    syllables and its syllable bigrams, so a one-syllable noun meets itself with a particle ("팀을" → 팀, 을, 팀을)."""
    terms: list[str] = []
    for word in _WORD.findall(split_identifier(folded(text))):
        if _HANGUL.fullmatch(word):
            terms.extend(word)
            terms.extend(word[i : i + 2] for i in range(len(word) - 1))
        else:
            lower = word.lower()
            if lower in _STOP:
                continue
            if len(lower) > 3 and lower.endswith("s") and not lower.endswith(("ss", "us", "is")):
                lower = lower[:-1]
            terms.append(lower)
    return terms


class RankingError(ValueError):
    """A ranker's input it cannot rank with (a query vector that is empty, not finite, or not of the tools'
    dimension). Its message says why in words safe for the trace (no text, no vector): :func:`select_tools` writes
    it as the fallback's reason (``embedding:query vector has 8 dimensions, tools have 256``)."""


class Ranker(Protocol):
    name: str

    def score(self, text: str) -> dict[str, float]:
        """Scores by tool name (higher is better); a tool with no score did not match at all."""
        ...


class LexicalRanker:
    """Okapi BM25 (k1=1.2, b=0.75) over :meth:`ToolDoc.weighted_terms`, with an inverted index so a query costs
    only its terms' postings; and a question that says an admin's example query lifts its tool above every tool
    the servers' text alone matched, however that text was written.

    A question says an example where the idf-weighted Dice coefficient of their term sets is at least
    :data:`EXAMPLE_MATCH` (1 for the same words; "재택근무 관련 규정 좀 찾아줘" says "재택근무 규정 찾아줘" at
    0.87, while two questions sharing only request words, "우리 팀 예산 목록 전부 알려줘" and "오늘 내가 할 일
    목록 좀 알려줘", meet at about 0.4): its tool's score gains the best BM25 score of the question times that
    coefficient."""

    name = "lexical"

    def __init__(self, docs: Iterable[ToolDoc], *, k1: float = 1.2, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self.postings: dict[str, list[tuple[str, int]]] = {}
        self.lengths: dict[str, int] = {}
        self.examples: dict[str, list[frozenset[str]]] = {}
        for doc in docs:
            counts, self.lengths[doc.name] = doc.weighted_terms()
            for term, tf in counts.items():
                self.postings.setdefault(term, []).append((doc.name, tf))
            examples = [frozenset(tokens(q)) for q in doc.example_queries]
            if any(examples):
                self.examples[doc.name] = [e for e in examples if e]
        n = max(len(self.lengths), 1)
        self.average_length = (sum(self.lengths.values()) / n) or 1.0
        self.idf = {t: math.log(1 + (n - len(p) + 0.5) / (len(p) + 0.5)) for t, p in self.postings.items()}
        self.unseen_idf = math.log(1 + (n + 0.5) / 0.5)  # a query term no tool has: as rare as a term can be

    def score(self, text: str) -> dict[str, float]:
        query = Counter(tokens(text))
        scores: dict[str, float] = {}
        for term, qtf in query.items():
            postings = self.postings.get(term)
            if not postings:
                continue
            idf = self.idf[term]
            for name, tf in postings:
                norm = self.k1 * (1 - self.b + self.b * self.lengths[name] / self.average_length)
                scores[name] = scores.get(name, 0.0) + qtf * idf * tf * (self.k1 + 1) / (tf + norm)
        best = max(scores.values(), default=0.0)
        terms = frozenset(query)
        for name, examples in self.examples.items():
            match = max(self._match(terms, example) for example in examples)
            if match >= EXAMPLE_MATCH:
                scores[name] = scores.get(name, 0.0) + best * match
        return scores

    def _match(self, query: frozenset[str], example: frozenset[str]) -> float:
        """How far ``query`` says ``example`` (term sets): 1 for the same terms, 0 for none shared; a rare term
        shared counts more than a particle or a request word ("알려줘") shared."""
        weight = sum(self.idf.get(t, self.unseen_idf) for t in query) + sum(self.idf[t] for t in example)
        shared = sum(self.idf[t] for t in query & example)
        return 2 * shared / weight if weight else 0.0


@runtime_checkable
class ToolVectorSource(Protocol):
    """A query embedder that can also embed the tools again (``mcpregistry.embeddings.QueryEmbedder``)."""

    def __call__(self, text: str) -> Sequence[float]: ...

    def tool_vectors(self, dimensions: int) -> Mapping[str, Sequence[float]]:
        """The tools' vectors as the service answers them now, of ``dimensions`` (those cached of another
        embedded again). Raises when the service fails or answers what is no such vector."""
        ...


class EmbeddingRanker:
    """Cosine similarity of the query's vector to each tool's cached vector (checked by
    ``mcpregistry.embeddings``: finite, of one dimension). ``embed_query`` may fail (a provider outage) or answer
    what is not a vector of the tools' dimension (:class:`RankingError`, never zipped short nor scored NaN):
    :func:`select_tools` then falls back to the lexical ranker and says so. A query's vector of another dimension
    than the tools' is first taken as the service's new model: an ``embed_query`` that can
    (:class:`ToolVectorSource`) has the tools embedded again, and they are ranked with; only if that fails, or
    still disagrees, does the run fall back (the cached vectors were otherwise never embedded again, as no tool's
    text had changed, and every run fell back for good)."""

    name = "embedding"

    def __init__(self, vectors: Mapping[str, Sequence[float]], embed_query: Callable[[str], Sequence[float]]) -> None:
        self._use(vectors)
        self.embed_query = embed_query

    def _use(self, vectors: Mapping[str, Sequence[float]]) -> None:
        self.vectors = {name: _unit(v) for name, v in vectors.items() if v}
        self.dimensions = {len(v) for v in self.vectors.values()}

    def score(self, text: str) -> dict[str, float]:
        raw: Any = self.embed_query(text)  # the service's answer, whatever its type says
        if not isinstance(raw, Sequence) or isinstance(raw, str):
            raise RankingError("query vector is not a list of numbers")
        if not raw:
            raise RankingError("query vector is empty")
        if not all(isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in raw):
            raise RankingError("query vector has a value that is not a finite number")
        if self.dimensions - {len(raw)} and isinstance(self.embed_query, ToolVectorSource):
            self._use(self.embed_query.tool_vectors(len(raw)))
        if self.dimensions - {len(raw)}:
            tools = " or ".join(str(d) for d in sorted(self.dimensions))
            raise RankingError(f"query vector has {len(raw)} dimensions, tools have {tools}")
        query = _unit(raw)
        scores = {name: sum(a * b for a, b in zip(query, v, strict=True)) for name, v in self.vectors.items()}
        if not all(math.isfinite(s) for s in scores.values()):
            raise RankingError("a tool vector has a value that is not a finite number")
        return scores


def _unit(vector: Sequence[float]) -> list[float]:
    norm = math.hypot(*vector) or 1.0  # hypot: no overflow to inf for large finite values
    return [x / norm for x in vector]


@dataclass
class Selection:
    """What one model turn is offered, each tool with its score and why it is in the offer."""

    offered: list[str]
    scores: dict[str, float]
    reasons: dict[str, str]
    ranker: str
    candidates: int
    fallback: str = ""
    elapsed_ms: float = 0.0
    # The named first tool this turn was to force and could not (``{"tool", "why"}``, why one of
    # ``filtered_out``, ``withdrawn``, ``not_a_tool``): the run goes on unforced, and its trace says so (a rule
    # stored before the check of its forced tool against the agent's filters would otherwise go unnoticed).
    forced_dropped: dict[str, str] | None = None
    # The offered tools' docs by the name the model sees: the trace names each tool by its own name and server too.
    docs: Mapping[str, ToolDoc] = field(default_factory=dict)

    def as_trace(self, turn: int) -> dict[str, Any]:
        """The trace entry (and ``tool_selection`` event) of one turn's selection: each offered tool by the name the
        model was offered it by (``name``), its own name (``tool``, never an alias: ``직원.검색``, not
        ``tool_66dde059``) and server (``mcp_id``), why it is offered, and its score where a ranker ran."""
        offered: list[dict[str, Any]] = []
        for name in self.offered:
            tool: dict[str, Any] = {"name": name}
            doc = self.docs.get(name)
            if doc is not None:
                tool.update(tool=doc.own_name or doc.name, mcp_id=doc.mcp_id)
            if self.ranker != "none":  # no ranker ran: no tool has a score
                tool["score"] = round(self.scores.get(name, 0.0), 4)
            tool["why"] = self.reasons[name]
            offered.append(tool)
        entry: dict[str, Any] = {
            "type": "tool_selection",
            "turn": turn,
            "ranker": self.ranker,
            "candidates": self.candidates,
            "offered": offered,
            "selection_ms": round(self.elapsed_ms, 3),
        }
        if self.fallback:
            entry["fallback"] = self.fallback
        if self.forced_dropped:
            entry["forced_dropped"] = self.forced_dropped
        return entry


@dataclass
class WideningState:
    """Tools the model asked for that were not offered: added to the next offers, at most ``max_widenings``
    times in a run."""

    widenings: int = 0
    extra: list[str] = field(default_factory=list)


def within_filters(doc: ToolDoc, settings: ToolSelectionSettings) -> bool:
    """Whether ``doc`` passes the settings' hard filters (``servers``, ``tags``): a tool outside them is never
    offered, so no call to it widens an offer. Tags compare composed (NFC) on both sides, as the ranker reads them:
    a tag typed decomposed (macOS) on the tool or in the filter is the same tag, and the filter must not leave the
    model no tool at all."""
    if settings.servers and doc.mcp_id not in settings.servers:
        return False
    return not settings.tags or bool({nfc(t) for t in settings.tags} & {nfc(t) for t in doc.tags})


def select_tools(
    *,
    ranker: Ranker,
    text: str,
    candidates: Sequence[ToolDoc],
    settings: ToolSelectionSettings,
    always: Sequence[tuple[str, str]] = (),
    widening: WideningState | None = None,
    fallback_ranker: Ranker | None = None,
    must_propagate: tuple[type[BaseException], ...] = (),
) -> Selection:
    """The offer for one model turn. ``always`` holds ``(name, why)`` pairs offered whatever their score
    (rule-named tools, tools already called in this run, a failed tool's fallback); pinned tools come from
    ``settings``. Tools outside the hard filters are never offered, pinned or not (tags compared composed, NFC).
    When no more tools than ``top_k`` pass the filters, all of them are offered unranked (the trace's ranker is
    ``none``, the tools not offered for another reason are ``why: all``, none with a score): no ranker is asked,
    so no embedding service is called for nothing. A ranker's failure hands over to ``fallback_ranker`` (the
    Selection's ``fallback`` says why), except for the ``must_propagate`` errors."""
    started = time.perf_counter()
    allowed = [d for d in candidates if within_filters(d, settings)]
    allowed_names = {d.name for d in allowed}
    k = settings.top_k + (settings.widen_step * widening.widenings if widening else 0)
    used_ranker: str = ranker.name
    fallback = ""
    scores: dict[str, float] = {}
    if len(allowed) <= k:
        used_ranker = "none"
    else:
        try:
            scores = ranker.score(text)
        except must_propagate:
            raise
        except Exception as exc:  # an embedding outage must not end the run: lexical takes over
            if fallback_ranker is None:
                raise
            # Words safe for the trace: a ranker's own, the embedding module's about a vector (no text, no vector).
            why = str(exc) if isinstance(exc, RankingError | EmbeddingVectorError) else type(exc).__name__
            used_ranker, fallback = fallback_ranker.name, f"{ranker.name}:{why}"
            scores = fallback_ranker.score(text)
    offered: list[str] = []
    reasons: dict[str, str] = {}

    def add(name: str, why: str) -> None:
        if name in allowed_names and name not in reasons:
            offered.append(name)
            reasons[name] = why

    for name in settings.pinned:
        add(name, "pinned")
    for name, why in always:
        add(name, why)
    # A tool the model asked for is "widened" even where it also ranks: that is why the model has it now.
    for name in widening.extra if widening else []:
        add(name, "widened")
    ranked = sorted((d.name for d in allowed), key=lambda n: (-scores.get(n, 0.0), n))
    # Where every allowed tool fits no ranker ran: the rest are offered as "all", not as ranked with no score.
    for name in ranked[:k]:
        add(name, "all" if used_ranker == "none" else "ranked")
    docs = {d.name: d for d in allowed}
    return Selection(
        offered=offered,
        scores={n: scores.get(n, 0.0) for n in offered},
        reasons=reasons,
        ranker=used_ranker,
        candidates=len(allowed),
        fallback=fallback,
        elapsed_ms=(time.perf_counter() - started) * 1000,
        docs={n: docs[n] for n in offered},
    )
