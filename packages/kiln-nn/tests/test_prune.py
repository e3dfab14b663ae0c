"""kiln.nn.utils.prune against torch.nn.utils.prune: the same masks for the deterministic methods (L1, Ln,
custom, global) and their combinations, the same registered names, forward values and gradients, the
random methods' counts, remove/is_pruned, errors and signatures."""

from __future__ import annotations

import inspect
import math
import re

import numpy as np
import pytest
import torch
import torch.nn.utils.prune as tprune
from layer_twins import seeded, to_np  # noqa: F401

import kiln
import kiln.nn as nn
from kiln.nn.utils import prune as kprune


def twin(kind="Linear", args=(6, 4)):
    t = getattr(torch.nn, kind)(*args)
    k = getattr(nn, kind)(*args)
    k.load_state_dict({n: kiln.tensor(v.detach().numpy()) for n, v in t.state_dict().items()})
    return k, t


def assert_same(k, t):
    assert [n for n, _ in k.named_parameters()] == [n for n, _ in t.named_parameters()]
    assert [n for n, _ in k.named_buffers()] == [n for n, _ in t.named_buffers()]
    for (n, kb), (_, tb) in zip(k.named_buffers(), t.named_buffers()):
        np.testing.assert_array_equal(to_np(kb), tb.numpy(), err_msg=n)
    assert [type(h).__name__ for h in k._forward_pre_hooks.values()] == [
        type(h).__name__ for h in t._forward_pre_hooks.values()
    ]


STEPS = [
    [("l1_unstructured", ("weight", 0.3), {})],
    [("l1_unstructured", ("weight", 5), {}), ("l1_unstructured", ("weight", 0.5), {})],
    [("ln_structured", ("weight", 0.5, 2, 0), {}), ("l1_unstructured", ("weight", 3), {})],
    [("l1_unstructured", ("weight", 4), {}), ("ln_structured", ("weight", 1, 1, -1), {})],
    [("ln_structured", ("weight", 2, math.inf, 1), {}), ("ln_structured", ("weight", 0.34, -math.inf, 1), {})],
    [("identity", ("bias",), {}), ("l1_unstructured", ("bias", 0.25), {})],
    [("l1_unstructured", ("weight", 0), {}), ("ln_structured", ("weight", 0.0, 2, 0), {})],
]


@pytest.mark.parametrize("steps", STEPS)
def test_deterministic_pruning_matches_torch(steps):
    k, t = twin()
    for name, args, kwargs in steps:
        kout = getattr(kprune, name)(k, *args, **kwargs)
        tout = getattr(tprune, name)(t, *args, **kwargs)
        assert kout is k and tout is t
        assert_same(k, t)
    x = torch.randn(5, 6)
    xk = kiln.tensor(x.numpy())
    kout, tout = k(xk), t(x)
    np.testing.assert_allclose(to_np(kout), tout.detach().numpy(), rtol=1e-6, atol=1e-6)
    kout.sum().backward()
    tout.sum().backward()
    for (n, kp), (_, tp) in zip(k.named_parameters(), t.named_parameters()):  # masked entries get no gradient
        np.testing.assert_allclose(to_np(kp.grad), tp.grad.numpy(), rtol=1e-6, atol=1e-6, err_msg=n)
    assert kprune.is_pruned(k) and tprune.is_pruned(t)
    for pname in {args[0] for _, args, _ in steps}:
        kprune.remove(k, pname)
        tprune.remove(t, pname)
    assert not kprune.is_pruned(k)
    assert [n for n, _ in k.named_parameters()] == [n for n, _ in t.named_parameters()] and not list(k.buffers())
    np.testing.assert_allclose(to_np(k.weight), t.weight.detach().numpy(), rtol=1e-6)
    assert type(k.weight) is nn.Parameter


def test_importance_scores_custom_masks_and_global_pruning_match_torch():
    k, t = twin("Conv2d", (3, 4, 3))
    scores = torch.rand(4, 3, 3, 3)
    kprune.l1_unstructured(k, "weight", 0.4, importance_scores=kiln.tensor(scores.numpy()))
    tprune.l1_unstructured(t, "weight", 0.4, importance_scores=scores)
    mask = (torch.rand(4) > 0.3).float()
    kprune.custom_from_mask(k, "bias", kiln.tensor(mask.numpy()))
    tprune.custom_from_mask(t, "bias", mask)
    kprune.ln_structured(k, "weight", 1, 2, 0, importance_scores=kiln.tensor(scores.numpy()))
    tprune.ln_structured(t, "weight", 1, 2, 0, importance_scores=scores)
    assert_same(k, t)
    k1, t1 = twin()
    k2, t2 = twin("Linear", (4, 3))
    kprune.l1_unstructured(k2, "weight", 2)
    tprune.l1_unstructured(t2, "weight", 2)
    kparams, tparams = [(k1, "weight"), (k2, "weight"), (k1, "bias")], [(t1, "weight"), (t2, "weight"), (t1, "bias")]
    kscore = {(k1, "bias"): kiln.zeros(4)}
    tscore = {(t1, "bias"): torch.zeros(4)}
    kprune.global_unstructured(kparams, kprune.L1Unstructured, importance_scores=kscore, amount=0.3)
    tprune.global_unstructured(tparams, tprune.L1Unstructured, importance_scores=tscore, amount=0.3)
    for km, tm in ((k1, t1), (k2, t2)):
        assert_same(km, tm)


def test_random_methods_prune_the_asked_amount():
    k, _ = twin("Linear", (10, 8))
    kprune.random_unstructured(k, "weight", 0.25)
    assert int(to_np(k.weight_mask).sum()) == 80 - 20
    kprune.random_unstructured(k, "weight", 10)  # 10 more among the kept ones
    assert (
        int(to_np(k.weight_mask).sum()) == 50
        and type(k._forward_pre_hooks[next(iter(k._forward_pre_hooks))]).__name__ == "PruningContainer"
    )
    kprune.random_structured(k, "weight", 2, dim=1)
    cols = to_np(k.weight_mask).sum(0)
    assert (cols == 0).sum() >= 2
    kiln.manual_seed(4)
    a, _ = twin("Linear", (10, 8))
    kprune.random_unstructured(a, "weight", 0.5)
    kiln.manual_seed(4)
    b, _ = twin("Linear", (10, 8))
    kprune.random_unstructured(b, "weight", 0.5)
    np.testing.assert_array_equal(to_np(a.weight_mask), to_np(b.weight_mask))  # follows kiln's seed


def test_pruning_method_objects_and_containers():
    method = kprune.L1Unstructured(amount=2)
    t = kiln.tensor([[0.1, -3.0], [0.5, 2.0]])
    np.testing.assert_array_equal(to_np(method.prune(t)), [[0.0, -3.0], [0.0, 2.0]])
    tm = tprune.L1Unstructured(amount=2)
    np.testing.assert_array_equal(
        to_np(method.compute_mask(t, kiln.ones(2, 2))),
        tm.compute_mask(torch.tensor(to_np(t)), torch.ones(2, 2)).numpy(),
    )
    first = kprune.Identity()
    first._tensor_name = "weight"
    container = kprune.PruningContainer(first)
    assert len(container) == 1 and isinstance(container[0], kprune.Identity) and list(container)
    with pytest.raises(TypeError, match="is not a BasePruningMethod subclass"):
        container.add_pruning_method(object())
    other = kprune.Identity()
    other._tensor_name = "bias"
    with pytest.raises(ValueError) as ke:
        container.add_pruning_method(other)
    tfirst = tprune.Identity()
    tfirst._tensor_name = "weight"
    tcontainer = tprune.PruningContainer(tfirst)
    tother = tprune.Identity()
    tother._tensor_name = "bias"
    with pytest.raises(ValueError) as te:
        tcontainer.add_pruning_method(tother)
    assert re.sub("<[^>]*>", "<>", str(ke.value)) == re.sub("<[^>]*>", "<>", str(te.value))


ERRORS = [
    ("l1_unstructured", ("weight", -1), {}, ValueError),
    ("l1_unstructured", ("weight", 1.5), {}, ValueError),
    ("l1_unstructured", ("weight", "x"), {}, TypeError),
    ("l1_unstructured", ("weight", 100), {}, ValueError),
    ("random_structured", ("bias", 1, 0), {}, ValueError),
    ("ln_structured", ("weight", 10, 2, 0), {}, ValueError),
]


@pytest.mark.parametrize(("name", "args", "kwargs", "exc"), ERRORS)
def test_errors_match_torch_and_leave_the_module_as_it_was(name, args, kwargs, exc):
    k, t = twin()
    with pytest.raises(exc) as ke:
        getattr(kprune, name)(k, *args, **kwargs)
    with pytest.raises(exc) as te:
        getattr(tprune, name)(t, *args, **kwargs)
    assert str(ke.value).replace("kiln.", "torch.") == str(te.value)
    # the parameter is restored (registered again, after the others, as torch does)
    assert [n for n, _ in k.named_parameters()] == [n for n, _ in t.named_parameters()]
    assert not kprune.is_pruned(k) and not list(k.buffers())


def test_remove_and_global_errors_match_torch():
    k, t = twin()
    for lib, m in ((kprune, k), (tprune, t)):
        with pytest.raises(ValueError) as e:
            lib.remove(m, "weight")
        msg = str(e.value)
    assert msg.startswith("Parameter 'weight' of module")
    for call in (
        lambda lib, m: lib.global_unstructured(3, lib.L1Unstructured, amount=1),
        lambda lib, m: lib.global_unstructured([(m, "weight")], lib.L1Unstructured, importance_scores=[1], amount=1),
        lambda lib, m: lib.global_unstructured([(m, "weight")], lib.RandomStructured, amount=1),
    ):
        with pytest.raises(TypeError) as ke:
            call(kprune, k)
        with pytest.raises(TypeError) as te:
            call(tprune, t)
        assert str(ke.value).split(" Found method")[0] == str(te.value).split(" Found method")[0]


@pytest.mark.parametrize("name", [n for n in tprune.__dict__ if not n.startswith("_") and n in kprune.__all__])
def test_names_and_signatures_match_torch(name):
    kobj, tobj = getattr(kprune, name), getattr(tprune, name)
    assert kobj.__doc__
    target = "__init__" if inspect.isclass(tobj) else None
    kf = getattr(kobj, target) if target else kobj
    tf = getattr(tobj, target) if target else tobj
    if target and tf is object.__init__:
        return
    kp = [p.name for p in inspect.signature(kf).parameters.values()]
    tpn = [p.name for p in inspect.signature(tf).parameters.values()]
    if kp != ["self", "args", "kwargs"] and tpn != ["self", "args", "kwargs"]:
        assert kp == tpn


def test_every_torch_name_is_here():
    public = {
        n for n, v in vars(tprune).items() if not n.startswith("_") and getattr(v, "__module__", "") == tprune.__name__
    }
    assert public <= set(kprune.__all__)
