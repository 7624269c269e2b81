"""Side-by-side benchmark: zerolite (ZeRO-2/3) vs PyTorch DDP, FSDP2 and DeepSpeed ZeRO-3.

`python -m benchmarks.peers.run --help` drives everything; each engine runs in its own
torchrun job (`benchmarks.peers.worker`), the single-process reference in its own process
(`benchmarks.peers.reference`). DeepSpeed is optional (`pip install deepspeed`).
"""
