"""initialize(model=None) fails as DeepSpeed's does (an AssertionError, before any process
group is joined); deepspeed.accelerator.is_current_accelerator_supported;
get_accelerator().device_count() reading DeepSpeed's LOCAL_SIZE on CPU; git_version_info."""
import pytest
import torch
import torch.distributed as dist

import zerolite
from zerolite.compat import DEEPSPEED_API_VERSION, deepspeed
from zerolite.compat.deepspeed import accelerator


def test_initialize_without_model_is_deepspeeds_assertion():
    for init in (zerolite.initialize, deepspeed.initialize):
        with pytest.raises(AssertionError, match="requires a model"):
            init(model=None, config={"train_batch_size": 1})
        with pytest.raises(zerolite.ZeroliteConfigError):
            init(config={"train_batch_size": 1})
    assert not dist.is_initialized()  # raised before joining a group


def test_current_accelerator_supported():
    assert accelerator.is_current_accelerator_supported()
    assert "cpu" in accelerator.SUPPORTED_ACCELERATOR_LIST


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU accelerator's rule")
def test_cpu_device_count_reads_local_size(monkeypatch):
    acc = accelerator.ZeroliteAccelerator("cpu")
    monkeypatch.delenv("LOCAL_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert acc.device_count() == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    assert acc.device_count() == 3
    monkeypatch.setenv("LOCAL_SIZE", "4")  # DeepSpeed's launcher's variable wins
    assert acc.device_count() == 4
    monkeypatch.setenv("LOCAL_SIZE", "0")
    assert acc.device_count() == 3


def test_git_version_info():
    info = deepspeed.git_version_info
    assert info.version == deepspeed.version == deepspeed.__version__ == DEEPSPEED_API_VERSION
    assert deepspeed.git_hash is None and not any(info.installed_ops.values())
    major, minor = torch.__version__.split(".")[:2]
    assert info.torch_info["version"] == f"{major}.{minor}"
    assert set(info.torch_info) >= {"version", "cuda_version", "nccl_version", "hip_version",
                                    "bf16_support"}
    assert info.accelerator_name == accelerator.get_accelerator().device_name()
