"""A training script written the way DeepSpeed's tutorials write them; the only change for
zerolite is the import on the first line of code.

    torchrun --standalone --nproc_per_node 2 examples/deepspeed_style_train.py \
        --deepspeed --deepspeed_config configs/zero3_cpu.json --save_dir /tmp/ckpt
"""
import argparse

import torch
import torch.distributed as dist

import zerolite as deepspeed
from zerolite.models import GPT, GPTConfig


def add_argument():
    parser = argparse.ArgumentParser(description="DeepSpeed-style GPT training")
    parser.add_argument("--local_rank", type=int, default=-1,
                        help="local rank passed from distributed launcher")
    parser.add_argument("-e", "--epochs", default=2, type=int, help="number of total epochs")
    parser.add_argument("--num_samples", default=512, type=int, help="training samples")
    parser.add_argument("--save_dir", default="checkpoints", type=str,
                        help="where to save the final checkpoint")
    parser.add_argument("--log_interval", default=4, type=int, help="print every N steps")
    # Include DeepSpeed configuration arguments (--deepspeed, --deepspeed_config).
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


class CountingDataset(torch.utils.data.Dataset):
    """Token rows that count up from a random start with a random stride (easy to learn)."""

    def __init__(self, num_samples, seq_len, vocab_size, seed=0):
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, vocab_size, (num_samples, 1), generator=g)
        stride = torch.randint(1, 5, (num_samples, 1), generator=g)
        self.data = (start + stride * torch.arange(seq_len + 1)) % vocab_size

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        row = self.data[i]
        return row[:-1], row[1:]


def main():
    deepspeed.init_distributed()
    args = add_argument()
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=256, seq_len=32, n_layer=2, n_head=2, d_model=64)

    # Parameters are partitioned across ranks as each module is constructed.
    with deepspeed.zero.Init():
        model = GPT(cfg)

    trainset = CountingDataset(args.num_samples, cfg.seq_len, cfg.vocab_size)
    model_engine, optimizer, trainloader, _ = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters(), training_data=trainset)

    step = 0
    for epoch in range(args.epochs):
        running_loss = 0.0
        for i, (inputs, targets) in enumerate(trainloader):
            loss = model_engine(inputs, targets)
            model_engine.backward(loss)
            model_engine.step()
            step += 1
            running_loss += loss.item()
            if step % args.log_interval == 0:
                avg = torch.tensor(running_loss / args.log_interval)
                dist.all_reduce(avg)
                if dist.get_rank() == 0:
                    avg_loss = avg.item() / dist.get_world_size()
                    print(f"[epoch {epoch + 1}, step {step}] loss: {avg_loss:.4f}", flush=True)
                running_loss = 0.0

    model_engine.save_checkpoint(args.save_dir)
    if dist.get_rank() == 0:
        print(f"Finished training; checkpoint saved to {args.save_dir}", flush=True)


if __name__ == "__main__":
    main()
