"""A training script in the shape of DeepSpeed's CIFAR-10 tutorial (argparse +
add_config_arguments, --local_rank, engine.local_rank, get_accelerator().device_name(...),
training_data=, the MoE helper import, engine.eval(), the raw module for evaluation,
save/load), on small synthetic images so it needs no download. Unchanged for DeepSpeed.

    zerolite --as-deepspeed --num_procs 2 cifar_style.py --stage 3 --dtype bf16 --out DIR
"""
import argparse
import json
import os

import deepspeed
import torch
import torch.nn as nn
import torch.nn.functional as F
from deepspeed.accelerator import get_accelerator
from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

STEPS, TRAIN_BATCH, GAS, CLASSES, LR = 8, 16, 2, 4, 0.03


def add_argument():
    parser = argparse.ArgumentParser(description="CIFAR-style")
    parser.add_argument("--local_rank", type=int, default=-1,
                        help="local rank passed from distributed launcher")
    parser.add_argument("--dtype", default="fp32", type=str, choices=["bf16", "fp16", "fp32"])
    parser.add_argument("--stage", default=0, type=int, choices=[0, 1, 2, 3])
    parser.add_argument("--moe-param-group", default=False, action="store_true")
    parser.add_argument("--out", required=True)
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


class Images(torch.utils.data.Dataset):
    """3x8x8 noise images with one brighter quadrant; the quadrant is the class."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.y = torch.randint(0, CLASSES, (n,), generator=g)
        self.x = torch.randn(n, 3, 8, 8, generator=g)
        for q in range(CLASSES):
            rows, cols = slice(4 * (q // 2), 4 * (q // 2) + 4), slice(4 * (q % 2), 4 * (q % 2) + 4)
            self.x[self.y == q, :, rows, cols] += 1.0

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, padding=1)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 8, 3, padding=1)
        self.fc1 = nn.Linear(8 * 2 * 2, 32)
        self.fc2 = nn.Linear(32, CLASSES)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def get_ds_config(args):
    return {
        "train_batch_size": TRAIN_BATCH, "gradient_accumulation_steps": GAS,
        "steps_per_print": 2000,
        "optimizer": {"type": "Adam", "params": {"lr": LR, "betas": [0.8, 0.999], "eps": 1e-8,
                                                 "weight_decay": 3e-7}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": LR,
                                                     "warmup_num_steps": 4}},
        "gradient_clipping": 1.0, "prescale_gradients": False,
        "bf16": {"enabled": args.dtype == "bf16"}, "fp16": {"enabled": args.dtype == "fp16"},
        "wall_clock_breakdown": False,
        "zero_optimization": {"stage": args.stage, "allgather_partitions": True,
                              "reduce_scatter": True, "allgather_bucket_size": 50000000,
                              "reduce_bucket_size": 50000000, "overlap_comm": True,
                              "contiguous_gradients": True, "cpu_offload": False},
    }


def create_moe_param_groups(model):
    parameters = {"params": [p for p in model.parameters() if p.requires_grad],
                  "name": "parameters"}
    return split_params_into_different_moe_groups_for_optimizer(parameters)


def main(args):
    deepspeed.init_distributed()
    trainset, testset = Images(STEPS * TRAIN_BATCH, seed=1), Images(32, seed=2)
    torch.manual_seed(0)
    net = Net()
    parameters = filter(lambda p: p.requires_grad, net.parameters())
    if args.moe_param_group:
        parameters = create_moe_param_groups(net)
    model_engine, optimizer, trainloader, __ = deepspeed.initialize(
        args=args, model=net, model_parameters=parameters, training_data=trainset,
        config=get_ds_config(args))
    local_device = get_accelerator().device_name(model_engine.local_rank)
    local_rank = model_engine.local_rank
    target_dtype = None
    if model_engine.bfloat16_enabled():
        target_dtype = torch.bfloat16
    elif model_engine.fp16_enabled():
        target_dtype = torch.half
    criterion = nn.CrossEntropyLoss()

    losses = []
    for i, data in enumerate(trainloader):
        inputs, labels = data[0].to(local_device), data[1].to(local_device)
        if target_dtype is not None:
            inputs = inputs.to(target_dtype)
        outputs = model_engine(inputs)
        loss = criterion(outputs, labels)
        model_engine.backward(loss)
        model_engine.step()
        losses.append(loss.item())

    def evaluate(model):
        images, labels = testset.x.to(local_device), testset.y.to(local_device)
        if target_dtype is not None:
            images = images.to(target_dtype)
        with torch.no_grad():
            return criterion(model(images).float(), labels).item()

    model_engine.eval()
    eval_engine, eval_module = evaluate(model_engine), evaluate(net)  # the tutorial uses net()
    save_dir = os.path.join(args.out, "ckpt")
    model_engine.save_checkpoint(save_dir, client_state={"step": model_engine.global_steps})
    _, client_state = model_engine.load_checkpoint(save_dir)
    with open(os.path.join(args.out, f"rank{local_rank}.json"), "w") as f:
        json.dump({"losses": losses, "eval_engine": eval_engine, "eval_module": eval_module,
                   "eval_after_load": evaluate(model_engine), "client_state": client_state,
                   "global_steps": model_engine.global_steps}, f)


if __name__ == "__main__":
    main(add_argument())
