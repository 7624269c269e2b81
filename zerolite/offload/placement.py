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
- cpu+params (stage 3): offload_param cpu too: the param shards in host memory as well (copied
        to the device right before each all-gather).
- nvme: the Adam moments in files (two slots each, so a failed step never overwrites the last
        committed value) and, with 16-bit training, the fp32 masters with them (with fp32 the
        master is the param shard and stays); the host holds two chunk buffer sets of
        `sub_group_size` elements per moment (and master).
- nvme+params (stage 3): offload_param nvme too: the compute-dtype param shards in files
        (one slot; with fp32 the shard is the master, already in the optimizer's files); the
        host holds up to `buffer_count` shards read ahead.
- params (stage 3, 16-bit only): offload_param nvme alone, the optimizer in memory.
"""
from __future__ import annotations

from zerolite.state_bytes import StateBytes


def offload_bytes(per_stage: dict, stage: int, sb: StateBytes, world_size: int,
                  num_params: int, block: dict | None, sub_group_size: int,
                  gas: int = 1, param_block: dict | None = None,
                  largest_unit: int | None = None) -> dict:
    """{choice: {"device", "host", "disk"}} bytes per rank for ZeRO `stage`.

    `per_stage[stage]` is check_config.estimate_model_state_bytes' row (params, grads,
    optimizer) for the bytes per element `sb` (zerolite/state_bytes.py); `block` / `param_block` are the config's offload_optimizer / offload_param
    blocks (ratio, buffer_count), or None; `largest_unit` (params) bounds the read-ahead.
    """
    row = per_stage[stage]
    optimizer = row["optimizer"]
    separate = not sb.master_is_shard  # 16-bit compute with fp32 masters
    moments = optimizer * (sb.moments + sb.compensation) / sb.optimizer
    masters = optimizer - moments  # 0 where the master IS the param shard
    ratio = block.ratio if block else 1.0
    shard = num_params / (world_size if stage >= 1 else 1)
    per_elem = sb.optimizer
    buffers = 2 * per_elem * min(sub_group_size, shard)
    on_disk = (moments + masters) * ratio
    rest = row["params"] + row["grads"]
    # cpu: the moved fraction of the optimizer row, and of the grads row where it is the
    # shard (stages 2-3; stages 0-1 keep their full gradient buffers on the device).
    host_grad = sb.grad * shard * ratio  # the host gradient buffer has the master's dtype
    moved = optimizer * ratio + (host_grad if stage >= 2 else 0.0)
    # A master that is the shard: its host copy; else the 16-bit cast buffer. Accumulation
    # adds a staging buffer of the gradient's dtype.
    extra = sb.compute if sb.master_is_shard else 2
    host = optimizer * ratio + host_grad + shard * ratio * (extra + (sb.grad if gas > 1 else 0))
    out = {
        "none": {"device": row["total"], "host": 0.0, "disk": 0.0},
        "cpu": {"device": row["total"] - moved, "host": host, "disk": 0.0},
        "nvme": {"device": rest + optimizer - on_disk, "host": buffers, "disk": 2 * on_disk},
    }
    if stage != 3:
        return out
    # offload_param cpu (ratio 1): the param shard leaves the device, and the host holds no
    # more than before: 16-bit, the host shard takes the cast buffer's place; a master that is
    # the shard, the host master copy becomes the shard.
    out["cpu+params"] = {"device": out["cpu"]["device"] - row["params"], "host": host,
                         "disk": 0.0}
    count = param_block.buffer_count if param_block else 5
    read_ahead = row["params"] if largest_unit is None else \
        min(row["params"], count * row["params"] * largest_unit / num_params)
    if separate:
        out["nvme+params"] = {"device": row["grads"] + optimizer - on_disk,
                              "host": buffers + read_ahead,
                              "disk": 2 * on_disk + row["params"], "host_read_ahead": read_ahead}
        out["params"] = {"device": row["grads"] + optimizer, "host": read_ahead,
                         "disk": row["params"], "host_read_ahead": read_ahead}
    else:  # the param shard is the master: it moves with the optimizer state
        both = (row["params"] + moments) * ratio
        out["nvme+params"] = {"device": row["grads"] + row["params"] + moments - both,
                              "host": 2 * (sb.optimizer + sb.compute) * min(sub_group_size, shard)
                              + read_ahead, "disk": 2 * both, "host_read_ahead": read_ahead}
    return out


def configured_choice(zc) -> str:
    """The row of offload_bytes that `zc` (a ZeroOptimizationConfig) selects."""
    opt = zc.offload_optimizer.device if zc.offload_optimizer else "none"
    param = zc.offload_param.device if zc.offload_param else "none"
    if param == "nvme":
        return "nvme+params" if opt == "nvme" else "params"
    return "cpu+params" if param == "cpu" else opt
