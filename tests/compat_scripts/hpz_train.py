"""A short ZeRO-3 + hpZ run for two `zerolite --num_nodes 2 --num_procs 2` launchers
(tests/test_hpz.py): the engine reads the node layout torchrun sets (LOCAL_WORLD_SIZE=2) and
gathers backward from secondary shards inside each node. Prints one line per rank."""
import os

import torch

import zerolite
from zerolite.models import GPT, GPTConfig
from zerolite.testing.reference import make_token_batches

torch.set_num_threads(1)
cfg = GPTConfig(vocab_size=64, seq_len=8, n_layer=2, n_head=2, d_model=16)
torch.manual_seed(0)
model = GPT(cfg)
ds = {"train_batch_size": 8, "gradient_accumulation_steps": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
      "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                            "stage3_max_reuse_distance": 0, "zero_hpz_partition_size": 2}}
engine, *_ = zerolite.initialize(model=model, config=ds)
rank, world = engine.global_rank, engine.world_size
for x, y in make_token_batches(3, 8, cfg.seq_len, cfg.vocab_size, seed=1):
    per = x.shape[0] // world
    loss = engine(x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per])
    engine.backward(loss)
    engine.step()
s = engine.last_step_stats
print(f"[rank {rank}] hpz ok: node {int(os.environ['GROUP_RANK'])}, secondary gather bytes "
      f"{s.secondary_gather_bytes}, of them to the other node "
      f"{s.inter_node_bytes_by_collective['secondary_all_gather']}", flush=True)
