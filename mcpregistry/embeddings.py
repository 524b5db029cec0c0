"""Tool vectors for the embedding tool ranker (``agents.tool_selection.EmbeddingRanker``).

The embedding service is named by ``PLATFORM_EMBEDDINGS_URL`` + ``PLATFORM_EMBEDDINGS_MODEL``: an
OpenAI-compatible ``/embeddings`` endpoint (the ``openai`` client, key from ``PLATFORM_EMBEDDINGS_API_KEY`` in
the environment, never the database), or ``bedrock`` as the URL for Bedrock embeddings through langchain-aws.
A tool's vector is computed at discovery and cached in ``ToolEmbedding`` keyed by the digest of the embedded
text, so it is recomputed only when the description, arguments, tags or example queries change. Every vector is
checked where it enters (the service's answer, the cache read): a non-empty list of finite numbers, all of one
dimension (:func:`embedding_vectors`), so a NaN or a vector of another model is never stored nor ranked with.
Failures are logged and never fail a discovery or a run: the ranker is then unavailable and selection falls back to
BM25.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import DatabaseError

from agent_platform.text import nfc
from mcpregistry.models import McpTool, ToolEmbedding

logger = logging.getLogger(__name__)

Embedder = Callable[[list[str]], list[list[float]]]


class EmbeddingVectorError(ValueError):
    """A vector the embedding service answered, or the cache holds, that cannot be ranked with. Its message says
    why in words safe for a run's trace (no text, no vector): the ranker's fallback reason."""


def embedding_vectors(raw: Any, *, count: int, dimensions: int | None = None) -> list[list[float]]:
    """``raw`` (tools' vectors) as ``count`` vectors, each a non-empty list of finite numbers, all of one
    dimension (``dimensions`` where given). Raises :class:`EmbeddingVectorError` otherwise: a NaN stored would
    make the cache unreadable as JSON, and an empty or shorter vector would rank every tool the same or on a
    truncated vector, silently."""
    if not isinstance(raw, list) or len(raw) != count:
        answered = len(raw) if isinstance(raw, list) else 0
        raise EmbeddingVectorError(f"embedding service answered {answered} vectors for {count} texts")
    vectors: list[list[float]] = []
    for vector in raw:
        if not isinstance(vector, list | tuple) or not vector:
            raise EmbeddingVectorError("tool vector is empty")
        if not all(isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in vector):
            raise EmbeddingVectorError("tool vector has a value that is not a finite number")
        if dimensions is not None and len(vector) != dimensions:
            raise EmbeddingVectorError(f"tool vector has {len(vector)} dimensions, other tools have {dimensions}")
        dimensions = len(vector)
        vectors.append([float(x) for x in vector])
    return vectors


def tool_embedding_text(tool: McpTool) -> str:
    """What is embedded for a tool: its name, description, argument names, tags and example queries, composed
    (NFC) as the query is (:func:`embedding_ranker_setup`): a server's description or an example query written
    decomposed (Korean typed on macOS) would embed far from the same words composed."""
    arguments = " ".join(str(a) for a in ((tool.input_schema or {}).get("properties") or {}))
    parts = [tool.name.replace("_", " "), tool.description or "", arguments, " ".join(tool.tags or [])]
    return nfc("\n".join(p for p in [*parts, *(tool.example_queries or [])] if p))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def bedrock_embeddings_client() -> Any:
    """The ``bedrock-runtime`` client for embeddings, credentials and region from boto3's standard chain."""
    import boto3

    return boto3.client("bedrock-runtime")


def embedding_service_configured() -> bool:
    """Whether the settings name an embedding service (``PLATFORM_EMBEDDINGS_URL`` and ``_MODEL``)."""
    return bool(settings.PLATFORM_EMBEDDINGS_URL and settings.PLATFORM_EMBEDDINGS_MODEL)


def configured_embedder() -> tuple[str, Embedder] | None:
    """(model name, embed function) from the settings, or None when no embedding service is configured. May
    raise while building the client (a Bedrock client with no region): ``embedding_ranker_setup`` catches it."""
    url, model = settings.PLATFORM_EMBEDDINGS_URL, settings.PLATFORM_EMBEDDINGS_MODEL
    if not url or not model:
        return None
    if url == "bedrock":
        from langchain_aws import BedrockEmbeddings

        client = BedrockEmbeddings(model_id=model, client=bedrock_embeddings_client())
        return f"bedrock:{model}", lambda texts: [list(v) for v in client.embed_documents(texts)]
    from openai import OpenAI

    client_openai = OpenAI(
        base_url=url,
        api_key=os.environ.get("PLATFORM_EMBEDDINGS_API_KEY") or "unused",
        timeout=settings.PLATFORM_EMBEDDINGS_TIMEOUT_S,
        max_retries=1,
    )

    def embed(texts: list[str]) -> list[list[float]]:
        response = client_openai.embeddings.create(model=model, input=texts)
        return [list(item.embedding) for item in sorted(response.data, key=lambda d: d.index)]

    return model, embed


def tool_embeddings_refresh(
    tools: Sequence[McpTool], *, embedder: tuple[str, Embedder] | None = None, dimensions: int | None = None
) -> int:
    """Compute the vectors of ``tools`` whose cached one is missing or stale. Returns how many were computed;
    0 when no service is configured. Raises the embedding client's error, or :class:`EmbeddingVectorError` for an
    answer that is not a vector (nothing of that answer is stored; callers decide whether it matters).

    Stale: its text changed, or the cached vector is not one (empty, not finite), or the cached vectors disagree
    on their dimension, or the service now answers vectors of another dimension than the cached ones (the model
    behind the URL changed while ``PLATFORM_EMBEDDINGS_MODEL`` did not): then every tool is embedded again.
    ``dimensions``: the dimension the service is known to answer now (a query's vector said so, where no tool's text
    changed to tell): a cached vector of another is stale, and an answer of another is refused."""
    embedder = embedder or configured_embedder()
    if embedder is None or not tools:
        return 0
    model, embed = embedder
    cached = {e.tool_id: e for e in ToolEmbedding.objects.filter(tool__in=list(tools), model=model)}
    stale: list[tuple[McpTool, str]] = []
    kept: list[tuple[McpTool, str, int]] = []
    for tool in tools:
        text = tool_embedding_text(tool)
        entry = cached.get(tool.pk)
        if (
            entry is None
            or entry.text_digest != _digest(text)
            or not _usable(entry.vector)
            or (dimensions is not None and len(entry.vector) != dimensions)
        ):
            stale.append((tool, text))
        else:
            kept.append((tool, text, len(entry.vector)))
    if len({dimensions for _tool, _text, dimensions in kept}) > 1:
        stale, kept = stale + [(tool, text) for tool, text, _dimensions in kept], []
    if not stale:
        return 0
    vectors = embedding_vectors(embed([text for _tool, text in stale]), count=len(stale), dimensions=dimensions)
    outdated = [(tool, text) for tool, text, dimensions in kept if dimensions != len(vectors[0])]
    if outdated:
        more = embed([text for _tool, text in outdated])
        vectors += embedding_vectors(more, count=len(outdated), dimensions=len(vectors[0]))
        stale += outdated
    for (tool, text), vector in zip(stale, vectors, strict=True):
        ToolEmbedding.objects.update_or_create(
            tool=tool, model=model, defaults={"text_digest": _digest(text), "vector": vector}
        )
    return len(stale)


def _usable(vector: Any) -> bool:
    try:
        embedding_vectors([vector], count=1)
    except EmbeddingVectorError:
        return False
    return True


def refresh_after_discovery(tools: Sequence[McpTool]) -> None:
    """Discovery's hook: refresh the vectors, logging (never raising) a failure of the embedding service."""
    try:
        tool_embeddings_refresh(tools)
    except Exception as exc:  # noqa: BLE001 - an embedding outage must not fail a discovery
        logger.warning("tool embeddings not refreshed: %s", type(exc).__name__)


@dataclass(frozen=True)
class RankerInputs:
    """What the embedding ranker needs (the tools' vectors by the name the model sees, the query embedder), or
    why it cannot be had: ``unavailable`` is ``"not_configured"``, the failure's class name, or what is wrong with
    a vector (:class:`EmbeddingVectorError`'s message), and then the vectors are empty."""

    vectors: dict[str, list[float]] = field(default_factory=dict)
    embed_query: QueryEmbedder | None = None
    unavailable: str = ""


@dataclass(frozen=True)
class QueryEmbedder:
    """A run's query embedder (``agents.tool_selection.EmbeddingRanker``'s ``embed_query``): the query's vector,
    its text composed (NFC) as the tools' are, and the tools' vectors embedded again (``tool_vectors``) when the
    query's vector says the service now answers another dimension than the cached ones: the model behind the URL
    changed and no tool's text did, so no refresh at run start could tell."""

    index: dict[str, McpTool]
    embedder: tuple[str, Embedder]

    def __call__(self, text: str) -> list[float]:
        return self.embedder[1]([nfc(text)])[0]

    def tool_vectors(self, dimensions: int) -> dict[str, list[float]]:
        """The tools' vectors, those of another dimension than ``dimensions`` embedded again and cached. Raises the
        embedding client's error, or :class:`EmbeddingVectorError` (an answer that is not such a vector). Where
        that failed, this process does not try again for ``REEMBED_RETRY_S`` (a service that answers queries in
        one dimension and tools in another had every run embed every tool, for nothing)."""
        key = (self.embedder[0], dimensions)
        failed_at = _reembed_failed.get(key)
        if failed_at is not None and time.monotonic() - failed_at < REEMBED_RETRY_S:
            raise EmbeddingVectorError(
                f"query vector has {dimensions} dimensions; the tools embedded again did not answer so "
                f"(not tried again within {int(REEMBED_RETRY_S)} s)"
            )
        try:
            tool_embeddings_refresh(list(self.index.values()), embedder=self.embedder, dimensions=dimensions)
        except DatabaseError:
            raise
        except Exception as exc:
            _reembed_failed[key] = time.monotonic()
            if isinstance(exc, EmbeddingVectorError):
                raise EmbeddingVectorError(
                    f"query vector has {dimensions} dimensions; embedding the tools again: {exc}"
                ) from exc
            raise
        _reembed_failed.pop(key, None)
        return _cached_vectors(self.index, self.embedder[0])


# How long a process leaves the tools' vectors alone after embedding them again in a query's dimension failed
# (``QueryEmbedder.tool_vectors``), per embedding model and dimension: monotonic time of the failure.
REEMBED_RETRY_S = 600.0
_reembed_failed: dict[tuple[str, int], float] = {}


def _cached_vectors(index: dict[str, McpTool], model: str) -> dict[str, list[float]]:
    """The cached vectors of ``index``'s tools by the name the model sees, checked (:func:`embedding_vectors`)."""
    by_pk = {e.tool_id: e.vector for e in ToolEmbedding.objects.filter(tool__in=list(index.values()), model=model)}
    names = [name for name, tool in index.items() if tool.pk in by_pk]
    checked = embedding_vectors([by_pk[index[name].pk] for name in names], count=len(names))
    return dict(zip(names, checked, strict=True))


def embedding_ranker_setup(index: dict[str, McpTool]) -> RankerInputs:
    """The embedding ranker's inputs for ``index``, refreshing stale vectors. Never raises for the embedding
    service or its configuration (a misconfigured client, a missing region, an outage, an answer that is not a
    vector): the reason is returned and the run ranks lexically. A database error propagates (the task's to
    retry). The query's vector is checked by ``agents.tool_selection.EmbeddingRanker``, against the tools': of
    another dimension, the ranker has the tools embedded again (:meth:`QueryEmbedder.tool_vectors`)."""
    try:
        embedder = configured_embedder()
        if embedder is None:
            return RankerInputs(unavailable="not_configured")
        tool_embeddings_refresh(list(index.values()), embedder=embedder)
    except DatabaseError:
        raise
    except EmbeddingVectorError as exc:
        logger.warning("tool embeddings unavailable: %s", exc)
        return RankerInputs(unavailable=str(exc))
    except Exception as exc:  # noqa: BLE001 - the run falls back to the lexical ranker
        logger.warning("tool embeddings unavailable: %s", type(exc).__name__)
        return RankerInputs(unavailable=type(exc).__name__)
    try:
        vectors = _cached_vectors(index, embedder[0])
    except EmbeddingVectorError as exc:  # changed since the refresh (another worker's): not ranked with
        logger.warning("tool embeddings unavailable: %s", exc)
        return RankerInputs(unavailable=str(exc))
    return RankerInputs(vectors=vectors, embed_query=QueryEmbedder(index, embedder))


def embedding_ranker_inputs(index: dict[str, McpTool]) -> tuple[dict[str, list[float]], Callable[[str], Any]] | None:
    """The tools' cached vectors (refreshing stale ones) by the name the model sees, and the query embedder; None
    when no service is configured or it fails (``embedding_ranker_setup`` says why)."""
    inputs = embedding_ranker_setup(index)
    if inputs.embed_query is None:
        return None
    return inputs.vectors, inputs.embed_query
