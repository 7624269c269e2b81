"""One GPT, world 1, every engine as its own users run it: tokens/s, MFU, peak memory, losses.

    python benchmarks/gpu_peers.py --out benchmarks/results/gpu_check/peers.json
    python benchmarks/gpu_peers.py --dry-run --out /tmp/peers.json   # tiny model on CPU

Engines (each in a process of its own, so peak memory and start-up are its own):
  torch             fp32 params, bf16 autocast, torch.optim.AdamW(fused=True), clip 1.0
  fsdp2             fully_shard per block + root, MixedPrecisionPolicy(bf16 params, fp32
                    reduce), AdamW (torch's default foreach), clip_grad_norm_ 1.0
  deepspeed         deepspeed.initialize with the JSON below (ZeRO-3 defaults, bf16,
                    "torch_adam": true so nothing is JIT-built), when `import deepspeed` works
  zerolite          zerolite.initialize with the same JSON
  zerolite_offload  the same JSON plus offload_optimizer cpu, pin_memory

Same seed, same initial weights (built on the device), same batches, same hyper-parameters.
Per engine: tokens/s over the measured steps, MFU = 6 * params * tokens/s / the device's dense
bf16 peak (H200 and H100 SXM 989 TFLOP/s; `peak_flops`), peak max_memory_allocated / max_memory_reserved over the whole process,
first-step seconds, and the loss of every step. The summary adds each loss's relative
difference from the torch engine's. A failing engine is recorded with its error; the others
still run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

ENGINES = ("torch", "fsdp2", "deepspeed", "zerolite", "zerolite_offload")
BF16_DENSE_FLOPS = {"H200": 989e12, "H100 80GB HBM3": 989e12, "H100 SXM": 989e12,
                    "H100 NVL": 835e12, "H100 PCIe": 756e12, "A100": 312e12}
"""Dense bf16 peak by device-name fragment (NVIDIA's datasheets); the first that the device
name contains wins. The lent machines are an H200 and an 'NVIDIA H100 80GB HBM3' (SXM)."""


def peak_flops(device_name: str) -> float | None:
    """Dense bf16 peak for MFU, or None for a device not in the table (MFU left out)."""
    for fragment, flops in BF16_DENSE_FLOPS.items():
        if fragment in device_name:
            return flops
    return None
LR, BETAS, EPS, WD, CLIP = 3e-4, (0.9, 0.95), 1e-8, 0.1, 1.0


def model_config(dry: bool):
    from zerolite.models import GPTConfig

    if dry:
        return GPTConfig(vocab_size=256, seq_len=32, n_layer=2, n_head=2, d_model=32)
    # ~1.3B parameters: 24 x 12 d^2 + (vocab + seq) d with tied embeddings.
    return GPTConfig(vocab_size=32768, seq_len=2048, n_layer=24, n_head=16, d_model=2048)


def ds_config(micro: int, offload: bool) -> dict:
    zero = {"stage": 3}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    return {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": 1,
            "gradient_clipping": CLIP, "bf16": {"enabled": True},
            "optimizer": {"type": "AdamW", "params": {
                "lr": LR, "betas": list(BETAS), "eps": EPS, "weight_decay": WD,
                "torch_adam": True}},
            "zero_optimization": zero}


def batches(cfg, micro: int, n: int, device):
    g = torch.Generator().manual_seed(1234)
    data = torch.randint(0, cfg.vocab_size, (n, micro, cfg.seq_len + 1), generator=g)
    return [(d[:, :-1].to(device), d[:, 1:].to(device)) for d in data]


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _build(engine: str, cfg, micro: int, device):
    """(step(x, y) -> loss tensor, notes)."""
    from zerolite.models import GPT

    torch.manual_seed(0)
    with torch.device(device):
        model = GPT(cfg)
    if engine == "torch":
        opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS,
                                weight_decay=WD, fused=device.type == "cuda")

        def step(x, y):
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = model(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss
        return step, "fp32 params, bf16 autocast, fused AdamW"
    if engine == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.blocks:
            fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS,
                                weight_decay=WD)

        def step(x, y):
            loss = model(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss
        return step, "fully_shard per block, bf16 params / fp32 reduce, AdamW (foreach)"
    if engine == "deepspeed":
        import deepspeed as lib
    else:
        import zerolite as lib
    ds, *_ = lib.initialize(model=model, model_parameters=model.parameters(),
                            config=ds_config(micro, engine == "zerolite_offload"))

    def step(x, y):
        loss = ds(x, y)
        ds.backward(loss)
        ds.step()
        return loss
    return step, f"{lib.__name__} {getattr(lib, '__version__', '')} ZeRO-3 defaults, bf16"


def run_engine(engine: str, micro: int, steps: int, warmup: int, dry: bool) -> dict:
    """In this process: build `engine`, train warmup + steps steps, measure."""
    import torch.distributed as dist

    device = torch.device("cpu" if dry else "cuda")
    if engine == "deepspeed":
        os.environ.setdefault("DS_ACCELERATOR", device.type)
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo" if dry else "nccl")
    elif engine != "torch":
        dist.init_process_group("gloo" if dry else "nccl")
    if device.type == "cuda":
        torch.cuda.set_device(0)
    cfg = model_config(dry)
    t0 = time.perf_counter()
    step, notes = _build(engine, cfg, micro, device)
    build_s = time.perf_counter() - t0
    data = batches(cfg, micro, warmup + steps, device)
    losses, times = [], []
    for x, y in data:
        _sync(device)
        t = time.perf_counter()
        loss = step(x, y)
        losses.append(float(loss.detach().float()))
        _sync(device)
        times.append(time.perf_counter() - t)
    params = cfg.num_params()
    tokens = micro * cfg.seq_len
    measured = sum(times[warmup:])
    tok_s = tokens * steps / measured
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    peak = peak_flops(name)
    row = {"engine": engine, "notes": notes, "params": params, "micro": micro,
           "seq": cfg.seq_len, "build_s": build_s, "first_step_s": times[0],
           "step_s": measured / steps, "tokens_per_s": tok_s, "device": name,
           "peak_flops": peak, "mfu": None if peak is None else 6 * params * tok_s / peak,
           "losses": losses}
    if device.type == "cuda":
        row.update(peak_allocated_gib=torch.cuda.max_memory_allocated() / 2**30,
                   peak_reserved_gib=torch.cuda.max_memory_reserved() / 2**30)
    if dist.is_initialized():
        dist.destroy_process_group()
    return row


def compare(rows: list[dict]) -> None:
    """Each row's largest relative loss difference from the torch row, per step."""
    ref = next((r for r in rows if r["engine"] == "torch" and "losses" in r), None)
    for r in rows:
        if ref and "losses" in r:
            r["max_rel_loss_diff_vs_torch"] = max(
                abs(a - b) / abs(b) for a, b in zip(r["losses"], ref["losses"]))


def table(rows: list[dict]) -> str:
    lines = ["| engine | tokens/s | MFU | peak alloc GiB | peak reserved GiB | step 1 s | "
             "loss 1 -> last | max rel diff vs torch |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['engine']} | FAILED: {r['error'][:120]} |||||||")
            continue
        lines.append(
            f"| {r['engine']} | {r['tokens_per_s']:.0f} | "
            f"{'n/a' if r.get('mfu') is None else format(r['mfu'], '.1%')} | "
            f"{r.get('peak_allocated_gib', 0):.1f} | {r.get('peak_reserved_gib', 0):.1f} | "
            f"{r['first_step_s']:.2f} | {r['losses'][0]:.4f} -> {r['losses'][-1]:.4f} | "
            f"{r.get('max_rel_loss_diff_vs_torch', float('nan')):.2e} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines", default=",".join(ENGINES))
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--timeout", type=int, default=75, help="seconds per engine")
    p.add_argument("--dry-run", action="store_true", help="tiny model on CPU")
    p.add_argument("--out", default="benchmarks/results/gpu_check/peers.json")
    p.add_argument("--engine", help=argparse.SUPPRESS)  # child: run one engine, print JSON
    args = p.parse_args(argv)
    if args.engine:
        row = run_engine(args.engine, args.micro, args.steps, args.warmup, args.dry_run)
        print("ROW " + json.dumps(row), flush=True)
        return 0
    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_peers: needs a CUDA device (or --dry-run); nothing measured")
        return 0
    rows = []
    for i, engine in enumerate(args.engines.split(",")):
        if engine == "deepspeed" and not _importable("deepspeed"):
            rows.append({"engine": engine, "error": "import deepspeed failed (not installed?)"})
            continue
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29600 + i), RANK="0",
                   WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        cmd = [sys.executable, os.path.abspath(__file__), "--engine", engine,
               "--micro", str(args.micro), "--steps", str(args.steps),
               "--warmup", str(args.warmup)] + (["--dry-run"] if args.dry_run else [])
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=args.timeout)
            out, rc = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else \
                (exc.stdout or "")
            rc = "timeout"
        found = [ln for ln in out.splitlines() if ln.startswith("ROW ")]
        row = json.loads(found[-1][4:]) if found and rc == 0 else \
            {"engine": engine, "error": f"rc={rc}: {out[-1500:]}"}
        row["wall_s"] = round(time.monotonic() - t0, 1)
        rows.append(row)
        print(f"gpu_peers: {engine}: {'ok' if 'error' not in row else 'FAILED'} "
              f"in {row['wall_s']}s", flush=True)
        if "error" in row:
            print(row["error"], flush=True)
    compare(rows)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    print(table(rows))
    return 0 if all("error" not in r for r in rows if r["engine"] != "deepspeed") else 1


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


if __name__ == "__main__":
    sys.exit(main())
