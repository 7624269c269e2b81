"""DeepSpeed-Chat's step 3 (RLHF with PPO) in miniature, as its program does it, on the model
dschat_sft.py trained: four ZeRO-3 engines in one process, unchanged between DeepSpeed and a
plain PyTorch reference.

What its engine setup and PPO trainer do, in their order: an actor (training config, FusedAdam)
and a reference model (evaluation config, `deepspeed.initialize(model=..., config=...)` without
an optimizer) built by `from_pretrained` under `HfDeepSpeedConfig`; a critic and a reward model
built by `AutoModel.from_config` under `HfDeepSpeedConfig` (so zero.Init partitions them),
wrapped with a value head and loaded from the step-2 checkpoint by gathering each module's
parameters with `GatheredParameters(modifier_rank=0)` and calling `_load_from_state_dict` on
rank 0 only; then per step: every model in eval mode, `actor.module.generate(...,
synced_gpus=True)`, log-probabilities from the actor and the reference, the reward model's end
score and the critic's values through `forward_value` called on the engines, the KL-penalised
rewards and GAE advantages, the clipped policy loss (`actor.backward`, `actor.step`) and the
clipped value loss (`critic.backward`, `critic.step`); at the end the model norms gathered
parameter by parameter, as its trainer prints them.

    python dschat_rlhf.py --make-critic ACTOR_DIR CRITIC_DIR
    torchrun --nproc_per_node 2 -m zerolite.as_deepspeed dschat_rlhf.py \
        --actor ACTOR_DIR --critic CRITIC_DIR --output_dir OUT             # zerolite as DeepSpeed
    python dschat_rlhf.py --reference 2 --actor ... --critic ... --output_dir REF  # 1 process

Writes OUTPUT_DIR/result_rank<N>.json: per step the sequences, reward scores, actor and critic
losses; the final model norms.
"""
import argparse
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dschat_sft import create_hf_model, get_train_ds_config  # noqa: E402  (its utils)

PAD, PROMPT, ANSWER = 1, 4, 4
KL_CTL, CLIP_REWARD, CLIP_RANGE, CLIP_RANGE_VALUE, GAMMA, LAM = 0.1, 5.0, 0.2, 0.2, 1.0, 0.95


class RewardModel(nn.Module):
    """DeepSpeed-Chat's reward / critic model: a transformer body and a value head; the
    trainer calls `forward_value`, never `forward`."""

    def __init__(self, base):
        super().__init__()
        self.config = base.config
        self.v_head = nn.Linear(self.config.word_embed_proj_dim, 1, bias=False)
        self.rwtranrsformer = base  # (sic) DeepSpeed-Chat's attribute name

    def forward_value(self, input_ids, attention_mask=None, prompt_length=0,
                      return_value_only=False, use_cache=False):
        hidden = self.rwtranrsformer(input_ids, attention_mask=attention_mask,
                                     use_cache=use_cache)[0]
        values = self.v_head(hidden).squeeze(-1)
        if return_value_only:
            return values
        ends = attention_mask.sum(dim=1) - 1  # the last real token of each row
        return {"values": values,
                "chosen_end_scores": values.gather(1, ends.unsqueeze(1)).squeeze(1)}


def make_critic(actor_dir, path):
    """The step-2 checkpoint: a value-head model on the actor's body, saved as DeepSpeed-Chat's
    ZeRO-3 save writes it (pytorch_model.bin keyed by the wrapper's names, config.json)."""
    from transformers import AutoModel

    torch.manual_seed(1)
    model = RewardModel(AutoModel.from_pretrained(actor_dir))
    os.makedirs(path, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(path, "pytorch_model.bin"))
    model.config.to_json_file(os.path.join(path, "config.json"))


def get_eval_ds_config(stage):
    return {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 10,
            "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 1e4,
                                  "offload_param": {"device": "none"},
                                  "memory_efficient_linear": False},
            "gradient_clipping": 1.0, "prescale_gradients": False, "wall_clock_breakdown": False}


def load_state_dict_into_model(model, state_dict, zero_stage):
    """DeepSpeed-Chat's loader for ZeRO-3: module by module, gather the module's own
    parameters with modifier_rank=0 and load on rank 0 only."""
    import deepspeed

    error_msgs = []

    def load(module, prefix=""):
        args = (state_dict, prefix, {}, True, [], [], error_msgs)
        if any(key.startswith(prefix) for key in state_dict):
            if zero_stage == 3:
                named = dict(module.named_parameters(prefix=prefix[:-1], recurse=False))
                params = [named[k] for k in state_dict if k in named]
                if params:
                    with deepspeed.zero.GatheredParameters(params, modifier_rank=0):
                        if torch.distributed.get_rank() == 0:
                            module._load_from_state_dict(*args)
            else:
                module._load_from_state_dict(*args)
        for name, child in module._modules.items():
            if child is not None:
                load(child, prefix + name + ".")

    load(model)
    return error_msgs


def create_critic_model(critic_dir, ds_config, zero_stage, with_deepspeed):
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.from_pretrained(critic_dir)
    dschf = None
    if with_deepspeed and ds_config["zero_optimization"]["stage"] == 3:
        from transformers.integrations.deepspeed import HfDeepSpeedConfig

        dschf = HfDeepSpeedConfig(ds_config)  # noqa: F841 (kept alive: Transformers reads it)
    model = RewardModel(AutoModel.from_config(config))
    state = torch.load(os.path.join(critic_dir, "pytorch_model.bin"), map_location="cpu",
                       weights_only=True)
    if with_deepspeed:
        assert not load_state_dict_into_model(model, state, zero_stage)
    else:
        model.load_state_dict(state)
    return model


def gather_log_probs(logits, labels):
    return F.log_softmax(logits, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def prompts_for(step, rank):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randint(3, 50, (2, PROMPT), generator=g)


def experience(actor, ref, reward, critic, prompts, synced):
    """generate_experience: the four models in eval mode, no grad."""
    for m in (actor, ref, reward, critic):
        m.eval()
    with torch.no_grad():
        seq = actor.module.generate(prompts, attention_mask=torch.ones_like(prompts),
                                    max_length=PROMPT + ANSWER, pad_token_id=PAD,
                                    do_sample=False, synced_gpus=synced)
        mask = seq.ne(PAD).long()
        logprobs = gather_log_probs(actor(seq, attention_mask=mask).logits[:, :-1], seq[:, 1:])
        ref_logprobs = gather_log_probs(ref(seq, attention_mask=mask).logits[:, :-1],
                                        seq[:, 1:])
        score = reward.forward_value(seq, mask, prompt_length=PROMPT)["chosen_end_scores"]
        values = critic.forward_value(seq, mask, return_value_only=True)[:, :-1]
    actor.train(), critic.train()
    return {"seq": seq, "mask": mask, "logprobs": logprobs, "ref_logprobs": ref_logprobs,
            "score": score, "values": values}


def advantages_and_returns(exp):
    start = PROMPT - 1
    action_mask = exp["mask"][:, 1:]
    rewards = -KL_CTL * (exp["logprobs"] - exp["ref_logprobs"])
    ends = start + action_mask[:, start:].sum(1)
    clipped = exp["score"].clamp(-CLIP_REWARD, CLIP_REWARD)
    values = exp["values"].clone()
    for j in range(rewards.shape[0]):
        rewards[j, start:ends[j]][-1] += clipped[j]
        rewards[j, ends[j]:] = 0
        values[j, ends[j]:] = 0
    last, advs = 0, []
    length = rewards.shape[1]
    for t in reversed(range(start, length)):
        nxt = values[:, t + 1] if t < length - 1 else 0.0
        delta = rewards[:, t] + GAMMA * nxt - values[:, t]
        last = delta + GAMMA * LAM * last
        advs.append(last)
    advantages = torch.stack(advs[::-1], dim=1)
    return advantages.detach(), advantages + values[:, start:], values


def actor_loss(actor, exp, advantages):
    start, mask = PROMPT - 1, exp["mask"][:, 1:][:, PROMPT - 1:]
    logits = actor(exp["seq"], attention_mask=exp["mask"], use_cache=False).logits
    logprobs = gather_log_probs(logits[:, :-1], exp["seq"][:, 1:])[:, start:]
    ratio = torch.exp((logprobs - exp["logprobs"][:, start:]) * mask)
    loss = torch.max(-advantages * ratio,
                     -advantages * ratio.clamp(1 - CLIP_RANGE, 1 + CLIP_RANGE))
    return (loss * mask).sum() / mask.sum()


def critic_loss(critic, exp, returns, old_values):
    start, mask = PROMPT - 1, exp["mask"][:, 1:][:, PROMPT - 1:]
    values = critic.forward_value(exp["seq"], exp["mask"], return_value_only=True,
                                  use_cache=False)[:, :-1][:, start:]
    old = old_values[:, start:]
    clipped = values.clamp(old - CLIP_RANGE_VALUE, old + CLIP_RANGE_VALUE)
    loss = torch.max((values - returns) ** 2, (clipped - returns) ** 2)
    return 0.5 * (loss * mask).sum() / mask.sum()


def record(exp, a_loss, c_loss):
    return {"seq": exp["seq"].tolist(), "score": exp["score"].tolist(),
            "actor_loss": a_loss, "critic_loss": c_loss}


def main_deepspeed(args):
    import deepspeed
    from deepspeed.ops.adam import FusedAdam
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    deepspeed.init_distributed()
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    train_config = get_train_ds_config(3, "fp32", False)
    train_config.update(train_micro_batch_size_per_gpu=2, train_batch_size=2 * world)
    eval_config = get_eval_ds_config(3)
    eval_config.update(train_micro_batch_size_per_gpu=2, train_batch_size=2 * world)
    for config in (train_config, eval_config):
        # scaled down with the model: a real model's embeddings and head are far above
        # DeepSpeed-Chat's 1e4 elements, so they are gathered and released, not kept
        config["zero_optimization"]["stage3_param_persistence_threshold"] = 0

    actor_model = create_hf_model(args.actor, train_config)
    actor, *_ = deepspeed.initialize(
        model=actor_model, config=train_config,
        optimizer=FusedAdam(actor_model.parameters(), lr=args.lr, betas=(0.9, 0.95)))
    ref, *_ = deepspeed.initialize(model=create_hf_model(args.actor, eval_config),
                                   config=eval_config)
    critic_model = create_critic_model(args.critic, eval_config, 3, True)
    critic, *_ = deepspeed.initialize(
        model=critic_model, config=train_config,
        optimizer=FusedAdam(critic_model.parameters(), lr=args.lr, betas=(0.9, 0.95)))
    reward, *_ = deepspeed.initialize(model=create_critic_model(args.critic, eval_config, 3, True),
                                      config=eval_config)
    steps = []
    for step in range(args.steps):
        exp = experience(actor, ref, reward, critic, prompts_for(step, rank), synced=True)
        advantages, returns, old_values = advantages_and_returns(exp)
        a_loss = actor_loss(actor, exp, advantages)
        actor.backward(a_loss)
        actor.step()
        c_loss = critic_loss(critic, exp, returns, old_values)
        critic.backward(c_loss)
        critic.step()
        steps.append(record(exp, a_loss.item(), c_loss.item()))

    def model_norm(engine):  # the PPO trainer's get_model_norm
        total = 0.0
        with torch.no_grad():
            for p in engine.parameters():
                gather = hasattr(p, "ds_id") and p.ds_status == ZeroParamStatus.NOT_AVAILABLE
                with deepspeed.zero.GatheredParameters(p, enabled=gather):
                    total += float(p.float().norm())
        return total

    result = {"steps": steps, "norms": [model_norm(e) for e in (actor, ref, critic, reward)],
              "ref_optimizer": [type(ref.optimizer).__name__, type(reward.optimizer).__name__]}
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, f"result_rank{rank}.json"), "w") as f:
        json.dump(result, f)


def main_reference(args):
    """The same steps without DeepSpeed, one process replaying `args.reference` ranks."""
    world = args.reference
    actor = create_hf_model(args.actor, None)
    ref = create_hf_model(args.actor, None)
    critic = create_critic_model(args.critic, None, 0, False)
    reward = create_critic_model(args.critic, None, 0, False)
    actor_opt = torch.optim.AdamW(actor.parameters(), lr=args.lr, betas=(0.9, 0.95),
                                  weight_decay=0.0)
    critic_opt = torch.optim.AdamW(critic.parameters(), lr=args.lr, betas=(0.9, 0.95),
                                   weight_decay=0.0)
    results = [{"steps": []} for _ in range(world)]
    for step in range(args.steps):
        exps = [experience(_Engine(actor), ref, reward, critic, prompts_for(step, rank),
                           synced=False) for rank in range(world)]
        losses = []
        for model, opt, loss_fn in ((actor, actor_opt, "actor"), (critic, critic_opt, "critic")):
            opt.zero_grad()
            for rank, exp in enumerate(exps):
                advantages, returns, old_values = advantages_and_returns(exp)
                loss = (actor_loss(model, exp, advantages) if loss_fn == "actor"
                        else critic_loss(model, exp, returns, old_values))
                (loss / world).backward()
                losses.append(loss.item())
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        for rank, exp in enumerate(exps):
            results[rank]["steps"].append(record(exp, losses[rank], losses[world + rank]))
    with torch.no_grad():
        norms = [sum(float(p.float().norm()) for p in m.parameters())
                 for m in (actor, ref, critic, reward)]
    os.makedirs(args.output_dir, exist_ok=True)
    for rank, result in enumerate(results):
        result["norms"] = norms
        with open(os.path.join(args.output_dir, f"result_rank{rank}.json"), "w") as f:
            json.dump(result, f)


class _Engine(nn.Module):
    """The plain actor as the trainer reaches it on an engine: called, and `.module.generate`."""

    def __init__(self, model):
        super().__init__()
        self.module = model

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--make-critic", nargs=2, default=None, metavar=("ACTOR", "CRITIC"))
    p.add_argument("--actor")
    p.add_argument("--critic")
    p.add_argument("--output_dir")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--reference", type=int, default=0)
    p.add_argument("--local_rank", type=int, default=-1)
    return p.parse_args()


if __name__ == "__main__":
    a = parse_args()
    if a.make_critic:
        make_critic(*a.make_critic)
    elif a.reference:
        main_reference(a)
    else:
        main_deepspeed(a)
