"""``python -m bench.tool_selection``: it builds its registry of 300+ tools through the platform's own services and
prints each ranker's figures, the headline last. (It stopped working when the run's plan grew frozen contracts and
nothing ran it.) Recall is checked against the README's floor; timings are not checked."""

from __future__ import annotations

import pytest

from tests.e2e.harness import bench_figures, run_bench

pytestmark = [pytest.mark.slow]


def test_the_tool_selection_bench_ranks_the_labelled_queries_and_prints_the_headline_last() -> None:
    done = run_bench("bench.tool_selection", "--repeat", "1", timeout=600)

    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    found = bench_figures(done.stdout)
    names = [line.partition(": ")[0] for line in done.stdout.splitlines() if ": " in line]
    assert names[-1] == "prompt_tokens_saved_ratio"
    assert found["lexical_recall_at_5"] >= 0.9  # the target for the lexical ranker
    for name in ("embedding_recall_at_5", "lexical_mrr", "prompt_tokens_all_tools", "prompt_tokens_top_k"):
        assert found[name] > 0, name
