"""The largest GPT that trains at world 2 with peak RSS <= a per-rank budget (default 4 GiB),
without offload and with NVMe offload of the optimizer state, in fp32 or bf16 (fp32 or bf16
masters), under zerolite or DeepSpeed: found by running it.

Each probe is two fresh rank processes (gloo on 127.0.0.1, one intra-op thread each) that
build zerolite's GPT under `zerolite.zero.Init` (no rank holds the whole model: the JSON
records Init's peak parameter bytes next to the full model's), train --steps steps of ZeRO-3
AdamW (fp32 unless --precisions says otherwise; micro-batch --batch x --seq tokens per rank,
clipping 1.0) and report ru_maxrss. A probe fits when both ranks finish and both peaks are
within the budget; a rank whose RSS passes the budget stops itself at once (exit 3), so failed
probes are cheap and never push the shared machine into swap. The depth is searched (growing
x2 or by --grow, then bisection) at a fixed width, sequence and batch.

    PYTHONPATH=. python benchmarks/offload_capacity.py --out benchmarks/results/offload_capacity.json

--precisions (comma list, default fp32) adds a precision axis: `fp32` (as above), `bf16`
(`"bf16": {"enabled": true}`: bf16 params, fp32 masters and fp32 Adam moments) and
`bf16_masters` (bf16.bf16_master_weights_and_grads + bf16_optimizer_states, and
zerolite.master_rounding from --master-rounding). The model is built in fp32 under zero.Init
in every case: the engine casts it (zerolite keeps the fp32 values until it builds the
masters; DeepSpeed's zero.Init casts each module to the config's dtype as it is built).
--engine deepspeed runs the same model and config under DeepSpeed (deepspeed.zero.Init,
deepspeed.initialize, "torch_adam": true, DS_ACCELERATOR=cpu, gloo) from the interpreter
given by --ds-python (a venv with deepspeed; the zerolite tree goes on its PYTHONPATH). A
probe that fails other than by passing the budget (DeepSpeed refusing a config, a crash)
ends that search; its error is recorded in the JSON. fp32 zerolite results are stored as
report[mode], as before; the others under "<precision>/<mode>" (zerolite) and
"deepspeed/<precision>/<mode>". --merge adds to an existing --out of the same shape;
--reuse FILE copies zerolite fp32 results of the same shape from FILE instead of rerunning.

Memory is what is measured; step times come from a shared machine (read them as rough).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

MIB = 2 ** 20
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OVER_BUDGET = 3


def _guard(budget: int) -> None:
    """Exit the process as soon as its RSS passes `budget` (checked every 20 ms)."""
    import psutil

    proc = psutil.Process()

    def watch():
        while True:
            if proc.memory_info().rss > budget:
                os._exit(OVER_BUDGET)
            time.sleep(0.02)

    threading.Thread(target=watch, daemon=True).start()


def _zero_cfg(args) -> dict:
    zero = {"stage": 3}
    if args.reuse_distance is not None:  # else DeepSpeed's default (1e9), as a user's config
        zero["stage3_max_reuse_distance"] = args.reuse_distance
    if args.mode in ("nvme", "nvme+param"):
        zero.update(offload_optimizer={"device": "nvme", "nvme_path": args.swap},
                    sub_group_size=args.sub_group_size)
    if args.mode == "nvme+param":
        zero["offload_param"] = {"device": "nvme", "nvme_path": args.swap}
    return zero


PRECISIONS = ("fp32", "bf16", "bf16_masters")
ENGINES = ("zerolite", "deepspeed")
SHAPE = ("d_model", "vocab", "seq", "batch", "steps", "budget_mib", "sub_group_size",
         "reuse_distance")
"""Flags that must agree for results to share a JSON (--merge, --reuse)."""


def _config(args, engine: str, precision: str) -> dict:
    """The JSON config both engines get (DeepSpeed keys; zerolite's own section for zerolite,
    torch_adam for DeepSpeed so no C++ op is built)."""
    ds = {"train_batch_size": 2 * args.batch, "train_micro_batch_size_per_gpu": args.batch,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}, "gradient_clipping": 1.0,
          "zero_optimization": _zero_cfg(args), "steps_per_print": 10 ** 9}
    if precision in ("bf16", "bf16_masters"):
        ds["bf16"] = {"enabled": True}
    if precision == "bf16_masters":
        ds["bf16"].update(bf16_master_weights_and_grads=True, bf16_optimizer_states=True)
        if engine == "zerolite":
            ds["zerolite"] = {"master_rounding": args.master_rounding}
    if engine == "deepspeed":
        ds["optimizer"]["params"]["torch_adam"] = True
    return ds


def _state_mib(stats: dict) -> float:
    """Model state in zerolite's memory_stats: param + grad + master shards + optimizer state."""
    return sum(stats.get(k, 0) for k in ("param_shards", "grad_shards", "master_shards",
                                          "optimizer_state")) / MIB


def _worker(args) -> dict:
    import torch
    import torch.distributed as dist

    import zerolite
    from zerolite.models import GPT, GPTConfig
    from zerolite.offload.chunked_optimizer import ChunkedOffloadOptimizer

    torch.set_num_threads(1)
    _guard(args.budget_mib * MIB)
    dist.init_process_group("gloo", rank=args.rank, world_size=2)
    cfg = GPTConfig(vocab_size=args.vocab, seq_len=args.seq, n_layer=args.layers,
                    n_head=args.d_model // 64, d_model=args.d_model)
    torch.manual_seed(0)
    with zerolite.zero.Init() as init:  # fp32 values; the engine casts (see the docstring)
        model = GPT(cfg)
    ds = _config(args, "zerolite", args.precision)
    engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(), config=ds)
    g = torch.Generator().manual_seed(args.rank)
    times, losses, before_step = [], [], {}
    for step in range(args.steps):
        x = torch.randint(0, cfg.vocab_size, (args.batch, cfg.seq_len), generator=g)
        start = time.perf_counter()
        loss = engine(x, x)
        engine.backward(loss)
        if step == args.steps - 1:  # grads reduced, moments from the steps before: all state
            before_step = {k: v for k, v in engine.memory_stats().items()
                           if isinstance(v, (int, float))}
        engine.step()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    out = {"rank": args.rank, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           "step_s": times, "losses": losses,
           "init_peak_param_mib": init.peak_param_bytes / MIB,
           "init_kept_param_mib": init.partitioned_bytes / MIB,
           "full_model_param_mib": 4 * cfg.num_params() / MIB,
           "memory_stats_mib": {k: v / MIB for k, v in engine.memory_stats().items()
                             if isinstance(v, (int, float))},
           "memory_stats_before_last_step_mib": {k: v / MIB for k, v in before_step.items()},
           "model_state_mib": _state_mib(before_step)}
    if isinstance(engine.basic_optimizer, ChunkedOffloadOptimizer):
        s = engine.basic_optimizer.offload_stats()
        out.update(disk_mib=s["disk_bytes"] / MIB,
                   read_written_mib_per_step=[s["bytes_read"] / MIB / max(1, args.steps - 1),
                                              s["bytes_written"] / MIB / args.steps])
    return out


def _ds_state_mib(engine) -> float | None:
    """DeepSpeed stage 3's model state on this rank, from its optimizer's tensors (partitioned
    compute-dtype flats, master flats, the gradient partition buffer, optimizer state),
    counted once per storage; None where the attributes are not there."""
    import torch

    opt = engine.optimizer
    tensors = []
    for name in ("fp16_partitioned_groups_flat", "fp32_partitioned_groups_flat"):
        tensors += [t for t in getattr(opt, name, None) or [] if isinstance(t, torch.Tensor)]
    buf = getattr(opt, "grad_partitions_flat_buffer", None)
    if isinstance(buf, torch.Tensor):
        tensors.append(buf)
    inner = getattr(opt, "optimizer", None)
    for state in getattr(inner, "state", {}).values():
        tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    if not tensors:
        return None
    seen = {}
    for t in tensors:
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values()) / MIB


def _ds_worker(args) -> dict:
    """The same probe under DeepSpeed ZeRO-3 (run by the --ds-python interpreter)."""
    os.environ.update(RANK=str(args.rank), LOCAL_RANK=str(args.rank), WORLD_SIZE="2",
                      LOCAL_WORLD_SIZE="2")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("DS_BUILD_OPS", "0")
    import deepspeed
    import torch

    from zerolite.models import GPT, GPTConfig

    torch.set_num_threads(1)
    _guard(args.budget_mib * MIB)
    deepspeed.init_distributed(dist_backend="gloo")
    cfg = GPTConfig(vocab_size=args.vocab, seq_len=args.seq, n_layer=args.layers,
                    n_head=args.d_model // 64, d_model=args.d_model)
    ds = _config(args, "deepspeed", args.precision)
    torch.manual_seed(0)
    with deepspeed.zero.Init(config_dict_or_path=ds):  # casts to the config's dtype
        model = GPT(cfg)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=ds)
    g = torch.Generator().manual_seed(args.rank)
    times, losses, state = [], [], None
    for step in range(args.steps):
        x = torch.randint(0, cfg.vocab_size, (args.batch, cfg.seq_len), generator=g)
        start = time.perf_counter()
        loss = engine(x, x)
        engine.backward(loss)
        if step == args.steps - 1:
            state = _ds_state_mib(engine)
        engine.step()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    return {"rank": args.rank, "peak_rss_mib":
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "step_s": times, "losses": losses, "full_model_param_mib": 4 * cfg.num_params() / MIB,
            "model_state_mib": state, "deepspeed": deepspeed.__version__,
            "torch": torch.__version__,
            "model_state_source": "DeepSpeed stage-3 optimizer tensors after the last backward "
                                  "(param flats, master flats, grad partition buffer, "
                                  "optimizer state; one count per storage)"}


def _error_line(text: str) -> str | None:
    """The last 'SomeError: message' line of a traceback (the exact error), if any."""
    lines = [ln.strip() for ln in text.splitlines()
             if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b", ln.strip())]
    return lines[-1] if lines else None


def _probe(args, mode: str, layers: int, engine: str = "zerolite",
           precision: str = "fp32") -> dict:
    from zerolite.models import GPTConfig

    params = GPTConfig(vocab_size=args.vocab, seq_len=args.seq, n_layer=layers,
                       n_head=args.d_model // 64, d_model=args.d_model).num_params()
    swap = tempfile.mkdtemp(prefix="zl-capacity-", dir=args.nvme_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    python = sys.executable
    if engine == "deepspeed":
        python = args.ds_python
        env.update(DS_ACCELERATOR="cpu", DS_BUILD_OPS="0", PYTHONPATH=os.pathsep.join(
            p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    procs, paths, logs = [], [], []
    start = time.perf_counter()
    for rank in range(2):
        paths.append(os.path.join(swap, f"result{rank}.json"))
        logs.append(os.path.join(swap, f"stderr{rank}.txt"))
        cmd = [python, os.path.abspath(__file__), "--worker", "--mode", mode,
               "--rank", str(rank), "--layers", str(layers), "--result", paths[-1],
               "--swap", swap, "--engine", engine, "--precision", precision,
               "--master-rounding", args.master_rounding] + _shared_flags(args)
        with open(logs[-1], "w") as err:  # a file, not a pipe: DeepSpeed logs a lot
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                          stderr=err, text=True))
    codes = _wait_all(procs, args.probe_timeout)
    row = {"mode": mode, "engine": engine, "precision": precision, "layers": layers,
           "params": params, "exit_codes": codes, "wall_s": time.perf_counter() - start}
    if all(c == 0 for c in codes):
        row["ranks"] = [json.load(open(p)) for p in paths]
        row["fits"] = all(r["peak_rss_mib"] <= args.budget_mib for r in row["ranks"])
    else:
        row["fits"] = False
        if OVER_BUDGET in codes:
            row["why"] = "over budget (a rank passed it and stopped)"
        else:
            texts = [open(p, errors="replace").read() for p in logs]
            errors = [e for e in map(_error_line, texts) if e]
            row["why"] = "failed: " + " | ".join(t[-400:] for t in texts)
            row["error"] = errors[0] if errors else (
                f"exit codes {codes}, no exception line in stderr")
            row["stderr_tail"] = [t[-3000:] for t in texts]
    shutil.rmtree(swap, ignore_errors=True)
    print(json.dumps({k: v for k, v in row.items() if k != "ranks"}
                     | {"peak_rss_mib": [r["peak_rss_mib"] for r in row.get("ranks", [])]}),
          flush=True)
    return row


def _wait_all(procs, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs):
        failed = [p for p in procs if p.poll() not in (None, 0)]
        if failed or time.monotonic() > deadline:  # one rank gone: the other would hang
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.1)
    return [p.returncode for p in procs]


def _search(args, mode: str, engine: str = "zerolite", precision: str = "fp32") -> dict:
    """Largest depth that fits: grow from --start by --grow (x2 by default) until a probe
    fails, then bisect. A probe that fails other than by the budget (a refused config, a
    crash) ends the search: every depth would fail the same way."""
    probes, fit, fail, error = [], None, None, None
    layers = args.start
    while fail is None or (fit or 0) + 1 < fail:
        if fail is None and fit is not None:
            layers = max(fit + 1, int(fit * args.grow))
        elif fail is not None:
            layers = ((fit or 0) + fail) // 2
        row = _probe(args, mode, layers, engine, precision)
        probes.append(row)
        if row["fits"]:
            fit = layers
        else:
            fail = layers
            if "error" in row:
                error = row["error"]
                break
            if layers <= 1:
                break
        if fail is None and fit is not None and fit >= args.max_layers:
            break
    best = next((p for p in probes if p["layers"] == fit), None)
    out = {"mode": mode, "engine": engine, "precision": precision,
           "config_json": _config(args, engine, precision),
           "largest_fitting_layers": fit, "smallest_failing_layers": fail,
           "largest": best, "probes": probes}
    if best:
        out["peak_rss_mib"] = max(r["peak_rss_mib"] for r in best["ranks"])
        states = [r.get("model_state_mib") for r in best["ranks"]]
        if all(isinstance(v, (int, float)) for v in states):
            out["model_state_bytes_per_param"] = sum(states) * MIB / best["params"]
    if error is not None:
        out["error"] = error
    return out


def _key(engine: str, precision: str, mode: str) -> str:
    """Where a search is stored: report[mode] for zerolite fp32 (as before this axis)."""
    if engine == "zerolite":
        return mode if precision == "fp32" else f"{precision}/{mode}"
    return f"{engine}/{precision}/{mode}"


def _shared_flags(a) -> list[str]:
    return ["--d-model", str(a.d_model), "--vocab", str(a.vocab), "--seq", str(a.seq),
            "--batch", str(a.batch), "--steps", str(a.steps), "--budget-mib",
            str(a.budget_mib), "--sub-group-size", str(a.sub_group_size)] + \
        ([] if a.reuse_distance is None else ["--reuse-distance", str(a.reuse_distance)])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--budget-mib", type=int, default=4096)
    p.add_argument("--sub-group-size", type=int, default=10_000_000)
    p.add_argument("--modes", default="none,nvme")
    p.add_argument("--precisions", default="fp32",
                   help="comma list of fp32, bf16 (fp32 masters), bf16_masters (bf16 masters "
                        "+ bf16 optimizer states)")
    p.add_argument("--master-rounding", default="nearest",
                   help="zerolite.master_rounding for bf16_masters (zerolite only)")
    p.add_argument("--engine", choices=ENGINES, default="zerolite")
    p.add_argument("--ds-python", default=None,
                   help="interpreter of a venv with deepspeed (--engine deepspeed)")
    p.add_argument("--grow", type=float, default=2.0,
                   help="depth factor while every probe fits (then bisection)")
    p.add_argument("--merge", action="store_true",
                   help="add to an existing --out of the same shape instead of replacing it")
    p.add_argument("--reuse", default=None,
                   help="JSON of an earlier run of the same shape: zerolite fp32 results found "
                        "there are copied (marked reused_from), not rerun")
    p.add_argument("--reuse-distance", type=int, default=None,
                   help="zero_optimization.stage3_max_reuse_distance (default: DeepSpeed's)")
    p.add_argument("--start", type=int, default=8, help="first depth probed")
    p.add_argument("--max-layers", type=int, default=256)
    p.add_argument("--probe-timeout", type=float, default=1200)
    p.add_argument("--nvme-path", default=tempfile.gettempdir())
    p.add_argument("--out", default=None)
    p.add_argument("--worker", action="store_true")
    p.add_argument("--mode")
    p.add_argument("--rank", type=int)
    p.add_argument("--layers", type=int)
    p.add_argument("--result")
    p.add_argument("--swap")
    p.add_argument("--precision", default="fp32")
    args = p.parse_args()
    if args.worker:
        res = (_ds_worker if args.engine == "deepspeed" else _worker)(args)
        with open(args.result, "w") as f:
            json.dump(res, f)
        os._exit(0)  # skip process-group teardown
    precisions = args.precisions.split(",")
    modes = args.modes.split(",")
    bad = [x for x in precisions if x not in PRECISIONS]
    if bad:
        p.error(f"--precisions: unknown {bad}; choose from {PRECISIONS}")
    if args.engine == "deepspeed" and not args.ds_python:
        p.error("--engine deepspeed needs --ds-python (a venv's python with deepspeed)")
    run = {"engine": args.engine, "precisions": args.precisions, "modes": args.modes,
           "command": "PYTHONPATH=. python benchmarks/offload_capacity.py " + " ".join(
               shlex.quote(a) for a in sys.argv[1:])}
    report = {"config": {k: v for k, v in vars(args).items() if k not in (
        "worker", "mode", "rank", "layers", "result", "swap", "precision", "merge", "reuse",
        "ds_python")} | {
        "world_size": 2, "stage": 3, "dtype": "fp32" if precisions == ["fp32"] else
        args.precisions, "optimizer": "AdamW"},
        "note": "memory measured per rank (ru_maxrss); step times from a shared 2-core "
                "machine with other jobs running: rough"}
    if args.merge and args.out and os.path.exists(args.out):
        report = _merge_base(json.load(open(args.out)), args)
    report.setdefault("runs", []).append(run)
    reused = _load_same_shape(args.reuse, args) if args.reuse else {}
    keys = []
    for precision in precisions:
        for mode in modes:
            key = _key(args.engine, precision, mode)
            keys.append(key)
            if args.engine == "zerolite" and precision == "fp32" and mode in reused:
                report[key] = reused[mode] | {
                    "engine": "zerolite", "precision": "fp32", "reused_from": args.reuse,
                    "reused_note": f"not rerun: copied from {args.reuse}, same shape flags"}
                _summarize(report[key])
                continue
            new = _search(args, mode, args.engine, precision) | {"command": run["command"]}
            if key in report:  # --merge over an earlier search: keep it, it shows the noise
                old = report[key]
                new["earlier_searches"] = [{k: v for k, v in old.items()
                                            if k != "earlier_searches"}] + \
                    old.get("earlier_searches", [])
            report[key] = new
    text = json.dumps(report, indent=1)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)
    for key in keys:
        r = report[key]
        print(key, "largest fitting layers:", r["largest_fitting_layers"],
              "params:", r["largest"]["params"] if r["largest"] else None,
              "error:" if r.get("error") else "", r.get("error", ""))


def _summarize(res: dict) -> None:
    """Peak RSS and bytes per parameter of an older result's largest fit (in place)."""
    best = res.get("largest")
    if not best:
        return
    res["peak_rss_mib"] = max(r["peak_rss_mib"] for r in best["ranks"])
    states = [r.get("model_state_mib") for r in best["ranks"]]
    if not all(isinstance(v, (int, float)) for v in states):  # older runs: after the step
        states = [_state_mib({k: v * MIB for k, v in r.get("memory_stats_mib", {}).items()})
                  for r in best["ranks"]]
        res["model_state_note"] = ("memory_stats after the last step (older run): gradient "
                                   "shards already freed, so not counted")
    if all(states):
        res["model_state_bytes_per_param"] = sum(states) * MIB / best["params"]


def _same_shape(cfg: dict, args) -> None:
    diff = {k: (cfg.get(k), getattr(args, k)) for k in SHAPE if cfg.get(k) != getattr(args, k)}
    if diff:
        sys.exit(f"results of another shape (theirs, ours): {diff}")


def _merge_base(old: dict, args) -> dict:
    """An earlier report of the same shape, its dtype the union of both runs' precisions
    (each result names its own engine, precision and command: see "runs")."""
    _same_shape(old["config"], args)
    have = old["config"].get("dtype", "fp32").split(",")
    old["config"]["dtype"] = ",".join(have + [x for x in args.precisions.split(",")
                                              if x not in have])
    return old


def _load_same_shape(path: str, args) -> dict:
    data = json.load(open(path))
    _same_shape(data["config"], args)
    return {k: v for k, v in data.items() if isinstance(v, dict) and "probes" in v}


if __name__ == "__main__":
    main()
