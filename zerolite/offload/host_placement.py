"""Host-resident masters: `offload_optimizer.device: "cpu"` and `offload_param.device: "cpu"`.

An explicit placement: each optimized flat's fp32 master (and so its optimizer state and its
update) lives either on the engine's device or in host memory beside it. For a flat on the
host (HostMaster, HostShard below):

  backward  its reduced fp32 gradient shard goes device->host as its reduction finishes
            (host_transfers.py: a side stream, after the reduction's "ready" event), into a
            host gradient buffer kept across steps (pinned when `pin_memory`); with gradient
            accumulation later micro-steps land in a staging buffer and are added on the host.
            The device copy of the shard is dropped once copied.
  step      the host waits for those copies, then the optimizer updates the host master.
  refresh   the updated master is cast to the compute dtype on the host (half the bytes to
            move for 16-bit training) and copied host->device into the param shard.

`ratio` < 1 (DeepSpeed's partial offload): flats go to the host in model order while the
elements already placed there are below `ratio` x all optimized elements; the rest keep
their master on the device and are stepped there (one torch optimizer: it groups its
tensors by device).

`offload_param.device: "cpu"` (stage 3): every flat's param shard lives in host memory too
(with fp32 it is the host master itself) and is copied to the device right before its
all-gather, on the gather stream; the gathered full buffer stays on the device.

[Note: the host is the device on CPU] With the model on the CPU both choices already hold
everything in host memory, so nothing is copied (a log line says so). The plan's
`separate_host` argument (tests pass it to ZeroEngine, never a user config key) makes separate
host copies even there, so the hand-off, the host step and the copy-back run for real on CPU.

Both are placements (zerolite/zero/flat_placement.py) chosen by plan.py before the flats are
built: `HostMaster` is where a flat's master lives, `HostShard` where its shard lives.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from zerolite.offload.host_transfers import HostTransfers
from zerolite.zero.flat_placement import MasterHome, MasterPlacement, ShardHome, ShardPlacement


class HostMaster(MasterPlacement):
    """One flat's fp32 master (and so its optimizer state and update) in host memory, with
    its gradient hand-off (backward) and its copy back to the shard (after the step)."""

    home = MasterHome.HOST

    def __init__(self, transfers: HostTransfers, pin: bool, shard_on_host: bool):
        self.transfers, self.pin, self.shard_on_host = transfers, pin, shard_on_host
        self.grad = self.staging = self.cast = None
        self._staged = False

    def _empty(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return self.transfers.backend.host_empty(numel, dtype, self.pin)

    def place(self, flat, master: nn.Parameter) -> nn.Parameter:
        # The master's dtype (fp32, or bf16 masters) is kept on the host, its grad too.
        host = self._empty(flat.shard_numel, master.dtype)
        host.copy_(master.detach())  # the device master (or the shard it is) stays as the shard
        self.grad = self._empty(flat.shard_numel, master.dtype)
        if flat.compute_dtype != master.dtype and not self.shard_on_host:
            self.cast = self._empty(flat.shard_numel, flat.compute_dtype)
        return nn.Parameter(host)

    # -- backward: the reduced gradient shard to the host ---------------------------------
    def take_grad_shard(self, flat, shard: torch.Tensor, name: str) -> None:
        master = flat.master
        if shard.dtype != master.dtype:
            shard = shard.to(master.dtype)  # bf16 masters: cast on the device, half the bytes
        flat.round_grad_(shard)  # [Note: gradient precision]
        if master.grad is None:  # first micro-step of the window: straight into the buffer
            master.grad = self.grad
            self.transfers.to_host(self.grad, shard, name)
            return
        if self._staged:  # a second reduction of this flat before a settle: finish the first
            self.transfers.settle()
        if self.staging is None:
            self.staging = self._empty(flat.shard_numel, master.dtype)
        self._staged = True

        def accumulate():
            # the same add (in the master's dtype, at the flat's precision) as on device
            flat.round_grad_(master.grad.add_(self.staging))
            self._staged = False

        self.transfers.to_host(self.staging, shard, name, then=accumulate)

    # -- after the step: the updated master to the device ---------------------------------
    def refresh_shard(self, flat) -> None:
        if self.shard_on_host:  # host -> host; the copy to the device happens per gather
            if flat.shard.data_ptr() != flat.master.data_ptr():
                flat.copy_into_shard(0, flat.master.detach())
            return
        src = flat.master.detach()
        if self.cast is not None:
            self.cast.copy_(src)  # host-side cast: the same rounding as the device's copy_
            src = self.cast
        self.transfers.to_device(flat.shard, src, f"shard {id(flat):x}")

    def host_nbytes(self, flat, optimizer) -> dict:
        nb = lambda t: t.numel() * t.element_size()  # noqa: E731
        state = optimizer.state.get(flat.master, {}) if optimizer is not None else {}
        return {"masters": nb(flat.master), "grads": nb(self.grad),
                "optimizer_state": sum(nb(v) for v in state.values()
                                       if isinstance(v, torch.Tensor)),
                "staging": sum(nb(t) for t in (self.staging, self.cast) if t is not None)}


class HostShard(ShardPlacement):
    """offload_param 'cpu': one flat's compute-dtype shard in host memory (with a master of the
    compute dtype, the host master itself), copied to the device right before its all-gather."""

    home = ShardHome.HOST

    def __init__(self, transfers: HostTransfers, pin: bool):
        self.transfers, self.pin = transfers, pin

    def place(self, flat, shard: torch.Tensor) -> torch.Tensor:
        if flat.master is not None and flat.compute_dtype == flat.master.dtype:
            return flat.master.data  # fp32 / bf16 masters: the host master is the param shard
        host = self.transfers.backend.host_empty(flat.shard_numel, flat.compute_dtype, self.pin)
        host.copy_(shard)
        return host

    @property
    def full_is_shard_capable(self) -> bool:
        return False  # the full buffer is on the device, the shard is not

    def gather_source(self, flat) -> torch.Tensor:
        """A device copy of the host shard, made on the current (gather) stream: allocated
        there, so the allocator reuses its memory only after that stream's all-gather."""
        backend = self.transfers.backend
        tmp = torch.empty(flat.shard_numel, dtype=flat.compute_dtype, device=flat.device)
        backend.copy(tmp, flat.shard, name="h2d param")
        self.transfers.note_read(backend.record(), keep=(flat.shard,))
        self.transfers.bytes_to_device += tmp.numel() * tmp.element_size()
        return tmp

    def host_nbytes(self, flat) -> int:
        if flat.master is not None and flat.shard.data_ptr() == flat.master.data_ptr():
            return 0  # counted as the master
        return flat.shard.numel() * flat.shard.element_size()
