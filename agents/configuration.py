"""Configuration as code: servers, contracts, agents and rules as one reviewable JSON (or YAML) document.

``config_import`` is idempotent (natural keys: a server's ``mcp_id``, a contract's ``mcp_id`` + ``tool``, an
agent's ``slug``, a rule's agent + ``name`` + occurrence: the k-th rule of a name is the agent's k-th rule of that
name in the export's order) and all-or-nothing (one transaction; every error names its entry).
Secret values are given inline (``{"value": "..."}``, encrypted on import) or by reference
(``{"from_env": "NAME"}``, read on the worker); ``{"set": true}`` keeps the value already stored.
``config_export`` never writes a secret value: a stored value is exported as ``{"set": true}``.
A secret map left out of an entry (a server's ``env`` or ``headers``, an agent's ``model.secrets``) keeps the stored
secrets; ``{}`` removes them all, and a map that is given removes the names it leaves out (each one reported as
deleted). A setting left out of an existing agent's entry is left as it is; a new agent takes the defaults. A key
left out of a contract's, a rule's or a tool's entry keeps the stored value; a tool without a contract yet takes what the gate applies
to it without one, and the risk discovery proposes (``write``).
"""

from __future__ import annotations

import codecs
import copy
import functools
import json
import math
import re
import sys
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, cast

import yaml
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils.translation import gettext as _
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator
from pydantic import ValidationError as PydanticValidationError

from agent_platform.errors import ApplicationError
from agent_platform.json import json_error_text
from agent_platform.json import loads as json_loads
from agent_platform.slugs import ASCII_SLUG_REFUSAL, validate_ascii_slug
from agent_platform.text import nfc, nfc_value
from agents.deterministic import RuleSpec as EngineRuleSpec
from agents.models import MAX_ITERATIONS_LIMIT, TIME_LIMIT_MAX_S, Agent, AgentArm, AgentVersion, DeterministicRule
from agents.rule_dependents import rules_failing_for_want_of_a_tool
from agents.selectors import (
    agent_tool_name_conflicts,
    rules_calling,
    rules_refused_by_tool_contract,
    servers_leaving,
    tool_name_clashes_made,
    tool_name_conflict_problem,
)
from agents.services import (
    agent_arm_create,
    agent_arm_delete,
    agent_arm_update,
    agent_update,
    agent_version_import,
    agent_version_publish,
    deterministic_rule_update,
    publish_on_save_deferred,
    publish_on_save_digests,
    publishes_after,
    unbinding_refused,
)
from agents.versions import AGENT_FIELDS, VersionContent, content_digest, version_content, version_content_portable
from audit.change_guard import values_differ
from mcpregistry.binding_policy import masked_secret_given
from mcpregistry.contract_document import ContractSpec, contract_entry, contract_fields
from mcpregistry.contracts import contract_defaults, pydantic_message, spec_keys, unknown_key_problem
from mcpregistry.crypto import SecretDecryptionError, readable
from mcpregistry.gate_records import CONTRACT_FIELDS, contract_of
from mcpregistry.models import (
    INT32_MAX,
    McpServer,
    McpTool,
    ToolContract,
    fallback_call_problems,
    fallback_checks_deferred,
)
from mcpregistry.services import (
    mcp_server_update,
    mcp_tool_create,
    mcp_tool_update,
    tool_contract_update,
    tool_name_problem,
)
from mcpregistry.signals import tool_name_checks_deferred

# What a document may be: read at most this many bytes; hold at most this many values (a YAML alias counts each
# time it is used: a few lines of aliases expanded to gigabytes), nested at most this deep.
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024  # the alias bombs are the value count's; an installation's export is far under
MAX_DOCUMENT_VALUES = 1_000_000
# The first and the last key of an export (``config_export``): a document cut short (a copy stopped at a line, a
# truncated upload) is still valid JSON or YAML, and left out, a server's env map deleted the secrets it lost.
# ``config_import`` refuses a document with the first but not the last; a hand-written one carries neither.
EXPORT_HEADER = "export_format"
EXPORT_END = "end"
EXPORT_FORMAT = 1  # what an export's first key holds: a document of another format is refused, not guessed at
# libyaml's safe loader where installed (a large export read in a second, not ten), else PyYAML's own.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MAX_DOCUMENT_DEPTH = 100
# A tool's name, as ``McpTool.name`` holds it.
TOOL_NAME_MAX = 200
# The problems a refused import shows, at most (one broken server with thousands of rules calling it: thousands).
MAX_PROBLEMS_SHOWN = 50
_SURROGATE = re.compile("[\ud800-\udfff]")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SecretSpec(_Strict):
    value: str | None = None
    from_env: str | None = None
    set: bool | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> SecretSpec:
        given = [k for k in ("value", "from_env", "set") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(_('give exactly one of {"value": ...}, {"from_env": ...} or {"set": true}'))
        if self.set is False:
            # Read as {"set": true}, it kept the stored secret and the next export showed it set.
            raise ValueError(_('{"set": false} deletes nothing: leave the name out of the map to delete its value'))
        return self


class ServerSpec(_Strict):
    mcp_id: str
    name: str | None = None
    transport: Literal["stdio", "streamable_http", "sse", "local"] = "stdio"
    command: str = ""
    args: list[str] = Field(default_factory=list)
    cwd: str = ""
    # A secret map left out: the stored secrets, kept; {} removes them. ``public_env`` left out: as it is.
    env: dict[str, SecretSpec] | None = None
    public_env: list[str] | None = None
    url: str = ""
    headers: dict[str, SecretSpec] | None = None
    timeout_s: float = Field(default=30.0, gt=0, le=3600)
    session_scope: Literal["per_run", "shared"] = "per_run"
    enabled: bool = True
    tool_prefix: str = ""
    # The circuit breaker (``mcpregistry.breaker``); left out: as it is.
    breaker_threshold: int | None = Field(default=None, ge=1, le=INT32_MAX)
    breaker_cooldown_s: float | None = Field(default=None, ge=0, le=86400)


# The settings of a server entry applied as given (``name``, the secret maps and the breaker have rules of their own).
_SERVER_SETTINGS = (
    "transport",
    "command",
    "args",
    "cwd",
    "url",
    "timeout_s",
    "enabled",
    "session_scope",
    "tool_prefix",
)
# Those that say how to connect, which a change of transport sets anew (a new server's defaults where left out).
_CONNECTION_SETTINGS = ("command", "args", "cwd", "url")


class ModelSpec(_Strict):
    provider: Literal["offline", "bedrock", "scripted", "openai_compatible"] = "offline"
    model_id: str = ""
    params: dict[str, Any] = Field(default_factory=dict)
    # The model API key: {"api_key": {"value": ...} | {"from_env": NAME} | {"set": true}} (encrypted on import).
    # Left out: the stored key, kept; {} removes it.
    secrets: dict[Literal["api_key"], SecretSpec] | None = None


class VersionContentSpec(_Strict):
    """A version's frozen content (``agents.versions.VersionContent``) as a document carries it: its rules
    without their ``rule_id`` (an installation's own; resolved by name on import)."""

    agent: dict[str, Any]
    servers: list[str]
    rules: list[dict[str, Any]]
    contracts: dict[str, dict[str, Any]]

    @model_validator(mode="after")
    def _frozen_shape(self) -> VersionContentSpec:
        missing, unknown = set(AGENT_FIELDS) - set(self.agent), set(self.agent) - set(AGENT_FIELDS)
        if missing or unknown:
            raise ValueError(
                "agent: "
                + "; ".join(
                    part
                    for part in (
                        _("missing %(fields)s") % {"fields": ", ".join(sorted(missing))} if missing else "",
                        _("unknown %(fields)s") % {"fields": ", ".join(sorted(unknown))} if unknown else "",
                    )
                    if part
                )
            )
        rule_fields = sorted(f.name for f in dataclass_fields(EngineRuleSpec))
        for i, rule in enumerate(self.rules):
            # Each key it lacks or does not know named, as the agent's are: the valid keys alone did not say which.
            missing, unknown = {"name", "mcp_id", "tool_name"} - set(rule), set(rule) - set(rule_fields)
            parts = [unknown_key_problem(str(key), rule_fields) for key in sorted(unknown, key=str)]
            if missing:
                parts.insert(0, _("missing %(fields)s") % {"fields": ", ".join(sorted(missing))})
                if not unknown:  # an unknown key's problem names the keys a rule has
                    parts.insert(0, _("a rule has %(fields)s") % {"fields": ", ".join(rule_fields)})
            if parts:
                raise ValueError(f"rules[{i}]: " + "; ".join(parts))
        for key, contract in self.contracts.items():
            if "/" not in key:
                raise ValueError("contracts: " + _("'%(key)s' is not 'mcp_id/tool'") % {"key": key})
            if set(contract) - set(CONTRACT_FIELDS):
                unknown_fields = ", ".join(sorted(set(contract) - set(CONTRACT_FIELDS)))
                raise ValueError(f"contracts.{key}: " + _("unknown %(fields)s") % {"fields": unknown_fields})
        return self


class VersionSpec(_Strict):
    number: int = Field(ge=1, le=INT32_MAX)
    # The model's own bound, refused by name as ``agent_version publish`` refuses it: the import cut it silently.
    note: Annotated[str, StringConstraints(max_length=AgentVersion._meta.get_field("note").max_length)] = ""
    content: VersionContentSpec


class ShadowSpec(_Strict):
    version: int | None = Field(default=None, ge=1)
    sample_rate: float = Field(default=0.0, ge=0.0, le=1.0)


def _ascii_slug(value: str) -> str:
    """An arm's name checked as the admin checks it (``agent_platform.slugs``), refused in its words: a pattern's
    regular expression (``^[-a-zA-Z0-9_]{1,32}$``) was all a reader was told."""
    try:
        validate_ascii_slug(value)
    except ValidationError:
        raise ValueError(str(ASCII_SLUG_REFUSAL)) from None
    return value


class ArmSpec(_Strict):
    name: Annotated[str, StringConstraints(min_length=1, max_length=32), AfterValidator(_ascii_slug)]
    version: int = Field(ge=1)
    weight: int = Field(default=1, ge=0, le=INT32_MAX)


class AgentSpec(_Strict):
    """An agent's entry. A key left out of an existing agent's entry leaves that setting as it is (the defaults
    below are a new agent's); so does one left out of its ``model``."""

    slug: str
    name: str | None = None
    enabled: bool = True
    system_prompt: str = ""
    deterministic_instruction: str | None = None
    answer_template: str = ""
    model: ModelSpec = Field(default_factory=ModelSpec)
    servers: list[str] = Field(default_factory=list)
    max_iterations: int = Field(default=6, ge=1, le=MAX_ITERATIONS_LIMIT)
    mode: Literal["react", "flow"] = "react"
    flow_graph: str = ""
    answer_from_deterministic: bool = False
    caller_approves_model_writes: bool = False
    language: str = "ko"
    no_match_answer: str = ""
    tool_selection: dict[str, Any] = Field(default_factory=dict)
    mcp_context: dict[str, Any] = Field(default_factory=dict)
    time_limit_s: int = Field(default=300, ge=1, le=TIME_LIMIT_MAX_S)
    # Versions (applied after the rules, ``_apply_versions``). A key left out leaves that setting as it is.
    publish_on_save: bool | None = None
    live_version: int | None = Field(default=None, ge=1)
    shadow: ShadowSpec | None = None
    arms: list[ArmSpec] | None = None
    versions: list[VersionSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _versions_named_once(self) -> AgentSpec:
        numbers = [v.number for v in self.versions]
        if len(numbers) != len(set(numbers)):
            raise ValueError("versions: " + _("a number is given twice"))
        names = [a.name for a in self.arms or []]
        if len(names) != len(set(names)):
            raise ValueError("arms: " + _("a name is given twice"))
        return self


# The settings of an agent's entry stored under their own names (``Agent``'s fields).
_AGENT_SETTINGS = (
    "enabled",
    "system_prompt",
    "answer_template",
    "max_iterations",
    "mode",
    "flow_graph",
    "answer_from_deterministic",
    "caller_approves_model_writes",
    "language",
    "no_match_answer",
    "tool_selection",
    "mcp_context",
    "time_limit_s",
)


class RuleSpec(_Strict):
    agent: str | None = None
    name: str
    order: int = Field(default=100, ge=-INT32_MAX - 1, le=INT32_MAX)
    enabled: bool = True
    mcp_id: str | None = None
    tool: str = ""
    code: str = ""
    when: dict[str, Any] = Field(default_factory=dict)
    params: dict[str, Any] = Field(default_factory=dict)
    answer_template: str = ""
    force_first_tool: str = ""


_Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]


class ToolSpec(_Strict):
    """What an admin writes about a discovered tool for top-K selection (``agents.tool_selection``)."""

    mcp_id: str
    tool: Annotated[str, StringConstraints(min_length=1, max_length=TOOL_NAME_MAX)]
    tags: list[_Text] = Field(default_factory=list)
    example_queries: list[_Text] = Field(default_factory=list)
    # Whether the tool may be offered and called (the admin's switch); left out: as it is. For a tool waiting for
    # a review, what approving the review restores.
    enabled: bool | None = None


class ConfigDocument(_Strict):
    servers: list[ServerSpec] = Field(default_factory=list)
    tools: list[ToolSpec] = Field(default_factory=list)
    contracts: list[ContractSpec] = Field(default_factory=list)
    agents: list[AgentSpec] = Field(default_factory=list)
    rules: list[RuleSpec] = Field(default_factory=list)


@dataclass
class ImportReport:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    # What was imported but deserves a look: a version naming a server this installation does not have.
    warnings: list[str] = field(default_factory=list)


_Entry = TypeVar("_Entry")


class _Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: str, message: str) -> None:
        self.items.append(f"{where}: {message}")


def _by_name(rows: Any) -> dict[str, Any]:
    """``rows`` by their composed name (as the document names them), also those stored decomposed (the admin and
    the services keep text as typed): an entry is matched to its row, never made a second one; a row stored as
    the entry names it comes first. Read once per server and import: looked up row by row, each new tool read
    all of its server's rows (a thousand new tools, half a million rows)."""
    found: dict[str, Any] = {}
    for row in rows:
        name = nfc(row.name)
        if name not in found or (row.name == name and found[name].name != name):
            found[name] = row
    return found


_YAML_BOOL = "tag:yaml.org,2002:bool"
_YAML_STR = "tag:yaml.org,2002:str"


class _DocumentLoader(_YAML_LOADER):  # type: ignore[misc,valid-type]
    """The safe YAML loader, noting each mapping in which a key is given twice (``repeated``): PyYAML keeps the
    last one silently. Keys merged in (``<<: *defaults``) may be overridden, as YAML means them to be. A plain
    key that YAML 1.1 reads as true or false (``on``, ``yes``, ``no``, ``off``) is the text as written: a
    document's keys are texts, and a retry's unquoted ``on:`` was refused as "a key that is not a text (bool)".
    A number or date that Python cannot make (an integer past ``sys.get_int_max_str_digits()`` digits, month 13)
    is a YAML error at its place, not Python's English text."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.repeated: list[tuple[dict[Any, Any], Any]] = []

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        self.flatten_mapping(node)  # the merged keys too
        for key_node, _value in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag == _YAML_BOOL and not key_node.style:
                key_node.tag = _YAML_STR
        return cast(dict[Any, Any], super().construct_mapping(node, deep=deep))

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        try:
            return cast(int, super().construct_yaml_int(node))
        except ValueError:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                _("a number with more than %(limit)s digits") % {"limit": sys.get_int_max_str_digits()},
                node.start_mark,
            ) from None

    def construct_yaml_timestamp(self, node: yaml.ScalarNode) -> Any:
        try:
            return super().construct_yaml_timestamp(node)
        except ValueError:
            raise yaml.constructor.ConstructorError(
                None, None, _("a date that is not one (quote it if it is a text)"), node.start_mark
            ) from None

    def construct_yaml_map(self, node: yaml.MappingNode) -> Any:
        data: dict[Any, Any] = {}
        yield data
        own = [key for key, _value in node.value if key.tag != "tag:yaml.org,2002:merge"]
        data.update(self.construct_mapping(node))
        seen: set[Any] = set()
        for key_node in own:
            key = self.construct_object(key_node)  # built already: the same object
            try:
                if key in seen:
                    self.repeated.append((data, key))
                    break
                seen.add(key)
            except TypeError:  # an unhashable key: construct_mapping refused it already
                continue


_DocumentLoader.add_constructor("tag:yaml.org,2002:map", _DocumentLoader.construct_yaml_map)
_DocumentLoader.add_constructor("tag:yaml.org,2002:int", _DocumentLoader.construct_yaml_int)
_DocumentLoader.add_constructor("tag:yaml.org,2002:timestamp", _DocumentLoader.construct_yaml_timestamp)


def _json_object(repeated: list[tuple[dict[Any, Any], Any]], pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, noted in ``repeated`` with its first key given twice (``json`` keeps the last silently)."""
    data = dict(pairs)
    if len(data) < len(pairs):
        seen: set[str] = set()
        for key, _value in pairs:
            if key in seen:
                repeated.append((data, key))
                break
            seen.add(key)
    return data


def _path_to(document: Any, target: Any) -> str:
    """Where ``target`` (an object inside ``document``, by identity) is, as ``document_problems`` names a place
    (``agents[0] (assistant).model``); "" for the document itself. Walked without recursion, each object once
    (YAML aliases share them)."""
    stack: list[tuple[Any, str]] = [(document, "")]
    seen: set[int] = set()
    while stack:
        value, path = stack.pop()
        if value is target:
            return path
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, dict):
            stack.extend((item, f"{path}.{key}" if path else str(key)) for key, item in value.items())
        elif isinstance(value, list):
            labels = [_label(path, item) if "." not in path and "[" not in path else "" for item in value]
            stack.extend(
                (item, f"{path}[{i}]" + (f" ({labels[i]})" if labels[i] else "")) for i, item in enumerate(value)
            )
    return ""


def load_document(path: str | Path, *, kind: Literal["json", "yaml"] | None = None) -> dict[str, Any]:
    """Read a JSON or YAML configuration file (``-``: the standard input). Raises ApplicationError for a file over
    ``MAX_DOCUMENT_BYTES``, not UTF-8 (a byte order mark is read past), not valid JSON or YAML (nesting past the
    bounded decoder's limit included; a key given twice in one object, which the parsers resolve by keeping the
    last), or not an object. What the values may be is checked by ``config_import`` (``document_problems``).

    ``kind`` left out: YAML for a name ending in ``.yaml`` or ``.yml``, JSON for ``.json`` (in any case: a
    ``config.YAML`` was read as JSON); another name (``/dev/stdin``, ``-``, a pipe) is read as JSON, and as YAML
    where the text does not begin as JSON does (an export piped as YAML was refused as no JSON at its first
    character)."""
    suffix = Path(str(path)).suffix.lower()
    chosen = kind.upper() if kind else "YAML" if suffix in (".yaml", ".yml") else "JSON" if suffix == ".json" else ""
    if str(path) == "-":
        raw = sys.stdin.buffer.read(MAX_DOCUMENT_BYTES + 1)
    else:
        with open(path, "rb") as stream:  # read to the limit, not to the end: a device or a pipe may have none
            raw = stream.read(MAX_DOCUMENT_BYTES + 1)
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise ApplicationError(
            _("%(path)s: larger than %(limit)s MB") % {"path": path, "limit": MAX_DOCUMENT_BYTES // (1024 * 1024)},
            code="invalid_config",
        )
    # A byte order mark (Windows editors write one) is no part of the text.
    bom = len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0
    try:
        text = raw[bom:].decode("utf-8")
    except UnicodeDecodeError as exc:
        # Windows PowerShell 5.1's ``export_config > f.json`` writes UTF-16 with its byte order mark; an editor may
        # save CP949: the byte alone did not say what to do.
        utf16 = raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))
        raise ApplicationError(
            _("%(path)s: not UTF-8 text (byte %(position)s)") % {"path": path, "position": bom + exc.start + 1}
            + ": "
            + (_("the file is UTF-16: save it as UTF-8") if utf16 else _("save it as UTF-8")),
            code="invalid_config",
        ) from None
    kind_read = chosen or "JSON"
    try:
        try:
            data, repeated = _read(text, kind_read)
        except json.JSONDecodeError as exc:
            if chosen or exc.pos != len(text) - len(text.lstrip(" \t\n\r")):
                raise
            kind_read = "YAML"  # not JSON from its first character: a name that says neither, read as YAML
            data, repeated = _read(text, kind_read)
    except (ValueError, yaml.YAMLError) as exc:
        error = _yaml_error_text(exc, text) if isinstance(exc, yaml.YAMLError) else _json_value_error_text(exc, text)
        raise ApplicationError(
            _("%(path)s: not valid %(kind)s: %(error)s") % {"path": path, "kind": kind_read, "error": error},
            code="invalid_config",
        ) from None
    except RecursionError:
        raise ApplicationError(
            _("%(path)s: not valid %(kind)s: nested too deeply") % {"path": path, "kind": kind_read},
            code="invalid_config",
        ) from None
    if repeated:
        mapping, key = repeated[0]
        raise ApplicationError(
            _("%(path)s: %(where)s: the key '%(key)s' is given twice (give each key once)")
            % {"path": path, "where": _path_to(data, mapping) or _("the document"), "key": key},
            code="invalid_config",
        )
    if not isinstance(data, dict):
        raise ApplicationError(
            _("%(path)s: the document must be an object with servers, contracts, agents, rules") % {"path": path},
            code="invalid_config",
        )
    return data


def _read(text: str, kind: str) -> tuple[Any, list[tuple[dict[Any, Any], Any]]]:
    """``text`` read as ``kind`` (``JSON`` or ``YAML``), with the objects in which a key is given twice."""
    if kind == "YAML":
        loader = _DocumentLoader(text)
        try:
            return loader.get_single_data(), loader.repeated
        finally:
            loader.dispose()
    repeated: list[tuple[dict[Any, Any], Any]] = []
    return json_loads(text, object_pairs_hook=functools.partial(_json_object, repeated)), repeated


def _at(what: str, line: int, column: int) -> str:
    """``what`` is wrong at ``line`` and ``column`` (from 1), as ``json_error_text`` says it."""
    return _("%(what)s, at line %(line)d, column %(column)d") % {"what": what, "line": line, "column": column}


def _line_and_column(text: str, index: int) -> tuple[int, int]:
    line = text.count("\n", 0, index) + 1
    return line, index - (text.rfind("\n", 0, index) + 1) + 1


def _json_value_error_text(exc: ValueError, text: str) -> str:
    """Why a JSON text is not read (``json_error_text``); an integer past Python's digit limit (the decoder's
    ValueError names ``sys.set_int_max_str_digits()``) as the other problems are told, with where it is."""
    if isinstance(exc, json.JSONDecodeError) or "sys.set_int_max_str_digits" not in str(exc):
        return json_error_text(exc)
    limit = sys.get_int_max_str_digits()
    what = _("a number with more than %(limit)s digits") % {"limit": limit}
    strings_or_long_number = re.compile(r'"(?:[^"\\]|\\.)*"|(-?[0-9]{' + str(limit + 1) + ",})")
    found = next((m for m in strings_or_long_number.finditer(text) if m.group(1)), None)
    return _at(what, *_line_and_column(text, found.start())) if found else what


# What PyYAML (libyaml's words, then PyYAML's own where they differ) says is wrong, by how its text begins, as the
# reader is told it; None: said by ``_yaml_error_text`` itself. Another problem is given in PyYAML's words.
def _yaml_problems() -> dict[str, str | None]:
    indentation = _("a key or a list item was expected here: check the indentation and the brackets")
    return {
        "mapping values are not allowed": _("a colon where no value may start (quote a text that holds ': ')"),
        "did not find expected key": indentation,
        "did not find expected '-' indicator": indentation,
        "expected <block end>": indentation,
        "did not find expected ',' or ']'": _("a comma or ']' was expected"),
        "expected ',' or ']'": _("a comma or ']' was expected"),
        "did not find expected ',' or '}'": _("a comma or '}' was expected"),
        "expected ',' or '}'": _("a comma or '}' was expected"),
        "could not find expected ':'": _("a colon was expected"),
        "found unexpected end of stream": _("a quoted text is not closed"),
        "found undefined alias": _("an alias (*name) that no anchor (&name) defines"),
        "second occurrence": _("an anchor (&name) given twice"),
        "could not determine a constructor for the tag": _("a tag (!...) that a configuration document does not take"),
        "found unhashable key": _("a key that is a list or an object (a key is a text)"),
        "but found another document": _("more than one document (---): a file holds one"),
        "found unknown escape character": _("an escape sequence is not valid"),
        "did not find expected hexdecimal number": _("an escape sequence is not valid"),  # "\x4", "\uZZZZ"
        "expected escape sequence of": _("an escape sequence is not valid"),
        # "\ud800" (half of a pair, which libyaml does not join), "\U00110000"
        "found invalid Unicode character escape code": _(
            "an escape sequence that names no Unicode character (U+D800 to U+DFFF, or past U+10FFFF)"
        ),
        # An unclosed "servers: [" (told at the end of the text), "[a,,b]", a stray "]" where a value begins
        "did not find expected node content": _("a value was expected here: check the brackets and the commas"),
        "expected the node content": _("a value was expected here: check the brackets and the commas"),
        "did not find expected <document start>": _("there is more after the document's value"),
        "expected '<document start>'": _("there is more after the document's value"),
        "found character": None,
        "found a tab character": None,
        # libyaml's own limit (some thousand brackets), before the bounded decoder's
        "exceeded maximum nesting depth": _("nested too deeply"),
    }


def _yaml_error_text(exc: yaml.YAMLError, text: str) -> str:
    """Why a YAML text is not read, in the reader's language with its line and column: PyYAML's English, which
    named the text "<unicode string>", followed a translated heading."""
    if isinstance(exc, yaml.reader.ReaderError):
        # The reader stops at the first such character; libyaml counts its position in bytes, not characters.
        index = text.find(chr(exc.character)) if isinstance(exc.character, int) else -1
        what = _("a control character (U+%(code)04X) that YAML does not take") % {"code": exc.character}
        return _at(what, *_line_and_column(text, index)) if index >= 0 else what
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None:
        return str(exc)
    problem, mark = exc.problem or "", exc.problem_mark
    said = next((said for start, said in _yaml_problems().items() if problem.startswith(start)), problem)
    if problem.startswith("found unexpected end of stream") and exc.context_mark is not None:
        mark = exc.context_mark  # where the quote opens
        said = said if "quoted" in (exc.context or "") else problem
    if said is None:  # a character that cannot start a value: a tab for indentation, or an unquoted @ or `
        lines = text.split("\n")
        line = lines[mark.line] if mark.line < len(lines) else ""
        character = line[mark.column] if mark.column < len(line) else ""
        said = (
            _("a tab where YAML takes none (indent with spaces)")
            if character == "\t" or problem.startswith("found a tab")
            else _("'%(character)s' cannot begin a value: quote the text") % {"character": character}
        )
    return _at(said, mark.line + 1, mark.column + 1)


def document_problems(document: Any) -> list[str]:
    """Where ``document`` holds what no JSON column stores, each named by its path
    (``agents[0] (assistant).system_prompt: …``): a value that is not JSON (a YAML set, date, timestamp or
    binary), a number that is not finite (YAML's ``.nan``, ``.inf``), a key that is not a text, a text with a
    NUL character or a lone surrogate; or a document past ``MAX_DOCUMENT_VALUES`` values (YAML aliases expanded)
    or ``MAX_DOCUMENT_DEPTH`` levels. Stored, these failed the import as a server error, or a later run.
    Walked without recursion; the values are never written into a problem (a secret's may be among them)."""
    problems: list[str] = []
    stack: list[tuple[Any, str, int]] = [(document, "", 0)]
    values = 0
    while stack and len(problems) < 20:
        value, path, depth = stack.pop()
        values += 1
        if values > MAX_DOCUMENT_VALUES:
            return [
                _("the document holds more than %(limit)s values (a YAML alias counts each time it is used)")
                % {"limit": f"{MAX_DOCUMENT_VALUES:,}"}
            ]
        where = path or str(_("the document"))
        if depth > MAX_DOCUMENT_DEPTH:
            problems.append(f"{where}: {_('the JSON is nested too deeply')}")
        elif isinstance(value, dict):
            children = []
            for key, item in value.items():
                if not isinstance(key, str):
                    problems.append(
                        _("%(where)s: a key that is not a text (%(type)s)")
                        % {"where": where, "type": type(key).__name__}
                    )
                    continue
                if problem := _text_problem(key):
                    problems.append(f"{where}: {problem}")
                    continue
                children.append((item, f"{path}.{key}" if path else key, depth + 1))
            stack.extend(reversed(children))
        elif isinstance(value, list):
            # An entry of a section is named as the import names it: servers[1] (docs)
            labels = [_label(path, item) if depth == 1 else "" for item in value]
            labels = [label if not _text_problem(label) else "" for label in labels]
            stack.extend(
                (item, f"{path}[{i}]" + (f" ({labels[i]})" if labels[i] else ""), depth + 1)
                for i, item in reversed(list(enumerate(value)))
            )
        elif isinstance(value, str):
            if problem := _text_problem(value):
                problems.append(f"{where}: {problem}")
        elif isinstance(value, float):
            if not math.isfinite(value):
                problems.append(f"{where}: {_('NaN and Infinity are not numbers JSON holds: write a finite one')}")
        elif not (value is None or isinstance(value, bool | int)):
            problems.append(
                _("%(where)s: a %(type)s is not a JSON value (text, number, true or false, null, list or object)")
                % {"where": where, "type": type(value).__name__}
            )
    return problems


def _text_problem(text: str) -> str:
    """Why ``text`` cannot be stored (PostgreSQL refuses a NUL; no UTF-8 encoder takes a lone surrogate), or ""."""
    if "\x00" in text:
        return str(_("Text may not contain NUL characters."))
    if _SURROGATE.search(text):
        return str(_("Text may not contain unpaired surrogates (\\ud800–\\udfff)."))
    return ""


def config_sections() -> dict[str, Any]:
    """Sections that apps above agents add to the document (``PLATFORM_CONFIG_SECTIONS``: section name → dotted
    path of a module with ``section_import(entries, *, actor, via, report, problem)`` and ``section_export()``).
    Named by setting, not imported here, so that agents does not depend on the apps that build on it."""
    from importlib import import_module

    from django.conf import settings

    return {name: import_module(path) for name, path in getattr(settings, "PLATFORM_CONFIG_SECTIONS", {}).items()}


def _parse(document: dict[str, Any], *, sections: Collection[str] = ()) -> ConfigDocument:
    """The document's own sections, validated; ``sections``: the other top-level keys it may have (named among the
    valid keys of an unknown one). A problem is in the reader's language where ``pydantic_message`` knows its
    kind, and an unknown key names the valid ones (pydantic's English named neither)."""
    try:
        return ConfigDocument.model_validate(document)
    except PydanticValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = list(err["loc"])
            if err["type"] == "extra_forbidden" and loc:
                valid = spec_keys(ConfigDocument, loc[:-1]) or []
                message = unknown_key_problem(str(loc[-1]), [*valid, *sections] if len(loc) == 1 else valid)
            else:
                message = pydantic_message(err)
            where = ".".join(str(p) for p in loc)
            # Name the entry: servers[1] (docs)
            if len(loc) >= 2 and isinstance(loc[1], int):
                section, index = str(loc[0]), loc[1]
                entry = (document.get(section) or [None] * (index + 1))[index]
                label = _label(section, entry)
                where = f"{section}[{index}]{f' ({label})' if label else ''}" + (
                    "." + ".".join(str(p) for p in loc[2:]) if len(loc) > 2 else ""
                )
            lines.append(f"{where}: {message}")
        raise ApplicationError(_not_valid(lines), code="invalid_config") from None


def _not_valid(lines: list[str]) -> str:
    """The message of a document that is not valid: a translated heading, then one line per problem."""
    return _("configuration is not valid:") + "\n" + "\n".join(_capped(lines))


def _capped(lines: list[str]) -> list[str]:
    """``lines``, the first ``MAX_PROBLEMS_SHOWN`` of them and how many more there are: the first ones name what
    to fix first; thousands of lines bury them."""
    if len(lines) <= MAX_PROBLEMS_SHOWN:
        return lines
    return [*lines[:MAX_PROBLEMS_SHOWN], _("… and %(count)s more") % {"count": len(lines) - MAX_PROBLEMS_SHOWN}]


# What an entry passes to the OS or the network as written, kept byte-exact by ``_composed``: a path is bytes on
# Linux (a folder made on macOS keeps its decomposed Korean, and the composed spelling names no folder), a URL's
# path is what the server routes (a model's ``base_url`` too), a secret is bytes. ``*`` is every value of a map (its names are composed).
_AS_WRITTEN: dict[str, tuple[tuple[str, ...], ...]] = {
    "servers": (("command",), ("args",), ("cwd",), ("url",), ("env", "*"), ("headers", "*")),
    "agents": (
        ("model", "secrets", "*"),
        ("model", "params", "base_url"),
        # Each version's frozen copy of it (a list: each of its items is walked).
        ("versions", "content", "agent", "model_params", "base_url"),
    ),
}


# ``_AS_WRITTEN`` by the model fields that store it: the path inside the field (``()``: the whole field).
_AS_WRITTEN_FIELDS: dict[type[Any], dict[str, tuple[str, ...]]] = {
    McpServer: {"command": (), "args": (), "cwd": (), "url": (), "env": ("*",), "headers": ("*",)},
    Agent: {"model_secrets": ("*",), "model_params": ("base_url",)},
}


def _stored_where_composed_alike(obj: Any, before: dict[str, Any] | None) -> None:
    """Put back on ``obj`` the stored value (``before``, by attname) of each field the entry gave the same text
    composed: stored decomposed (typed on macOS), it was written again composed, reported updated with an audit
    event whose before and after read alike. What ``_AS_WRITTEN`` names is compared as written."""
    if before is None:
        return
    as_written = _AS_WRITTEN_FIELDS.get(type(obj), {})
    for model_field in obj._meta.concrete_fields:
        name, path = model_field.attname, as_written.get(model_field.attname)
        if name not in before or path == () or not values_differ(getattr(obj, name), before[name]):
            continue
        composed = nfc_value(before[name])
        if path:
            _keep_as_written(before[name], composed, path)
        if not values_differ(getattr(obj, name), composed):
            setattr(obj, name, copy.deepcopy(before[name]))


def _composed(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` with every text composed (Unicode NFC; ``agent_platform.text.nfc_value``), names, keywords
    and regexes included: a rule named in decomposed Korean (macOS, a pasted file name) was stored beside its
    composed namesake as a second rule. What ``_AS_WRITTEN`` names is kept exactly as given: composed, a
    server's decomposed folder no longer existed after an installation re-imported its own export."""
    composed = nfc_value(document)
    for section, paths in _AS_WRITTEN.items():
        given_entries, composed_entries = document.get(section), composed.get(section)
        if not (isinstance(given_entries, list) and isinstance(composed_entries, list)):
            continue
        for given_entry, composed_entry in zip(given_entries, composed_entries, strict=True):
            for path in paths:
                _keep_as_written(given_entry, composed_entry, path)
    return cast(dict[str, Any], composed)


def _keep_as_written(given: Any, composed: Any, path: tuple[str, ...]) -> None:
    """Put the value at ``path`` of ``given`` into ``composed`` (its composed copy) as written. A map's names
    along the path are found composed, as ``nfc_value`` wrote them; a list along it has each of its items
    walked."""
    if isinstance(given, list) and isinstance(composed, list):
        for given_item, composed_item in zip(given, composed, strict=True):
            _keep_as_written(given_item, composed_item, path)
        return
    if not (isinstance(given, dict) and isinstance(composed, dict)):
        return
    key, rest = path[0], path[1:]
    keys = list(given) if key == "*" else [key] if key in given else []
    for name in keys:
        composed_name = nfc(name) if isinstance(name, str) else name
        if rest:
            _keep_as_written(given[name], composed.get(composed_name), rest)
        else:
            composed[composed_name] = copy.deepcopy(given[name])


def _named_twice(config: ConfigDocument, extra: dict[str, Any], sections: dict[str, Any]) -> list[str]:
    """An entry whose natural key an earlier entry of its section has: applied in turn, the last one won, and the
    values flipped on every import. A section of ``PLATFORM_CONFIG_SECTIONS`` is keyed by its module's
    ``SECTION_KEY`` (default ``name``). Rules are not here: two of one name are two rules (keyed by occurrence,
    ``_config_import``)."""
    keyed: dict[str, list[tuple[Any, str]]] = {
        "servers": [(s.mcp_id, s.mcp_id) for s in config.servers],
        "tools": [((t.mcp_id, t.tool), f"{t.mcp_id}.{t.tool}") for t in config.tools],
        "contracts": [((c.mcp_id, c.tool), f"{c.mcp_id}.{c.tool}") for c in config.contracts],
        "agents": [(a.slug, a.slug) for a in config.agents],
    }
    for name, entries in extra.items():
        key = getattr(sections[name], "SECTION_KEY", "name")
        if isinstance(entries, list):
            keyed[name] = [
                (entry.get(key), str(entry.get(key)))
                if isinstance(entry, dict) and isinstance(entry.get(key), str)
                else (object(), "")  # not a text: the section names its problem
                for entry in entries
            ]
    lines = []
    for section, keys in keyed.items():
        first: dict[Any, int] = {}
        for index, (key, label) in enumerate(keys):
            if key in first:
                lines.append(
                    f"{section}[{index}] ({label}): "
                    + _("named twice (first as %(section)s[%(first)s]); give each once")
                    % {"section": section, "first": first[key]}
                )
            else:
                first[key] = index
    return lines


def _rules_by_name(agent: Agent | None) -> dict[str, list[DeterministicRule]]:
    """``agent``'s rules (None: the rules of no agent) by their composed name, each name's rules in the order the
    export writes them (``order``, then id). A rule stored decomposed is its composed namesake's, as ``_by_name``
    finds a row."""
    rules: dict[str, list[DeterministicRule]] = {}
    for rule in DeterministicRule.objects.filter(agent=agent).order_by("order", "id"):
        rules.setdefault(nfc_value(rule.name), []).append(rule)
    return rules


def _label(section: str, entry: Any) -> str:
    if not isinstance(entry, dict):
        return ""
    keys = {
        "servers": ("mcp_id",),
        "tools": ("mcp_id", "tool"),
        "contracts": ("mcp_id", "tool"),
        "agents": ("slug",),
        "rules": ("agent", "name"),
    }
    # A section of PLATFORM_CONFIG_SECTIONS (eval_sets) is named by its entries' name.
    return ".".join(str(entry.get(k)) for k in keys.get(section, ("name",)) if entry.get(k) is not None)


# The contract's fields whose entry key is another name (``contract_fields``); the others are their own key.
_CONTRACT_ENTRY_KEYS = {"fallback_tool": "fallback"}


def _contract_given(cspec: ContractSpec) -> dict[str, Any]:
    """The contract's field values ``cspec`` gives (``contract_fields``), without those of the keys it leaves out.
    An export gives every key, so its entries still set the whole contract."""
    given = cspec.model_fields_set
    return {
        name: value for name, value in contract_fields(cspec).items() if _CONTRACT_ENTRY_KEYS.get(name, name) in given
    }


# A rule entry's keys by the rule's field each one sets (``mcp_id``: the server it names); the rule editor's JSON
# view holds the same keys (``agents.rule_form``).
RULE_DOCUMENT_FIELDS = {
    "agent": "agent",
    "name": "name",
    "order": "order",
    "enabled": "enabled",
    "mcp_id": "server",
    "tool": "tool_name",
    "code": "code",
    "when": "when",
    "params": "params",
    "answer_template": "answer_template",
    "force_first_tool": "force_first_tool",
}
# What a code rule's entry does not hold: its code decides them (``DeterministicRule.UNUSED_BY_CODE``).
CODE_RULE_UNUSED_KEYS = ("when", "mcp_id", "tool", "params")
# What an existing rule's entry may change (its agent and name are how it is found).
_RULE_ENTRY_KEYS = {key: field for key, field in RULE_DOCUMENT_FIELDS.items() if key not in {"agent", "name"}}


def _rule_updated_key(rspec: RuleSpec, changed: list[str]) -> str:
    """An updated rule's report line, naming the entry's keys whose values changed (as a contract's does)."""
    keys = {attribute if attribute != "server" else "server_id": key for key, attribute in _RULE_ENTRY_KEYS.items()}
    return _("rule %(agent)s.%(rule)s (%(fields)s)") % {
        "agent": rspec.agent or "*",
        "rule": rspec.name,
        "fields": ", ".join(sorted(keys[name] for name in changed if name in keys)),
    }


def _secret_entries_changed(key: str, before: Any, after: Any) -> list[str]:
    """The names of a secret map's entries (``env``, ``headers``, ``model.secrets``) that an import added, changed
    or removed, as ``key.NAME``: a report line names them, never their values."""
    before, after = dict(before or {}), dict(after or {})
    return [f"{key}.{name}" for name in sorted(set(before) | set(after)) if before.get(name) != after.get(name)]


def _server_updated_key(mcp_id: str, before: dict[str, Any] | None, server: McpServer, changed: list[str]) -> str:
    """An updated server's report line, naming the entry's keys whose values changed (as a contract's does; a
    secret map by the names of its changed entries)."""
    keys: list[str] = []
    for name in changed:
        if name in {"env", "headers"}:
            keys += _secret_entries_changed(name, (before or {}).get(name), getattr(server, name))
        elif name in ServerSpec.model_fields:
            keys.append(name)
    if not keys:  # only what the server keeps of itself changed (its health, its breaker's state)
        return _("server %(server)s") % {"server": mcp_id}
    return _("server %(server)s (%(fields)s)") % {"server": mcp_id, "fields": ", ".join(sorted(keys))}


# An agent's fields by the key of its entry that sets each one, where the two differ.
_AGENT_ENTRY_KEYS = {"model_provider": "model.provider", "model_id": "model.model_id", "model_params": "model.params"}


def _agent_updated_key(slug: str, before: dict[str, Any], after: dict[str, Any]) -> str:
    """An updated agent's report line, naming the entry's keys whose values changed (as its versions' do)."""
    keys: list[str] = []
    for name, value in after.items():
        if before.get(name) == value:
            continue
        if name == "model_secrets":
            keys += _secret_entries_changed("model.secrets", before.get(name), value)
        elif name in _AGENT_ENTRY_KEYS:
            keys.append(_AGENT_ENTRY_KEYS[name])
        elif name in AgentSpec.model_fields:
            keys.append(name)
    if not keys:
        return _("agent %(agent)s") % {"agent": slug}
    return _("agent %(agent)s (%(fields)s)") % {"agent": slug, "fields": ", ".join(sorted(keys))}


def _contract_without_entry(tool: McpTool) -> ToolContract:
    """The unsaved contract an entry's keys are set on for a tool with none stored: what the gate applies to it
    without one (``contract_of``: its arguments read off its input schema), with the risk discovery gives a tool
    it lists (``contract_defaults``: ``write`` until an admin marks it read). Discovery keeps a contract saved
    before it, so a left-out risk taken as "read" would never be proposed ``write``: a silent downgrade."""
    contract = contract_of(tool)
    contract.risk = contract_defaults(tool.input_schema or {}, tool.annotations or {})["risk"]
    return contract


def _contract_updated_key(cspec: ContractSpec, changed: list[str]) -> str:
    """An updated contract's report line, naming the entry's keys whose values changed (as an agent's does)."""
    keys = sorted(_CONTRACT_ENTRY_KEYS.get(name, name) for name in changed if name in CONTRACT_FIELDS)
    return _("contract %(server)s.%(tool)s (%(fields)s)") % {
        "server": cspec.mcp_id,
        "tool": cspec.tool,
        "fields": ", ".join(keys),
    }


def _public_env_problems(
    public_env: list[str], env: dict[str, SecretSpec], server: McpServer, *, created: bool
) -> list[str]:
    """A name ``public_env`` marks as a setting (its value shown, in the admin and by ``export_config``) must be
    given its value in the document, ``{"value": ...}``, and must not be a secret stored already: with
    ``{"set": true}`` the stored secret became a setting and the next export wrote it in clear. As the admin
    refuses a name given as a setting and as a secret."""
    stored = {} if created else dict(server.env or {})
    shown = set() if created else set(server.public_env or [])
    problems = []
    for name in public_env:
        given = env.get(name)
        # A setting's value is given, or read from the environment (a reference, never a value), or kept where
        # the name is a setting already; {"set": true} on a stored secret would make it shown.
        kept_secret = given is not None and given.value is None and given.from_env is None and name not in shown
        if kept_secret and name in stored:
            problems.append(
                _(
                    "'%(name)s' is stored as a secret and a secret never becomes a setting: import it without "
                    "'%(name)s' first, then as a setting"
                )
                % {"name": name}
            )
        elif kept_secret:
            problems.append(
                _(
                    "'%(name)s' is a setting (shown), so give its value as {\"value\": ...}, not as a secret "
                    '({"set": true} or {"from_env": ...}); a secret is never shown'
                )
                % {"name": name}
            )
    return problems


def _new_tool_problem(server: McpServer, name: str) -> str:
    """Why an entry may not register ``name`` as a tool of ``server`` (no row has that name yet), or "". Once
    discovery has listed the server's tools, a name it did not list (a typo, ``get asset status!``) is refused,
    naming the tools, as a rule's tool is: registered, the row had no schema and counted as callable, and the
    model was offered a tool the server does not have. Before the first discovery there is no list to check
    against: the name is checked as discovery checks a listed one (``tool_name_problem``)."""
    discovered = McpTool.objects.filter(server=server, discovered_at__isnull=False)
    if not discovered.exists():
        return tool_name_problem(name)
    names = sorted(discovered.filter(available=True).values_list("name", flat=True))
    return _("'%(tool)s' is not a tool of this server; its tools are: %(names)s") % {
        "tool": name,
        "names": ", ".join(names) or "—",
    }


def _tool_switch(tool: McpTool, enabled: bool | None) -> dict[str, bool]:
    """The fields a document's ``enabled`` sets on ``tool`` (None: none). A tool waiting for a review
    (``mcp_server_discover``) stays disabled until approved: the document sets what approving restores. A tool
    named before discovery keeps the document's choice through the review its first listing may start."""
    if enabled is None:
        return {}
    if tool.review_required:
        return {"enabled_before_review": enabled}
    if tool.discovered_at is None and tool.pk is None:
        return {"enabled": enabled, "enabled_before_review": enabled}
    return {"enabled": enabled}


def _secret_map(
    specs: dict[str, SecretSpec] | None,
    stored: dict[str, Any],
    where: str,
    field: str,
    problems: _Problems,
    *,
    settings: Collection[str] = (),
) -> dict[str, Any]:
    """The secret map an entry's ``field`` gives: None (left out) keeps ``stored``; a given map holds its names
    only. A secret's value that is the audit's mask ("***") is refused: stored, it replaced the real secret
    unseen (a name in ``settings`` is shown, and "***" is its value as any other)."""
    if specs is None:
        return dict(stored)
    result: dict[str, Any] = {}
    for name, spec in specs.items():
        if spec.value is not None and name not in settings and masked_secret_given(spec.value):
            problems.add(
                where,
                f"{field}.{name}: "
                + _(
                    '"***" is how the audit and an export show a secret, not its value: give {"set": true} to keep '
                    "the stored value, or the secret itself"
                ),
            )
        elif spec.value is not None:
            result[name] = spec.value
        elif spec.from_env is not None:
            result[name] = {"from_env": spec.from_env}
        elif name in stored:
            result[name] = stored[name]
        else:
            problems.add(
                where,
                f"{field}.{name}: "
                + _(
                    '{"set": true} keeps the stored value, but no value is stored: give {"value": ...} or {"from_env": ...}'
                ),
            )
    return result


def _save(
    save: Callable[[], Any],
    obj: Any,
    key: str,
    report: ImportReport,
    created: bool,
    before: dict[str, Any] | None,
    where: str,
    problems: _Problems,
    *,
    updated_key: Callable[[list[str]], str] | None = None,
    name_from: str | None = None,
) -> None:
    """Save through ``save`` (a service, which validates and records the change); a validation error becomes a
    problem of the entry. ``updated_key``: an updated entry's line from the fields that changed (their attnames).
    ``name_from``: the field the entry's name, not given, was taken from (``_given_name_only``)."""
    try:
        save()
    except ValidationError as exc:
        for name, messages in _given_name_only(exc.message_dict, name_from).items():
            for message in messages:
                problems.add(where, f"{name}: {message}" if name != "__all__" else message)
        return
    after = _fields(obj)
    if created:
        report.created.append(key)
    elif before != after:
        changed = [name for name, value in after.items() if before is None or before.get(name) != value]
        report.updated.append(updated_key(changed) if updated_key else key)
    else:
        report.unchanged.append(key)


def _given_name_only(refusals: dict[str, list[str]], name_from: str | None) -> dict[str, list[str]]:
    """``refusals`` without the name's where the entry gave no name and the field it was taken from
    (``name_from``: a server's mcp_id, an agent's slug) is refused: the problem is that field's, named once (an
    empty or too long mcp_id was also reported as a name the entry never gave)."""
    if name_from is None or name_from not in refusals:
        return refusals
    return {name: messages for name, messages in refusals.items() if name != "name"}


def _refusal_messages(exc: ValidationError) -> dict[str, list[str]]:
    """``exc``'s messages by field (``__all__``: not a field's)."""
    return exc.message_dict if hasattr(exc, "error_dict") else {"__all__": exc.messages}


def _refusals_add(problems: _Problems, where: str, refusals: dict[str, list[str]]) -> None:
    """One problem of the entry ``where`` per refused field, its messages together."""
    for name, messages in refusals.items():
        problems.add(where, "; ".join(messages) if name == "__all__" else f"{name}: {'; '.join(messages)}")


def _field_defaults(obj: Any) -> dict[str, Any]:
    """A new row's values (the fields' defaults), by attname, as ``_fields`` gives a stored one's."""
    return {f.attname: f.get_default() for f in obj._meta.concrete_fields}


def _every_refusal(obj: Any, refused: dict[str, list[str]], *, kept: dict[str, Any]) -> dict[str, list[str]]:
    """``refused`` (why a save of ``obj`` was refused, by field; {}: no save was tried) with every other field the
    model's own validation (``full_clean``) refuses in ``obj``. Nothing is written.

    ``Agent.clean`` stops at its first failing check, so a refused import named one problem of an agent's entry
    per round of fixing and importing again (a slug, then a language, then an answer template). Here copies of
    ``obj`` are validated again, the fields already refused set aside at their values in ``kept`` (as read, or a
    new row's defaults), until a round refuses nothing new: the model's checks run as they are, never a second
    copy of them. A field refused still beside the entry's other values (a flow graph that cannot load, beside
    ``mode`` "flow") has the entry's field it needs set aside with it (``_coupled_field``). A later round judges
    the other fields beside the values set aside (a check of two fields names the one left as it stands beside
    the other's kept value)."""
    refused = dict(refused)
    attnames = {f.name: f.attname for f in obj._meta.concrete_fields if f.attname in kept}
    aside = [name for name in refused if name in attnames]
    while (found := _refused_beside(obj, aside, kept=kept, attnames=attnames)) is not None:
        new = {name: messages for name, messages in found.items() if name not in refused}
        refused.update(new)
        more = [name for name in new if name in attnames]
        if not more and (coupled := _coupled_field(obj, refused, aside, kept=kept, attnames=attnames)):
            more = [coupled]
        if not more:
            return refused  # nothing left to set aside: another round would find the same
        aside += more
    return refused


def _refused_beside(
    obj: Any, aside: list[str], *, kept: dict[str, Any], attnames: dict[str, str]
) -> dict[str, list[str]] | None:
    """What ``full_clean`` refuses, by field, in a copy of ``obj`` whose fields ``aside`` take their values in
    ``kept``; None: nothing."""
    candidate = copy.copy(obj)
    for name in aside:
        setattr(candidate, attnames[name], copy.deepcopy(kept[attnames[name]]))
    try:
        candidate.full_clean(exclude=aside)
    except ValidationError as exc:
        return _refusal_messages(exc)
    return None


def _coupled_field(
    obj: Any, refused: dict[str, list[str]], aside: list[str], *, kept: dict[str, Any], attnames: dict[str, str]
) -> str | None:
    """A field the entry changed (not set aside yet) that keeps a refused field failing at its kept value: set
    aside too, the checks after that one run. None where there is none."""
    for name, attname in attnames.items():
        if name in aside or getattr(obj, attname) == kept[attname]:
            continue
        found = _refused_beside(obj, [*aside, name], kept=kept, attnames=attnames)
        if found is None or set(found) - set(refused):
            return name
    return None


def _fields(obj: Any) -> dict[str, Any]:
    return {
        f.attname: getattr(obj, f.attname)
        for f in obj._meta.concrete_fields
        if f.attname not in {"created_at", "updated_at"}
    }


@transaction.atomic
def config_import(
    *,
    document: dict[str, Any],
    actor: Any,
    via: str = "import_config",
    dry_run: bool = False,
    progress: Callable[[str], None] | None = None,
    progress_every: int = 500,
) -> ImportReport:
    """Apply a configuration document. Raises ApplicationError naming every offending entry; then nothing
    was changed. With ``dry_run`` the changes are computed and rolled back, their audit events with them.

    Every entry is written by its service (``mcp_server_*``, ``tool_contract_*``, ``agent_*``,
    ``deterministic_rule_*``, ``agent_version_import``, ``agent_arm_*``), so each change is one audit event naming
    ``actor`` and the path ``via``. The sections of ``PLATFORM_CONFIG_SECTIONS`` (e.g. ``eval_sets``) are imported
    last, in the same transaction.

    Versions: an agent's ``versions`` are stored under their numbers (a number the agent has already must have
    the same content: versions never change), then its ``live_version``, ``shadow`` and ``arms`` are set to
    the versions they name, then ``publish_on_save``. Publishing on save is held back while the entries apply;
    at the end an agent that publishes on save and changed publishes once, unless the document chooses another
    live version than the one live before (naming the one live, as an export does, is no choice).

    ``progress`` is told, for a section of ``progress_every`` entries or more, each time that many more are
    applied and when the section is done ("tools: 500/1000"): a large document takes minutes."""
    with publish_on_save_deferred() as deferred, tool_name_checks_deferred():
        return _config_import(
            document=document,
            actor=actor,
            via=via,
            dry_run=dry_run,
            deferred=deferred,
            progress=progress,
            progress_every=progress_every,
        )


def _counted(
    section: str, entries: list[_Entry], *, tell: Callable[[str], None] | None, every: int
) -> Iterator[tuple[int, _Entry]]:
    """``enumerate(entries)``, telling ``tell`` how many of the section's entries are applied (each yielded
    entry's turn is over when the next is asked for), every ``every`` entries and at the end; a section of
    fewer entries is not told of."""
    for index, entry in enumerate(entries):
        yield index, entry
        done = index + 1
        if tell is not None and len(entries) >= every and (done % every == 0 or done == len(entries)):
            tell(_("%(section)s: %(done)s/%(total)s") % {"section": section, "done": done, "total": len(entries)})


def _config_import(
    *,
    document: dict[str, Any],
    actor: Any,
    via: str,
    dry_run: bool,
    deferred: set[int],
    progress: Callable[[str], None] | None,
    progress_every: int,
) -> ImportReport:
    def counted(section: str, entries: list[_Entry]) -> Iterator[tuple[int, _Entry]]:
        return _counted(section, entries, tell=progress, every=progress_every)

    if not isinstance(document, dict):
        raise ApplicationError(
            _("the document must be an object with servers, contracts, agents, rules"), code="invalid_config"
        )
    if found := document_problems(document):
        raise ApplicationError(_not_valid(found), code="invalid_config")
    if EXPORT_HEADER in document and (
        type(document[EXPORT_HEADER]) is not int or document[EXPORT_HEADER] != EXPORT_FORMAT  # not true, not 1.0
    ):
        raise ApplicationError(
            _("%(header)s: %(value)s is not a format this installation reads (it writes and reads %(format)s)")
            % {"header": EXPORT_HEADER, "value": json.dumps(document[EXPORT_HEADER])[:40], "format": EXPORT_FORMAT},
            code="invalid_config",
        )
    if EXPORT_HEADER in document and document.get(EXPORT_END) is not True:
        raise ApplicationError(
            _(
                "the document was cut short: it begins as export_config writes one (%(header)s) but lacks the "
                "last key an export ends with (%(end)s: true). Export it again, or copy all of it."
            )
            % {"header": EXPORT_HEADER, "end": EXPORT_END},
            code="invalid_config",
        )
    document = _composed({k: v for k, v in document.items() if k not in (EXPORT_HEADER, EXPORT_END)})
    sections = config_sections()
    extra = {name: document[name] for name in sections if name in document}
    config = _parse({k: v for k, v in document.items() if k not in sections}, sections=sorted(sections))
    if twice := _named_twice(config, extra, sections):
        raise ApplicationError(_not_valid(twice), code="invalid_config")
    problems = _Problems()
    report = ImportReport()
    conflicts_before = agent_tool_name_conflicts()  # the clashes there are: the import is refused only its own
    failing_before = rules_failing_for_want_of_a_tool()  # likewise: the report names the rules the import fails
    # What each agent that publishes on save would freeze before the import: at the end only those whose frozen
    # content it changed publish (after a roll back, the same document published the draft and undid it).
    frozen_before = publish_on_save_digests(Agent.objects.filter(publish_on_save=True))
    servers: dict[str, McpServer] = {s.mcp_id: s for s in McpServer.objects.all()}
    # Where the document gives each server and agent: an entry that refers to one whose own entry is not valid
    # says so (its problems are reported there), not that it is unknown.
    server_entries = {spec.mcp_id: i for i, spec in enumerate(config.servers)}
    agent_entries = {spec.slug: i for i, spec in enumerate(config.agents)}

    def server_problem(mcp_id: str) -> str:
        if mcp_id in server_entries:
            return _("server '%(server)s' is not valid (see servers[%(index)s])") % {
                "server": mcp_id,
                "index": server_entries[mcp_id],
            }
        return _("unknown server '%(server)s'") % {"server": mcp_id}

    for i, spec in counted("servers", config.servers):
        where = f"servers[{i}] ({spec.mcp_id})"
        server = servers.get(spec.mcp_id)
        created = server is None
        if server is not None and not server.secrets_readable():
            problems.add(where, unreadable_secrets_problem())
            continue
        server = server or McpServer(mcp_id=spec.mcp_id)
        before = None if created else _fields(server)
        server.name = spec.name or server.name or spec.mcp_id
        # A key left out of an existing server's entry leaves that setting alone (as an agent's does); a new
        # server takes the defaults. Before, a left-out timeout, scope or prefix was set back to its default.
        given = set(ServerSpec.model_fields) if created else spec.model_fields_set
        if "transport" in given and spec.transport != server.transport:
            # Another transport: its connection settings start afresh (an HTTP server kept the stdio command and
            # arguments it no longer uses, and exported them).
            given = given | set(_CONNECTION_SETTINGS)
        for name in _SERVER_SETTINGS:
            if name in given:
                setattr(server, name, getattr(spec, name))
        if spec.breaker_threshold is not None:
            server.breaker_threshold = spec.breaker_threshold
        if spec.breaker_cooldown_s is not None:
            server.breaker_cooldown_s = spec.breaker_cooldown_s
        stored_env, stored_headers = dict(server.env or {}), dict(server.headers or {})
        stored_public = [] if created else list(server.public_env or [])
        # Left out, env is every stored name kept ({"set": true}): the settings among them stay settings.
        env = spec.env if spec.env is not None else {name: SecretSpec(set=True) for name in stored_env}
        # Left out, public_env is the stored list as it is: a name marked a setting before it has a value (the demo's
        # FAILURE_TIMEOUT_S) stays one, not turned into a secret by an import that changed another value.
        public_env = spec.public_env if spec.public_env is not None else stored_public
        for message in _public_env_problems(public_env, env, server, created=created):
            problems.add(where, f"public_env: {message}")
        server.public_env = public_env
        server.env = _secret_map(spec.env, stored_env, where, "env", problems, settings=public_env)
        server.headers = _secret_map(spec.headers, stored_headers, where, "headers", problems)
        removed = [f"env.{name}" for name in stored_env if name not in server.env and name not in stored_public] + [
            f"headers.{name}" for name in stored_headers if name not in server.headers
        ]
        report.deleted.extend(
            _("secret %(name)s of server %(server)s") % {"name": name, "server": spec.mcp_id} for name in removed
        )
        _stored_where_composed_alike(server, before)
        _save(
            functools.partial(mcp_server_update, server=server, actor=actor, via=via),
            server,
            _("server %(server)s") % {"server": spec.mcp_id},
            report,
            created,
            before,
            where,
            problems,
            updated_key=functools.partial(_server_updated_key, spec.mcp_id, before, server),
            name_from=None if spec.name else "mcp_id",
        )
        servers[spec.mcp_id] = server

    tools_by_name: dict[int, dict[str, McpTool]] = {}  # each server's tools (``_by_name``), read once

    def server_tools(server: McpServer) -> dict[str, McpTool]:
        if server.pk not in tools_by_name:
            tools_by_name[server.pk] = _by_name(McpTool.objects.filter(server=server).order_by("name", "pk"))
        return tools_by_name[server.pk]

    for i, tspec in counted("tools", config.tools):
        where = f"tools[{i}] ({tspec.mcp_id}.{tspec.tool})"
        server = servers.get(tspec.mcp_id)
        if server is None or server.pk is None:
            problems.add(where, server_problem(tspec.mcp_id))
            continue
        # As for a contract: a tool named before discovery is registered now and filled in by discovery.
        tool = server_tools(server).get(tspec.tool)
        if tool is None and (problem := _new_tool_problem(server, tspec.tool)):
            problems.add(where, f"tool: {problem}")
            continue
        created = tool is None
        tool = tool or McpTool(server=server, name=tspec.tool)
        before = None if created else _fields(tool)
        # A key left out of an existing tool's entry keeps the stored value, as a contract's does (its tags and
        # example queries, which top-K selection reads, were emptied by an entry that only switched it on).
        for name in ("tags", "example_queries"):
            if created or name in tspec.model_fields_set:
                setattr(tool, name, getattr(tspec, name))
        switch = _tool_switch(tool, tspec.enabled)
        for name, value in switch.items():
            setattr(tool, name, value)
        _stored_where_composed_alike(tool, before)
        save = (
            functools.partial(
                mcp_tool_create,
                server=server,
                name=tspec.tool,
                actor=actor,
                via=via,
                data={"tags": tspec.tags, "example_queries": tspec.example_queries, **switch},
            )
            if created
            else functools.partial(mcp_tool_update, tool=tool, actor=actor, via=via)
        )
        label = _("tool %(server)s.%(tool)s") % {"server": tspec.mcp_id, "tool": tspec.tool}
        _save(save, tool, label, report, created, before, where, problems)
        if created and (row := McpTool.objects.filter(server=server, name=tspec.tool).first()) is not None:
            server_tools(server)[tspec.tool] = row

    # Whether a contract's fallback called in the gate is a write is checked once every contract is saved, on what
    # the document leaves (entry by entry, the answer depended on the entries' order).
    saved_contracts: list[tuple[str, ToolContract, dict[str, Any] | None]] = []
    with fallback_checks_deferred():
        for i, cspec in counted("contracts", config.contracts):
            where = f"contracts[{i}] ({cspec.mcp_id}.{cspec.tool})"
            server = servers.get(cspec.mcp_id)
            if server is None or server.pk is None:
                problems.add(where, server_problem(cspec.mcp_id))
                continue
            if not 1 <= len(cspec.tool) <= TOOL_NAME_MAX:
                problems.add(
                    where, "tool: " + _("a tool's name has 1 to %(limit)s characters") % {"limit": TOOL_NAME_MAX}
                )
                continue
            # A contract may come before discovery: the tool row is created now and filled in by discovery.
            tool = server_tools(server).get(cspec.tool)
            if tool is None and (problem := _new_tool_problem(server, cspec.tool)):
                problems.add(where, f"tool: {problem}")
                continue
            if tool is None:
                # Its own change and audit event (config.mcp_tool.create): reported as the tools section's are, so
                # that the report accounts for every event the import writes.
                tool = server_tools(server)[cspec.tool] = mcp_tool_create(
                    server=server, name=cspec.tool, actor=actor, via=via
                )
                report.created.append(_("tool %(server)s.%(tool)s") % {"server": cspec.mcp_id, "tool": cspec.tool})
            contract = ToolContract.objects.filter(tool=tool).first()
            created = contract is None
            contract = contract or _contract_without_entry(tool)
            before = None if created else _fields(contract)
            # Only the keys the entry gives: one left out keeps the stored value, as a server's or an agent's
            # does (it was set back to the model's default: a write tool became read, its calls unapproved).
            for name, value in _contract_given(cspec).items():
                setattr(contract, name, value)
            _stored_where_composed_alike(contract, before)
            known = len(problems.items)
            _save(
                functools.partial(tool_contract_update, contract=contract, actor=actor, via=via),
                contract,
                _("contract %(server)s.%(tool)s") % {"server": cspec.mcp_id, "tool": cspec.tool},
                report,
                created,
                before,
                where,
                problems,
                updated_key=functools.partial(_contract_updated_key, cspec),
            )
            if len(problems.items) == known:
                saved_contracts.append((where, contract, before))
    for where, contract, before in saved_contracts:
        became_write = contract.risk == ToolContract.Risk.WRITE and (
            before is None or before["risk"] != ToolContract.Risk.WRITE
        )
        for name, message in fallback_call_problems(contract, became_write=became_write):
            problems.add(where, f"{name}: {message}")

    agents: dict[str, Agent] = {a.slug: a for a in Agent.objects.all()}
    leaving: dict[str, set[str]] = {}
    clashing: set[str] = set()  # the agents whose entry was refused for two tools of one name
    for i, aspec in counted("agents", config.agents):
        where = f"agents[{i}] ({aspec.slug})"
        agent = agents.get(aspec.slug)
        created = agent is None
        if agent is not None and not readable(agent.model_secrets):
            problems.add(where, unreadable_secrets_problem())
            continue
        agent = agent or Agent(slug=aspec.slug)
        before = (
            None if created else {**_fields(agent), "servers": sorted(agent.servers.values_list("mcp_id", flat=True))}
        )
        # A key left out of an existing agent's entry leaves its setting alone; a new agent takes the defaults.
        given = set(AgentSpec.model_fields) if created else aspec.model_fields_set
        model_given = (
            set(ModelSpec.model_fields) if created else aspec.model.model_fields_set if "model" in given else set()
        )
        agent.name = aspec.name or agent.name or aspec.slug
        name_from = None if aspec.name else "slug"
        for name in _AGENT_SETTINGS:
            if name in given:
                setattr(agent, name, getattr(aspec, name))
        if aspec.deterministic_instruction is not None:
            agent.deterministic_instruction = aspec.deterministic_instruction
        for name, attribute in (("provider", "model_provider"), ("model_id", "model_id"), ("params", "model_params")):
            if name in model_given:
                setattr(agent, attribute, getattr(aspec.model, name))
        stored_secrets = dict(agent.model_secrets or {})
        secrets = {str(k): v for k, v in aspec.model.secrets.items()} if aspec.model.secrets is not None else None
        agent.model_secrets = _secret_map(secrets, stored_secrets, where, "model.secrets", problems)
        report.deleted.extend(
            _("secret %(name)s of agent %(agent)s") % {"name": f"model.secrets.{name}", "agent": aspec.slug}
            for name in stored_secrets
            if name not in agent.model_secrets
        )
        names = aspec.servers if "servers" in given else sorted(agent.servers.values_list("mcp_id", flat=True))
        missing = [m for m in names if m not in servers or servers[m].pk is None]
        if unknown := [m for m in missing if m not in server_entries]:
            problems.add(where, _("unknown server(s): %(servers)s") % {"servers": ", ".join(unknown)})
        for mcp_id in missing:
            if mcp_id in server_entries:
                problems.add(where, server_problem(mcp_id))
        # What the entry is checked against once a refusal has named a field: the agent as it was read, or a new
        # agent's defaults (``_every_refusal``).
        kept = _field_defaults(agent) if created else before or {}
        if missing:
            # Not applied without its servers, but what the agent's own validation refuses is named now too: found
            # on the next run, it was one more round of fixing and importing again.
            _refusals_add(problems, where, _given_name_only(_every_refusal(agent, {}, kept=kept), name_from))
            continue
        _stored_where_composed_alike(agent, before)
        bound = [servers[m] for m in names]
        if conflict := tool_name_conflict_problem(bound):
            problems.add(where, f"servers: {conflict}")
            clashing.add(aspec.slug)
        leaving[aspec.slug] = servers_leaving(agent=agent, servers=bound)
        try:
            # Its rules may move with it: whether a rule still calls a server it leaves is checked once they are in.
            agent_update(agent=agent, actor=actor, via=via, servers=bound, check_rules=False)
        except ValidationError as exc:
            refused = _every_refusal(agent, _refusal_messages(exc), kept=kept)
            _refusals_add(problems, where, _given_name_only(refused, name_from))
            continue
        after = {**_fields(agent), "servers": sorted(names)}
        if created:
            report.created.append(_("agent %(agent)s") % {"agent": aspec.slug})
        elif before != after:
            report.updated.append(_agent_updated_key(aspec.slug, before or {}, after))
        else:
            report.unchanged.append(_("agent %(agent)s") % {"agent": aspec.slug})
        agents[aspec.slug] = agent

    # A rule is keyed by its agent, its name and its occurrence: the document's k-th rule of a name for an agent is
    # the agent's k-th rule of that name in the export's order (``order``, then id). The admin and the services
    # allow two rules of one name; keyed by name alone, an installation's own export was refused ("named twice").
    # The document's rules of a name are ranked the same way (``order``, then their place in the document, as the
    # rules an import creates take ascending ids in that place's order), not by their place alone: two listed out
    # of ``order`` traded contents on every import, and an import into an empty installation disagreed with a
    # re-import.
    occurrences: dict[int, int] = {}
    same_named: dict[tuple[str | None, str], list[int]] = {}
    for i, rspec in enumerate(config.rules):
        same_named.setdefault((rspec.agent, rspec.name), []).append(i)
    for indices in same_named.values():
        for rank, i in enumerate(sorted(indices, key=lambda i: (config.rules[i].order, i))):
            occurrences[i] = rank
    stored_rules: dict[str | None, dict[str, list[DeterministicRule]]] = {}
    for i, rspec in counted("rules", config.rules):
        where = f"rules[{i}] ({rspec.agent or '*'}.{rspec.name})"
        occurrence = occurrences[i]
        agent = agents.get(rspec.agent) if rspec.agent else None
        if rspec.agent and agent is None:
            problems.add(
                where,
                _("agent '%(agent)s' is not valid (see agents[%(index)s])")
                % {"agent": rspec.agent, "index": agent_entries[rspec.agent]}
                if rspec.agent in agent_entries
                else _("unknown agent '%(agent)s'") % {"agent": rspec.agent},
            )
            continue
        # A code rule decides its own conditions, tool and parameters (seed 000): what an export written before the
        # rule refused them still carries of them is left out, with a warning, so that it imports (it was refused,
        # and the whole document with it).
        unused = [key for key in CODE_RULE_UNUSED_KEYS if rspec.code and getattr(rspec, key)]
        if unused:
            report.warnings.append(
                _("%(where)s: a code rule decides its own conditions, tool and parameters; left out: %(keys)s")
                % {"where": where, "keys": ", ".join(unused)}
            )
        server = servers.get(rspec.mcp_id) if rspec.mcp_id and "mcp_id" not in unused else None
        if rspec.mcp_id and "mcp_id" not in unused and (server is None or server.pk is None):
            problems.add(where, server_problem(rspec.mcp_id))
            continue
        if rspec.agent not in stored_rules:  # read before any of its rules is saved: the order is the stored one
            stored_rules[rspec.agent] = _rules_by_name(agent)
        same_name = stored_rules[rspec.agent].get(rspec.name, [])
        rule = same_name[occurrence] if occurrence < len(same_name) else None
        created = rule is None
        rule = rule or DeterministicRule(agent=agent, name=rspec.name)
        before = None if created else _fields(rule)
        # A key left out of an existing rule's entry keeps the stored value, as a contract's does (a disabled rule
        # was switched back on and moved to order 100 by an entry that changed its template); a new rule takes the
        # defaults.
        given = (set(RuleSpec.model_fields) if created else rspec.model_fields_set) - set(unused)
        for key, attribute in _RULE_ENTRY_KEYS.items():
            if key in given:
                setattr(rule, attribute, server if key == "mcp_id" else getattr(rspec, key))
        _stored_where_composed_alike(rule, before)
        _save(
            functools.partial(deterministic_rule_update, rule=rule, actor=actor, via=via),
            rule,
            _("rule %(agent)s.%(rule)s") % {"agent": rspec.agent or "*", "rule": rspec.name},
            report,
            created,
            before,
            where,
            problems,
            updated_key=functools.partial(_rule_updated_key, rspec),
        )

    for i, aspec in enumerate(config.agents):
        if aspec.slug in agents and (
            calling := rules_calling(agent=agents[aspec.slug], mcp_ids=leaving.get(aspec.slug, set()))
        ):
            problems.add(f"agents[{i}] ({aspec.slug})", f"servers: {unbinding_refused(calling)}")

    named_live = _apply_versions(config.agents, agents, actor=actor, via=via, report=report, problems=problems)
    # Checked once every entry is in, for every agent (a server's prefix or a tool switched on may clash in an
    # agent the document does not list): entry by entry, a prefix and the binding that fixes it were refused. Only
    # a clash the import makes: one there before does not refuse every later import.
    for slug, clash in tool_name_clashes_made(conflicts_before, agent_tool_name_conflicts()).items():
        if slug not in clashing:
            problems.add(f"agents[{agent_entries[slug]}] ({slug})" if slug in agent_entries else slug, clash)

    for name, entries in extra.items():
        sections[name].section_import(entries, actor=actor, via=via, report=report, problem=problems.add)

    if not problems.items:
        for agent in Agent.objects.filter(pk__in=deferred - named_live, publish_on_save=True).order_by("slug"):
            if not publishes_after(agent, frozen_before):
                continue
            live = agent.live_version_id
            try:
                version = agent_version_publish(agent=agent, actor=actor, via=via, note="published on save")
            except ValidationError as exc:  # a draft that cannot run stays a draft, as an admin's edit does
                report.warnings.append(
                    _("Agent %(agent)s was not published on save: %(problems)s")
                    % {"agent": agent.slug, "problems": "; ".join(exc.messages)}
                )
                continue
            if version.pk != live:  # the same content as the live version's publishes nothing
                report.created.append(
                    _("version %(agent)s v%(number)s") % {"agent": agent.slug, "number": version.number}
                )

    if problems.items:
        transaction.set_rollback(True)
        raise ApplicationError(
            _("configuration was not imported:") + "\n" + "\n".join(_capped(problems.items)), code="invalid_config"
        )
    # A contract may tighten what a stored rule sends on purpose (the rule editor refuses the reverse): the rules
    # every call of which the imported contracts now refuse are named, as on the contract's page.
    for _where, contract, before in saved_contracts:
        if before != _fields(contract):
            report.warnings.extend(rules_refused_by_tool_contract(tool=contract.tool))
    # A tool or server the document switches off, or a rule it switches on or points at a tool runs cannot call:
    # the enabled rules that now fail every run they decide, as the tool's and the server's pages name them.
    report.warnings.extend(text for pk, text in rules_failing_for_want_of_a_tool().items() if pk not in failing_before)
    if dry_run:
        transaction.set_rollback(True)
    return report


def _apply_versions(
    specs: list[AgentSpec],
    agents: dict[str, Agent],
    *,
    actor: Any,
    via: str,
    report: ImportReport,
    problems: _Problems,
) -> set[int]:
    """The agents' versions, live version, shadow, arms and publish on save, through the services. Returns the
    ids of the agents whose live version the document chooses: one other than the version live before the import.
    The version already live, named (an export's round trip, edited), is no choice: an agent that publishes on save
    publishes its draft at the end, as the same edit in the admin does. A setting naming a version this import
    refused or that is missing is left as it is (its problem is the version's, named once)."""
    named_live: set[int] = set()
    for i, aspec in enumerate(specs):
        agent = agents.get(aspec.slug)
        if agent is None or agent.pk is None:
            continue  # its problem is reported already
        where = f"agents[{i}] ({aspec.slug})"
        versions = {v.number: v for v in AgentVersion.objects.filter(agent=agent)}
        refused: set[int] = set()  # the numbers of the versions this entry gives that were refused
        for vspec in aspec.versions:
            label = _("version %(agent)s v%(number)s") % {"agent": aspec.slug, "number": vspec.number}
            content = vspec.content.model_dump()
            stored = versions.get(vspec.number)
            if stored is None:
                try:
                    versions[vspec.number] = agent_version_import(
                        agent=agent,
                        number=vspec.number,
                        content=cast(VersionContent, content),
                        note=vspec.note,
                        actor=actor,
                        via=via,
                        warn=report.warnings.append,
                    )
                except ValidationError as exc:
                    for message in exc.messages:
                        problems.add(where, f"versions: v{vspec.number}: {message}")
                    refused.add(vspec.number)
                    continue
                report.created.append(label)
            # Both composed: the document's base URL is as written (``_AS_WRITTEN``), one stored may be either.
            elif nfc_value(version_content_portable(stored.content)) == nfc_value(version_content_portable(content)):
                report.unchanged.append(label)
            else:
                problems.add(
                    where,
                    "versions: "
                    + _(
                        "v%(number)s is not the content of this installation's v%(number)s (a version never "
                        "changes; leave it out or give it another number)"
                    )
                    % {"number": vspec.number},
                )

        def version(
            number: int | None,
            what: str,
            versions: dict[int, AgentVersion] = versions,
            where: str = where,
            refused: set[int] = refused,
        ) -> AgentVersion | None:
            found = versions.get(number) if number is not None else None
            if number is not None and found is None and number not in refused:
                problems.add(where, f"{what}: " + _("no version %(number)s (give it in versions)") % {"number": number})
            return found

        def unresolved(number: int | None, versions: dict[int, AgentVersion] = versions) -> bool:
            """Whether ``number`` names a version there is not (missing, or refused): its problem is named once,
            and the setting naming it is left as it is (set to none, it added "Without a live version…")."""
            return number is not None and number not in versions

        given = aspec.model_fields_set
        agent.refresh_from_db()
        live_before = agent.live_version_id
        publishes_on_save = aspec.publish_on_save if aspec.publish_on_save is not None else agent.publish_on_save
        data: dict[str, Any] = {}
        if "publish_on_save" in given and aspec.publish_on_save is not None:
            data["publish_on_save"] = aspec.publish_on_save
        if "live_version" in given and (aspec.live_version is not None or not publishes_on_save):
            # An agent that publishes on save has its draft live: a null live version leaves that to publish on
            # save (unset, it was published again by every import of the document).
            live = version(aspec.live_version, "live_version")
            if not unresolved(aspec.live_version):
                data["live_version"] = live
            if live is not None and live.pk != live_before:
                named_live.add(agent.pk)
        if "shadow" in given:
            shadow_number = aspec.shadow.version if aspec.shadow else None
            shadow = version(shadow_number, "shadow")
            if not unresolved(shadow_number):
                data["shadow_version"] = shadow
                data["shadow_sample_rate"] = aspec.shadow.sample_rate if aspec.shadow else 0.0
        changed = sorted(name for name, value in data.items() if getattr(agent, name) != value)
        if changed:
            try:
                agent_update(agent=agent, actor=actor, via=via, data={name: data[name] for name in changed})
            except ValidationError as exc:
                for name, messages in exc.message_dict.items():
                    problems.add(where, f"{name}: {'; '.join(messages)}")
            else:
                # A new agent's publish on save and live version are part of its creation, reported once.
                if _("agent %(agent)s") % {"agent": aspec.slug} not in report.created:
                    report.updated.append(
                        _("agent %(agent)s (%(fields)s)") % {"agent": aspec.slug, "fields": ", ".join(changed)}
                    )

        if aspec.arms is None:
            continue
        arms = {arm.name: arm for arm in AgentArm.objects.filter(agent=agent)}
        for arm_spec in aspec.arms:
            label = _("arm %(agent)s.%(arm)s") % {"agent": aspec.slug, "arm": arm_spec.name}
            arm_version = version(arm_spec.version, f"arms.{arm_spec.name}")
            if arm_version is None:
                continue
            arm = arms.pop(arm_spec.name, None)
            try:
                if arm is None:
                    agent_arm_create(
                        actor=actor,
                        via=via,
                        data={
                            "agent": agent,
                            "name": arm_spec.name,
                            "version": arm_version,
                            "weight": arm_spec.weight,
                        },
                    )
                    report.created.append(label)
                elif (arm.version_id, arm.weight) != (arm_version.pk, arm_spec.weight):
                    agent_arm_update(
                        arm=arm, actor=actor, via=via, data={"version": arm_version, "weight": arm_spec.weight}
                    )
                    report.updated.append(label)
                else:
                    report.unchanged.append(label)
            except ValidationError as exc:
                for name, messages in exc.message_dict.items():
                    for message in messages:
                        problems.add(where, f"arms.{arm_spec.name}{'' if name == '__all__' else '.' + name}: {message}")
        for arm in arms.values():
            agent_arm_delete(arm=arm, actor=actor, via=via)
            report.deleted.append(_("arm %(agent)s.%(arm)s") % {"agent": aspec.slug, "arm": arm.name})
    return named_live


def agent_versions_entry(agent: Agent) -> dict[str, Any]:
    """An agent's version settings as ``export_config`` writes them: publish on save, the live version, the
    shadow candidate and rate, the arms, and the versions these name (their frozen content, portable). The rest
    of the history stays in the installation (and its audit record)."""
    arms = list(AgentArm.objects.filter(agent=agent).select_related("version").order_by("name"))
    live = agent.live_version
    if live is not None and agent.publish_on_save and live.digest == content_digest(version_content(agent)):
        # The draft published on save, no choice of a version: null leaves it to publish on save. Written as its
        # number, the next import of the same document, edited, chose that old version again and set it live.
        live = None
    named = [v for v in (live, agent.shadow_version, *(arm.version for arm in arms)) if v is not None]
    shadowed = agent.shadow_version is not None or agent.shadow_sample_rate
    return {
        "publish_on_save": agent.publish_on_save,
        "live_version": live.number if live else None,
        "shadow": (
            {
                "version": agent.shadow_version.number if agent.shadow_version else None,
                "sample_rate": agent.shadow_sample_rate,
            }
            if shadowed
            else None
        ),
        "arms": [{"name": arm.name, "version": arm.version.number, "weight": arm.weight} for arm in arms],
        "versions": [
            {"number": v.number, "note": v.note, "content": _sorted_keys(version_content_portable(v.content))}
            for v in sorted({v.pk: v for v in named}.values(), key=lambda v: v.number)
        ],
    }


def _sorted_keys(value: Any) -> Any:
    """A JSON value with its objects' keys sorted, at every level: what a document writes of a free-form object
    (a contract's arguments, a rule's conditions, a version's content) is the same text after any round trip
    (PostgreSQL's ``jsonb`` and the contract's own model ordered the keys their way)."""
    if isinstance(value, dict):
        return {key: _sorted_keys(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_sorted_keys(item) for item in value]
    return value


def _exported_secrets(stored: dict[str, Any], *, public: list[str] | None = None) -> dict[str, Any]:
    """Secret values as ``{"set": true}`` (or their ``from_env`` reference); a non-secret env value (named in
    ``public``) as itself."""
    shown = set(public or [])
    return {
        k: (
            {"from_env": v["from_env"]}
            if isinstance(v, dict) and "from_env" in v
            else {"value": v}
            if k in shown and isinstance(v, str)
            else {"set": True}
        )
        for k, v in stored.items()
    }


def unreadable_secrets_problem() -> str:
    """An import's problem with a server or agent whose stored secrets this process cannot decrypt: it could keep
    none of them (``{"set": true}``) nor tell which are set."""
    return _(
        "its stored secrets cannot be decrypted with this server's keys (SECRETS_ENCRYPTION_KEYS lacks the key they "
        "were encrypted with): add that key back, or enter them again in the admin, before importing over it"
    )


def config_export() -> dict[str, Any]:
    """The whole configuration as a document ``config_import`` accepts. No secret value is written.

    Raises ``SecretDecryptionError`` naming the servers and agents whose stored secrets this process cannot
    decrypt: the document would not say which of their secrets are set."""
    unreadable = [
        *(_("server %(server)s") % {"server": s.mcp_id} for s in McpServer.objects.all() if not s.secrets_readable()),
        *(_("agent %(agent)s") % {"agent": a.slug} for a in Agent.objects.all() if not readable(a.model_secrets)),
    ]
    if unreadable:
        raise SecretDecryptionError(
            _(
                "the stored secrets of %(rows)s cannot be decrypted with this server's keys (SECRETS_ENCRYPTION_KEYS "
                "lacks the key they were encrypted with): an export would not say which secrets are set. Add that "
                "key back, or enter those secrets again in the admin."
            )
            % {"rows": ", ".join(unreadable)}
        )
    servers = [
        {
            "mcp_id": s.mcp_id,
            "name": s.name,
            "transport": s.transport,
            "command": s.command,
            "args": s.args,
            "cwd": s.cwd,
            "env": _exported_secrets(s.env or {}, public=s.public_env or []),
            "public_env": s.public_env or [],
            "url": s.url,
            "headers": _exported_secrets(s.headers or {}),
            "timeout_s": s.timeout_s,
            "session_scope": s.session_scope,
            "enabled": s.enabled,
            "tool_prefix": s.tool_prefix,
            "breaker_threshold": s.breaker_threshold,
            "breaker_cooldown_s": s.breaker_cooldown_s,
        }
        for s in McpServer.objects.order_by("mcp_id")
    ]
    tools = [
        {
            "mcp_id": t.server.mcp_id,
            "tool": t.name,
            "tags": t.tags or [],
            "example_queries": t.example_queries or [],
            "enabled": enabled,
        }
        for t in McpTool.objects.select_related("server").order_by("server__mcp_id", "name")
        # A tool waiting for a review is disabled by discovery, not by an admin: approving restores this.
        if (enabled := t.enabled_before_review if t.review_required else t.enabled) is False
        or t.tags
        or t.example_queries
        # Every tool its server lists, at its defaults too: left out, a tool switched on again or its tags cleared
        # here was left as it was by the import elsewhere, reported unchanged. One no longer listed (vanished) is
        # written only where an admin set something on it.
        or t.available
    ]
    contracts = [
        {**entry, **{k: _sorted_keys(entry[k]) for k in ("args", "returns", "retry")}}
        for entry in (
            contract_entry(c)
            for c in ToolContract.objects.select_related("tool__server").order_by("tool__server__mcp_id", "tool__name")
        )
    ]
    agents = [
        {
            "slug": a.slug,
            "name": a.name,
            "enabled": a.enabled,
            "system_prompt": a.system_prompt,
            "deterministic_instruction": a.deterministic_instruction,
            "answer_template": a.answer_template,
            "model": {
                "provider": a.model_provider,
                "model_id": a.model_id,
                "params": _sorted_keys(a.model_params),
                # Always written: left out, an import keeps the secrets an installation has.
                "secrets": _exported_secrets(a.model_secrets or {}),
            },
            "servers": sorted(a.servers.values_list("mcp_id", flat=True)),
            "max_iterations": a.max_iterations,
            "mode": a.mode,
            "flow_graph": a.flow_graph,
            "answer_from_deterministic": a.answer_from_deterministic,
            "caller_approves_model_writes": a.caller_approves_model_writes,
            "language": a.language,
            "no_match_answer": a.no_match_answer,
            "tool_selection": _sorted_keys(a.tool_selection),
            "mcp_context": _sorted_keys(a.mcp_context),
            "time_limit_s": a.time_limit_s,
            **agent_versions_entry(a),
        }
        for a in Agent.objects.select_related("live_version", "shadow_version").order_by("slug")
    ]
    rules = [
        {**entry, "when": _sorted_keys(entry["when"]), "params": _sorted_keys(entry["params"])}
        for entry in (
            rule_entry(r) for r in DeterministicRule.objects.select_related("agent", "server").order_by("order", "id")
        )
    ]
    document: dict[str, Any] = {
        EXPORT_HEADER: EXPORT_FORMAT,
        "servers": servers,
        "tools": tools,
        "contracts": contracts,
        "agents": agents,
        "rules": rules,
    }
    for name, section in config_sections().items():
        entries = section.section_export()
        if entries:
            document[name] = entries
    document[EXPORT_END] = True  # the last key: an import refuses a document cut before it
    # Written composed, as an import reads it (``_composed``): text stored decomposed (typed on macOS) re-imported
    # as "updated" with before and after alike, and another installation's export of the import differed.
    return _composed(document)


def rule_entry(rule: DeterministicRule) -> dict[str, Any]:
    """A rule as a document entry (``export_config``'s ``rules[]``; the rule editor's JSON view). A code rule's
    holds no conditions, server, tool or parameters (``CODE_RULE_UNUSED_KEYS``): its code decides them, and one
    stored with them before they were refused kept them, which no run read and an import into another
    installation refused."""
    entry = {
        "agent": rule.agent.slug if rule.agent else None,
        "name": rule.name,
        "order": rule.order,
        "enabled": rule.enabled,
        "mcp_id": rule.server.mcp_id if rule.server else None,
        "tool": rule.tool_name,
        "code": rule.code,
        "when": rule.when,
        "params": rule.params,
        "answer_template": rule.answer_template,
        "force_first_tool": rule.force_first_tool,
    }
    if rule.code:
        entry.update({"mcp_id": None, "tool": "", "when": {}, "params": {}})
    return entry
