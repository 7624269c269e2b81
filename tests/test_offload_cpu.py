"""offload_optimizer / offload_param "cpu": host-resident masters against no offload.

On CPU the host is the device, so the runs here pass `separate_host=True` to initialize in
each rank: the masters, optimizer state and gradient shards then get separate host copies
and every transfer (grad shard to the host, host step, cast + copy back, param shard in
before its gather) runs for real. Every run uses gradient accumulation (2 micro-steps) and
active clipping (gpt_cases.CLIP).
"""
import pytest
import torch

import zerolite
from zerolite.offload.plan import OffloadPlan
from zerolite.testing.multiprocess import RankFailed, run_ranks
from zerolite.testing.reference import train_engine
from zerolite.zero.flat_placement import MasterHome, ShardHome
from zerolite.zero.sharded_model import gather_full_state_dict

from offload_cases import assert_same_run
from gpt_cases import batches, ds_config, reference_run, tiny_gpt

STEPS, HALF = 4, 2
CPU = {"device": "cpu"}
# The forced-host runs compare bitwise; on a GPU the engine runs on CUDA and the host step
# rounds differently from the device step, so there the `cuda` tests at the end take over.
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU runs (forced host "
                              "copies); the cuda-marked tests cover the GPU")


def _cfg(world, offload=None, stage=3, bf16=False, param=None, **extra):
    cfg = ds_config(world, stage=stage, bf16=bf16, **extra)
    if offload is not None:
        cfg["zero_optimization"]["offload_optimizer"] = offload
    if param is not None:
        cfg["zero_optimization"]["offload_param"] = param
    return cfg


def _engine(cfg, force=True):
    model = tiny_gpt()
    engine, *_ = zerolite.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                                     separate_host=force)
    return engine


def _host_flats(engine):
    return [f for f in engine.sharded.flats if f.placement.master_home is MasterHome.HOST]


def _placed(engine):
    """(flats with a host master, flats in all, bytes moved to host / to device)."""
    plan = engine.placement_plan
    if not isinstance(plan, OffloadPlan) or plan.transfers is None:
        return None
    for f in _host_flats(engine):  # separate host tensors, really
        assert f.master.data_ptr() != f.shard.data_ptr() \
            or f.placement.shard.home is ShardHome.HOST
    return (len(_host_flats(engine)),
            sum(f.master is not None for f in engine.sharded.flats),
            plan.transfers.bytes_to_host, plan.transfers.bytes_to_device)


def _train(rank, world, cfg, force=True, steps=STEPS):
    engine = _engine(cfg, force)
    losses = train_engine(engine, batches(steps), rank, world)
    return (losses, gather_full_state_dict(engine.sharded), _placed(engine),
            engine.memory_stats(), engine.skipped_steps)




# -- parity -----------------------------------------------------------------------------------
@cpu_only
@pytest.mark.parametrize("world", [1, 2, pytest.param(4, marks=pytest.mark.slow)])
def test_cpu_offload_bitwise_equal_to_no_offload_and_tracks_reference(world):
    plain = run_ranks(_train, world, _cfg(world), False)[0]
    off = run_ranks(_train, world, _cfg(world, CPU))[0]
    assert_same_run(off, plain)
    ref_losses, ref_params = reference_run(STEPS)
    torch.testing.assert_close(torch.tensor(off[0]), torch.tensor(ref_losses), rtol=1e-5, atol=0)
    for name, value in ref_params.items():
        torch.testing.assert_close(off[1][name], value, rtol=1e-5, atol=1e-5)
    on_host, flats, to_host, to_device = off[2]
    assert on_host == flats > 1
    shard_bytes = off[3]["host"]["masters"]  # fp32: one master shard per optimized flat
    # Each micro-step's reduced grad shards went to the host; each step's masters came back.
    assert to_host == STEPS * 2 * shard_bytes and to_device == STEPS * shard_bytes
    # Adam's two moments and its fp32 step counter, per flat
    assert off[3]["host"]["optimizer_state"] == 2 * shard_bytes + 4 * flats
    assert plain[3]["host"] == {}


@cpu_only
@pytest.mark.parametrize("case", ["bf16", "fp16-skip", "ratio0.5", "stage2", "stage1",
                                  "stage0", "offload_param", "offload_param-bf16",
                                  "offload_param-world1"])
def test_cpu_offload_variants_bitwise_equal_to_no_offload(case):
    world = 1 if case.endswith("world1") else 2  # world 1: the full buffer is not the shard
    stage, bf16, offload, param, extra = 3, False, CPU, None, {}
    if case == "bf16":
        bf16 = True
    elif case == "fp16-skip":  # 2**20: the first 2 of 4 steps overflow and are skipped
        extra = {"fp16": {"enabled": True, "initial_scale_power": 20, "hysteresis": 1}}
    elif case == "ratio0.5":
        offload = {"device": "cpu", "ratio": 0.5}
    elif case.startswith("stage"):
        stage = int(case[-1])
    else:
        param, bf16 = CPU, case.endswith("bf16")
    plain = run_ranks(_train, world, _cfg(world, stage=stage, bf16=bf16, **extra), False)[0]
    off = run_ranks(_train, world, _cfg(world, offload, stage=stage, bf16=bf16, param=param,
                                        **extra))[0]
    assert_same_run(off, plain)
    assert (off[4] > 0) == (case == "fp16-skip") and off[4] == plain[4]
    on_host, flats, to_host, to_device = off[2]
    assert (0 < on_host < flats) if case == "ratio0.5" else (on_host == flats)
    assert to_host > 0 and to_device > 0
    if param is not None:
        assert off[3]["host"]["param_shards"] == (0 if not bf16 else off[3]["param_shards"])


@cpu_only
def test_cpu_offload_on_a_cpu_model_copies_nothing_by_default():
    plain = run_ranks(_train, 1, _cfg(1), False)[0]
    off = run_ranks(_train, 1, _cfg(1, CPU, param=CPU), False)[0]
    assert_same_run(off, plain)
    assert off[2] is None and off[3]["host"] == {}


# -- checkpoints across modes ------------------------------------------------------------------
def _save_half(rank, world, cfg, save_dir, force):
    engine = _engine(cfg, force)
    losses = train_engine(engine, batches(STEPS)[:HALF], rank, world)
    engine.save_checkpoint(save_dir, tag="half")
    return losses


def _resume(rank, world, cfg, save_dir, force):
    engine = _engine(cfg, force)
    engine.load_checkpoint(save_dir, tag="half")
    losses = train_engine(engine, batches(STEPS)[HALF:], rank, world)
    return losses, gather_full_state_dict(engine.sharded), _placed(engine)


@cpu_only
@pytest.mark.parametrize("save_mode,load_mode", [("cpu", "none"), ("none", "cpu")])
def test_resume_across_cpu_offload_modes_is_exact(tmp_path, save_mode, load_mode):
    world, bf16 = 2, True
    mode = {"cpu": _cfg(world, CPU, bf16=bf16), "none": _cfg(world, bf16=bf16)}
    straight = run_ranks(_train, world, _cfg(world, bf16=bf16), False)[0]
    ckpt = str(tmp_path / "ckpt")
    first = run_ranks(_save_half, world, mode[save_mode], ckpt, save_mode == "cpu")[0]
    losses, params, placed = run_ranks(_resume, world, mode[load_mode], ckpt,
                                       load_mode == "cpu")[0]
    assert_same_run((first + losses, params), straight)
    assert (placed is not None) == (load_mode == "cpu")


# -- bad input ---------------------------------------------------------------------------------
def _build(rank, world, cfg):
    _engine(cfg)


@pytest.mark.parametrize("cfg,match", [
    (_cfg(1, CPU, stage=2, param=CPU), r"offload_param.device: 'cpu' needs zero_optimization"
                                       r".stage 3.*got stage 2"),
    (_cfg(1, None, param=CPU), r"offload_param.device: 'cpu' needs zero_optimization"
                               r".offload_optimizer.device 'cpu' with ratio 1"),
    (_cfg(1, {"device": "cpu", "ratio": 0.5}, param=CPU), r"ratio 1.*'ratio': 0.5"),
    (_cfg(1, CPU, bf16=True, param={"device": "nvme", "nvme_path": "/tmp/zl-never-written"}),
     r"offload_param.device 'nvme' together with offload_optimizer.device 'cpu'"),
])
def test_bad_cpu_offload_combinations_name_the_keys(cfg, match):
    with pytest.raises(RankFailed, match=match):
        run_ranks(_build, 1, cfg)


# -- ordering on the recording backend (what a GPU would be told to do) ------------------------
def _recording():
    from zerolite.device import DeviceLayer
    from zerolite.testing.fake_device import RecordingBackend

    backend = RecordingBackend()
    return backend, DeviceLayer("cpu", eager=True, backend=backend)


def _host_op(backend, name):
    with backend.use_stream("host"):
        return backend.op(name)


def test_grad_copy_follows_its_reduction_and_the_step_waits_for_it():
    from zerolite.offload.host_transfers import HostTransfers
    from zerolite.testing.fake_device import FakeWork

    backend, layer = _recording()
    transfers = HostTransfers(backend)
    ticket = layer.reduce.submit(lambda: ([FakeWork(backend, "reduce u1")], torch.ones(4)),
                                 name="u1")
    host = torch.zeros(4)
    transfers.to_host(host, ticket.wait(), "u1")
    overlapped = backend.op("backward u0")  # compute goes on while the copy runs
    transfers.settle()
    step = _host_op(backend, "host step")
    copy = backend.index_of("d2h u1")
    assert backend.log[copy][1] == "host_copy"
    assert backend.happens_before(backend.index_of("reduce u1"), copy)
    assert backend.happens_before(copy, step)
    assert not backend.happens_before(copy, overlapped)
    assert torch.equal(host, torch.ones(4))


def test_copy_back_after_old_readers_and_before_next_gather_and_next_step():
    from zerolite.offload.host_transfers import HostTransfers
    from zerolite.testing.fake_device import FakeWork

    backend, layer = _recording()
    transfers = HostTransfers(backend)
    gather = lambda: layer.gather.submit(  # noqa: E731 - a gather reading the device shard
        lambda: ([FakeWork(backend, "all_gather u1")], None), name="u1")
    gather().wait()
    _host_op(backend, "host step 1")
    shard, master = torch.zeros(4), torch.full((4,), 2.0)
    transfers.to_device(shard, master, "u1")
    gather()
    transfers.settle()
    step2 = _host_op(backend, "host step 2")
    h2d = backend.index_of("h2d u1")
    assert backend.happens_before(backend.index_of("all_gather u1", 0), h2d)
    assert backend.happens_before(h2d, backend.index_of("all_gather u1", 1))
    assert backend.happens_before(h2d, step2)  # the host rewrites the master only after
    assert torch.equal(shard, master)


def _train_recorded(rank, world, cfg):
    import zerolite.engine as engine_mod

    backend, layer = _recording()
    engine_mod.make_device_layer = lambda device: layer
    engine = _engine(cfg)
    real_step = engine.basic_optimizer.step  # the host step over the masters

    def step(*args, **kwargs):
        _host_op(backend, "host step")
        return real_step(*args, **kwargs)

    engine.basic_optimizer.step = step
    losses = train_engine(engine, batches(STEPS), rank, world)
    log = backend.log
    recorded_on = {e[2]: (i, e[1]) for i, e in enumerate(log) if e[0] == "record"}
    steps = [i for i, e in enumerate(log) if e == ("op", "host", "host step")]
    copies = {"d2h": [], "h2d": []}
    for i, e in enumerate(log):
        if e[0] == "op" and e[2].split(" ")[0] in copies:
            copies[e[2].split(" ")[0]].append(i)
    bad = []
    for c in copies["d2h"]:
        waited = [recorded_on[e[2]][0] for e in log[:c]
                  if e[0] == "wait" and e[1] == "compute" and recorded_on[e[2]][1] == "reduce"]
        later_step = next(s for s in steps if s > c)
        if not (backend.happens_before(waited[-1], c) and backend.happens_before(c, later_step)):
            bad.append(("d2h", c))
    for c in copies["h2d"]:
        gathers = [i for i, e in enumerate(log) if i > c and e[:2] == ("record", "all_gather")]
        later = [s for s in steps if s > c]  # none after the last step
        if (gathers and not backend.happens_before(c, gathers[0])) or (
                later and not backend.happens_before(c, later[0])):
            bad.append(("h2d", c))
    return losses, len(copies["d2h"]), len(copies["h2d"]), len(steps), bad


@cpu_only
def test_engine_copies_are_ordered_on_the_recording_backend():
    world = 2
    plain = run_ranks(_train, world, _cfg(world), False)[0]
    losses, d2h, h2d, steps, bad = run_ranks(_train_recorded, world, _cfg(world, CPU))[0]
    assert losses == plain[0]
    flats = 3  # the tiny GPT: root + 2 blocks, one trainable flat each
    assert steps == STEPS and d2h == STEPS * 2 * flats and h2d == STEPS * flats
    assert bad == []


# -- check-config's cpu row against what a run holds -------------------------------------------
@cpu_only
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("param", [None, CPU], ids=["opt", "opt+param"])
def test_check_config_cpu_offload_estimate_matches_a_run(bf16, param):
    from zerolite.cli.check_config import count_params, summarize
    from zerolite.config import load_config

    world = 2
    cfg = _cfg(world, CPU, bf16=bf16, param=param)
    ms = run_ranks(_train, world, cfg, True, 1)[0][3]
    summary = summarize(load_config(cfg, world_size=world), count_params(tiny_gpt()))
    est = summary["memory"]["offload_optimizer"]
    row = "cpu+params" if param else "cpu"
    assert summary["memory"]["offload_optimizer_in_config"] == row
    host = ms["host"]
    device = (ms["param_shards"] + ms["master_shards"] + ms["optimizer_state"]
              - host["masters"] - host["optimizer_state"] - host["param_shards"])
    # The run pads each flat to a multiple of the world size: a few elements more.
    assert 0 <= host["total"] - est[row]["host"] < 0.01 * est[row]["host"]
    assert 0 <= device - est[row]["device"] <= 0.01 * est[row]["device"]
    if param:
        return
    # What leaves the device: 16 of 18 bytes per shard element with bf16, 12 of 16 with fp32.
    assert est["cpu"]["device"] == est["none"]["device"] * (2 / 18 if bf16 else 4 / 16)


# -- on a GPU (skipped without CUDA; benchmarks/gpu_check.py runs them) --------------------------
def _cpu_state(state):
    return {k: v.detach().cpu() for k, v in state.items()}


def _train_cuda(rank, world, cfg):
    engine = _engine(cfg, force=False)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    losses = train_engine(engine, batches(STEPS), rank, world)
    torch.cuda.synchronize()
    where = {"master": sorted({str(f.master.device) for f in engine.sharded.flats
                               if f.master is not None}),
             "shard": sorted({str(f.shard.device) for f in engine.sharded.flats}),
             "pinned": bool(_host_flats(engine)) and all(f.master.is_pinned()
                                                         for f in _host_flats(engine))}
    return (losses, _cpu_state(gather_full_state_dict(engine.sharded)), where,
            torch.cuda.max_memory_allocated())


@pytest.mark.cuda
@pytest.mark.parametrize("world,mode", [(1, "cpu-pinned"), (1, "cpu+param"), (1, "ratio0.5"),
                                        (2, "cpu-pinned")])
def test_cpu_offload_on_cuda_matches_no_offload(world, mode):
    pinned = {"device": "cpu", "pin_memory": True}
    offload, param = {"cpu-pinned": (pinned, None), "cpu+param": (pinned, pinned),
                      "ratio0.5": ({"device": "cpu", "ratio": 0.5}, None)}[mode]
    plain = run_ranks(_train_cuda, world, _cfg(world, bf16=True), timeout_s=600)[0]
    off = run_ranks(_train_cuda, world, _cfg(world, offload, bf16=True, param=param),
                    timeout_s=600)[0]
    # Not bitwise: the host's AdamW and norm round differently from the device's.
    torch.testing.assert_close(torch.tensor(off[0]), torch.tensor(plain[0]), rtol=1e-5, atol=0)
    for name, value in plain[1].items():
        torch.testing.assert_close(off[1][name], value, rtol=1e-5, atol=1e-6, msg=name)
    where = off[2]
    assert where["master"] == (["cpu", "cuda:0"] if mode == "ratio0.5" else ["cpu"])
    assert where["shard"] == (["cpu"] if param else ["cuda:0"])
    assert where["pinned"] == (mode != "ratio0.5")
    assert off[3] < plain[3]  # peak device bytes: masters, moments and grad shards left
