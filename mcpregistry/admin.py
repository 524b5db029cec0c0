"""Admin for MCP bindings. Secret env and header values are write-only: shown as set/unset, never rendered."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.options import IS_POPUP_VAR
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Count, Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django.utils.text import capfirst
from django.utils.translation import gettext, ngettext, pgettext_lazy
from django.utils.translation import gettext_lazy as _

from agent_platform.json import bounded_json_overrides
from agent_platform.text import grapheme_cut, nfc
from audit.admin_changes import ADMIN_VIA, ServiceAdminMixin, form_data
from audit.models import AuditEvent
from audit.visible import invisible_characters, visible_text
from mcpregistry import discovery_view
from mcpregistry.binding_policy import readable_variables_text, setting_secret_problem, url_credentials_problem
from mcpregistry.contract_form import ToolContractForm
from mcpregistry.contracts import gate_filled_argument, schema_with_contract
from mcpregistry.crypto import local_key_file_problem, readable
from mcpregistry.gate_records import contract_of
from mcpregistry.list_fields import TextListField
from mcpregistry.models import (
    McpServer,
    McpTool,
    RequestCategory,
    ToolContract,
    _setting_secret_problem,
    readable_map,
)
from mcpregistry.services import (
    DiscoveryReport,
    HealthReport,
    discovery_secrets,
    mcp_server_create,
    mcp_server_delete,
    mcp_server_discover,
    mcp_server_health_check,
    mcp_server_update,
    mcp_tool_delete,
    mcp_tool_review_approve,
    mcp_tool_update,
    request_category_create,
    request_category_delete,
    request_category_update,
    tool_contract_create,
    tool_contract_delete,
    tool_contract_update,
    tool_enable_refused,
)
from mcpregistry.signals import rules_left_failing, rules_refused_by_contract

# A whole value ``${VAR}`` on a secret line: read VAR from the worker's environment (``{"from_env": "VAR"}``).
FROM_ENV_LINE = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")


class UnshownTextarea(forms.Textarea):
    """A box whose text is never sent back in a page: a page refused for another field shows it empty, as a
    password box is (what was typed in it is a secret)."""

    def format_value(self, value: Any) -> None:
        return None


class SecretLinesField(forms.CharField):
    """Changes to a map of secret values, entered but never shown back: one ``NAME=value`` per line.

    ``NAME=value`` sets or replaces that name's value (the text after the first ``=``, as typed); ``NAME=${VAR}``
    makes the worker read it from its environment variable VAR (stored as ``{"from_env": "VAR"}``). Names not
    given keep their stored value; the form's "remove" boxes clear one. A line is refused naming its number.
    """

    widget = UnshownTextarea(
        attrs={"rows": 3, "cols": 60, "autocomplete": "off", "spellcheck": "false", "placeholder": "API_TOKEN=…"}
    )

    def to_python(self, value: Any) -> dict[str, Any] | None:
        lines = str(value or "").splitlines()
        changes: dict[str, Any] = {}
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            name, sep, entry = line.partition("=")
            name = name.strip()
            if not sep or not name:
                raise forms.ValidationError(
                    _("Line %(n)d: write NAME=value, or NAME=${VAR} to read it from the worker's environment.")
                    % {"n": number}
                )
            if name in changes:
                raise forms.ValidationError(_("Line %(n)d: %(name)s is given twice.") % {"n": number, "name": name})
            entry = entry.strip()
            from_env = FROM_ENV_LINE.match(entry)
            changes[name] = {"from_env": from_env.group(1)} if from_env else entry
        return changes or None


def merge_secrets(stored: dict[str, Any], changes: dict[str, Any] | None, *, clear: bool) -> dict[str, Any]:
    merged = {} if clear else dict(stored or {})
    for name, entry in (changes or {}).items():
        if entry is None:
            merged.pop(name, None)
        else:
            merged[name] = entry
    return merged


# A URL as typed starts with its scheme: ``127.0.0.1:8746/mcp`` or ``localhost:8746/mcp`` is refused, never given one.
_TYPED_HTTP_SCHEME = re.compile(r"https?://", re.IGNORECASE)


class HttpUrlField(forms.URLField):
    """A server's URL, refused unless typed with its ``http://`` or ``https://``, in the words the model's own check
    uses (for a URL Django's check refuses too: one error, not that and the model's). Django's field put
    ``https://`` before a URL typed without one (saved without a word, it failed at discovery with an SSL error
    against a plain HTTP server) and read ``localhost:`` as a scheme (two errors at once)."""

    default_error_messages = {"invalid": _("Enter an http:// or https:// URL.")}

    def to_python(self, value: Any) -> str:
        text = str(value or "").strip()
        if text and not _TYPED_HTTP_SCHEME.match(text):
            raise forms.ValidationError(self.error_messages["invalid"], code="invalid")
        return str(super().to_python(value))


# How the server page names a secret's kind, beside its name.
SECRET_KINDS = {"env": pgettext_lazy("secret kind", "environment"), "header": pgettext_lazy("secret kind", "header")}


def stored_secrets(server: McpServer) -> list[tuple[str, str, Any]]:
    """The secret values stored for ``server`` as (kind, name, entry), env (its settings left out) then headers:
    what is stored, never what a rejected post put on the instance."""
    stored = McpServer.objects.filter(pk=server.pk).first() if server.pk else None
    return secrets_of(stored) if stored is not None else []


def secrets_of(stored: McpServer) -> list[tuple[str, str, Any]]:
    """``stored_secrets`` of a row as loaded (none of a map this process cannot decrypt)."""
    public = set(stored.public_env or [])
    secrets = [("env", name, entry) for name, entry in readable_map(stored.env).items() if name not in public]
    return secrets + [("header", name, entry) for name, entry in readable_map(stored.headers).items()]


def unreadable_secrets_text() -> str:
    """What the server page tells of a binding whose secrets this process cannot decrypt: the local key file's fault
    where it is the only key and cannot be used, else the key missing from ``SECRETS_ENCRYPTION_KEYS``."""
    fault = local_key_file_problem()
    if fault is not None:
        return gettext(
            "The stored secret values cannot be decrypted: %(fault)s. Runs that use this server fail until they can. "
            "Other changes save and keep the stored values as they are."
        ) % {"fault": fault}
    return gettext(
        "The stored secret values cannot be decrypted with this server's keys (SECRETS_ENCRYPTION_KEYS lacks the "
        "key they were encrypted with); runs that use this server fail until they can. Add that key back, or tick "
        '"clear all stored secret values" and enter every value and setting again. Other changes save and keep '
        "the stored values as they are."
    )


def page_secrets(server: McpServer) -> list[str]:
    """The values a page masks in what ``server`` told at discovery: those discovery masks (``discovery_secrets``:
    its secrets, and the other bindings' that look like credentials, which a discovery before that stored), or
    none of its own where this process cannot decrypt them (the texts were masked when they were discovered)."""
    return discovery_secrets(server) if server.secrets_readable() else []


def secret_choices(server: McpServer) -> list[tuple[str, str]]:
    """The stored secret values of ``server`` as (``env:NAME`` or ``header:Name``, label) for the remove boxes."""
    return [
        (f"{kind}:{name}", format_html("{} <code>{}</code>", SECRET_KINDS[kind], name))
        for kind, name, _entry in stored_secrets(server)
    ]


class McpServerForm(forms.ModelForm):
    args = TextListField(
        label=capfirst(_("arguments")),
        separator="\n",
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60, "placeholder": "-m\nmy_package.server"}),
    )
    new_env = SecretLinesField(
        label=_("set environment values"),
        required=False,
        help_text=_(
            "One NAME=value per line sets or replaces a secret value; NAME=${VAR} reads it from the worker's "
            "environment variable VAR. Names not written here keep their stored value. Stored values are never "
            "shown."
        ),
    )
    new_headers = SecretLinesField(
        label=_("set header values"),
        required=False,
        # Its own placeholder, but never shown back either: a page refused for another field wrote the typed
        # header values (a bearer token) into the page.
        widget=UnshownTextarea(
            attrs={
                "rows": 3,
                "cols": 60,
                "autocomplete": "off",
                "spellcheck": "false",
                "placeholder": "Authorization=Bearer …",
            }
        ),
        help_text=_(
            "One Name=value per line (e.g. Authorization=Bearer …) sets or replaces a header; Name=${VAR} reads "
            "it from the worker's environment variable VAR. Headers not written here keep their stored value."
        ),
    )
    remove_secrets = forms.MultipleChoiceField(
        label=_("remove stored values"),
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text=_("The stored secret values to clear; the others are kept."),
    )
    env_settings = forms.CharField(
        label=_("environment settings (not secret)"),
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60, "placeholder": "FAILURE_MODE=none"}),
        help_text=_(
            "One NAME=value per line: environment values that are settings, shown and edited as themselves and "
            "never masked. Every other environment value is a secret (below). Removing a line removes the value."
        ),
    )
    url = HttpUrlField(label=_("URL"), required=False, assume_scheme="https", max_length=500)
    clear_secrets = forms.BooleanField(label=_("clear all stored secret values"), required=False)

    class Meta:
        model = McpServer
        fields = [
            "mcp_id",
            "name",
            "transport",
            "enabled",
            "timeout_s",
            "session_scope",
            "tool_prefix",
            "command",
            "args",
            "cwd",
            "url",
            "breaker_threshold",
            "breaker_cooldown_s",
        ]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "args" in self.fields:
            self.fields["args"].help_text = _(
                "One per line. stdio: the command's arguments. Local: the dotted paths of the Python tools, a "
                "module for every tool in it (mcpregistry.builtin_tools)."
            )
        public = [str(n) for n in (self.instance.public_env or [])]
        stored = readable_map(self.instance.env)
        self.initial["env_settings"] = "\n".join(
            f"{name}={stored[name]}" for name in public if isinstance(stored.get(name), str)
        )
        self.fields["remove_secrets"].choices = secret_choices(self.instance)
        if not self.fields["remove_secrets"].choices:  # nothing stored: no row of empty boxes
            self.fields["remove_secrets"].widget = forms.MultipleHiddenInput()
        variables = readable_variables_text(settings.PLATFORM_MCP_ENV_PASSTHROUGH)
        for name in ("new_env", "new_headers"):
            self.fields[name].help_text = format_html("{} {}", self.fields[name].help_text, variables)

    def clean_env_settings(self) -> dict[str, str] | None:
        """``NAME=value`` lines as a map, or None when the form did not carry the field (a script's post)."""

        if self.add_prefix("env_settings") not in self.data:
            return None
        values: dict[str, str] = {}
        for number, line in enumerate(str(self.cleaned_data.get("env_settings") or "").splitlines(), start=1):
            if not line.strip():
                continue
            name, sep, value = line.partition("=")
            if not sep or not name.strip():
                raise forms.ValidationError(_("Line %(n)d: write NAME=value (e.g. FAILURE_MODE=none).") % {"n": number})
            if name.strip() in values:  # the last one silently won
                raise forms.ValidationError(
                    _("Line %(n)d: %(name)s is given twice.") % {"n": number, "name": name.strip()}
                )
            values[name.strip()] = value.strip()
        return values

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        settings_env = cleaned.get("env_settings")
        new_env = cleaned.get("new_env") or {}
        both_ways = sorted(set(settings_env or {}) & set(new_env))
        if both_ways:
            # A name is a setting (shown) or a secret (never shown), not both: stored both ways, the secret's value
            # was kept under a name marked as a setting, shown in clear and never masked.
            self.add_error(
                "new_env",
                _("%(names)s: given as a setting and as a secret; keep one (a secret is never shown).")
                % {"names": ", ".join(both_ways)},
            )
            return cleaned
        clear = bool(cleaned.get("clear_secrets"))
        unreadable = [name for name in ("env", "headers") if not readable(getattr(self.instance, name))]
        if unreadable and clear:
            for name in unreadable:  # replaced whole: what cannot be read cannot be kept
                setattr(self.instance, name, {})
        elif unreadable:
            asked = {
                "env": bool(
                    settings_env or new_env or any(c.startswith("env:") for c in cleaned.get("remove_secrets") or [])
                ),
                "headers": bool(cleaned.get("new_headers")),
            }
            if any(asked[name] for name in unreadable):
                self.add_error("clear_secrets", unreadable_secrets_text())
                return cleaned
        if settings_env is not None and readable(self.instance.env):
            env = dict(self.instance.env or {})
            # A name marked as a setting that has no value was not on the page (only values are): it stays marked.
            unshown = [n for n in self.instance.public_env or [] if not isinstance(env.get(n), str)]
            for name in self.instance.public_env or []:
                if name not in settings_env:
                    env.pop(name, None)
            env.update(settings_env)
            self.instance.env = env
            self.instance.public_env = [*settings_env, *(n for n in unshown if n not in settings_env)]
        # Applied before the model's own validation, so a ${VAR} placeholder in a new value is refused too.
        public = set(self.instance.public_env or [])
        env = readable_map(self.instance.env)
        kept_settings = {k: v for k, v in env.items() if k in public}
        removed = {"env": set(), "header": set()}
        for choice in cleaned.get("remove_secrets") or []:
            kind, _sep, name = str(choice).partition(":")
            removed[kind].add(name)
        for kind, field in (("env", "new_env"), ("header", "new_headers")):
            both = sorted(removed[kind] & set(cleaned.get(field) or {}))
            if both:
                self.add_error(
                    field,
                    _("%(names)s: set here and ticked for removal; keep one.") % {"names": ", ".join(both)},
                )
        if new_env:
            # A setting's name given a secret value (a script's post, which carries no settings box) becomes a
            # secret: never shown, masked.
            self.instance.public_env = [n for n in self.instance.public_env or [] if n not in new_env]
        env_changes = {**dict.fromkeys(removed["env"]), **new_env}
        header_changes = {**dict.fromkeys(removed["header"]), **(cleaned.get("new_headers") or {})}
        if readable(self.instance.env):  # else left as stored: nothing was asked of it (above)
            self.instance.env = merge_secrets(self.instance.env, env_changes, clear=clear)
            if clear:
                self.instance.env = {**kept_settings, **self.instance.env}
        if readable(self.instance.headers):
            self.instance.headers = merge_secrets(self.instance.headers, header_changes, clear=clear)
        return cleaned

    def full_clean(self) -> None:
        super().full_clean()
        if self.is_bound and self._errors:
            self._not_sent_back()

    def _not_sent_back(self) -> None:
        """A refused page sends back no secret: what was typed in the secret boxes (never shown) is named, so that
        it is entered again, and a setting refused for holding a secret is shown without it (the field blank, a
        settings line left out), its error saying so. A value as stored is shown as it was."""
        for field in ("new_env", "new_headers"):
            lines = str(self.data.get(self.add_prefix(field)) or "").splitlines()
            names = list(dict.fromkeys(n.strip() for n, sep, _v in (line.partition("=") for line in lines) if sep))
            names = [name for name in names if name]
            if names:
                self.add_error(
                    field,
                    ngettext(
                        "%(names)s: enter its value again; values are never sent back.",
                        "%(names)s: enter their values again; values are never sent back.",
                        len(names),
                    )
                    % {"names": ", ".join(names)},
                )
        shown = self.data.copy()
        for field in ("url", "args", "command", "cwd"):
            text = str(self.data.get(self.add_prefix(field)) or "")
            # Refused for it, or dropped unsaid (a stdio server's URL, its field hidden): either way not shown.
            if field not in self.changed_data or not _holds_secret(field, text):
                continue
            shown[self.add_prefix(field)] = ""
            self.add_error(field, _("It was not sent back, as it holds a secret: enter it again without it."))
        if "env_settings" in self._errors and "env_settings" in self.changed_data:
            stored = set(str(self.initial.get("env_settings") or "").splitlines())
            kept, left_out = [], []
            for line in str(self.data.get(self.add_prefix("env_settings")) or "").splitlines():
                name, _sep, value = line.partition("=")
                if line not in stored and _setting_secret_problem(name.strip(), value.strip()):
                    left_out.append(name.strip())
                else:
                    kept.append(line)
            if left_out:
                shown[self.add_prefix("env_settings")] = "\n".join(kept)
                self.add_error(
                    "env_settings",
                    _("%(names)s: not sent back, as it holds a secret: enter it again as a secret value.")
                    % {"names": ", ".join(left_out)},
                )
        self.data = shown

    def _update_errors(self, errors: ValidationError) -> None:
        # The model validates env/headers; on this form they are entered as new_env/new_headers, and the settings
        # (public_env) as env_settings.
        if hasattr(errors, "error_dict"):
            renamed = {"env": "new_env", "headers": "new_headers", "public_env": "env_settings"}
            # A URL its field refused is not on the instance: the model's check of the one left there (a new
            # binding's none) said the URL was wrong a second time.
            errors = ValidationError(
                {
                    renamed.get(k, k): v
                    for k, v in errors.error_dict.items()
                    if not (k == "url" and "url" in self.errors)
                }
            )
        super()._update_errors(errors)


def _holds_secret(field: str, text: str) -> bool:
    """Whether the server setting ``field``, as typed (``args`` a line each), holds what the model refuses as a
    secret: a URL's user and password, or what the audit hides."""
    value: Any = [line.strip() for line in text.splitlines() if line.strip()] if field == "args" else text.strip()
    if field == "url" and url_credentials_problem(text.strip(), ""):
        return True
    return bool(value) and setting_secret_problem(field, value, "") is not None


class RulesLeftMixin:
    """A tool's or server's deletion, confirmed on its own page or by the list's bulk action, names above Django's
    confirmation the enabled rules it leaves failing (``rules_left``, as ``tool_rules_check`` answers): a rule is
    not deleted with what it calls, and without a word its runs failed (``deterministic:tool_unknown``) while the
    rule still read enabled; and the contracts that stay and name a deleted tool as their fallback
    (``contracts_left``). The pages are this app's ``admin/mcpregistry/delete_confirmation.html`` and
    ``delete_selected_confirmation.html``, which Django's admin looks up for each model of the app by itself."""

    def rules_left(self, objs: Iterable[Any]) -> list[str]:
        """The texts naming the enabled rules that deleting ``objs`` leaves failing."""
        raise NotImplementedError

    def contracts_left(self, objs: Iterable[Any]) -> list[str]:
        """The texts naming the contracts that stay and name one of ``objs`` as their fallback (none by default)."""
        return []

    def render_delete_form(self, request: HttpRequest, context: dict[str, Any]) -> HttpResponse:
        context["rules_left"] = self.rules_left([context["object"]])
        context["contracts_left"] = self.contracts_left([context["object"]])
        return super().render_delete_form(request, context)  # type: ignore[misc, no-any-return]

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions: dict[str, Any] = super().get_actions(request)  # type: ignore[misc]
        if "delete_selected" not in actions:  # not offered to this reader
            return actions
        delete, name, description = actions["delete_selected"]

        def delete_naming_rules(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
            response = delete(modeladmin, request, queryset)
            if isinstance(response, TemplateResponse) and response.context_data is not None:  # the confirmation
                response.context_data["rules_left"] = self.rules_left(queryset)
                response.context_data["contracts_left"] = self.contracts_left(queryset)
            return response

        actions["delete_selected"] = (delete_naming_rules, name, description)
        return actions


# The classes of a part of the server page that ``server_form.js`` shows whatever the transport.
SHOWN_FOR_EVERY_TRANSPORT = ["server-transport-stdio", "server-transport-http", "server-transport-local"]

# A discovery waits for its server at least this long (``mcp_server_discover``: ``max(timeout_s, 30)``).
DISCOVERY_WAIT_MIN_S = 30.0

# The server page lists its tools read-only, as links (a tool is enabled, reviewed and given its contract on its own
# page): a form field per tool made a server of a few hundred tools unsavable (Django's limit on a request's fields,
# DATA_UPLOAD_MAX_NUMBER_FIELDS, answered 400). Past this many, the rest are in the filtered tool list.
SERVER_PAGE_TOOLS_SHOWN = 100


# The server page's tool table shows this much of each tool's description.
SERVER_PAGE_DESCRIPTION_CHARS = 160


def description_start(description: str) -> str:
    """The start of a tool's description as the server page's tool table shows it: cut where a reader sees a
    boundary (``grapheme_cut``; a description listed decomposed, ``ᄒ+ᅡ+ᆫ``, cut by code points ended in
    another syllable than the server wrote), "…" where it goes on, hidden characters written out."""
    shown = grapheme_cut(description, SERVER_PAGE_DESCRIPTION_CHARS)
    return visible_text(shown) + ("…" if len(shown) < len(nfc(description)) else "")


def server_tools_table(server: McpServer) -> str:
    """The server's tools (the first ``SERVER_PAGE_TOOLS_SHOWN`` by name): each a link to its page, its state and
    the start of its description, and a link to the tool list filtered to this server. No form field."""
    if not server.pk:
        return "—"
    tools = server.tools.order_by("name")
    total = tools.count()
    if not total:
        return str(_("none discovered yet: use the Discover tools button"))

    def state(tool: McpTool) -> str:
        if not tool.available:
            return str(_("no longer listed by the server"))
        if tool.review_required:
            return str(_("awaiting review"))
        return str(_("enabled") if tool.enabled else _("disabled"))

    rows = (
        (
            reverse("admin:mcpregistry_mcptool_change", args=[tool.pk]),
            tool.name,
            state(tool),
            description_start(tool.description),
        )
        for tool in tools[:SERVER_PAGE_TOOLS_SHOWN]
    )
    listed = reverse("admin:mcpregistry_mcptool_changelist") + f"?server__id__exact={server.pk}"
    more = (
        ngettext(
            "the first %(shown)d of %(n)d tool; all of them in the tool list",
            "the first %(shown)d of %(n)d tools; all of them in the tool list",
            total,
        )
        % {"shown": SERVER_PAGE_TOOLS_SHOWN, "n": total}
        if total > SERVER_PAGE_TOOLS_SHOWN
        else ngettext("%(n)d tool in the tool list", "%(n)d tools in the tool list", total) % {"n": total}
    )
    return format_html(
        '<div id="tools-group"><table class="discovery-table server-tool-table"><thead><tr><th>{}</th><th>{}</th>'
        '<th>{}</th></tr></thead><tbody>{}</tbody></table><p><a href="{}">{}</a></p></div>',
        _("name"),
        _("state"),
        _("what it is"),
        format_html_join("", '<tr><td><a href="{}"><code>{}</code></a></td><td>{}</td><td>{}</td></tr>', rows),
        listed,
        more,
    )


@admin.register(McpServer)
class McpServerAdmin(RulesLeftMixin, ServiceAdminMixin, admin.ModelAdmin):
    form = McpServerForm
    list_display = [
        "mcp_id",
        "name",
        "transport",
        "enabled",
        "health_badge",
        "breaker_badge",
        "last_checked_at",
        "tool_count",
    ]
    list_filter = ["transport", "enabled", "health"]
    search_fields = ["mcp_id", "name"]
    readonly_fields = [
        "secrets_state",
        "health",
        "last_checked_at",
        "last_error",
        "protocol_version",
        "server_info_pretty",
        "resources_pretty",
        "prompts_pretty",
        "breaker_badge",
        "breaker_opened_at",
        "tools_table",
    ]
    actions = ["discover_tools", "check_health"]
    change_form_template = "admin/mcpregistry/mcpserver/change_form.html"

    class Media:
        css = {"all": ["mcpregistry/editors.css"]}
        js = ["mcpregistry/server_form.js"]

    # The page shows what the chosen transport uses (mcpregistry/static/mcpregistry/server_form.js): a stdio
    # server its command, arguments, folder, environment and secret environment; an HTTP one its URL and secret
    # headers; local tools their dotted paths only. Hidden fields keep their values; the environment settings and
    # the secrets, where some are stored, are shown whatever the transport (``get_fieldsets``).
    fieldsets = [
        (None, {"fields": ["mcp_id", "name", "transport", "enabled", "timeout_s", "session_scope", "tool_prefix"]}),
        (
            _("command and arguments"),
            {"fields": ["command", "args", "cwd"], "classes": ["server-transport-stdio", "server-transport-local"]},
        ),
        (_("HTTP"), {"fields": ["url"], "classes": ["server-transport-http"]}),
        (_("environment settings"), {"fields": ["env_settings"], "classes": ["server-transport-stdio"]}),
        (
            _("secrets"),
            {
                "fields": ["secrets_state", "new_env", "new_headers", "remove_secrets", "clear_secrets"],
                "classes": ["server-transport-stdio", "server-transport-http"],
            },
        ),
        (
            _("circuit breaker"),
            {"fields": ["breaker_badge", "breaker_opened_at", "breaker_threshold", "breaker_cooldown_s"]},
        ),
        (
            _("health and discovery"),
            {
                "fields": [
                    "health",
                    "last_checked_at",
                    "last_error",
                    "protocol_version",
                    "server_info_pretty",
                    "resources_pretty",
                    "prompts_pretty",
                ]
            },
        ),
    ]

    def render_change_form(self, request: HttpRequest, context: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        server = context.get("original")
        if server is not None:  # what the Discover tools button says it waits at most (as ``mcp_server_discover``)
            context["discovery_wait_s"] = f"{max(server.timeout_s, DISCOVERY_WAIT_MIN_S):g}"
        return super().render_change_form(request, context, *args, **kwargs)

    def get_readonly_fields(self, request: HttpRequest, obj: McpServer | None = None) -> Any:
        """A bound server's MCP id is shown, not edited: what names the server elsewhere names it by its id
        (``mcp_server_update`` refuses a change)."""
        fields = list(super().get_readonly_fields(request, obj))
        return [*fields, "mcp_id"] if obj is not None else fields

    def get_fieldsets(self, request: HttpRequest, obj: McpServer | None = None) -> Any:
        fieldsets = list(super().get_fieldsets(request, obj))
        stored = McpServer.objects.filter(pk=obj.pk).first() if obj is not None else None
        if stored is not None:
            # What is stored is shown, and can be removed, whatever the transport: a stdio binding switched to
            # another kept its environment values and secrets, hidden, with no box to clear them. Removed on the
            # page, they are a change as any other, audited.
            env = readable_map(stored.env)
            held = {
                "env_settings": any(isinstance(env.get(name), str) for name in stored.public_env or []),
                "secrets_state": bool(secrets_of(stored)) or not stored.secrets_readable(),
            }
            fieldsets = [
                (name, {**options, "classes": SHOWN_FOR_EVERY_TRANSPORT})
                if any(field in options["fields"] for field, shown in held.items() if shown)
                else (name, options)
                for name, options in fieldsets
            ]
        if obj is not None:  # a new binding has no tools until its first discovery
            fieldsets.append((_("tools"), {"fields": ["tools_table"]}))
        return fieldsets

    @admin.display(description=_("tools"))
    def tools_table(self, obj: McpServer) -> str:
        return server_tools_table(obj)

    def service_save(self, *, obj: McpServer, actor: Any, m2m: dict[str, list[Any]], change: bool) -> None:
        if change:
            mcp_server_update(server=obj, actor=actor, via=ADMIN_VIA)
        else:
            saved = mcp_server_create(actor=actor, via=ADMIN_VIA, data=form_data(obj))
            obj.pk = saved.pk
            obj._state.adding = False

    def service_delete(self, *, obj: McpServer, actor: Any) -> None:
        mcp_server_delete(server=obj, actor=actor, via=ADMIN_VIA)

    def response_change(self, request: HttpRequest, obj: McpServer) -> HttpResponse:
        """Below the save's own message: the enabled rules the server, disabled, leaves failing their runs
        (``tool_rules_check``), each linked to its page."""
        response = super().response_change(request, obj)
        for text in rules_left_failing(server_id=obj.pk):
            self.message_user(request, text, messages.WARNING)
        return response

    def rules_left(self, objs: Iterable[McpServer]) -> list[str]:
        return [text for server in objs for text in rules_left_failing(server_id=server.pk, deleting=True)]

    @admin.display(description=_("server info"))
    def server_info_pretty(self, obj: McpServer) -> str:
        return discovery_view.server_info_text(obj.server_info, secrets=page_secrets(obj))

    @admin.display(description=_("resources (read-only)"))
    def resources_pretty(self, obj: McpServer) -> str:
        return discovery_view.resources_table(obj.resources, secrets=page_secrets(obj))

    @admin.display(description=_("prompts (read-only)"))
    def prompts_pretty(self, obj: McpServer) -> str:
        return discovery_view.prompts_table(obj.prompts, secrets=page_secrets(obj))

    @admin.display(description=_("secrets"))
    def secrets_state(self, obj: McpServer) -> str:
        def state(entry: Any) -> str:
            if isinstance(entry, dict) and "from_env" in entry:
                return str(_("from the worker's environment (%(var)s)") % {"var": entry["from_env"]})
            return str(_("set"))

        stored = McpServer.objects.filter(pk=obj.pk).first() if obj.pk else None
        rows = [(SECRET_KINDS[kind], name, state(entry)) for kind, name, entry in secrets_of(stored)] if stored else []
        listed = format_html_join(mark_safe("<br>"), "{} <code>{}</code>: {}", rows)
        if stored is not None and not stored.secrets_readable():
            return format_html('<p class="errornote">{}</p>{}', unreadable_secrets_text(), listed)
        return listed if rows else str(_("none set"))

    @admin.display(description=_("health"), ordering="health")
    def health_badge(self, obj: McpServer) -> str:
        colour = {"ok": "green", "error": "#ba2121"}.get(obj.health, "gray")
        return format_html(
            '<b style="color:{}">{}</b>{}',
            colour,
            obj.get_health_display(),
            format_html(': <span title="{}">{}</span>', obj.last_error, error_start(obj.last_error))
            if obj.last_error
            else "",
        )

    @admin.display(description=_("circuit"), ordering="breaker_state")
    def breaker_badge(self, obj: McpServer) -> str:
        colour = {"closed": "green", "open": "#ba2121", "half_open": "#b8860b"}.get(obj.breaker_state, "gray")
        failures = (
            format_html(
                " ({})",
                ngettext("%(n)d failure in a row", "%(n)d failures in a row", obj.breaker_failures)
                % {"n": obj.breaker_failures},
            )
            if obj.breaker_failures
            else ""
        )
        return format_html('<b style="color:{}">{}</b>{}', colour, obj.get_breaker_state_display(), failures)

    def get_queryset(self, request: HttpRequest) -> QuerySet[McpServer]:
        # The list's tool counts, read with the servers (one COUNT per server otherwise).
        servers: QuerySet[McpServer] = super().get_queryset(request)
        return servers.annotate(available_tools=Count("tools", filter=Q(tools__available=True)))

    @admin.display(description=_("tools"), ordering="available_tools")
    def tool_count(self, obj: McpServer) -> int:
        return int(obj.available_tools)  # type: ignore[attr-defined]

    @admin.action(description=_("Discover tools (connect and list)"), permissions=["change"])
    def discover_tools(self, request: HttpRequest, queryset: QuerySet[McpServer]) -> None:
        for server in queryset:
            self._discover(request, server)

    # It changes no configuration, but starts the servers' processes and connects out: the change permission, as
    # the server page's own health button asks for.
    @admin.action(description=_("Check health (connect and list, change nothing)"), permissions=["change"])
    def check_health(self, request: HttpRequest, queryset: QuerySet[McpServer]) -> None:
        for server in queryset:
            self._check_health(request, server)

    def _discover(self, request: HttpRequest, server: McpServer) -> None:
        report = mcp_server_discover(server=server, actor=request.user, via=ADMIN_VIA)
        warned = (
            report.schema_errors
            or report.name_taken
            or report.descriptions_cut
            or report.schema_texts_cut
            or report.schemas_oversized
        )
        level = messages.SUCCESS if report.ok and not warned else messages.WARNING
        self.message_user(request, discovery_message(report), level=level if report.ok else messages.ERROR)

    def _check_health(self, request: HttpRequest, server: McpServer) -> None:
        report = mcp_server_health_check(server=server)
        self.message_user(request, health_message(report), level=messages.SUCCESS if report.ok else messages.ERROR)

    def get_urls(self) -> list[Any]:
        def server_view(operation: Any) -> Any:
            def view(request: HttpRequest, object_id: str) -> HttpResponse:
                # Permission first (a 403 whatever the id), then the server: a missing one is a 404, not a 403.
                if not self.has_change_permission(request):
                    raise PermissionDenied
                server = self.get_object(request, object_id)
                if server is None:
                    raise Http404(gettext("MCP server not found."))
                if not self.has_change_permission(request, server):
                    raise PermissionDenied
                if request.method != "POST":
                    return HttpResponseNotAllowed(["POST"])
                operation(request, server)
                return HttpResponseRedirect(
                    reverse("admin:mcpregistry_mcpserver_change", args=[server.pk], current_app=self.admin_site.name)
                )

            return self.admin_site.admin_view(view)

        return [
            path("<path:object_id>/discover/", server_view(self._discover), name="mcpregistry_mcpserver_discover"),
            path("<path:object_id>/health/", server_view(self._check_health), name="mcpregistry_mcpserver_health"),
            *super().get_urls(),
        ]

    def response_add(self, request: HttpRequest, obj: McpServer, post_url_continue: str | None = None) -> HttpResponse:
        """A new binding's next step is discovery: its page (with the *Discover tools* button) follows."""
        if "_addanother" in request.POST or IS_POPUP_VAR in request.POST:
            return super().response_add(request, obj, post_url_continue)
        self.message_user(
            request,
            _("Added %(id)s. Discover its tools with the Discover tools button.") % {"id": obj.mcp_id},
            messages.SUCCESS,
        )
        return HttpResponseRedirect(
            reverse("admin:mcpregistry_mcpserver_change", args=[obj.pk], current_app=self.admin_site.name)
        )


# The server list shows this much of a binding's last error, the whole of it in the badge's title.
HEALTH_ERROR_SHOWN_CHARS = 120


def error_start(text: str) -> str:
    """The start of ``text`` the server list shows: the whole where it is short, else cut at the last space within
    ``HEALTH_ERROR_SHOWN_CHARS`` characters (or, in a long word, where a reader sees a boundary: ``grapheme_cut``),
    ending with "…"."""
    text = nfc(text)
    if len(text) <= HEALTH_ERROR_SHOWN_CHARS:
        return text
    cut = grapheme_cut(text, HEALTH_ERROR_SHOWN_CHARS - 1)
    if not text[len(cut)].isspace():  # inside a word: cut before it, unless that leaves too little
        words = re.match(r"(.*)\s", cut, re.S)
        if words and len(words.group(1)) >= HEALTH_ERROR_SHOWN_CHARS // 2:
            cut = words.group(1)
    return cut.rstrip() + "…"


def _names(names: list[str]) -> str:
    return ", ".join(names[:20]) + (f" (+{len(names) - 20})" if len(names) > 20 else "")


def discovery_message(report: DiscoveryReport) -> str:
    """What a discovery did, with the server id as it is spelled (the admin capitalizes a message's first
    letter, so the id never comes first)."""
    if not report.ok:
        return str(_("Discovery of %(id)s failed: %(error)s") % {"id": report.mcp_id, "error": report.error})
    parts = [ngettext("%(n)d tool listed", "%(n)d tools listed", report.tool_count) % {"n": report.tool_count}]
    for label, names in (
        (_("added"), report.added),
        (_("updated"), report.updated),
        (_("vanished"), report.vanished),
        (_("review required"), report.review_required),
        (_("a secret of the binding masked in the input schema"), report.secrets_masked),
        (
            _("left off: another server bound to the same agent offers this name (give one a tool name prefix)"),
            report.name_taken,
        ),
        (_("unusable input schema"), report.schema_errors),
    ):
        if names:
            parts.append(f"{label}: {_names(names)}")
    if report.added:
        # Every added tool starts as a write: without this, an admin's first run parked for approval of a clock lookup.
        parts.append(
            str(
                _(
                    "each added tool asks a person to approve every call (risk: write) until you mark it read on "
                    "its page"
                )
            )
        )
    if report.added_read_only_hinted:
        parts.append(
            str(_("saying they only read (readOnlyHint, the server's word, not checked): %(tools)s"))
            % {"tools": _names(report.added_read_only_hinted)}
        )
    parts.extend(str(warning) for warning in report.warnings())
    if not (report.added or report.updated or report.vanished):
        parts.append(str(_("no change")))
    return str(_("Discovery of %(id)s: %(parts)s") % {"id": report.mcp_id, "parts": "; ".join(parts)})


def health_message(report: HealthReport) -> str:
    if not report.ok:
        return str(_("Health of %(id)s: error: %(error)s") % {"id": report.mcp_id, "error": report.error})
    text = str(
        ngettext(
            "Health of %(id)s: ok, %(n)d tool listed in %(ms).0f ms",
            "Health of %(id)s: ok, %(n)d tools listed in %(ms).0f ms",
            report.tool_count,
        )
        % {"id": report.mcp_id, "n": report.tool_count, "ms": report.latency_ms}
    )
    if report.new or report.missing:
        text += "; " + str(
            _("differs from the registry (new: %(new)s; missing: %(missing)s): discover to update it")
            % {"new": _names(report.new) or "—", "missing": _names(report.missing) or "—"}
        )
    return text


class ToolContractInline(admin.StackedInline):
    """The structured contract editor (``mcpregistry.contract_form``); the JSON stays editable below it."""

    formfield_overrides = bounded_json_overrides()  # JSON nested too deeply: refused at its field

    model = ToolContract
    form = ToolContractForm
    can_delete = False
    extra = 0
    fieldsets = [
        (None, {"fields": ["risk", "unknown_args"]}),
        (_("arguments"), {"fields": ["args"], "classes": ["contract-editor"]}),
        (_("result"), {"fields": ["returns"], "classes": ["contract-editor"]}),
        (
            _("retries, timeout and fallback"),
            {"fields": ["retry", "timeout_s", "fallback_tool", "fallback_policy", "correction_cap"]},
        ),
        (_("memo and idempotency"), {"fields": ["memo", "memo_ttl_s", "idempotency_arg"]}),
        (_("advanced: the contract as JSON"), {"fields": ["contract_json"], "classes": ["collapse"]}),
    ]

    class Media:
        css = {"all": ["mcpregistry/editors.css"]}


def _contract_save(*, obj: ToolContract, actor: Any, via: str, creating: bool) -> None:
    if creating:
        tool_contract_create(tool=obj.tool, actor=actor, via=via, data=form_data(obj))
    else:
        tool_contract_update(contract=obj, actor=actor, via=via)


def _contract_delete(*, obj: ToolContract, actor: Any, via: str) -> None:
    tool_contract_delete(contract=obj, actor=actor, via=via)


def _contract_history_name(event: AuditEvent) -> str:
    """A contract's change on its tool's History page, by the tool its event names: the ``name`` it recorded is
    the contract's ``str`` in the language of whoever changed it."""
    return gettext("contract of %(tool)s") % {"tool": event.tool}


class McpToolForm(forms.ModelForm):
    """Tags as comma-separated words and example questions a line each (``mcpregistry/list_fields.py``)."""

    tags = TextListField(
        label=capfirst(_("tags")),
        required=False,
        widget=forms.TextInput(attrs={"size": 60, "placeholder": "자산, asset, 장비"}),
        help_text=_("Comma-separated words for tool selection and the agents' tag filters."),
    )
    example_queries = TextListField(
        label=capfirst(_("example queries")),
        separator="\n",
        required=False,
        widget=forms.Textarea(
            attrs={"rows": 4, "cols": 80, "placeholder": "A-1001 자산 상태 알려줘\n노트북 사용 현황은?"}
        ),
        help_text=_("Questions this tool answers, one per line; tool selection ranks a query against them."),
    )

    class Meta:
        model = McpTool
        fields = ["enabled", "tags", "example_queries"]

    def clean_enabled(self) -> bool:
        """A tool waiting for a review is enabled by approving it, not by ticking the box (``mcp_tool_update``
        refuses it as well). The instance is the row as stored: the page's POST read it under the configuration's
        lock (``ServiceAdminMixin``)."""
        enabled = bool(self.cleaned_data.get("enabled"))
        tool = self.instance
        if enabled and tool.pk is not None and tool.review_required and not tool.enabled:
            raise forms.ValidationError(tool_enable_refused())
        return enabled


@admin.register(McpTool)
class McpToolAdmin(RulesLeftMixin, ServiceAdminMixin, admin.ModelAdmin):
    form = McpToolForm
    list_display = ["name", "server", "enabled", "available", "review_state", "risk", "discovered_at"]
    list_select_related = ["server", "contract"]  # the server's id and the contract's risk, in every row
    list_filter = ["server", "enabled", "available", "review_required"]
    search_fields = ["name", "description"]
    readonly_fields = [
        "server",
        "name",
        "description_shown",
        "schema_pretty",
        "model_view",
        "annotations_pretty",
        "available",
        "review_diff",
        "schema_error",
        "discovered_at",
    ]
    fields = [
        "server",
        "name",
        "enabled",
        "tags",
        "example_queries",
        "available",
        "review_diff",
        "schema_error",
        "description_shown",
        "schema_pretty",
        "model_view",
        "annotations_pretty",
        "discovered_at",
    ]
    inlines = [ToolContractInline]
    actions = ["approve_reviewed_changes"]

    class Media:
        css = {"all": ["mcpregistry/editors.css"]}

    inline_services = {ToolContract: (_contract_save, _contract_delete)}
    inline_history_names = {ToolContract: _contract_history_name}

    def service_save(self, *, obj: McpTool, actor: Any, m2m: dict[str, list[Any]], change: bool) -> None:
        mcp_tool_update(tool=obj, actor=actor, via=ADMIN_VIA)

    def response_change(self, request: HttpRequest, obj: McpTool) -> HttpResponse:
        """Below the save's own message: the stored rules its contract now refuses (``contract_rules_check``),
        each a rule whose every call is refused until it is mended or the contract loosened; and the enabled rules
        that call it while runs cannot (it or its server disabled: ``tool_rules_check``), each linked to its page."""
        response = super().response_change(request, obj)
        for text in rules_refused_by_contract(tool=obj):
            self.message_user(request, text, messages.WARNING)
        for text in rules_left_failing(server_id=obj.server_id, tool_names=[obj.name]):
            self.message_user(request, text, messages.WARNING)
        return response

    def rules_left(self, objs: Iterable[McpTool]) -> list[str]:
        by_server: dict[Any, list[str]] = {}
        for tool in objs:
            by_server.setdefault(tool.server_id, []).append(tool.name)
        return [
            text
            for server_id, names in by_server.items()
            for text in rules_left_failing(server_id=server_id, tool_names=names, deleting=True)
        ]

    def contracts_left(self, objs: Iterable[McpTool]) -> list[str]:
        """The contracts of the tools that stay whose fallback is one of ``objs``: the fallback is gone with it, and
        the staying tool's page is refused every save (its contract's fallback is no tool of the server) until its
        contract names another, or a discovery lists the deleted tool again."""
        deleted: dict[Any, set[str]] = {}
        deleted_ids = set()
        for tool in objs:
            deleted.setdefault(tool.server_id, set()).add(tool.name)
            deleted_ids.add(tool.pk)
        query = Q(pk__in=[])
        for server_id, names in deleted.items():
            query |= Q(tool__server_id=server_id, fallback_tool__in=sorted(names))
        staying = ToolContract.objects.filter(query).exclude(tool_id__in=deleted_ids).select_related("tool__server")
        return [
            format_html(
                gettext(
                    "The contract of {tool} names {fallback} as its fallback tool: once {fallback} is deleted, the "
                    "fallback is gone, and the page of {tool} refuses every save until its contract names another "
                    "fallback (or a discovery lists {fallback} again)."
                ),
                tool=format_html(
                    '<a href="{}">{}</a>',
                    reverse("admin:mcpregistry_mcptool_change", args=[contract.tool.pk]),
                    contract.tool,
                ),
                fallback=contract.fallback_tool,
            )
            for contract in staying.order_by("tool__server__mcp_id", "tool__name")
        ]

    def service_delete(self, *, obj: McpTool, actor: Any) -> None:
        mcp_tool_delete(tool=obj, actor=actor, via=ADMIN_VIA)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.display(description=_("risk"))
    def risk(self, obj: McpTool) -> str:
        contract = getattr(obj, "contract", None)
        return contract.get_risk_display() if contract else "—"

    @admin.display(description=_("description"))
    def description_shown(self, obj: McpTool) -> str:
        """The description as the model reads it, with what a person would not see written out (``⟦U+202E⟧``)
        and said: a server can hide instructions to the model in Unicode tag characters."""
        hidden = invisible_characters(obj.description + json.dumps(obj.input_schema, ensure_ascii=False))
        if not hidden:
            return obj.description
        return format_html(
            '<p class="errornote">{}</p>{}',
            ngettext(
                "The description or schema holds %(n)d kind of character that does not show itself (written out "
                "as ⟦U+…⟧): a model reads it as text. Approve only what you can read.",
                "The description or schema holds %(n)d kinds of characters that do not show themselves (written "
                "out as ⟦U+…⟧): a model reads them as text. Approve only what you can read.",
                len(hidden),
            )
            % {"n": len(hidden)},
            visible_text(obj.description),
        )

    @admin.display(description=_("input schema"))
    def schema_pretty(self, obj: McpTool) -> str:
        return discovery_view.arguments_table(obj.input_schema, secrets=page_secrets(obj.server))

    @admin.display(description=_("as the model is shown it"))
    def model_view(self, obj: McpTool) -> str:
        """The arguments as a model is told of them: the schema with this contract's limits written in
        (``contracts.schema_with_contract``, as ``agents.engine.tool_specs`` builds it), so an admin sees that a
        limit set below reaches the model before the gate refuses a call for it. Read as saved
        (:meth:`saved_tool`): a page refused for its contract shows what runs are sent, not its unsaved limits."""
        saved = self.saved_tool(obj)
        if saved.schema_error:
            return str(_("Not offered to a model: the schema is unusable."))
        applied = contract_of(saved)
        shown = schema_with_contract(saved.input_schema, applied.args, idempotency_arg=gate_filled_argument(applied))
        return format_html(
            "<p>{}</p>{}",
            format_html(
                "{} <code>{}</code>. {}{}",
                _("Named"),
                saved.exposed_name,
                _("Runs of a published version are shown the contract it froze; this is the contract as saved."),
                ""
                if saved.callable
                else format_html(
                    " <b>{}</b>",
                    _(
                        "Not offered to a model now: the tool is disabled, gone from its server or waiting for a review."
                    ),
                ),
            ),
            discovery_view.arguments_table(
                shown, secrets=page_secrets(saved.server), folded=_("the schema the model is sent (JSON)")
            ),
        )

    @staticmethod
    def saved_tool(tool: McpTool) -> McpTool:
        """``tool`` and its contract as stored, read again: a refused page's forms have already written what was
        posted (its contract's limits, the enabled box) onto the objects it shows."""
        return McpTool.objects.select_related("server", "contract").filter(pk=tool.pk).first() or tool

    @admin.display(description=_("annotations (hints from the server, not trusted)"))
    def annotations_pretty(self, obj: McpTool) -> str:
        return discovery_view.annotations_text(obj.annotations, secrets=page_secrets(obj.server))

    @admin.display(description=_("review"), ordering="review_required")
    def review_state(self, obj: McpTool) -> str:
        """A warning where the tool waits for a review; nothing where it does not (a red cross for "no review
        needed", Django's boolean icon, read as a fault)."""
        if not obj.review_required:
            return ""
        return format_html('<b style="color:#ba2121">⚠ {}</b>', _("review required"))

    @admin.display(description=_("change under review"))
    def review_diff(self, obj: McpTool) -> str:
        if not obj.review_required:
            return "—"
        if obj.previous_input_schema is None and not obj.previous_description:
            return format_html(
                "<p><b>{}</b></p>",
                _(
                    "The server added this tool after it was bound. It stays disabled until you review its "
                    "description and schema below and approve it."
                ),
            )
        before = [
            obj.previous_description,
            *json.dumps(obj.previous_input_schema, ensure_ascii=False, indent=2).splitlines(),
        ]
        after = [obj.description, *json.dumps(obj.input_schema, ensure_ascii=False, indent=2).splitlines()]
        # Characters that do not show themselves are written out: two lines that only look alike differ.
        diff = visible_text("\n".join(difflib.unified_diff(before, after, "before", "now", lineterm="")))
        return format_html(
            "<p><b>{}</b></p><pre>{}</pre>",
            _("The server changed this tool after it was enabled. It stays disabled until you approve the change."),
            diff,
        )

    @admin.action(
        description=_("Approve reviewed changes (a tool enabled before its review is enabled again)"),
        permissions=["change"],
    )
    def approve_reviewed_changes(self, request: HttpRequest, queryset: QuerySet[McpTool]) -> None:
        count = refused = 0
        for tool in queryset:
            try:
                count += mcp_tool_review_approve(tool=tool, actor=request.user, via=ADMIN_VIA)
            except ValidationError as exc:  # enabled again, it would give an agent two tools of one name
                refused += 1
                self.message_user(
                    request,
                    _("The review of %(tool)s was not approved: %(why)s")
                    % {"tool": tool, "why": " ".join(exc.messages)},
                    level=messages.ERROR,
                )
        if count or refused:
            self.message_user(request, ngettext("%(n)d tool approved.", "%(n)d tools approved.", count) % {"n": count})
        else:
            self.message_user(request, _("None of the selected tools awaited review."), messages.WARNING)


class RequestCategoryForm(forms.ModelForm):
    """Keywords written as the rule editor takes them: comma-separated (a JSON list is read too)."""

    keywords = TextListField(
        label=_("keywords"),
        unique=True,
        widget=forms.TextInput(attrs={"size": 80, "placeholder": "프린터, 노트북, 모니터"}),
        help_text=_("Comma-separated words; a request that mentions any of them belongs to this department."),
    )

    class Meta:
        model = RequestCategory
        fields = ["department", "keywords", "order", "enabled"]

    def clean_keywords(self) -> list[str]:
        # Composed as the model stores them, so a word typed twice, once decomposed, is one word.
        words = [nfc(word.strip()) for word in self.cleaned_data["keywords"]]
        words = list(dict.fromkeys(word for word in words if word))
        if not words:
            raise forms.ValidationError(_("Give at least one keyword."))
        return words


@admin.register(RequestCategory)
class RequestCategoryAdmin(ServiceAdminMixin, admin.ModelAdmin):
    """The ``classify_request`` local tool's table: keywords → department (each change audited)."""

    form = RequestCategoryForm
    list_display = ["department", "keywords_text", "order", "enabled"]
    list_editable = ["order", "enabled"]
    list_filter = ["enabled"]
    search_fields = ["department"]

    def service_save(self, *, obj: RequestCategory, actor: Any, m2m: dict[str, list[Any]], change: bool) -> None:
        if change:
            request_category_update(category=obj, actor=actor, via=ADMIN_VIA)
        else:
            saved = request_category_create(actor=actor, via=ADMIN_VIA, data=form_data(obj))
            obj.pk = saved.pk
            obj._state.adding = False

    def service_delete(self, *, obj: RequestCategory, actor: Any) -> None:
        request_category_delete(category=obj, actor=actor, via=ADMIN_VIA)

    @admin.display(description=_("keywords"))
    def keywords_text(self, obj: RequestCategory) -> str:
        return ", ".join(str(word) for word in obj.keywords) if isinstance(obj.keywords, list) else "—"
