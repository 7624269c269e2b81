"""ZeroEngine: DeepSpeed's engine interface (forward/backward/step, accessors) over a
ShardedModel and an optimizer that only ever sees this rank's fp32 shards."""
from __future__ import annotations

import logging
import math
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import psutil
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.autograd.graph import register_multi_grad_hook
from torch.utils._pytree import tree_leaves, tree_map

from zerolite.autocast import TorchAutocast
from zerolite.buffer_dtypes import set_buffer_dtypes
from zerolite.comm.build import build_grad_reducer, build_param_gatherer
from zerolite.comm.last_collective import RECORD as LAST, set_phase
from zerolite.comm.topology import NodeLayout, build_secondary_group
from zerolite.comm.wire_count import WireCounter
from zerolite.device import default_device, make_device_layer, place_module
from zerolite.engine_accessors import DeepSpeedAccessors
from zerolite.fragments import TensorFragments
from zerolite.errors import ZeroliteStateError
from zerolite.monitor import ThroughputTimer, TrainingMonitor
from zerolite.config.offload import OffloadConfig
from zerolite.offload.chunked_optimizer import ChunkedOffloadOptimizer
from zerolite.offload.plan import build_plan
from zerolite.optim.builder import ZeroOptimizerRules, build_optimizer, check_master_optimizer
from zerolite.optim.grad_norm import clip_coefficient, global_grad_norm
from zerolite.optim.loss_scaler import AmpGradScaler, LossScaler
from zerolite.optim.param_groups import param_groups
from zerolite.optim.zero_optimizer import ZeroOptimizer
from zerolite.zero.flat_placement import MasterHome
from zerolite.zero.partition import policy_from_classes
from zerolite.zero.sliced_param import partition_info
from zerolite.zero.sharded_model import ShardedModel, ShardingOptions

logger = logging.getLogger("zerolite")


def _to_half(x):
    """fp16.auto_cast: floating-point inputs become float16, everything else is untouched."""
    return x.half() if isinstance(x, torch.Tensor) and x.is_floating_point() else x


def skips_nonfinite_steps(config) -> bool:
    """Is an optimizer step whose gradient norm is inf or NaN skipped under `config`?

    [Note: non-finite gradients] As in DeepSpeed 0.19: such a step is skipped (nothing
    applied, skipped_steps + 1, the lr schedule does not advance, get_global_grad_norm() is
    the float inf; global_steps still counts it) in fp16 (the loss scaler's overflow), at
    stage 3, at stage 0 in bf16, at stages 1-2 in fp32, and at stages 1-2 in bf16 unless
    bf16.check_grad_overflow is false (stage 1 with data_types.grad_accum_dtype fp32 and the
    optimizer on the device still skips: DeepSpeed's BF16_Optimizer always does). Stage 0 in
    fp32, a plain torch optimizer under DeepSpeed, applies it, as does bf16 with the check off.
    """
    stage = config.zero_optimization.stage
    if config.fp16.enabled or stage == 3:
        return True
    if not config.bf16.enabled:
        return stage != 0
    if stage == 0 or config.bf16.check_grad_overflow:
        return True
    return (stage == 1 and config.data_types.grad_accum_dtype == "fp32"
            and config.zero_optimization.offload_optimizer is None)


@dataclass
class _StepWindow:
    """What one optimizer step's micro-steps accumulated, for telemetry."""

    forward_s: float = 0.0
    backward_s: float = 0.0
    step_s: float = 0.0
    tokens: int = 0
    losses: list = field(default_factory=list)


class ZeroEngine(DeepSpeedAccessors, nn.Module):
    """[Note: the engine is an nn.Module] As DeepSpeedEngine: the model is its submodule
    `module`, so `isinstance(engine, nn.Module)` holds, `engine.modules()` yields the engine
    (Lightning Fabric finds it that way), `engine.parameters()` are the model's, and
    `named_parameters()` / `state_dict()` carry the `module.` prefix. Calling the engine runs
    nn.Module's call, so hooks registered on the engine run; attributes the engine lacks are
    looked up on the model."""

    def __init__(self, model: nn.Module, config, *, model_parameters=None, optimizer=None,
                 lr_scheduler=None, training_data=None, collate_fn=None, unit_policy=None,
                 separate_host: bool = False):
        """`separate_host` (tests): offload 'cpu' keeps separate host copies even when the
        device is the CPU, so the host hand-off runs for real (offload/host_placement.py)."""
        super().__init__()
        self.module = model
        self._config = config
        self._initialize_args = {"optimizer": optimizer, "lr_scheduler": lr_scheduler,
                                 "training_data": training_data, "collate_fn": collate_fn}
        """What initialize was given (DeepSpeed's client_optimizer, client_lr_scheduler,
        training_data, collate_fn; engine_accessors.py)."""
        self._compiled = False
        """engine.compile() has compiled the model (DeepSpeed's engine.is_compiled)."""
        self.device = default_device()  # cuda:LOCAL_RANK or cpu; inputs are the caller's to move
        place_module(model, self.device, slice_of=partition_info)
        set_buffer_dtypes(model, config.precision_dtype, config.data_types)
        self.torch_autocast = TorchAutocast(config.torch_autocast, self.device)
        """torch_autocast: the forward's autocast context and the gradients' reduction
        dtypes (autocast.py, [Note: torch_autocast])."""
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.device_layer = make_device_layer(self.device)
        zc = config.zero_optimization
        if unit_policy is None and config.zerolite.unit_policy:
            policy = policy_from_classes(config.zerolite.unit_policy)
        elif isinstance(unit_policy, (list, tuple, set)):
            policy = policy_from_classes(unit_policy)
        else:
            policy = unit_policy  # None (default policy) or a callable(name, module) -> bool
        if isinstance(optimizer, torch.optim.Optimizer):
            # The client optimizer's own groups win; it is the one trained (param_groups.py).
            model_parameters = optimizer.param_groups
        group_of, group_hparams = param_groups(model, model_parameters)
        # One pass: where each flat lives (the plan), the sharded model over it, then the
        # optimizer over its finished masters.
        self.placement_plan = build_plan(OffloadConfig.from_zero(zc), stage=zc.stage,
                                         quantized_weights=zc.zero_quantized_weights,
                                         layer=self.device_layer, rank=self.rank,
                                         compute_dtype=config.precision_dtype,
                                         separate_host=separate_host)
        # hpZ: the node layout torchrun set up, and this rank's group of
        # zero_hpz_partition_size ranks inside its node (refused if it does not fit).
        self.node_layout = NodeLayout.from_env(self.world_size)
        hpz_group = build_secondary_group(zc.zero_hpz_partition_size, self.node_layout,
                                          self.rank)
        self.sharded = ShardedModel(model, compute_dtype=config.precision_dtype,
                                    group_of=group_of, rank=self.rank,
                                    world_size=self.world_size,
                                    options=ShardingOptions.from_config(
                                        zc, reduce_once_per_step=config.zerolite
                                        .reduce_once_per_step),
                                    unit_policy=policy,
                                    reducer=build_grad_reducer(
                                        config, self.world_size, self.device_layer,
                                        wire=WireCounter(self.node_layout, self.rank)),
                                    gatherer=build_param_gatherer(
                                        config, self.device_layer,
                                        wire=WireCounter(self.node_layout, self.rank),
                                        secondary=hpz_group),
                                    device_layer=self.device_layer,
                                    plan=self.placement_plan, secondary=hpz_group,
                                    master_dtype=config.master_dtype,
                                    comm_dtypes=self.torch_autocast.comm_dtypes(model, zc.stage),
                                    grad_accum_dtype=config.grad_accum_torch_dtype)
        masters = self.sharded.master_groups(group_hparams)
        opt_cfg = config.optimizer
        bf16_masters = config.bf16.bf16_master_weights_and_grads
        rounding = config.zerolite.master_rounding
        basic = build_optimizer(opt_cfg.type if opt_cfg else None,
                                opt_cfg.params if opt_cfg else None, optimizer, masters,
                                cpu_optimizer=zc.offload_optimizer is not None,
                                master_rounding=rounding if bf16_masters else None,
                                bf16_optimizer_states=config.bf16.bf16_optimizer_states,
                                rules=ZeroOptimizerRules(
                                    stage=zc.stage,
                                    allow_untested=config.zero_allow_untested_optimizer,
                                    force_ds_cpu_optimizer=config.zero_force_ds_cpu_optimizer))
        if bf16_masters and basic is not None:
            check_master_optimizer(basic, offloaded=zc.offload_optimizer is not None,
                                   bf16_states=config.bf16.bf16_optimizer_states,
                                   master_rounding=rounding)
        self.basic_optimizer = self.placement_plan.wrap_optimizer(basic)
        """The torch optimizer over the master shards (DeepSpeed's `engine.basic_optimizer`)."""
        if basic is not None:
            self.optimizer = ZeroOptimizer(self.basic_optimizer, update=self._apply_update,
                                           zero_grad=self.zero_grad)
            self.sharded.parameter_offload.attach_to(self.optimizer)  # .parameter_offload
        else:  # as DeepSpeed's stage 3 without an optimizer: its DeepSpeedZeRoOffload
            self.optimizer = self.sharded.parameter_offload if zc.stage == 3 else None
        """What initialize returns: stepping it is the whole update (zero_optimizer.py).
        Without an optimizer: at stage 3 the object that owns the module hooks (TRL's
        generation helpers remove and restore them through it), else None."""
        # deepspeed.utils.safe_get_full_optimizer_state & co.
        self.fragments = TensorFragments(self.sharded, self.basic_optimizer)
        self.loss_scaler = LossScaler.from_config(config.fp16) if config.fp16.enabled else None
        self.amp_scaler = AmpGradScaler() if self.torch_autocast.needs_grad_scaler else None
        """torch_autocast in fp16: the GradScaler DeepSpeed adds ([Note: torch_autocast])."""
        self._skips_nonfinite = skips_nonfinite_steps(config)
        self.lr_scheduler = self._build_scheduler(lr_scheduler)
        self.training_dataloader = self._build_dataloader(training_data, collate_fn)
        self.global_steps = 0
        self.global_samples = 0
        self.micro_steps = 0
        self.skipped_steps = 0
        self._global_grad_norm: float | None = None
        self._last_step_skipped = False
        self._step_applied = False
        self._boundary_override: bool | None = None
        self._in_engine_backward = False
        self._loss_scaled_by_user = False  # engine.scale(loss) before a loss.backward()
        self._torch_backward_start: float | None = None
        self._last_step_time = time.perf_counter()
        self.monitor = TrainingMonitor(config, self.rank, self.world_size)
        self.tput_timer = ThroughputTimer(self.train_batch_size())
        """DeepSpeed's throughput counters (monitor.py); started in forward, stopped in step."""
        self._window = _StepWindow()
        self.last_step_stats = None
        """Communication/compute accounting of the last optimizer step (zero/step_stats.py)."""
        self._wire_seen: dict = {}
        """(owner, counter, label) -> bytes counted by the end of the previous step."""

    # -- construction helpers ---------------------------------------------------------
    def _build_scheduler(self, client_scheduler):
        if client_scheduler is not None:
            if callable(client_scheduler) and not hasattr(client_scheduler, "step"):
                return client_scheduler(self.basic_optimizer)  # as DeepSpeed
            # Over the client's optimizer it already drives ours (the same object, or its
            # groups under the NVMe wrapper). Over another one (e.g. with a config-built
            # optimizer): point it at ours, lr included.
            if getattr(client_scheduler, "optimizer", None) not in (None, self.basic_optimizer):
                client_scheduler.optimizer = self.basic_optimizer
                if hasattr(client_scheduler, "get_last_lr"):
                    for group, lr in zip(self.basic_optimizer.param_groups,
                                         client_scheduler.get_last_lr()):
                        group["lr"] = lr
            return client_scheduler
        sched = self._config.scheduler
        if sched is None or self.basic_optimizer is None:
            return None
        from zerolite.optim.lr_schedules import build_lr_scheduler_from_config

        return build_lr_scheduler_from_config(self.basic_optimizer, sched)

    def _build_dataloader(self, training_data, collate_fn):
        """initialize's training_data as DeepSpeed loads it (deepspeed_io), in this process."""
        if training_data is None:
            return None
        return self.deepspeed_io(training_data, collate_fn=collate_fn, pin_memory=False,
                                 num_local_io_workers=0)

    # -- the training loop -------------------------------------------------------------
    def forward(self, *args, **kwargs):
        set_phase("forward")
        if self.module.training:
            self.tput_timer.start()
        start = time.perf_counter()
        if self._config.fp16.enabled and self._config.fp16.auto_cast:
            args, kwargs = tree_map(_to_half, (args, kwargs))
        with self.sharded.forward_context(), self.torch_autocast.forward_context():
            out = self.module(*args, **kwargs)
        self._arm_torch_style_backward(out)
        self._window.forward_s += time.perf_counter() - start
        first = args[0] if args else None
        if isinstance(first, torch.Tensor) and first.dim() == 2 and not first.is_floating_point():
            self._window.tokens += first.numel() * self.world_size
        return out

    def backward(self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True):
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ZeroliteStateError("engine.backward(loss) needs a scalar loss tensor, got "
                                     f"{type(loss).__name__} {getattr(loss, 'shape', '')}")
        # DeepSpeed returns the loss it backpropagated before the fp16 scale: divided by the
        # accumulation steps when scale_wrt_gas (programs log `engine.backward(loss)`).
        gas_scaled = loss / self.gradient_accumulation_steps() if scale_wrt_gas else loss
        scaled = self._scaled_loss(gas_scaled)
        set_phase("backward")
        start = time.perf_counter()
        self.sharded.hide_param_grads()
        self.sharded.set_accumulation_boundary(self.is_gradient_accumulation_boundary())
        self._in_engine_backward = True
        try:
            scaled.backward(retain_graph=retain_graph)
        finally:
            self._in_engine_backward = False
        self.sharded.finish_backward()
        self._window.backward_s += time.perf_counter() - start
        if self._logs_this_step():
            self._window.losses.append(loss.detach().float().item())
        return gas_scaled

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """DeepSpeed's `engine.scale(loss)`: the loss times the fp16 loss scale (the loss
        itself otherwise), for `engine.scale(loss).backward()` in place of engine.backward."""
        if self.basic_optimizer is None:
            raise ZeroliteStateError("engine.scale(loss): no optimizer; add an \"optimizer\" "
                                     "section to the config or pass optimizer= to initialize")
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or loss.grad_fn is None:
            raise ZeroliteStateError("engine.scale(loss) needs a scalar loss tensor with a "
                                     f"grad_fn, got {type(loss).__name__} "
                                     f"{getattr(loss, 'shape', '')}")
        self._loss_scaled_by_user = True
        return self._scaled_loss(loss)

    def _scaled_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss times the fp16 loss scale (in fp32, as DeepSpeed's loss scaler) or the
        torch_autocast GradScaler's (in the loss's dtype, as torch's GradScaler.scale)."""
        if self.loss_scaler is not None:
            return loss.float() * self.loss_scaler.loss_scale
        if self.amp_scaler is not None:
            return loss * self.amp_scaler.loss_scale
        return loss

    # [Note: loss.backward()] As in DeepSpeed >= 0.18, a program may call `loss.backward()`
    # (or `engine.scale(loss).backward()`) instead of `engine.backward(loss)`. The forward arms
    # a hook on the model's outputs that fires once when a backward reaches them; if that
    # backward is not the engine's own it does what engine.backward does around autograd: the
    # accumulation boundary, the 1/gas factor, and the end-of-backward reduction (queued to run
    # when autograd finishes). The 1/gas factor is applied to each parameter gradient as the
    # engine takes it (FlatParam.take_param_grad), not to the outputs' gradients as DeepSpeed
    # does, so it is right whatever the graph: when one output is computed from another (a
    # loss and its logits) or the loss is computed outside the model. fp16 needs the loss
    # scale, so a loss.backward() without engine.scale raises, as under DeepSpeed.
    def _arm_torch_style_backward(self, out) -> None:
        if not torch.is_grad_enabled() or self.basic_optimizer is None:
            return
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)
                   and t.requires_grad]
        if outputs:
            register_multi_grad_hook(outputs, self._begin_torch_style_backward, mode="any")

    def _begin_torch_style_backward(self, _grad) -> None:
        if self._in_engine_backward:
            return
        scaled = self.loss_scaler is not None or self.amp_scaler is not None
        if scaled and not self._loss_scaled_by_user:
            raise RuntimeError(
                "loss.backward() under fp16: the loss must be scaled first; call "
                "engine.scale(loss).backward() or engine.backward(loss)")
        self._loss_scaled_by_user = False
        set_phase("backward")
        self._torch_backward_start = time.perf_counter()
        self.sharded.hide_param_grads()
        self.sharded.set_accumulation_boundary(self.is_gradient_accumulation_boundary())
        self.sharded.set_grad_scale(1.0 / self.gradient_accumulation_steps())
        torch.autograd.Variable._execution_engine.queue_callback(self._end_torch_style_backward)

    def _end_torch_style_backward(self) -> None:
        try:
            self.sharded.finish_backward()
        finally:
            self.sharded.set_grad_scale(1.0)
            self._window.backward_s += time.perf_counter() - self._torch_backward_start

    def _logs_this_step(self) -> bool:
        return (self.global_steps + 1) % self.monitor.steps_per_print == 0

    def is_gradient_accumulation_boundary(self) -> bool:
        if self._boundary_override is not None:
            return self._boundary_override
        return (self.micro_steps + 1) % self.gradient_accumulation_steps() == 0

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        self._boundary_override = is_boundary

    def step(self, lr_kwargs=None) -> None:
        set_phase("step")
        start = time.perf_counter()
        self._step_applied = False
        boundary = self.is_gradient_accumulation_boundary()
        if boundary:
            if self.basic_optimizer is None:
                raise ZeroliteStateError("engine.step(): no optimizer; add an \"optimizer\" "
                                         "section to the config or pass optimizer= to initialize")
            # The optimizer's step is the update (_apply_update); through it, as DeepSpeed's
            # engine does, so a torch scheduler built over it sees the step it tracks.
            self.optimizer.step()
            # As DeepSpeed: a skipped (overflow) step still counts as a global step, but the
            # lr schedule does not advance.
            if self.lr_scheduler is not None and self._step_applied:
                self.lr_scheduler.step(**(lr_kwargs or {}))
            self.global_steps += 1
            LAST.step = self.global_steps  # the watchdog derives step times from this
            self.global_samples += self.train_batch_size()
            self._window.step_s += time.perf_counter() - start
            self._after_optimizer_step()
        else:
            self._window.step_s += time.perf_counter() - start
        self.tput_timer.stop(global_step=boundary)
        self.micro_steps += 1

    def _after_optimizer_step(self) -> None:
        """Per-step telemetry: TrainingMonitor (every rank), comm breakdown when asked."""
        now = time.perf_counter()
        w, self._window = self._window, _StepWindow()
        st = self.last_step_stats = self.sharded.stats.end_step()
        st.compute_s = max(0.0, w.forward_s + w.backward_s - st.all_gather_wait_s
                           - st.reduce_scatter_wait_s)
        self._fill_wire_stats(st)
        breakdown = self._config.wall_clock_breakdown
        loss = None
        if w.losses:  # collected on every rank for exactly the logged steps: one all-reduce
            total = torch.tensor(sum(w.losses) / len(w.losses), dtype=torch.float64,
                                 device=self.device)
            if self.world_size > 1:
                dist.all_reduce(total)
            loss = total.item() / self.world_size
        metrics = {"loss": loss,
                   "lr": self.get_lr()[0] if self.get_lr() else None,
                   "grad_norm": self._global_grad_norm, "samples": self.train_batch_size(),
                   "tokens": w.tokens or None,
                   "step_time_s": now - self._last_step_time}
        if breakdown:
            metrics.update(forward_s=w.forward_s, backward_s=w.backward_s, step_s=w.step_s)
        self._last_step_time = now
        self.monitor.on_step(self.global_steps, metrics)
        if breakdown and self.rank == 0 and self.global_steps % self.monitor.steps_per_print == 0:
            logger.info("zerolite: step %d | compute %.3fs | all_gather %.3fs (exposed %.3fs) | "
                        "reduce %.3fs (exposed %.3fs) | %d gathers, %d prefetched | "
                        "peak gathered %.1f MiB", self.global_steps, st.compute_s,
                        st.all_gather_s, st.all_gather_wait_s, st.reduce_scatter_s,
                        st.reduce_scatter_wait_s, st.gathers, st.prefetched,
                        st.peak_live_bytes / 2**20)

    def _fill_wire_stats(self, st) -> None:
        """This step's bytes from the reducer's and gatherer's cumulative counters."""
        seen, now = self._wire_seen, {}
        totals = {"reduce": 0, "gather": 0}
        for owner, wire in (("reduce", self.sharded.reducer.wire),
                            ("gather", self.sharded.gatherer.wire)):
            for which, counter in (("sent", wire.sent), ("inter_node", wire.inter_node)):
                for label, value in counter.items():
                    now[owner, which, label] = value
                    step = value - seen.get((owner, which, label), 0)
                    if which == "sent":
                        totals[owner] += step
                        st.bytes_by_collective[label] = step
                    else:
                        st.inter_node_bytes += step
                        st.inter_node_bytes_by_collective[label] = step
        self._wire_seen = now
        st.reduce_bytes, st.all_gather_bytes = totals["reduce"], totals["gather"]
        st.secondary_gather_bytes = st.bytes_by_collective.get("secondary_all_gather", 0)

    @torch.no_grad()
    def _apply_update(self) -> None:
        self.sharded.hide_param_grads()  # the step takes the gradients, p.grad ends None
        self.sharded.reduce_deferred_grads()
        cfg = self._config
        if cfg.zero_optimization.stage > 0 or cfg.precision_dtype != torch.float32:
            self.sharded.zero_missing_grads()  # DeepSpeed's ZeRO and fp16/bf16 optimizers
        self.sharded.settle_host_copies()  # the host step reads what the copies wrote
        masters = [f.master for f in self.sharded.flats if f.master is not None]
        grads = [m.grad for m in masters if m.grad is not None]
        # Stage 0 holds whole gradients on every rank: summing over ranks would count N times.
        # The float64 sum of squares is non-finite iff some element is (fp32 squares cannot
        # overflow float64), so the all-reduced norm doubles as the fp16 overflow check.
        norm = global_grad_norm(grads, self.sharded.partitions > 1, device=self.device)
        overflow = not math.isfinite(norm)
        scale = 1.0
        if self.loss_scaler is not None:
            scale = self.loss_scaler.loss_scale
            self.loss_scaler.update_scale(overflow)
        amp = self.amp_scaler
        zero_stage = cfg.zero_optimization.stage
        if amp is not None and zero_stage == 0:
            # torch_autocast fp16 at stage 0: unscaled before clipping; the scaler drops a
            # non-finite step, which DeepSpeed still counts as applied.
            scale = amp.loss_scale
            amp.update(found_inf=overflow)
            if overflow:
                self._global_grad_norm = float("inf")
                for m in masters:
                    m.grad = None
                self.optimizer.overflow = self._last_step_skipped = False
                self._step_applied = True
                return
        skip = overflow and self._skips_nonfinite
        self.optimizer.overflow = self._last_step_skipped = skip
        if skip:
            self.skipped_steps += 1
            self._global_grad_norm = float("inf")
            for m in masters:
                m.grad = None
            return
        if scale != 1.0:
            for g in grads:
                g.mul_(1.0 / scale)
            norm /= scale  # exact for power-of-two scales (all dynamic ones)
        self._global_grad_norm = float("inf") if overflow else norm  # DeepSpeed's NaN is inf
        coef = clip_coefficient(norm, self._config.gradient_clipping)
        if coef is not None:
            for g in grads:
                g.mul_(coef)
        if amp is not None and zero_stage > 0:
            # torch_autocast fp16 at stages 1-3: norm and clipping above saw the scaled
            # gradients (as DeepSpeed's ZeRO step does); GradScaler.step unscales them here.
            for g in grads:
                g.mul_(1.0 / amp.loss_scale)
            amp.update(found_inf=False)
        self.basic_optimizer.step()
        for m in masters:
            m.grad = None
        self.sharded.refresh_params_from_masters()
        self._step_applied = True

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Safe at any time: accumulated shard grads are cleared by step() itself, so this
        only drops grads left over outside an accumulation window."""
        if self.micro_steps % self.gradient_accumulation_steps() == 0:
            self.sharded.drop_grads()

    # -- modes and pass-through --------------------------------------------------------
    def train(self, mode: bool = True):
        self.module.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def __getattr__(self, name):
        # Only called when normal lookup fails: nn.Module's registries (`module` itself is in
        # _modules), then the wrapped model.
        try:
            return super().__getattr__(name)
        except AttributeError:
            pass
        module = self.__dict__.get("_modules", {}).get("module")
        if module is None:
            raise AttributeError(name)
        try:
            return getattr(module, name)
        except AttributeError:
            raise AttributeError(f"{name!r}: neither zerolite's engine nor the wrapped "
                                 f"{type(module).__name__} has this attribute") from None

    @contextmanager
    def no_sync(self):
        """Skip gradient reduction inside (stages 0 and 1): grads accumulate locally and are
        reduced by the next backward outside (stage 0) or at the step (stage 1)."""
        if self.zero_optimization_stage() >= 2:
            raise ZeroliteStateError(
                "no_sync() is not supported with ZeRO stage 2 or 3 (as in DeepSpeed): "
                "gradients are reduce-scattered during backward; use gradient accumulation")
        saved = self.sharded.grad_sync.requires_sync
        self.sharded.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self.sharded.set_requires_gradient_sync(saved)

    # -- accessors (DeepSpeed names) ---------------------------------------------------
    def get_lr(self) -> list[float]:
        opt = self.basic_optimizer
        return [g.get("lr", 0.0) for g in opt.param_groups] if opt is not None else []

    def get_mom(self) -> list:
        """Each group's betas (momentum for SGD / RMSprop style groups); 0.0 where a group has
        neither, as DeepSpeed."""
        out = []
        for g in (self.basic_optimizer.param_groups if self.basic_optimizer else []):
            out.append(g["betas"] if "betas" in g else g.get("momentum", 0.0))
        return out

    def get_global_grad_norm(self) -> torch.Tensor | float | None:
        """The last step's gradient norm before clipping, as DeepSpeed's ZeRO and bf16
        optimizers leave it: a 0-dim tensor on the engine's device (programs call `.item()` on
        it), the float inf after a skipped step ([Note: non-finite gradients]), None before the
        first step. Its dtype is DeepSpeed 0.19's: float64 from stage 3 with the optimizer on
        the device, float32 otherwise. At stage 0 it is a float, as DeepSpeed's fp16/bf16 wrappers keep it (in
        fp32 DeepSpeed keeps no norm there and returns None; zerolite has one)."""
        norm = self._global_grad_norm
        zc = self._config.zero_optimization
        if norm is None or self._last_step_skipped or zc.stage == 0:
            return norm
        wide = zc.stage == 3 and zc.offload_optimizer is None
        return torch.tensor(norm, dtype=torch.float64 if wide else torch.float32,
                            device=self.device)

    def was_step_applied(self) -> bool:
        return self._step_applied

    def memory_stats(self) -> dict:
        """This rank's resident memory and what zerolite itself holds, in bytes."""
        shard = sum(f.shard.numel() * f.shard.element_size() for f in self.sharded.flats)
        master = sum(f.master_nbytes() for f in self.sharded.flats)
        # reduced gradient shards waiting for the step, in the masters' dtype (on the host
        # with offload_optimizer 'cpu': counted under "host"), and stage 0's held 16-bit ones
        grads = sum(f.master.grad.numel() * f.master.grad.element_size()
                    for f in self.sharded.flats if f.master is not None and f.master.grad is not None
                    and f.placement.master_home is not MasterHome.HOST)
        grads += sum(f.reduced_grad.numel() * f.reduced_grad.element_size()
                     for f in self.sharded.flats if f.reduced_grad is not None)
        if isinstance(self.basic_optimizer, ChunkedOffloadOptimizer):
            master += self.basic_optimizer.master_resident_nbytes()  # swapped-out masters' rest
            optim = self.basic_optimizer.resident_state_nbytes()  # its chunk buffers
        else:
            optim = sum(v.numel() * v.element_size() for state in (
                self.basic_optimizer.state.values() if self.basic_optimizer else [])
                for v in state.values() if isinstance(v, torch.Tensor))
        plan = self.placement_plan
        host = plan.host_nbytes(self.sharded.flats, self.basic_optimizer)
        return {"rss": psutil.Process().memory_info().rss, "param_shards": shard,
                "master_shards": master, "grad_shards": grads, "optimizer_state": optim,
                "gathered": self.sharded.gathered_nbytes(),
                # hpZ secondary shards held now: from a unit's forward to its backward
                # (last_step_stats.peak_secondary_bytes: the step's most)
                "secondary_shards": self.sharded.secondary_nbytes(),
                # full-size buffers kept for reuse (the most ever live at once), and the
                # spare / read-ahead shard buffers of offload_param nvme (param_swap.py)
                "buffer_pool": self.sharded.pool.held_bytes(),
                "param_read_buffers": plan.read_buffer_bytes(),
                "host": host}  # the part in host memory apart from the device (offload 'cpu')

    # -- checkpoints (implemented in zerolite.checkpoint) ------------------------------
    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest: bool = True,
                        exclude_frozen_parameters: bool = False):
        from zerolite.checkpoint import save_checkpoint

        with self._checkpoint_event():
            return save_checkpoint(self, save_dir, tag=tag, client_state=client_state or {},
                                   save_latest=save_latest,
                                   exclude_frozen_parameters=exclude_frozen_parameters)

    def load_checkpoint(self, load_dir, tag=None, load_module_strict: bool = True,
                        load_optimizer_states: bool = True, load_lr_scheduler_states: bool = True,
                        load_module_only: bool = False, custom_load_fn=None):
        from zerolite.checkpoint import load_checkpoint

        if custom_load_fn is not None:
            raise ZeroliteStateError("load_checkpoint(custom_load_fn=...) is not supported")
        with self._checkpoint_event():
            return load_checkpoint(self, load_dir, tag=tag,
                                   load_module_strict=load_module_strict,
                                   load_optimizer_states=load_optimizer_states,
                                   load_lr_scheduler_states=load_lr_scheduler_states,
                                   load_module_only=load_module_only)

    def _checkpoint_event(self):
        """Stage 3: parameters released before a checkpoint event, the persistent ones gathered
        after (ShardedModel.checkpoint_event); DeepSpeed does it only where its ZeRO-3
        optimizer exists, so not for an engine without an optimizer."""
        return self.sharded.checkpoint_event() if self.basic_optimizer is not None \
            else nullcontext()

    def save_16bit_model(self, save_dir, save_filename: str = "pytorch_model.bin",
                         exclude_frozen_parameters: bool = False):
        from zerolite.checkpoint import save_16bit_model_as_configured

        with self._checkpoint_event():
            return save_16bit_model_as_configured(
                self, save_dir, save_filename,
                exclude_frozen_parameters=exclude_frozen_parameters)
