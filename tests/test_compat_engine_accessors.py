"""DeepSpeedEngine's accessors (zerolite/engine_accessors.py) against the configs that set
them: each answers what DeepSpeed 0.19.8's engine answers for that config (values away from
the defaults throughout, so a hard-coded default fails), at world 1 and, where ranks matter,
at world 2; each refused name raises DeepSpeedFeatureNotSupported naming it; and the
inventory's view of the engine (tools/deepspeed_inventory.py) holds for a real engine."""
import importlib.util
import os

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset, TensorDataset

import zerolite
from zerolite.errors import DeepSpeedFeatureNotSupported
from zerolite.engine_accessors import REFUSED
from zerolite.testing.multiprocess import run_ranks

from gpt_cases import batches, ds_config, tiny_gpt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location(
    "deepspeed_inventory", os.path.join(ROOT, "tools", "deepspeed_inventory.py"))
inv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(inv)

ZERO = {"stage": 3, "contiguous_gradients": False, "reduce_scatter": False,
        "reduce_bucket_size": 12345, "use_multi_rank_bucket_allreduce": False,
        "allgather_partitions": False, "allgather_bucket_size": 23456, "overlap_comm": False,
        "load_from_fp32_weights": False, "elastic_checkpoint": True, "sub_group_size": 34567,
        "stage3_prefetch_bucket_size": 45678, "stage3_param_persistence_threshold": 56,
        "stage3_model_persistence_threshold": 67890, "stage3_max_live_parameters": 78901,
        "stage3_max_reuse_distance": 89012, "stage3_gather_16bit_weights_on_model_save": True,
        "ignore_unused_parameters": False, "legacy_stage1": True, "round_robin_gradients": True,
        "zero_quantized_weights": True, "zero_quantized_nontrainable_weights": False,
        "zero_quantized_gradients": True, "log_trace_cache_warnings": True,
        "module_granularity_threshold": 99,
        "offload_optimizer": {"device": "cpu", "cpuadam_cores_perc": 0.3}}
FP16 = {"enabled": True, "auto_cast": True, "loss_scale": 0, "initial_scale_power": 5,
        "loss_scale_window": 77, "hysteresis": 3, "consecutive_hysteresis": True,
        "min_loss_scale": 2, "fp16_master_weights_and_grads": False}
FULL = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3,
        "optimizer": {"type": "Adam", "legacy_fusion": True,
                      "params": {"lr": 2e-3, "betas": [0.8, 0.95], "eps": "auto"}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 7}},
        "fp16": FP16, "zero_optimization": ZERO, "gradient_clipping": 0.7,
        "prescale_gradients": True, "gradient_predivide_factor": 2.0,
        "communication_data_type": "fp16", "steps_per_print": 33, "wall_clock_breakdown": True,
        "dataloader_drop_last": True, "memory_breakdown": True, "dump_state": True,
        "zero_allow_untested_optimizer": True, "zero_force_ds_cpu_optimizer": False,
        "checkpoint": {"tag_validation": "Fail"}}
"""Every key an accessor reads, away from DeepSpeed's default (but the two zerolite refuses
switched on: fp16_master_weights_and_grads, zero_quantized_nontrainable_weights)."""

FULL_EXPECTED = {
    "optimizer_name": "adam", "optimizer_legacy_fusion": True,
    "optimizer_params": {"lr": 2e-3, "betas": [0.8, 0.95], "eps": 1e-8},
    "scheduler_name": "WarmupLR", "scheduler_params": {"warmup_num_steps": 7},
    "zero_reduce_scatter": False, "zero_overlap_comm": False, "zero_sub_group_size": 34567,
    "zero_reduce_bucket_size": 12345, "zero_multi_rank_bucket_allreduce": False,
    "zero_allgather_bucket_size": 23456, "zero_allgather_partitions": False,
    "zero_contiguous_gradients": False, "zero_load_from_fp32_weights": False,
    "zero_elastic_checkpoint": True, "zero_max_live_parameters": 78901,
    "zero_max_reuse_distance": 89012, "zero_prefetch_bucket_size": 45678,
    "zero_param_persistence_threshold": 56, "zero_model_persistence_threshold": 67890,
    "zero_module_granularity_threshold": 99, "zero_legacy_stage1": True,
    "zero_ignore_unused_parameters": False, "zero_round_robin_gradients": True,
    "zero_hpz_partition_size": 1, "zero_quantized_weights": True,
    "zero_quantized_nontrainable_weights": False, "zero_quantized_gradients": True,
    "zero_log_trace_cache_warnings": True, "zero_compute_grad_norm": True,
    "zero_nvme_offload_optimizer": False, "super_offload": False, "cpuadam_cores_perc": 0.3,
    "is_first_weights_partition_group": True, "zero_allow_untested_optimizer": True,
    "zero_force_ds_cpu_optimizer": False,
    "fp16_auto_cast": True, "fp16_master_weights_and_gradients": False,
    "bf16_master_weights_and_gradients": False, "bf16_optimizer_states": False,
    "loss_scale": 0.0, "dynamic_loss_scale": True, "initial_dynamic_scale": 32,
    "dynamic_loss_scale_args": {"init_scale": 32, "scale_window": 77, "delayed_shift": 3,
                                "consecutive_hysteresis": True, "min_scale": 2},
    "gradient_predivide_factor": 2.0, "postscale_gradients": False,
    "dataloader_drop_last": True, "memory_breakdown": True, "dump_state": True,
    "checkpoint_tag_validation_enabled": True, "checkpoint_tag_validation_fail": True,
    "checkpoint_writer_enabled": False, "managed_gradient_accumulation": True,
    "get_data_parallel_rank": 0, "get_model_parallel_rank": 0, "get_tensor_parallel_rank": 0,
    "get_type": [0.0],
}
"""FULL's answers: what DeepSpeed 0.19.8's getters return for these keys (the optimizer names
it ships lower-cased, "auto" as resolved), whether or not zerolite acts on the key."""

FEATURES_OFF = ("flops_profiler_enabled", "autotuning_enabled", "autotuning_profile_model_info",
                "data_efficiency_enabled", "data_sampling_enabled", "curriculum_learning_enabled",
                "random_ltd_enabled", "is_deepcompile_enabled", "is_deepcompile_active",
                "is_sanity_checks_enabled")
FEATURE_BLOCKS = {"flops_profiler": {"enabled": True}, "autotuning": {"enabled": True},
                  "data_efficiency": {"enabled": False}}
"""Config blocks of features zerolite does not build: they load, and the engine says off
(those that would change training, switched on, are refused: test_config_honesty.py)."""


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def _answers(engine, names) -> dict:
    return {name: getattr(engine, name)() for name in names}


def _full_config(rank, world):
    engine, *_ = zerolite.initialize(model=_model(), config={**FULL, **FEATURE_BLOCKS})
    return {"answers": _answers(engine, [*FULL_EXPECTED, *FEATURES_OFF]),
            "communication_data_type": engine.communication_data_type,
            "is_compiled": engine.is_compiled,
            "client": [engine.client_optimizer, engine.client_lr_scheduler,
                       engine.training_data, engine.collate_fn]}


def test_full_config_answers_as_deepspeed():
    r = run_ranks(_full_config, 1)[0]
    assert r["answers"] == {**FULL_EXPECTED, **{name: False for name in FEATURES_OFF}}
    assert r["communication_data_type"] is torch.float16 and r["is_compiled"] is False
    assert r["client"] == [None, None, None, None]


class _Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        return torch.tensor([float(i)])


def _collate(items):
    return torch.cat(items)


def _client_objects(rank, world):
    """Client optimizer and scheduler, training data and collate_fn; bf16 masters; the
    config's defaults elsewhere."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5)
    data = _Squares()
    cfg = {"train_batch_size": 4 * world, "gradient_accumulation_steps": 2,
           "bf16": {"enabled": True, "bf16_master_weights_and_grads": True,
                    "bf16_optimizer_states": True},
           "zero_optimization": {"stage": 2}, "checkpoint": {"tag_validation": "ignore"},
           "zero_allow_untested_optimizer": True}
    engine, *_ = zerolite.initialize(model=model, optimizer=opt, lr_scheduler=sched,
                                     training_data=data, collate_fn=_collate, config=cfg)
    return {"client": [engine.client_optimizer is opt, engine.client_lr_scheduler is sched,
                       engine.training_data is data, engine.collate_fn is _collate],
            "answers": _answers(engine, [
                "optimizer_name", "optimizer_params", "optimizer_legacy_fusion",
                "scheduler_name", "scheduler_params", "bf16_master_weights_and_gradients",
                "bf16_optimizer_states", "fp16_auto_cast", "loss_scale", "dynamic_loss_scale",
                "checkpoint_tag_validation_enabled", "checkpoint_tag_validation_fail",
                "cpuadam_cores_perc", "super_offload", "is_first_weights_partition_group",
                "zero_force_ds_cpu_optimizer", "postscale_gradients", "get_mom"]),
            "communication_data_type": engine.communication_data_type,
            "loader_batches": [b.tolist() for b in engine.training_dataloader]}


def test_client_objects_and_defaults():
    r = run_ranks(_client_objects, 1)[0]
    assert r["client"] == [True] * 4
    assert r["answers"] == {
        "optimizer_name": "SGD", "optimizer_params": None, "optimizer_legacy_fusion": False,
        "scheduler_name": None, "scheduler_params": None,
        "bf16_master_weights_and_gradients": True, "bf16_optimizer_states": True,
        "fp16_auto_cast": False, "loss_scale": 0.0, "dynamic_loss_scale": True,
        "checkpoint_tag_validation_enabled": False, "checkpoint_tag_validation_fail": False,
        "cpuadam_cores_perc": 0.9, "super_offload": False,
        "is_first_weights_partition_group": False, "zero_force_ds_cpu_optimizer": True,
        "postscale_gradients": True, "get_mom": [0.5]}
    assert r["communication_data_type"] is torch.bfloat16  # the training dtype, as DeepSpeed's
    assert sorted(x for b in r["loader_batches"] for x in b) == [float(i) for i in range(10)]


def _static_scale_and_optimizer_names(rank, world):
    out = []
    for type_name in ("AdamW", "SGD", "adagrad", "Lion"):
        cfg = ds_config(world, stage=0, fp16={"enabled": True, "loss_scale": 128},
                        optimizer={"type": type_name, "params": {"lr": 0.01}})
        engine, *_ = zerolite.initialize(model=_model(), config=cfg)
        out.append((engine.optimizer_name(), engine.loss_scale(), engine.dynamic_loss_scale(),
                    engine.postscale_gradients(), engine.zero_optimization_stage()))
    return out


def test_optimizer_names_as_deepspeed_reports_them_and_a_static_loss_scale():
    names = run_ranks(_static_scale_and_optimizer_names, 1)[0]
    assert [n[0] for n in names] == ["adamw", "SGD", "adagrad", "lion"]
    assert {n[1:] for n in names} == {(128.0, False, True, 0)}


# -- ranks and groups (world 2) ---------------------------------------------------------
def _ranks_and_groups(rank, world):
    engine, *_ = zerolite.initialize(
        model=tiny_gpt(), config=ds_config(world, stage=3, zero_optimization={
            "stage": 3, "zero_hpz_partition_size": 2}))
    group = engine.data_parallel_group
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t, group=group)
    return {"dp_rank": engine.get_data_parallel_rank(),
            "mp_rank": engine.get_model_parallel_rank(),
            "tp_rank": engine.get_tensor_parallel_rank(), "group_size": dist.get_world_size(group),
            "sum": t.item(), "seq_group_is_dp": engine.seq_data_parallel_group is group,
            "seq_dp_world_size": engine.seq_dp_world_size,
            "sequence_parallel_size": engine.sequence_parallel_size,
            "backend": engine.dist_backend, "hpz": engine.zero_hpz_partition_size(),
            "param_names": sorted(engine.param_names.values()) == sorted(
                n for n, _ in engine.module.named_parameters()),
            "flags": [engine.has_moe_layers, engine.pipeline_parallelism,
                      engine.dont_change_device, engine.losses, engine.enable_backward_allreduce]}


def test_ranks_and_groups_at_world_2():
    for rank, r in enumerate(run_ranks(_ranks_and_groups, 2)):
        assert (r["dp_rank"], r["mp_rank"], r["tp_rank"]) == (rank, 0, 0)
        assert (r["group_size"], r["sum"], r["seq_dp_world_size"]) == (2, 3.0, 2)
        assert r["seq_group_is_dp"] and r["sequence_parallel_size"] == 1
        assert r["backend"] == "gloo" and r["hpz"] == 2 and r["param_names"]
        assert r["flags"] == [False, False, False, None, True]


def _deepspeed_io(rank, world):
    engine, *_ = zerolite.initialize(model=_model(), config=ds_config(
        world, stage=1, gas=1, train_batch_size=3 * world, dataloader_drop_last=True))
    data = TensorDataset(torch.arange(20.0))
    train = engine.deepspeed_io(data, num_local_io_workers=0)
    evals = engine.deepspeed_io(data, route="eval", batch_size=4, num_local_io_workers=0,
                                collate_fn=lambda items: [int(x[0]) for x in items])
    default_workers = engine.deepspeed_io(data).num_workers

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(3))

    refused = None
    try:
        engine.deepspeed_io(object())
    except ValueError as e:
        refused = str(e)
    return {"train": [b[0].tolist() for b in train], "train_len": len(train),
            "eval": list(evals), "workers": default_workers,
            "map": engine.is_map_style_dataset(data),
            "iterable": engine.is_iterable_style_dataset(Stream()),
            "map_stream": engine.is_map_style_dataset(Stream()), "refused": refused}


def test_deepspeed_io_splits_the_data_between_ranks():
    results = run_ranks(_deepspeed_io, 2)
    train = [x for r in results for b in r["train"] for x in b]
    assert all(len(b) == 3 for r in results for b in r["train"])  # micro-batch 3
    assert len(train) == len(set(train)) == 18  # 10 samples a rank: 3 batches of 3, 1 dropped
    assert [r["train_len"] for r in results] == [3, 3]
    # in order, batches of 4, the last partial one dropped (dataloader_drop_last)
    assert results[0]["eval"] == [[0, 2, 4, 6], [8, 10, 12, 14]]
    assert results[1]["eval"] == [[1, 3, 5, 7], [9, 11, 13, 15]]
    for r in results:
        assert (r["workers"], r["map"], r["iterable"], r["map_stream"]) == (2, True, True, False)
        assert r["refused"] == "Training data must be a torch Dataset"


# -- state: no_sync, module state dicts --------------------------------------------------
def _no_sync_flag(rank, world):
    engine, *_ = zerolite.initialize(model=tiny_gpt(), config=ds_config(world, stage=1))
    seen = [engine.inside_no_sync_ctxt]
    with engine.no_sync():
        seen.append(engine.inside_no_sync_ctxt)
    seen.append(engine.inside_no_sync_ctxt)
    return seen


def test_inside_no_sync_ctxt_follows_no_sync():
    assert run_ranks(_no_sync_flag, 2) == [[False, True, False]] * 2


def _load_then_train(rank, world, stage, load):
    """Train 2 steps from tiny_gpt(seed=5)'s weights: loaded into an engine over seed 0's
    model (load) or built over seed 5's (reference)."""
    from zerolite.testing.reference import rank_micro_batches

    model = tiny_gpt(seed=0 if load else 5)
    engine, *_ = zerolite.initialize(model=model, config=ds_config(world, stage=stage))
    if load:
        engine.load_module_state_dict({"module": tiny_gpt(seed=5).state_dict()})
    full = {k: v.clone() for k, v in engine._zero3_consolidated_16bit_state_dict().items()}
    losses = []
    for batch in batches(2):
        for x, y in rank_micro_batches(batch, rank, world, engine.gradient_accumulation_steps()):
            loss = engine(x, y)
            losses.append(loss.item())
            engine.backward(loss)
            engine.step()
    return full, losses


@pytest.mark.parametrize("stage", [1, 3])
def test_load_module_state_dict_reaches_the_masters(stage):
    loaded = run_ranks(_load_then_train, 2, stage, True)
    reference = run_ranks(_load_then_train, 2, stage, False)
    target = tiny_gpt(seed=5).state_dict()
    full = loaded[0][0]  # rank 0's (the others get {})
    assert full.keys() == target.keys()
    for key, value in target.items():
        torch.testing.assert_close(full[key], value, rtol=0, atol=0)
    for (_, losses), (_, ref_losses) in zip(loaded, reference):
        assert losses == ref_losses  # the step starts from the loaded fp32 masters


def _module_state_dict(rank, world, stage):
    model = tiny_gpt()
    first = next(model.parameters())
    first.requires_grad_(False)
    engine, *_ = zerolite.initialize(model=model, config=ds_config(world, stage=stage))
    frozen = next(n for n, p in model.named_parameters() if not p.requires_grad)
    try:
        sd = engine.module_state_dict(prefix="m.")
        return {"keys": sorted(sd), "equal": all(torch.equal(sd["m." + k], v)
                                               for k, v in model.state_dict().items()),
                "without_frozen": "m." + frozen not in engine.module_state_dict(
                    prefix="m.", exclude_frozen_parameters=True),
                "expected": sorted("m." + k for k in model.state_dict())}
    except DeepSpeedFeatureNotSupported as e:
        return {"refused": str(e)}


def test_module_state_dict_at_stage_1_and_refused_at_stage_3():
    for r in run_ranks(_module_state_dict, 2, 1):
        assert r["keys"] == r["expected"] and r["equal"] and r["without_frozen"]
    for r in run_ranks(_module_state_dict, 2, 3):
        assert r["refused"].startswith("DeepSpeedEngine.module_state_dict: not supported")


# -- refused names, and the inventory against a real engine ------------------------------
def _refusals_and_presence(rank, world):
    engine, *_ = zerolite.initialize(model=_model(), config=ds_config(world, stage=3))
    messages = {}
    for name in REFUSED:
        try:
            getattr(engine, name)(1, key=2)
        except DeepSpeedFeatureNotSupported as e:
            messages[name] = str(e)
    for label, assign in (("communication_data_type", torch.bfloat16),
                          ("enable_backward_allreduce", False)):
        try:
            setattr(engine, label, assign)
        except DeepSpeedFeatureNotSupported as e:
            messages[label + " ="] = str(e)
    engine.enable_backward_allreduce = True
    rows = inv.engine_inventory()
    on_engine = {name: name in vars(engine) or name in engine._modules
                 or hasattr(type(engine), name) for name, *_ in rows}
    return messages, rows, on_engine


def test_refused_names_raise_naming_themselves_and_the_inventory_holds():
    messages, rows, on_engine = run_ranks(_refusals_and_presence, 1)[0]
    for name in REFUSED:
        assert messages[name].startswith(f"DeepSpeedEngine.{name}: not supported"), name
    assert "communication_data_type = ..." in messages["communication_data_type ="]
    assert "enable_backward_allreduce = False" in messages["enable_backward_allreduce ="]
    status = {name: s for name, _, s, _ in rows}
    assert {n for n, s in status.items() if s == "refused"} == set(REFUSED)
    # done and refused names are the engine's own (not the model's through __getattr__);
    # internal and pending ones are not there at all
    wrong = {n: s for n, s in status.items() if on_engine[n] != (s in ("done", "refused"))}
    assert not wrong, wrong


def test_refusals_are_the_engines_methods():
    from zerolite.engine import ZeroEngine

    for name in REFUSED:
        assert getattr(ZeroEngine, name).__doc__.startswith("Refused:")
    assert ZeroEngine.compile is not torch.nn.Module.compile  # DeepSpeed's, not torch's


def _compiled(rank, world):
    from torch._dynamo.utils import counters

    from zerolite.testing.reference import train_engine

    engine, *_ = zerolite.initialize(model=tiny_gpt(), config=ds_config(world))
    engine.compile(backend="eager")
    engine.compile(backend="eager")  # a second call is a no-op, as in DeepSpeed
    losses = train_engine(engine, batches(4), rank, world)
    refused = {}
    for kwargs in ({"schedule": [(0, [])]}, {"compiled_autograd_enabled": True}):
        try:
            engine.compile(**kwargs)
        except DeepSpeedFeatureNotSupported as e:
            refused[next(iter(kwargs))] = str(e)
    return {"losses": losses, "is_compiled": engine.is_compiled,
            "compiled_call": engine.module._compiled_call_impl is not None,
            "frames": counters["stats"]["unique_graphs"],
            "recompile_limit": sum(n for why, n in counters["unimplemented"].items()
                                   if "recompile limit" in why),
            "refused": refused}


def test_engine_compile_trains_as_the_reference():
    """engine.compile (Accelerate calls it for a dynamo backend): the model's forward runs
    through dynamo, the units' hooks stay eager, and training is the reference's."""
    from gpt_cases import reference_run

    ref_losses, _ = reference_run(4)
    for r in run_ranks(_compiled, 2):
        torch.testing.assert_close(torch.tensor(r["losses"]), torch.tensor(ref_losses),
                                   rtol=1e-5, atol=0)
        assert r["is_compiled"] and r["compiled_call"] and r["frames"] > 0
        assert r["recompile_limit"] == 0
        assert "DeepCompile schedules" in r["refused"]["schedule"]
        assert "compiled autograd" in r["refused"]["compiled_autograd_enabled"]
