"""Every LR scheduler's learning-rate (and momentum) sequence over 30 steps equals torch's, and a
scheduler restored from ``state_dict`` continues the same sequence."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import kiln
import kiln.nn as nn
import kiln.optim as optim
import kiln.optim.lr_scheduler as klr

STEPS = 30

FACTORIES = {
    "LambdaLR": lambda S, o: S.LambdaLR(o, lambda e: 0.95**e),
    "LambdaLR-per-group": lambda S, o: S.LambdaLR(o, [lambda e: 1 / (e + 1), lambda e: 0.9**e]),
    "MultiplicativeLR": lambda S, o: S.MultiplicativeLR(o, lambda e: 0.97),
    "StepLR": lambda S, o: S.StepLR(o, step_size=4, gamma=0.5),
    "MultiStepLR": lambda S, o: S.MultiStepLR(o, milestones=[3, 7, 7, 20], gamma=0.3),
    "ConstantLR": lambda S, o: S.ConstantLR(o, factor=0.25, total_iters=6),
    "LinearLR": lambda S, o: S.LinearLR(o, start_factor=0.2, end_factor=0.9, total_iters=10),
    "ExponentialLR": lambda S, o: S.ExponentialLR(o, gamma=0.9),
    "CosineAnnealingLR": lambda S, o: S.CosineAnnealingLR(o, T_max=8, eta_min=0.001),
    "CosineAnnealingWarmRestarts": lambda S, o: S.CosineAnnealingWarmRestarts(o, T_0=5, T_mult=2, eta_min=0.01),
    "CyclicLR-triangular2": lambda S, o: S.CyclicLR(
        o, base_lr=0.01, max_lr=[0.1, 0.2], step_size_up=4, mode="triangular2"
    ),
    "CyclicLR-exp_range": lambda S, o: S.CyclicLR(
        o, base_lr=0.01, max_lr=0.1, step_size_up=3, step_size_down=5, mode="exp_range", gamma=0.97
    ),
    "OneCycleLR": lambda S, o: S.OneCycleLR(o, max_lr=0.5, total_steps=STEPS + 1),
    "OneCycleLR-linear-3phase": lambda S, o: S.OneCycleLR(
        o, max_lr=[0.5, 0.3], epochs=4, steps_per_epoch=8, anneal_strategy="linear", three_phase=True
    ),
    "PolynomialLR": lambda S, o: S.PolynomialLR(o, total_iters=12, power=2.0),
    "SequentialLR": lambda S, o: S.SequentialLR(
        o, [S.LinearLR(o, start_factor=0.1, total_iters=5), S.ExponentialLR(o, gamma=0.9)], milestones=[5]
    ),
    "ChainedScheduler": lambda S, o: S.ChainedScheduler(
        [S.ConstantLR(o, factor=0.5, total_iters=4), S.ExponentialLR(o, gamma=0.95)]
    ),
}


def make_optimizer(lib, adam: bool = False):
    if lib is kiln:
        groups = [{"params": [nn.Parameter(kiln.ones(2))]}, {"params": [nn.Parameter(kiln.ones(1))], "lr": 0.05}]
        return optim.Adam(groups, lr=0.1) if adam else optim.SGD(groups, lr=0.1, momentum=0.9)
    groups = [
        {"params": [torch.nn.Parameter(torch.ones(2))]},
        {"params": [torch.nn.Parameter(torch.ones(1))], "lr": 0.05},
    ]
    return torch.optim.Adam(groups, lr=0.1) if adam else torch.optim.SGD(groups, lr=0.1, momentum=0.9)


def sequence(sched, opt, steps):
    out = []
    for _ in range(steps):
        opt.step()
        sched.step()
        out.append((list(sched.get_last_lr()), [g.get("momentum", g.get("betas")) for g in opt.param_groups]))
    return out


def close(a, b):
    assert len(a) == len(b)
    for (lra, ma), (lrb, mb) in zip(a, b):
        assert all(math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-15) for x, y in zip(lra, lrb)), (lra, lrb)
        flat_a = [v for m in ma for v in (m if isinstance(m, tuple) else (m,))]
        flat_b = [v for m in mb for v in (m if isinstance(m, tuple) else (m,))]
        assert flat_a == pytest.approx(flat_b, rel=1e-12)


@pytest.mark.parametrize("name", list(FACTORIES))
def test_sequence_matches_torch(name):
    ko, to = make_optimizer(kiln), make_optimizer(torch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ks, ts = FACTORIES[name](klr, ko), FACTORIES[name](torch.optim.lr_scheduler, to)
        assert ks.get_last_lr() == pytest.approx(ts.get_last_lr(), rel=1e-12)
        close(sequence(ks, ko, STEPS), sequence(ts, to, STEPS))


@pytest.mark.parametrize("name", list(FACTORIES))
def test_state_dict_resumes(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ko = make_optimizer(kiln)
        ks = FACTORIES[name](klr, ko)
        sequence(ks, ko, 10)
        saved_opt, saved_sched = ko.state_dict(), ks.state_dict()
        expected = sequence(ks, ko, 15)
        ko2 = make_optimizer(kiln)
        ks2 = FACTORIES[name](klr, ko2)
        ko2.load_state_dict(saved_opt)
        ks2.load_state_dict(saved_sched)
        close(sequence(ks2, ko2, 15), expected)


def test_cyclic_momentum_with_adam_betas():
    ko, to = make_optimizer(kiln, adam=True), make_optimizer(torch, adam=True)
    ks = klr.CyclicLR(ko, 0.01, 0.1, step_size_up=3)
    ts = torch.optim.lr_scheduler.CyclicLR(to, 0.01, 0.1, step_size_up=3)
    close(sequence(ks, ko, 12), sequence(ts, to, 12))


@pytest.mark.parametrize("mode,threshold_mode", [("min", "rel"), ("max", "abs")])
def test_reduce_lr_on_plateau_matches_torch(mode, threshold_mode):
    metrics = [1.0, 0.9, 0.9, 0.95, 0.91, 0.92, 0.93, 0.5, 0.6, 0.6, 0.6, 0.6, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7]
    ko, to = make_optimizer(kiln), make_optimizer(torch)
    kw = dict(mode=mode, factor=0.5, patience=2, threshold_mode=threshold_mode, cooldown=1, min_lr=[0.01, 0.02])
    ks, ts = klr.ReduceLROnPlateau(ko, **kw), torch.optim.lr_scheduler.ReduceLROnPlateau(to, **kw)
    for m in metrics:
        ks.step(m)
        ts.step(m)
        assert ks.get_last_lr() == ts.get_last_lr()
    sd = ks.state_dict()
    ks2 = klr.ReduceLROnPlateau(make_optimizer(kiln), **kw)
    ks2.load_state_dict(sd)
    assert ks2.best == ks.best and ks2.num_bad_epochs == ks.num_bad_epochs


def test_scheduler_errors_match_torch():
    for S, lib in ((klr, kiln), (torch.optim.lr_scheduler, torch)):
        o = make_optimizer(lib)
        with pytest.raises(TypeError, match="is not an Optimizer"):
            S.StepLR(object(), 3)
        with pytest.raises(ValueError, match=r"Constant multiplicative factor expected to be between 0 and 1\."):
            S.ConstantLR(o, factor=2.0)
        with pytest.raises(ValueError, match=r"Factor should be < 1\.0\."):
            S.ReduceLROnPlateau(o, factor=1.0)
        with pytest.raises(ValueError, match="You must define either total_steps OR"):
            S.OneCycleLR(o, max_lr=0.1)
        with pytest.raises(ValueError, match="Expected 2 lr_lambdas, but got 3"):
            S.LambdaLR(o, [lambda e: 1.0] * 3)
        with pytest.raises(KeyError, match="initial_lr"):
            S.StepLR(make_optimizer(lib), 3, last_epoch=4)


def test_step_order_warning_like_torch():
    for S, lib in ((klr, kiln), (torch.optim.lr_scheduler, torch)):
        o = make_optimizer(lib)
        s = S.StepLR(o, 2)
        with pytest.warns(
            UserWarning, match="Detected call of `lr_scheduler.step\\(\\)` before `optimizer.step\\(\\)`"
        ):
            s.step()
        o2 = make_optimizer(lib)
        s2 = S.StepLR(o2, 2)
        o2.step()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            s2.step()
