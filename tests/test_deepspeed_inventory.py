"""The inventory of DeepSpeed's public API (docs/deepspeed_api.md): every name DeepSpeed
0.19.8 exports from the modules issue 23 lists is done, refused, internal (with a reason) or
pending (named, for another open work item); the page is what tools/deepspeed_inventory.py
renders now; refused names really raise DeepSpeedFeatureNotSupported."""
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


@pytest.mark.parametrize("module, name", [(m, n) for m, names in REFUSED.items() for n in names])
def test_refused_names_raise_when_used(module, name):
    obj = getattr(inv.alias_module(module), name)
    with pytest.raises(DeepSpeedFeatureNotSupported, match=name):
        if isinstance(obj, type) or callable(obj):
            obj()
        else:
            obj.anything  # a refused module
