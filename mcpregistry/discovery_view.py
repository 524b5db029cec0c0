"""What discovery read off a server, as a reader takes it in: a tool's input schema as one row per argument, its
annotations in words, the server's resources and prompts as tables. The JSON as discovered stays a click away
(``folded_json``); every text a server wrote is masked with the binding's secrets first (a careless server may
put one in a description), with ``mask_known``, so that an argument called ``api_key`` keeps its shape (a
key that is itself a secret is shown as the server named it)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import ngettext, pgettext

from audit.masking import mask_known
from audit.visible import visible_text
from mcpregistry.contracts import optional_branch
from mcpregistry.list_fields import value_text

# JSON Schema's type names in words (those the contract editor's type column uses, without the Python name).
_TYPE_WORDS = {
    "string": lambda: pgettext("schema type", "text"),
    "integer": lambda: pgettext("schema type", "whole number"),
    "number": lambda: pgettext("schema type", "number"),
    "boolean": lambda: pgettext("schema type", "true or false"),
    "array": lambda: pgettext("schema type", "list"),
    "object": lambda: pgettext("schema type", "object"),
    "null": lambda: pgettext("schema type", "nothing (null)"),
}
# Nested objects are shown as ``parent.child`` rows down to this depth; deeper ones as "object".
_MAX_DEPTH = 3


@dataclass(frozen=True)
class ArgumentRow:
    name: str
    type: str
    required: bool
    description: str
    limits: str


def type_text(prop: Any) -> str:
    """A property's type in words: ``text``, ``list of whole number``, ``text or nothing (null)``, ``one of the
    listed values``; ``any`` when the schema does not say."""
    if not isinstance(prop, dict):
        return _("any")
    kind = prop.get("type")
    if isinstance(kind, list):
        return _(" or ").join(_word(k) for k in kind) or _("any")
    if kind == "array":
        items = prop.get("items")
        return _("list of %(type)s") % {"type": type_text(items)} if isinstance(items, dict) and items else _word(kind)
    if isinstance(kind, str):
        return _word(kind)
    for key in ("anyOf", "oneOf"):
        options = prop.get(key)
        if isinstance(options, list) and options:
            return _(" or ").join(dict.fromkeys(type_text(option) for option in options))
    if isinstance(prop.get("$ref"), str):
        return prop["$ref"].rsplit("/", 1)[-1]
    if "enum" in prop or "const" in prop:
        return _("one of the listed values")
    return _("any")


def _word(kind: Any) -> str:
    word = _TYPE_WORDS.get(str(kind))
    return word() if word else str(kind)


def _value(value: Any) -> str:
    """A value as the editors write it (``value_text``), the empty text as ``""``."""
    return value_text(value) or '""'


def _count(n: float) -> int:
    """A count's plural form for ``ngettext``, which takes a whole number: a schema's ``1e400`` (infinite) or
    ``2.5`` is still shown as it is, only the form is chosen from a whole number."""
    return int(n) if isinstance(n, int) or math.isfinite(n) else 0


def limits_text(prop: Any) -> str:
    """A property's limits in words, ``·``-separated: allowed values, ranges, lengths, pattern, format, default."""
    if not isinstance(prop, dict):
        return ""
    parts: list[str] = []
    if isinstance(prop.get("enum"), list):
        parts.append(_("one of: %(values)s") % {"values": ", ".join(_value(v) for v in prop["enum"])})
    if "const" in prop:
        parts.append(_("always %(value)s") % {"value": _value(prop["const"])})
    for key, text in (
        ("minimum", lambda n: _("at least %(n)s") % {"n": n}),
        ("exclusiveMinimum", lambda n: _("more than %(n)s") % {"n": n}),
        ("maximum", lambda n: _("at most %(n)s") % {"n": n}),
        ("exclusiveMaximum", lambda n: _("less than %(n)s") % {"n": n}),
        (
            "minLength",
            lambda n: ngettext("at least %(n)s character", "at least %(n)s characters", _count(n)) % {"n": n},
        ),
        ("maxLength", lambda n: ngettext("at most %(n)s character", "at most %(n)s characters", _count(n)) % {"n": n}),
        ("minItems", lambda n: ngettext("at least %(n)s item", "at least %(n)s items", _count(n)) % {"n": n}),
        ("maxItems", lambda n: ngettext("at most %(n)s item", "at most %(n)s items", _count(n)) % {"n": n}),
    ):
        value = prop.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            parts.append(text(value))
    if isinstance(prop.get("pattern"), str):
        parts.append(_("matches %(pattern)s") % {"pattern": prop["pattern"]})
    if isinstance(prop.get("format"), str):
        parts.append(_("format: %(format)s") % {"format": prop["format"]})
    if "default" in prop:
        parts.append(_("default: %(value)s") % {"value": _value(prop["default"])})
    return " · ".join(parts)


def schema_rows(schema: Any, *, prefix: str = "", depth: int = 1) -> list[ArgumentRow]:
    """One row per argument of a tool's input schema, in the schema's order; an object argument's own
    properties follow it as ``parent.child`` rows."""
    if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
        return []
    listed = schema.get("required")
    required = {name for name in listed if isinstance(name, str)} if isinstance(listed, list) else set()
    rows: list[ArgumentRow] = []
    for name, prop in schema["properties"].items():
        prop = prop if isinstance(prop, dict) else {}
        description = prop.get("description") or prop.get("title") or ""
        rows.append(
            ArgumentRow(
                name=f"{prefix}{name}",
                type=type_text(prop),
                required=name in required,
                description=str(description),
                limits=limits_text(optional_branch(prop)),  # an optional number's range is in its anyOf
            )
        )
        if depth < _MAX_DEPTH:
            rows += schema_rows(prop, prefix=f"{prefix}{name}.", depth=depth + 1)
    return rows


def arguments_table(schema: Any, *, secrets: Iterable[str] = (), folded: str = "") -> SafeString:
    """The input schema as a table (argument, type, required, what it is, limits), the JSON folded beneath
    (under ``folded``, or "the input schema as discovered")."""
    masked = mask_known(schema, secrets=secrets)
    rows = schema_rows(masked)
    folded = folded or _("the input schema as discovered (JSON)")
    if not rows:
        summary = _("This tool takes no arguments.") if _declares_none(masked) else _("The schema names no arguments.")
        return format_html("<p>{}</p>{}", summary, folded_json(masked, folded))
    body = format_html_join(
        "",
        "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        (
            (_shown(r.name), r.type, _("required") if r.required else _("optional"), _shown(r.description), r.limits)
            for r in rows
        ),
    )
    return format_html(
        '<table class="discovery-table"><thead><tr><th>{}</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th></tr>'
        "</thead><tbody>{}</tbody></table>{}",
        _("argument"),
        _("type"),
        _("required"),
        _("what it is"),
        _("limits"),
        body,
        folded_json(masked, folded),
    )


def _declares_none(schema: Any) -> bool:
    return isinstance(schema, dict) and schema.get("properties") == {}


def folded_json(value: Any, summary: str) -> SafeString:
    return format_html(
        '<details class="discovery-json"><summary>{}</summary><pre>{}</pre></details>',
        summary,
        visible_text(json.dumps(value, ensure_ascii=False, indent=2)),
    )


def _shown(value: Any) -> str:
    """A server's text as a person reads it: what does not show itself written out (``audit.visible``)."""
    return visible_text(str(value))


# MCP's tool annotations (hints the server gives; the platform does not trust them for risk).
_HINTS = {
    "readOnlyHint": (lambda: _("only reads"), lambda: _("may change things")),
    "destructiveHint": (lambda: _("may destroy or overwrite data"), lambda: _("does not destroy data")),
    "idempotentHint": (lambda: _("calling it twice does no more than once"), lambda: _("calling it twice may do more")),
    "openWorldHint": (lambda: _("reaches outside systems"), lambda: _("stays within its own data")),
}


def annotations_text(annotations: Any, *, secrets: Iterable[str] = ()) -> SafeString | str:
    """A tool's annotations in words, one per line (``title`` first, unknown keys as they are)."""
    if not isinstance(annotations, dict) or not annotations:
        return "—"
    masked = mask_known(annotations, secrets=secrets)
    lines: list[tuple[str, str]] = []
    if masked.get("title"):
        lines.append((_("title"), str(masked["title"])))
    for key, value in masked.items():
        if key == "title":
            continue
        words = _HINTS.get(key)
        if words is not None and isinstance(value, bool):
            lines.append((key, (words[0] if value else words[1])()))
        else:
            lines.append((key, _value(value)))
    return format_html(
        '<div class="discovery-lines">{}</div>',
        format_html_join("", "<div>{} <code>{}</code></div>", ((text, key) for key, text in lines)),
    )


def server_info_text(info: Any, *, secrets: Iterable[str] = ()) -> str:
    """The server's name and version as it reported them (``sds-company-data 3.4.11``); ``—`` when none."""
    if not isinstance(info, dict) or not info:
        return "—"
    info = mask_known(info, secrets=secrets)
    words = [str(info[key]) for key in ("name", "version") if info.get(key)]
    rest = {k: v for k, v in info.items() if k not in {"name", "version"}}
    if rest:
        words.append(json.dumps(rest, ensure_ascii=False))
    return " ".join(words) or "—"


def resources_table(resources: Any, *, secrets: Iterable[str] = ()) -> SafeString | str:
    """The server's resources: URI, name, media type and description, the listing folded beneath."""
    if not isinstance(resources, list) or not resources:
        return "—"
    masked = mask_known(resources, secrets=secrets)
    rows = (
        (r.get("uri", ""), r.get("title") or r.get("name", ""), r.get("mimeType", ""), r.get("description", ""))
        for r in masked
        if isinstance(r, dict)
    )
    return format_html(
        '<table class="discovery-table"><thead><tr><th>{}</th><th>{}</th><th>{}</th><th>{}</th></tr></thead>'
        "<tbody>{}</tbody></table>{}",
        _("URI"),
        _("name"),
        _("media type"),
        _("what it is"),
        format_html_join(
            "", "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td></tr>", (map(_shown, r) for r in rows)
        ),
        folded_json(masked, _("the listing as discovered (JSON)")),
    )


def prompts_table(prompts: Any, *, secrets: Iterable[str] = ()) -> SafeString | str:
    """The server's prompts: name, description and arguments (``team (required)``), the listing folded beneath."""
    if not isinstance(prompts, list) or not prompts:
        return "—"
    masked = mask_known(prompts, secrets=secrets)
    rows = (
        (p.get("name", ""), p.get("description", ""), _prompt_arguments(p.get("arguments")))
        for p in masked
        if isinstance(p, dict)
    )
    return format_html(
        '<table class="discovery-table"><thead><tr><th>{}</th><th>{}</th><th>{}</th></tr></thead>'
        "<tbody>{}</tbody></table>{}",
        _("name"),
        _("what it is"),
        _("arguments"),
        format_html_join("", "<tr><td><code>{}</code></td><td>{}</td><td>{}</td></tr>", (map(_shown, r) for r in rows)),
        folded_json(masked, _("the listing as discovered (JSON)")),
    )


def _prompt_arguments(arguments: Any) -> str:
    if not isinstance(arguments, list) or not arguments:
        return "—"
    words = []
    for argument in arguments:
        if not isinstance(argument, dict):
            continue
        name = str(argument.get("name", ""))
        words.append(_("%(name)s (required)") % {"name": name} if argument.get("required") else name)
    return ", ".join(words) or "—"
