"""`zero.Init`: partition parameters while the model is being built (DeepSpeed's zero.Init).

Inside the context every nn.Module subclass has its `__init__` wrapped. When the OUTERMOST
`__init__` of a module object returns (a subclass calling `super().__init__()` does not
count), each parameter of that module that is not partitioned yet is broadcast from rank 0
(so all ranks agree), and only this rank's contiguous slice of the flattened value is kept:
`ceil(numel / world)` elements, zero padded on the last rank. Peak memory while building is
therefore the partitioned model plus one module's full parameters.

A partitioned parameter carries `p.zl_partitioned` (PartitionInfo) and DeepSpeed's
`p.ds_shape`, `p.ds_numel`, `p.ds_id` and `p.ds_tensor` (the local slice).

[Note: full-shaped placeholder, not the 1-D slice] DeepSpeed swaps `p.data` for an empty
tensor, so `p.shape` lies and every consumer must read `ds_shape`. We keep the slice in
`ds_tensor` and set `p.data` to a zero-stride NaN tensor of the FULL shape (one element of
storage): `p.shape`, `p.numel()` and everything that lays out parameters (FlatParam slots,
checkpoint layouts) stay correct, and a stray use is loud — in-place writes raise ("more than
one element of the written-to tensor refers to a single memory location") and a forward
outside GatheredParameters produces NaN.

[Note: parent-level initialisation] Children are partitioned before their parent's
`__init__` finishes, so a parent that re-initialises its children's weights (the usual
`self.apply(self._init_weights)`, or `nn.init.normal_(child.weight)`) would act on
placeholders. As DeepSpeed does for `Module.apply`, the context wraps `Module.apply` and the
`torch.nn.init` functions: a partitioned parameter is gathered for the call, the result is
broadcast from rank 0 and re-partitioned. The model then ends up bit-identical to one built
without the context from the same seed. Other writes (e.g. `p.data.copy_(...)` in a parent)
need `GatheredParameters(params, modifier_rank=0)`, as in DeepSpeed.

`copy_full_value` is what FlatParam calls to read a parameter's value when the engine is
built: a plain copy for ordinary parameters, an all-gather of the slices for partitioned ones.
"""
from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn

from zerolite.errors import ZeroliteConfigError

logger = logging.getLogger("zerolite")


@dataclass
class PartitionInfo:
    """How a zero.Init-partitioned parameter is split; set as `param.zl_partitioned`."""

    shape: torch.Size
    numel: int
    rank: int
    world: int
    local: torch.Tensor = field(repr=False, default=None)
    """This rank's slice of the flattened value: `shard_numel` elements (padded)."""
    gathered: int = 0
    """Nesting depth of GatheredParameters contexts holding the full value right now."""

    @property
    def shard_numel(self) -> int:
        return max(1, math.ceil(self.numel / self.world))


def is_partitioned(p) -> bool:
    return getattr(p, "zl_partitioned", None) is not None


# -- collectives on whatever device the backend needs ---------------------------------------
def _comm_device(t: torch.Tensor) -> torch.device:
    if t.device.type == "cpu" and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return t.device


def _broadcast_(t: torch.Tensor, src: int) -> None:
    """In-place broadcast of contiguous `t` from global rank `src`."""
    if dist.get_world_size() == 1:
        return
    dev = _comm_device(t)
    buf = t if dev == t.device else t.to(dev)
    dist.broadcast(buf, src=src)
    if buf is not t:
        t.copy_(buf)


def _all_gather_slices(local: torch.Tensor, world: int) -> torch.Tensor:
    """Concatenate every rank's `local` slice (rank order) into a new 1-D tensor."""
    from zerolite.comm import all_gather_flat

    dev = _comm_device(local)
    src = local.to(dev).contiguous()
    out = torch.empty(local.numel() * world, dtype=local.dtype, device=dev)
    all_gather_flat(out, src)
    return out if dev == local.device else out.to(local.device)


def _placeholder(p: torch.Tensor, shape) -> torch.Tensor:
    return torch.full((1,), float("nan"), dtype=p.dtype, device=p.device).expand(shape)


# -- partition / gather / release of one parameter ------------------------------------------
@torch.no_grad()
def partition_param(p: nn.Parameter, dtype: torch.dtype | None = None,
                    ds_id: int | None = None) -> int:
    """Broadcast `p` from rank 0, keep this rank's slice; returns the slice's bytes."""
    rank, world = dist.get_rank(), dist.get_world_size()
    full = p.detach().contiguous()
    _broadcast_(full, src=0)
    info = PartitionInfo(torch.Size(p.shape), p.numel(), rank, world)
    n = info.shard_numel
    local = torch.zeros(n, dtype=dtype or p.dtype, device=p.device)
    lo, hi = min(rank * n, info.numel), min((rank + 1) * n, info.numel)
    local[:hi - lo].copy_(full.reshape(-1)[lo:hi])
    info.local = local
    p.data = _placeholder(local, info.shape)
    p.zl_partitioned = info
    p.ds_shape, p.ds_numel, p.ds_tensor = info.shape, info.numel, local
    if not hasattr(p, "ds_id"):
        p.ds_id = ds_id
    return local.numel() * local.element_size()


@torch.no_grad()
def gather_partitioned(p: nn.Parameter) -> None:
    """Give a partitioned `p` its full value (collective). Nested calls only count."""
    info = p.zl_partitioned
    info.gathered += 1
    if info.gathered == 1:
        full = _all_gather_slices(info.local, info.world)[:info.numel]
        p.data = full.view(info.shape)


@torch.no_grad()
def release_partitioned(p: nn.Parameter, modifier_rank: int | None) -> None:
    """Undo one gather_partitioned; with `modifier_rank`, first broadcast the value from that
    rank and store it in the local slice (collective)."""
    info = p.zl_partitioned
    if modifier_rank is not None:
        value = p.detach()
        if tuple(value.shape) != tuple(info.shape):
            raise ZeroliteConfigError(
                f"GatheredParameters: a parameter of shape {tuple(info.shape)} was given a "
                f"value of shape {tuple(value.shape)}; modify it in place instead")
        value = value.contiguous()
        _broadcast_(value, src=modifier_rank)
        n = info.shard_numel
        lo, hi = min(info.rank * n, info.numel), min((info.rank + 1) * n, info.numel)
        info.local[:hi - lo].copy_(value.reshape(-1)[lo:hi])
    info.gathered -= 1
    if info.gathered == 0:
        p.data = _placeholder(info.local, info.shape)


def copy_full_value(p: torch.Tensor, dest: torch.Tensor) -> None:
    """Copy `p`'s full value, flattened, into `dest` (FlatParam construction).

    Ordinary parameters: a plain copy. zero.Init-partitioned ones: all-gather of the slices
    (collective — every rank builds its FlatParams in the same order, so the calls match),
    after which the slice is dropped: from here on the engine owns the value.
    """
    info = getattr(p, "zl_partitioned", None)
    if info is None or info.gathered:
        dest.copy_(p.detach().reshape(-1))
        return
    with torch.no_grad():
        dest.copy_(_all_gather_slices(info.local, info.world)[:info.numel])
    p.zl_partitioned = None
    p.ds_tensor = None


# -- the context ------------------------------------------------------------------------------
_ACTIVE: list["Init"] = []
_PATCHED: dict = {}
"""What the outermost active context replaced: class -> original __init__, plus the rest."""

_INIT_FNS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_",
             "dirac_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
             "kaiming_normal_", "orthogonal_", "sparse_")


def _current() -> "Init | None":
    return _ACTIVE[-1] if _ACTIVE else None


def _subclasses(cls):
    seen, todo = [], list(cls.__subclasses__())
    while todo:
        c = todo.pop()
        if c not in seen:
            seen.append(c)
            todo.extend(c.__subclasses__())
    return seen


def _wrap_init(orig):
    @functools.wraps(orig)
    def wrapper(module, *args, **kwargs):
        ctx = _current()
        if ctx is None:
            return orig(module, *args, **kwargs)
        key = id(module)
        depth = ctx._depth.get(key, 0)
        ctx._depth[key] = depth + 1
        try:
            orig(module, *args, **kwargs)
        finally:
            if depth == 0:
                del ctx._depth[key]
            else:
                ctx._depth[key] = depth
        if depth == 0:
            ctx._partition_module(module)

    wrapper._zl_original_init = orig
    return wrapper


def _patch_class(cls) -> None:
    init = cls.__dict__.get("__init__")
    if init is None or cls in _PATCHED["classes"] or hasattr(init, "_zl_original_init"):
        return
    try:
        cls.__init__ = _wrap_init(init)
    except (TypeError, AttributeError):  # e.g. an extension type that refuses new attributes
        return
    _PATCHED["classes"][cls] = init


def _gathering_call(fn, params):
    """Call fn() with the partitioned `params` gathered; rank 0's result is kept."""
    from zerolite.zero.gathered import GatheredParameters

    params = [p for p in params if is_partitioned(p) and not p.zl_partitioned.gathered]
    if not params:
        return fn()
    with GatheredParameters(params, modifier_rank=0):
        return fn()


def _patch_globals() -> None:
    _PATCHED["classes"] = {}
    for cls in _subclasses(nn.Module):
        _patch_class(cls)
    _PATCHED["init_subclass"] = nn.Module.__dict__.get("__init_subclass__")

    def init_subclass(cls, **kwargs):
        super(nn.Module, cls).__init_subclass__(**kwargs)
        if _ACTIVE:
            _patch_class(cls)

    nn.Module.__init_subclass__ = classmethod(init_subclass)

    orig_apply = nn.Module.apply
    _PATCHED["apply"] = orig_apply

    def apply(self, fn):
        if getattr(fn, "_zl_gathering", False):  # children's apply: already wrapped
            return orig_apply(self, fn)

        @functools.wraps(fn)
        def gathered_fn(m):
            return _gathering_call(lambda: fn(m), m.parameters(recurse=False))
        gathered_fn._zl_gathering = True
        return orig_apply(self, gathered_fn)

    nn.Module.apply = apply

    _PATCHED["init_fns"] = {}
    for name in _INIT_FNS:
        orig = getattr(torch.nn.init, name, None)
        if orig is None:
            continue
        _PATCHED["init_fns"][name] = orig

        def make(orig):
            @functools.wraps(orig)
            def init_fn(tensor, *args, **kwargs):
                if not is_partitioned(tensor) or tensor.zl_partitioned.gathered:
                    return orig(tensor, *args, **kwargs)
                _gathering_call(lambda: orig(tensor, *args, **kwargs), [tensor])
                return tensor
            return init_fn

        setattr(torch.nn.init, name, make(orig))


def _unpatch_globals() -> None:
    for cls, init in _PATCHED.pop("classes").items():
        cls.__init__ = init
    sub = _PATCHED.pop("init_subclass")
    if sub is None:
        del nn.Module.__init_subclass__
    else:
        nn.Module.__init_subclass__ = sub
    nn.Module.apply = _PATCHED.pop("apply")
    for name, fn in _PATCHED.pop("init_fns").items():
        setattr(torch.nn.init, name, fn)


class Init:
    """Partition parameters as modules are constructed (DeepSpeed's `deepspeed.zero.Init`).

        with zerolite.zero.Init():
            model = MyModel()          # never fully materialised on one rank
        engine, *_ = zerolite.initialize(model=model, config=cfg)

    `module`: an already-built module to partition now. `data_parallel_group`: only the
    default (world) group is supported, since the engine shards over the world.
    `config_dict_or_path` / `config`, `remote_device`, `pin_memory`: accepted and ignored
    (logged). `dtype`: store the slices in this dtype; by default they keep the parameters'
    dtype so the engine builds fp32 masters from the original values (DESIGN: numerics).
    `enabled=False` makes the context a no-op. Nested contexts act as one.

    After the context: `peak_param_bytes` is the most parameter memory that was alive at the
    end of any module's `__init__` (every slice kept so far plus the module's full params
    about to be partitioned); `partitioned_bytes` the slices kept.
    """

    def __init__(self, module: nn.Module | None = None, data_parallel_group=None,
                 mem_efficient_linear: bool = True, remote_device=None, pin_memory: bool = False,
                 config_dict_or_path=None, config=None, enabled: bool = True,
                 dtype: torch.dtype | None = None, mpu=None, **kwargs):
        self.enabled = enabled
        self.dtype = dtype
        self.partitioned_bytes = 0
        self.peak_param_bytes = 0
        self.num_partitioned = 0
        self._depth: dict[int, int] = {}
        if not enabled:
            return
        if mpu is not None:
            raise ZeroliteConfigError("zero.Init(mpu=...): model parallelism is not supported")
        ignored = {k: v for k, v in dict(remote_device=remote_device, pin_memory=pin_memory,
                                         config_dict_or_path=config_dict_or_path, config=config,
                                         **kwargs).items() if v not in (None, False)}
        if remote_device in ("cpu", "nvme"):
            logger.warning("zero.Init(remote_device=%r): offload is not supported; parameter "
                           "slices stay on the device they are created on", remote_device)
        if ignored:
            logger.debug("zero.Init: ignoring %s", sorted(ignored))
        if not dist.is_initialized():
            from zerolite.comm import init_distributed
            init_distributed()
        if data_parallel_group is not None and \
                dist.get_world_size(data_parallel_group) != dist.get_world_size():
            raise ZeroliteConfigError(
                "zero.Init(data_parallel_group=...): zerolite shards over the whole world "
                f"({dist.get_world_size()} ranks); a group of "
                f"{dist.get_world_size(data_parallel_group)} ranks is not supported")
        if module is not None:
            self._partition_module(module)

    def __enter__(self):
        if not self.enabled:
            return self
        if not _ACTIVE:
            _patch_globals()
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc):
        if not self.enabled:
            return False
        _ACTIVE.remove(self)
        if not _ACTIVE:
            _unpatch_globals()
        logger.debug("zero.Init: partitioned %d parameters, %.1f MiB kept on this rank",
                     self.num_partitioned, self.partitioned_bytes / 2**20)
        return False

    def _partition_module(self, module: nn.Module) -> None:
        todo = [p for p in module.parameters() if not is_partitioned(p)
                and not hasattr(p, "zl_handle")]
        if not todo:
            return
        pending = sum(p.untyped_storage().nbytes() for p in
                      {p.untyped_storage().data_ptr(): p for p in todo}.values())
        self.peak_param_bytes = max(self.peak_param_bytes, self.partitioned_bytes + pending)
        for p in todo:
            self.partitioned_bytes += partition_param(p, self.dtype, ds_id=self.num_partitioned)
            self.num_partitioned += 1
