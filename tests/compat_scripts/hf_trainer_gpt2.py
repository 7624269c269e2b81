"""A Hugging Face Trainer script, unchanged between DeepSpeed and plain PyTorch: a small GPT-2
from a saved checkpoint (`from_pretrained`, so ZeRO-3 builds it under zero.Init), trained,
evaluated, saved, then trained again resuming from the Trainer checkpoint of step --save_steps;
first of all a Trainer that only evaluates and predicts.

    torchrun --nproc_per_node 2 -m zerolite.as_deepspeed hf_trainer_gpt2.py --init DIR \
        --out DIR --deepspeed ds_config.json --per_device 2     # zerolite as DeepSpeed
    python hf_trainer_gpt2.py --init DIR --out DIR --per_device 4  # the reference (1 process)

Writes --out/result_rank<N>.json: per-micro-batch losses of both runs and the eval loss.
"""
import argparse
import json
import os

import torch
import torch.nn.functional as F
from transformers import GPT2LMHeadModel, Trainer, TrainingArguments

SEQ, VOCAB = 16, 128
GLOBAL_BATCH = 8  # per_device x gas x world: one epoch is --steps optimizer steps


class Tokens(torch.utils.data.Dataset):
    """Rows that count up from a random start with a random stride (easy to learn)."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (n, 1), generator=g)
        stride = torch.randint(1, 5, (n, 1), generator=g)
        self.rows = (start + stride * torch.arange(SEQ)) % VOCAB

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


class RecordingTrainer(Trainer):
    """Records each training micro-batch's mean token loss, recomputed from the logits so it
    does not depend on how the Trainer normalises the loss it back-propagates."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.micro_losses = []

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True,
                                             num_items_in_batch=num_items_in_batch)
        if model.training:
            logits = outputs.logits[:, :-1].float()
            labels = inputs["labels"][:, 1:]
            self.micro_losses.append(F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     labels.reshape(-1)).item())
        return (loss, outputs) if return_outputs else loss


def make_args(out, a, **extra):
    return TrainingArguments(
        output_dir=out, per_device_train_batch_size=a.per_device,
        per_device_eval_batch_size=a.per_device, gradient_accumulation_steps=a.gas,
        max_steps=a.steps, learning_rate=3e-3, weight_decay=0.0, warmup_steps=0,
        lr_scheduler_type="linear", max_grad_norm=1.0, logging_steps=1, save_strategy="steps",
        save_steps=a.save_steps, save_only_model=False, report_to=[], seed=0,
        train_sampling_strategy="sequential", dataloader_num_workers=0,
        deepspeed=a.deepspeed, disable_tqdm=True,
        use_cpu=not torch.cuda.is_available(),  # accelerate runs ranks on CPU only when asked
        **extra)


def offload_facts(engine):
    """What the engine says about offload, through DeepSpeed's accessors (None without one)."""
    if not hasattr(engine, "zero_cpu_offload"):
        return None
    param = engine.zero_offload_param()
    return {"cpu_offload": engine.zero_cpu_offload(),
            "cpu_optimizer": engine.zero_use_cpu_optimizer(),
            "param_device": param["device"] if param else "none",
            "optimizer_class": type(engine.optimizer.optimizer).__name__}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--init", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--deepspeed", default=None)
    p.add_argument("--per_device", type=int, default=4)
    p.add_argument("--gas", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--save_steps", type=int, default=3)
    p.add_argument("--local_rank", type=int, default=-1)
    a = p.parse_args()
    train, evals = Tokens(a.steps * GLOBAL_BATCH, seed=1), Tokens(16, seed=2)

    # Evaluation and prediction before any training (a Trainer that never trains: Transformers
    # initializes DeepSpeed in inference mode, an engine without an optimizer).
    eval_args = make_args(os.path.join(a.out, "eval_only"), a)
    evaluator = Trainer(model=GPT2LMHeadModel.from_pretrained(a.init), args=eval_args,
                        eval_dataset=evals)
    eval_only_loss = evaluator.evaluate()["eval_loss"]
    predicted = torch.as_tensor(evaluator.predict(evals).predictions)
    eval_engine = type(evaluator.model_wrapped).__name__
    eval_optimizer = getattr(evaluator.model_wrapped, "optimizer", None)
    del evaluator

    first = os.path.join(a.out, "run")
    args = make_args(first, a)  # before from_pretrained: ZeRO-3 builds the model in zero.Init
    model = GPT2LMHeadModel.from_pretrained(a.init)
    trainer = RecordingTrainer(model=model, args=args, train_dataset=train, eval_dataset=evals)
    trainer.train()
    eval_loss = trainer.evaluate()["eval_loss"]
    trainer.save_model(os.path.join(a.out, "final"))
    losses = trainer.micro_losses

    resumed_args = make_args(os.path.join(a.out, "resumed"), a)
    model = GPT2LMHeadModel.from_pretrained(a.init)
    trainer = RecordingTrainer(model=model, args=resumed_args, train_dataset=train)
    trainer.train(resume_from_checkpoint=os.path.join(first, f"checkpoint-{a.save_steps}"))
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    with open(os.path.join(a.out, f"result_rank{rank}.json"), "w") as f:
        json.dump({"losses": losses, "resumed": trainer.micro_losses, "eval_loss": eval_loss,
                   "eval_only_loss": eval_only_loss, "eval_engine": eval_engine,
                   "eval_optimizer": type(eval_optimizer).__name__,
                   "predicted": {"shape": list(predicted.shape),
                                 "argmax": predicted.argmax(-1).tolist(),
                                 "sum": float(predicted.double().sum())},
                   "engine": type(trainer.model_wrapped).__name__,
                   "offload": offload_facts(trainer.model_wrapped)}, f)


if __name__ == "__main__":
    main()
