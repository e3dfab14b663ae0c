"""``kiln.func.functional_call`` on modules and ``kiln.nn.parallel`` against PyTorch: gradients of a
model's loss as a function of its parameters, tied weights, strictness, restoration after an error,
and DataParallel on one device and split across several."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.func as kf
import kiln.nn as knn

torch = pytest.importorskip("torch")


def _twins():
    k = knn.Sequential(knn.Linear(3, 4), knn.Tanh(), knn.Linear(4, 2))
    t = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    t.load_state_dict({n: torch.tensor(v.detach().numpy()) for n, v in k.state_dict().items()})
    return k, t


def test_functional_call_gradients_match_torch():
    k, t = _twins()
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    kp = {n: v.detach() for n, v in k.named_parameters()}
    tp = {n: v.detach() for n, v in t.named_parameters()}
    kg = kf.grad(lambda p: kf.functional_call(k, p, (kiln.tensor(x),)).pow(2).mean())(kp)
    tg = torch.func.grad(lambda p: torch.func.functional_call(t, p, (torch.tensor(x),)).pow(2).mean())(tp)
    for n in kg:
        np.testing.assert_allclose(kg[n].numpy(), tg[n].numpy(), rtol=1e-5, atol=1e-6)
    # the module's own parameters are back, untouched
    assert all(a is b for a, b in zip(k.parameters(), [k[0].weight, k[0].bias, k[2].weight, k[2].bias], strict=True))


def test_functional_call_with_other_values_changes_the_output_only_during_the_call():
    k, _ = _twins()
    x = kiln.randn(2, 3)
    before = k(x)
    zeros = {n: kiln.zeros_like(v) for n, v in k.named_parameters()}
    assert kf.functional_call(k, zeros, x).abs().sum().item() == 0.0
    assert kiln.equal(k(x), before)


def test_functional_call_strict_and_errors_match_torch():
    k, t = _twins()
    for lib, mod in ((torch, t), (kiln, k)):
        with pytest.raises(RuntimeError, match=r"Missing key\(s\): '0.bias'"):
            lib.func.functional_call(
                mod, {n: v for n, v in mod.named_parameters() if n != "0.bias"}, (lib.ones(1, 3),), strict=True
            )
    with pytest.raises(ValueError, match="multiple dictionaries"):
        kf.functional_call(k, ({"0.bias": kiln.zeros(4)}, {"0.bias": kiln.zeros(4)}), (kiln.ones(1, 3),))


def test_functional_call_restores_parameters_after_an_exception():
    k, _ = _twins()
    w = k[0].weight
    with pytest.raises(RuntimeError):
        kf.functional_call(k, {"0.weight": kiln.zeros(4, 3)}, (kiln.ones(1, 5),))  # wrong input width
    assert k[0].weight is w


def test_functional_call_tied_weights():
    a, b = knn.Linear(2, 2, bias=False), knn.Linear(2, 2, bias=False)
    b.weight = a.weight  # two modules sharing one parameter
    m = knn.Sequential(a, b)
    x = kiln.ones(1, 2)
    out = kf.functional_call(m, {"0.weight": kiln.eye(2) * 2}, (x,))
    assert out.tolist() == [[4.0, 4.0]]  # both uses of the tied weight see the new value
    out = kf.functional_call(m, {"0.weight": kiln.eye(2) * 2}, (x,), tie_weights=False)
    expected = (2 * x.numpy()) @ a.weight.detach().numpy().T  # the second layer keeps the original weight
    np.testing.assert_allclose(out.detach().numpy(), expected, rtol=1e-6)
    with pytest.raises(ValueError, match="tied"):
        kf.functional_call(m, {"0.weight": kiln.eye(2), "1.weight": kiln.eye(2) * 3}, (x,))


def test_stateless_path():
    from kiln.nn.utils.stateless import functional_call

    assert functional_call is kf.functional_call


def test_data_parallel_without_an_accelerator_is_the_module():
    k, t = _twins()
    if kiln.accelerator.is_available():  # a plugin accelerator (the example device's cell, 2 devices)
        k.to(kiln.device(kiln.accelerator.current_accelerator().type, 0))  # as users do, before wrapping
    dp = knn.DataParallel(k)
    tdp = torch.nn.DataParallel(t)
    x = np.ones((4, 3), np.float32)
    out = dp(kiln.tensor(x)).detach().cpu().numpy()
    np.testing.assert_allclose(out, tdp(torch.tensor(x)).detach().numpy(), rtol=1e-5, atol=1e-6)
    assert dp.module is k and "module.0.weight" in dict(dp.named_parameters())
    if kiln.accelerator.is_available():
        assert dp.device_ids and k[0].weight.device == dp.device_ids[0]


def test_data_parallel_split_across_devices_matches_one_device():
    """Scatter, differentiable replicas, gather: the same outputs and gradients as one call (on three
    'devices' that are the CPU, so the machinery runs without an accelerator)."""
    from kiln.nn import parallel

    k, _ = _twins()
    x = kiln.randn(7, 3)
    cpu = [kiln.device("cpu")] * 3
    ins = parallel.scatter((x,), cpu)
    assert [i[0].shape[0] for i in ins] == [3, 3, 1]
    outs = parallel.parallel_apply(parallel.replicate(k, cpu), ins)
    y = parallel.gather(outs, "cpu")
    ref = k(x)
    np.testing.assert_allclose(y.detach().numpy(), ref.detach().numpy(), rtol=1e-5, atol=1e-6)
    y.sum().backward()
    split = [p.grad.clone() for p in k.parameters()]
    k.zero_grad()
    ref.sum().backward()
    for a, p in zip(split, k.parameters(), strict=True):
        np.testing.assert_allclose(a.numpy(), p.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_distributed_data_parallel_name_imports_and_says_what_to_install():
    try:
        import kiln_distributed  # noqa: F401

        pytest.skip("kiln-distributed is installed")
    except ModuleNotFoundError:
        pass
    from kiln.nn.parallel import DistributedDataParallel

    with pytest.raises(ModuleNotFoundError, match="pip install kiln-distributed"):
        DistributedDataParallel(knn.Linear(2, 2))


def test_distributed_data_parallel_without_the_package(monkeypatch):
    # as if kiln-distributed were not installed, whether it is or not
    import sys

    import kiln.nn.parallel as par

    saved = vars(par).pop("DistributedDataParallel", None)
    monkeypatch.setitem(sys.modules, "kiln.distributed.ddp", None)
    try:
        from kiln.nn.parallel import DistributedDataParallel

        assert DistributedDataParallel.__name__ == "DistributedDataParallel"
        with pytest.raises(ModuleNotFoundError, match="pip install kiln-distributed"):
            DistributedDataParallel(knn.Linear(2, 2))
    finally:
        vars(par).pop("DistributedDataParallel", None)
        if saved is not None:
            par.DistributedDataParallel = saved


def test_distributed_data_parallel_is_kiln_distributed_class():
    ddp = pytest.importorskip("kiln.distributed.ddp")
    import kiln.nn.parallel as par

    assert par.DistributedDataParallel is ddp.DistributedDataParallel
    assert issubclass(par.DistributedDataParallel, knn.Module)
