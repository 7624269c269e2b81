"""`zerolite check-config CONFIG.json --world-size N [--params P | --model module:factory]`.

Prints the resolved config, the batch triangle and a per-rank model-state memory estimate for
ZeRO stages 0-3 (the accounting below).

Bytes per parameter Ψ that zerolite holds (Adam/AdamW; N = world size), checked against
engine.memory_stats() of real runs (tests/test_memory_estimate.py):

    mixed precision (fp16/bf16): params 2 (16-bit shard; stages 0-2 also keep the full
    16-bit params), grads 4 (zerolite keeps fp32 gradients, not 16-bit ones), optimizer 12
    (fp32 master 4 + exp_avg 4 + exp_avg_sq 4)
        stage 0: 20Ψ   stage 1: 6Ψ + 14Ψ/N   stage 2: 2Ψ + 18Ψ/N   stage 3: 18Ψ/N

    fp32: params 4 (the fp32 master IS the param shard: FlatParam.shard is master.data; stages
    0-2 also keep the full params), grads 4, optimizer 8 (exp_avg + exp_avg_sq)
        stage 0: 20Ψ   stage 1: 8Ψ + 12Ψ/N   stage 2: 4Ψ + 16Ψ/N   stage 3: 16Ψ/N

    bf16 masters (bf16.bf16_master_weights_and_grads; the bf16 master IS the param shard):
    params 2, grad shards 2 (stages 0-1 keep their full fp32 accumulation buffer, 4), optimizer
    8 (fp32 moments, with offload_optimizer) or, with bf16.bf16_optimizer_states, 4 (+2 for
    zerolite.master_rounding "kahan"'s compensation)
        stage 3: 12Ψ/N (fp32 moments)   8Ψ/N (bf16 states)   10Ψ/N (bf16 states + kahan)
    (zerolite/state_bytes.py holds the table)

Note: the ZeRO paper's table (16Ψ at stage 0, 16Ψ/N at stage 3 with 16-bit grads) is
DeepSpeed's accounting. zerolite differs in two places: the reduced gradient shard is fp32 at
stages 2-3 (rounded to the accumulation dtype where DeepSpeed's 16-bit one rounds: +2Ψ/N in
mixed precision; stages 0-1 keep the full gradient in the parameters' dtype, as DeepSpeed), and at stages 0-2 the full compute-dtype params sit
next to the shard (stage 0: one extra full copy; stages 1-2: an extra 1/N).

Stage 3 also holds the units gathered at the moment (reported separately), and with hpZ
(`zero_hpz_partition_size` h > 1) the secondary shards: from a unit's forward to its
backward, 1/h of its compute-dtype params (2Ψ/h in 16 bit, 4Ψ/h in fp32) at most, the root
unit excluded with --model (it stays gathered from forward to backward). Activations,
temporary buffers and the CUDA/allocator overhead are not included.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import warnings

from zerolite.state_bytes import mode_of, state_bytes

MIB = 1024 ** 2
GIB = 1024 ** 3

def _layout(sb, stage: int, accum_bytes: int) -> dict[str, tuple[int, int]]:
    """part -> bytes per parameter as (unsharded, sharded over N), for the StateBytes `sb`."""
    c = sb.compute
    if stage == 0:  # nothing sharded: full params + a full shard (= the master for fp32)
        params = (2 * c, 0)
    elif stage < 3:  # full params kept gathered, plus this rank's shard
        params = (c, c)
    else:
        params = (0, c)
    # stages 0-1: the full gradient in its buffer between backward and step (stage 0 turns it
    # into the master's fp32 one at the step, as DeepSpeed's fp16/bf16 optimizer does); stages
    # 2-3: the reduced shard (the master's dtype)
    grads = (accum_bytes, 0) if stage < 2 else (0, sb.grad)
    optimizer = (sb.optimizer, 0) if stage == 0 else (0, sb.optimizer)
    return {"params": params, "grads": grads, "optimizer": optimizer}


def estimate_model_state_bytes(num_params: int, world_size: int, stage: int,
                               precision: str, compensation: bool = False,
                               accum_bytes: int | None = None) -> dict:
    """Per-rank model-state bytes for Adam under ZeRO ``stage`` (0-3).

    ``precision``: "fp16", "bf16" (or "mixed"), "fp32", "bf16_masters" or
    "bf16_masters_states" (zerolite/state_bytes.py); ``compensation``: the Kahan buffer of bf16
    masters; ``accum_bytes``: bytes per element of stages 0-1's gradient buffer (default: the
    compute dtype's, DeepSpeed's default data_types.grad_accum_dtype; 4 with "fp32").
    Returns a dict with "params", "grads", "optimizer" (master apart from the shard +
    Adam moments + compensation), "total" (floats, bytes) and "formula" (e.g. "4Ψ + 12Ψ/N").
    Excludes activations and stage 3's gathered units.
    """
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage must be 0, 1, 2 or 3, got {stage!r}")
    sb = state_bytes(precision, compensation=compensation)
    if world_size < 1 or num_params < 0:
        raise ValueError("world_size must be >= 1 and num_params >= 0")
    out: dict = {}
    full = shard = 0
    for part, (unsharded, sharded) in _layout(sb, stage, accum_bytes or sb.compute).items():
        out[part] = float(unsharded * num_params) + sharded * num_params / world_size
        full, shard = full + unsharded, shard + sharded
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    terms = ([f"{full}Ψ"] if full else []) + ([f"{shard}Ψ/N"] if shard else [])
    out["formula"] = " + ".join(terms)
    return out


def _precision_of(cfg) -> str:
    return "bf16" if cfg.bf16.enabled else "fp16" if cfg.fp16.enabled else "fp32"


def _load_model(spec: str):
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--model {spec!r}: expected 'module:factory' (e.g. mypkg.models:build)")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    factory = importlib.import_module(module_name)
    for part in attr.split("."):
        factory = getattr(factory, part)
    if not callable(factory):
        raise ValueError(f"--model {spec!r}: {attr} is not callable")
    model = factory()
    import torch.nn as nn

    if not isinstance(model, nn.Module):
        raise ValueError(f"--model {spec!r}: the factory returned {type(model).__name__}, "
                         "not a torch.nn.Module")
    return model


def count_params(model) -> int:
    """Parameters of ``model``, each tied (shared) parameter counted once."""
    unique = {id(p): p for p in model.parameters()}  # parameters() already skips duplicates
    return sum(p.numel() for p in unique.values())


def _unit_sizes(model) -> tuple[int, int]:
    """(root unit numel, largest other unit numel) under zerolite's default unit policy."""
    from zerolite.zero.partition import assign_params, find_unit_modules

    units = find_unit_modules(model, None)
    owner, _ = assign_params(model, units)
    sizes = [0] * (len(units) + 1)
    for p, unit in owner.items():
        sizes[unit] += p.numel()
    return sizes[0], max(sizes[1:], default=0)


def _fmt(nbytes: float) -> str:
    return f"{nbytes / GIB:10.3f} GiB" if nbytes >= GIB else f"{nbytes / MIB:10.3f} MiB"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="zerolite check-config", allow_abbrev=False,
                                description="Validate a DeepSpeed config and estimate memory.")
    p.add_argument("config", help="DeepSpeed JSON config")
    p.add_argument("--world-size", "--world_size", dest="world_size", type=int, required=True)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--params", type=float, default=None,
                   help="number of model parameters (1.3e9 is fine)")
    g.add_argument("--model", default=None, help="module:factory returning an nn.Module")
    p.add_argument("--hidden-size", "--hidden_size", dest="hidden_size", type=int, default=None,
                   help="model hidden size, to resolve 'auto' bucket sizes")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (config, batch, memory in bytes) instead of text")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from zerolite.config import load_config
    from zerolite.errors import ZeroliteConfigError
    from zerolite.initialize import guess_hidden_size

    model = None
    hidden = args.hidden_size
    if args.model is not None:
        try:
            model = _load_model(args.model)
        except Exception as e:  # noqa: BLE001 - the user's import/factory failing is a user error
            sys.stderr.write(f"zerolite check-config: error: --model {args.model!r}: "
                             f"{type(e).__name__}: {e}\n")
            return 2
        hidden = hidden or guess_hidden_size(model)
    if args.params is not None and (args.params < 0 or not float(args.params).is_integer()):
        sys.stderr.write(f"zerolite check-config: error: --params {args.params}: expected a "
                         "non-negative whole number\n")
        return 2
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cfg = load_config(args.config, args.world_size, hidden_size=hidden)
    except ZeroliteConfigError as e:
        sys.stderr.write(f"zerolite check-config: error: {e}\n")
        return 2
    for w in caught:
        sys.stderr.write(f"zerolite check-config: warning: {w.message}\n")

    num_params = None
    if model is not None:
        num_params = count_params(model)
    elif args.params is not None:
        num_params = int(args.params)
    summary = summarize(cfg, num_params, model)
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True, default=str))
    else:
        print_summary(summary)
    return 0


def summarize(cfg, num_params: int | None, model=None) -> dict:
    """Everything check-config reports, as JSON-able data (memory in bytes)."""
    out = {"config": cfg.to_dict(),
           "batch": {"train_batch_size": cfg.train_batch_size,
                     "train_micro_batch_size_per_gpu": cfg.train_micro_batch_size_per_gpu,
                     "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
                     "world_size": cfg.world_size},
           "num_params": num_params, "precision": _precision_of(cfg),
           "state_mode": mode_of(cfg)[0], "compensation": mode_of(cfg)[1],
           "stage": cfg.zero_optimization.stage, "memory": None}
    if num_params is None:
        return out
    mode, compensation = mode_of(cfg)
    sb = state_bytes(mode, compensation=compensation)
    compute_bytes = sb.compute
    accum = None if cfg.grad_accum_torch_dtype == cfg.precision_dtype else 4
    mem = {"per_stage": {s: estimate_model_state_bytes(num_params, cfg.world_size, s, mode,
                                                       compensation, accum) for s in range(4)}}
    if model is not None:
        root, largest = _unit_sizes(model)
        live = min(num_params, root + 2 * largest)
        mem["stage3_gathered_bytes"] = live * compute_bytes
        mem["stage3_gathered_note"] = (
            f"root unit {root:,} params kept gathered + 2 x largest unit {largest:,} params "
            "(the one computing and the next)")
    else:
        live = min(num_params, cfg.zero_optimization.stage3_max_live_parameters)
        mem["stage3_gathered_bytes"] = live * compute_bytes
        mem["stage3_gathered_note"] = ("upper bound from stage3_max_live_parameters; pass "
                                       "--model for a per-unit estimate")
    from zerolite.offload.placement import configured_choice, offload_bytes

    zc = cfg.zero_optimization
    hpz = zc.zero_hpz_partition_size
    if hpz > 1:
        # Every re-gathered unit's secondary shard, held after the forward until its backward.
        regathered = num_params - root if model is not None else num_params
        mem["hpz_secondary_bytes"] = compute_bytes * regathered / hpz
        mem["hpz_secondary_note"] = (
            f"zero_hpz_partition_size {hpz}: 1/{hpz} of the {regathered:,} params of the "
            "re-gathered units in the compute dtype, from the end of forward until each "
            "unit's backward")
    mem["offload_optimizer"] = offload_bytes(
        mem["per_stage"], zc.stage, sb, cfg.world_size, num_params, zc.offload_optimizer,
        int(zc.sub_group_size), gas=cfg.gradient_accumulation_steps,
        param_block=zc.offload_param, largest_unit=largest if model is not None else None)
    mem["offload_optimizer_in_config"] = configured_choice(zc)
    if cfg.zerolite.reduce_once_per_step and cfg.gradient_accumulation_steps > 1 \
            and cfg.zero_optimization.stage >= 2:
        # Full gradients of every parameter stay on each rank between micro-steps, in the
        # gradient buffer's dtype (flat_param.py: the parameters', or fp32).
        mem["reduce_once_per_step_bytes"] = (accum or compute_bytes) * num_params
    sparse = cfg.zerolite.sparse_gradients
    if sparse is not None and sparse.error_feedback:
        # The error-feedback residual: a full (unsharded) fp32 gradient copy per rank.
        mem["sparse_gradients_residual_bytes"] = 4 * num_params
    mem["not_included"] = "activations, temporary communication/gradient buffers, allocator overhead"
    out["memory"] = mem
    return out


def print_summary(summary: dict) -> None:
    print("resolved config:")
    print(json.dumps(summary["config"], indent=2, sort_keys=True, default=str))
    b = summary["batch"]
    print(f"\nbatch: train_batch_size {b['train_batch_size']} = micro batch "
          f"{b['train_micro_batch_size_per_gpu']} x gradient_accumulation_steps "
          f"{b['gradient_accumulation_steps']} x world_size {b['world_size']}")
    mem = summary["memory"]
    if mem is None:
        print("\nmemory: pass --params P or --model module:factory for a memory estimate")
        return
    precision, stage = summary["precision"], summary["stage"]
    kind = {"mixed": "mixed precision", "fp32": "fp32 master = param shard",
            "bf16_masters": "bf16 master = param shard, fp32 moments",
            "bf16_masters_states": "bf16 master = param shard, bf16 moments"}[
        summary["state_mode"]]
    if summary.get("compensation"):
        kind += ", kahan compensation"
    print(f"\nmodel-state memory per rank: {summary['num_params']:,} params, {precision} "
          f"({kind}), Adam, world_size N={b['world_size']}  [config uses stage {stage}]")
    print(f"  {'stage':<7}{'formula':<14}{'params':>14}{'grads':>14}{'optimizer':>14}"
          f"{'total':>14}")
    for s, e in mem["per_stage"].items():
        mark = " <-" if s == stage else ""
        print(f"  {s:<7}{e['formula']:<14}{_fmt(e['params'])}{_fmt(e['grads'])}"
              f"{_fmt(e['optimizer'])}{_fmt(e['total'])}{mark}")
    print(f"  stage 3 extra, gathered units: {_fmt(mem['stage3_gathered_bytes']).strip()} "
          f"({mem['stage3_gathered_note']})")
    if "hpz_secondary_bytes" in mem:
        print(f"  stage 3 extra, hpZ secondary shards: "
              f"{_fmt(mem['hpz_secondary_bytes']).strip()} ({mem['hpz_secondary_note']})")
    print(f"\noffload choices at stage {stage}, per rank (device = where the model computes):")
    print(f"  {'choice':<12}{'device':>14}{'host':>14}{'disk':>14}")
    for choice, e in mem["offload_optimizer"].items():
        mark = " <-" if choice == mem["offload_optimizer_in_config"] else ""
        print(f"  {choice:<12}{_fmt(e['device'])}{_fmt(e['host'])}{_fmt(e['disk'])}{mark}")
    if stage == 3:
        print("  (X+params: offload_param X too; params: offload_param nvme alone. host = "
              "chunk buffers + shards read ahead, bounded by offload_param.buffer_count)")
    print("  (cpu: on a CPU-only run device and host are the same RAM and nothing moves)")
    if "reduce_once_per_step_bytes" in mem:
        print(f"  zerolite.reduce_once_per_step extra, full gradients kept across "
              f"micro-steps: {_fmt(mem['reduce_once_per_step_bytes']).strip()} per rank")
    if "sparse_gradients_residual_bytes" in mem:
        print(f"  zerolite.sparse_gradients error-feedback residual, a full fp32 gradient copy "
              f"(ZeRO's gradient sharding given back): "
              f"{_fmt(mem['sparse_gradients_residual_bytes']).strip()} per rank")
    print(f"  not included: {mem['not_included']}")
