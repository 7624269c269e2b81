"""deepspeed.ops.adam.DeepSpeedCPUAdam runs torch's fused CPU Adam and matches torch AdamW."""
import pytest
import torch

from zerolite.compat.deepspeed.ops.adam import DeepSpeedCPUAdam


def _run(make_opt, steps=10):
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(257) * 2)
    opt = make_opt([p])
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        p.grad = torch.randn(257, generator=g)
        opt.step()
    return p.detach().clone(), opt


def test_cpu_adam_is_fused_and_matches_adamw():
    kw = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    ours, opt = _run(lambda ps: DeepSpeedCPUAdam(ps, **kw))
    assert opt.defaults["fused"] is True
    ref, _ = _run(lambda ps: torch.optim.AdamW(ps, **kw))
    # fused vs for-loop rounding: <= 2.4e-7 measured after 10 steps (optim/builder.py note)
    torch.testing.assert_close(ours, ref, rtol=0, atol=2e-6)


def test_cpu_adam_adamw_mode_false_is_l2_adam():
    kw = dict(lr=1e-2, weight_decay=0.1)
    ours, _ = _run(lambda ps: DeepSpeedCPUAdam(ps, adamw_mode=False, **kw))
    ref, _ = _run(lambda ps: torch.optim.Adam(ps, **kw))
    torch.testing.assert_close(ours, ref, rtol=0, atol=2e-6)


def test_cpu_adam_refuses_amsgrad_as_deepspeed_does():
    p = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(RuntimeError, match=r"DeepSpeedCPUAdam\(amsgrad=True\)"):
        DeepSpeedCPUAdam([p], amsgrad=True)
    opt = DeepSpeedCPUAdam([p])
    with pytest.raises(RuntimeError, match="AMSGrad"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))], "amsgrad": True})
