"""ZeRO-3 leaf modules (deepspeed.utils.set_z3_leaf_modules and friends, the
zero_optimization.leaf_module config): DeepSpeed 0.19's matching rules, and what a leaf
changes here: it becomes one unit (one gather) instead of one unit per expert, and training a
routed MoE through it at world 2 matches single-process PyTorch."""
import copy
import logging

import pytest
import torch
import torch.nn as nn

import zerolite
from zerolite.compat.deepspeed import utils as du
from zerolite.testing.multiprocess import run_ranks


class Expert(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return torch.tanh(self.fc(x))


class SpecialExpert(Expert):
    pass


class MoE(nn.Module):
    """Top-1 routing: which experts run depends on the data."""

    def __init__(self, d=6, n=4):
        super().__init__()
        self.router = nn.Linear(d, n)
        self.experts = nn.ModuleList([SpecialExpert(d) if i == 0 else Expert(d) for i in range(n)])

    def forward(self, x):
        choice = self.router(x).argmax(-1)
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            hit = choice == i
            if hit.any():
                out[hit] = expert(x[hit])
        return out


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(3, 6)
        self.moe = MoE()
        self.out = nn.Linear(6, 1)

    def forward(self, x, y):
        return ((self.out(self.moe(self.inp(x))) - y) ** 2).mean()


def test_matching_rules():
    net = Net()
    assert du.set_z3_leaf_modules(net, [Expert]) == list(net.moe.experts)  # subclasses too
    assert all(du.z3_leaf_module(m) for m in net.moe.experts)
    assert du.unset_z3_leaf_modules(net, ["SpecialExpert"]) == [net.moe.experts[0]]
    assert du.get_z3_leaf_modules(net) == list(net.moe.experts)[1:]
    du.unset_z3_leaf_modules(net, [Expert])
    assert du.set_z3_leaf_modules(net, [f"{__name__}.MoE"]) == [net.moe]  # fully qualified
    assert du.set_z3_leaf_modules(net, ["Conv2d"], raise_if_not_found=False) == []
    with pytest.raises(ValueError, match="No modules of type"):
        du.set_z3_leaf_modules(net, ["Conv2d"])
    with pytest.raises(AssertionError, match="types or names"):
        du.set_z3_leaf_modules(net, [3])
    found, missing = du.set_z3_leaf_modules_by_name(net, ["moe.router", "nope"],
                                                    raise_if_not_found=False)
    assert found == [net.moe.router] and missing == ["nope"]
    with pytest.raises(ValueError, match=r"No modules named \['nope'\]"):
        du.set_z3_leaf_modules_by_name(net, ["nope"])
    found, missing = du.set_z3_leaf_modules_by_suffix(net, [".fc", "zzz"], flag=False,
                                                      raise_if_not_found=False)
    assert found == [e.fc for e in net.moe.experts] and missing == ["zzz"]
    assert not any(du.z3_leaf_module(e.fc) for e in net.moe.experts)
    with pytest.raises(ValueError, match="suffixes"):
        du.set_z3_leaf_modules_by_suffix(net, ["zzz"])


def batches():
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(8, 3, generator=g), torch.randn(8, 1, generator=g)) for _ in range(5)]


def config(leaf=None):
    zero = {"stage": 3, "stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 0}
    if leaf is not None:
        zero["leaf_module"] = leaf
    return {"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"lr": 0.02}},
            "zero_optimization": zero}


def _train(rank, world, how):
    net = Net()
    if how == "call":
        du.set_z3_leaf_modules(net, [MoE])
    seen = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: seen.append(record.getMessage())
    logging.getLogger("zerolite").addHandler(handler)
    leaf = {"names": ["moe"], "name_suffixes": ["no_such"]} if how == "config" else None
    engine, *_ = zerolite.initialize(model=net, config=config(leaf))
    units = [u.name for u in engine.sharded.units]
    if how == "none":
        # Not trained: with one unit per expert, ranks routing to different experts gather
        # different units and the collectives never pair up (a hang, as in DeepSpeed without
        # leaves; that is what leaf modules are for).
        return None, units, False, seen
    # (checked before training: the wrong units would make the ranks wait on each other)
    assert units == ["<root>", "moe"], units
    losses = []
    for x, y in batches():
        lo = rank * 4
        loss = engine(x[lo:lo + 4], y[lo:lo + 4])
        engine.backward(loss)
        engine.step()
        total = loss.detach().clone()
        torch.distributed.all_reduce(total)
        losses.append(total.item() / world)
    tagged = all(getattr(p, "ds_z3_leaf_module", None) is net.moe for p in net.moe.parameters())
    return losses, units, tagged, seen


def _reference():
    net = Net()
    opt = torch.optim.Adam(net.parameters(), lr=0.02)
    losses = []
    for x, y in batches():
        loss = net(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("how", ["none", "call", "config"])
def test_leaf_is_one_unit_and_trains_like_pytorch(how):
    losses, units, tagged, warnings = run_ranks(_train, 2, how)[0]
    if how == "none":  # the default policy: one unit per expert
        assert units == ["<root>", "moe.experts.0", "moe.experts.1", "moe.experts.2", "moe.experts.3"]
        assert not tagged
        return
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(_reference()), rtol=1e-5,
                               atol=1e-7)
    assert units == ["<root>", "moe"] and tagged
    if how == "config":
        assert any("name_suffixes" in w and "no_such" in w for w in warnings), warnings


def test_leaf_module_config_is_checked():
    with pytest.raises(zerolite.ZeroliteConfigError, match="leaf_module.names"):
        zerolite.config.load_config(config({"names": [1]}), 1)
    with pytest.raises(zerolite.ZeroliteConfigError, match="leaf_module.classez"):
        zerolite.config.load_config(config({"classez": ["MoE"]}), 1)
    cfg = zerolite.config.load_config(config({"classes": "MoE"}), 1)
    assert cfg.zero_optimization.leaf_module == {"classes": ["MoE"], "names": [],
                                                 "name_suffixes": []}
    default = zerolite.config.load_config(config(), 1).zero_optimization.leaf_module
    assert default["classes"][0].endswith("MixtralSparseMoeBlock")
    assert copy.deepcopy(default) == default
