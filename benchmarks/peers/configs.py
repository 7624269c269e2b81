"""The DeepSpeed-style JSON configs of the peers matrix. Every engine of a cell gets the same
JSON: zerolite and DeepSpeed read all of it, FSDP2 and DDP take what they have an
equivalent for (micro-batch, accumulation, precision, optimizer, clipping) and otherwise run
with their own defaults, as their users run them.

  ds_defaults    only `"stage": 3` (DeepSpeed's defaults for everything else: reduce bucket
                 5e8, prefetch bucket 5e7, persistence 1e5, max live 1e9, reuse distance 1e9)
  ds_docs_zero3  the ZeRO-3 example of DeepSpeed's ZeRO tutorial (prefetch and reduce buckets
                 1e7, persistence 1e5, max live and reuse distance 1e9, sub_group 1e9) with
                 its CPU offload sections left out: on a CPU-only machine there is nowhere to
                 offload from
  hf_auto        configs/hf_auto.json with "auto" resolved as the Hugging Face Trainer does
                 before handing it to DeepSpeed: reduce bucket hidden^2, prefetch bucket
                 0.9 hidden^2, persistence 10 hidden; max live and reuse distance 1e9
  issue16        the config of issue 16: buckets 5e6, persistence 1e4, max live and reuse 1e8
  tuned          the config the README's old table used: release after forward (reuse 0),
                 nothing persistent, prefetch one block ahead
"""
from __future__ import annotations

from benchmarks.peers import workload as W

CONFIGS = ("ds_defaults", "ds_docs_zero3", "hf_auto", "issue16", "tuned")


def zero_section(name: str, hidden: int, block_numel: int, stage: int = 3) -> dict:
    if name == "ds_defaults":
        return {"stage": stage}
    if name == "ds_docs_zero3":
        return {"stage": stage, "contiguous_gradients": True,
                "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
                "stage3_prefetch_bucket_size": 1e7, "stage3_param_persistence_threshold": 1e5,
                "reduce_bucket_size": 1e7, "sub_group_size": 1e9}
    if name == "hf_auto":
        return {"stage": stage, "overlap_comm": True, "contiguous_gradients": True,
                "sub_group_size": 1e9, "reduce_bucket_size": hidden * hidden,
                "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
                "stage3_param_persistence_threshold": 10 * hidden,
                "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
                "stage3_gather_16bit_weights_on_model_save": True}
    if name == "issue16":
        return {"stage": stage, "reduce_bucket_size": 5e6, "stage3_prefetch_bucket_size": 5e6,
                "stage3_param_persistence_threshold": 1e4, "stage3_max_live_parameters": 1e8,
                "stage3_max_reuse_distance": 1e8}
    if name == "tuned":
        return {"stage": stage, "stage3_param_persistence_threshold": 0,
                "stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": block_numel}
    raise ValueError(f"unknown config {name!r}; choose from {', '.join(CONFIGS)}")


def ds_config(name: str, *, micro: int, gas: int, bf16: bool, hidden: int, block_numel: int,
              stage: int = 3) -> dict:
    """The whole JSON of one cell (the same for every engine)."""
    return {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": gas,
            "optimizer": {"type": "AdamW",
                          "params": {"lr": W.LR, "betas": list(W.BETAS), "eps": W.EPS,
                                     "weight_decay": W.WEIGHT_DECAY}},
            "gradient_clipping": W.CLIP,
            "zero_optimization": zero_section(name, hidden, block_numel, stage),
            "bf16": {"enabled": bf16}}
