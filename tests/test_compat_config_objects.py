"""DeepSpeed's config objects on the alias: deepspeed.runtime.config.DeepSpeedConfig,
deepspeed.runtime.zero.config.DeepSpeedZeroConfig and its offload / leaf-module blocks,
deepspeed.runtime.config_utils.DeepSpeedConfigModel, the optimizer-name constants,
deepspeed.DeepSpeedConfigError; Hjson and base64 config sources (DeepSpeed reads both)."""
import base64
import json
import sys

import pytest
import torch

import zerolite
from zerolite.compat import deepspeed
from zerolite.compat.deepspeed.runtime import config as rc
from zerolite.compat.deepspeed.runtime.config_utils import DeepSpeedConfigModel
from zerolite.compat.deepspeed.runtime.zero.config import DeepSpeedZeroConfig, ZeroStageEnum
from zerolite.compat.deepspeed.runtime.zero.offload_config import (
    DeepSpeedZeroOffloadOptimizerConfig, DeepSpeedZeroOffloadParamConfig, OffloadDeviceEnum,
)
from zerolite.config import ZeroOptimizationConfig, load_config
from zerolite.errors import ZeroliteConfigError

CFG = {"train_batch_size": 16, "gradient_accumulation_steps": 4,
       "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
       "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
       "bf16": {"enabled": True}, "gradient_clipping": 1.0, "communication_data_type": "fp32",
       "zero_optimization": {"stage": 3, "prefetch_bucket_size": 1000,
                             "offload_optimizer": {"device": "cpu", "pipeline_read": True}},
       "checkpoint": {"tag_validation": "Fail"}}


def test_deepspeed_config_reads_like_deepspeed():
    c = rc.DeepSpeedConfig(CFG)  # no process group: world size 1, as DeepSpeed
    assert (c.world_size, c.global_rank) == (1, 0)
    assert (c.train_batch_size, c.train_micro_batch_size_per_gpu,
            c.gradient_accumulation_steps) == (16, 4, 4)
    assert c.optimizer_name == rc.ADAMW_OPTIMIZER == "adamw"  # lower-cased: a DeepSpeed name
    assert c.optimizer_params == {"lr": 1e-3} and c.scheduler_name == "WarmupLR"
    assert c.bfloat16_enabled and not c.fp16_enabled and c.gradient_clipping == 1.0
    assert c.communication_data_type is torch.float32
    assert c.zero_enabled and c.zero_optimization_stage == 3 == ZeroStageEnum.weights
    assert isinstance(c.zero_config, DeepSpeedZeroConfig)
    assert c.zero_config.stage3_prefetch_bucket_size == 1000  # the alias, resolved
    assert c.checkpoint_tag_validation_enabled and c.checkpoint_tag_validation_fail
    assert c._param_dict is CFG
    assert rc.DeepSpeedConfig({"train_batch_size": 4}).optimizer_name is None


def test_optimizer_constants():
    assert (rc.ADAM_OPTIMIZER, rc.ADAGRAD_OPTIMIZER, rc.LAMB_OPTIMIZER, rc.LION_OPTIMIZER) == (
        "adam", "adagrad", "lamb", "lion")
    assert set(rc.DEEPSPEED_OPTIMIZERS) >= {"adam", "adamw", "adagrad", "lamb", "lion"}
    assert rc.TORCH_ADAM_PARAM == "torch_adam" and rc.ADAM_W_MODE == "adam_w_mode"


def test_config_error_is_zerolites_and_names_the_key():
    assert deepspeed.DeepSpeedConfigError is ZeroliteConfigError is rc.DeepSpeedConfigError
    assert deepspeed.DeepSpeedConfig is rc.DeepSpeedConfig
    with pytest.raises(deepspeed.DeepSpeedConfigError, match="checkpoint.tag_validation"):
        rc.DeepSpeedConfig({**CFG, "checkpoint": {"tag_validation": "sometimes"}})
    with pytest.raises(deepspeed.DeepSpeedConfigError, match="train_batch_size"):
        rc.DeepSpeedConfig({"train_batch_size": 3, "train_micro_batch_size_per_gpu": 2})
    with pytest.raises(deepspeed.DeepSpeedConfigError, match="zero_optimization.stage"):
        zerolite.initialize(model=torch.nn.Linear(2, 2),
                            config={"train_batch_size": 1, "zero_optimization": {"stage": 7}})


def test_zero_config_defaults_and_blocks():
    z = DeepSpeedZeroConfig()
    plain = ZeroOptimizationConfig.from_dict({}, zerolite.config._util.ParseContext())
    for name in ("stage", "reduce_bucket_size", "stage3_max_live_parameters",
                 "stage3_param_persistence_threshold", "sub_group_size", "overlap_comm"):
        assert getattr(z, name) == getattr(plain, name), name
    assert z.offload_param is None and z.offload_optimizer is None
    z = DeepSpeedZeroConfig(stage=3, offload_param={"device": "nvme", "nvme_path": "/tmp/x"},
                            offload_optimizer={"device": "none"})
    assert isinstance(z.offload_param, DeepSpeedZeroOffloadParamConfig)
    assert z.offload_param.device == OffloadDeviceEnum.nvme and str(z.offload_param.nvme_path) == "/tmp/x"
    assert isinstance(z.offload_optimizer, DeepSpeedZeroOffloadOptimizerConfig)
    assert z.offload_optimizer.device == "none" and not z.offload_optimizer.pipeline
    assert z.offload_param.buffer_count == 5 and z.model_dump()["offload_param"]["buffer_count"] == 5
    assert DeepSpeedZeroOffloadOptimizerConfig(device="cpu", pipeline_write=True).pipeline
    assert z.model_fields_set == {"stage", "offload_param", "offload_optimizer"}


def test_zero_config_refuses_what_zerolite_refuses():
    with pytest.raises(ZeroliteConfigError, match="unknown field.*no_such_knob"):
        DeepSpeedZeroConfig(stage=1, no_such_knob=3)
    with pytest.raises(ZeroliteConfigError, match="offload_param.*stage 3"):
        DeepSpeedZeroConfig(stage=2, offload_param={"device": "cpu"})
    with pytest.raises(ValueError):
        DeepSpeedZeroOffloadParamConfig(device="tape")
    with pytest.raises(ZeroliteConfigError, match="buffer_count"):
        DeepSpeedZeroOffloadParamConfig(device="cpu", buffer_count=-1)
    # "auto" falls back to the default unless strict (Hugging Face configs rely on it)
    assert DeepSpeedZeroConfig(stage=2, overlap_comm="auto").overlap_comm is False
    with pytest.raises(ZeroliteConfigError, match="stage"):
        DeepSpeedZeroConfig(strict=True, stage="auto")


def test_config_model_subclass_like_deepspeeds():
    class MyConfig(DeepSpeedConfigModel):
        width: int = 4
        name: str = "x"

    c = MyConfig(width=8, name="auto")
    assert (c.width, c.name) == (8, "x") and c.model_dump() == {"width": 8, "name": "x"}
    assert MyConfig(width=8) == c and MyConfig() != c
    with pytest.raises(ZeroliteConfigError, match=r"MyConfig: unknown field\(s\) \['height'\]"):
        MyConfig(height=1)


def test_hjson_config_file(tmp_path):
    pytest.importorskip("hjson")  # a test extra (setup.cfg); DeepSpeed depends on it
    path = tmp_path / "ds.hjson"
    path.write_text("{\n  # DeepSpeed reads configs with hjson\n  train_batch_size: 8,\n"
                    "  zero_optimization: {stage: 2,},\n}\n")
    cfg = load_config(str(path), world_size=2)
    assert (cfg.train_micro_batch_size_per_gpu, cfg.zero_optimization.stage) == (4, 2)
    assert rc.DeepSpeedConfig(str(path)).zero_optimization_stage == 2
    path.write_text('{"train_batch_size": 8, "train_batch_size": 4}')
    with pytest.raises(ZeroliteConfigError, match="duplicate key"):
        load_config(str(path), world_size=1)


def test_hjson_missing_says_so(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "hjson", None)  # import hjson -> ImportError
    path = tmp_path / "ds.json"
    path.write_text("{train_batch_size: 8}")
    with pytest.raises(ZeroliteConfigError, match="invalid JSON.*line 1.*pip install hjson"):
        load_config(str(path), world_size=1)


def test_base64_config():
    encoded = base64.urlsafe_b64encode(json.dumps({"train_batch_size": 6}).encode()).decode()
    assert load_config(encoded, world_size=3).train_micro_batch_size_per_gpu == 2
    assert rc.DeepSpeedConfig(encoded).train_batch_size == 6
    with pytest.raises(ZeroliteConfigError, match="file not found: 'nope.json'"):
        load_config("nope.json", world_size=1)
