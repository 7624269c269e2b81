"""The documentation: the config reference generated from zerolite/config/ lists every key the
parser accepts (and every key it lists loads without an "unknown key" warning); the README is
short, says `make test`, links only to files that exist, and its quick start runs."""
import dataclasses
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from zerolite.config import (
    KEY_SUPPORT, OPTIMIZER_PARAMS, SCHEDULER_PARAMS, ActivationCheckpointingConfig, Bf16Config,
    Fp16Config, ZeroConfig, ZeroliteConfigWarning, ZeroliteExtrasConfig, ZeroOptimizationConfig,
)
from zerolite.config import batch, core, sections
from zerolite.config._util import REQUIRED
from zerolite.config.support import TOP_LEVEL_IGNORED

REPO = Path(__file__).resolve().parents[1]
SECTIONS = {"fp16": Fp16Config, "bf16": Bf16Config, "zero_optimization": ZeroOptimizationConfig,
            "activation_checkpointing": ActivationCheckpointingConfig,
            "zerolite": ZeroliteExtrasConfig}
REQUIRED_FILL = {"total_num_steps": 100, "cycle_min_lr": 0.01, "cycle_max_lr": 0.1}


@pytest.fixture(scope="module")
def generator():
    spec = importlib.util.spec_from_file_location(
        "config_reference", REPO / "docs" / "gen" / "config_reference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def page_keys(generator) -> list[str]:
    """The keys as the generated page shows them, one per table row."""
    rows = re.findall(r"^\| `([^`]+)` \|", generator.markdown(), flags=re.M)
    assert len(rows) == len(set(rows)), "a key is listed twice"
    return rows


def _plain(key: str) -> str:  # "optimizer.params (Adam).lr" -> "optimizer.params.lr"
    return re.sub(r" \([^)]*\)", "", key)


def accepted_keys() -> set[str]:
    """Every key the parser accepts, read from the parser's own tables."""
    keys = set(KEY_SUPPORT) | set(batch.BATCH_KEYS) | set(core._TOP_MODELLED)
    keys |= set(TOP_LEVEL_IGNORED) | {"amp.enabled"}
    for prefix, cls in SECTIONS.items():
        keys |= {f"{prefix}.{f.name}" for f in dataclasses.fields(cls) if f.init}
        keys |= {f"{prefix}.{k}" for k in (*getattr(cls, "_ALIASES", {}),
                                           *getattr(cls, "_EXTRA_KNOWN", ()))}
    for name, block in _offload_defaults().items():
        keys |= {f"zero_optimization.{name}.{k}" for k in (*block, "pipeline")}
    keys |= {f"{m}.{k}" for m in ("csv_monitor", "tensorboard") for k in sections._MONITOR_DEFAULTS}
    keys |= {"optimizer.type", "optimizer.params", "optimizer.legacy_fusion", "scheduler.type",
             "scheduler.params"}
    keys |= {f"optimizer.params.{k}" for spec in OPTIMIZER_PARAMS.values() for k in spec}
    keys |= {f"scheduler.params.{k}" for spec in SCHEDULER_PARAMS.values() for k in spec}
    return keys


def _offload_defaults() -> dict:
    """The offload blocks' keys and defaults, from their dataclasses (config/offload.py)."""
    from zerolite.config.offload import OffloadOptimizerConfig, OffloadParamConfig

    return {cls._KEY: {f.name: f.default for f in dataclasses.fields(cls)}
            for cls in (OffloadParamConfig, OffloadOptimizerConfig)}


def test_config_reference_lists_every_accepted_key(page_keys):
    documented = {_plain(k) for k in page_keys}
    missing = sorted(accepted_keys() - documented)
    assert not missing, f"keys the config accepts but the reference does not list: {missing}"
    for prefix, cls in SECTIONS.items():  # per section, every field's own row
        for f in dataclasses.fields(cls):
            assert f"{prefix}.{f.name}" in page_keys, (prefix, f.name)
    for type_name, spec in OPTIMIZER_PARAMS.items():  # per optimizer type, every parameter
        for key in spec:
            assert f"optimizer.params ({type_name}).{key}" in page_keys
    for type_name, spec in SCHEDULER_PARAMS.items():
        for key in spec:
            assert f"scheduler.params ({type_name}).{key}" in page_keys


def test_config_reference_rows_carry_status_type_default_and_meaning(generator):
    rows = [r for _, _, part in generator.sections() for r in part]
    assert {r.status for r in rows} == {"honoured", "accepted, no effect", "refused"}
    by_key = {r.key: r for r in rows}
    for key, status in KEY_SUPPORT.items():
        assert by_key[key].status == generator.STATUS[status], key
    reuse = by_key["zero_optimization.stage3_max_reuse_distance"]
    assert (reuse.type, reuse.default) == ("int", "1e9")
    assert "reuse" in reuse.meaning  # the field's docstring
    assert by_key["zero_optimization.overlap_comm"].status == "accepted, no effect"
    assert by_key["amp"].status == "refused"
    assert by_key["optimizer.params (Lamb).lr"].status == "refused"
    assert all(r.meaning for r in rows), [r.key for r in rows if not r.meaning]


def _config_with(key: str) -> dict | None:
    """A config holding `key` (as the page shows it) with a valid value; None to skip."""
    parts = _plain(key).split(".")
    type_name = re.search(r"\(([^)]*)\)", key)
    if parts[0] in SECTIONS and len(parts) == 2:
        cls = SECTIONS[parts[0]]
        name = getattr(cls, "_ALIASES", {}).get(parts[1], parts[1])
        field = {f.name: f for f in dataclasses.fields(cls)}.get(name)
        value = None if field is None else (
            field.default if field.default is not dataclasses.MISSING else field.default_factory())
        return {parts[0]: {parts[1]: value}}
    if parts[0] in ("csv_monitor", "tensorboard") and len(parts) == 2:
        return {parts[0]: {parts[1]: sections._MONITOR_DEFAULTS[parts[1]]}}
    if parts[:2] == ["optimizer", "params"] and type_name:
        spec = OPTIMIZER_PARAMS[type_name.group(1)]
        return {"optimizer": {"type": type_name.group(1), "params": {parts[2]: spec[parts[2]][0]}}}
    if parts[:2] == ["scheduler", "params"] and type_name:
        spec = SCHEDULER_PARAMS[type_name.group(1)]
        params = {k: REQUIRED_FILL[k] for k, (d, _) in spec.items() if d is REQUIRED}
        params.setdefault(parts[2], spec[parts[2]][0])
        return {"scheduler": {"type": type_name.group(1), "params": params}}
    if key == "optimizer.legacy_fusion":
        return {"optimizer": {"type": "AdamW", "legacy_fusion": False}}
    if key == "amp.enabled":
        return {"amp": {"enabled": False}}
    if len(parts) == 1 and parts[0] not in batch.BATCH_KEYS:
        special = {"amp": {"enabled": False}, "bfloat16": {"enabled": False},
                   "managed_gradient_accumulation": True}
        field = {f.name: f for f in dataclasses.fields(ZeroConfig)}.get(parts[0])
        if field is not None and field.default is not dataclasses.MISSING:
            special[parts[0]] = field.default
        elif field is not None:
            special[parts[0]] = {}  # a section: its defaults
        return {parts[0]: special.get(parts[0])}
    return None  # the batch keys (in every config), optimizer/scheduler.type, offload keys


def test_every_listed_key_loads_without_an_unknown_key_warning(page_keys):
    loaded = 0
    for key in page_keys:
        extra = _config_with(key)
        if extra is None:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("error", ZeroliteConfigWarning)
            ZeroConfig.from_dict({"train_batch_size": 2, **extra}, world_size=1)
        loaded += 1
    assert loaded > 200
    with pytest.warns(ZeroliteConfigWarning, match="stage3_prefetch_bucket_sizee"):
        ZeroConfig.from_dict({"train_batch_size": 2, "zero_optimization": {
            "stage3_prefetch_bucket_sizee": 1}}, world_size=1)


def test_config_page_holds_the_marker_the_build_replaces():
    hooks = (REPO / "docs" / "gen" / "hooks.py").read_text()
    marker = re.search(r'MARKER = "([^"]+)"', hooks).group(1)
    assert marker in (REPO / "docs" / "reference" / "config.md").read_text()


def test_readme_is_short_says_make_test_and_links_resolve():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert "`make test`" in text and "`make demo`" in text
    assert "make test" in (REPO / ".ci" / "run").read_text()
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert links
    missing = [link for link in links if "://" not in link and not (REPO / link).exists()]
    assert not missing, missing


def test_readme_quick_start_runs(tmp_path):
    text = (REPO / "README.md").read_text()
    code = re.search(r"## Quick start\n\n```python\n(.*?)```", text, flags=re.S).group(1)
    assert len(code.splitlines()) <= 15
    (tmp_path / "configs").mkdir()
    shutil.copy(REPO / "configs" / "zero3_cpu.json", tmp_path / "configs")
    (tmp_path / "quick_start.py").write_text(code)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "quick_start.py"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == "global_step10"
