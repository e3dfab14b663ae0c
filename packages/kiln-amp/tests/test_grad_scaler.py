"""GradScaler against PyTorch's: the same scale sequence on injected infs (skips, backoff, growth), the
same state errors, and a checkpoint with the scaler's state that resumes exactly."""

from __future__ import annotations

import itertools
import pickle
import warnings

import numpy as np
import pytest
import torch

import kiln
from kiln.amp import GradScaler

W0 = np.array([[0.5, -0.25, 1.0]], dtype=np.float32)


def _setup(lib, **scaler_kw):
    model = lib.nn.Linear(3, 1, bias=False)
    with lib.no_grad():
        model.weight.copy_(lib.tensor(W0))
    opt = lib.optim.SGD(model.parameters(), lr=0.125)
    scaler = lib.amp.GradScaler("cpu", **scaler_kw)
    return model, opt, scaler


def _step(lib, model, opt, scaler, i: int, inf_at: set):
    x = lib.ones(2, 3) * (1.0 + i / 8)
    if i in inf_at:
        x[0, 1] = float("inf") if i % 2 else float("nan")
    opt.zero_grad()
    loss = model(x).sum()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    return scaler.get_scale(), scaler._get_growth_tracker(), model.weight.detach().numpy().copy()


def _run(lib, steps: int, inf_at: set, **scaler_kw):
    model, opt, scaler = _setup(lib, **scaler_kw)
    return [_step(lib, model, opt, scaler, i, inf_at) for i in range(steps)]


def test_scale_sequence_matches_pytorch_on_injected_infs():
    inf_at = {0, 1, 5, 6, 7, 12}
    kw = {"init_scale": 2.0**10, "growth_interval": 3}
    ours, theirs = _run(kiln, 16, inf_at, **kw), _run(torch, 16, inf_at, **kw)
    assert [(s, t) for s, t, _ in ours] == [(s, t) for s, t, _ in theirs]
    for (_, _, a), (_, _, b) in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    scales = [s for s, _, _ in ours]
    assert min(scales) < 2.0**10 and any(b > a for a, b in itertools.pairwise(scales))  # backed off, grew again
    # a skipped step leaves the weights alone
    for i in sorted(inf_at):
        before = W0 if i == 0 else ours[i - 1][2]
        np.testing.assert_array_equal(ours[i][2], before)


def test_defaults_and_the_update_rule_on_the_edges():
    scaler = GradScaler("cpu")
    assert (scaler.get_scale(), scaler.get_growth_factor(), scaler.get_backoff_factor()) == (65536.0, 2.0, 0.5)
    assert scaler.get_growth_interval() == 2000 and scaler.is_enabled()
    update = kiln.backend.op("_amp_update_scale_")
    # (scale, tracker, found_inf, interval): growth that overflows float32 keeps the scale, resets the tracker
    for scale, tracker, found, interval in (
        (2.0**127, 0, 0.0, 1),
        (1.0, 2, 0.0, 3),
        (1.0, 2, 3.0, 3),
        (8.0, 0, 0.0, 5),
    ):
        results = []
        for lib, fn in ((kiln, update), (torch, torch._amp_update_scale_)):
            s = lib.full((), scale, dtype=lib.float32)
            t = lib.full((), tracker, dtype=lib.int32)
            fn(s, t, lib.full((), found, dtype=lib.float32), 2.0, 0.5, interval)
            results.append((s.item(), t.item()))
        assert results[0] == results[1], (scale, tracker, found, interval)


def test_state_errors_match_pytorch():
    for lib in (kiln, torch):
        model, opt, scaler = _setup(lib)
        with pytest.raises(AssertionError, match=r"did not use scaler\.scale"):
            scaler.step(opt)
        scaler.scale(model(lib.ones(1, 3)).sum()).backward()
        scaler.unscale_(opt)
        with pytest.raises(RuntimeError, match="unscale_\\(\\) has already been called on this optimizer"):
            scaler.unscale_(opt)
        scaler.step(opt)
        with pytest.raises(RuntimeError, match="step\\(\\) has already been called since the last update"):
            scaler.step(opt)
        with pytest.raises(RuntimeError, match="unscale_\\(\\) is being called after step"):
            scaler.unscale_(opt)
        with pytest.raises(RuntimeError, match="Closure use is not currently supported"):
            scaler.step(opt, closure=lambda: 0.0)
        scaler.update()
        with pytest.raises(AssertionError, match="No inf checks were recorded prior to update"):
            scaler.update()


def test_factors_and_gradients_are_checked():
    with pytest.raises(AssertionError, match=r"growth factor must be > 1\.0"):
        GradScaler("cpu", growth_factor=1.0)
    with pytest.raises(AssertionError, match=r"backoff factor must be < 1\.0"):
        GradScaler("cpu", backoff_factor=1.0)
    w = kiln.zeros(3, dtype=kiln.float16, requires_grad=True)
    w.grad = kiln.ones(3).half()
    opt = kiln.optim.SGD([w], lr=1.0)
    scaler = GradScaler("cpu")
    scaler.scale(kiln.ones(()))
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        scaler.step(opt)
    with pytest.raises(ValueError, match="outputs must be a Tensor or an iterable of Tensors"):
        scaler.scale(3.0)


def test_scale_takes_tensors_lists_tuples_and_nesting():
    scaler = GradScaler("cpu", init_scale=4.0)
    a, b = kiln.ones(2), kiln.full((), 2.0)
    assert scaler.scale(a).tolist() == [4.0, 4.0]
    out = scaler.scale([a, (b, [a])])
    assert isinstance(out, list) and isinstance(out[1], tuple)
    assert out[1][0].item() == 8.0 and out[1][1][0].tolist() == [4.0, 4.0]
    assert [t.item() for t in scaler.scale(x for x in (b, b))] == [8.0, 8.0]


def test_update_with_a_new_scale():
    model, opt, scaler = _setup(kiln)
    scaler.scale(model(kiln.ones(1, 3)).sum()).backward()
    scaler.step(opt)
    scaler.update(128.0)
    assert scaler.get_scale() == 128.0
    scaler.update(kiln.tensor(32.0))
    assert scaler.get_scale() == 32.0
    with pytest.raises(AssertionError, match="new_scale should be a float or a 1-element"):
        scaler.update(kiln.ones(2))
    with pytest.raises(AssertionError, match="new_scale should be a float or a 1-element"):
        scaler.update(kiln.ones(1, requires_grad=True))


def test_disabled_scaler_passes_through():
    model, opt, scaler = _setup(kiln, enabled=False)
    loss = model(kiln.ones(1, 3)).sum()
    assert scaler.scale(loss) is loss
    loss.backward()
    scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 1.0 and scaler.state_dict() == {}
    np.testing.assert_allclose(model.weight.detach().numpy(), W0 - 0.125)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scaler.load_state_dict({})  # a no-op when disabled


def test_cuda_scaler_without_cuda_disables_itself():
    if kiln.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.warns(UserWarning, match="CUDA is not available.  Disabling"):
        scaler = GradScaler()
    assert not scaler.is_enabled()


def test_state_dict_round_trip_and_errors():
    model, opt, scaler = _setup(kiln, init_scale=256.0, growth_interval=5)
    for i in range(3):
        _step(kiln, model, opt, scaler, i, {1})
    state = scaler.state_dict()
    assert state == {
        "scale": 128.0,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": 5,
        "_growth_tracker": 1,
    }
    fresh = GradScaler("cpu")
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state
    with pytest.raises(RuntimeError, match="source state dict is empty"):
        fresh.load_state_dict({})
    with pytest.raises(KeyError, match="growth_interval"):
        fresh.load_state_dict({"scale": 1.0})


def test_pickling_only_between_iterations():
    model, opt, scaler = _setup(kiln, init_scale=64.0)
    scaler.scale(model(kiln.ones(1, 3)).sum()).backward()
    scaler.step(opt)
    with pytest.raises(AssertionError, match="may only be pickled at the beginning"):
        pickle.dumps(scaler)
    scaler.update()
    copy = pickle.loads(pickle.dumps(scaler))
    assert copy.get_scale() == 64.0 and copy._get_growth_tracker() == 1
    _step(kiln, model, opt, copy, 5, set())  # usable after unpickling


def test_checkpoint_with_the_scalers_state_resumes_exactly(tmp_path):
    inf_at = {1, 4}
    kw = {"init_scale": 2.0**6, "growth_interval": 2}
    straight = _run(kiln, 8, inf_at, **kw)

    model, opt, scaler = _setup(kiln, **kw)
    for i in range(4):
        _step(kiln, model, opt, scaler, i, inf_at)
    path = tmp_path / "ckpt.safetensors"
    kiln.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "scaler": scaler.state_dict()}, path)

    model2, opt2, scaler2 = _setup(kiln)  # default scaler settings: all of them come from the checkpoint
    ckpt = kiln.load(path)
    model2.load_state_dict(ckpt["model"])
    opt2.load_state_dict(ckpt["optimizer"])
    scaler2.load_state_dict(ckpt["scaler"])
    resumed = [_step(kiln, model2, opt2, scaler2, i, inf_at) for i in range(4, 8)]
    for (s, t, w), (s2, t2, w2) in zip(straight[4:], resumed):
        assert (s, t) == (s2, t2)
        np.testing.assert_array_equal(w, w2)


def test_unscale_then_clip_then_step():
    model, opt, scaler = _setup(kiln, init_scale=1024.0)
    x = kiln.ones(1, 3) * 10
    scaler.scale(model(x).sum()).backward()
    scaler.unscale_(opt)
    np.testing.assert_allclose(model.weight.grad.numpy(), [[10.0, 10.0, 10.0]])
    kiln.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    norm = np.linalg.norm(model.weight.detach().numpy() - W0)
    assert abs(norm - 0.125) < 1e-5
