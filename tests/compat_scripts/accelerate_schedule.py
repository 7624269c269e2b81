"""An Accelerate custom loop in the shape of Accelerate's `examples/by_feature` and Transformers'
`run_clm_no_trainer.py`, unchanged from what runs on DeepSpeed: a DeepSpeed plugin with "auto"
keys (ZeRO-3, gradient accumulation 2, clipping), a client torch AdamW with two param groups
(no weight decay on bias / LayerNorm), `get_cosine_schedule_with_warmup` passed to `prepare`
(Accelerate steps it itself, num_processes times per optimizer step; DeepSpeed never sees it),
`accelerator.accumulate`, `clip_grad_norm_`, and `save_state` mid-run. After the run it
`load_state`s that checkpoint and trains the remaining steps again.

Records per-micro-batch losses, the lr of every group at every optimizer step, the resumed
run's losses and lrs, and the final weights (rank 0) in --out/rank{r}.json.

    torchrun --nproc_per_node 2 -m zerolite.as_deepspeed accelerate_schedule.py --out DIR
"""
import argparse
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator, DeepSpeedPlugin, PartialState
from transformers import get_cosine_schedule_with_warmup

GAS, MICRO, STEPS, CLIP, LR, WD, WARMUP, SAVE_AT = 2, 4, 8, 0.5, 1e-2, 0.1, 2, 4
DS_CONFIG = {"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
             "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
             "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
             "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                   "stage3_gather_16bit_weights_on_model_save": True}}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 32)
        self.LayerNorm = nn.LayerNorm(32)
        self.mid = nn.Linear(32, 32)
        self.head = nn.Linear(32, 1)

    def forward(self, x, y=None):
        out = self.head(torch.tanh(self.mid(torch.tanh(self.LayerNorm(self.inp(x))))))
        return out if y is None else F.mse_loss(out, y)


def data(world: int):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(STEPS * GAS * MICRO * world, 8, generator=g)
    return x, torch.sin(x.sum(dim=1, keepdim=True))


def model_and_groups():
    torch.manual_seed(0)
    model = Net()
    no_decay = ("bias", "LayerNorm.weight")
    named = list(model.named_parameters())
    return model, [
        {"params": [p for n, p in named if not any(nd in n for nd in no_decay)],
         "weight_decay": WD},
        {"params": [p for n, p in named if any(nd in n for nd in no_decay)],
         "weight_decay": 0.0}]


def schedule(optimizer, num_processes: int):
    # As run_clm_no_trainer.py: Accelerate steps the scheduler num_processes times per step.
    return get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=WARMUP * num_processes,
                                           num_training_steps=STEPS * num_processes)


def train(accelerator, model, optimizer, lr_scheduler, loader, save_dir=None):
    losses, lrs = [], []
    for xb, yb in loader:
        with accelerator.accumulate(model):
            loss = model(xb, yb)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), CLIP)
                lrs.append([g["lr"] for g in optimizer.param_groups])  # the lr just used
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
        losses.append(loss.item())
        if save_dir and accelerator.sync_gradients and len(lrs) == SAVE_AT:
            accelerator.save_state(save_dir)
    return losses, lrs


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--local_rank", type=int, default=-1)
    a = p.parse_args()
    if not torch.cuda.is_available():
        PartialState(cpu=True)  # Accelerate joins CPU ranks (gloo) only when told to
    plugin = DeepSpeedPlugin(hf_ds_config=dict(DS_CONFIG), gradient_accumulation_steps=GAS,
                             gradient_clipping=CLIP)
    accelerator = Accelerator(deepspeed_plugin=plugin)
    model, groups = model_and_groups()
    optimizer = torch.optim.AdamW(groups, lr=LR)
    lr_scheduler = schedule(optimizer, accelerator.num_processes)
    x, y = data(accelerator.num_processes)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y),
                                         batch_size=MICRO, shuffle=False)
    model, optimizer, loader, lr_scheduler = accelerator.prepare(model, optimizer, loader,
                                                                 lr_scheduler)
    ckpt = os.path.join(a.out, "state")
    losses, lrs = train(accelerator, model, optimizer, lr_scheduler, loader, save_dir=ckpt)
    state = accelerator.get_state_dict(model)
    accelerator.load_state(ckpt)
    rest = accelerator.skip_first_batches(loader, SAVE_AT * GAS)
    resumed_losses, resumed_lrs = train(accelerator, model, optimizer, lr_scheduler, rest)
    resumed_state = accelerator.get_state_dict(model)
    rank = accelerator.process_index
    out = {"losses": losses, "lrs": lrs, "resumed_losses": resumed_losses,
           "resumed_lrs": resumed_lrs, "engine": type(model).__name__}
    if rank == 0:
        out["state"] = {k: v.tolist() for k, v in state.items()}
        out["resumed_state"] = {k: v.tolist() for k, v in resumed_state.items()}
    with open(os.path.join(a.out, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
