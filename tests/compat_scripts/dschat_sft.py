"""DeepSpeed-Chat's step 1 (supervised fine-tuning) as its users run it, on a tiny OPT built
locally (no hub downloads), unchanged between DeepSpeed ZeRO-3 and a plain PyTorch reference.

What DeepSpeed-Chat's step-1 program does, in its order: `deepspeed.add_config_arguments`,
`deepspeed.init_distributed()`, a config dict built in code ("hybrid_engine" and "tensorboard"
blocks switched off, stage-3 knobs, gradient clipping), `HfDeepSpeedConfig(ds_config)` kept
alive while `from_pretrained` builds the model (so Transformers partitions it with
`deepspeed.zero.Init`), `resize_token_embeddings` to a multiple of 8 (Transformers gathers
and swaps the embedding under ZeRO-3), weight-decay parameter groups, `FusedAdam` with
betas (0.9, 0.95), a Transformers cosine schedule, `deepspeed.initialize(model, optimizer,
args, config, lr_scheduler, dist_init_required=True)`, perplexity before and after with
`torch.distributed.all_reduce`, `model.backward` / `model.step`,
`model.tput_timer.update_epoch_count()`, then the two saves: `save_hf_format` on rank 0 (the
module's state_dict) and its ZeRO-3 save (every rank: `named_parameters`, `ds_id`,
`ds_status == NOT_AVAILABLE`, `GatheredParameters`, `v.data.cpu()`).

    python dschat_sft.py --make-init DIR
    torchrun --nproc_per_node 2 -m zerolite.as_deepspeed dschat_sft.py \
        --model_name_or_path DIR --zero_stage 3 --output_dir OUT       # zerolite as DeepSpeed
    python dschat_sft.py --reference 2 --init_state OUT/init/pytorch_model.bin \
        --model_name_or_path DIR --output_dir REF                      # plain PyTorch, 1 process

The reference has no DeepSpeed: it replays the ranks' DistributedSampler batches as one
global batch (each emulated rank's loss separately, gradients averaged as data parallelism
does), torch AdamW on the same groups, the same clipping and schedule. It starts from the
weights the DeepSpeed run had after `resize_token_embeddings` (the added rows are random
draws, and how many draws came before them differs between the two programs), which the
DeepSpeed run writes with its own ZeRO-3 save before training.

Writes OUTPUT_DIR/result_rank<N>.json (losses, learning rates, perplexities) and the model
(OUTPUT_DIR/pytorch_model.bin, config.json).
"""
import argparse
import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

VOCAB = 50          # the pretrained vocabulary; the "tokenizer" adds 3 special tokens
TOKENIZER_LEN = VOCAB + 3
SEQ = 16
NO_DECAY = ["bias", "layer_norm.weight", "layernorm.weight", "norm.weight", "ln_f.weight"]
LORA_NAMES = ["lora_right_weight", "lora_left_weight"]


def make_init(path):
    """A tiny OPT (2 layers, head tied to the embedding, no dropout), saved to `path`."""
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(0)
    cfg = OPTConfig(vocab_size=VOCAB, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                    num_attention_heads=2, max_position_embeddings=64, word_embed_proj_dim=32,
                    dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, layerdrop=0.0,
                    pad_token_id=1, bos_token_id=2, eos_token_id=2)
    OPTForCausalLM(cfg).save_pretrained(path)


class PromptDataset(Dataset):
    """Fixed-length rows (no padding, so every rank's loss averages the same token count):
    counting sequences with a per-row stride, which a tiny model learns in a few steps."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        starts = torch.randint(3, VOCAB, (n,), generator=g)
        strides = torch.randint(1, 4, (n,), generator=g)
        pos = torch.arange(SEQ)
        self.rows = 3 + (starts[:, None] + strides[:, None] * pos) % (VOCAB - 3)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        ids = self.rows[i]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def get_train_ds_config(stage, dtype, offload):
    """DeepSpeed-Chat's training config, as its utils build it."""
    device = "cpu" if offload else "none"
    config = {
        "train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 10,
        "zero_optimization": {
            "stage": stage, "overlap_comm": True, "offload_param": {"device": device},
            "offload_optimizer": {"device": device},
            "stage3_param_persistence_threshold": 1e4, "stage3_max_live_parameters": 3e7,
            "stage3_prefetch_bucket_size": 3e7, "memory_efficient_linear": False},
        "gradient_clipping": 1.0, "prescale_gradients": False, "wall_clock_breakdown": False,
        "hybrid_engine": {"enabled": False, "max_out_tokens": 512, "inference_tp_size": 1,
                          "release_inference_cache": False, "pin_parameters": True,
                          "tp_gather_partition_size": 8},
        "tensorboard": {"enabled": False, "output_path": "/tmp/ds_tensorboard_logs/",
                        "job_name": "step1_tensorboard"},
    }
    if dtype == "bf16":
        config["bfloat16"] = {"enabled": True}
    return config


def get_optimizer_grouped_parameters(model, weight_decay, lora_lr):
    """DeepSpeed-Chat's groups: decayed, LoRA (its own learning rate), not decayed."""
    def lora(n):
        return any(nd in n.lower() for nd in LORA_NAMES)

    def no_decay(n):
        return any(nd in n.lower() for nd in NO_DECAY)

    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for n, p in named if not no_decay(n) and not lora(n)],
         "weight_decay": weight_decay},
        {"params": [p for n, p in named if not no_decay(n) and lora(n)],
         "weight_decay": weight_decay, "lr": lora_lr},
        {"params": [p for n, p in named if no_decay(n)], "weight_decay": 0.0},
    ]
    return [g for g in groups if g["params"]]


class LinearLayer_LoRA(nn.Module):
    """DeepSpeed-Chat's LoRA layer: it takes over the Linear's (ZeRO-3 partitioned) weight and
    bias, sizes its factors from `weight.ds_shape`, freezes the weight, and can fuse."""

    def __init__(self, weight, lora_dim, lora_scaling=1, bias=None):
        super().__init__()
        self.weight = weight
        self.bias = bias
        try:
            rows, columns = weight.ds_shape  # for zero stage 3
        except AttributeError:
            rows, columns = weight.shape
        self.lora_right_weight = nn.Parameter(torch.zeros(columns, lora_dim))
        self.lora_left_weight = nn.Parameter(torch.zeros(lora_dim, rows))
        self.lora_scaling = lora_scaling / lora_dim
        nn.init.kaiming_uniform_(self.lora_right_weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_left_weight)
        self.weight.requires_grad = False
        self.fuse_lora = False

    def train(self, mode=True):  # as DeepSpeed-Chat's: returns nothing
        pass

    def eval(self):
        pass

    def fuse_lora_weight(self):
        if not self.fuse_lora:
            self.weight.data += self.lora_scaling * torch.matmul(self.lora_left_weight.t(),
                                                                 self.lora_right_weight.t())
        self.fuse_lora = True

    def forward(self, input):
        if self.fuse_lora:
            return F.linear(input, self.weight, self.bias)
        return F.linear(input, self.weight, self.bias) + (
            input @ self.lora_right_weight @ self.lora_left_weight) * self.lora_scaling


def module_helpers(with_deepspeed):
    if with_deepspeed:  # where DeepSpeed-Chat imports them from
        from deepspeed.compression.helper import recursive_getattr, recursive_setattr
        return recursive_getattr, recursive_setattr

    def getter(model, name):
        for part in name.split("."):
            model = getattr(model, part)
        return model

    def setter(model, name, module):
        parent, _, leaf = name.rpartition(".")
        setattr(getter(model, parent) if parent else model, leaf, module)

    return getter, setter


def convert_linear_layer_to_lora(model, part_module_name, lora_dim, with_deepspeed):
    getter, setter = module_helpers(with_deepspeed)
    names = [n for n, m in model.named_modules()
             if isinstance(m, nn.Linear) and part_module_name in n]
    for name in names:
        module = getter(model, name)
        layer = LinearLayer_LoRA(module.weight, lora_dim, bias=module.bias)
        setter(model, name, layer.to(module.weight.device).to(module.weight.dtype))
    return model


def only_optimize_lora_parameters(model):
    for name, param in model.named_parameters():
        param.requires_grad = any(n in name for n in LORA_NAMES)
    return model


def convert_lora_to_linear_layer(model, with_deepspeed):
    """Fuse every LoRA layer (under ZeRO-3 inside GatheredParameters(modifier_rank=0))."""
    getter, _ = module_helpers(with_deepspeed)
    for name in [n for n, m in model.named_modules() if isinstance(m, LinearLayer_LoRA)]:
        module = getter(model, name)
        if not with_deepspeed:
            module.fuse_lora_weight()
            continue
        import deepspeed
        from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

        params = [p for p in (module.weight, module.bias, module.lora_left_weight,
                              module.lora_right_weight)
                  if hasattr(p, "ds_id") and p.ds_status == ZeroParamStatus.NOT_AVAILABLE]
        with deepspeed.zero.GatheredParameters(params, modifier_rank=0,
                                               enabled=hasattr(module.weight, "ds_id")):
            module.fuse_lora_weight()
    return model


def create_hf_model(model_name_or_path, ds_config):
    from transformers import AutoConfig, AutoModelForCausalLM

    model_config = AutoConfig.from_pretrained(model_name_or_path)
    dschf = None
    if ds_config is not None and ds_config["zero_optimization"]["stage"] == 3:
        from transformers.integrations.deepspeed import HfDeepSpeedConfig

        dschf = HfDeepSpeedConfig(ds_config)  # noqa: F841 (kept alive: Transformers reads it)
    model = AutoModelForCausalLM.from_pretrained(model_name_or_path, config=model_config)
    model.config.end_token_id = model.config.eos_token_id
    model.config.pad_token_id = model.config.eos_token_id
    model.resize_token_embeddings(int(8 * math.ceil(TOKENIZER_LEN / 8.0)))
    return model


def save_zero_three_model(model, global_rank, save_dir, zero_stage, keep_lora=False):
    """DeepSpeed-Chat's save for ZeRO-3: gather one parameter at a time, keep a CPU view, leave
    out LoRA factors (`keep_lora`: the starting state written for the reference keeps them)."""
    import deepspeed
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    def to_fetch(params):
        return [p for p in params
                if hasattr(p, "ds_id") and p.ds_status == ZeroParamStatus.NOT_AVAILABLE]

    os.makedirs(save_dir, exist_ok=True)
    model_to_save = model.module if hasattr(model, "module") else model
    out = {}
    for k, v in model_to_save.named_parameters():
        if hasattr(v, "ds_id"):
            with deepspeed.zero.GatheredParameters(to_fetch([v]), enabled=zero_stage == 3):
                v_p = v.data.cpu()
        else:
            v_p = v.cpu()
        if global_rank == 0 and (keep_lora or "lora" not in k):
            out[k] = v_p
    if global_rank == 0:
        torch.save(out, os.path.join(save_dir, "pytorch_model.bin"))


def save_hf_format(model, output_dir):
    model_to_save = model.module if hasattr(model, "module") else model
    os.makedirs(output_dir, exist_ok=True)
    torch.save(model_to_save.state_dict(), os.path.join(output_dir, "pytorch_model.bin"))
    model_to_save.config.to_json_file(os.path.join(output_dir, "config.json"))


def parse_args(with_deepspeed):
    parser = argparse.ArgumentParser()
    parser.add_argument("--make-init", default=None)
    parser.add_argument("--model_name_or_path")
    parser.add_argument("--output_dir")
    parser.add_argument("--per_device_train_batch_size", type=int, default=2)
    parser.add_argument("--per_device_eval_batch_size", type=int, default=4)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--num_train_epochs", type=int, default=2)
    parser.add_argument("--train_rows", type=int, default=24)
    parser.add_argument("--learning_rate", type=float, default=5e-3)
    parser.add_argument("--weight_decay", type=float, default=0.1)
    parser.add_argument("--num_warmup_steps", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--zero_stage", type=int, default=0)
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--offload", action="store_true")
    parser.add_argument("--gradient_checkpointing", action="store_true")
    parser.add_argument("--lora_dim", type=int, default=0)
    parser.add_argument("--lora_module_name", default="decoder.layers.")
    parser.add_argument("--only_optimize_lora", action="store_true")
    parser.add_argument("--lora_learning_rate", type=float, default=5e-3)
    parser.add_argument("--reference", type=int, default=0,
                        help="no DeepSpeed: one process replaying this many ranks' batches")
    parser.add_argument("--init_state", default=None)
    if with_deepspeed:
        import deepspeed

        parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def set_random_seed(seed, accelerator=None):
    import random

    import numpy as np
    from transformers import set_seed

    set_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if accelerator is not None:
        accelerator.manual_seed_all(seed)


def loaders(args, world, rank):
    from transformers import default_data_collator

    train, evaluation = PromptDataset(args.train_rows, 0), PromptDataset(8, 1)
    train_sampler = DistributedSampler(train, num_replicas=world, rank=rank)
    eval_sampler = DistributedSampler(evaluation, num_replicas=world, rank=rank)
    return (DataLoader(train, collate_fn=default_data_collator, sampler=train_sampler,
                       batch_size=args.per_device_train_batch_size),
            DataLoader(evaluation, collate_fn=default_data_collator, sampler=eval_sampler,
                       batch_size=args.per_device_eval_batch_size))


def main_deepspeed(args):
    import deepspeed
    from deepspeed.accelerator import get_accelerator
    from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam
    from transformers import get_scheduler

    get_accelerator().set_device(max(args.local_rank, 0))
    device = torch.device(get_accelerator().device_name(), max(args.local_rank, 0))
    deepspeed.init_distributed()
    args.global_rank = torch.distributed.get_rank()
    world = torch.distributed.get_world_size()

    ds_config = get_train_ds_config(args.zero_stage, args.dtype, args.offload)
    ds_config["train_micro_batch_size_per_gpu"] = args.per_device_train_batch_size
    ds_config["train_batch_size"] = (args.per_device_train_batch_size * world
                                     * args.gradient_accumulation_steps)
    set_random_seed(args.seed, get_accelerator())
    torch.distributed.barrier()

    model = create_hf_model(args.model_name_or_path, ds_config)
    if args.lora_dim > 0:
        model = convert_linear_layer_to_lora(model, args.lora_module_name, args.lora_dim, True)
        if args.only_optimize_lora:
            model = only_optimize_lora_parameters(model)
    save_zero_three_model(model, args.global_rank, os.path.join(args.output_dir, "init"),
                          args.zero_stage, keep_lora=True)
    train_dataloader, eval_dataloader = loaders(args, world, args.global_rank)

    def evaluation(model, eval_dataloader):
        model.eval()
        losses = 0
        for step, batch in enumerate(eval_dataloader):
            batch = {k: v.to(device) for k, v in batch.items()}
            with torch.no_grad():
                outputs = model(**batch)
            losses += outputs.loss.float()
        losses = losses / (step + 1)
        perplexity = torch.exp(losses)
        torch.distributed.all_reduce(perplexity, op=torch.distributed.ReduceOp.SUM)
        return (perplexity / torch.distributed.get_world_size()).item()

    groups = get_optimizer_grouped_parameters(model, args.weight_decay, args.lora_learning_rate)
    AdamOptimizer = DeepSpeedCPUAdam if args.offload else FusedAdam
    optimizer = AdamOptimizer(groups, lr=args.learning_rate, betas=(0.9, 0.95))
    updates_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    lr_scheduler = get_scheduler(name="cosine", optimizer=optimizer,
                                 num_warmup_steps=args.num_warmup_steps,
                                 num_training_steps=args.num_train_epochs * updates_per_epoch)
    model, optimizer, _, lr_scheduler = deepspeed.initialize(
        model=model, optimizer=optimizer, args=args, config=ds_config,
        lr_scheduler=lr_scheduler, dist_init_required=True)
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()

    result = {"ppl": [evaluation(model, eval_dataloader)], "loss": [], "lr": [], "tput": [],
              "epochs": None, "bf16": model.bfloat16_enabled(),
              "param_dtype": str(next(model.module.parameters()).dtype),
              "checkpointing": model.module.is_gradient_checkpointing}
    for _epoch in range(args.num_train_epochs):
        model.train()
        for batch in train_dataloader:
            batch = {k: v.to(device) for k, v in batch.items()}
            outputs = model(**batch, use_cache=False)
            loss = outputs.loss
            model.backward(loss)
            model.step()
            result["loss"].append(loss.item())
            result["lr"].append(lr_scheduler.get_last_lr()[0])
        result["ppl"].append(evaluation(model, eval_dataloader))
        timer = model.tput_timer
        result["tput"].append([timer.micro_step_count, timer.global_step_count,
                               timer.avg_samples_per_sec()])
        timer.update_epoch_count()
    result["epochs"] = model.tput_timer.epoch_count

    if args.lora_dim > 0:
        model = convert_lora_to_linear_layer(model, True)
    if args.global_rank == 0:
        save_hf_format(model, args.output_dir)
    if args.zero_stage == 3:
        save_zero_three_model(model, args.global_rank, args.output_dir, args.zero_stage)
    with open(os.path.join(args.output_dir, f"result_rank{args.global_rank}.json"), "w") as f:
        json.dump(result, f)


def main_reference(args):
    """The same program without DeepSpeed, one process, `args.reference` ranks' batches."""
    from transformers import get_scheduler

    world = args.reference
    set_random_seed(args.seed)
    model = create_hf_model(args.model_name_or_path, None)
    if args.lora_dim > 0:
        model = convert_linear_layer_to_lora(model, args.lora_module_name, args.lora_dim, False)
        if args.only_optimize_lora:
            model = only_optimize_lora_parameters(model)
    if args.init_state:
        state = torch.load(args.init_state, map_location="cpu", weights_only=True)
        params = dict(model.named_parameters())
        assert sorted(state) == sorted(params), (sorted(state), sorted(params))
        with torch.no_grad():
            for name, value in state.items():
                params[name].copy_(value)
    per_rank = [loaders(args, world, r) for r in range(world)]

    def evaluation():
        model.eval()
        ppl = []
        for _train, eval_dataloader in per_rank:
            losses = 0
            for step, batch in enumerate(eval_dataloader):
                with torch.no_grad():
                    losses += model(**batch).loss.float()
            ppl.append(torch.exp(losses / (step + 1)))
        return (sum(ppl) / world).item()

    groups = get_optimizer_grouped_parameters(model, args.weight_decay, args.lora_learning_rate)
    optimizer = torch.optim.AdamW(groups, lr=args.learning_rate, betas=(0.9, 0.95), eps=1e-8)
    steps_per_epoch = len(per_rank[0][0])
    updates_per_epoch = math.ceil(steps_per_epoch / args.gradient_accumulation_steps)
    lr_scheduler = get_scheduler(name="cosine", optimizer=optimizer,
                                 num_warmup_steps=args.num_warmup_steps,
                                 num_training_steps=args.num_train_epochs * updates_per_epoch)
    gas = args.gradient_accumulation_steps
    results = [{"ppl": [evaluation()], "loss": [], "lr": []} for _ in range(world)]
    for _epoch in range(args.num_train_epochs):
        model.train()
        micro = 0
        for batches in zip(*(train for train, _eval in per_rank)):
            for rank, batch in enumerate(batches):
                loss = model(**batch, use_cache=False).loss
                (loss / (world * gas)).backward()
                results[rank]["loss"].append(loss.item())
            micro += 1
            if micro % gas == 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            for rank in range(world):
                results[rank]["lr"].append(lr_scheduler.get_last_lr()[0])
        ppl = evaluation()
        for rank in range(world):
            results[rank]["ppl"].append(ppl)
    if args.lora_dim > 0:
        model = convert_lora_to_linear_layer(model, False)
    os.makedirs(args.output_dir, exist_ok=True)
    torch.save({k: v.detach() for k, v in model.named_parameters() if "lora" not in k},
               os.path.join(args.output_dir, "pytorch_model.bin"))
    for rank, result in enumerate(results):
        with open(os.path.join(args.output_dir, f"result_rank{rank}.json"), "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    import sys

    if "--make-init" in sys.argv:
        make_init(sys.argv[sys.argv.index("--make-init") + 1])
    elif "--reference" in sys.argv:
        main_reference(parse_args(with_deepspeed=False))
    else:
        main_deepspeed(parse_args(with_deepspeed=True))
