"""zerolite.optim.lr_schedules against closed forms of DeepSpeed's schedule formulas.

The reference functions below are written from DeepSpeed's formulas (lr_schedules.py / docs),
independently of the classes: ``it`` is last_batch_iteration, -1 meaning "just constructed".
"""

import json
import math

import pytest
import torch

from zerolite.errors import ZeroliteConfigError
from zerolite.optim.lr_schedules import (
    SCHEDULER_TYPES,
    LRRangeTest,
    OneCycle,
    WarmupCosineLR,
    WarmupDecayLR,
    WarmupLR,
    build_lr_scheduler,
)

STEPS = 1200


# ----------------------------------------------------------------------------- references

def ref_warmup_gamma(it, warmup, kind):
    warmup = max(2, warmup)
    if kind == "log":
        return math.log(it + 1) / math.log(warmup)
    return it / warmup


def ref_warmup_lr(it, lo, hi, warmup, kind):
    if it < 0:
        return lo
    if it < max(2, warmup):
        return lo + (hi - lo) * ref_warmup_gamma(it, warmup, kind)
    return hi


def ref_warmup_decay_lr(it, lo, hi, warmup, total, kind):
    if it < 0:
        return lo
    w = max(2, warmup)
    if it < w:
        gamma = ref_warmup_gamma(it, warmup, kind)
    else:
        gamma = max(0.0, (total - it) / max(1, total - w))
    return lo + (hi - lo) * gamma


def ref_cosine_lr(it, base_lr, warmup, total, warmup_min_ratio, cos_min_ratio, kind):
    if it < 0:
        return 0.0
    w = max(2, warmup)
    if it < w:
        ratio = warmup_min_ratio + (1 - warmup_min_ratio) * ref_warmup_gamma(it, warmup, kind)
    else:
        progress = min(1.0, (it - w + 1) / max(1, total - w))
        ratio = cos_min_ratio + (1 - cos_min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return base_lr * ratio


def ref_onecycle(it, lo, hi, s1, s2=None, n1=0, n2=None, decay_step=0, lr_rate=0.0,
                 mom_lo=0.8, mom_hi=0.9, mom_rate=0.0):
    """(lr, momentum) at iteration it."""
    s2 = s1 if s2 is None else s2
    n2 = n1 if n2 is None else n2
    total = s1 + s2
    if it < 0:
        return lo, mom_lo  # construction writes cycle_min_lr and cycle_min_mom
    if it < total:
        k = (it + 1) % total  # batches into the cycle, 0..total-1
        if k <= s1:
            frac = k / s1 if n1 <= 0 else math.floor(k * n1 / s1) / n1
        else:
            frac = (total - k) / s2 if n2 <= 0 else math.floor((total - k) * n2 / s2) / n2
        return lo + (hi - lo) * frac, mom_hi - (mom_hi - mom_lo) * frac
    d = it - total + 1
    lr = lo if (decay_step == 0 or lr_rate == 0) else lo / (1 + lr_rate * d / decay_step)
    mom = mom_hi if (decay_step == 0 or mom_rate == 0) else mom_hi * (1 + mom_rate * d / decay_step)
    return lr, mom


def ref_range_test(it, lo, size, rate, staircase):
    x = (it + 1) / size
    if staircase:
        x = math.floor(x)
    return lo * (1 + rate * x)


# ----------------------------------------------------------------------------- helpers

def make_opt(kind="adam", lrs=(0.01,)):
    groups = [{"params": [torch.nn.Parameter(torch.zeros(2))], "lr": lr} for lr in lrs]
    if kind == "adam":
        return torch.optim.AdamW(groups, betas=(0.9, 0.999))
    return torch.optim.SGD(groups, momentum=0.5)


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)


def check_lrs(opt, sched, expected, it):
    got = [g["lr"] for g in opt.param_groups]
    assert all(close(g, e) for g, e in zip(got, expected)), (it, got, expected)
    assert all(close(g, e) for g, e in zip(sched.get_last_lr(), expected)), it


def run_and_check(opt, sched, ref_per_group, steps=STEPS):
    """ref_per_group(it) -> list of expected lrs; checks construction and every step."""
    check_lrs(opt, sched, ref_per_group(-1), -1)
    for it in range(steps):
        sched.step()
        assert sched.last_batch_iteration == it
        check_lrs(opt, sched, ref_per_group(it), it)
        assert all(close(a, b) for a, b in zip(sched.get_lr(), ref_per_group(it)))


# ----------------------------------------------------------------------------- schedules

@pytest.mark.parametrize("kind,warmup,lo,hi", [
    ("log", 100, 0.0, 1e-3),
    ("linear", 250, [1e-5, 2e-5], [1e-3, 3e-3]),
    ("log", 1, 1e-4, 2e-3),  # warmup_num_steps is raised to 2
    ("linear", 1000, 0.0, [5e-4, 1e-3]),
])
def test_warmup_lr(kind, warmup, lo, hi):
    n = len(hi) if isinstance(hi, list) else len(lo) if isinstance(lo, list) else 1
    opt = make_opt(lrs=[0.1] * n)
    sched = WarmupLR(opt, warmup_min_lr=lo, warmup_max_lr=hi, warmup_num_steps=warmup, warmup_type=kind)
    los = lo if isinstance(lo, list) else [lo] * n
    his = hi if isinstance(hi, list) else [hi] * n
    run_and_check(opt, sched, lambda it: [ref_warmup_lr(it, a, b, warmup, kind) for a, b in zip(los, his)])


def test_warmup_lr_default_max_is_optimizer_lr():
    opt = make_opt(lrs=[0.02])
    sched = WarmupLR(opt, warmup_num_steps=10)
    for _ in range(20):
        sched.step()
    assert close(opt.param_groups[0]["lr"], 0.02)


@pytest.mark.parametrize("kind,warmup,total,lo,hi", [
    ("log", 100, 1000, 0.0, 1e-3),
    ("linear", 200, 1100, [1e-5, 0.0], [1e-3, 2e-3]),
    ("linear", 300, 200, 0.0, 1e-3),  # total < warmup: decay window clamps to 1 step
])
def test_warmup_decay_lr(kind, warmup, total, lo, hi):
    n = 2 if isinstance(hi, list) else 1
    opt = make_opt("sgd", lrs=[0.1] * n)
    sched = WarmupDecayLR(opt, total_num_steps=total, warmup_min_lr=lo, warmup_max_lr=hi,
                          warmup_num_steps=warmup, warmup_type=kind)
    los = lo if isinstance(lo, list) else [lo] * n
    his = hi if isinstance(hi, list) else [hi] * n
    run_and_check(opt, sched,
                  lambda it: [ref_warmup_decay_lr(it, a, b, warmup, total, kind) for a, b in zip(los, his)])
    assert close(opt.param_groups[0]["lr"], los[0])  # decayed back to warmup_min_lr


@pytest.mark.parametrize("kind,warmup,total,wmin,cmin", [
    ("log", 100, 1000, 0.0, 0.0001),
    ("linear", 150, 900, 0.1, 0.01),
    ("linear", 50, 40, 0.2, 0.05),  # total < warmup
])
def test_warmup_cosine_lr(kind, warmup, total, wmin, cmin):
    base = [0.01, 0.003]
    opt = make_opt(lrs=base)
    sched = WarmupCosineLR(opt, total_num_steps=total, warmup_min_ratio=wmin, warmup_num_steps=warmup,
                           cos_min_ratio=cmin, warmup_type=kind)
    run_and_check(opt, sched,
                  lambda it: [ref_cosine_lr(it, b, warmup, total, wmin, cmin, kind) for b in base])
    assert close(opt.param_groups[0]["lr"], base[0] * cmin)


ONECYCLE_CASES = [
    dict(cycle_min_lr=1e-4, cycle_max_lr=1e-3, cycle_first_step_size=400),
    dict(cycle_min_lr=1e-4, cycle_max_lr=1e-3, cycle_first_step_size=300, cycle_second_step_size=500,
         cycle_first_stair_count=5, cycle_second_stair_count=8, decay_step_size=50, decay_lr_rate=0.1,
         decay_mom_rate=0.001),
    dict(cycle_min_lr=2e-4, cycle_max_lr=2e-3, cycle_first_step_size=3, cycle_second_step_size=7,
         cycle_first_stair_count=3, decay_step_size=10, decay_lr_rate=0.5, cycle_min_mom=0.85,
         cycle_max_mom=0.95),
    dict(cycle_min_lr=1e-4, cycle_max_lr=5e-3, cycle_first_step_size=250, cycle_second_step_size=250,
         decay_step_size=100, decay_lr_rate=0.0, decay_mom_rate=0.0),  # decay phase holds
]


@pytest.mark.parametrize("opt_kind", ["adam", "sgd"])
@pytest.mark.parametrize("case", ONECYCLE_CASES)
def test_onecycle(case, opt_kind):
    opt = make_opt(opt_kind, lrs=[0.5, 0.5])
    sched = OneCycle(opt, **case)
    args = dict(lo=case["cycle_min_lr"], hi=case["cycle_max_lr"], s1=case["cycle_first_step_size"],
                s2=case.get("cycle_second_step_size"), n1=case.get("cycle_first_stair_count", 0),
                n2=case.get("cycle_second_stair_count"), decay_step=case.get("decay_step_size", 0),
                lr_rate=case.get("decay_lr_rate", 0.0), mom_lo=case.get("cycle_min_mom", 0.8),
                mom_hi=case.get("cycle_max_mom", 0.9), mom_rate=case.get("decay_mom_rate", 0.0))

    def check(it):
        lr, mom = ref_onecycle(it, **args)
        check_lrs(opt, sched, [lr, lr], it)
        for g in opt.param_groups:
            if opt_kind == "adam":
                assert close(g["betas"][0], mom) and g["betas"][1] == 0.99, (it, g["betas"], mom)
            else:  # as DeepSpeed: no betas in the defaults, so momentum is not cycled
                assert g["momentum"] == 0.5, (it, g["momentum"])

    check(-1)
    for it in range(STEPS):
        sched.step()
        check(it)
        if opt_kind == "sgd":
            assert sched.get_mom() is None
        else:
            assert all(close(m, ref_onecycle(it, **args)[1]) for m in sched.get_mom())


def test_onecycle_per_group_lists_and_no_momentum():
    opt = make_opt("adam", lrs=[0.1, 0.1])
    sched = OneCycle(opt, cycle_min_lr=[1e-4, 1e-5], cycle_max_lr=[1e-3, 1e-4], cycle_first_step_size=200,
                     cycle_second_step_size=300, cycle_first_stair_count=4, decay_step_size=20,
                     decay_lr_rate=0.2, cycle_momentum=False)
    run_and_check(opt, sched, lambda it: [
        ref_onecycle(it, 1e-4, 1e-3, 200, 300, 4, None, 20, 0.2)[0],
        ref_onecycle(it, 1e-5, 1e-4, 200, 300, 4, None, 20, 0.2)[0]])
    assert opt.param_groups[0]["betas"] == (0.9, 0.999)  # untouched
    assert sched.get_mom() is None


def test_onecycle_peak_reached_with_stairs():
    opt = make_opt()
    sched = OneCycle(opt, cycle_min_lr=0.1, cycle_max_lr=1.0, cycle_first_step_size=3,
                     cycle_second_step_size=7, cycle_first_stair_count=3, cycle_second_stair_count=7)
    seen = []
    for _ in range(10):
        sched.step()
        seen.append(sched.get_last_lr()[0])
    assert max(seen) == 1.0


@pytest.mark.parametrize("staircase", [False, True])
@pytest.mark.parametrize("lo,size,rate", [(1e-4, 100, 1.0), ([1e-5, 3e-5], 37, 0.25)])
def test_lr_range_test(lo, size, rate, staircase):
    los = lo if isinstance(lo, list) else [lo]
    opt = make_opt("sgd", lrs=[0.1] * len(los))
    sched = LRRangeTest(opt, lr_range_test_min_lr=lo, lr_range_test_step_size=size,
                        lr_range_test_step_rate=rate, lr_range_test_staircase=staircase)
    run_and_check(opt, sched, lambda it: [ref_range_test(it, a, size, rate, staircase) for a in los])


# ----------------------------------------------------------------------------- state / builder

ALL_CONFIGS = [
    ("WarmupLR", {"warmup_min_lr": 0, "warmup_max_lr": 0.001, "warmup_num_steps": 100, "warmup_type": "linear"}),
    ("WarmupDecayLR", {"total_num_steps": 500, "warmup_max_lr": 0.002, "warmup_num_steps": 50}),
    ("WarmupCosineLR", {"total_num_steps": 500, "warmup_num_steps": 50, "warmup_min_ratio": 0.1}),
    ("OneCycle", {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_step_size": 100,
                  "cycle_first_stair_count": 4, "decay_step_size": 10, "decay_lr_rate": 0.1,
                  "decay_mom_rate": 0.01}),
    ("LRRangeTest", {"lr_range_test_min_lr": 1e-4, "lr_range_test_step_size": 10,
                     "lr_range_test_staircase": True}),
]


@pytest.mark.parametrize("type_name,params", ALL_CONFIGS)
def test_state_dict_round_trip(type_name, params):
    opt_a = make_opt(lrs=[0.01, 0.02])
    a = build_lr_scheduler(opt_a, type_name, params)
    for _ in range(137):
        a.step()
    sd = json.loads(json.dumps(a.state_dict()))
    assert sd == {"last_batch_iteration": 136}

    opt_b = make_opt(lrs=[0.01, 0.02])
    b = build_lr_scheduler(opt_b, type_name, params)
    b.load_state_dict(sd)
    for _ in range(400):
        a.step()
        b.step()
        assert a.get_last_lr() == b.get_last_lr()
        assert [g["lr"] for g in opt_a.param_groups] == [g["lr"] for g in opt_b.param_groups]
        assert [g["betas"] for g in opt_a.param_groups] == [g["betas"] for g in opt_b.param_groups]


def test_step_with_explicit_iteration_and_resume_constructor():
    opt = make_opt()
    sched = WarmupDecayLR(opt, total_num_steps=100, warmup_num_steps=10, last_batch_iteration=41)
    assert opt.param_groups[0]["lr"] == 0.01  # resuming: nothing applied until step()
    sched.step()
    assert close(opt.param_groups[0]["lr"], ref_warmup_decay_lr(42, 0.0, 0.001, 10, 100, "log"))
    sched.step(7)
    assert close(opt.param_groups[0]["lr"], ref_warmup_decay_lr(7, 0.0, 0.001, 10, 100, "log"))


def test_tensor_lr_stays_tensor():
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.Adam([p], lr=torch.tensor(0.01))
    sched = WarmupLR(opt, warmup_max_lr=0.001, warmup_num_steps=10, warmup_type="linear")
    sched.step()
    sched.step()
    assert isinstance(opt.param_groups[0]["lr"], torch.Tensor)
    assert math.isclose(opt.param_groups[0]["lr"].item(), 0.0001, rel_tol=1e-6)
    assert isinstance(sched.get_last_lr()[0], float)


def test_scheduler_types():
    assert SCHEDULER_TYPES == ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest")
    for name, params in ALL_CONFIGS:
        assert type(build_lr_scheduler(make_opt(), name, params)).__name__ == name


@pytest.mark.parametrize("type_name,params,needles", [
    ("Cosine", {}, ["scheduler.type", "'Cosine'", "WarmupCosineLR", "OneCycle"]),
    ("warmuplr", {}, ["scheduler.type", "'warmuplr'", "WarmupLR"]),
    ("WarmupDecayLR", {"warmup_num_steps": 10}, ["scheduler.params.total_num_steps"]),
    ("WarmupCosineLR", {}, ["scheduler.params.total_num_steps"]),
    ("OneCycle", {"cycle_max_lr": 0.1}, ["scheduler.params.cycle_min_lr"]),
    ("WarmupLR", {"warmup_type": "cosine"}, ["scheduler.params.warmup_type", "'cosine'"]),
    ("WarmupLR", {"warmup_num_steps": "100"}, ["scheduler.params.warmup_num_steps", "'100'"]),
    ("WarmupLR", {"warmup_num_steps": 0}, ["scheduler.params.warmup_num_steps"]),
    ("WarmupLR", {"warmup_num_steps": 10.5}, ["scheduler.params.warmup_num_steps"]),
    ("WarmupLR", {"warmup_max_lr": -1.0}, ["scheduler.params.warmup_max_lr"]),
    ("WarmupLR", {"warmup_max_lr": [0.1, 0.2, 0.3]}, ["scheduler.params.warmup_max_lr", "param group"]),
    ("WarmupLR", {"warmup_max_lr": 0.1, "lr": 0.1}, ["scheduler.params.lr", "unknown"]),
    ("WarmupDecayLR", {"total_num_steps": -5}, ["scheduler.params.total_num_steps"]),
    ("WarmupCosineLR", {"total_num_steps": 10, "cos_min_ratio": 2.0}, ["scheduler.params.cos_min_ratio"]),
    ("OneCycle", {"cycle_min_lr": 0.1, "cycle_max_lr": 1, "cycle_momentum": "yes"},
     ["scheduler.params.cycle_momentum"]),
    ("OneCycle", {"cycle_min_lr": 0.1, "cycle_max_lr": 1, "cycle_second_step_size": -1},
     ["scheduler.params.cycle_second_step_size"]),
    ("LRRangeTest", {"lr_range_test_step_size": 0}, ["scheduler.params.lr_range_test_step_size"]),
    ("LRRangeTest", {"lr_range_test_staircase": 1}, ["scheduler.params.lr_range_test_staircase"]),
])
def test_build_errors_name_the_key(type_name, params, needles):
    with pytest.raises(ZeroliteConfigError) as info:
        build_lr_scheduler(make_opt(lrs=[0.1, 0.1]), type_name, params)
    for needle in needles:
        assert needle in str(info.value), str(info.value)


def test_build_accepts_integral_floats_and_none_params():
    sched = build_lr_scheduler(make_opt(), "WarmupDecayLR", {"total_num_steps": 1e3, "warmup_num_steps": 100.0})
    assert sched.total_num_steps == 1000 and sched.warmup_num_steps == 100
    assert isinstance(build_lr_scheduler(make_opt(), "LRRangeTest", None), LRRangeTest)
