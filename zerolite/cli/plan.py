"""`zerolite plan`: the step-time model of zerolite.plan as a table (or `--json`).

    zerolite plan --params 7e9 --gpus 8 64 256 1024 [--tokens-per-gpu 4096] [--summary]
    zerolite plan --layers 32 --d-model 4096 --vocab 32000 --seq 4096 --gpus 64
"""
from __future__ import annotations

import argparse
import json

from zerolite.plan import SCHEMES, Cluster, Workload, assumptions, gpt_units, params_units, plan


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="zerolite plan",
        description="Predict compute vs communication per optimizer step for DDP, ZeRO-3 and "
                    "ZeRO++ (hpZ, qwZ, qgZ). Defaults: an H100/H200 node (8 GPUs, NVLink "
                    "450 GB/s per direction, one 400 Gb/s NIC = 50 GB/s per GPU, 989 bf16 "
                    "TFLOP/s at 40%% MFU).")
    size = p.add_argument_group("model size: --params, or a GPT shape")
    size.add_argument("--params", type=float, help="parameter count, e.g. 7e9")
    size.add_argument("--layers", type=int)
    size.add_argument("--d-model", type=int)
    size.add_argument("--vocab", type=int)
    size.add_argument("--seq", type=int, help="sequence length (learned position embeddings)")
    p.add_argument("--tokens-per-gpu", type=int, default=4096,
                   help="tokens per GPU per optimizer step, all micro-steps (default 4096)")
    p.add_argument("--micro-steps", type=int, default=1,
                   help="gradient accumulation steps (ZeRO-3 gathers/reduces each; default 1)")
    p.add_argument("--gpus", type=int, nargs="+", default=[8], help="GPU count(s)")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--intra-gbps", type=float, default=450.0,
                   help="intra-node GB/s per GPU per direction (default 450: NVLink 4 nominal)")
    p.add_argument("--inter-gbps", type=float, default=50.0,
                   help="inter-node GB/s per GPU per direction (default 50: 400 Gb/s IB)")
    p.add_argument("--peak-tflops", type=float, default=989.0,
                   help="peak TFLOP/s per GPU (default 989: H100/H200 dense bf16)")
    p.add_argument("--mfu", type=float, default=0.4, help="model FLOPs utilization (0.4)")
    p.add_argument("--dtype-bytes", type=int, default=2,
                   help="bytes per gathered parameter element (2: bf16; 4: fp32)")
    p.add_argument("--grad-bytes", type=int, default=None,
                   help="bytes per reduced gradient element (default: --dtype-bytes, the "
                        "communication_data_type default of DeepSpeed and zerolite)")
    p.add_argument("--hpz", type=int, default=None, help="hpZ partition size (default: node)")
    p.add_argument("--qwz-bits", type=int, default=8)
    p.add_argument("--qgz-bits", type=int, default=4)
    p.add_argument("--block-size", type=int, default=256)
    p.add_argument("--schemes", nargs="+", choices=SCHEMES, default=list(SCHEMES))
    p.add_argument("--summary", action="store_true",
                   help="one line per scheme and GPU count (no per-collective rows)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def _workload(args) -> Workload:
    shape = (args.layers, args.d_model, args.vocab, args.seq)
    if args.params is not None:
        if any(v is not None for v in shape):
            raise ValueError("give --params or the GPT shape, not both")
        units = params_units(int(args.params))
    elif all(v is not None for v in shape):
        units = gpt_units(*shape)
    else:
        raise ValueError("give --params, or all of --layers --d-model --vocab --seq")
    return Workload(units, tokens_per_gpu=args.tokens_per_gpu, micro_steps=args.micro_steps,
                    param_bytes=args.dtype_bytes,
                    grad_bytes=args.grad_bytes or args.dtype_bytes, hpz=args.hpz,
                    qwz_bits=args.qwz_bits, qgz_bits=args.qgz_bits, block_size=args.block_size)


def run(args) -> dict:
    w = _workload(args)
    out = {"params": w.params, "tokens_per_gpu": w.tokens_per_gpu, "runs": []}
    for n in args.gpus:
        c = Cluster(gpus=n, gpus_per_node=args.gpus_per_node, intra_gbps=args.intra_gbps,
                    inter_gbps=args.inter_gbps, peak_tflops=args.peak_tflops, mfu=args.mfu)
        out["runs"].append({"gpus": n, "assumptions": assumptions(w, c),
                            "schemes": [r.as_dict() for r in plan(w, c, args.schemes)]})
    return out


def _gb(n: int) -> str:
    return f"{n / 1e9:9.3f}"


def print_report(out: dict, summary: bool) -> None:
    print(f"step-time model: {out['params']:,} params, {out['tokens_per_gpu']:,} tokens per "
          "GPU per step (GB = 1e9 bytes one GPU sends per step)")
    print("assumptions:")
    for line in out["runs"][0]["assumptions"][:1] + out["runs"][0]["assumptions"][2:]:
        print(f"  - {line}")
    head = (f"{'gpus':>5} {'scheme':<20}{'intra GB':>9} {'inter GB':>9} {'compute s':>9} "
            f"{'comm fwd':>9} {'comm bwd':>9} {'exposed':>9} {'step s':>9}  hidden  break-even")
    if summary:
        print("\n" + head)
    for run in out["runs"]:
        if not summary:
            print(f"\n{run['assumptions'][1]}")
            print(f"  {'scheme':<20}{'collective':<38}{'phase':<9}{'group':>6}{'intra GB':>10}"
                  f"{'inter GB':>10}{'time s':>9}")
            for s in run["schemes"]:
                for c in s["collectives"]:
                    print(f"  {s['scheme']:<20}{c['name']:<38}{c['phase']:<9}{c['group']:>6}"
                          f"{_gb(c['intra_bytes']):>10}{_gb(c['inter_bytes']):>10}"
                          f"{c['seconds']:9.4f}")
            print("\n" + head)
        for s in run["schemes"]:
            print(f"{run['gpus']:>5} {s['scheme']:<20}{_gb(s['intra_bytes'])} "
                  f"{_gb(s['inter_bytes'])} {s['compute_s']:9.4f} {s['comm_fwd_s']:9.4f} "
                  f"{s['comm_bwd_s']:9.4f} {s['exposed_s']:9.4f} {s['step_s']:9.4f}  "
                  f"{'yes' if s['hidden'] else 'NO':<6}  {s['break_even_tokens']:>10,}")
    print("\nbreak-even = tokens per GPU per step from which communication hides (same "
          "micro-steps)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        out = run(args)
    except ValueError as e:
        build_parser().error(str(e))
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print_report(out, args.summary)
    return 0
