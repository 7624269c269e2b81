"""One training step at world size 2 on a ~20M-param GPT: zerolite ZeRO-3 vs plain DDP.

    make bench        # writes benchmarks/results/latest.json

The step time each rank measures (median over timed steps, after warm-up) and the peak RSS
per rank go into the benchmark's extra_info; the ratio is computed in one run.
"""
import pytest

from zerolite.testing.multiprocess import run_ranks

from step_workloads import GPT_20M, run_steps

WORLD, MICRO, STEPS, WARMUP = 2, 4, 6, 2
_results: dict = {}


ZERO3 = {"stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 0}


def _run(kind):
    return run_ranks(run_steps, WORLD, kind, GPT_20M, MICRO, STEPS, WARMUP, timeout_s=900,
                     zero=ZERO3)


@pytest.mark.parametrize("kind", ["ddp", "zerolite"])
def test_step_world2_gpt20m(benchmark, kind):
    per_rank = benchmark.pedantic(_run, args=(kind,), rounds=1, iterations=1)
    median = max(r["median_step_s"] for r in per_rank)
    _results[kind] = median
    benchmark.extra_info.update({
        "engine": kind, "world_size": WORLD, "params": per_rank[0]["params"],
        "micro_batch": MICRO, "median_step_s": median,
        "peak_rss_mib_per_rank": [r["peak_rss_mib"] for r in per_rank],
        "rss_after_steps_mib_per_rank": [r["rss_after_steps_mib"] for r in per_rank],
    })
    if kind == "zerolite" and "ddp" in _results:
        benchmark.extra_info["step_time_ratio_vs_ddp"] = median / _results["ddp"]
    print(f"\n{kind}: median step {median:.3f}s, peak RSS/rank "
          f"{[round(r['peak_rss_mib']) for r in per_rank]} MiB")
