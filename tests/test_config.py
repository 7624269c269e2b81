"""Tests for zerolite.config: DeepSpeed defaults, batch triangle, errors, warnings, "auto"."""

from __future__ import annotations

import argparse
import copy
import json
import logging
import pathlib
import warnings

import pytest
import torch
from hypothesis import given, settings, strategies as st

from zerolite.config import (
    KEY_SUPPORT, Fp16Config, ZeroConfig, ZeroliteConfigError, ZeroliteConfigWarning,
    ZeroliteExtrasConfig, accepted_ignored_keys, add_config_arguments, load_config,
)

CONFIGS = pathlib.Path(__file__).resolve().parent.parent / "configs"
MIN = {"train_micro_batch_size_per_gpu": 2}


def load_quiet(cfg, ws=1, **kw):
    """Load and assert that no unknown-key warning was raised."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", ZeroliteConfigWarning)
        return load_config(cfg, ws, **kw)


def with_(**extra):
    d = copy.deepcopy(MIN)
    d.update(extra)
    return d


# ---------------------------------------------------------------- defaults


def test_minimal_config_gets_deepspeed_defaults():
    cfg = load_quiet(MIN, 1)
    assert isinstance(cfg, ZeroConfig)
    assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu,
            cfg.gradient_accumulation_steps, cfg.world_size) == (2, 2, 1, 1)
    assert cfg.optimizer is None and cfg.scheduler is None
    assert cfg.gradient_clipping == 0.0 and cfg.steps_per_print == 10
    assert cfg.prescale_gradients is False and cfg.gradient_predivide_factor == 1.0
    assert cfg.communication_data_type is None
    assert cfg.wall_clock_breakdown is False and cfg.dataloader_drop_last is False
    fp16 = cfg.fp16
    assert (fp16.enabled, fp16.loss_scale, fp16.initial_scale_power, fp16.loss_scale_window,
            fp16.hysteresis, fp16.consecutive_hysteresis, fp16.min_loss_scale, fp16.auto_cast) == (
        False, 0.0, 16, 1000, 2, False, 1.0, False)
    assert cfg.bf16.enabled is False
    z = cfg.zero_optimization
    assert z.stage == 0 and z.overlap_comm is False
    assert z.contiguous_gradients is True and z.reduce_scatter is True
    assert z.reduce_bucket_size == 500_000_000 and z.allgather_bucket_size == 500_000_000
    assert z.allgather_partitions is True
    assert z.stage3_prefetch_bucket_size == 50_000_000
    assert z.stage3_param_persistence_threshold == 100_000
    assert z.stage3_max_live_parameters == 1_000_000_000
    assert z.stage3_max_reuse_distance == 1_000_000_000
    assert z.stage3_gather_16bit_weights_on_model_save is False
    assert z.offload_optimizer is None and z.offload_param is None
    assert z.zero_quantized_gradients is False and z.zero_quantized_weights is False
    assert z.zero_hpz_partition_size == 1 and z.sub_group_size == 1_000_000_000
    assert z.round_robin_gradients is False and z.elastic_checkpoint is False
    ac = cfg.activation_checkpointing
    assert not (ac.partition_activations or ac.cpu_checkpointing or ac.profile)
    assert ac.number_checkpoints is None
    assert cfg.zerolite == ZeroliteExtrasConfig()
    assert (cfg.zerolite.comm_timeout_s, cfg.zerolite.quantized_gradients_bits,
            cfg.zerolite.quantized_block_size, cfg.zerolite.unit_policy) == (300, 8, 256, None)
    assert cfg.csv_monitor is None and cfg.tensorboard is None
    assert cfg.precision_dtype == torch.float32
    assert cfg.raw == MIN


def test_stage3_overlap_comm_defaults_true_and_aliases():
    cfg = load_quiet(with_(zero_optimization={"stage": 3, "prefetch_bucket_size": 1e6,
                                              "stage3_gather_fp16_weights_on_model_save": True}))
    z = cfg.zero_optimization
    assert z.overlap_comm is True
    assert z.stage3_prefetch_bucket_size == 1_000_000 and isinstance(z.stage3_prefetch_bucket_size, int)
    assert z.stage3_gather_16bit_weights_on_model_save is True
    assert load_quiet(with_(zero_optimization={"stage": 3, "overlap_comm": False})) \
        .zero_optimization.overlap_comm is False


def test_optimizer_defaults_and_canonical_names():
    cfg = load_quiet(with_(optimizer={"type": "adam", "params": {"lr": 3e-4}}))
    assert cfg.optimizer.type == "Adam"
    assert cfg.optimizer.params == {"lr": 3e-4, "betas": (0.9, 0.999), "eps": 1e-8,
                                    "weight_decay": 0.0, "bias_correction": True,
                                    "amsgrad": False, "adam_w_mode": True, "torch_adam": False,
                                    "fp32_optimizer_states": None}
    for spelled, canon in [("ADAMW", "AdamW"), ("sgd", "SGD"), ("Adagrad", "Adagrad"),
                           ("lamb", "Lamb"), ("Lion", "Lion")]:
        opt = load_quiet(with_(optimizer={"type": spelled})).optimizer
        assert opt.type == canon and "lr" in opt.params
    assert load_quiet(with_(optimizer={"type": "SGD", "params": {"momentum": 0.9}})) \
        .optimizer.params["momentum"] == 0.9


@pytest.mark.parametrize("sched", [
    {"type": "WarmupLR"},
    {"type": "WarmupDecayLR", "params": {"total_num_steps": 100}},
    {"type": "WarmupCosineLR", "params": {"total_num_steps": 100}},
    {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3}},
    {"type": "lrrangetest"},
])
def test_scheduler_types_load_with_defaults(sched):
    s = load_quiet(with_(scheduler=sched)).scheduler
    assert s.type.lower() == sched["type"].lower()
    if s.type == "WarmupLR":  # warmup_max_lr None: each param group's own lr (DeepSpeed's code)
        assert s.params == {"warmup_min_lr": 0.0, "warmup_max_lr": None, "warmup_num_steps": 1000,
                            "warmup_type": "log", "last_batch_iteration": -1}


@pytest.mark.parametrize("spelling,canon", [
    ("fp32", "fp32"), ("float32", "fp32"), ("fp16", "fp16"), ("FP16", "fp16"), ("bf16", "bf16"),
    ("bfp16", "bf16"), ("bfloat16", "bf16"), (None, None)])
def test_communication_data_type_spellings(spelling, canon):
    assert load_quiet(with_(communication_data_type=spelling)).communication_data_type == canon


def test_precision_dtype_and_bfloat16_alias():
    assert load_quiet(with_(bf16={"enabled": True})).precision_dtype == torch.bfloat16
    assert load_quiet(with_(bfloat16={"enabled": True})).bf16.enabled is True
    assert load_quiet(with_(fp16={"enabled": True})).precision_dtype == torch.float16


def test_to_dict_is_json_and_round_trips():
    cfg = load_quiet(CONFIGS / "zero3_fp16.json", 2)
    d = cfg.to_dict()
    json.dumps(d)
    again = load_quiet(d, 2)
    assert again.to_dict() == d
    assert d["optimizer"]["params"]["betas"] == [0.9, 0.999]


def test_direct_dataclass_validation():
    with pytest.raises(ZeroliteConfigError, match="fp16.loss_scale"):
        Fp16Config(loss_scale=-1)
    with pytest.raises(ZeroliteConfigError, match="zerolite.quantized_block_size"):
        ZeroliteExtrasConfig(quantized_block_size=100)


# ---------------------------------------------------------------- batch triangle

MICRO, GAS = 2, 3
PATTERNS = [("train", "micro", "gas"), ("train", "micro"), ("train", "gas"), ("micro", "gas"),
            ("train",), ("micro",)]
KEYS = {"train": "train_batch_size", "micro": "train_micro_batch_size_per_gpu",
        "gas": "gradient_accumulation_steps"}


@pytest.mark.parametrize("ws", [1, 2, 4, 8])
@pytest.mark.parametrize("pattern", PATTERNS, ids="+".join)
@pytest.mark.parametrize("missing_as", ["absent", "auto", "null"])
def test_batch_triangle(ws, pattern, missing_as):
    full = {"train": MICRO * GAS * ws, "micro": MICRO, "gas": GAS}
    d = {KEYS[k]: full[k] for k in pattern}
    for k in set(KEYS) - set(pattern):
        if missing_as != "absent":
            d[KEYS[k]] = "auto" if missing_as == "auto" else None
    cfg = load_quiet(d, ws)
    if pattern == ("train",):
        expected = (full["train"], full["train"] // ws, 1)
    elif pattern == ("micro",):
        expected = (MICRO * ws, MICRO, 1)
    else:
        expected = (full["train"], MICRO, GAS)
    got = (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps)
    assert got == expected
    assert got[0] == got[1] * got[2] * ws


@settings(max_examples=60, deadline=None)
@given(micro=st.integers(1, 64), gas=st.integers(1, 16), ws=st.integers(1, 16))
def test_batch_triangle_property(micro, gas, ws):
    train = micro * gas * ws
    for d in ({"train_batch_size": train, "train_micro_batch_size_per_gpu": micro},
              {"train_batch_size": train, "gradient_accumulation_steps": gas},
              {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": gas}):
        cfg = ZeroConfig.from_dict(d, ws)
        assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu,
                cfg.gradient_accumulation_steps) == (train, micro, gas)


def test_batch_mismatch_message_explains_world_size():
    d = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}
    load_quiet(d, 2)
    with pytest.raises(ZeroliteConfigError) as ei:
        load_quiet(d, 4)
    msg = str(ei.value)
    for part in ("train_batch_size=16", "train_micro_batch_size_per_gpu=4",
                 "gradient_accumulation_steps=2", "world_size=4", "nproc_per_node", "WORLD_SIZE"):
        assert part in msg
    assert "\n" not in msg


# ---------------------------------------------------------------- bad configs

BAD = [
    # (id, config, world_size, key that must be named)
    ("no-batch", {}, 1, "train_batch_size"),
    ("only-gas", {"gradient_accumulation_steps": 2}, 1, "train_micro_batch_size_per_gpu"),
    ("all-auto", {k: "auto" for k in KEYS.values()}, 1, "train_batch_size"),
    ("batch-mismatch", {"train_batch_size": 10, "train_micro_batch_size_per_gpu": 2,
                        "gradient_accumulation_steps": 2}, 2, "train_batch_size"),
    ("batch-indivisible", {"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4}, 1,
     "train_micro_batch_size_per_gpu"),
    ("train-indivisible", {"train_batch_size": 6}, 4, "train_batch_size"),
    ("batch-zero", {"train_micro_batch_size_per_gpu": 0}, 1, "train_micro_batch_size_per_gpu"),
    ("batch-negative", {"train_batch_size": -8}, 1, "train_batch_size"),
    ("batch-bool", {"train_micro_batch_size_per_gpu": True}, 1, "train_micro_batch_size_per_gpu"),
    ("batch-string", {"train_micro_batch_size_per_gpu": "4"}, 1, "train_micro_batch_size_per_gpu"),
    ("batch-fraction", {"train_micro_batch_size_per_gpu": 2.5}, 1, "train_micro_batch_size_per_gpu"),
    ("gas-negative", with_(gradient_accumulation_steps=-1), 1, "gradient_accumulation_steps"),
    ("stage-5", with_(zero_optimization={"stage": 5}), 1, "zero_optimization.stage"),
    ("stage-string", with_(zero_optimization={"stage": "3"}), 1, "zero_optimization.stage"),
    ("stage-auto", with_(zero_optimization={"stage": "auto"}), 1, "zero_optimization.stage"),
    ("zero-not-object", with_(zero_optimization=[3]), 1, "zero_optimization"),
    ("reduce-bucket-negative", with_(zero_optimization={"reduce_bucket_size": -1}), 1,
     "zero_optimization.reduce_bucket_size"),
    ("prefetch-negative", with_(zero_optimization={"stage3_prefetch_bucket_size": -5}), 1,
     "zero_optimization.stage3_prefetch_bucket_size"),
    ("overlap-string", with_(zero_optimization={"overlap_comm": "yes"}), 1,
     "zero_optimization.overlap_comm"),
    ("offload-device", with_(zero_optimization={"offload_optimizer": {"device": "gpu"}}), 1,
     "zero_optimization.offload_optimizer.device"),
    ("mics", with_(zero_optimization={"mics_shard_size": 4}), 1, "zero_optimization.mics_shard_size"),
    ("alias-twice", with_(zero_optimization={"prefetch_bucket_size": 1,
                                             "stage3_prefetch_bucket_size": 2}), 1,
     "zero_optimization.stage3_prefetch_bucket_size"),
    ("unknown-optimizer", with_(optimizer={"type": "OneBitAdam"}), 1, "optimizer.type"),
    ("optimizer-no-type", with_(optimizer={"params": {"lr": 1}}), 1, "optimizer.type"),
    ("lr-string", with_(optimizer={"type": "Adam", "params": {"lr": "0.1"}}), 1, "optimizer.params.lr"),
    ("lr-negative", with_(optimizer={"type": "Adam", "params": {"lr": -1}}), 1, "optimizer.params.lr"),
    ("betas-one", with_(optimizer={"type": "Adam", "params": {"betas": [0.9]}}), 1,
     "optimizer.params.betas"),
    ("betas-range", with_(optimizer={"type": "AdamW", "params": {"betas": [0.9, 1.5]}}), 1,
     "optimizer.params.betas"),
    ("opt-auto-other", with_(optimizer={"type": "Adam", "params": {"amsgrad": "auto"}}), 1,
     "optimizer.params.amsgrad"),
    ("nesterov", with_(optimizer={"type": "SGD", "params": {"nesterov": True}}), 1,
     "optimizer.params.nesterov"),
    ("unknown-scheduler", with_(scheduler={"type": "Cosine"}), 1, "scheduler.type"),
    ("decay-no-total", with_(scheduler={"type": "WarmupDecayLR"}), 1,
     "scheduler.params.total_num_steps"),
    ("cosine-total-auto", with_(scheduler={"type": "WarmupCosineLR",
                                           "params": {"total_num_steps": "auto"}}), 1,
     "scheduler.params.total_num_steps"),
    ("onecycle-no-max", with_(scheduler={"type": "OneCycle", "params": {"cycle_min_lr": 0.1}}), 1,
     "scheduler.params.cycle_max_lr"),
    ("warmup-type", with_(scheduler={"type": "WarmupLR", "params": {"warmup_type": "cubic"}}), 1,
     "scheduler.params.warmup_type"),
    ("warmup-steps-neg", with_(scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": -3}}),
     1, "scheduler.params.warmup_num_steps"),
    ("fp16-and-bf16", with_(fp16={"enabled": True}, bf16={"enabled": True}), 1, "fp16.enabled"),
    ("fp16-enabled-string", with_(fp16={"enabled": "true"}), 1, "fp16.enabled"),
    ("loss-scale-negative", with_(fp16={"loss_scale": -1}), 1, "fp16.loss_scale"),
    ("hysteresis-zero", with_(fp16={"hysteresis": 0}), 1, "fp16.hysteresis"),
    ("bf16-twice", with_(bf16={"enabled": True}, bfloat16={"enabled": True}), 1, "bf16"),
    ("amp-on", with_(amp={"enabled": True}), 1, "amp.enabled"),
    ("unmanaged-accumulation", with_(managed_gradient_accumulation=False), 1,
     "managed_gradient_accumulation"),
    ("comm-dtype", with_(communication_data_type="int8"), 1, "communication_data_type"),
    ("clip-string", with_(gradient_clipping="1.0"), 1, "gradient_clipping"),
    ("clip-negative", with_(gradient_clipping=-1.0), 1, "gradient_clipping"),
    ("clip-nan", with_(gradient_clipping=float("nan")), 1, "gradient_clipping"),
    ("predivide-zero", with_(gradient_predivide_factor=0), 1, "gradient_predivide_factor"),
    ("steps-per-print-zero", with_(steps_per_print=0), 1, "steps_per_print"),
    ("wall-clock-int", with_(wall_clock_breakdown=1), 1, "wall_clock_breakdown"),
    ("quant-bits", with_(zerolite={"quantized_gradients_bits": 6}), 1,
     "zerolite.quantized_gradients_bits"),
    ("quant-block", with_(zerolite={"quantized_block_size": 48}), 1, "zerolite.quantized_block_size"),
    ("timeout-zero", with_(zerolite={"comm_timeout_s": 0}), 1, "zerolite.comm_timeout_s"),
    ("unit-policy", with_(zerolite={"unit_policy": "Block"}), 1, "zerolite.unit_policy"),
    ("act-ckpt", with_(activation_checkpointing={"number_checkpoints": 0}), 1,
     "activation_checkpointing.number_checkpoints"),
    ("tensorboard", with_(tensorboard={"enabled": "yes"}), 1, "tensorboard.enabled"),
    ("world-size", MIN, 0, "world_size"),
    ("config-int", 42, 1, "config"),
]


@pytest.mark.parametrize("cfg,ws,key", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_config_raises_naming_key(cfg, ws, key):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ZeroliteConfigWarning)
        with pytest.raises(ZeroliteConfigError) as ei:
            load_config(cfg, ws)
    msg = str(ei.value)
    assert key in msg
    assert "\n" not in msg


def test_bad_table_is_large_enough():
    assert len(BAD) >= 30


def _write(tmp_path, text, name="ds.json"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_missing_file(tmp_path):
    p = tmp_path / "nope.json"
    with pytest.raises(ZeroliteConfigError, match="not found") as ei:
        load_config(str(p), 1)
    assert str(p) in str(ei.value)


def test_invalid_json_reports_line_and_column(tmp_path):
    # invalid as JSON and as Hjson (which DeepSpeed also reads: unquoted keys are fine there)
    p = _write(tmp_path, '{\n  "train_batch_size": 8,\n  "fp16": {"enabled": true]\n}')
    with pytest.raises(ZeroliteConfigError) as ei:
        load_config(p, 1)
    msg = str(ei.value)
    assert str(p) in msg and "line 3" in msg and "column" in msg and "\n" not in msg


@pytest.mark.parametrize("text", ["[1, 2]", '"hello"', "3"])
def test_top_level_not_object(tmp_path, text):
    p = _write(tmp_path, text)
    with pytest.raises(ZeroliteConfigError, match="JSON object") as ei:
        load_config(p, 1)
    assert str(p) in str(ei.value)


def test_duplicate_json_key(tmp_path):
    p = _write(tmp_path, '{"train_batch_size": 8, "train_batch_size": 16}')
    with pytest.raises(ZeroliteConfigError, match="train_batch_size"):
        load_config(p, 1)


def test_file_error_names_file_and_key(tmp_path):
    p = _write(tmp_path, json.dumps(with_(zero_optimization={"stage": 7})))
    with pytest.raises(ZeroliteConfigError) as ei:
        load_config(p, 1)
    assert "zero_optimization.stage" in str(ei.value) and str(p) in str(ei.value)


# ---------------------------------------------------------------- unknown keys


def test_unknown_keys_one_warning_listing_all():
    d = with_(trian_batch_size=8, zero_optimization={"stage": 3, "overlap_com": True},
              fp16={"enabeld": True}, bf16={"enable": False},
              optimizer={"type": "Adam", "param": {}, "params": {"lrr": 1}},
              scheduler={"type": "WarmupLR", "kind": 1})
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        cfg = load_config(d, 1)
    ours = [w for w in rec if issubclass(w.category, ZeroliteConfigWarning)]
    assert len(ours) == 1
    msg = str(ours[0].message)
    for key in ("trian_batch_size", "zero_optimization.overlap_com", "fp16.enabeld", "bf16.enable",
                "optimizer.param", "optimizer.params.lrr", "scheduler.kind"):
        assert key in msg
    assert cfg.zero_optimization.stage == 3


def test_known_deepspeed_keys_do_not_warn():
    load_quiet(with_(zero_allow_untested_optimizer=True, wandb={"enabled": False},
                     flops_profiler={"enabled": False}, amp={"enabled": False},
                     zero_optimization={"stage": 2, "cpu_offload": False, "legacy_stage1": False},
                     bf16={"enabled": False, "immediate_grad_update": True},
                     csv_monitor={"enabled": True, "output_path": "out/", "job_name": "j"}))


# ---------------------------------------------------------------- "auto" (HF Trainer)


def test_hf_auto_resolution_with_hidden_size(caplog):
    with caplog.at_level(logging.INFO, logger="zerolite"):
        cfg = load_quiet(CONFIGS / "hf_auto.json", 2, hidden_size=1024)
    z = cfg.zero_optimization
    assert z.reduce_bucket_size == 1024 ** 2
    assert z.stage3_prefetch_bucket_size == int(0.9 * 1024 ** 2)
    assert z.stage3_param_persistence_threshold == 10 * 1024
    assert cfg.gradient_clipping == 1.0
    assert cfg.fp16.enabled is False and cfg.bf16.enabled is False
    assert cfg.optimizer.params["lr"] == 1e-3 and cfg.optimizer.params["betas"] == (0.9, 0.999)
    assert cfg.optimizer.params["eps"] == 1e-8 and cfg.optimizer.params["weight_decay"] == 0.0
    sp = cfg.scheduler.params
    assert (sp["warmup_min_lr"], sp["warmup_max_lr"], sp["warmup_num_steps"]) == (0.0, 1e-3, 1000)
    assert cfg.train_micro_batch_size_per_gpu == 2 and cfg.gradient_accumulation_steps == 1
    assert cfg.train_batch_size == 4
    logged = caplog.text
    for key in ("gradient_clipping", "optimizer.params.lr", "zero_optimization.reduce_bucket_size",
                "fp16.enabled", "scheduler.params.warmup_max_lr"):
        assert key in logged


def test_hf_auto_without_hidden_size_keeps_defaults(caplog):
    with caplog.at_level(logging.INFO, logger="zerolite"):
        z = load_quiet(CONFIGS / "hf_auto.json", 1).zero_optimization
    assert z.reduce_bucket_size == 500_000_000
    assert z.stage3_prefetch_bucket_size == 50_000_000
    assert z.stage3_param_persistence_threshold == 100_000
    assert "hidden_size unknown" in caplog.text


def test_scheduler_warmup_max_lr_auto_follows_optimizer_lr():
    cfg = load_quiet(with_(optimizer={"type": "AdamW", "params": {"lr": 5e-4}},
                           scheduler={"type": "WarmupDecayLR",
                                      "params": {"warmup_max_lr": "auto", "total_num_steps": 50}}))
    assert cfg.scheduler.params["warmup_max_lr"] == 5e-4


# ---------------------------------------------------------------- shipped configs, args, support


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.json")), ids=lambda p: p.name)
@pytest.mark.parametrize("ws", [1, 2, 4])
def test_shipped_configs_load(path, ws):
    cfg = load_quiet(path, ws)
    assert cfg.train_batch_size == (cfg.train_micro_batch_size_per_gpu
                                    * cfg.gradient_accumulation_steps * ws)


def test_shipped_config_contents():
    c3 = load_quiet(CONFIGS / "zero3_cpu.json", 1)
    assert c3.zero_optimization.stage == 3 and c3.precision_dtype == torch.float32
    assert c3.optimizer.type == "AdamW" and c3.optimizer.params["weight_decay"] == 0.01
    assert c3.scheduler.type == "WarmupLR" and c3.gradient_clipping == 1.0
    assert c3.steps_per_print == 10 and c3.train_micro_batch_size_per_gpu == 4
    assert load_quiet(CONFIGS / "zero3_bf16.json", 1).precision_dtype == torch.bfloat16
    fp16 = load_quiet(CONFIGS / "zero3_fp16.json", 1)
    assert fp16.precision_dtype == torch.float16 and fp16.fp16.loss_scale == 0
    assert load_quiet(CONFIGS / "zero2_cpu.json", 1).zero_optimization.stage == 2
    for p in CONFIGS.glob("zero*.json"):
        assert "train_batch_size" not in json.loads(p.read_text())


def test_args_config_sources(tmp_path):
    p = _write(tmp_path, json.dumps(MIN))
    parser = add_config_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--deepspeed", "--deepspeed_config", str(p)])
    assert args.deepspeed is True
    assert load_quiet(None, 2, args=args).train_batch_size == 4
    with pytest.raises(ZeroliteConfigError, match="given twice"):
        load_config(MIN, 1, args=args)
    with pytest.raises(ZeroliteConfigError, match="config"):
        load_config(None, 1)
    with pytest.raises(ZeroliteConfigError, match="config"):
        load_config(None, 1, args=parser.parse_args([]))
    legacy = argparse.Namespace(deepscale_config=str(p))
    assert load_quiet(None, 1, args=legacy).train_micro_batch_size_per_gpu == 2


def test_key_support_table():
    assert set(KEY_SUPPORT.values()) <= {"honoured", "accepted-ignored", "rejected"}
    for key in ("train_batch_size", "optimizer", "scheduler", "fp16", "bf16", "gradient_clipping",
                "zero_optimization.stage", "zero_optimization.stage3_prefetch_bucket_size",
                "zero_optimization.stage3_max_reuse_distance", "csv_monitor",
                "zero_optimization.reduce_bucket_size",
                "zero_optimization.zero_quantized_gradients", "communication_data_type",
                "zero_optimization.offload_optimizer", "zero_optimization.sub_group_size",
                "zero_optimization.offload_param"):
        assert KEY_SUPPORT[key] == "honoured", key
    for key in ("zero_optimization.overlap_comm",
                "zero_optimization.round_robin_gradients", "zero_optimization.elastic_checkpoint"):
        assert KEY_SUPPORT[key] == "accepted-ignored", key


def test_accepted_ignored_keys_lists_only_effective_ignored():
    cfg = load_quiet(with_(zero_optimization={"stage": 3, "round_robin_gradients": True,
                                              "offload_optimizer": {"device": "cpu"},
                                              "offload_param": {"device": "none"},
                                              "sub_group_size": 1e9, "elastic_checkpoint": False},
                           flops_profiler={"enabled": True}))
    assert accepted_ignored_keys(cfg) == ["zero_optimization.round_robin_gradients",
                                          "flops_profiler"]
    assert cfg.zero_optimization.offload_optimizer["device"] == "cpu"
    assert cfg.zero_optimization.offload_param is None
