"""The config reference page, generated from the config code itself (zerolite/config/).

Every key comes from the tables the parser uses: the dataclass fields of each section (their
type annotation, default and attribute docstring), the sections' aliases and extra known
keys, the top-level keys, the optimizer / scheduler parameter tables and the offload and
monitor blocks; the support status from ``zerolite.config.KEY_SUPPORT``. The docs build
(docs/gen/hooks.py) puts the result into docs/reference/config.md, so the page cannot drift
from the code; tests/test_docs.py checks it lists every key the parser accepts.

    python docs/gen/config_reference.py      # print the Markdown
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from zerolite.config import (  # noqa: E402
    KEY_SUPPORT, OPTIMIZER_PARAMS, SCHEDULER_PARAMS, ActivationCheckpointingConfig, Bf16Config,
    DataTypesConfig, Fp16Config, SparseGradientsConfig, TorchAutocastConfig, ZeroConfig,
    ZeroliteExtrasConfig, ZeroOptimizationConfig,
)
from zerolite.config import batch as _batch  # noqa: E402
from zerolite.config.support import SWITCHED_ON_REFUSED  # noqa: E402
from zerolite.config import core as _core  # noqa: E402
from zerolite.config import sections as _sections  # noqa: E402
from zerolite.config._util import REQUIRED  # noqa: E402
from zerolite.config.support import HONOURED, IGNORED, REJECTED, TOP_LEVEL_IGNORED  # noqa: E402

STATUS = {HONOURED: "honoured", IGNORED: "accepted, no effect", REJECTED: "refused"}

# The offload blocks are dataclasses (zerolite/config/offload.py); their keys' status for
# zerolite is stated here; tests/test_docs.py fails when a block gains a key this table does
# not describe.
OFFLOAD_KEYS = {
    "device": (HONOURED, '"none", "cpu" or "nvme": where the state lives.'),
    "nvme_path": (HONOURED, "Directory for the swap files (one private directory per rank); "
                            "required with device nvme."),
    "pin_memory": (HONOURED, "Pin the host buffers (where CUDA exists)."),
    "buffer_count": (HONOURED, "nvme: shards read ahead, in the recorded fetch order."),
    ("offload_optimizer", "buffer_count"): (IGNORED, "DeepSpeed's swap buffer count; zerolite "
                                                     "always uses two chunk buffer sets."),
    "buffer_size": (IGNORED, "DeepSpeed's parameter buffer size; zerolite reads each shard "
                             "whole (said at start-up)."),
    "max_in_cpu": (IGNORED, "DeepSpeed's cap on parameters kept in CPU memory; not used "
                            "(said at start-up)."),
    "pipeline_read": (IGNORED, "Overlap swap-in with compute; zerolite always pipelines."),
    "pipeline_write": (IGNORED, "Overlap swap-out with compute; zerolite always pipelines."),
    "pipeline": (IGNORED, "Older spelling of pipeline_read/pipeline_write."),
    "fast_init": (IGNORED, "DeepSpeed's faster swap-file initialisation."),
    "ratio": (HONOURED, "Fraction of the optimizer state offloaded (0 < ratio <= 1; < 1 needs "
                        "stage 3)."),
    "super_offload": (REJECTED, "DeepSpeed's SuperOffload; true is refused (not implemented)."),
    "cpuadam_cores_perc": (IGNORED, "DeepSpeed's CPU-Adam core share; torch picks its threads."),
}
PARAM_MEANING = {  # DeepSpeed's (= torch's) meaning of the optimizer and schedule parameters
    "lr": "Learning rate.", "betas": "Coefficients of the running averages.",
    "eps": "Term added to the denominator.", "weight_decay": "Weight decay.",
    "bias_correction": "Correct the moment bias; `false` is refused for Adam/AdamW (torch's "
                       "Adam always corrects).",
    "amsgrad": "AMSGrad variant.",
    "adam_w_mode": "Adam: decoupled weight decay (AdamW) when true, L2 when false. AdamW: "
                   "false is ignored with a warning, as DeepSpeed does.",
    "torch_adam": "Keep torch's default Adam implementation instead of the fused CPU one.",
    "fp32_optimizer_states": "DeepSpeedCPUAdam (offload_optimizer): Adam moments in fp32 "
                             "(default) or, false, in the masters' dtype (bf16 masters); "
                             "bf16.bf16_optimizer_states forces false, as DeepSpeed does.",
    "momentum": "Momentum factor.", "dampening": "Dampening of the momentum.",
    "nesterov": "Nesterov momentum (needs momentum > 0 and dampening 0).",
    "lr_decay": "Learning-rate decay.", "initial_accumulator_value": "Start of the sum of "
                                                                    "squares.",
    "eps_inside_sqrt": "Lamb: eps inside the square root.", "max_grad_norm": "Lamb: clipping.",
    "max_coeff": "Lamb: upper bound of the trust ratio.",
    "alpha": "RMSprop: smoothing constant of the squared-gradient average.",
    "centered": "RMSprop: normalise by the gradient's estimated variance.",
    "momentum_decay": "NAdam: momentum decay.",
    "decoupled_weight_decay": "NAdam/RAdam: decoupled (AdamW-style) weight decay.",
    "rho": "Adadelta: coefficient of the running averages.",
    "min_coeff": "Lamb: lower bound of the trust ratio.",
    "warmup_min_lr": "Learning rate at the start of the warm-up.",
    "warmup_max_lr": "Learning rate at the end of the warm-up (`auto`: optimizer.params.lr).",
    "warmup_num_steps": "Steps of the warm-up.",
    "warmup_type": "Warm-up curve: log or linear.",
    "last_batch_iteration": "Position to resume the schedule at (-1: not started).",
    "total_num_steps": "Steps of the whole schedule (decay ends there).",
    "warmup_min_ratio": "Start of the warm-up, as a fraction of the optimizer's lr.",
    "cos_min_ratio": "End of the cosine decay, as a fraction of the optimizer's lr.",
    "cycle_min_lr": "Lower learning rate of the cycle.",
    "cycle_max_lr": "Upper learning rate of the cycle.",
    "decay_lr_rate": "Learning-rate decay after the cycle.",
    "cycle_first_step_size": "Steps of the cycle's rising half.",
    "cycle_second_step_size": "Steps of the falling half (null: as the first).",
    "cycle_first_stair_count": "Stairs in the rising half (<= 0: none).",
    "cycle_second_stair_count": "Stairs in the falling half (null: as the first).",
    "decay_step_size": "Steps between decays after the cycle.",
    "cycle_momentum": "Cycle the momentum (beta1) inversely to the learning rate.",
    "cycle_min_mom": "Lower momentum of the cycle.", "cycle_max_mom": "Upper momentum.",
    "decay_mom_rate": "Momentum decay after the cycle.",
    "lr_range_test_min_lr": "Starting learning rate.",
    "lr_range_test_step_size": "Steps between increases.",
    "lr_range_test_step_rate": "Increase per step size.",
    "lr_range_test_staircase": "Increase in stairs rather than continuously.",
}
JSON_TYPES = {"str": "string", "dict": "object", "list": "list", "None": "null",
              "OptimizerConfig": "object", "SchedulerConfig": "object", "Fp16Config": "object",
              "Bf16Config": "object", "ZeroOptimizationConfig": "object",
              "ActivationCheckpointingConfig": "object", "ZeroliteExtrasConfig": "object",
              "SparseGradientsConfig": "object", "DataTypesConfig": "object",
              "TorchAutocastConfig": "object"}
MONITOR_MEANING = {"enabled": "Write the monitor's output.",
                   "output_path": "Directory of the output.",
                   "job_name": "Sub-directory / run name."}

@dataclass
class Row:
    key: str
    type: str
    default: str
    meaning: str
    status: str


def attribute_docs(cls) -> dict[str, str]:
    """Field name -> the docstring written under it in the class body."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    out = {}
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            out[node.target.id] = " ".join(nxt.value.value.split())
    return out


def show(value) -> str:
    if value is REQUIRED:
        return "required"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "[" + ", ".join(show(v) for v in value) + "]"
    if isinstance(value, int) and abs(value) >= 10**6:
        return f"{value:.0e}".replace("e+0", "e").replace("e+", "e") if value % 10**6 == 0 \
            else str(value)
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def json_type(annotation: str) -> str:
    """'dict | None' -> 'object or null' (the Python annotation in JSON's words)."""
    return " or ".join(JSON_TYPES.get(t.strip(), t.strip()) for t in str(annotation).split("|"))


def _default(f) -> str:
    if f.default is not dataclasses.MISSING:
        return show(f.default)
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        made = f.default_factory()  # type: ignore[misc]
        return "{...}" if dataclasses.is_dataclass(made) else show(made)
    return "derived"


def _status(key: str, fallback: str = HONOURED) -> str:
    return STATUS[KEY_SUPPORT.get(key, fallback)]


def section_rows(prefix: str, cls) -> list[Row]:
    docs = attribute_docs(cls)
    rows = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        key = f"{prefix}.{f.name}"
        rows.append(Row(key, json_type(f.type), _default(f), docs.get(f.name, ""), _status(key)))
    for alias, name in getattr(cls, "_ALIASES", {}).items():
        key = f"{prefix}.{alias}"
        rows.append(Row(key, "as its target", "", f"Another name for `{name}` (give one of "
                        "them).", _status(key)))
    for extra in sorted(getattr(cls, "_EXTRA_KNOWN", ())):
        key = f"{prefix}.{extra}"
        rows.append(Row(key, "any", "", "DeepSpeed key zerolite does not model; loads without "
                        "effect" + (" (true maps onto the offload block, with a deprecation "
                                    "warning)" if extra in ("cpu_offload", "cpu_offload_param")
                                    else "") + ".", _status(key, IGNORED)))
    return rows


_NESTED_FIELDS = {"checkpoint_tag_validation": "checkpoint.tag_validation"}
"""ZeroConfig fields read from a nested JSON key (the field name is not the key)."""


def top_rows() -> list[Row]:
    docs = attribute_docs(ZeroConfig)
    fields = {f.name: f for f in dataclasses.fields(ZeroConfig)}
    rows = []
    for name in _batch.BATCH_KEYS:
        rows.append(Row(name, "int > 0 or \"auto\"", "derived", docs.get(name, "") + " Any two "
                        "give the third (DeepSpeed's rules; sizes must divide exactly).",
                        _status(name)))
    for name, f in fields.items():
        if name in _batch.BATCH_KEYS or name in ("raw", "world_size"):
            continue
        key = _NESTED_FIELDS.get(name, name)
        rows.append(Row(key, json_type(f.type), _default(f), docs.get(name, ""), _status(key)))
    rows.append(Row("bfloat16", "object", "", "Legacy name of `bf16` (give one of them).",
                    _status("bfloat16")))
    rows.append(Row("amp", "object", "", "apex AMP. `amp.enabled: true` is refused (use fp16 "
                    "or bf16); disabled, it loads.", _status("amp")))
    rows.append(Row("amp.enabled", "bool", "false", "Switch apex AMP on: refused.",
                    STATUS[REJECTED]))
    rows.append(Row("managed_gradient_accumulation", "bool", "true", "The engine counts "
                    "micro-steps and reduces gradients at the accumulation boundary. `false` "
                    "(DeepSpeed's caller-owned boundary, where step() alone reduces) is refused.",
                    _status("managed_gradient_accumulation")))
    for name in TOP_LEVEL_IGNORED:
        if name not in fields and name not in _core._TOP_MODELLED:
            rows.append(Row(name, "any", "", "DeepSpeed feature zerolite does not have; the "
                            "key loads without effect.", _status(name, IGNORED)))
    for key, (when, why) in SWITCHED_ON_REFUSED.items():
        if key.split(".")[0] in TOP_LEVEL_IGNORED and "." in key:
            kind = {"true": "bool", "> 1": "int", "set": "object"}[when]
            rows.append(Row(key, kind, "", f"Refused when switched on ({when}): {why}.",
                            STATUS[REJECTED]))
    return rows


def offload_defaults() -> dict:
    """The defaults of the two offload blocks, from their dataclasses (config/offload.py);
    `device` shows "none": no block means no offload."""
    from dataclasses import fields

    from zerolite.config.offload import OffloadOptimizerConfig, OffloadParamConfig

    out = {}
    for cls in (OffloadParamConfig, OffloadOptimizerConfig):
        out[cls._KEY] = {**{f.name: f.default for f in fields(cls)}, "device": "none"}
    return out


def offload_rows() -> list[Row]:
    rows = []
    for block, defaults in offload_defaults().items():
        for key in sorted(set(defaults) | {"pipeline"}):
            status, meaning = OFFLOAD_KEYS.get((block, key)) or OFFLOAD_KEYS[key]
            default = show(defaults[key]) if key in defaults else ""
            typ = {"device": "string", "nvme_path": "string or null", "ratio": "float"}.get(
                key, type(defaults.get(key, False)).__name__)
            rows.append(Row(f"zero_optimization.{block}.{key}", typ, default, meaning,
                            STATUS[status]))
    return rows


def monitor_rows() -> list[Row]:
    return [Row(f"{mon}.{key}", type(default).__name__, show(default), MONITOR_MEANING[key],
                STATUS[HONOURED])
            for mon in ("csv_monitor", "tensorboard")
            for key, default in _sections._MONITOR_DEFAULTS.items()]


def table_rows(prefix: str, spec: dict) -> list[Row]:
    return [Row(f"{prefix}.{key}", rule.describe, show(default),
                PARAM_MEANING.get(key, ""), STATUS[HONOURED]) for key, (default, rule) in spec.items()]


def sections() -> list[tuple[str, str, list[Row]]]:
    """(title, intro, rows) of every part of the page, in page order."""
    opt_types = ", ".join(f"`{t}`" for t in OPTIMIZER_PARAMS)
    sch_types = ", ".join(f"`{t}`" for t in SCHEDULER_PARAMS)
    parts = [
        ("Top level", "Keys at the top of the JSON object.", top_rows()),
        ("zero_optimization", "The ZeRO stage and its knobs.",
         section_rows("zero_optimization", ZeroOptimizationConfig)),
        ("Offload blocks", "`zero_optimization.offload_optimizer` and "
         "`zero_optimization.offload_param` (see [Offload](../offload.md)).", offload_rows()),
        ("fp16", "float16 mixed precision with loss scaling.", section_rows("fp16", Fp16Config)),
        ("bf16", "bfloat16 mixed precision (legacy name `bfloat16`).",
         section_rows("bf16", Bf16Config)),
        ("data_types", "Per-kind dtypes under fp16/bf16 (DeepSpeed >= 0.19).",
         section_rows("data_types", DataTypesConfig)),
        ("torch_autocast", "DeepSpeed's autocast mode: fp32 parameters, the forward under "
         "`torch.autocast` (see [Migrating](../migrating.md#torch_autocast)).",
         section_rows("torch_autocast", TorchAutocastConfig)),
        ("zerolite", "zerolite's own block (`\"zerolite\": {...}`); DeepSpeed has no such "
         "keys. The watchdog keys can be overridden by environment variables (see "
         "[the watchdog](../watchdog.md)).", section_rows("zerolite", ZeroliteExtrasConfig)),
        ("zerolite.sparse_gradients", "Top-k sparsified gradients with error feedback "
         "(stages 2-3; refused at stages 0-1 and with `zero_quantized_gradients`); see "
         "[Architecture](../architecture.md#sparsified-gradients-top-k-with-error-feedback).",
         section_rows("zerolite.sparse_gradients", SparseGradientsConfig)),
        ("activation_checkpointing", "Accepted so DeepSpeed configs load; use "
         "`zerolite.checkpointing` for activation checkpointing.",
         section_rows("activation_checkpointing", ActivationCheckpointingConfig)),
        ("Monitors", "`csv_monitor` and `tensorboard`.", monitor_rows()),
        ("optimizer", f"`optimizer.type` is one of {opt_types} (case-insensitive); `Lamb` "
         "loads but is refused when the engine builds it (its per-parameter trust ratio needs "
         "norms across shards). `optimizer.legacy_fusion` loads without effect.",
         [Row("optimizer.type", "string", "", "Which optimizer the engine builds over the "
              "fp32 shards.", _status("optimizer.type")),
          Row("optimizer.params", "object", "{}", "Hyper-parameters of the chosen type (below); "
              "DeepSpeed's defaults fill in the rest.", _status("optimizer.params")),
          Row("optimizer.legacy_fusion", "any", "", "DeepSpeed fp16 option; loads without "
              "effect.", STATUS[IGNORED])]
         + [r for t, spec in OPTIMIZER_PARAMS.items()
            for r in table_rows(f"optimizer.params ({t})", spec)]),
        ("scheduler", f"`scheduler.type` is one of {sch_types}. An unknown parameter is an "
         "error when the config loads.",
         [Row("scheduler.type", "string", "", "Which DeepSpeed learning-rate schedule.",
              _status("scheduler.type")),
          Row("scheduler.params", "object", "{}", "Parameters of the chosen schedule (below); "
              "required ones must be given.", _status("scheduler.params"))]
         + [r for t, spec in SCHEDULER_PARAMS.items()
            for r in table_rows(f"scheduler.params ({t})", spec)]),
    ]
    for _, _, rows in parts:
        for r in rows:
            if r.key.startswith("optimizer.params (Lamb)"):
                r.status = STATUS[REJECTED]
    return parts


def documented_keys() -> set[str]:
    """Every dotted key on the page ("optimizer.params (Adam).lr" -> "optimizer.params.lr")."""
    out = set()
    for _, _, rows in sections():
        for r in rows:
            out.add(r.key.split(" (")[0] + ("." + r.key.rsplit(".", 1)[1] if " (" in r.key
                                            else ""))
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown() -> str:
    lines = []
    for title, intro, rows in sections():
        lines += [f"### {title}", "", intro, "",
                  "| key | type | default | meaning | zerolite |", "|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| `{_cell(r.key)}` | {_cell(r.type)} | {_cell(r.default)} | "
                         f"{_cell(r.meaning)} | {r.status} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown())
