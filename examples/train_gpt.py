"""Demo: train a small byte-level GPT with ZeRO-3 on the Python standard library's sources.

    torchrun --standalone --nproc_per_node 2 examples/train_gpt.py \
        --deepspeed_config configs/demo_zero3_cpu.json

Written the way DeepSpeed's tutorials write training scripts; `import zerolite as deepspeed`
is the only change such a script needs.
"""
import argparse
import logging
import sys
import time

import torch
import torch.distributed as dist

import zerolite as deepspeed
from zerolite.models import GPT, GPTConfig
from zerolite.models.byte_data import ByteWindows, stdlib_bytes


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--log-every", type=int, default=20,
                        help="progress-bar period (match steps_per_print in the config)")
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def progress(step, total, width=30):
    done = int(width * step / total)
    return f"[{'#' * done}{'.' * (width - done)}] {step}/{total}"


def main():
    args = parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cfg = GPTConfig(seq_len=args.seq_len, n_layer=args.layers, n_head=args.heads,
                    d_model=args.d_model)
    model = GPT(cfg)
    text = stdlib_bytes()
    dataset = ByteWindows(text, args.seq_len, num_windows=args.steps * 64)
    engine, _, loader, _ = deepspeed.initialize(args=args, model=model,
                                                model_parameters=model.parameters(),
                                                training_data=dataset)
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        print(f"zerolite demo: {cfg.num_params() / 1e6:.2f}M-param byte-level GPT, "
              f"{len(text) / 1e6:.1f} MB of stdlib source, world size {world}, ZeRO stage "
              f"{engine.zero_optimization_stage()}, batch {engine.train_batch_size()}", flush=True)
    step, first_loss, t0 = 0, None, time.perf_counter()
    losses = []
    while step < args.steps:
        for x, y in loader:
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
            if not engine.was_step_applied():
                continue
            step = engine.global_steps
            if step % args.log_every == 0 or step == args.steps:
                mean = torch.tensor([sum(losses) / len(losses)], dtype=torch.float64)
                dist.all_reduce(mean)
                mean = mean.item() / world
                first_loss = first_loss if first_loss is not None else mean
                if rank == 0:  # lr, samples/s and memory per rank: the engine's own log line
                    print(f"{progress(step, args.steps)} loss {mean:.3f}", flush=True)
                losses = []
            if step >= args.steps:
                break
    if rank == 0:
        print(f"done in {time.perf_counter() - t0:.0f}s; loss {first_loss:.3f} -> {mean:.3f}",
              flush=True)
    if mean >= first_loss:
        print("loss did not fall", file=sys.stderr)
        sys.exit(1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
