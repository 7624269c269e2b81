"""ZeRO-Offload / ZeRO-Infinity: `zero_optimization.offload_optimizer` and `offload_param`.

plan.py resolves the config (zerolite/config/offload.py) into one placement per flat before
the model is sharded (zerolite/zero/flat_placement.py) and wraps the optimizer afterwards:

- device "cpu": the fp32 masters, optimizer state and update live in host memory
  (host_placement.py: HostMaster, HostShard; host_transfers.py moves gradients and updated
  shards). With the model on the CPU they already do: nothing moves.
- device "nvme": the optimizer's per-element state goes to files under `nvme_path` and the step
  runs in `sub_group_size`-element chunks (chunked_optimizer.py, swap_files.py); `ratio` < 1
  keeps the last (1 - ratio) of the chunks in memory. With 16-bit training the fp32 masters go
  to the files with the state (plan.py: FileMaster); with fp32 training the master IS the param
  shard and stays in memory unless offload_param puts the shard on disk as well
  (param_swap.py: FileShard, ParamFiles).
- placement.py: check-config's device / host / disk bytes per choice.
"""
