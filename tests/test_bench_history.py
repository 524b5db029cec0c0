"""``python -m bench.history`` at a small size: the key's runs counted at both sizes (the long history is the short
one, the runs written in bulk and the long one's requests), each figure measured, the headline last, and nothing
of the demo's admin password in what it prints. Timings are not checked."""

from __future__ import annotations

import pytest

from tests.e2e.harness import bench_figures, run_bench

pytestmark = [pytest.mark.slow]


def test_the_history_bench_measures_both_requests_at_both_sizes_and_prints_the_headline_last() -> None:
    done = run_bench("bench.history", "--requests", "5", "--history", "300", timeout=300)

    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    found = bench_figures(done.stdout)
    names = [line.partition(": ")[0] for line in done.stdout.splitlines() if ": " in line]
    assert names[-1] == "post_ms_ratio_long_over_short"
    assert found["runs_of_key_long"] == found["runs_of_key_short"] + 300 + 5  # the bulk history, then 5 POSTs
    for name in ("post_ms_p50_short", "post_ms_p50_long", "page_ms_p50_short", "page_ms_p50_long"):
        assert found[name] > 0, name
    assert "password" not in done.stdout + done.stderr
