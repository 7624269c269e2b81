"""A PyTorch Lightning program as its users write it for DeepSpeed: a LightningModule with
AdamW (DeepSpeedCPUAdam under an offload strategy, as Lightning's docs have it) and a
per-step LambdaLR scheduler, `Trainer(strategy=DeepSpeedStrategy(stage=N),
accumulate_grad_batches=2, gradient_clip_val=0.5)`, a ModelCheckpoint callback, and a resume
from the checkpoint the Trainer saved; with --configure-model the layers are built in
`configure_model` (inside deepspeed.zero.Init under stage 3). Records per-batch losses, the
learning rates and the final (gathered) weights in --out.

    torchrun --nproc_per_node 2 -m zerolite.as_deepspeed lightning_tiny.py --stage 3 --out DIR
    python lightning_tiny.py --out DIR                      # the reference: plain Lightning

Without --stage it is the reference: one CPU process, `strategy="auto"`, a batch of
MICRO * --world samples, the same global batch the ranks see together (see `loader`).

--cpu-as-cuda: a CUDAAccelerator that places on CPU (lightning_shared.py says why).
"""
import json
import os

import lightning.pytorch as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning.pytorch.accelerators import CUDAAccelerator
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from lightning_shared import cpu_as_cuda, gathered_state, parser

MICRO, GAS, CLIP, BATCHES = 2, 2, 0.5, 12


class Regressor(pl.LightningModule):
    """[Note: the reference divides its loss by GAS] Lightning divides the training_step loss
    by accumulate_grad_batches for every strategy, and DeepSpeed's engine.backward divides it
    by gradient_accumulation_steps again (Lightning puts the same number in the config), so
    under DeepSpeed the gradient is the single-process one / GAS; with clipping active that
    shows in the weights. `loss_divisor=GAS` gives the reference DeepSpeed's gradient."""

    def __init__(self, lr: float = 1e-2, loss_divisor: int = 1, in_configure_model=False,
                 cpu_adam=False):
        super().__init__()
        self.save_hyperparameters()
        self.last_loss = None
        self.partitioned_at_build = False  # every parameter 0-element right after it was made
        if not in_configure_model:
            self._build()

    def _build(self):
        self.body = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh())
        self.head = nn.Linear(32, 1)

    def configure_model(self):
        """Lightning's way to build a large model: under stage 3 this runs inside
        deepspeed.zero.Init, so each parameter is partitioned as it is made."""
        if self.hparams.in_configure_model and not hasattr(self, "head"):
            torch.manual_seed(0)
            self._build()
            self.partitioned_at_build = all(p.numel() == 0 for p in self.parameters())

    def forward(self, x):
        return self.head(self.body(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss)
        self.last_loss = float(loss)
        return loss / self.hparams.loss_divisor

    def configure_optimizers(self):
        if self.hparams.cpu_adam:
            # With the optimizer offloaded DeepSpeed refuses a torch optimizer; Lightning's
            # docs have users return DeepSpeedCPUAdam (AdamW's update) there.
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            opt = DeepSpeedCPUAdam(self.parameters(), lr=self.hparams.lr, weight_decay=0.01)
        else:
            opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class Record(Callback):
    def __init__(self):
        self.losses, self.lrs = [], []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(pl_module.last_loss)
        self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])


def loader(world: int, reference: bool):
    """The ranks' loader as users write it; Lightning gives each rank a DistributedSampler
    (shuffle=True, seed 0, set_epoch every epoch). The reference's sampler is that sampler at
    one replica, so its batch k holds what the ranks' batches k hold together."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(BATCHES * MICRO * world, 8, generator=g)
    data = torch.utils.data.TensorDataset(x, torch.sin(x.sum(dim=1, keepdim=True)))
    if not reference:
        return torch.utils.data.DataLoader(data, batch_size=MICRO)
    sampler = torch.utils.data.DistributedSampler(data, num_replicas=1, rank=0, shuffle=True,
                                                  seed=0)
    return torch.utils.data.DataLoader(data, batch_size=MICRO * world, sampler=sampler)


def fit(a, epochs, ckpt_dir, resume_from=None):
    torch.manual_seed(0)
    model = Regressor(loss_divisor=1 if a.stage else GAS, in_configure_model=a.configure_model,
                      cpu_adam="offload" in (a.strategy or ""))
    record = Record()
    checkpoint = ModelCheckpoint(dirpath=ckpt_dir, monitor="train_loss", save_last=False)
    if a.stage:
        from lightning.pytorch.strategies import DeepSpeedStrategy

        # By name as users pick it ("deepspeed_stage_3_offload"), or the class with a stage.
        strategy = a.strategy or DeepSpeedStrategy(stage=a.stage)
        accelerator = cpu_as_cuda(CUDAAccelerator) if a.cpu_as_cuda else "gpu"
        devices = int(os.environ.get("WORLD_SIZE", "1"))
    else:
        strategy, accelerator, devices = "auto", "cpu", 1
    trainer = pl.Trainer(accelerator=accelerator, devices=devices, strategy=strategy,
                         max_epochs=epochs, accumulate_grad_batches=GAS, precision=a.precision,
                         gradient_clip_val=CLIP, callbacks=[record, checkpoint], logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0)
    trainer.fit(model, loader(a.world, reference=not a.stage), ckpt_path=resume_from)
    return trainer, model, record, checkpoint


def main():
    p = parser()
    p.add_argument("--configure-model", dest="configure_model", action="store_true",
                   help="build the layers in LightningModule.configure_model")
    p.add_argument("--strategy", default=None,
                   help="a registered strategy name instead of DeepSpeedStrategy(stage=...)")
    p.add_argument("--precision", default="32-true", help="Trainer(precision=...)")
    a = p.parse_args()
    trainer, model, record, _ = fit(a, 2, os.path.join(a.out, "whole"))
    result = {"losses": record.losses, "lrs": record.lrs, "world": trainer.world_size,
              "partitioned_at_build": model.partitioned_at_build,
              "state": gathered_state(model, a.stage), "global_step": trainer.global_step,
              "dtype": str(next(model.parameters()).dtype)}
    # Stop after the first epoch, save through the Trainer, resume in a new Trainer.
    half, ckpt_dir = os.path.join(a.out, "half.ckpt"), os.path.join(a.out, "resumed")
    trainer, model, first, _ = fit(a, 1, ckpt_dir)
    trainer.save_checkpoint(half)
    trainer, model, second, checkpoint = fit(a, 2, ckpt_dir, half)
    result["resumed"] = {"losses": first.losses + second.losses, "lrs": first.lrs + second.lrs,
                         "state": gathered_state(model, a.stage),
                         "global_step": trainer.global_step,
                         "best_model_score": float(checkpoint.best_model_score)}
    if a.stage:
        import deepspeed

        engine = trainer.strategy.model
        result["engine"] = type(engine).__name__
        result["offload"] = [engine.zero_cpu_offload(), engine.zero_offload_param() is not None]
        result["deepspeed"] = deepspeed.__file__
    with open(os.path.join(a.out, f"rank{trainer.global_rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
