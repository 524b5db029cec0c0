"""The MCP SDK's client session, with its check of a tool's structured result made once per output schema, and
never inside the call.

``mcp.ClientSession.call_tool`` checks a result's ``structuredContent`` against the tool's ``outputSchema`` with
``jsonschema.validate``, which first checks the schema itself against the JSON Schema metaschema: about 3 ms of
CPU on every call, more than the call itself over a live session. :class:`ClientSession` here does the same check
with a validator made once per schema (the schema checked then), so each call costs only the check of its result.
What is refused is what the SDK refuses; the error raised is a ``RuntimeError`` as the SDK's, of the kind
:class:`ToolResultInvalid`, with a short message (the SDK's repeats the whole result and schema).

The SDK reads the tools list for a tool whose schema it does not know yet (on every session that did not list
tools: a run's own, a worker's) inside ``call_tool``, within the call's deadline: a list slower than the tool's
timeout turned an answered call into a timeout. Here the list is read after the answer
(:meth:`ClientSession.check_tool_result`), once per session, every page of it, and waited for briefly: where it
cannot be had in time the answer is taken unchecked rather than failed, since the call was answered and its failure
would read as a request never sent.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from typing import Any

import anyio
from jsonschema import SchemaError, ValidationError
from jsonschema.exceptions import best_match
from jsonschema.validators import validator_for
from mcp import ClientSession as SdkClientSession
from mcp import types
from referencing import Registry
from referencing.exceptions import Unresolvable

logger = logging.getLogger(__name__)

_MAX_VALIDATORS = 512

# How long the answers of a session's first calls wait for its tools list (all callers together, from when it was
# asked for), after the call was answered: a slower list leaves them unchecked (it is still read, for later calls).
OUTPUT_SCHEMA_WAIT_S = 5.0
# How many pages of the tools list are followed (a cursor that never ends stops here).
OUTPUT_SCHEMA_PAGES_MAX = 100

_validators: OrderedDict[str, Any] = OrderedDict()
_validators_lock = threading.Lock()


def output_validator(schema: dict[str, Any]) -> Any:
    """A validator for ``schema`` (its own draft, or the latest; ``$ref``s resolve within the schema document and
    the bundled metaschemas, as in the SDK), made once per schema and kept (up to ``_MAX_VALIDATORS``). Raises
    ``SchemaError`` for a schema that is not valid JSON Schema, each time it is asked for."""
    key = json.dumps(schema, sort_keys=True, ensure_ascii=False, default=str)
    with _validators_lock:
        validator = _validators.get(key)
        if validator is not None:
            _validators.move_to_end(key)
            return validator
    cls = validator_for(schema)
    cls.check_schema(schema)
    validator = cls(schema, registry=Registry())
    with _validators_lock:
        _validators[key] = validator
        while len(_validators) > _MAX_VALIDATORS:
            _validators.popitem(last=False)
    return validator


class ToolResultInvalid(RuntimeError):
    """A tool answered with structured content its own ``outputSchema`` refuses (or without the structured content
    it promised, or under a schema that is no JSON Schema): the tool answered, its answer is not what it said. A
    ``RuntimeError`` as the SDK raises it; the gate reads it as ``result:shape``."""


class ToolResultTooBig(ToolResultInvalid):
    """A tool answered at a length the pool does not read (``pool._answer_max_bytes``: a stdio server's line, a
    streamable HTTP answer's body or event): the tool answered (the call is no timeout, and is not sent again as one),
    and its answer was refused unread. The gate reads it as ``result:too_big``."""


class ClientSession(SdkClientSession):
    """The SDK's session, its check of a tool's answer against the tool's output schema split in two: ``call_tool``
    checks an answer whose tool's schema is known (the SDK's hook, CPU only), and leaves unchecked one whose tool's
    schema is not known yet (nothing is listed inside the call); :meth:`check_tool_result` checks the latter once the
    tools list has been read. The pool calls it after the call's deadline, so that reading the list never turns an
    answered call into a timeout (a read sent again, a write of unknown outcome)."""

    _tools_listed: anyio.Event | None = None
    _tools_listing_began = 0.0

    def output_schema_known(self, name: str) -> bool:
        """Whether ``call_tool`` checked (or had nothing to check of) an answer of ``name``: its output schema, or
        that it has none, is known on this session."""
        return name in self._tool_output_schemas

    async def check_tool_result(self, name: str, result: types.CallToolResult) -> None:
        """Check an answer ``call_tool`` left unchecked, once the tools list has been read (:meth:`_tools_list_read`).
        Raises :class:`ToolResultInvalid` as ``call_tool`` does. Where the list does not come within its bound, or
        fails, or does not list the tool, the answer is taken unchecked: the call was answered, and its failure would
        read as a request never sent; the contract's own result checks still apply."""
        if result.isError:
            return
        if name not in self._tool_output_schemas:
            listed = await self._tools_list_read()
            if name not in self._tool_output_schemas:
                if listed:
                    # Remembered as having no known schema: its later answers are neither waited on nor listed for.
                    self._tool_output_schemas[name] = None
                logger.warning("Tool %s answered; its output schema could not be read to check it", name)
                return
        await self._validate_tool_result(name, result)

    async def _tools_list_read(self) -> bool:
        """Whether the tools list has been read (every page, or as far as it could be): read once per session, in the
        session's own tasks, and waited for at most ``OUTPUT_SCHEMA_WAIT_S`` from when it began, by all callers
        together. A list slower than that is still read to its end: later answers are checked against it."""
        if self._tools_listed is None:
            self._tools_listed = anyio.Event()
            self._tools_listing_began = time.monotonic()
            try:
                self._task_group.start_soon(self._read_tools_list, self._tools_listed)
            except RuntimeError:  # the session has ended: there is nothing to read it on
                self._tools_listed.set()
        with anyio.move_on_after(self._tools_listing_began + OUTPUT_SCHEMA_WAIT_S - time.monotonic()):
            await self._tools_listed.wait()
        return self._tools_listed.is_set()

    async def _read_tools_list(self, done: anyio.Event) -> None:
        """Read the server's tools list, following its pages (at most ``OUTPUT_SCHEMA_PAGES_MAX``): the SDK's
        ``list_tools`` keeps each page's output schemas. A tool listed past the first page is checked too, and
        nothing is listed again on every call of it."""
        try:
            cursor: str | None = None
            for _page in range(OUTPUT_SCHEMA_PAGES_MAX):
                page = await self.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
                cursor = page.nextCursor
                if not cursor:
                    break
        except Exception as exc:  # noqa: BLE001 - the calls were answered whatever befalls this second request
            # The server ended the session (a 404), or its stream closed, after it answered the call: that must not
            # read as the call's own failure. The answers stand, unchecked against schemas that could not be read.
            logger.warning("The tools list could not be read to check the tools' answers (%s)", exc)
        finally:
            done.set()

    async def _validate_tool_result(self, name: str, result: types.CallToolResult) -> None:
        """The SDK's check (``mcp.ClientSession._validate_tool_result``) with a validator kept per schema, made only
        where the tool's output schema is known: never a tools list here, inside the call (:meth:`check_tool_result`
        does that, after it)."""
        output_schema = self._tool_output_schemas.get(name)
        if output_schema is None:
            return
        if result.structuredContent is None:
            raise ToolResultInvalid(f"Tool {name} has an output schema but did not return structured content")
        try:
            error = best_match(output_validator(output_schema).iter_errors(result.structuredContent))
            if error is not None:
                raise error
        except ValidationError as e:
            # The error's own message and where it is (not its whole text, which repeats the result and the schema).
            where = "/".join(str(step) for step in e.absolute_path) or "(the result)"
            raise ToolResultInvalid(
                f"Invalid structured content returned by tool {name}: {e.message} (at {where})"
            ) from e
        except SchemaError as e:
            raise ToolResultInvalid(f"Invalid schema for tool {name}: {e.message}") from e
        except Unresolvable as e:
            raise ToolResultInvalid(f"Invalid schema for tool {name}: {e}") from e
