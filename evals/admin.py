"""The admin's pages for evals: sets with their cases (changed through the services, audited), an action that
runs a set against its agent, an eval run's page with its progress and per-case scores, and two eval runs side by
side with the cases that changed outcome first."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import NON_FIELD_ERRORS, PermissionDenied, ValidationError
from django.db.models import Count, QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.text import capfirst, format_lazy
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from agent_platform.errors import ApplicationError
from agent_platform.json import bounded_json_overrides
from agent_platform.text import nfc, nfc_value
from agents.models import Agent, Run
from agents.services import CANCELLABLE
from audit.admin_changes import ADMIN_VIA, ServiceAdminMixin, form_data
from audit.admin_readonly import ReadOnlyAdminMixin, WritesRefusedMixin
from audit.labels import actor_in_words, breakable, when_cell
from evals.case_editor import (
    HELP_TEXTS,
    NO_TOOL,
    AlternativesWidget,
    AnswerChecksWidget,
    ContextLinesWidget,
    DataLinesWidget,
    NameListWidget,
    ThresholdsWidget,
    ToolLinesWidget,
    alternative_tool_names,
    case_tool_names,
    normalized_alternatives,
    normalized_checks,
    normalized_tools,
)
from evals.labels import CASE_TYPE_NAMES, SCORE_LABELS
from evals.models import CASE_TYPES, EvalCase, EvalCaseResult, EvalRun, EvalSet
from evals.scoring import MAX_METRICS, RATE_METRICS, same_json, written_tool_case_problem
from evals.services import (
    CASE_TEXT_FIELDS,
    alternatives_problems,
    eval_case_create,
    eval_case_delete,
    eval_case_update,
    eval_run_cancel,
    eval_run_compare,
    eval_run_refresh,
    eval_run_start,
    eval_runs_comparable_check,
    eval_set_create,
    eval_set_delete,
    eval_set_update,
)
from mcpregistry.contracts import argument_names
from mcpregistry.gate_records import contract_of
from mcpregistry.list_fields import EditedJSONField
from mcpregistry.models import McpServer, McpTool

SUMMARY_ROWS = list(SCORE_LABELS.items())
EDITED_CASE_FIELDS = ("expected_tools", "forbidden_tools", "answer_checks", "alternatives", "context", "data")


class CaseRefused(Exception):
    """A case's service refused a row its form let through, while the set's page was saved. The change view's
    transaction rolls back everything the page saved, and the page is made again with the refusal at the row
    (``EvalSetAdmin.changeform_view``): a form error, not a server error."""

    def __init__(self, *, case: EvalCase, error: ValidationError) -> None:
        super().__init__(error)
        self.case, self.error = case, error
        self.row: int | None = None  # the row's place in the formset (``EvalSetAdmin.save_formset`` finds it)


def _case_save(*, obj: EvalCase, actor: Any, via: str, creating: bool) -> None:
    try:
        if creating:
            saved = eval_case_create(actor=actor, via=via, data=form_data(obj))
            obj.pk = saved.pk
        else:
            eval_case_update(case=obj, actor=actor, via=via)
    except ValidationError as exc:
        raise CaseRefused(case=obj, error=exc) from exc


def _case_delete(*, obj: EvalCase, actor: Any, via: str) -> None:
    eval_case_delete(case=obj, actor=actor, via=via)


CASE_TYPE_LABELS = {kind: format_lazy("{} ({})", name, kind) for kind, name in CASE_TYPE_NAMES.items()}


def _lf(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


class TypedTextField(forms.CharField):
    """A text area's text as the admin typed it (a case's query and note, a set's description): the spaces around
    it kept, the line breaks a browser sends (CRLF) read as the LF stored. Django's own field stripped the one and
    kept the other, so a page sent back unchanged changed ``" 앞뒤 공백 "``, ``"노트\n"`` and every text of
    several lines, and recorded each as a change."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs["strip"] = False
        super().__init__(**kwargs)

    def to_python(self, value: Any) -> Any:
        text = super().to_python(value)
        return _lf(text) if isinstance(text, str) else text


def text_as_stored(form: forms.ModelForm[Any], name: str) -> Any:
    """The text ``name`` of ``form``, or the stored one where the two differ only in their line breaks: a text
    stored with CRLF (imported, or written through the API) comes back from the browser as LF, and is no change."""
    value = form.cleaned_data.get(name)
    stored = getattr(form.instance, name, None) if form.instance.pk else None
    if isinstance(value, str) and isinstance(stored, str) and _lf(stored) == value:
        return stored
    return value


class EvalCaseForm(forms.ModelForm):
    """A case as an admin writes it: its type chosen from the five the scoring knows, the tools and the checks
    in inputs named for what they hold (``evals/case_editor.py``; nothing to write as JSON, no key to guess).
    Saving a case unchanged changes nothing: lines that mean what is stored keep what is stored."""

    case_type = forms.ChoiceField(label=_("type"), choices=[])

    class Meta:
        model = EvalCase
        fields = [
            "key",
            "order",
            "case_type",
            "query",
            "expected_tools",
            "ordered",
            "forbidden_tools",
            "answer_checks",
            "alternatives",
            "context",
            "data",
            "note",
        ]
        field_classes = {
            **dict.fromkeys(EDITED_CASE_FIELDS, EditedJSONField),
            "query": TypedTextField,
            "note": TypedTextField,
        }
        widgets = {
            "expected_tools": ToolLinesWidget,
            "forbidden_tools": NameListWidget,
            "answer_checks": AnswerChecksWidget,
            "alternatives": AlternativesWidget,
            "context": ContextLinesWidget,
            "data": DataLinesWidget,
        }
        help_texts = {
            **HELP_TEXTS,
            "ordered": _("The expected tools must be called in the order listed."),
        }

    # The tool names of the set's agent (``EvalCaseInline.get_formset`` sets them): named under the tool inputs.
    agent_tools: tuple[str, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.agent_tools:
            listed = _("The agent's tools: %(tools)s.") % {"tools": ", ".join(self.agent_tools)}
            for name in ("expected_tools", "forbidden_tools", "alternatives"):
                if name in self.fields:
                    self.fields[name].help_text = format_html("{} {}", self.fields[name].help_text, listed)
        stored = self.instance.case_type if self.instance.pk else ""
        choices = [(kind, CASE_TYPE_LABELS.get(kind, kind)) for kind in CASE_TYPES]
        if stored and stored not in CASE_TYPES:  # a type written before the list: kept, never silently changed
            choices.append((stored, stored))
        self.fields["case_type"].choices = choices
        self.fields["case_type"].initial = stored or "single_tool"

    def _as_stored(self, name: str, same: Any) -> Any:
        """The cleaned value, or the stored one when both mean the same (no change to record), as JSON: ``limit=true``
        or ``limit=1.0`` typed over a stored ``limit=1`` is a change (Python's ``==`` calls them equal)."""
        value = self.cleaned_data.get(name)
        stored = getattr(self.instance, name) if self.instance.pk else None
        return stored if stored is not None and same_json(same(value), same(stored)) else value

    def clean_query(self) -> Any:
        return text_as_stored(self, "query")

    def clean_note(self) -> Any:
        return text_as_stored(self, "note")

    def clean_expected_tools(self) -> Any:
        return self._as_stored("expected_tools", normalized_tools)

    def clean_answer_checks(self) -> Any:
        return self._as_stored("answer_checks", normalized_checks)

    def clean_alternatives(self) -> Any:
        """Refused as an import refuses it (``evals.services.alternatives_problems``, in its words): a key it does
        not know, ``"ordered": "false"`` (which the scoring would have read as true) never reach the column, where
        they would also stop the set's export from importing again. A stored one is refused too when the page is
        sent back: it is shown as JSON, to be put right."""
        if problems := alternatives_problems(self.cleaned_data.get("alternatives")):
            raise ValidationError(problems, code="invalid")
        return self._as_stored("alternatives", normalized_alternatives)

    def clean_forbidden_tools(self) -> Any:
        # The box puts "no tool at all" first: the same names in another order are no change.
        return self._as_stored("forbidden_tools", lambda v: sorted(set(v)) if isinstance(v, list) else v)

    def clean(self) -> dict[str, Any]:
        """The text composed (NFC) as the service stores it, so that the checks here and the formset's (two
        cases with one key) see what will be stored: a key typed decomposed is the key typed composed.

        A tool name no server has is a typo (the case would fail on every run): refused where it is written,
        naming the tools of the set's agent."""
        cleaned = super().clean()
        for name in CASE_TEXT_FIELDS:
            if name in self.cleaned_data:
                self.cleaned_data[name] = nfc_value(self.cleaned_data[name])
        # A single_tool or multi_tool case that expects no tool passed whatever its run called: refused where its
        # type or its tools are written (a stored row sent back as it is stays as it is).
        stored = self.instance if self.instance.pk else None
        if problem := written_tool_case_problem(
            self.cleaned_data.get("case_type"),
            self.cleaned_data.get("expected_tools"),
            stored_type=stored.case_type if stored is not None else None,
            stored_tools=stored.expected_tools if stored is not None else None,
        ):
            self.add_error("expected_tools", problem)
        names_by_field = {
            "expected_tools": case_tool_names(cleaned.get("expected_tools")),
            "forbidden_tools": [n for n in case_tool_names(cleaned.get("forbidden_tools")) if n != NO_TOOL],
            "alternatives": alternative_tool_names(cleaned.get("alternatives")),
        }
        wanted = {n for names in names_by_field.values() for n in names}
        if not wanted:
            return cleaned
        # Composed (NFC) on both sides: a server may list ``직원검색`` decomposed, and the name typed is composed.
        known = {name for name in map(nfc, McpTool.objects.values_list("name", flat=True)) if name in wanted}
        # A name the case already held passes (a page sent back unchanged changes nothing, and refuses nothing).
        known |= set(self._stored_tool_names()) if self.instance.pk else set()
        for field, names in names_by_field.items():
            unknown = [n for n in dict.fromkeys(names) if n not in known]
            if unknown and field in self.fields:
                self.add_error(
                    field,
                    _("%(names)s: no server has a tool of this name; the agent's tools: %(tools)s")
                    % {"names": ", ".join(unknown), "tools": ", ".join(self.agent_tools) or "—"},
                )
        self._unknown_arguments_refused(self.cleaned_data)
        return cleaned

    def _unknown_arguments_refused(self, cleaned: dict[str, Any]) -> None:
        """An expected argument the tool does not take (``nmae=김하늘``) failed the case's ``tools:args`` on every
        run: refused at its field, naming the arguments the tool takes, as a rule's page does, where the tool lists
        them (``argument_names``; every server's tool of that name). An argument the case already held passes."""
        stored = set(_tool_arguments(self._stored_tool_lists())) if self.instance.pk else set()
        for field in ("expected_tools", "alternatives"):
            value = cleaned.get(field)
            lists = [value] if field == "expected_tools" else _alternative_tool_lists(value)
            given: dict[str, list[str]] = {}
            for name, arg in _tool_arguments(lists):
                if (name, arg) not in stored and arg not in given.setdefault(name, []):
                    given[name].append(arg)
            for name, args in given.items():
                takes = _arguments_taken(name)
                unknown = [a for a in args if takes is not None and a not in takes]
                if not unknown or field not in self.fields:
                    continue
                words = {"tool": name, "names": ", ".join(unknown), "takes": ", ".join(sorted(takes or ()))}
                if takes:
                    self.add_error(
                        field, _("%(tool)s has no argument %(names)s; its arguments are: %(takes)s.") % words
                    )
                else:
                    self.add_error(field, _("%(tool)s has no argument %(names)s; it takes none.") % words)

    def _stored_tool_lists(self) -> list[Any]:
        case = self.instance
        return [case.expected_tools, *_alternative_tool_lists(case.alternatives)]

    def _stored_tool_names(self) -> list[str]:
        case = self.instance
        return [
            *case_tool_names(case.expected_tools),
            *case_tool_names(case.forbidden_tools),
            *alternative_tool_names(case.alternatives),
        ]


def _alternative_tool_lists(value: Any) -> list[Any]:
    """The tool lists of a case's alternatives."""
    return [a.get("tools") for a in value if isinstance(a, dict)] if isinstance(value, list) else []


def _tool_arguments(tool_lists: list[Any]) -> list[tuple[str, str]]:
    """(tool name, argument name) for every argument the tool lists expect, in order."""
    pairs = []
    for tools in tool_lists:
        for item in tools if isinstance(tools, list) else []:
            if isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("args"), dict):
                pairs += [(item["name"], str(arg)) for arg in item["args"]]
    return pairs


def _arguments_taken(tool_name: str) -> frozenset[str] | None:
    """The argument names the registered tools named ``tool_name`` take (their contract's, else their input
    schema's), or None where one of them takes any name or no server has the tool."""
    tools = list(McpTool.objects.filter(name=tool_name).select_related("contract"))
    taken: set[str] = set()
    for tool in tools:
        names = argument_names(contract_of(tool).args or {}, tool.input_schema)
        if names is None:
            return None
        taken |= names
    return frozenset(taken) if tools else None


def tell_at_row(form: forms.BaseForm, error: ValidationError) -> None:
    """``error`` on the row's fields; what names a field the row does not show (its set, say), above the row,
    named."""
    if not hasattr(error, "error_dict"):
        form.add_error(None, error)
        return
    for name, problems in error.error_dict.items():
        if name == NON_FIELD_ERRORS or (name in form.fields and not form.fields[name].widget.is_hidden):
            form.add_error(None if name == NON_FIELD_ERRORS else name, problems)
            continue
        field = next((f for f in EvalCase._meta.get_fields() if f.name == name), None)
        label = capfirst(str(getattr(field, "verbose_name", name)))
        for problem in ValidationError(problems).messages:
            form.add_error(None, f"{label}: {problem}")


# The request attribute that carries a refused row to the page made again (``EvalSetAdmin.changeform_view``).
REFUSED_CASE = "_evals_refused_case"


class EvalCaseFormSet(BaseInlineFormSet):
    # A row a case's service refused when the page was saved: told at the row when the page is made again.
    refused: CaseRefused | None = None

    def validate_unique(self) -> None:
        """Two rows with one key: told at the second row's key and above the rows, by the field's name (Django's own
        check told it above the rows only, naming the column: ``key의 중복된 데이터``)."""
        seen: set[str] = set()
        message = ""
        for form in self.forms:
            if not form.is_valid() or form in self.deleted_forms:
                continue
            key = form.cleaned_data.get("key")
            if key in seen:
                label = EvalCase._meta.get_field("key").verbose_name
                message = gettext("Please correct the duplicate data for %(field)s.") % {"field": label}
                form.add_error("key", message)
            elif isinstance(key, str):
                seen.add(key)
        super().validate_unique()
        if message:
            raise ValidationError(message, code="unique")

    def clean(self) -> None:
        super().clean()
        refused = self.refused
        if refused is not None and refused.row is not None and refused.row < len(self.forms):
            tell_at_row(self.forms[refused.row], refused.error)


class EvalCaseInline(admin.StackedInline):
    # JSON nested too deeply, NaN and Infinity: refused at their field.
    formfield_overrides = bounded_json_overrides(finite=True)
    model = EvalCase
    form = EvalCaseForm
    formset = EvalCaseFormSet
    extra = 0

    def get_formset(self, request: HttpRequest, obj: EvalSet | None = None, **kwargs: Any) -> Any:
        formset: Any = super().get_formset(request, obj, **kwargs)
        if obj is not None:
            agent = obj.agent if obj.agent_id else None
        else:  # the add page: the agent posted, or (none chosen yet) every enabled tool
            posted = request.POST.get("agent", "") if request.method == "POST" else ""
            agent = Agent.objects.filter(pk=posted).first() if posted.isdigit() else None
        if agent is not None or obj is None:
            tools = (
                McpTool.objects.filter(server__agents=agent)
                if agent is not None
                else McpTool.objects.filter(enabled=True, server__enabled=True)
            )
            names = tuple(sorted(set(tools.values_list("name", flat=True))))
            formset.form = type(formset.form.__name__, (formset.form,), {"agent_tools": names})
        formset.refused = getattr(request, REFUSED_CASE, None)
        return formset

    fields = [
        ("key", "order", "case_type"),
        "query",
        ("expected_tools", "ordered"),
        "forbidden_tools",
        "answer_checks",
        "alternatives",
        ("context", "data"),
        "note",
    ]


class EvalSetForm(forms.ModelForm):
    """The sandbox servers picked from the bound servers (not typed as JSON ids); the thresholds' help names every
    score a threshold may name, and which are minimums and which maximums."""

    sandbox_servers = forms.MultipleChoiceField(
        label=capfirst(_("sandbox servers")),  # as Django writes a model field's label
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text=_(
            "Servers whose write tools the eval may really call. Every other write call is refused "
            "(eval:write_blocked) and scored as attempted."
        ),
    )

    class Meta:
        model = EvalSet
        fields = ["name", "description", "agent", "sandbox_servers", "thresholds"]
        field_classes = {"thresholds": EditedJSONField, "description": TypedTextField}
        widgets = {
            "thresholds": ThresholdsWidget(
                minimums=RATE_METRICS, maximums=MAX_METRICS, labels=lambda name: str(SCORE_LABELS.get(name, name))
            )
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        stored = (
            [str(i) for i in self.instance.sandbox_servers] if isinstance(self.instance.sandbox_servers, list) else []
        )
        known = list(McpServer.objects.order_by("mcp_id").values_list("mcp_id", flat=True))
        # The stored ones first, in their order (a save that changes nothing keeps it), then the other servers.
        self.fields["sandbox_servers"].choices = [(i, i) for i in stored] + [(i, i) for i in known if i not in stored]
        self.initial["sandbox_servers"] = stored
        self.fields["thresholds"].help_text = _(
            "Empty: no threshold for that score. run_eval exits non-zero when a score is below its minimum or "
            "above its maximum."
        )

    def clean_description(self) -> Any:
        """Composed (NFC), as the import stores it; a stored one that differs only in that (or its line breaks) is
        kept, as the import keeps it: no change."""
        value = text_as_stored(self, "description")
        stored = getattr(self.instance, "description", None) if self.instance.pk else None
        if not isinstance(value, str):
            return value
        if isinstance(stored, str) and nfc(_lf(stored)) == nfc(value):
            return stored
        return nfc(value)


@admin.register(EvalSet)
class EvalSetAdmin(ServiceAdminMixin, admin.ModelAdmin):
    form = EvalSetForm
    formfield_overrides = bounded_json_overrides(finite=True)
    list_display = ["name", "agent", "case_count", "updated_at"]
    search_fields = ["name", "description"]
    inlines = [EvalCaseInline]
    inline_services = {EvalCase: (_case_save, _case_delete)}
    actions = ["run_against_agent"]
    change_form_template = "admin/evals/evalset/change_form.html"

    class Media:
        css = {"all": ["evals/evals.css"]}
        js = ["evals/eval_set_form.js"]

    def render_change_form(self, request: HttpRequest, context: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        # The words of the cases' buttons (eval_set_form.js), in the reader's language.
        context["case_labels"] = {
            "open": gettext("Edit"),
            "close": gettext("Close"),
            "openAll": gettext("Open every case"),
            "closeAll": gettext("Close every case"),
        }
        return super().render_change_form(request, context, *args, **kwargs)

    def get_queryset(self, request: HttpRequest) -> QuerySet[EvalSet]:
        # The list's agents and case counts, read with the sets (a query per set for each otherwise: the default
        # agent may be empty, which the list's own select_related does not follow).
        eval_sets: QuerySet[EvalSet] = super().get_queryset(request)
        return eval_sets.select_related("agent").annotate(case_total=Count("cases"))

    @admin.display(description=_("cases"), ordering="case_total")
    def case_count(self, obj: EvalSet) -> int:
        total = getattr(obj, "case_total", None)
        return obj.cases.count() if total is None else int(total)

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> Any:
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except CaseRefused as refused:
            # Everything the page saved was rolled back with the view's transaction (the set's own change too):
            # the page again, from what was sent, with the refusal at its row (``EvalCaseFormSet``), so the
            # formset is not valid and nothing is saved this time.
            setattr(request, REFUSED_CASE, refused)
            return super().changeform_view(request, object_id, form_url, extra_context)

    def save_formset(self, request: HttpRequest, form: Any, formset: Any, change: bool) -> None:
        try:
            super().save_formset(request, form, formset, change)
        except CaseRefused as refused:
            refused.row = next((i for i, row in enumerate(formset.forms) if row.instance is refused.case), None)
            if refused.row is None:
                raise refused.error from refused
            raise

    def service_save(self, *, obj: EvalSet, actor: Any, m2m: dict[str, list[Any]], change: bool) -> None:
        if change:
            eval_set_update(eval_set=obj, actor=actor, via=ADMIN_VIA)
        else:
            saved = eval_set_create(actor=actor, via=ADMIN_VIA, data=form_data(obj))
            obj.pk = saved.pk
            obj._state.adding = False

    def service_delete(self, *, obj: EvalSet, actor: Any) -> None:
        eval_set_delete(eval_set=obj, actor=actor, via=ADMIN_VIA)

    @admin.action(description=_("Run the selected eval sets against their agent"), permissions=["run"])
    def run_against_agent(self, request: HttpRequest, queryset: Any) -> HttpResponse | None:
        started: list[EvalRun] = []
        for eval_set in queryset.select_related("agent"):
            if eval_set.agent is None:
                self.message_user(
                    request,
                    gettext("Eval set '%(name)s' names no agent; choose its default agent first.")
                    % {"name": eval_set.name},
                    messages.ERROR,
                )
                continue
            if eval_set.agent.live_version_id is None and not request.user.has_perm("agents.change_agent"):
                # Its eval would freeze the draft as a version (``eval_version_pin``): a publish, which needs the
                # permission to change agents, as the agent's own page asks.
                self.message_user(
                    request,
                    gettext(
                        "Agent '%(slug)s' was never published: its eval would publish its draft as a version, which "
                        "needs the permission to change agents. Publish the agent first, or ask someone who may."
                    )
                    % {"slug": eval_set.agent.slug},
                    messages.ERROR,
                )
                continue
            try:
                started.append(
                    eval_run_start(eval_set=eval_set, agent=eval_set.agent, actor=_admin_actor(request), via=ADMIN_VIA)
                )
            except ApplicationError as exc:
                self.message_user(request, f"{eval_set.name}: {exc.message}", messages.ERROR)
        if len(started) == 1:
            return HttpResponseRedirect(reverse("admin:evals_evalrun_change", args=[started[0].pk]))
        if started:
            self.message_user(request, gettext("%(n)d eval runs started.") % {"n": len(started)}, messages.SUCCESS)
        return None

    def has_run_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("evals.add_evalrun"))


@admin.register(EvalRun)
class EvalRunAdmin(ReadOnlyAdminMixin, WritesRefusedMixin, admin.ModelAdmin):
    """Eval runs are read here (nothing edits one); two selected runs can be compared, and a running one cancelled
    (its page's Cancel button, or the list's action), each after a page that asks to confirm, by whoever may
    change eval runs (``evals.services.eval_run_cancel``)."""

    change_form_template = "admin/evals/evalrun/change_form.html"
    list_display = ["started", "what_ran", "label", "progress", "pass_rate", "verdict"]
    list_filter = ["eval_set", "agent", "status"]
    # Who started it in words (``started_by_text``), not as the record codes it (``admin:alice``).
    readonly_fields = [*(f.name for f in EvalRun._meta.fields), "started_by_text"]
    fields = [
        "eval_set",
        "agent",
        "version",
        "label",
        "status",
        "sandbox_servers",
        "total",
        "done",
        "started_by_text",
        "created_at",
        "finished_at",
    ]
    actions = ["compare", "cancel_selected"]

    def has_compare_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        """Who may cancel an eval run: whoever may change eval runs (nobody edits one here: cancelling is the one
        change this page makes)."""
        return bool(request.user.has_perm("evals.change_evalrun"))

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        # The compare action only reads: let those who may view eval runs use it. The cancel action is for those
        # who may cancel (the action's own permission; its confirmation is this list's POST too).
        action = request.POST.get("action") if request.method == "POST" else None
        if action in ("compare", "cancel_selected"):
            allowed = self.has_view_permission(request) and (action == "compare" or self.has_cancel_permission(request))
            if not allowed:
                raise PermissionDenied
            return admin.ModelAdmin.changelist_view(self, request, extra_context)
        return super().changelist_view(request, extra_context)

    class Media:
        css = {"all": ["evals/evals.css"]}

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).select_related("eval_set", "agent")

    @admin.display(description=_("started"), ordering="created_at")
    def started(self, obj: EvalRun) -> str:
        return when_cell(obj.created_at)

    @admin.display(description=EvalRun._meta.get_field("started_by").verbose_name)
    def started_by_text(self, obj: EvalRun) -> str:
        return actor_in_words(obj.started_by) or "—"

    @admin.display(description=_("eval set and agent"), ordering="eval_set__name")
    def what_ran(self, obj: EvalRun) -> str:
        # The set above the agent it ran against (with the version when one was pinned), each wrapping at its
        # hyphens, dots and underscores rather than after any letter.
        agent = obj.agent.slug if obj.version is None else f"{obj.agent.slug} v{obj.version}"
        return format_html('{}<span class="cell-code">{}</span>', breakable(obj.eval_set.name), breakable(agent))

    @admin.display(description=_("progress"))
    def progress(self, obj: EvalRun) -> str:
        return f"{obj.done}/{obj.total}"

    @admin.display(description=_("pass rate"))
    def pass_rate(self, obj: EvalRun) -> str:
        rate = obj.summary.get("pass_rate")
        return "—" if rate is None else f"{rate:.0%}"

    @admin.display(description=_("thresholds"))
    def verdict(self, obj: EvalRun) -> str:
        verdict = obj.verdict
        if verdict == "cancelled":
            return format_html('<span class="eval-fail">{}</span>', gettext("cancelled"))
        if verdict == "running":
            return gettext("running")
        if verdict == "no_thresholds":  # nothing judged it: not "met", whatever its cases did
            return gettext("no thresholds set")
        if verdict == "met":
            return format_html('<span class="eval-pass">{}</span>', gettext("met"))
        return format_html('<span class="eval-fail">{}</span>', gettext("not met"))

    @admin.action(description=_("Compare the two selected eval runs"), permissions=["compare"])
    def compare(self, request: HttpRequest, queryset: Any) -> HttpResponse | None:
        chosen = list(queryset.select_related("eval_set").order_by("created_at")[:3])
        if len(chosen) != 2:
            self.message_user(request, gettext("Select exactly two eval runs to compare."), messages.WARNING)
            return None
        try:
            eval_runs_comparable_check(a=chosen[0], b=chosen[1])
        except ApplicationError as exc:
            self.message_user(request, exc.message, messages.WARNING)
            return None
        return HttpResponseRedirect(f"{reverse('admin:evals_evalrun_compare')}?a={chosen[0].pk}&b={chosen[1].pk}")

    @admin.action(description=_("Cancel the selected eval runs"), permissions=["cancel"])
    def cancel_selected(self, request: HttpRequest, queryset: Any) -> HttpResponse | None:
        """The first POST (the action chosen) asks to confirm, listing the selected eval runs that are running; the
        confirmation's POST (``post=yes``) cancels them, each through the service."""
        chosen = list(queryset.select_related("eval_set", "agent").order_by("created_at"))
        running = [r for r in chosen if r.status == EvalRun.Status.RUNNING]
        if not running:
            self.message_user(request, gettext("None of the selected eval runs is running."), messages.WARNING)
            return None
        if request.POST.get("post") != "yes":
            return self._cancel_confirmation(request, running, skipped=len(chosen) - len(running))
        cancelled = 0
        for eval_run in running:
            try:
                eval_run_cancel(eval_run=eval_run, actor=_admin_actor(request), via=ADMIN_VIA)
                cancelled += 1
            except ApplicationError as exc:  # finished meanwhile
                self.message_user(request, f"{eval_run}: {exc.message}", messages.WARNING)
        if cancelled:
            cancelled_text = ngettext("%(n)d eval run cancelled.", "%(n)d eval runs cancelled.", cancelled)
            self.message_user(request, cancelled_text % {"n": cancelled}, messages.SUCCESS)
        return None

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """An eval run's Cancel button: a page that asks to confirm (a GET, or a POST without ``post=yes``), then
        the confirmation's POST cancels it and goes back to its page."""
        if not (self.has_view_permission(request) and self.has_cancel_permission(request)):
            raise PermissionDenied
        eval_run = (
            EvalRun.objects.select_related("eval_set", "agent").filter(pk=object_id).first()
            if _is_uuid(object_id)
            else None
        )
        if eval_run is None:
            raise Http404
        change_url = reverse("admin:evals_evalrun_change", args=[eval_run.pk], current_app=self.admin_site.name)
        if request.method == "POST" and request.POST.get("post") == "yes":
            try:
                eval_run_cancel(eval_run=eval_run, actor=_admin_actor(request), via=ADMIN_VIA)
            except ApplicationError as exc:
                self.message_user(request, exc.message, messages.WARNING)
            else:
                self.message_user(request, gettext("The eval run was cancelled."), messages.SUCCESS)
            return HttpResponseRedirect(change_url)
        if eval_run.status != EvalRun.Status.RUNNING:
            self.message_user(
                request,
                gettext("The eval run has already ended (%(status)s).") % {"status": eval_run.get_status_display()},
                messages.WARNING,
            )
            return HttpResponseRedirect(change_url)
        return self._cancel_confirmation(request, [eval_run], skipped=0)

    def _cancel_confirmation(self, request: HttpRequest, eval_runs: list[EvalRun], *, skipped: int) -> HttpResponse:
        """The page that asks to confirm cancelling ``eval_runs`` (all running), each with what its cancellation
        ends: its cases not yet scored and its runs not finished."""
        rows = []
        for eval_run in eval_runs:
            results = EvalCaseResult.objects.filter(eval_run=eval_run)
            rows.append(
                {
                    "eval_run": eval_run,
                    "change_url": reverse(
                        "admin:evals_evalrun_change", args=[eval_run.pk], current_app=self.admin_site.name
                    ),
                    "unscored": results.filter(scored=False).count(),
                    "unsubmitted": results.filter(scored=False, run__isnull=True).count(),
                    "runs": Run.objects.filter(eval_results__eval_run=eval_run, status__in=CANCELLABLE).count(),
                }
            )
        single = len(eval_runs) == 1 and request.POST.get("action") != "cancel_selected"
        context = {
            **self.admin_site.each_context(request),
            "title": gettext("Cancel this eval run?") if len(eval_runs) == 1 else gettext("Cancel these eval runs?"),
            "opts": self.model._meta,
            "rows": rows,
            "skipped": skipped,
            "single": single,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "back_url": rows[0]["change_url"]
            if single
            else reverse("admin:evals_evalrun_changelist", current_app=self.admin_site.name),
        }
        return TemplateResponse(request, "admin/evals/evalrun/cancel.html", context)

    def get_urls(self) -> list[URLPattern]:
        return [
            path("compare/", self.admin_site.admin_view(self.compare_view), name="evals_evalrun_compare"),
            path("<path:object_id>/cancel/", self.admin_site.admin_view(self.cancel_view), name="evals_evalrun_cancel"),
            *super().get_urls(),
        ]

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        eval_run = EvalRun.objects.filter(pk=object_id).first() if _is_uuid(object_id) else None
        if eval_run is not None and self.has_view_permission(request, eval_run):
            if eval_run.status == EvalRun.Status.RUNNING:
                eval_run = eval_run_refresh(eval_run=eval_run)
            results = list(eval_run.results.select_related("case", "run").order_by("case__order", "case__id"))
            for result in results:
                # The page shows each case as its eval run asked it and scored it, not as edited since.
                result.case = result.case_as_run()
            extra_context = {
                **(extra_context or {}),
                "eval_run": eval_run,
                "results": results,
                "summary_rows": [(label, eval_run.summary.get(key)) for key, label in SUMMARY_ROWS],
                "percent": (100 * eval_run.done // eval_run.total) if eval_run.total else 100,
                "cancelled_cases": sum(1 for r in results if r.cancelled),
                "may_cancel": eval_run.status == EvalRun.Status.RUNNING and self.has_cancel_permission(request),
                "cancel_url": reverse(
                    "admin:evals_evalrun_cancel", args=[eval_run.pk], current_app=self.admin_site.name
                ),
            }
        return super().change_view(request, object_id, form_url, extra_context)

    def compare_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        a_id, b_id = request.GET.get("a", ""), request.GET.get("b", "")
        if not (_is_uuid(a_id) and _is_uuid(b_id)):
            raise Http404
        a = EvalRun.objects.select_related("eval_set", "agent").filter(pk=a_id).first()
        b = EvalRun.objects.select_related("eval_set", "agent").filter(pk=b_id).first()
        if a is None or b is None:
            raise Http404
        try:
            rows = eval_run_compare(a=a, b=b)
        except ApplicationError as exc:  # runs of two sets (a link written by hand, or kept from elsewhere)
            self.message_user(request, exc.message, messages.WARNING)
            return HttpResponseRedirect(reverse("admin:evals_evalrun_changelist"))
        context = {
            **self.admin_site.each_context(request),
            "title": gettext("Two eval runs side by side"),
            "opts": self.model._meta,
            "a": a,
            "b": b,
            "rows": rows,
            "changed": sum(1 for r in rows if r.changed),
            "unchanged": sum(1 for r in rows if not r.changed),
            "summary_rows": [(label, a.summary.get(key), b.summary.get(key)) for key, label in SUMMARY_ROWS],
        }
        return TemplateResponse(request, "admin/evals/evalrun/compare.html", context)


def _admin_actor(request: HttpRequest) -> str:
    """The actor an admin's start or cancellation of an eval run is recorded under, as a run's cancellation from its
    page is."""
    return f"admin:{request.user.get_username()}"


def _is_uuid(value: str) -> bool:
    import uuid

    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True
