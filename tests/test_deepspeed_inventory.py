"""The inventory of DeepSpeed's public API (docs/deepspeed_api.md): every name DeepSpeed
0.19.8 exports from the modules issue 23 lists, and every public method and attribute of its
engine (DeepSpeedEngine), is done, refused, internal (with a reason) or pending (named, for
another open work item); the page is what tools/deepspeed_inventory.py renders now; refused
names really raise DeepSpeedFeatureNotSupported (the engine's, on a real engine:
tests/test_compat_engine_accessors.py)."""
import importlib.util
import json
import os

import pytest

from zerolite.compat import DEEPSPEED_API_VERSION
from zerolite.compat.deepspeed import DeepSpeedFeatureNotSupported
from zerolite.compat.deepspeed._refused_names import REFUSED

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location(
    "deepspeed_inventory", os.path.join(ROOT, "tools", "deepspeed_inventory.py"))
inv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(inv)
_names_spec = importlib.util.spec_from_file_location(
    "deepspeed_names", os.path.join(ROOT, "tools", "deepspeed_names.py"))
names_tool = importlib.util.module_from_spec(_names_spec)
_names_spec.loader.exec_module(names_tool)

_ENGINE_SOURCE = """
class Other:
    def not_the_engine(self):
        self.nor_this = 1


class DeepSpeedEngine(Module):
    def __init__(self, model):
        self.module = model
        self._private = 0
        self.shown = None

        def hook(*args):
            self.set_in_a_closure = True

    def step(self):
        self.global_steps += 1
        self.step = None  # assigned, but it is a method

    def _helper(self):
        self.from_a_private_method = 1

    @property
    def comm_dtype(self):
        return None

    @comm_dtype.setter
    def comm_dtype(self, value):
        self.comm_dtype = value

    @staticmethod
    def is_map_style(obj):
        return True
"""


def test_every_public_name_is_classified():
    version, rows = inv.inventory()
    assert version == DEEPSPEED_API_VERSION
    missing = {m: [r[0] for r in entries if r[2] == "missing"]
               for m, entries in rows.items()}
    missing = {m: names for m, names in missing.items() if names}
    assert not missing, ("DeepSpeed names neither done, refused nor internal (provide them, "
                         f"refuse them in _refused_names.py, or say why they are internal in "
                         f"tools/deepspeed_inventory.py): {missing}")


def test_the_checker_sees_a_missing_name():
    alias = inv.alias_module("deepspeed.utils")
    assert inv.classify("deepspeed.utils", "no_such_helper", alias) == ("missing", "")
    assert inv.classify("deepspeed.utils", "safe_get_full_grad", alias)[0] == "done"


def test_every_engine_name_is_classified():
    rows = inv.engine_inventory()
    missing = [name for name, _, status, _ in rows if status == "missing"]
    assert not missing, ("DeepSpeedEngine names neither done, refused nor internal (provide "
                         "them in zerolite/engine_accessors.py, refuse them in its REFUSED, or "
                         f"say why they are internal in tools/deepspeed_inventory.py): {missing}")
    assert {status for _, _, status, _ in rows} <= {"done", "refused", "internal", "pending"}


def test_the_checker_sees_a_missing_engine_name():
    instance = inv.engine_instance_attributes()
    assert {"module", "optimizer", "global_steps"} <= instance
    assert inv.classify_engine("no_such_method", instance) == ("missing", "")
    assert inv.classify_engine("zero_max_live_parameters", instance)[0] == "done"
    assert inv.classify_engine("offload_states", instance)[0] == "refused"
    assert inv.classify_engine("allreduce_bucket", instance)[0] == "internal"
    # nn.Module's own compile is not DeepSpeed's: only zerolite's classes count
    assert inv.engine_definition("state_dict")[0] is False


def test_engine_notes_and_pending_name_live_names():
    status = {name: s for name, _, s, _ in inv.engine_inventory()}
    assert all(status[name] == "done" for name in inv.ENGINE_NOTES), inv.ENGINE_NOTES
    for name in inv.ENGINE_PENDING:
        assert status[name] == "pending", f"{name} is provided now: remove it from ENGINE_PENDING"


def test_page_is_current():
    with open(inv.PAGE, encoding="utf-8") as f:
        assert f.read() == inv.render(), "run: python tools/deepspeed_inventory.py"


def test_pending_names_are_not_there_yet():
    for module, names in inv.PENDING.items():
        alias = inv.alias_module(module)
        for name in names:
            assert inv.classify(module, name, alias)[0] == "pending", (
                f"{module}.{name} is provided now: remove it from PENDING")


def test_names_json_is_deepspeeds():
    data = json.load(open(inv.NAMES, encoding="utf-8"))
    assert "safe_get_full_fp32_param" in data["modules"]["deepspeed.utils"]
    assert "initialize" in data["modules"]["deepspeed"]
    engine = data["engine"]
    assert (len(engine["methods"]), len(engine["attributes"])) == (180, 71)
    assert engine["methods"]["communication_data_type"] == "property"
    assert engine["methods"]["is_map_style_dataset"] == "staticmethod"
    assert {"tput_timer", "global_steps", "data_parallel_group"} <= set(engine["attributes"])
    assert not set(engine["methods"]) & set(engine["attributes"])


def _fake_deepspeed(root, version="0.19.8"):
    package = root / "deepspeed"
    (package / "runtime").mkdir(parents=True)
    (package / "runtime" / "engine.py").write_text(_ENGINE_SOURCE)
    (package / "git_version_info_installed.py").write_text(f"version='{version}'\n")
    return package


def test_engine_names_are_read_from_the_source(tmp_path):
    names = names_tool.engine_names(str(_fake_deepspeed(tmp_path)))
    assert names == {"methods": {"comm_dtype": "property", "is_map_style": "staticmethod",
                                 "step": "method"},
                     "attributes": ["from_a_private_method", "global_steps", "module",
                                    "set_in_a_closure", "shown"]}


def test_engine_only_refresh_keeps_the_module_names(tmp_path, monkeypatch):
    out = tmp_path / "names.json"
    before = json.load(open(inv.NAMES, encoding="utf-8"))
    out.write_text(json.dumps(before))
    monkeypatch.setattr(names_tool, "OUT", str(out))
    _fake_deepspeed(tmp_path / "src")
    names_tool.main(["--engine-only", "--source", str(tmp_path / "src")])
    after = json.load(open(out, encoding="utf-8"))
    assert after["modules"] == before["modules"]
    assert after["deepspeed_version"] == before["deepspeed_version"]
    assert after["engine"]["methods"]["step"] == "method"
    _fake_deepspeed(tmp_path / "other", version="0.20.0")
    with pytest.raises(SystemExit, match="0.20.0"):
        names_tool.main(["--engine-only", "--source", str(tmp_path / "other")])


@pytest.mark.parametrize("module, name", [(m, n) for m, names in REFUSED.items() for n in names])
def test_refused_names_raise_when_used(module, name):
    obj = getattr(inv.alias_module(module), name)
    with pytest.raises(DeepSpeedFeatureNotSupported, match=name):
        if isinstance(obj, type) or callable(obj):
            obj()
        else:
            obj.anything  # a refused module
