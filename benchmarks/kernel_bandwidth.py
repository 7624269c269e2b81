"""GB/s of the quantization kernels on one CUDA device, against its memory bandwidth.

    python benchmarks/kernel_bandwidth.py --out benchmarks/results/gpu_check/kernels.json

For int8 and int4 (block 256): quantize (fp32 in -> codes + scales), dequantize (codes +
scales -> fp32) and the fused dequantize-sum of K=8 chunks (what qgZ runs after its
all-to-all). The top-k selection kernel of sparsified gradients (ratios 1% and 0.1% of a
16M-element unit), with torch.topk's time on the same tensor beside it. The fused Adam/AdamW
step on bf16 master weights (bf16 grad and states, 64M elements) for its three roundings
(nearest, kahan, stochastic), with torch's fused AdamW on the same bf16 tensors beside it.
GB/s = bytes a kernel must read and write / its median time (CUDA events,
after autotuning). The reference is the device's own copy bandwidth (`dst.copy_(src)`,
read + write), and the spec figure where the driver reports clock and bus width.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BLOCK, K = 256, 8


def traffic_bytes(op: str, n: int, bits: int, block: int = BLOCK, k: int = K) -> int:
    """Bytes read + written by one call on `n` elements (per chunk for dequantize_sum)."""
    nb = -(-n // block)
    packed = nb * block * bits // 8 + nb * 4  # codes of the padded length + fp32 scales
    if op == "quantize":
        return n * 4 + packed
    if op == "dequantize":
        return packed + n * 4
    if op == "dequantize_sum":
        return k * packed + n * 4
    raise ValueError(op)


def spec_bandwidth_gbs(props) -> float | None:
    """2 transfers per clock x bus width, where the driver reports both (HBM, GDDR)."""
    clock_khz = getattr(props, "memory_clock_rate", None)
    bus_bits = getattr(props, "memory_bus_width", None)
    if not clock_khz or not bus_bits:
        return None
    return 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9


def time_s(fn, warmup: int = 3, iters: int = 20) -> float:
    for _ in range(warmup):  # the first calls compile and autotune
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


TOPK_ELEMENTS, TOPK_RATIOS = 1 << 24, (0.01, 0.001)


def topk_rows(x: torch.Tensor, copy_gbs: float) -> list[dict]:
    """The top-k selection kernel (sparsified gradients) on one unit-sized fp32 tensor: GB/s
    of the least traffic any selection needs (read x, write the residual, write the selected
    (index, value) pairs), and its time against torch.topk on the same tensor (the twin's
    core)."""
    from triton_kernels.topk_ref import selected_count
    from triton_kernels.topk_triton import topk_select_triton

    n = x.numel()
    rows = []
    for ratio in TOPK_RATIOS:
        k = selected_count(n, ratio)
        res = torch.empty_like(x)
        seconds = time_s(lambda: topk_select_triton(x, k, res))
        torch_s = time_s(lambda: torch.topk(x.abs(), k, sorted=False))
        gbs = (8 * n + 8 * k) / seconds / 1e9
        rows.append({"op": "topk_select", "bits": f"r={ratio:g}", "elements": n,
                     "seconds": seconds, "GB/s": gbs, "vs_copy": gbs / copy_gbs,
                     "torch_topk_seconds": torch_s})
    return rows


ADAMW_ELEMENTS = 1 << 26


def adamw_traffic_bytes(n: int, rounding: str, param: int = 2, grad: int = 2,
                        state: int = 2) -> int:
    """Bytes read + written by one Adam step on `n` elements (sizes in bytes per element):
    param, grad, exp_avg and exp_avg_sq read; param and both states written; kahan also reads
    and writes its bf16 compensation."""
    if rounding not in ("nearest", "kahan", "stochastic"):
        raise ValueError(rounding)
    return n * (2 * param + grad + 4 * state + (4 if rounding == "kahan" else 0))


def adamw_rows(n: int, copy_gbs: float, dev) -> list[dict]:
    """The fused Adam step on bf16 params, grads and states, per rounding; torch's fused AdamW
    (fp32 math, bf16 storage: what "nearest" computes) on the same tensors for scale."""
    from triton_kernels.adamw_triton import adamw_step_triton

    gen = torch.Generator(device=dev).manual_seed(0)
    p = torch.randn(n, device=dev, generator=gen).to(torch.bfloat16)
    g = (torch.randn(n, device=dev, generator=gen) * 1e-2).to(torch.bfloat16)
    m = torch.zeros_like(p)
    v = torch.zeros_like(p)
    c = torch.zeros_like(p)
    kw = dict(step=10, lr=1e-4, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)
    rows = []
    for rounding in ("nearest", "kahan", "stochastic"):
        comp = c if rounding == "kahan" else None
        seconds = time_s(lambda: adamw_step_triton(p, g, m, v, comp, rounding=rounding, **kw))
        gbs = adamw_traffic_bytes(n, rounding) / seconds / 1e9
        rows.append({"op": "adamw_step", "bits": f"bf16 {rounding}", "elements": n,
                     "seconds": seconds, "GB/s": gbs, "vs_copy": gbs / copy_gbs})
    tp = p.clone().requires_grad_(True)
    tp.grad = g.clone()
    opt = torch.optim.AdamW([tp], lr=1e-4, weight_decay=0.01, fused=True)
    rows[0]["torch_fused_adamw_seconds"] = time_s(opt.step)
    return rows


def run(n: int) -> dict:
    from triton_kernels.quantize_triton import (dequantize_sum_triton, dequantize_triton,
                                                quantize_triton)

    dev = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(dev)
    src = torch.randn(n, device=dev)
    dst = torch.empty_like(src)
    copy_gbs = 2 * n * 4 / time_s(lambda: dst.copy_(src)) / 1e9
    rows = []
    for bits in (8, 4):
        codes, scales = quantize_triton(src, bits, BLOCK)
        chunk = n // K
        c2 = torch.stack([quantize_triton(src[i * chunk:(i + 1) * chunk], bits, BLOCK)[0]
                          for i in range(K)])
        s2 = torch.stack([quantize_triton(src[i * chunk:(i + 1) * chunk], bits, BLOCK)[1]
                          for i in range(K)])
        cases = {"quantize": (lambda: quantize_triton(src, bits, BLOCK), n),
                 "dequantize": (lambda: dequantize_triton(codes, scales, bits, BLOCK, n), n),
                 "dequantize_sum": (lambda: dequantize_sum_triton(c2, s2, bits, BLOCK, chunk),
                                    chunk)}
        for op, (fn, elems) in cases.items():
            seconds = time_s(fn)
            gbs = traffic_bytes(op, elems, bits) / seconds / 1e9
            rows.append({"op": op, "bits": bits, "elements": elems, "seconds": seconds,
                         "GB/s": gbs, "vs_copy": gbs / copy_gbs})
    rows += topk_rows(src[:min(n, TOPK_ELEMENTS)], copy_gbs)
    rows += adamw_rows(min(n, ADAMW_ELEMENTS), copy_gbs, dev)
    spec = spec_bandwidth_gbs(props)
    for r in rows:
        r["vs_spec"] = r["GB/s"] / spec if spec else None
    return {"device": props.name, "elements": n, "block": BLOCK, "K": K,
            "copy_GB/s": copy_gbs, "spec_GB/s": spec, "kernels": rows}


def table(result: dict) -> str:
    spec = result["spec_GB/s"]
    lines = [f"device {result['device']}: copy {result['copy_GB/s']:.0f} GB/s"
             + (f", spec {spec:.0f} GB/s" if spec else ", spec n/a"),
             "| kernel | bits | GB/s | vs copy | vs spec |", "|---|---|---|---|---|"]
    for r in result["kernels"]:
        vs_spec = f"{r['vs_spec']:.0%}" if r["vs_spec"] else "n/a"
        lines.append(f"| {r['op']} | {r['bits']} | {r['GB/s']:.0f} | {r['vs_copy']:.0%} | "
                     f"{vs_spec} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--elements", type=int, default=1 << 28)  # 1 GiB of fp32
    p.add_argument("--out", default="benchmarks/results/gpu_check/kernels.json")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("kernel_bandwidth: needs a CUDA device; nothing measured")
        return 0
    result = run(args.elements)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
