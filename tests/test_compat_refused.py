"""DeepSpeed features zerolite does not have: each gives one clear error naming the feature,
where the program uses it (importing the name works, as scripts import them unconditionally)."""
import importlib

import pytest
import torch

from zerolite.compat.deepspeed import DeepSpeedFeatureNotSupported


def _call(module, name, *args, **kwargs):
    return lambda: getattr(importlib.import_module(module), name)(*args, **kwargs)


def _ulysses_register():
    from zerolite.compat.deepspeed.runtime.sequence_parallel.ulysses_sp import (
        UlyssesSPAttentionHF)
    return UlyssesSPAttentionHF.register_with_transformers(model_name_or_path=None,
                                                           sequence_parallel_size=2)


def _moe_group():
    p = torch.nn.Parameter(torch.zeros(2))
    p.allreduce = False  # how DeepSpeed marks an expert parameter
    from zerolite.compat.deepspeed.moe.utils import (
        split_params_into_different_moe_groups_for_optimizer)
    return split_params_into_different_moe_groups_for_optimizer({"params": [p]})


REFUSED = {
    "deepspeed.init_inference": _call("zerolite.compat.deepspeed", "init_inference", None),
    "deepspeed.tp_model_init": _call("zerolite.compat.deepspeed", "tp_model_init", model=None),
    "deepspeed.PipelineModule": _call("zerolite.compat.deepspeed", "PipelineModule", layers=[]),
    "deepspeed.pipe.PipelineModule": _call("zerolite.compat.deepspeed.pipe", "PipelineModule",
                                           layers=[]),
    "deepspeed.moe.layer.MoE": _call("zerolite.compat.deepspeed.moe.layer", "MoE",
                                     hidden_size=8, expert=None),
    "deepspeed.ops.lamb.FusedLamb": _call("zerolite.compat.deepspeed.ops.lamb", "FusedLamb",
                                          [torch.nn.Parameter(torch.zeros(1))]),
    "deepspeed.utils.groups._get_sequence_parallel_group": _call(
        "zerolite.compat.deepspeed.utils.groups", "_get_sequence_parallel_group"),
    "deepspeed.ops.adam.FusedAdam(bias_correction=False)": _call(
        "zerolite.compat.deepspeed.ops.adam", "FusedAdam", [torch.nn.Parameter(torch.zeros(1))],
        bias_correction=False),
    "split_params_into_different_moe_groups_for_optimizer (group 0)": _moe_group,
    # Lightning's convert_zero_checkpoint_to_fp32_state_dict reads DeepSpeed's .pt files
    "deepspeed.utils.zero_to_fp32.get_optim_files": _call(
        "zerolite.compat.deepspeed.utils.zero_to_fp32", "get_optim_files", "ckpt/checkpoint"),
    "deepspeed.utils.zero_to_fp32.get_model_state_file": _call(
        "zerolite.compat.deepspeed.utils.zero_to_fp32", "get_model_state_file", "ckpt", 3),
    # Accelerate with sp_backend="deepspeed" calls this classmethod first
    "deepspeed.runtime.sequence_parallel.ulysses_sp.UlyssesSPAttentionHF": _ulysses_register,
}


@pytest.mark.parametrize("feature", sorted(REFUSED))
def test_refused_feature_names_itself(feature):
    with pytest.raises(DeepSpeedFeatureNotSupported) as info:
        REFUSED[feature]()
    text = str(info.value)
    assert text.startswith(feature + ": not supported by zerolite's DeepSpeed alias"), text
    assert "real DeepSpeed" in text


def test_moe_helper_passes_groups_without_moe_through():
    from zerolite.compat.deepspeed.moe.utils import (
        split_params_into_different_moe_groups_for_optimizer)
    p = torch.nn.Parameter(torch.zeros(2))
    group = {"params": [p], "name": "parameters"}
    assert split_params_into_different_moe_groups_for_optimizer(group) == [group]
    assert split_params_into_different_moe_groups_for_optimizer((group,)) == [group]
    with pytest.raises(ValueError, match="expected a dict or a list/tuple of dicts"):
        split_params_into_different_moe_groups_for_optimizer(p)
