"""A run's input from a submission: the plain body (``query``, ``data``, ``files``) or an A2A message.

An A2A message (``{"role": "user", "parts": [...]}``) maps onto the run the way the deterministic stage reads
it (seed 000's ``DeterministicContext``): the text parts, joined by newlines, are the ``query``; each data
part's ``data`` object is one entry of ``a2a_data``; each file part is one entry of ``a2a_files``, metadata
only (``name``, ``mimeType``, ``uri``, ``size``): inline ``bytes`` are counted, never stored. The request's
``context`` (``userId``, ``sessionId``, ``chatbotId``, …) is the run's ``context`` either way, with the message's
``contextId`` (its conversation, as the A2A endpoint keeps it) as ``context.contextId``. A ``contextId`` given in a
context (REST's ``context``, MCP's ``arguments.context``, A2A's ``metadata.context``) is text, as a message's is,
or ``null`` for none (``agents.conversations.context_id_problem``, named here too).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any

# Where a context's contextId is checked for every door; named here as well, where it was first.
from agents.conversations import CONTEXT_ID_MAX_CHARS as CONTEXT_ID_MAX_CHARS
from agents.conversations import context_id_problem as context_id_problem


@dataclass(frozen=True)
class RunInput:
    query: str
    context: dict[str, Any] = field(default_factory=dict)
    a2a_data: list[dict[str, Any]] = field(default_factory=list)
    a2a_files: list[dict[str, Any]] = field(default_factory=list)


def decoded_size(encoded: str) -> int | None:
    """The size in bytes of base64 (standard alphabet, padded) content, or None if it is not base64."""
    try:
        return len(base64.b64decode(encoded, validate=True))
    except (binascii.Error, ValueError):
        return None


def file_metadata(file: dict[str, Any]) -> dict[str, Any]:
    """What is kept of a file: its name, media type, URI and size. Inline bytes are never kept."""
    kept: dict[str, Any] = {key: file[key] for key in ("name", "mimeType", "uri") if file.get(key) not in (None, "")}
    if file.get("bytes") is not None:
        size = decoded_size(file["bytes"])
        if size is not None:
            kept["size"] = size
    return kept


def run_input_from_message(message: dict[str, Any], *, context: dict[str, Any]) -> RunInput:
    """Map a validated A2A message (``role``, ``parts``, ``contextId``) onto the run's input. A ``contextId`` in
    ``context`` as well is the caller's to have checked against the message's (the REST API refuses two)."""
    if message.get("contextId"):
        context = {**context, "contextId": message["contextId"]}
    texts: list[str] = []
    a2a_data: list[dict[str, Any]] = []
    a2a_files: list[dict[str, Any]] = []
    for part in message["parts"]:
        if part["kind"] == "text":
            texts.append(part["text"])
        elif part["kind"] == "data":
            a2a_data.append(part["data"])
        elif part["kind"] == "file":
            a2a_files.append(file_metadata(part["file"]))
    query = "\n".join(text.strip() for text in texts if text.strip())
    return RunInput(query=query, context=context, a2a_data=a2a_data, a2a_files=a2a_files)


def run_input_from_body(validated: dict[str, Any]) -> RunInput:
    """The run's input from a validated submission: an A2A ``message``, or ``query`` with ``data``/``files``."""
    context = validated.get("context") or {}
    if validated.get("message") is not None:
        return run_input_from_message(validated["message"], context=context)
    return RunInput(
        query=validated["query"],
        context=context,
        a2a_data=list(validated.get("data") or []),
        a2a_files=[file_metadata(f) for f in validated.get("files") or []],
    )
