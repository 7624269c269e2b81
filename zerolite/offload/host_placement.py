"""Host-resident masters: `offload_optimizer.device: "cpu"` and `offload_param.device: "cpu"`.

An explicit placement: each optimized flat's fp32 master (and so its optimizer state and its
update) lives either on the engine's device or in host memory beside it. For a flat on the
host (a HostLink):

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
everything in host memory, so nothing is copied (a log line says so). FORCE_SEPARATE_HOST
(tests set it, never a user config key) makes separate host copies even there, so the
hand-off, the host step and the copy-back run for real on CPU.
"""
from __future__ import annotations

import logging

import torch
import torch.nn as nn

from zerolite.errors import ZeroliteConfigError
from zerolite.offload.host_transfers import HostTransfers

logger = logging.getLogger("zerolite")

FORCE_SEPARATE_HOST = False
"""Test switch: separate host copies even when the device is the CPU."""


class HostLink:
    """One flat's host-side tensors and its three transfers."""

    def __init__(self, flat, transfers: HostTransfers, backend, pin: bool,
                 master_on_host: bool, shard_on_host: bool):
        self.flat, self.transfers = flat, transfers
        self.master_on_host, self.shard_on_host = master_on_host, shard_on_host
        n = flat.shard_numel
        empty = lambda dtype: backend.host_empty(n, dtype, pin)  # noqa: E731
        self.grad = self.staging = self.cast = None
        self._staged = False
        if master_on_host:
            host = empty(torch.float32)
            host.copy_(flat.master.detach())
            flat.master = nn.Parameter(host)  # the device master (or fp32 shard) stays as shard
            self.grad = empty(torch.float32)
            if flat.compute_dtype != torch.float32 and not shard_on_host:
                self.cast = empty(flat.compute_dtype)
        self._empty = lambda: empty(torch.float32)
        if shard_on_host:
            if flat.master is not None and flat.compute_dtype == torch.float32:
                flat.shard = flat.master.data  # fp32: the host master is the param shard
            else:
                host = empty(flat.compute_dtype)
                host.copy_(flat.shard)
                flat.shard = host
            flat.full = flat._empty
        flat.shard_on_host = shard_on_host
        flat.host_link = self

    def host_tensors(self) -> list[torch.Tensor]:
        out = [t for t in (self.grad, self.staging, self.cast) if t is not None]
        if self.master_on_host:
            out.append(self.flat.master.data)
        if self.shard_on_host and (self.flat.master is None
                                   or self.flat.shard.data_ptr() != self.flat.master.data_ptr()):
            out.append(self.flat.shard)
        return out

    # -- backward: the reduced gradient shard to the host ---------------------------------
    def take_grad_shard(self, shard: torch.Tensor, name: str) -> None:
        master = self.flat.master
        if master.grad is None:  # first micro-step of the window: straight into the buffer
            master.grad = self.grad
            self.transfers.to_host(self.grad, shard, name)
            return
        if self._staged:  # a second reduction of this flat before a settle: finish the first
            self.transfers.settle()
        if self.staging is None:
            self.staging = self._empty()
        self._staged = True

        def accumulate():
            master.grad.add_(self.staging)  # the same fp32 add the device path does
            self._staged = False

        self.transfers.to_host(self.staging, shard, name, then=accumulate)

    # -- after the step: the updated master to the device ---------------------------------
    def refresh(self) -> None:
        flat = self.flat
        if flat.master is None:
            return
        if self.shard_on_host:  # host -> host; the copy to the device happens per gather
            if flat.shard.data_ptr() != flat.master.data_ptr():
                flat.shard.copy_(flat.master.detach())
            return
        src = flat.master.detach()
        if self.cast is not None:
            self.cast.copy_(src)  # host-side cast: the same rounding as the device's copy_
            src = self.cast
        self.transfers.to_device(flat.shard, src, f"shard {id(flat):x}")

    # -- before a gather (offload_param): the host shard onto the device -------------------
    def shard_on_device(self) -> torch.Tensor:
        """A device copy of the host shard, made on the current (gather) stream: allocated
        there, so the allocator reuses its memory only after that stream's all-gather."""
        flat, backend = self.flat, self.transfers.backend
        tmp = torch.empty(flat.shard_numel, dtype=flat.compute_dtype, device=flat._empty.device)
        backend.copy(tmp, flat.shard, name="h2d param")
        self.transfers.note_read(backend.record(), keep=(flat.shard,))
        self.transfers.bytes_to_device += tmp.numel() * tmp.element_size()
        return tmp


class HostPlacement:
    """Which flats keep their masters / param shards in host memory, and their transfers."""

    def __init__(self, links: list[HostLink], transfers: HostTransfers, pin: bool):
        self.links, self.transfers, self.pin = links, transfers, pin

    def settle(self) -> None:
        self.transfers.settle()

    def host_nbytes(self, optimizer) -> dict:
        """Bytes this rank holds in host memory apart from the device, by kind."""
        out = {"masters": 0, "optimizer_state": 0, "grads": 0, "staging": 0,
               "param_shards": 0}
        for link in self.links:
            f = link.flat
            nb = lambda t: t.numel() * t.element_size()  # noqa: E731
            if link.master_on_host:
                out["masters"] += nb(f.master)
                out["grads"] += nb(link.grad)
                state = optimizer.state.get(f.master, {}) if optimizer is not None else {}
                out["optimizer_state"] += sum(nb(v) for v in state.values()
                                              if isinstance(v, torch.Tensor))
            out["staging"] += sum(nb(t) for t in (link.staging, link.cast) if t is not None)
            if link.shard_on_host and (f.master is None
                                       or f.shard.data_ptr() != f.master.data_ptr()):
                out["param_shards"] += nb(f.shard)
        out["total"] = sum(out.values())
        return out


def _check(zc, opt_block, param_block, cpu_opt: bool, cpu_param: bool) -> None:
    if not cpu_param:
        return
    if zc.stage != 3:
        raise ZeroliteConfigError(
            f"zero_optimization.offload_param.device: 'cpu' needs zero_optimization.stage 3 "
            f"(only stage 3 partitions parameters), got stage {zc.stage}")
    if not cpu_opt or opt_block.get("ratio", 1.0) < 1.0:
        raise ZeroliteConfigError(
            "zero_optimization.offload_param.device: 'cpu' needs "
            "zero_optimization.offload_optimizer.device 'cpu' with ratio 1 (the host shard "
            "is refreshed from a host master); got offload_optimizer "
            f"{opt_block and {k: opt_block[k] for k in ('device', 'ratio')}}")
    if zc.zero_quantized_weights:
        raise ZeroliteConfigError(
            "zero_optimization.offload_param.device: 'cpu' together with "
            "zero_quantized_weights is not supported; turn one of them off")


def place_on_host(sharded, zc, layer, rank: int) -> HostPlacement | None:
    """Apply the config's cpu offload choices to `sharded`'s flats (before the optimizer is
    built over the masters). Returns None when nothing is placed apart from the device."""
    opt_block, param_block = zc.offload_optimizer, zc.offload_param
    cpu_opt = bool(opt_block) and opt_block["device"] == "cpu"
    cpu_param = bool(param_block) and param_block["device"] == "cpu"
    _check(zc, opt_block, param_block, cpu_opt, cpu_param)
    if not (cpu_opt or cpu_param):
        return None
    if layer.device.type == "cpu" and not FORCE_SEPARATE_HOST:
        if rank == 0:
            logger.info("zerolite: offload %s 'cpu': the model is on the CPU, so the masters, "
                        "optimizer state and param shards already live in host memory; "
                        "nothing is copied", "optimizer/param" if cpu_param else "optimizer")
        return None
    if param_block and param_block["device"] == "nvme":
        # The nvme param files are refreshed from an in-RAM or swapped master, not from a
        # host master behind copies to a device: that pairing is not built.
        raise ZeroliteConfigError(
            "zero_optimization.offload_param.device 'nvme' together with "
            "offload_optimizer.device 'cpu' on an accelerator is not implemented; use "
            "offload_optimizer 'nvme' with offload_param 'nvme', or 'cpu' for both")
    pin = bool(opt_block.get("pin_memory")) or bool(param_block and param_block.get("pin_memory"))
    transfers = HostTransfers(layer.backend)
    optimized = [f for f in sharded.flats if f.master is not None]
    budget = opt_block["ratio"] * sum(f.shard_numel for f in optimized)
    placed, links = 0, []
    if cpu_param:
        for unit in sharded.units:  # release before the shards move; regathered below
            unit.release()
    for flat in sharded.flats:
        on_host = flat.master is not None and placed < budget
        if on_host:
            placed += flat.shard_numel
        if on_host or cpu_param:
            links.append(HostLink(flat, transfers, layer.backend, pin, on_host, cpu_param))
    if cpu_param:
        sharded.residency.refresh_persistent()
    sharded.host_transfers = transfers
    if rank == 0:
        logger.info("zerolite: offload_optimizer 'cpu': %d of %d optimized flats (%d of %d "
                    "elements) keep their fp32 master and optimizer state in host memory%s%s",
                    sum(link.master_on_host for link in links), len(optimized), placed,
                    sum(f.shard_numel for f in optimized), " (pinned)" if pin else "",
                    "; param shards in host memory too (offload_param 'cpu')"
                    if cpu_param else "")
    return HostPlacement(links, transfers, pin)
