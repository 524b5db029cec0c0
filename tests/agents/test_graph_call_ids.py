"""A model turn's tool calls get ids no other call of the run has, as the turn is received: in its tool calls and
in the provider's own forms of them (content blocks, ``additional_kwargs``), so that what is sent back to the
provider pairs each result with its call."""

from __future__ import annotations

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from agents.graph import with_unique_call_ids


def turn(*ids: str | None, blocks: bool = False) -> AIMessage:
    calls = [{"name": "append_line", "args": {"text": str(i)}, "id": call_id} for i, call_id in enumerate(ids)]
    content: list[dict[str, object]] | str = (
        [{"type": "tool_use", "id": c["id"], "name": c["name"], "input": c["args"]} for c in calls] if blocks else ""
    )
    raw = [{"id": c["id"], "type": "function", "function": {"name": "append_line"}} for c in calls]
    return AIMessage(content=content, tool_calls=calls, additional_kwargs={"tool_calls": raw})


def test_a_turn_with_new_ids_is_kept_as_it_came() -> None:
    response = turn("call_a", "call_b")
    assert with_unique_call_ids(response, [HumanMessage("질문")]) is response


def test_an_id_used_in_an_earlier_turn_gets_a_new_one_everywhere() -> None:
    earlier = [HumanMessage("질문"), turn("call_0"), ToolMessage("ok", tool_call_id="call_0")]

    renamed = with_unique_call_ids(turn("call_0", blocks=True), earlier)

    assert [c["id"] for c in renamed.tool_calls] == ["call_0_r2"]
    assert isinstance(renamed.content, list)
    assert [b["id"] for b in renamed.content if isinstance(b, dict)] == ["call_0_r2"]
    assert [c["id"] for c in renamed.additional_kwargs["tool_calls"]] == ["call_0_r2"]


def test_ids_repeated_within_one_turn_or_missing_are_told_apart_in_order() -> None:
    renamed = with_unique_call_ids(turn("x", "x", None, blocks=True), [HumanMessage("질문")])

    assert [c["id"] for c in renamed.tool_calls] == ["x", "x_r2", "call_r2"]
    assert [c["args"] for c in renamed.tool_calls] == [{"text": "0"}, {"text": "1"}, {"text": "2"}]
    assert isinstance(renamed.content, list)
    assert [b["id"] for b in renamed.content if isinstance(b, dict)] == ["x", "x_r2", "call_r2"]


def test_a_new_id_is_one_every_provider_takes() -> None:
    """Bedrock's ToolUseId is [a-zA-Z0-9_.:-]+ of at most 64 characters (botocore's model of the Converse API)."""
    import re

    long_id = "tooluse_" + "A1b2" * 14  # 64 characters, reused
    renamed = with_unique_call_ids(turn(long_id, long_id), [HumanMessage("질문")])
    for call in renamed.tool_calls:
        assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", str(call["id"])), call["id"]
    assert len({c["id"] for c in renamed.tool_calls}) == 2


def test_a_model_giving_the_platforms_own_call_ids_gets_its_own() -> None:
    """``rule:…`` and ``flow:…`` name calls an admin configured, which the run's caller may approve: a model (or its
    server) giving one would pass its own write off as a rule's."""
    renamed = with_unique_call_ids(turn("rule:7", "flow:1", blocks=True), [HumanMessage("질문")])

    ids = [c["id"] for c in renamed.tool_calls]
    assert ids == ["model_rule_7_r2", "model_flow_1_r2"]
    assert isinstance(renamed.content, list)
    assert [b["id"] for b in renamed.content if isinstance(b, dict)] == ids
    assert [c["id"] for c in renamed.additional_kwargs["tool_calls"]] == ids
