"""A Lightning Fabric loop as its users write it for DeepSpeed: `Fabric(strategy=
DeepSpeedStrategy(config=...))`, `fabric.setup`, `fabric.setup_dataloaders`,
`fabric.backward`, `optimizer.step()`, and `fabric.save` / `fabric.load` of a state dict with
a tensor in it. Trains STEPS steps straight, and again as STEPS // 2 steps, save, a new model
and optimizer, load, STEPS // 2 more; records losses and the final (gathered) weights in --out.

    torchrun --nproc_per_node 2 -m zerolite.as_deepspeed fabric_tiny.py --stage 3 --out DIR
    python fabric_tiny.py --out DIR                          # the reference: plain Fabric

The reference is one CPU process on the same global batches (Fabric's DistributedSampler
does not shuffle a sequential loader), clipping with `fabric.clip_gradients`; under DeepSpeed
Fabric refuses that and the clipping goes in the config, as Fabric's docs say.
--cpu-as-cuda: a CUDAAccelerator that places on CPU (lightning_shared.py says why).
"""
import json
import os

import lightning.fabric as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning.fabric.accelerators import CUDAAccelerator

from lightning_shared import cpu_as_cuda, gathered_state, parser

MICRO, CLIP, STEPS = 2, 0.5, 8


def build(fabric):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                          nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    return fabric.setup(model, optimizer)


def loader(fabric, world, start):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(STEPS * MICRO * world, 8, generator=g)
    data = torch.utils.data.TensorDataset(x, torch.sin(x.sum(dim=1, keepdim=True)))
    batch = MICRO if fabric.world_size > 1 or world == 1 else MICRO * world
    dl = fabric.setup_dataloaders(torch.utils.data.DataLoader(data, batch_size=batch))
    return [b for i, b in enumerate(dl) if i >= start]


def train(fabric, model, optimizer, batches, reference, losses):
    for x, y in batches:
        loss = F.mse_loss(model(x), y)
        fabric.backward(loss, model=model)  # Fabric asks for it: this process sets up 3 models
        if reference:
            fabric.clip_gradients(model, optimizer, max_norm=CLIP)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())


def main():
    a = parser().parse_args()
    if a.stage:
        from lightning.fabric.strategies import DeepSpeedStrategy

        config = {"zero_optimization": {"stage": a.stage}, "gradient_clipping": CLIP,
                  "train_micro_batch_size_per_gpu": MICRO}
        fabric = L.Fabric(accelerator=cpu_as_cuda(CUDAAccelerator) if a.cpu_as_cuda else "cuda",
                          devices=int(os.environ.get("WORLD_SIZE", "1")),
                          strategy=DeepSpeedStrategy(config=config))
    else:
        fabric = L.Fabric(accelerator="cpu", devices=1)
    fabric.launch()
    reference = not a.stage

    model, optimizer = build(fabric)
    whole = []
    train(fabric, model, optimizer, loader(fabric, a.world, 0), reference, whole)
    result = {"losses": whole, "state": gathered_state(model, a.stage), "world": fabric.world_size}

    model, optimizer = build(fabric)
    first = []
    train(fabric, model, optimizer, loader(fabric, a.world, 0)[:STEPS // 2], reference, first)
    path = os.path.join(a.out, "half")
    mine = torch.tensor([float(fabric.global_rank), first[-1]])  # differs per rank
    fabric.save(path, {"model": model, "optimizer": optimizer, "step": len(first), "mine": mine})
    model, optimizer = build(fabric)
    state = {"model": model, "optimizer": optimizer, "step": 0, "mine": None}
    fabric.load(path, state)
    second = []
    train(fabric, model, optimizer, loader(fabric, a.world, state["step"]), reference, second)
    result["resumed"] = {"losses": first + second, "state": gathered_state(model, a.stage),
                         "step": state["step"], "mine_back": torch.equal(state["mine"], mine)}
    if a.stage:
        import deepspeed

        result["engine"] = type(model._forward_module).__name__
        result["deepspeed"] = deepspeed.__file__
    with open(os.path.join(a.out, f"rank{fabric.global_rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
