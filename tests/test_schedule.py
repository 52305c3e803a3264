"""LR schedules: values against torch.optim.lr_scheduler, validation, apply()."""
from __future__ import annotations

import math

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="torch, these tests' reference (the README's test command installs it)")

import pyxtts  # noqa: E402


def torch_lrs(make_scheduler, lr: float, n: int) -> list[float]:
    """The rate PyTorch uses for steps 0..n-1 (scheduler stepped after each update)."""
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    sched = make_scheduler(opt)
    out = []
    for _ in range(n):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def assert_close_list(got, want, lr):
    for i, (g, w) in enumerate(zip(got, want)):
        assert math.isclose(g, w, rel_tol=1e-9, abs_tol=1e-12 * lr), f"step {i}: {g!r} != torch {w!r}"


def test_constant(rng):
    lr = float(rng.uniform(1e-5, 1e-2))
    s = pyxtts.ConstantLR(lr)
    assert [s(i) for i in (0, 1, 10**9)] == [lr] * 3


@pytest.mark.parametrize("gamma", [0.5, 0.1])
def test_multistep_matches_torch(rng, gamma):
    lr = float(rng.uniform(1e-5, 1e-3))
    milestones = sorted(int(m) for m in rng.choice(np.arange(1, 60), 3, replace=False))
    s = pyxtts.MultiStepLR(lr, milestones, gamma=gamma)
    want = torch_lrs(lambda o: torch.optim.lr_scheduler.MultiStepLR(o, milestones, gamma=gamma), lr, 80)
    assert_close_list([s(i) for i in range(80)], want, lr)


def test_multistep_xtts_recipe():
    s = pyxtts.MultiStepLR(5e-6, [50000 * 18, 150000 * 18, 300000 * 18])
    assert s(0) == 5e-6 and s(50000 * 18 - 1) == 5e-6
    assert s(50000 * 18) == 2.5e-6 and s(300000 * 18) == 5e-6 / 8


@pytest.mark.parametrize("min_lr_frac", [0.0, 0.1])
def test_warmup_cosine_matches_torch(rng, min_lr_frac):
    lr = float(rng.uniform(1e-4, 1e-3))
    warmup, total = int(rng.integers(2, 12)), int(rng.integers(30, 60))
    min_lr = lr * min_lr_frac
    s = pyxtts.WarmupCosineLR(lr, warmup, total, min_lr=min_lr)
    # warmup from 0: step k has lr*k/warmup; torch's LinearLR cannot start at 0, so its
    # t-th rate with start_factor 1/warmup over warmup-1 iterations is our step t+1
    assert s(0) == 0.0
    lin = torch_lrs(lambda o: torch.optim.lr_scheduler.LinearLR(
        o, start_factor=1 / warmup, end_factor=1.0, total_iters=warmup - 1), lr, warmup)
    assert_close_list([s(k) for k in range(1, warmup + 1)], lin, lr)
    t_max = total - warmup
    cos = torch_lrs(lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=t_max, eta_min=min_lr),
                    lr, t_max + 1)
    assert_close_list([s(warmup + t) for t in range(t_max + 1)], cos, lr)
    assert s(total) == min_lr and s(total + 1000) == min_lr


def test_warmup_cosine_without_warmup():
    s = pyxtts.WarmupCosineLR(1.0, 0, 10)
    assert s(0) == 1.0 and s(5) == pytest.approx(0.5) and s(10) == 0.0


@pytest.mark.parametrize("make, arg", [
    (lambda: pyxtts.ConstantLR(-1.0), "lr"),
    (lambda: pyxtts.ConstantLR(float("nan")), "lr"),
    (lambda: pyxtts.WarmupCosineLR(1e-3, -1, 10), "warmup_steps"),
    (lambda: pyxtts.WarmupCosineLR(1e-3, 10, 10), "warmup_steps"),
    (lambda: pyxtts.WarmupCosineLR(1e-3, 1, 0), "total_steps"),
    (lambda: pyxtts.WarmupCosineLR(1e-3, 1, 10, min_lr=1e-2), "min_lr"),
    (lambda: pyxtts.MultiStepLR(1e-3, [10, 5]), "milestones"),
    (lambda: pyxtts.MultiStepLR(1e-3, [5, 5]), "milestones"),
    (lambda: pyxtts.MultiStepLR(1e-3, [-1]), "milestones"),
    (lambda: pyxtts.MultiStepLR(1e-3, [5], gamma=0.0), "gamma"),
    (lambda: pyxtts.ConstantLR(1.0)(-1), "step"),
])
def test_validation_names_the_argument(make, arg):
    with pytest.raises(ValueError, match=arg):
        make()


@pytest.mark.parametrize("make, arg", [
    (lambda: pyxtts.ConstantLR("1e-3"), "lr"),
    (lambda: pyxtts.WarmupCosineLR(1e-3, 1.5, 10), "warmup_steps"),
    (lambda: pyxtts.MultiStepLR(1e-3, 5), "milestones"),
    (lambda: pyxtts.ConstantLR(1.0)(1.0), "step"),
    (lambda: pyxtts.ConstantLR(1.0)(True), "step"),
    (lambda: pyxtts.ConstantLR(1.0)(np.array(2.5)), "step"),  # has __index__, which raises
    (lambda: pyxtts.WarmupCosineLR(1e-3, np.float32(1.0), 10), "warmup_steps"),
])
def test_wrong_types_name_the_argument(make, arg):
    with pytest.raises(TypeError, match=arg):
        make()


def test_apply_sets_optimizer_lr():
    class Opt:
        lr = 1.0

    o = Opt()
    s = pyxtts.MultiStepLR(1e-3, [3])
    assert s.apply(o, 3) == 5e-4 and o.lr == 5e-4
    assert "MultiStepLR" in repr(s) and "milestones=[3]" in repr(s)

