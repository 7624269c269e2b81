"""TRL's SFTTrainer and GRPOTrainer on a tiny Qwen2 and a character-level tokenizer, unchanged
between DeepSpeed ZeRO-3 and plain PyTorch (no hub downloads: `--make-init DIR` writes both).

    python trl_tiny.py --make-init DIR                        # the model and tokenizer
    torchrun --nproc_per_node 2 -m zerolite.as_deepspeed trl_tiny.py sft --init DIR --out DIR \
        --deepspeed ds_config.json --per_device 2             # zerolite as DeepSpeed
    python trl_tiny.py sft --init DIR --out DIR --per_device 4  # the reference (1 process)
    ... trl_tiny.py grpo [--no-gather] ...                    # GRPO, generating every step

Writes --out/result_rank<N>.json: the Trainer's log history, plus what the ZeRO-3 engine says
about its parameters after each generation and the unit gathers of each step (GRPO), and
around sampling from the trained model through TRL's `unwrap_model_for_generation` (SFT).
"""
import argparse
import json
import os

import torch

CHARS = "abcdefghij "
SPECIAL = ["<pad>", "<eos>", "<unk>"]


def make_init(path):
    """A tiny Qwen2 (2 layers, untied head) and a character tokenizer, saved to `path`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    vocab = {t: i for i, t in enumerate(SPECIAL + list(CHARS))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    fast.save_pretrained(path)
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(vocab), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      max_position_embeddings=64, tie_word_embeddings=False,
                      pad_token_id=0, eos_token_id=1, bos_token_id=1)
    Qwen2ForCausalLM(cfg).save_pretrained(path)


def texts(n, seed):
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        start = int(torch.randint(0, 10, (1,), generator=g))
        rows.append("".join(CHARS[(start + k) % 10] for k in range(12)))
    return rows


def common_args(a):
    return dict(output_dir=os.path.join(a.out, "run"), per_device_train_batch_size=a.per_device,
                gradient_accumulation_steps=a.gas, max_steps=a.steps, learning_rate=3e-3,
                weight_decay=0.0, warmup_steps=0, lr_scheduler_type="linear", max_grad_norm=1.0,
                logging_steps=1, save_strategy="no", report_to=[], seed=0,
                train_sampling_strategy="sequential", dataloader_num_workers=0,
                deepspeed=a.deepspeed, disable_tqdm=True, bf16=a.bf16,
                gradient_checkpointing=a.checkpointing, use_cpu=not torch.cuda.is_available())


def param_facts(engine):
    """What the ZeRO-3 engine's parameters say (None for a plain model or DDP)."""
    params = list(engine.module.parameters()) if hasattr(engine, "module") else []
    if not params or not hasattr(params[0], "ds_status"):
        return None
    offload = engine.optimizer.parameter_offload
    return {"status": sorted({p.ds_status.name for p in params}),
            "numel": sum(p.numel() for p in params),
            "hooks": [len(offload.forward_hooks), len(offload.backward_hooks)],
            "trace_invalid": offload.param_coordinator.is_invalid_trace()}


def step_gathers(trainer):
    """A callback recording, per optimizer step, the unit gathers the engine did."""
    from transformers import TrainerCallback

    gathers = []

    class Record(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            stats = getattr(trainer.model_wrapped, "last_step_stats", None)
            gathers.append(None if stats is None else stats.gathers)

    trainer.add_callback(Record())
    return gathers


def run_sft(a):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from trl import SFTConfig, SFTTrainer
    from trl.models import unwrap_model_for_generation

    overrides = {"learning_rate": 3e-2} if a.lora else {}  # adapters start at zero: learn faster
    args = SFTConfig(**{**common_args(a), **overrides}, max_length=16, dataset_text_field="text")
    model = AutoModelForCausalLM.from_pretrained(a.init, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(a.init)
    data = Dataset.from_dict({"text": texts(a.steps * 4 * a.gas, seed=1)})
    peft_config = None
    if a.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, bias="none",
                                 target_modules=["q_proj", "v_proj", "down_proj"],
                                 task_type="CAUSAL_LM")
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tok,
                         peft_config=peft_config)
    trainer.train()
    engine = trainer.model_wrapped
    before = param_facts(engine)
    # Sampling from the trained model as TRL's callbacks do: under ZeRO-3 this gathers the
    # parameters, drops the hooks, generates and re-adds them.
    config = GenerationConfig(max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=1)
    prompts = tok(["ab", "fg"], return_tensors="pt").to(engine.device)
    with unwrap_model_for_generation(engine, trainer.accelerator) as unwrapped:
        during = param_facts(engine)
        out = unwrapped.generate(**prompts, generation_config=config)
    samples = tok.batch_decode(out[:, prompts["input_ids"].shape[1]:], skip_special_tokens=True)
    return {"log": trainer.state.log_history, "before": before, "during": during,
            "after": param_facts(engine), "samples": samples,
            "buffers": {n: str(b.dtype) for n, b in
                        getattr(engine, "module", engine).named_buffers()},  # plain: the model
            "checkpointing": trainer.model.is_gradient_checkpointing}


def reward_a(completions, **kwargs):
    """Reward completions that contain many 'a' characters."""
    return [c.count("a") / max(1, len(c)) for c in completions]


def run_grpo(a):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(**common_args(a), num_generations=2, max_completion_length=6,
                      beta=0.0, temperature=1.0, log_completions=False,
                      ds3_gather_for_generation=not a.no_gather)
    model = AutoModelForCausalLM.from_pretrained(a.init, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(a.init)
    prompts = [t[:3] for t in texts(a.steps * 4 * a.gas, seed=2)]
    data = Dataset.from_dict({"prompt": prompts})
    trainer = GRPOTrainer(model=model, args=args, train_dataset=data, reward_funcs=reward_a,
                          processing_class=tok)
    gathers = step_gathers(trainer)
    facts = []

    def record(*_):  # after every generation: parameters sharded again, hooks back
        facts.append(param_facts(trainer.model_wrapped))

    original = trainer._generate

    def generate(*args_, **kwargs):
        out = original(*args_, **kwargs)
        record()
        return out

    trainer._generate = generate
    trainer.train()
    return {"log": trainer.state.log_history, "after_generation": facts, "gathers": gathers}


def run_dpo(a):
    """DPOTrainer with the reference model TRL builds itself (from the model's path); under
    ZeRO-3 TRL puts it in a deepspeed.initialize engine without an optimizer."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    args = DPOConfig(**common_args(a), beta=0.1, max_length=16)
    model = AutoModelForCausalLM.from_pretrained(a.init, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(a.init)
    rows = texts(a.steps * 4 * a.gas, seed=3)
    data = Dataset.from_dict({"prompt": [t[:4] for t in rows],
                              "chosen": [t[4:10] for t in rows],
                              "rejected": [t[4:10][::-1] for t in rows]})
    trainer = DPOTrainer(model=model, args=args, train_dataset=data, processing_class=tok)
    trainer.train()
    ref = trainer.ref_model
    return {"log": trainer.state.log_history,
            "ref_engine": type(ref).__name__, "ref_optimizer": getattr(ref, "optimizer", None)
            is None, "after": param_facts(trainer.model_wrapped)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", nargs="?", choices=["sft", "grpo", "dpo"])
    p.add_argument("--make-init", default=None)
    p.add_argument("--init")
    p.add_argument("--out")
    p.add_argument("--deepspeed", default=None)
    p.add_argument("--per_device", type=int, default=4)
    p.add_argument("--gas", type=int, default=1)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--no-gather", action="store_true",
                   help="GRPO: ds3_gather_for_generation=False (generate through the hooks)")
    p.add_argument("--lora", action="store_true", help="SFT: PEFT LoRA adapters on a frozen model")
    p.add_argument("--checkpointing", action="store_true", help="gradient_checkpointing=True")
    p.add_argument("--bf16", action="store_true", help="TrainingArguments(bf16=True)")
    p.add_argument("--local_rank", type=int, default=-1)
    a = p.parse_args()
    if a.make_init:
        make_init(a.make_init)
        return
    result = {"sft": run_sft, "grpo": run_grpo, "dpo": run_dpo}[a.mode](a)
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"result_rank{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
