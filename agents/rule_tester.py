"""The rule tester: which of an agent's rules match a query, in which order, with which parameters, and what
the tool's contract says of them — a dry run by default (no tool is called), optionally through the gate.
It runs the same deterministic stage as a run (``agents.deterministic_stage``), so the two cannot disagree."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin
from django.contrib.auth.decorators import permission_required
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from agent_platform.errors import ApplicationError
from agent_platform.json import FiniteJSONDecoder, json_error_text
from agents.api.config import api_setting
from agents.api.parsers import json_depth as json_text_depth
from agents.decision_reasons import reason_text
from agents.models import Agent, AgentVersion
from agents.selectors import deterministic_rule_specs
from audit.labels import reason_label
from audit.masking import register_secrets
from mcpregistry.contracts import json_depth
from mcpregistry.crypto import SecretDecryptionError
from mcpregistry.list_fields import data_parts_from_text, line_blocks, line_problem, typed_value

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise


@dataclass
class RuleTrial:
    order: int
    name: str
    kind: str
    mcp_id: str
    tool: str
    matched: bool
    reason: str
    params: dict[str, Any] | None = None
    verdict: str = ""
    result: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    # The stage ended at this rule with a failure a run would end at (``reason``: its code and message), whether
    # or not the rule matched first (a match on a tool its server lacks fails the run).
    failed: bool = False
    # A match on a write tool (its contract's risk, as a run applies it): a run waits there for a person's
    # approval before it calls the tool (``approval:pending``), and decides the rules after it once approved.
    waits_for_approval: bool = False
    # The agent's runs have no model to read a failed call (the offline provider): where every call of the stage
    # fails, the run fails (``deterministic:tool_failed``), as ``agents.engine.execute`` ends it.
    no_model: bool = False

    @property
    def call_failure(self) -> str:
        """Why a matched rule's call fails, as a run's result names it (``args:range:expression``), else "": through
        the gate, the call's own error (a write waiting for its approval has not failed); in a dry run, the
        contract's objection to the rendered parameters, on which the gate refuses the call before sending it."""
        if not self.matched:
            return ""
        if self.result is not None:
            error = str(self.result.get("error") or "")
            return "" if self.result.get("ok") or error == "approval:pending" else error
        return self.verdict.partition(": ")[0] if self.verdict not in ("", "ok") else ""

    @property
    def undecided(self) -> bool:
        """A code rule that a dry run could not decide (it called its own tools, which a dry run does not call)."""
        from agents.deterministic_stage import NOT_DECIDABLE_IN_DRY_RUN

        return self.reason == NOT_DECIDABLE_IN_DRY_RUN

    @property
    def reason_text(self) -> str:
        """The decision's reason in the reader's language (``agents/decision_reasons.py``)."""
        if self.undecided:
            return gettext("not decidable in a dry run")
        return reason_text(self.reason)

    @property
    def params_json(self) -> str:
        """The rendered parameters as JSON (what the tool is sent, masked as its audit event records it), Korean as
        itself; a value that is no JSON (a code rule's date, which fails the stage) as its text."""
        return "" if self.params is None else json.dumps(self.params, ensure_ascii=False, default=str)

    @property
    def error_text(self) -> str:
        """A failed call's reason in words with its code (``args:allowed:region``), as the audit pages name it."""
        return reason_in_words((self.result or {}).get("error") or "")

    @property
    def value_json(self) -> str:
        """What the tool answered, indented, Korean as itself."""
        value = (self.result or {}).get("value")
        return "" if value is None else json.dumps(value, ensure_ascii=False, indent=2, default=str)

    @property
    def result_json(self) -> str:
        """The call's result as JSON, indented: its value, and the gate's outcome (ok, error, attempts, latency)."""
        return "" if self.result is None else json.dumps(self.result, ensure_ascii=False, indent=2, default=str)


def reason_in_words(code: str) -> str:
    """A reason code in words with the code (``argument expression out of range · args:range:expression``), as the
    audit pages name it; the code alone where no words are known."""
    return f"{reason_label(code)} · {code}" if code and reason_label(code) != code else code


def _json_field(label: StrOrPromise, help_text: StrOrPromise = "") -> forms.CharField:
    return forms.CharField(
        label=label, help_text=help_text, required=False, widget=forms.Textarea(attrs={"rows": 3, "cols": 60})
    )


FILE_KEYS = ("name", "mimeType", "uri", "bytes")
"""What a file of the tester's ``a2a_files`` field may hold: a file of the API's ``files`` (``A2AFileSerializer``)."""


class RuleTesterForm(forms.Form):
    agent = forms.ModelChoiceField(queryset=Agent.objects.order_by("slug"), label=_("agent"))
    # Empty where data parts or files are given: an A2A message of only those runs with an empty query.
    query = forms.CharField(label=_("query"), required=False, widget=forms.TextInput(attrs={"size": 80}))
    context = _json_field(
        _("A2A context (KEY=value lines, as in the rule editor, or a JSON object)"),
        _(
            "A KEY=value line reads as in the rule editor: vip=true is the boolean (true, false, null), quoted "
            "JSON text, an object or a list is that. A number stays text, as callers send ids (empno=1234 is the "
            "text 1234, which a rule's empno=1234 meets too); for a number, write the field as a JSON object."
        ),
    )
    a2a_data = _json_field(
        _(
            "A2A data parts (PATH=value lines as in the rule editor, a blank line between parts, a JSON object, or "
            "a JSON list of objects)"
        ),
        _(
            'An entry that is not a JSON object (7, a list, text) is kept as {"value": …}, as the API keeps a data '
            "part's."
        ),
    )
    a2a_files = _json_field(
        _("A2A files (what a code rule reads as ctx.a2a_files)"),
        _(
            "KEY=value lines, a blank line between files, or a JSON list of objects, as the API's files: name, "
            "mimeType, and exactly one of uri and bytes (base64: a run keeps its size, never the bytes)."
        ),
    )
    tested = forms.ChoiceField(
        label=_("rules of"),
        choices=[
            ("live", _("what live traffic runs: the live version (the agent as stored if never published)")),
            ("stored", _("the agent as stored, with changes not published yet")),
            ("version", _("the published version numbered below")),
        ],
        initial="live",
        required=False,  # not given: what live traffic runs
        widget=forms.RadioSelect,
        help_text=_("A/B arms run their own versions: test one by its number."),
    )
    version = forms.IntegerField(label=_("version number"), required=False, min_value=1)
    execute = forms.BooleanField(label=_("also call the matched tools through the gate (audited)"), required=False)

    def _parse(self, name: str, expected: type) -> Any:
        """The field's JSON (or lines) as the value a trial is given; a problem is told at the field, and the
        field then reads as empty. Nested no deeper than the API lets a run's JSON nest
        (``PLATFORM_API_MAX_JSON_DEPTH``), refused in the API's words: deeper, the trial was a 500 (a
        ``RecursionError`` where the input is composed and masked) or tried input that no run can be given."""
        value = self._read(name, expected)
        if json_depth(value) > self._max_depth():
            self._refuse_too_deep(name)
            return expected()
        return value

    @staticmethod
    def _max_depth() -> int:
        return int(api_setting("PLATFORM_API_MAX_JSON_DEPTH"))

    def _refuse_too_deep(self, name: str) -> None:
        # The API's own refusal (``agents.api.parsers.json_parse_bounded``), word for word.
        self.add_error(name, gettext("JSON nested deeper than %(max)d levels.") % {"max": self._max_depth()})

    def _read(self, name: str, expected: type) -> Any:
        raw = (self.cleaned_data.get(name) or "").strip()
        if not raw:
            return expected()
        if expected is dict and not raw.startswith("{"):
            return self._key_value_lines(name, raw)
        if expected is list and not raw.startswith(("[", "{")):
            try:
                return file_parts_from_text(raw) if name == "a2a_files" else self._data_lines(raw)
            except ValueError as exc:
                self.add_error(name, str(exc))
                return []
        if json_text_depth(raw) > self._max_depth():
            # Measured on the text, before it is parsed: Python's parser gives up at its own recursion limit.
            self._refuse_too_deep(name)
            return expected()
        try:
            # NaN and Infinity refused, as the API refuses them: a trial on input no run can be given is no trial.
            value = json.loads(raw, cls=FiniteJSONDecoder)
        except ValueError as exc:
            self.add_error(name, _("Not valid JSON: %(error)s") % {"error": json_error_text(exc)})
            return expected()
        if expected is list and isinstance(value, dict):
            value = [value]  # one data part (or file) written as its JSON object, as the rule editor's data field
        if not isinstance(value, expected):
            self.add_error(name, _("Expected a JSON %(kind)s.") % {"kind": expected.__name__})
            return expected()
        if name == "a2a_data" and isinstance(value, list):
            return [entry_as_run_keeps_it(entry) for entry in value]
        if isinstance(value, list):
            # Each file an object, as the API takes a file (a run never holds ``[1]``).
            others = [str(n) for n, part in enumerate(value, start=1) if not isinstance(part, dict)]
            if others:
                self.add_error(
                    name,
                    _("Each entry must be a JSON object; these are not: %(entries)s.") % {"entries": ", ".join(others)},
                )
                return []
        return value

    @staticmethod
    def _data_lines(raw: str) -> list[dict[str, Any]]:
        """Data parts as ``PATH=value`` lines (``data_parts_from_text``); a line without ``=`` is refused in the
        field's own words, naming the line (the lines' own "write KEY=value" named neither paths nor JSON)."""
        for number, line in enumerate(raw.splitlines(), start=1):
            key, sep, _value = line.strip().partition("=")
            if line.strip() and (not sep or not key.strip()):
                raise line_problem(
                    number, gettext("write PATH=value lines, or a JSON object, or a JSON list of objects")
                )
        return data_parts_from_text(raw)

    def clean_query(self) -> str:
        """The query, checked as the API checks a run's (``run_query_check``): a form error, never a 413."""
        from agents.services import run_query_check

        query = str(self.cleaned_data.get("query") or "")
        try:
            run_query_check(query)
        except ApplicationError as exc:
            raise forms.ValidationError(exc.message, code=exc.code) from None
        return query

    def _key_value_lines(self, name: str, raw: str) -> dict[str, Any]:
        """``KEY=value`` lines, each value read by ``context_line_value``; a line without ``=`` or a key given twice
        is told at the field, naming the line."""
        try:
            pairs = text_pairs(list(enumerate(raw.splitlines(), start=1)))
        except ValueError as exc:
            self.add_error(name, str(exc))
            return {}
        return {key: context_line_value(value) for key, value in pairs.items()}

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        # Each field's problem is told at its field, both at once.
        cleaned["context"] = self._parse("context", dict)
        cleaned["a2a_data"] = self._parse("a2a_data", list)
        cleaned["a2a_files"] = self._files(self._parse("a2a_files", list))
        # Data parts or files that did not read are told at their field: the query is not also asked for.
        given = cleaned["a2a_data"] or cleaned["a2a_files"] or {"a2a_data", "a2a_files"} & set(self.errors)
        if "query" in cleaned and not cleaned["query"] and not given:
            self.add_error(
                "query",
                _("Enter a query, or give data parts or files (a message of only those runs with an empty query)."),
            )
        cleaned["agent_version"] = frozen_version(self._tested_version(cleaned))
        return cleaned

    def _files(self, files: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The files as a run keeps them (``file_metadata``: name, media type, URI, size; never the bytes), each
        checked as the API checks a file; a problem names the file by its number and its field."""
        from agents.api.a2a import file_metadata
        from agents.api.serializers import A2AFileSerializer

        kept: list[dict[str, Any]] = []
        for number, file in enumerate(files, start=1):
            unknown = [str(key) for key in file if key not in FILE_KEYS]
            if unknown:
                self.add_error(
                    "a2a_files",
                    _("file %(n)d: %(keys)s: a file holds only %(valid)s")
                    % {"n": number, "keys": ", ".join(unknown), "valid": ", ".join(FILE_KEYS)},
                )
                continue
            checked = A2AFileSerializer(data=file)
            if not checked.is_valid():
                for field_name, problems in checked.errors.items():
                    for problem in problems:
                        self.add_error(
                            "a2a_files",
                            _("file %(n)d: %(field)s: %(problem)s")
                            % {"n": number, "field": field_name, "problem": problem},
                        )
                continue
            kept.append(file_metadata(dict(checked.validated_data)))
        return kept

    def _tested_version(self, cleaned: dict[str, Any]) -> AgentVersion | None:
        """The published version whose frozen rules, servers and contracts are tested; None: the agent as stored
        (also what live traffic runs where the agent was never published)."""
        agent, tested, number = cleaned.get("agent"), cleaned.get("tested"), cleaned.get("version")
        if agent is None or "version" in self.errors:
            return None
        if number is not None and tested in ("live", "", None):
            tested = "version"  # a number typed means that version, whichever choice was left as it was
        if tested in ("live", "", None):
            return agent.live_version
        if tested != "version":
            return None
        numbers = ", ".join(map(str, agent.versions.order_by("-number").values_list("number", flat=True))) or "—"
        if number is None:
            self.add_error("version", _("Enter a version number (its versions: %(numbers)s).") % {"numbers": numbers})
            return None
        chosen = agent.versions.filter(number=number).first()
        if chosen is None:
            self.add_error(
                "version",
                _("%(agent)s has no version %(number)s; its versions: %(numbers)s")
                % {"agent": agent.slug, "number": number, "numbers": numbers},
            )
        return chosen


def file_parts_from_text(text: str) -> list[dict[str, Any]]:
    """Files as ``KEY=value`` lines, a blank line between files; each value is text as typed (a file's name
    ``2024`` stays a name). A line without ``=``, or a key given twice in one file, is refused naming the line."""
    return [text_pairs(block) for block in line_blocks(text)]


def context_line_value(text: str) -> Any:
    """A context line's value as the rule editor reads a context condition's (``typed_value``), but a number as
    the text typed. ``vip=true`` is the boolean: a run whose caller sends JSON ``true`` meets the editor's
    ``vip=true``, and a boolean meets only a boolean, so read as the text "true" the trial skipped the rule a run
    matched (``"true"``, quoted, is the text). A number stays text, as callers send ids: a condition's number meets
    its text as it meets the number (``condition_value_matches``), and a parameter ``{context.empno}`` renders
    ``"1234"``, the text a caller's run sends the tool, not a number its contract may refuse."""
    value = typed_value(text)
    return text if isinstance(value, int | float) and not isinstance(value, bool) else value


def entry_as_run_keeps_it(entry: Any) -> dict[str, Any]:
    """An A2A data entry as the API keeps a data part's ``data`` (``DataPartField``, the A2A endpoint's
    ``_rest_part``): an object as itself, any other JSON value as ``{"value": ...}``, which rules and tools read
    as an object. Refused here, the trial could not be given what a run is."""
    return entry if isinstance(entry, dict) else {"value": entry}


def text_pairs(lines: list[tuple[int, str]]) -> dict[str, Any]:
    """Numbered ``KEY=value`` lines as an object, each value text as typed (blank lines skipped). A line without
    ``=``, or a key given twice, is refused naming the line."""
    pairs: dict[str, Any] = {}
    for number, line in lines:
        if not line.strip():
            continue
        key, sep, value = line.strip().partition("=")
        if not sep or not key.strip():
            raise line_problem(number, gettext("write KEY=value"))
        if key.strip() in pairs:
            raise line_problem(number, gettext("%(key)s is given twice") % {"key": key.strip()})
        pairs[key.strip()] = value.strip()
    return pairs


def frozen_version(version: AgentVersion | None) -> AgentVersion | None:
    """``version`` where it holds frozen content, else None: a run of a version without any runs the agent as
    stored (``agents.execution``)."""
    return version if version is not None and version.content else None


def tested_configuration(agent: Agent, version: AgentVersion | None) -> Any:
    """The servers, rules and contracts a run of ``agent`` (of ``version``, where it holds frozen content) works
    with, read now (``agents.config_cache.run_configuration``)."""
    from agents.config_cache import run_configuration

    return run_configuration(agent=agent, version=frozen_version(version), generation=None)


def trials_summary(trials: list[RuleTrial]) -> str:
    """The trial at a glance: the tools a run would call first, or that none would be (and the run ends at a
    rule's failure, or goes to the model); and the rules a dry run could not decide, which a run may call too."""
    last = trials[-1] if trials else None
    if last is not None and (last.failed or (not last.matched and last.reason.startswith(("deterministic:", "mcp:")))):
        # A failure the stage ends at (seed 000's errors): the trial list ends with it, as the run would.
        return str(_("A run would fail at rule %(rule)s (%(reason)s).") % {"rule": last.name, "reason": last.reason})
    matched = [t for t in trials if t.matched]
    # A call its contract refuses is not sent (nor asked a person about: the gate checks the arguments first).
    failing = [t for t in matched if t.call_failure]
    called = [f"{t.mcp_id}.{t.tool}" for t in matched if not t.call_failure]
    writes = [f"{t.mcp_id}.{t.tool}" for t in matched if t.waits_for_approval and not t.call_failure]
    undecided = {
        "rules": ", ".join(t.name for t in trials if t.undecided),
        "option": RuleTesterForm.base_fields["execute"].label,
    }
    if matched:
        # A write is not called at once: the run parks on it (``approval:pending``) until a person decides.
        if not called:
            text = gettext("%(matched)d of %(rules)d rules matched.")
        elif writes:
            text = gettext(
                "%(matched)d of %(rules)d rules matched: a run calls %(tools)s before the model, but waits for a "
                "person to approve each write first (%(writes)s): it parks there until the approval is decided."
            )
        else:
            text = gettext("%(matched)d of %(rules)d rules matched: a run calls %(tools)s before the model.")
        summary = text % {
            "matched": len(matched),
            "rules": len(trials),
            "tools": ", ".join(called),
            "writes": ", ".join(writes),
        }
        if failing:
            summary += " " + _failures_told(failing, others_called=bool(called), undecided=bool(undecided["rules"]))
        if undecided["rules"]:
            summary += (
                " "
                + gettext(
                    "%(rules)s could not be decided in a dry run, as they read their own tools' answers: a run may "
                    "call more. Tick '%(option)s' to see what a run does."
                )
                % undecided
            )
        return summary
    if undecided["rules"]:
        return (
            gettext(
                "A dry run cannot tell whether a run calls a tool first: %(rules)s could not be decided, as they read "
                "their own tools' answers. Tick '%(option)s' to see what a run does."
            )
            % undecided
        )
    return str(
        _("No rule matched: a run goes to the model (or the agent's no-match answer) with no tool called first.")
    )


def _failures_told(failing: list[RuleTrial], *, others_called: bool, undecided: bool) -> str:
    """The matched calls that fail, each with its reason in words, and what a run then does, as
    ``agents.engine.execute`` does it: with other calls that succeed, it goes on (the model, or the offline
    provider's answer, reads the failures beside their results); where every call fails, a run with no model to
    read the failures fails ``deterministic:tool_failed``, and a model answers without their results. Where rules
    were not decided (they may call more), the run's end is left to them."""
    told = []
    for trial in failing:
        code = trial.call_failure
        values = {"tool": f"{trial.mcp_id}.{trial.tool}", "reason": reason_in_words(code)}
        if code.startswith("args:"):  # the gate's refusal before anything is sent
            told.append(
                gettext("Its contract refuses the call of %(tool)s (%(reason)s): a run does not send it.") % values
            )
        else:
            told.append(gettext("The call of %(tool)s fails (%(reason)s).") % values)
    no_model = failing[0].no_model
    if others_called:
        told.append(
            gettext("A run goes on with the other calls: its answer says which tools could not answer.")
            if no_model
            else gettext("A run goes on with the other calls: the model reads these failures with their results.")
        )
    elif not undecided:
        code = "deterministic:tool_failed"
        told.append(
            gettext(
                "Every call a run would make fails and no model reads the failures: the run fails with %(code)s "
                "(%(reason)s)."
            )
            % {"code": code, "reason": reason_label(code)}
            if no_model
            else gettext("Every call a run would make fails: the model reads the failures and answers without them.")
        )
    return " ".join(told)


def tested_label(agent: Agent, version: AgentVersion | None) -> str:
    """What a trial tested, in words: the version (and whether it is live), or the agent as stored."""
    if frozen_version(version) is None:
        return str(_("%(agent)s as stored") % {"agent": agent.slug})
    live = str(_(" (live)")) if agent.live_version_id == version.pk else ""
    return f"{agent.slug} v{version.number}{live}"


def rules_trial(
    *,
    agent: Agent,
    query: str,
    context: dict[str, Any],
    a2a_data: list[Any],
    execute: bool,
    actor: str,
    version: AgentVersion | None = None,
    configuration: Any = None,
    a2a_files: list[dict[str, Any]] | None = None,
) -> list[RuleTrial]:
    """Evaluate the rules of ``agent`` against the input, in order, with the run's own deterministic stage
    (``agents.deterministic_stage``) and the configuration a run of it works with: that of the published
    ``version`` (its frozen rules, servers and contracts), else the agent as stored. The input is read as a run
    stores it (composed, the servers' secrets masked: ``run_input_guarded``). A dry run by default, through the
    gate when ``execute`` (audited, source ``admin``). A failure that would end a run
    (``deterministic:rule_error``, ``mcp:not_loaded:<id>``, ``deterministic:tool_unknown``) ends the trial list at
    that rule, with the run's reason code and text. ``configuration``: ``tested_configuration``'s, where the
    caller has it. ``a2a_files``: the files as a run keeps them (``agents.api.a2a.file_metadata``), which a code
    rule reads as ``ctx.a2a_files``."""
    # The stage and the gate load the MCP SDK and LangChain: a process that serves the admin pays for them when
    # a rule is first tried, not when it starts (this module is the URLconf's).
    from agents.deterministic_stage import StageInput, deterministic_stage
    from agents.services import run_input_guarded
    from mcpregistry import gate
    from mcpregistry.models import ToolContract

    frozen = frozen_version(version)
    configuration = configuration or tested_configuration(agent, version)
    secrets = configuration.server_secrets
    register_secrets(secrets)  # every binding's: the gate masks what a tool answers with those registered too
    provider = frozen.content["agent"].get("model_provider") if frozen is not None else agent.model_provider

    def who(call_id: str) -> gate.GateCall:
        return gate.GateCall(
            source="admin",
            actor=actor,
            call_id=call_id.replace("rule:", "rule-tester:", 1),
            contracts=configuration.contracts,
            follow_fallback=provider == "offline",  # as the agent's runs do
        )

    stage = deterministic_stage(
        StageInput(
            query=run_input_guarded(query, secrets),
            context=run_input_guarded(context, secrets),
            a2a_data=run_input_guarded(a2a_data, secrets),
            a2a_files=run_input_guarded(list(a2a_files or []), secrets),
            servers=list(configuration.servers),
            rules=list(configuration.rules),
            contracts=configuration.contracts,
        ),
        mode="execute" if execute else "dry_run",
        who=who,
        check_contracts=True,
        sends_writes=False,  # a trial never writes: a run asks a person first, which a trial cannot
    )
    trials: list[RuleTrial] = []
    for position, step in enumerate(stage.steps, start=1):
        rule = step.rule
        trial = RuleTrial(position, rule.name, "code" if rule.code else "admin", step.mcp_id, step.tool, False, "")
        trial.verdict, trial.notes = step.verdict, list(step.notes)
        trial.no_model = provider == "offline"  # as a run decides whether it fails where every call failed
        if step.failure is not None:
            # Also where the rule matched first (its tool is gone): the run fails here, it calls nothing more.
            trial.reason, trial.failed = f"{step.failure.code}: {step.failure.message}", True
        if step.decision is not None:
            trial.matched = step.decision.matched and step.failure is None
            trial.reason = trial.reason or step.decision.reason
            trial.params = step.params_shown  # masked as the run's trace and audit show them (never the secrets)
        if step.result is not None:
            trial.result = step.result.as_dict()
        if trial.matched:
            server = next((s for s in configuration.servers if s.mcp_id == step.mcp_id), None)
            tool = next((t for t in server.tools.all() if t.name == step.tool), None) if server else None
            trial.waits_for_approval = (
                server is not None
                and tool is not None
                and (gate.contract_applied(who=who(""), server=server, tool=tool).risk == ToolContract.Risk.WRITE)
            )
            if execute and trial.waits_for_approval and trial.result is None:
                trial.notes.append(
                    gettext(
                        "Not called: it changes things, and a run waits for a person to approve the call first. "
                        "The rule tester never sends a write."
                    )
                )
        trials.append(trial)
    return trials


def unreadable_configuration_text() -> str:
    return gettext(
        "A secret of this agent's servers cannot be decrypted with this server's keys (SECRETS_ENCRYPTION_KEYS lacks "
        "the key it was encrypted with): its runs fail until it can, and a trial cannot read it either. Add that key "
        "back, or enter the server's secrets again on its page."
    )


def _trial_shown(request: HttpRequest, form: RuleTesterForm) -> tuple[list[RuleTrial], str, str, str]:
    """The trial of a valid form, as the page shows it: the trials, their summary, the rules left out (disabled)
    and what was tested. Raises ``SecretDecryptionError`` where the configuration cannot be read."""
    data, disabled = form.cleaned_data, ""
    from agents.services import run_input_guarded

    configuration = tested_configuration(data["agent"], data["agent_version"])
    trials = rules_trial(
        agent=data["agent"],
        query=data["query"],
        context=data["context"],
        a2a_data=data["a2a_data"],
        execute=data["execute"],
        actor=f"rule-tester:{request.user.get_username()}",
        version=data["agent_version"],
        configuration=configuration,
        a2a_files=data["a2a_files"],
    )
    tested = tested_label(data["agent"], data["agent_version"])
    summary = trials_summary(trials)
    version_content = data["agent_version"].content if data["agent_version"] is not None else None
    mode = (version_content or {}).get("agent", {}).get("mode") if version_content else data["agent"].mode
    if mode == Agent.Mode.FLOW:
        # Seed 000: a flow calls its tools in its own nodes; its runs skip the deterministic stage.
        summary = str(
            _(
                "This agent runs a flow: its runs evaluate no rules (a flow calls its tools in its own nodes). "
                "The rules below are evaluated as for an agent of the ReAct mode."
            )
        )
    if data["agent_version"] is None:  # the agent as stored (the form keeps only a version with content)
        disabled_rules = deterministic_rule_specs(
            agent=data["agent"], server_ids=[server.pk for server in configuration.servers], enabled=False
        )
        names = [rule.name for rule in disabled_rules]
        if names:
            disabled = str(_("Not evaluated, disabled: %(names)s.") % {"names": ", ".join(names)})
    # The page shows the input back as the trial read it: a server's secret typed in is not shown again.
    form.data = form.data.copy()
    for name in ("query", "context", "a2a_data", "a2a_files"):
        form.data[name] = run_input_guarded(form.data.get(name) or "", configuration.server_secrets)
    return trials, summary, disabled, tested


def tester_initial(request: HttpRequest, agent: Agent | None) -> dict[str, Any]:
    """The form as a link opens it: its agent, and which of its rules are tested (``?tested=stored``, the link on a
    rule's page: the rule just edited, not the live version; ``?version=N``: that published version)."""
    initial: dict[str, Any] = {"agent": agent} if agent else {}
    tested = request.GET.get("tested", "")
    if tested in dict(RuleTesterForm.base_fields["tested"].choices):  # type: ignore[attr-defined]
        initial["tested"] = tested
    version = request.GET.get("version", "")
    if version.isascii() and version.isdigit() and int(version) > 0:
        initial["version"] = int(version)
        initial.setdefault("tested", "version")
    return initial


@permission_required("agents.change_deterministicrule", raise_exception=True)
def rule_tester_view(request: HttpRequest) -> HttpResponse:
    # The agent chosen: the one named (?agent=, the link on a rule's page), else the only one there is.
    agents = Agent.objects.order_by("slug")
    chosen = agents.filter(slug=request.GET.get("agent", "")).first() or (
        agents.first() if agents.count() == 1 else None
    )
    form = RuleTesterForm(request.POST or None, initial=tester_initial(request, chosen))
    trials: list[RuleTrial] | None = None
    summary, disabled, tested = "", "", ""
    if request.method == "POST" and form.is_valid():
        try:
            trials, summary, disabled, tested = _trial_shown(request, form)
        except SecretDecryptionError:
            # Its agent's key or a bound server's secrets were stored with a key this process lacks: its runs fail
            # (config:secret_unreadable), and a trial cannot read them either.
            form.add_error(None, unreadable_configuration_text())
    context = {
        **admin.site.each_context(request),
        "title": _("Rule tester"),
        "form": form,
        "trials": trials,
        "tested": tested,
        "summary": summary,
        "disabled": disabled,
    }
    return TemplateResponse(request, "admin/agents/rule_tester.html", context)
