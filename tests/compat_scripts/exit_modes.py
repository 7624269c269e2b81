"""A short ZeRO-3 run on CPU that ends the ways training scripts end (issue 24: a finished run
exits 0, every time).

    zerolite --num_procs 2 exit_modes.py --end return|sys-exit|destroy|destroy-sys-exit
        [--init launcher|file:///path|tcp://127.0.0.1:PORT] [--linger-rank R --linger-s S]
        [--store-delay-s D]

--init: launcher = zerolite.initialize joins the launcher's group (env://); a URL = the script
calls init_process_group(init_method=URL) itself (RANK and WORLD_SIZE from the environment).
--linger-rank: that rank sleeps after training, so the other node finishes first.
--store-delay-s: every store call of the watchdog thread (not the main thread's) first waits
D seconds in a real store call (as from a store host that a loaded machine schedules late),
so a heartbeat is in flight when the script ends.
Prints "[rank R] done (watchdog on|off)" when training is over.
"""
import argparse
import datetime
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

import zerolite
from zerolite.models import GPT, GPTConfig


class DelayedStore:
    """The watchdog's store; in the watchdog thread each call is preceded by a D-second wait
    on a key nobody sets: a C++ call that releases the GIL, as a slow store answer does."""

    def __init__(self, store, delay_s: float):
        self._store, self._delay = store, datetime.timedelta(seconds=delay_s)

    def __getattr__(self, name):
        real = getattr(self._store, name)

        def call(*args, **kwargs):
            if threading.current_thread().name == "zerolite-watchdog":
                try:
                    self._store.wait(["exit_modes/never-set"], self._delay)
                except Exception:  # noqa: BLE001 - the wait times out: that is the delay
                    pass
            return real(*args, **kwargs)

        return call


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--end", default="return",
                   choices=("return", "sys-exit", "destroy", "destroy-sys-exit"))
    p.add_argument("--init", default="launcher")
    p.add_argument("--linger-rank", type=int, default=-1)
    p.add_argument("--linger-s", type=float, default=0.0)
    p.add_argument("--store-delay-s", type=float, default=0.0)
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args()
    if a.init != "launcher":
        dist.init_process_group("gloo", init_method=a.init, rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]),
                                timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = GPT(GPTConfig(vocab_size=64, seq_len=8, n_layer=2, n_head=2, d_model=16))
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
              "zero_optimization": {"stage": 3}, "zerolite": {"comm_timeout_s": 60}}
    engine, _, _, _ = zerolite.initialize(model=model, model_parameters=model.parameters(),
                                          config=config)
    wd = zerolite.watchdog.active()
    if wd is not None and a.store_delay_s > 0:
        wd.store = DelayedStore(wd.store, a.store_delay_s)
    rank = dist.get_rank()
    gen = torch.Generator().manual_seed(1 + rank)
    for _ in range(a.steps):
        data = torch.randint(0, 64, (2, 9), generator=gen)
        engine.backward(engine(data[:, :-1], data[:, 1:]))
        engine.step()
    print(f"[rank {rank}] done (watchdog {'on' if wd is not None else 'off'})", flush=True)
    if rank == a.linger_rank:
        time.sleep(a.linger_s)
    if a.end.startswith("destroy"):
        dist.destroy_process_group()
    if a.end.endswith("sys-exit"):
        sys.exit(0)


if __name__ == "__main__":
    main()
