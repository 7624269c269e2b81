"""An Accelerate training loop with a DeepSpeed plugin (ZeRO-3, gradient accumulation 2,
clipping), unchanged from what runs on DeepSpeed; records per-micro-batch losses and the final
weights (accelerator.get_state_dict) in --out.

    torchrun --nproc_per_node 2 -m zerolite.as_deepspeed accelerate_mlp.py --out DIR

With --dynamo BACKEND Accelerate compiles the engine (engine.compile). With --from-launcher
the script makes a plain `Accelerator()`: the DeepSpeed config comes from
`accelerate launch --use_deepspeed --zero_stage 3 --gradient_accumulation_steps 2
--gradient_clipping 0.5 ...` instead.
"""
import argparse
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator, DeepSpeedPlugin, PartialState

GAS, MICRO, STEPS, CLIP = 2, 4, 5, 0.5


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh())
        self.head = nn.Linear(32, 1)

    def forward(self, x, y=None):
        out = self.head(self.body(x))
        return out if y is None else F.mse_loss(out, y)


def data(world: int):
    g = torch.Generator().manual_seed(3)
    n = STEPS * GAS * MICRO * world
    x = torch.randn(n, 8, generator=g)
    return x, torch.sin(x.sum(dim=1, keepdim=True))


def model_and_optimizer():
    torch.manual_seed(0)
    model = Regressor()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--from-launcher", dest="from_launcher", action="store_true")
    p.add_argument("--dynamo", default=None, help="Accelerator(dynamo_backend=...): "
                   "Accelerate compiles the engine (engine.compile)")
    a = p.parse_args()
    ds_config = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": GAS,
                 "gradient_clipping": CLIP,
                 "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                       "stage3_gather_16bit_weights_on_model_save": True}}
    if not torch.cuda.is_available():
        # Note: Accelerate joins CPU ranks (gloo) only when told to; TrainingArguments(use_cpu)
        # does the same. The Accelerator below then shares this state.
        PartialState(cpu=True)
    if a.from_launcher:
        accelerator = Accelerator()
        assert accelerator.gradient_accumulation_steps == GAS
    else:
        accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=ds_config),
                                  dynamo_backend=a.dynamo)
    model, optimizer = model_and_optimizer()
    x, y = data(accelerator.num_processes)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y),
                                         batch_size=MICRO, shuffle=False)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for xb, yb in loader:
        with accelerator.accumulate(model):
            loss = model(xb, yb)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        losses.append(loss.item())
    state = accelerator.get_state_dict(model)
    rank = accelerator.process_index
    with open(os.path.join(a.out, f"rank{rank}.json"), "w") as f:
        import deepspeed  # what the launched ranks import

        json.dump({"losses": losses, "engine": type(model).__name__,
                   "deepspeed": deepspeed.__file__, "world": accelerator.num_processes,
                   "zero": [model.zero_optimization_stage(), model.gradient_accumulation_steps(),
                            model.gradient_clipping()],
                   "compiled": model.is_compiled,
                   "state": {k: v.tolist() for k, v in state.items()} if rank == 0 else None}, f)


if __name__ == "__main__":
    main()
