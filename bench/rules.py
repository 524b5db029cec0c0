"""What deterministic rules cost and what they save.

Run from the repo root: ``python -m bench.rules [--rounds N] [--model-latency-ms MS]``.

1. ``rules_1000_eval_ms``: evaluating 1,000 admin rules (keywords, regexes with named groups, context and data
   conditions, params templates) against a query, as the deterministic stage does before any call, ``--rounds``
   times (default 200; target: under 5 ms at p50).
2. Seed 001's eval set (its single- and multi-tool questions, and one that needs no tool), each run through
   the real engine, the demo server and a scripted model that takes a fixed latency per call (``--model-latency-ms``,
   default 200): once with the demo's rules (``rules``), once with the rules answering directly (``rules_direct``:
   the agent's "answer from deterministic results"), and once without rules (``no_rules``, the model finds the
   tools itself: the baseline). The demo server's shared session is opened by a warm-up run first (not counted),
   so that no variant's first run pays the server's start.

Printed as a table, then ``name: value`` lines: ``runs_failed`` (runs that did not succeed: the bench then stops
there and exits 1, their time and tokens being no run's cost); per variant ``<variant>_model_calls_per_run``, ``_tokens_per_run``
and ``_ms_per_run``; ``model_calls_saved_by_rules`` (the fraction of the baseline's model calls that the rules
save); ``rules_1000_eval_ms_p95`` / ``_p50``; and last the headline ``rules_over_no_rules_ms_per_run``: the rules'
milliseconds per run over the baseline's, both measured in this run.
"""

from __future__ import annotations

import argparse
import io
import random
import sys
import time
from typing import Any

from bench._stats import median, percentile, positive_int

QUESTIONS: list[dict[str, Any]] = [
    {
        "question": "김하늘 님은 어느 팀 소속인가요?",
        "type": "single_tool",
        "model_finds": [[("search_employee", {"name": "김하늘"})]],
        "after_rules": [],
    },
    {
        "question": "이서준 님이 소속된 팀에서 진행 중인 프로젝트를 알려주세요.",
        "type": "multi_tool",
        "model_finds": [[("search_employee", {"name": "이서준"})], [("list_projects", {"team": "클라우드운영팀"})]],
        "after_rules": [[("list_projects", {"team": "클라우드운영팀"})]],
    },
    {
        "question": "A-1001 자산의 현재 상태를 알려주세요.",
        "type": "single_tool",
        "model_finds": [[("get_asset_status", {"asset_id": "A-1001"})]],
        "after_rules": [],
    },
    {"question": "어떤 일을 도와줄 수 있어?", "type": "no_tool", "model_finds": [], "after_rules": []},
]


def script(turns: list[list[tuple[str, dict[str, Any]]]]) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = [{"tool_calls": [{"name": n, "args": a} for n, a in turn]} for turn in turns]
    return [*steps, {"content": "답변: {last_tool_result}"}]


def synthetic_rules(count: int) -> list[Any]:
    from agents.deterministic import RuleSpec

    rng = random.Random(42)
    words = ["주문", "조회", "배송", "환불", "자산", "팀", "프로젝트", "인원", "상태", "검색", "규정", "연차"]
    rules = []
    for i in range(count):
        kind = i % 4
        when: dict[str, Any]
        if kind == 0:
            when = {"all_keywords": rng.sample(words, 2)}
        elif kind == 1:
            when = {"any_keywords": rng.sample(words, 3), "regex": rf"(?P<code>[A-Z]-{i % 10}\d{{3}})"}
        elif kind == 2:
            when = {"regex": rf"(?P<name>[가-힣]{{2,4}})\s*님.*{rng.choice(words)}{i}"}
        else:
            when = {"context": {"chatbotId": f"bot-{i}"}, "data": {"order.id": "*"}}
        rules.append(
            RuleSpec(i, f"rule {i}", "svc", "tool", when=when, params={"q": "{query}", "user": "{context.userId}"})
        )
    return rules


def eval_rules_ms(rounds: int) -> list[float]:
    from agents.deterministic import decide

    rules = synthetic_rules(1000)
    query = "김하늘 님의 주문 조회와 배송 상태를 알려주세요 A-1001"
    context = {"chatbotId": "bot-3", "userId": "u-1"}
    data = [{"order": {"id": "O-1"}}]
    timings = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for rule in rules:
            decide(rule, query=query, context=context, a2a_data=data, available_tools={"tool"})
        timings.append((time.perf_counter() - t0) * 1000)
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=positive_int, default=200)
    parser.add_argument("--model-latency-ms", type=float, default=200.0)
    options = parser.parse_args()

    print("evaluating 1,000 rules…", file=sys.stderr)
    rule_ms = eval_rules_ms(options.rounds)

    from bench._django import setup_django

    setup_django()
    from django.core.management import call_command

    from agents.execution import run_execute
    from agents.models import Agent, Run
    from agents.services import agent_create, deterministic_rule_create

    BENCH = "system:bench"
    from mcpregistry.pool import shutdown_default_pool

    # Its report (the admin's password among it) is not the bench's output.
    call_command("seed_demo", "--admin-username", "bench", verbosity=0, stdout=io.StringIO())
    demo = Agent.objects.get(slug="company-assistant")
    latency = options.model_latency_ms / 1000

    def agent_for(variant: str, index: int, turns: list[Any]) -> Agent:
        agent = agent_create(
            actor=BENCH,
            via="bench",
            data={
                "slug": f"{variant}-{index}",
                "name": variant,
                "system_prompt": demo.system_prompt,
                "model_provider": "scripted",
                "model_params": {"script": script(turns), "latency_s": latency},
                "answer_from_deterministic": variant == "rules_direct",
            },
            servers=demo.servers.all(),
        )
        if variant != "no_rules":
            for rule in demo.rules.all():
                deterministic_rule_create(
                    actor=BENCH,
                    via="bench",
                    data={
                        "agent": agent,
                        "name": rule.name,
                        "order": rule.order,
                        "server": rule.server,
                        "tool_name": rule.tool_name,
                        "when": rule.when,
                        "params": rule.params,
                        "answer_template": rule.answer_template,
                    },
                )
        return agent

    # Warm-up (not counted): the demo server's shared session is opened and the engine's first run paid here, so
    # that the baseline's first run does not include them.
    warm = agent_for("warm_up", 0, QUESTIONS[0]["model_finds"])
    warm_run = Run.objects.create(agent=warm, query=QUESTIONS[0]["question"])
    run_execute(run_id=str(warm_run.id))

    rows = []
    totals: dict[str, dict[str, float]] = {}
    runs_failed = 0
    for index, item in enumerate(QUESTIONS):
        for variant in ("no_rules", "rules", "rules_direct"):
            turns = item["model_finds"] if variant == "no_rules" else item["after_rules"]
            agent = agent_for(variant, index, turns)
            run = Run.objects.create(agent=agent, query=item["question"])
            t0 = time.perf_counter()
            run_execute(run_id=str(run.id))
            elapsed = (time.perf_counter() - t0) * 1000
            run.refresh_from_db()
            usage = run.token_usage or {}
            tools = [c.tool for c in run.audit_events.filter(action="tool.call").order_by("id")]
            rows.append(
                (
                    item["type"],
                    item["question"][:22],
                    variant,
                    usage.get("model_calls", 0),
                    usage.get("total_tokens", 0),
                    round(elapsed),
                    ",".join(tools),
                    run.status,
                )
            )
            bucket = totals.setdefault(variant, {"calls": 0, "tokens": 0, "ms": 0, "runs": 0})
            if run.status != Run.Status.SUCCEEDED:
                runs_failed += 1  # shown in the table; its time, calls and tokens are no run's cost
                continue
            bucket["calls"] += usage.get("model_calls", 0)
            bucket["tokens"] += usage.get("total_tokens", 0)
            bucket["ms"] += elapsed
            bucket["runs"] += 1
    shutdown_default_pool()

    header = ("type", "question", "variant", "model calls", "tokens", "ms", "tools called", "status")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
    print()
    print(f"runs_failed: {runs_failed}")
    if runs_failed:
        sys.exit(f"{runs_failed} runs did not succeed (the table's status column): no figure of them")
    for variant, bucket in totals.items():
        runs = bucket["runs"]
        print(f"{variant}_model_calls_per_run: {bucket['calls'] / runs:.2f}")
        print(f"{variant}_tokens_per_run: {bucket['tokens'] / runs:.1f}")
        print(f"{variant}_ms_per_run: {bucket['ms'] / runs:.0f}")
    saved = 1 - totals["rules"]["calls"] / max(totals["no_rules"]["calls"], 1)
    print(f"model_calls_saved_by_rules: {saved:.3f}")
    print(f"rules_1000_eval_ms_p95: {percentile(rule_ms, 0.95):.3f}")
    print(f"rules_1000_eval_ms_p50: {median(rule_ms):.3f}")
    # The headline: what a run costs with the demo's rules against the same questions without them, this run.
    ms_per_run = {variant: bucket["ms"] / bucket["runs"] for variant, bucket in totals.items()}
    print(f"rules_over_no_rules_ms_per_run: {ms_per_run['rules'] / ms_per_run['no_rules']:.3f}")


if __name__ == "__main__":
    main()
