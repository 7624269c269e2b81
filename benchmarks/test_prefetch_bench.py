"""Prefetch off vs on: how much of ZeRO-3's all-gather time is hidden behind compute.

    make bench        # all benchmarks; or: .venv/bin/python -m pytest benchmarks/test_prefetch_bench.py

Per configuration (world size, model size, dtype) and prefetch setting: median step time,
exposed all-gather wait as a fraction of total all-gather time, peak RSS per rank and peak
live gathered bytes, in extra_info of the saved JSON; a table is printed at the end.
"""
import statistics

import pytest

from zerolite.testing.multiprocess import run_ranks

from step_workloads import GPT_20M, GPT_80M, run_steps

MICRO, STEPS, WARMUP = 4, 5, 2
CASES = [(2, "20M", "fp32"), (2, "20M", "bf16"), (2, "80M", "fp32"), (2, "80M", "bf16"),
         (4, "20M", "fp32")]
SIZES = {"20M": GPT_20M, "80M": GPT_80M}
# "on" prefetches one unit ahead (any budget > 0 allows the next unit): the least memory;
# a budget of the whole model hides no more on this 2-core machine and holds it all.
PREFETCH = {"off": {"stage3_prefetch_bucket_size": 0},
            "on": {"stage3_prefetch_bucket_size": 1}}
BASE = {"stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 0}
ROWS = []


def summarize(per_rank: list[dict]) -> dict:
    comm = [c for r in per_rank for c in r["comm"]]
    return {"median_step_s": max(r["median_step_s"] for r in per_rank),
            "all_gather_s_per_step": statistics.mean(c["all_gather_s"] for c in comm),
            "exposed_gather_s_per_step": statistics.mean(c["all_gather_wait_s"] for c in comm),
            "exposed_reduce_s_per_step": statistics.mean(c["reduce_scatter_wait_s"] for c in comm),
            "peak_rss_mib_per_rank": [round(r["peak_rss_mib"]) for r in per_rank],
            "peak_live_gathered_mib": max(c["peak_live_bytes"] for c in comm) / 2**20}


@pytest.mark.parametrize("prefetch", ["off", "on"])
@pytest.mark.parametrize("world,size,dtype", CASES)
def test_prefetch(benchmark, world, size, dtype, prefetch):
    zero = {**BASE, **PREFETCH[prefetch]}
    per_rank = benchmark.pedantic(
        run_ranks, args=(run_steps, world, "zerolite", SIZES[size], MICRO, STEPS, WARMUP),
        kwargs={"dtype": dtype, "zero": zero, "timeout_s": 1800}, rounds=1, iterations=1)
    row = {"world": world, "size": size, "dtype": dtype, "prefetch": prefetch,
           **summarize(per_rank)}
    benchmark.extra_info.update(row)
    ROWS.append(row)


def teardown_module(module):
    """Print the table. "exposed" = time compute blocked on gathers, as a fraction of the
    all-gather time of the same configuration with prefetch off (where every gather is
    waited for in full: its exposed time IS its communication time). With prefetch on,
    gathers overlap each other, so their summed durations are not a cost."""
    if not ROWS:
        return
    off = {(r["world"], r["size"], r["dtype"]): r for r in ROWS if r["prefetch"] == "off"}
    print("\n| world | size | dtype | prefetch | median step s | exposed all-gather s/step | "
          "exposed / all-gather time (off) | exposed reduce s/step | peak live MiB | "
          "peak RSS MiB/rank |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in ROWS:
        base = off.get((r["world"], r["size"], r["dtype"]))
        frac = (f"{r['exposed_gather_s_per_step'] / base['all_gather_s_per_step']:.0%}"
                if base and base["all_gather_s_per_step"] else "n/a")
        print(f"| {r['world']} | {r['size']} | {r['dtype']} | {r['prefetch']} | "
              f"{r['median_step_s']:.3f} | {r['exposed_gather_s_per_step']:.3f} | {frac} | "
              f"{r['exposed_reduce_s_per_step']:.3f} | {r['peak_live_gathered_mib']:.1f} | "
              f"{r['peak_rss_mib_per_rank']} |")
