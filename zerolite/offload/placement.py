"""Where each offload choice puts the model-state bytes of one rank (for `check-config`).

"device" is the memory the model computes in (the accelerator, or RAM on a CPU-only run),
"host" is RAM beside it, "disk" is files under nvme_path. What zerolite does today:

- none: everything on the device.
- cpu:  fp32 masters, Adam moments and the fp32 gradient shards in host memory
        (offload/host_placement.py), plus two host buffers per shard: a 16-bit cast buffer
        (mixed precision) and an accumulation staging buffer (gradient accumulation > 1);
        with fp32 training the device keeps its param shard and the host holds the master
        copy. `ratio` of the shard moves. On a CPU-only run device and host are the same
        RAM and nothing moves: the row says where the bytes would be on an accelerator.
- nvme: the Adam moments in files (two slots each, so a failed step never overwrites the last
        committed value), the masters stay on the device, and the host holds two chunk buffer
        sets of `sub_group_size` elements per moment.
"""
from __future__ import annotations

_MOMENTS = 2  # Adam/AdamW: exp_avg, exp_avg_sq (fp32)


def offload_bytes(per_stage: dict, stage: int, precision: str, world_size: int,
                  num_params: int, block: dict | None, sub_group_size: int,
                  gas: int = 1) -> dict:
    """{"none"|"cpu"|"nvme": {"device", "host", "disk"}} bytes per rank for ZeRO `stage`.

    `per_stage[stage]` is check_config.estimate_model_state_bytes' row (params, grads,
    optimizer); `block` is the config's offload_optimizer block (for ratio), or None.
    """
    row = per_stage[stage]
    optimizer = row["optimizer"]
    moments = optimizer * (8 / 12 if precision != "fp32" else 1.0)
    masters = optimizer - moments  # 0 with fp32: the master IS the param shard
    ratio = block["ratio"] if block else 1.0
    shard = num_params / (world_size if stage >= 1 else 1)
    buffers = 2 * _MOMENTS * 4 * min(sub_group_size, shard)
    on_disk = moments * ratio
    rest = row["params"] + row["grads"]
    # cpu: the moved fraction of the optimizer row, and of the grads row where it is the
    # shard (stages 2-3; stages 0-1 keep their full gradient buffers on the device).
    host_grad = 4 * shard * ratio
    moved = optimizer * ratio + (host_grad if stage >= 2 else 0.0)
    extra = 4 if precision == "fp32" else 2  # fp32: master copy; else the 16-bit cast buffer
    host = optimizer * ratio + host_grad + shard * ratio * (extra + (4 if gas > 1 else 0))
    return {
        "none": {"device": row["total"], "host": 0.0, "disk": 0.0},
        "cpu": {"device": row["total"] - moved, "host": host, "disk": 0.0},
        "nvme": {"device": rest + masters + moments - on_disk,
                 "host": buffers, "disk": 2 * on_disk},
    }
