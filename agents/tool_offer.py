"""What the model is offered on each turn of one run: top-K selection, widening, forced first call, and the
tools withdrawn after too many argument errors (seed 003 §5, §6; seed 002 §7.1).

The engine builds one :class:`ToolOffer` per run from its tool index; the ReAct graph asks it for each turn's
tool specs (``turn_tools``) and the engine's ``call_tool`` asks it whether a call may go to the gate
(``check``) and tells it each result (``record``). Refusals themselves are written by the gate
(``tool:not_offered``, ``tool:withdrawn``), so they are audited like every other call.

When a call fails in a way for which the gate tells the model to use the tool's fallback (its contract's
``fallback_tool``), that fallback is offered from the next turn on (``why: fallback``), within the hard filters:
the model is never told to call a tool it would then be refused. A matched rule's call that failed so tells the
model in its system message: its fallback is offered from the first turn (``suggest_fallback``). When the named
ranker fails (an embedding outage), the lexical one ranks for the rest of the run, and the first turn it does so
says why in the trace.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, ToolMessage

from agents.answers import text_of
from agents.errors import MUST_PROPAGATE
from agents.tool_selection import (
    LexicalRanker,
    Ranker,
    Selection,
    ToolDoc,
    ToolSelectionSettings,
    WideningState,
    select_tools,
    within_filters,
)
from mcpregistry.models import McpServer, McpTool

Index = dict[str, tuple[McpServer, McpTool]]
Verdict = Literal["ok", "not_offered", "withdrawn"]

# How much of the conversation (besides the query) the ranker reads: the model's own words of the last turns.
CONVERSATION_CHARS = 600

# The failures after which the gate suggests a tool's fallback to the model (``mcpregistry.gate``'s step 6: a
# backend that failed, or the tool's own error; not an empty answer nor a paused server, nor a refusal before the
# call). A write whose answer failed its check (``result:*``) is never handed to its fallback.
FALLBACK_SUGGESTED = frozenset(
    {
        "timeout",
        "rate_limit",
        "transport",
        "protocol",
        "unexpected",
        "tool:error",
        "result:shape",
        "result:too_big",
        "result:range",
    }
)


def tool_doc(name: str, server: McpServer, tool: McpTool) -> ToolDoc:
    """What the rankers know of ``tool``, offered to the model as ``name``. Its words are its own name's, not the
    alias's the model may be given (``agents.engine.model_tool_names``): ``직원.검색`` ranks for "직원 검색" though
    the model calls it ``tool_66dde059``."""
    properties = (tool.input_schema or {}).get("properties") or {}
    return ToolDoc(
        name=name,
        own_name=tool.exposed_name,
        mcp_id=server.mcp_id,
        description=tool.description or "",
        argument_names=tuple(str(a) for a in properties),
        tags=tuple(str(t) for t in (tool.tags or [])),
        example_queries=tuple(str(q) for q in (tool.example_queries or [])),
    )


@dataclass
class ToolOffer:
    """One run's offers. ``active`` is False when selection is off, or when the agent has no more than
    ``top_k`` tools and no hard filter (``servers``, ``tags``): every tool is then offered (less the withdrawn
    ones). With a hard filter the filter always applies; only the ranking is skipped when few tools pass it."""

    index: Index
    specs: dict[str, dict[str, Any]]
    settings: ToolSelectionSettings
    query: str
    rule_named: list[str] = field(default_factory=list)
    ranker: Ranker | None = None
    fallback_ranker: Ranker | None = None
    correction_caps: dict[str, int] = field(default_factory=dict)
    on_selection: Callable[[Selection, int], None] = lambda selection, turn: None
    first_turn_of_run: bool = True
    offered: list[str] = field(default_factory=list)
    widening: WideningState = field(default_factory=WideningState)
    corrections: dict[str, int] = field(default_factory=dict)
    withdrawn: set[str] = field(default_factory=set)
    # Platform tools beside the index (``read_resource``): always offered, never ranked.
    extra_specs: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Tools whose calls went to the gate in this run: kept in the offer, so the model can repeat or correct one.
    called: list[str] = field(default_factory=list)
    # A tool's fallback (by the names the model sees) and whether the tool writes, from the contract the gate
    # applies; the fallbacks the gate suggested in this run (to the model or in a rule's result) are offered from
    # the next turn on.
    fallback_tools: dict[str, tuple[str, bool]] = field(default_factory=dict)
    suggested_fallbacks: list[str] = field(default_factory=list)
    # Why the ranker the settings name is not the one ranking (no embedding service, its vectors not to be had):
    # said once, on the first selection of the run.
    ranker_note: str = ""

    def __post_init__(self) -> None:
        self.docs = [tool_doc(name, server, tool) for name, (server, tool) in self.index.items()]
        self.docs_by_name = {d.name: d for d in self.docs}
        filtered = bool(self.settings.servers or self.settings.tags)
        self.active = self.settings.enabled and (len(self.index) > self.settings.top_k or filtered)
        if self.active and self.ranker is None:
            self.ranker = LexicalRanker(self.docs)
        self.offered = list(self.index)

    def turn_tools(self, messages: list[AnyMessage], turns: int) -> tuple[list[dict[str, Any]], str | None]:
        """The specs to bind for model turn ``turns`` and the ``tool_choice`` (only on the run's first turn): the
        settings' ``force_first_tool`` (a matched rule's, the agent's, or the model's own ``tool_choice``, as
        ``agents.engine`` sets it), a named tool always among those offered and not forced once it is not: the
        turn's selection entry then says so (``forced_dropped``), one written for it where selection is off."""
        forced = self.settings.force_first_tool if self.first_turn_of_run and turns == 0 else ""
        named = forced if forced != "any" else ""
        self._remember_answered_calls(messages)
        if self.active:
            assert self.ranker is not None
            always = [(n, "rule") for n in self.rule_named] + [(n, "called") for n in self.called]
            always += [(n, "fallback") for n in self.suggested_fallbacks]
            if forced and forced != "any":
                always.insert(0, (forced, "forced"))
            selection = select_tools(
                ranker=self.ranker,
                text=self._ranking_text(messages),
                candidates=[d for d in self.docs if d.name not in self.withdrawn],
                settings=self.settings,
                always=always,
                widening=self.widening,
                fallback_ranker=self.fallback_ranker,
                must_propagate=MUST_PROPAGATE,
            )
            if selection.fallback and self.fallback_ranker is not None:
                # One outage is enough: the rest of the run ranks lexically, not waiting on the service each turn.
                self.ranker, self.fallback_ranker = self.fallback_ranker, None
            if self.ranker_note and not selection.fallback:
                selection.fallback = self.ranker_note
            self.ranker_note = ""
            self.offered = selection.offered
            if named and named not in self.offered:
                selection.forced_dropped = self._forced_dropped(named)
            self.on_selection(selection, turns)
        else:
            self.offered = [n for n in self.index if n not in self.withdrawn]
            if named and named not in self.offered:
                # Selection is off, so no turn has a selection entry: this one says what was offered unforced.
                self.on_selection(
                    Selection(
                        offered=list(self.offered),
                        scores={},
                        reasons=dict.fromkeys(self.offered, ""),
                        ranker="none",
                        candidates=len(self.offered),
                        forced_dropped=self._forced_dropped(named),
                        docs={n: self.docs_by_name[n] for n in self.offered},
                    ),
                    turns,
                )
        if named and named not in self.offered:
            forced = ""  # withdrawn, outside the hard filters, or no tool of the run: nothing to force
        # A platform tool never stands beside a server's tool of the same name (the engine does not offer it then).
        extra = [spec for name, spec in self.extra_specs.items() if name not in self.index]
        return [self.specs[n] for n in self.offered] + extra, (forced or None)

    def _forced_dropped(self, name: str) -> dict[str, str]:
        """Why the named tool to force is not offered (``Selection.forced_dropped``)."""
        if name in self.withdrawn:
            why = "withdrawn"
        elif name not in self.index:
            why = "not_a_tool"  # a rule stored for a tool since disabled, renamed or of a server unbound
        else:
            why = "filtered_out"  # outside the agent's servers and tags: a rule stored before that was checked
        return {"tool": name, "why": why}

    def _remember_answered_calls(self, messages: Sequence[AnyMessage]) -> None:
        """Tools whose calls succeeded earlier in the conversation (a resumed run's too) stay in the offer."""
        succeeded = {m.tool_call_id for m in messages if isinstance(m, ToolMessage) and m.status == "success"}
        for message in messages:
            if isinstance(message, AIMessage):
                for call in message.tool_calls:
                    name = call["name"]
                    if call.get("id") in succeeded and name in self.index and name not in self.called:
                        self.called.append(name)

    def _ranking_text(self, messages: Sequence[AnyMessage]) -> str:
        # Text only: a Bedrock turn's content is a list of blocks (its tool_use ids and inputs are no words).
        said = " ".join(
            text for m in messages if isinstance(m, AIMessage | HumanMessage) and (text := text_of(m.content))
        )
        return f"{self.query} {said[-CONVERSATION_CHARS:]}" if said else self.query

    def check(self, name: str) -> Verdict:
        """May a model's call to ``name`` (a tool of the index) go to the gate this turn? A call to a tool not
        offered widens the next offers with it (a bounded number of times), unless the hard filters keep it out for
        good: no offer could add it, and the widening it used up was refused to a tool they do let in."""
        if name in self.withdrawn:
            return "withdrawn"
        if self.active and name not in self.offered:
            self._widen(name)
            return "not_offered"
        if name not in self.called:
            self.called.append(name)
        return "ok"

    def _widen(self, name: str) -> None:
        """A call to ``name`` was refused as not offered: the next offers add it, while the run has widenings
        left and the hard filters let it in."""
        if (
            self.widening.widenings < self.settings.max_widenings
            and name not in self.widening.extra
            and (doc := self.docs_by_name.get(name)) is not None
            and within_filters(doc, self.settings)
        ):
            self.widening.widenings += 1
            self.widening.extra.append(name)

    def offered_later(self, name: str) -> bool:
        """Whether the next turns offer ``name``, a call to which :meth:`check` refused as not offered: only when
        that call widened the offer with it. Outside the hard filters, or with no widening left, the refusal tells
        the model not to call it again rather than that the next step may offer more."""
        return name in self.widening.extra and name not in self.withdrawn

    def restore_corrections(self, messages: Sequence[BaseMessage]) -> None:
        """Recount the argument errors and widenings of an earlier pass of this run (a run parked for an approval
        resumes with its conversation): each tool message keeps its gate reason code as its artifact. A refusal as
        not offered widens again as it did (``check``'s rule): a resumed run has no fresh ``max_widenings``, and
        the tools an earlier pass widened with stay offered."""
        for message in messages:
            if isinstance(message, ToolMessage) and message.name in self.index:
                artifact = message.artifact if isinstance(message.artifact, dict) else {}
                if artifact.get("error") == "tool:not_offered":
                    self._widen(message.name)
                self.record(message.name, artifact.get("error"))

    def suggest_fallback(self, name: str, error: str | None) -> None:
        """A call of ``name`` failed with ``error`` (the model's, or a matched rule's, whose result the system
        message gives the model): where the gate suggests the tool's fallback for it, the next turns offer that
        fallback. Counts nothing: a rule's argument error is no mistake of the model's to withdraw a tool for."""
        if error and error in FALLBACK_SUGGESTED and name in self.fallback_tools:
            fallback, writes = self.fallback_tools[name]
            if not (writes and error.startswith("result:")) and fallback not in self.suggested_fallbacks:
                self.suggested_fallbacks.append(fallback)

    def record(self, name: str, error: str | None) -> bool:
        """Count an argument error the model could fix; returns True when that withdraws the tool. A failure
        for which the gate suggests the tool's fallback puts the fallback in the next turns' offers."""
        self.suggest_fallback(name, error)
        if not error or not error.startswith("args:"):
            return False
        self.corrections[name] = self.corrections.get(name, 0) + 1
        if self.corrections[name] >= self.correction_caps.get(name, 3) and name not in self.withdrawn:
            self.withdrawn.add(name)
            return True
        return False
