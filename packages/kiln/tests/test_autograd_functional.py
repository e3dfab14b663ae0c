"""kiln.autograd.functional against torch.autograd.functional: jacobian, hessian, vjp, jvp, vhp, hvp.

Every case runs the same function (written with Tensor methods, so it runs on both libraries) on the
same random float64 values, contiguous and as non-contiguous views, and compares the results' nesting
(tuples exactly where PyTorch returns tuples), shapes, dtypes, ``requires_grad`` and values (1e-10);
with ``create_graph=True`` the results are differentiated again and the gradients compared. Errors
(strict mode, wrong types, wrong ``v``, unsupported options) must have PyTorch's type and message.
"""

from __future__ import annotations

import inspect

import kiln_testutil as U
import numpy as np
import pytest
import torch
import torch.autograd.functional as TF

import kiln
import kiln.autograd.functional as KF

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")

TOL = 1e-10
LAYOUTS = ("contiguous", "transposed", "strided")


# ---------------------------------------------------------------------------------------- helpers


def same(k, t, where: str = "result") -> None:
    """kiln's result ``k`` has torch's ``t``'s structure (tuples exactly where torch has them), shapes,
    dtypes, ``requires_grad`` and values."""
    if isinstance(t, tuple):
        assert type(k) is tuple, f"{where}: expected a tuple, got {type(k).__name__}"
        assert len(k) == len(t), f"{where}: length {len(k)} != torch's {len(t)}"
        for i, (a, b) in enumerate(zip(k, t)):
            same(a, b, f"{where}[{i}]")
        return
    assert isinstance(t, torch.Tensor)
    assert isinstance(k, kiln.Tensor), f"{where}: expected a kiln.Tensor, got {type(k).__name__}"
    assert tuple(k.shape) == tuple(t.shape), f"{where}: shape {tuple(k.shape)} != torch's {tuple(t.shape)}"
    assert k.dtype is U.T2K[t.dtype], f"{where}: dtype {k.dtype} != torch's {t.dtype}"
    assert k.requires_grad == t.requires_grad, f"{where}: requires_grad {k.requires_grad} != {t.requires_grad}"
    np.testing.assert_allclose(U.kiln_to_np(k), U.torch_to_np(t), rtol=TOL, atol=TOL, err_msg=where)


def flat(x) -> list:
    """The tensors of a (nested) result, in order."""
    if isinstance(x, tuple):
        return [t for item in x for t in flat(item)]
    return [x]


def operands(shapes, layout="contiguous", seed=0, requires_grad=False):
    """(kiln inputs, torch inputs, pairs): one random float64 operand per shape, laid out per ``layout``."""
    rng = U.rng_for(seed)
    pairs = [
        U.make_pair(s, kiln.float64, layout=layout, rng=rng, requires_grad=requires_grad, low=-1.5, high=1.5)
        for s in shapes
    ]
    return tuple(p.k for p in pairs), tuple(p.t for p in pairs), pairs


def vectors(shapes, seed=1, requires_grad=False):
    """(kiln, torch) tuples of random float64 vectors ``v``."""
    ks, ts, _ = operands(shapes, seed=seed, requires_grad=requires_grad)
    return ks, ts


def reduce_all(result):
    """A scalar depending on every tensor of ``result`` (non-linearly, so second derivatives matter)."""
    total = None
    for i, t in enumerate(flat(result)):
        term = (t * t).sum() * (i + 1) + t.sum()
        total = term if total is None else total + term
    return total


# Functions of one or more inputs, written once for both libraries (``lib`` builds captured constants).
# name -> (input shapes, factory(lib) -> function)


def _matmul_factory(lib):
    w = lib.tensor([[2.0, -1.0, 0.5], [0.0, 1.0, -0.25], [1.5, 0.5, 0.0]], dtype=lib.float64)
    b = lib.tensor([1.0, 0.5, -2.0], dtype=lib.float64)
    return lambda x: (x @ w.t() + b).tanh()


JAC_FUNCS = {
    "elementwise": ([(2, 3)], lambda lib: lambda x: x.sin() * x.exp()),
    "row_sums": ([(3, 4)], lambda lib: lambda x: x.exp().sum(dim=1)),
    "scalar": ([(2, 3)], lambda lib: lambda x: (x**3).sum()),
    "captured_constants": ([(2, 3)], _matmul_factory),
    "identity": ([(2, 3)], lambda lib: lambda x: x),
    "transpose_view": ([(2, 3)], lambda lib: lambda x: x.t() * 2.0),
    "zero_dim": ([()], lambda lib: lambda x: x.cos() * x),
    "two_inputs": ([(2, 3), (2, 3)], lambda lib: lambda x, y: 2 * x.exp() + 3 * y * x),
    "matmul_inputs": ([(2, 3), (3, 2)], lambda lib: lambda x, y: x @ y),
    "tuple_outputs": ([(2, 3)], lambda lib: lambda x: (x.exp(), x.sum(), x * x)),
    "tuples_both": ([(2, 3), (3,)], lambda lib: lambda x, y: (x * y, (x - y).pow(2).sum(), y.tanh())),
    "one_tuple_input": ([(4,)], lambda lib: lambda x: x.sigmoid()),
}

# scalar functions for hessian / vhp / hvp
SCALAR_FUNCS = {
    "cube_sum": ([(2, 3)], lambda lib: lambda x: (x**3).sum()),
    "log_sum_exp": ([(4,)], lambda lib: lambda x: x.exp().sum().log()),
    "zero_dim": ([()], lambda lib: lambda x: x.sin() * x.exp()),
    "one_element_output": ([(3,)], lambda lib: lambda x: (x * x.cos()).sum().reshape(1, 1)),
    "two_inputs": ([(3,), (3,)], lambda lib: lambda x, y: (2 * x.pow(2) + 3 * y.pow(2) + x * y.exp()).sum()),
    "mixed_shapes": ([(2, 2), (2,)], lambda lib: lambda x, y: ((x @ y).tanh() * y.sum()).sum()),
}


def _call(fn_k, fn_t, ks, ts, single: bool, **kwargs):
    """Run kiln's and torch's versions on the same inputs, a single tensor when ``single``."""
    k_in = ks[0] if single else ks
    t_in = ts[0] if single else ts
    return fn_k(k_in, **kwargs), fn_t(t_in, **kwargs)


def _cases(funcs):
    """(name, single) pairs: a one-input function runs with a tensor and with a 1-tuple."""
    out = []
    for name, (shapes, _) in funcs.items():
        out.append((name, False))
        if len(shapes) == 1:
            out.append((name, True))
    return out


def _id(case):
    name, single = case
    return f"{name}-{'tensor' if single else 'tuple'}"


# ---------------------------------------------------------------------------------------- the module


def test_module_surface_matches_torch():
    assert kiln.autograd.functional is KF  # reachable after `import kiln`, as torch.autograd.functional
    assert sorted(KF.__all__) == sorted(TF.__all__)
    for name in KF.__all__:
        k_sig, t_sig = inspect.signature(getattr(KF, name)), inspect.signature(getattr(TF, name))
        assert [(p.name, p.default, p.kind) for p in k_sig.parameters.values()] == [
            (p.name, p.default, p.kind) for p in t_sig.parameters.values()
        ], name
        assert getattr(KF, name).__doc__


# ---------------------------------------------------------------------------------------- jacobian


@pytest.mark.parametrize("vectorize", [False, True], ids=["loop", "vectorize"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", _cases(JAC_FUNCS), ids=_id)
def test_jacobian_matches_torch(case, layout, vectorize):
    name, single = case
    shapes, factory = JAC_FUNCS[name]
    ks, ts, _ = operands(shapes, layout)
    k_res, t_res = _call(
        lambda i: KF.jacobian(factory(kiln), i, vectorize=vectorize),
        lambda i: TF.jacobian(factory(torch), i, vectorize=vectorize),
        ks,
        ts,
        single,
    )
    same(k_res, t_res)


@pytest.mark.parametrize("case", _cases(JAC_FUNCS), ids=_id)
def test_jacobian_create_graph_is_differentiable(case):
    name, single = case
    shapes, factory = JAC_FUNCS[name]
    ks, ts, pairs = operands(shapes, "transposed", requires_grad=True)
    k_res, t_res = _call(
        lambda i: KF.jacobian(factory(kiln), i, create_graph=True),
        lambda i: TF.jacobian(factory(torch), i, create_graph=True),
        ks,
        ts,
        single,
    )
    same(k_res, t_res)
    if not any(t.requires_grad for t in flat(t_res)):  # a linear function: nothing to differentiate
        return
    reduce_all(k_res).backward()
    reduce_all(t_res).backward()
    for i, p in enumerate(pairs):
        if p.t_leaf.grad is None:
            assert p.k_leaf.grad is None
        else:
            same(p.k_leaf.grad, p.t_leaf.grad, f"grad of input {i}")


@pytest.mark.parametrize("api", ["jacobian", "hessian", "vjp", "jvp", "vhp", "hvp"])
def test_create_graph_with_inputs_that_do_not_require_grad(api):
    # the results then require grad exactly where torch's do (through the function's non-linearity)
    ks, ts, _ = operands([(3,), (2,)])
    vk, vt = vectors([(3,), (2,)])

    def fn(x, y):
        return (x.exp().sum() * y.sin().sum() + (y * 3).sum()).reshape(())

    extra_k, extra_t = ((), ()) if api in ("jacobian", "hessian") else ((vk,), (vt,))
    if api == "vjp":
        extra_k, extra_t = (kiln.tensor(1.5, dtype=kiln.float64),), (torch.tensor(1.5, dtype=torch.float64),)
    same(
        getattr(KF, api)(fn, ks, *extra_k, create_graph=True),
        getattr(TF, api)(fn, ts, *extra_t, create_graph=True),
    )


def test_jacobian_differentiable_with_respect_to_captured_parameters():
    rng = U.rng_for(3)
    (kw, tw), (kx, tx) = (U.both(rng.standard_normal(s), requires_grad=rg) for s, rg in (((3,), True), ((3,), False)))
    k_jac = KF.jacobian(lambda x: (kw * x).tanh() * x.sum(), kx, create_graph=True)
    t_jac = TF.jacobian(lambda x: (tw * x).tanh() * x.sum(), tx, create_graph=True)
    same(k_jac, t_jac)
    reduce_all(k_jac).backward()
    reduce_all(t_jac).backward()
    same(kw.grad, tw.grad, "grad of the captured parameter")


def test_results_are_detached_and_inputs_untouched_without_create_graph():
    ks, ts, pairs = operands([(2, 3), (3,)], requires_grad=True)

    def fn(x, y):
        return (x * y).sin(), y.exp().sum()

    for mod, ins in ((KF, ks), (TF, ts)):
        for res in (mod.jacobian(fn, ins), mod.vjp(fn, ins, (ins[0] * 0 + 1, ins[1].sum() * 0 + 1))):
            assert not any(t.requires_grad for t in flat(res))
    for p in pairs:
        assert p.k_leaf.grad is None and p.t_leaf.grad is None
        assert p.k.requires_grad and p.t.requires_grad


def test_function_capturing_its_input_treats_the_capture_as_a_constant():
    # The functions receive new Tensor objects, so a closure over the caller's tensor is a constant.
    ks, ts, _ = operands([(3,)])
    kx, tx = ks[0], ts[0]
    same(KF.jacobian(lambda x: x * kx, kx), TF.jacobian(lambda x: x * tx, tx))
    kx.requires_grad_(True)
    tx.requires_grad_(True)
    same(KF.jacobian(lambda x: x * kx, kx), TF.jacobian(lambda x: x * tx, tx))


def test_unused_inputs_and_constant_outputs_give_zeros():
    ks, ts, _ = operands([(2,), (3,)])
    same(
        KF.jacobian(lambda x, y: (x.exp(), x.sum() * 0 + kiln.ones(4, dtype=kiln.float64)), ks),
        TF.jacobian(lambda x, y: (x.exp(), x.sum() * 0 + torch.ones(4, dtype=torch.float64)), ts),
    )
    same(
        KF.jacobian(lambda x, y: kiln.ones(2, dtype=kiln.float64), ks),
        TF.jacobian(lambda x, y: torch.ones(2, dtype=torch.float64), ts),
    )
    same(KF.jacobian(lambda x, y: x.to(kiln.int64), ks), TF.jacobian(lambda x, y: x.to(torch.int64), ts))
    same(KF.hessian(lambda x, y: (x * x).sum(), ks), TF.hessian(lambda x, y: (x * x).sum(), ts))
    v_k, v_t = vectors([(2,), (3,)])
    for name in ("vjp", "jvp", "vhp", "hvp"):
        fk, ft = getattr(KF, name), getattr(TF, name)
        if name == "vjp":
            same(fk(lambda x, y: x.exp(), ks, v_k[0]), ft(lambda x, y: x.exp(), ts, v_t[0]), name)
        elif name == "jvp":
            same(fk(lambda x, y: x.exp(), ks, v_k), ft(lambda x, y: x.exp(), ts, v_t), name)
        else:
            same(fk(lambda x, y: x.exp().sum(), ks, v_k), ft(lambda x, y: x.exp().sum(), ts, v_t), name)


def test_jacobian_result_has_the_input_dtype():
    kx = kiln.tensor([1.0, 2.0], dtype=kiln.float32)
    tx = torch.tensor([1.0, 2.0], dtype=torch.float32)
    same(KF.jacobian(lambda x: x.double() * 3, kx), TF.jacobian(lambda x: x.double() * 3, tx))


def test_runs_under_no_grad():
    ks, ts, _ = operands([(3,)], requires_grad=True)
    v_k, v_t = vectors([(3,)])
    with kiln.no_grad():
        k = (KF.jacobian(lambda x: x.exp(), ks[0]), KF.vjp(lambda x: x.exp(), ks[0], v_k[0]))
        k_cg = KF.vjp(lambda x: x.exp(), ks[0], v_k[0], create_graph=True)
    with torch.no_grad():
        t = (TF.jacobian(lambda x: x.exp(), ts[0]), TF.vjp(lambda x: x.exp(), ts[0], v_t[0]))
        t_cg = TF.vjp(lambda x: x.exp(), ts[0], v_t[0], create_graph=True)
    same(k, t)
    same(k_cg, t_cg)
    assert kiln.is_grad_enabled()


def test_jacobian_of_an_empty_output_is_empty():
    # torch raises here ("stack expects a non-empty TensorList"); kiln returns the (empty) Jacobian
    x = kiln.tensor([1.0, 2.0, 3.0], dtype=kiln.float64)
    jac = KF.jacobian(lambda x: x[:0], x)
    assert jac.shape == (0, 3) and jac.dtype is kiln.float64 and not jac.requires_grad
    jac = KF.jacobian(lambda x: (x.sum(), x[:0]), (x,), vectorize=True)
    assert [tuple(j.shape) for row in jac for j in row] == [(3,), (0, 3)]


# ---------------------------------------------------------------------------------------- hessian


@pytest.mark.parametrize("vectorize", [False, True], ids=["loop", "vectorize"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", _cases(SCALAR_FUNCS), ids=_id)
def test_hessian_matches_torch(case, layout, vectorize):
    name, single = case
    shapes, factory = SCALAR_FUNCS[name]
    ks, ts, _ = operands(shapes, layout)
    k_res, t_res = _call(
        lambda i: KF.hessian(factory(kiln), i, vectorize=vectorize),
        lambda i: TF.hessian(factory(torch), i, vectorize=vectorize),
        ks,
        ts,
        single,
    )
    same(k_res, t_res)


@pytest.mark.parametrize("case", _cases(SCALAR_FUNCS), ids=_id)
def test_hessian_create_graph_is_differentiable(case):
    name, single = case
    shapes, factory = SCALAR_FUNCS[name]
    ks, ts, pairs = operands(shapes, "strided", requires_grad=True)
    k_res, t_res = _call(
        lambda i: KF.hessian(factory(kiln), i, create_graph=True),
        lambda i: TF.hessian(factory(torch), i, create_graph=True),
        ks,
        ts,
        single,
    )
    same(k_res, t_res)
    reduce_all(k_res).backward()
    reduce_all(t_res).backward()
    for i, p in enumerate(pairs):
        same(p.k_leaf.grad, p.t_leaf.grad, f"grad of input {i}")


# ---------------------------------------------------------------------------------------- vjp / jvp


def _jac_case_vectors(name, kind, seed=5, requires_grad=False):
    """v for vjp (output shapes) or jvp (input shapes) of JAC_FUNCS[name], in both libraries."""
    shapes, factory = JAC_FUNCS[name]
    if kind == "jvp":
        return vectors(shapes, seed, requires_grad)
    _, ts, _ = operands(shapes)
    out = factory(torch)(*ts)
    out_shapes = [o.shape for o in (out if isinstance(out, tuple) else (out,))]
    return vectors(out_shapes, seed, requires_grad)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", _cases(JAC_FUNCS), ids=_id)
@pytest.mark.parametrize("kind", ["vjp", "jvp"])
def test_vjp_jvp_match_torch(kind, case, layout):
    name, single = case
    shapes, factory = JAC_FUNCS[name]
    ks, ts, _ = operands(shapes, layout)
    v_k, v_t = _jac_case_vectors(name, kind)
    t_out = factory(torch)(*ts)
    v_single = (not isinstance(t_out, tuple)) if kind == "vjp" else single
    vk, vt = (v_k[0], v_t[0]) if v_single else (v_k, v_t)
    k_res, t_res = _call(
        lambda i: getattr(KF, kind)(factory(kiln), i, vk),
        lambda i: getattr(TF, kind)(factory(torch), i, vt),
        ks,
        ts,
        single,
    )
    same(k_res, t_res)


@pytest.mark.parametrize("case", _cases(JAC_FUNCS), ids=_id)
@pytest.mark.parametrize("kind", ["vjp", "jvp"])
def test_vjp_jvp_create_graph_is_differentiable(kind, case):
    name, single = case
    shapes, factory = JAC_FUNCS[name]
    ks, ts, pairs = operands(shapes, "transposed", requires_grad=True)
    v_k, v_t = _jac_case_vectors(name, kind, requires_grad=True)
    t_out = factory(torch)(*ts)
    v_single = (not isinstance(t_out, tuple)) if kind == "vjp" else single
    vk, vt = (v_k[0], v_t[0]) if v_single else (v_k, v_t)
    k_res, t_res = _call(
        lambda i: getattr(KF, kind)(factory(kiln), i, vk, create_graph=True),
        lambda i: getattr(TF, kind)(factory(torch), i, vt, create_graph=True),
        ks,
        ts,
        single,
    )
    same(k_res, t_res)
    reduce_all(k_res).backward()
    reduce_all(t_res).backward()
    for i, p in enumerate(pairs):
        same(p.k_leaf.grad, p.t_leaf.grad, f"grad of input {i}")
    for i, (a, b) in enumerate(zip(v_k, v_t)):
        if b.grad is None:
            assert a.grad is None
        else:
            same(a.grad, b.grad, f"grad of v[{i}]")


def test_v_may_be_omitted_for_single_elements():
    kx, tx = U.both(np.array([0.7]), requires_grad=False)
    k0, t0 = U.both(np.array(-0.3))
    same(KF.vjp(lambda x: (x.exp() * 2).sum(), kx), TF.vjp(lambda x: (x.exp() * 2).sum(), tx))
    same(KF.jvp(lambda x: (x.sin(), x * 3), k0), TF.jvp(lambda x: (x.sin(), x * 3), t0))
    same(KF.vhp(lambda x: (x**4).sum(), kx), TF.vhp(lambda x: (x**4).sum(), tx))
    same(KF.hvp(lambda x: (x**4).sum(), (k0,)), TF.hvp(lambda x: (x**4).sum(), (t0,)))


# ---------------------------------------------------------------------------------------- vhp / hvp


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", _cases(SCALAR_FUNCS), ids=_id)
@pytest.mark.parametrize("kind", ["vhp", "hvp"])
def test_vhp_hvp_match_torch(kind, case, layout):
    name, single = case
    shapes, factory = SCALAR_FUNCS[name]
    ks, ts, _ = operands(shapes, layout)
    v_k, v_t = vectors(shapes, seed=7)
    vk, vt = (v_k[0], v_t[0]) if single else (v_k, v_t)
    k_res, t_res = _call(
        lambda i: getattr(KF, kind)(factory(kiln), i, vk),
        lambda i: getattr(TF, kind)(factory(torch), i, vt),
        ks,
        ts,
        single,
    )
    same(k_res, t_res)


@pytest.mark.parametrize("case", _cases(SCALAR_FUNCS), ids=_id)
@pytest.mark.parametrize("kind", ["vhp", "hvp"])
def test_vhp_hvp_create_graph_is_differentiable(kind, case):
    name, single = case
    shapes, factory = SCALAR_FUNCS[name]
    ks, ts, pairs = operands(shapes, "strided", requires_grad=True)
    v_k, v_t = vectors(shapes, seed=7, requires_grad=True)
    vk, vt = (v_k[0], v_t[0]) if single else (v_k, v_t)
    k_res, t_res = _call(
        lambda i: getattr(KF, kind)(factory(kiln), i, vk, create_graph=True),
        lambda i: getattr(TF, kind)(factory(torch), i, vt, create_graph=True),
        ks,
        ts,
        single,
    )
    same(k_res, t_res)
    reduce_all(k_res).backward()
    reduce_all(t_res).backward()
    for i, p in enumerate(pairs):
        same(p.k_leaf.grad, p.t_leaf.grad, f"grad of input {i}")
    for i, (a, b) in enumerate(zip(v_k, v_t)):
        same(a.grad, b.grad, f"grad of v[{i}]")


def test_hvp_equals_vhp_transposed_for_a_smooth_function():
    ks, _, _ = operands([(3,), (2,)])
    v_k, _ = vectors([(3,), (2,)])

    def fn(x, y):
        return (x.exp().sum() * y.sin().sum() + (x * x).sum()).reshape(())

    for a, b in zip(KF.hvp(fn, ks, v_k)[1], KF.vhp(fn, ks, v_k)[1]):
        np.testing.assert_allclose(U.kiln_to_np(a), U.kiln_to_np(b), rtol=TOL, atol=TOL)


# ---------------------------------------------------------------------------------------- errors


def _error_case(kiln_call, torch_call, message=None):
    U.assert_same_error(kiln_call, torch_call, message=message, exact=True)


def _both(shapes, requires_grad=False):
    ks, ts, _ = operands(shapes, requires_grad=requires_grad)
    return ks, ts


def _param(lib):
    """A captured parameter that requires grad (outputs that depend on it require grad without the inputs)."""
    return lib.tensor([0.5, -2.0], dtype=lib.float64, requires_grad=True)


STRICT_CASES = {
    # name: (api, input shapes, factory(lib) -> function, keyword arguments)
    "jacobian-unused-input": ("jacobian", [(2,), (2,)], lambda lib: lambda x, y: x * x, {}),
    "jacobian-constant-output": ("jacobian", [(2,)], lambda lib: lambda x: lib.ones(2, dtype=lib.float64), {}),
    "jacobian-second-output-unused": (
        "jacobian",
        [(2,), (3,)],
        lambda lib: lambda x, y: (x * y.sum(), x.exp()),
        {},
    ),
    "jacobian-linear-create-graph": ("jacobian", [(2,)], lambda lib: lambda x: x * 2, {"create_graph": True}),
    "jacobian-strict-vectorize": ("jacobian", [(2,)], lambda lib: lambda x: x * x, {"vectorize": True}),
    "hessian-linear": ("hessian", [(2,)], lambda lib: lambda x: (x * 2).sum(), {}),
    "hessian-linear-in-one-input": ("hessian", [(2,), (2,)], lambda lib: lambda x, y: (x * x).sum() + y.sum(), {}),
    "hessian-unused-input": ("hessian", [(2,), (2,)], lambda lib: lambda x, y: (x * x).sum(), {}),
    "hessian-constant": ("hessian", [(2,)], lambda lib: lambda x: lib.ones((), dtype=lib.float64), {}),
    "hessian-quadratic-create-graph": ("hessian", [(2,)], lambda lib: lambda x: (x * x).sum(), {"create_graph": True}),
    "vjp-unused-input": ("vjp", [(2,), (2,)], lambda lib: lambda x, y: (x * x).sum(), {}),
    "vjp-constant-output": ("vjp", [(2,)], lambda lib: lambda x: lib.ones((), dtype=lib.float64), {}),
    "vjp-linear-create-graph": ("vjp", [(2,)], lambda lib: lambda x: (x * 2).sum(), {"create_graph": True}),
    "jvp-unused-input": ("jvp", [(2,), (2,)], lambda lib: lambda x, y: x * x, {}),
    "jvp-constant-output": ("jvp", [(2,)], lambda lib: lambda x: lib.ones(2, dtype=lib.float64), {}),
    "jvp-linear-create-graph": ("jvp", [(2,)], lambda lib: lambda x: x * 2, {"create_graph": True}),
    "jvp-output-independent": ("jvp", [(2,)], lambda lib: lambda x: (x * x, x.detach() * 1), {}),
    "jvp-output-of-a-captured-parameter": (
        "jvp",
        [(2,)],
        lambda lib: (lambda w: lambda x: (x * 2, w * 3))(_param(lib)),
        {},
    ),
    "vhp-jacobian-of-a-captured-parameter": (
        "vhp",
        [(2,), (2,)],
        lambda lib: (lambda w: lambda x, y: (x * x).sum() + (y * w).sum())(_param(lib)),
        {},
    ),
    "hvp-jacobian-of-a-captured-parameter": (
        "hvp",
        [(2,), (2,)],
        lambda lib: (lambda w: lambda x, y: (x * x).sum() + (y * w).sum())(_param(lib)),
        {},
    ),
    "vhp-linear": ("vhp", [(2,)], lambda lib: lambda x: (x * 2).sum(), {}),
    "vhp-unused-input": ("vhp", [(2,), (2,)], lambda lib: lambda x, y: (x * x).sum(), {}),
    "vhp-quadratic-create-graph": ("vhp", [(2,)], lambda lib: lambda x: (x * x).sum(), {"create_graph": True}),
    "hvp-linear": ("hvp", [(2,)], lambda lib: lambda x: (x * 2).sum(), {}),
    "hvp-unused-input": ("hvp", [(2,), (2,)], lambda lib: lambda x, y: (x * x).sum(), {}),
    "hvp-quadratic-create-graph": ("hvp", [(2,)], lambda lib: lambda x: (x * x).sum(), {"create_graph": True}),
}


@pytest.mark.parametrize("case", list(STRICT_CASES))
def test_strict_mode_errors_match_torch(case):
    api, shapes, factory, kwargs = STRICT_CASES[case]
    ks, ts = _both(shapes)
    single = len(shapes) == 1
    k_in, t_in = (ks[0], ts[0]) if single else (ks, ts)
    args_k, args_t = (), ()
    if api in ("jvp", "vhp", "hvp"):
        vk, vt = vectors(shapes)
        args_k, args_t = ((vk[0] if single else vk),), ((vt[0] if single else vt),)
    elif api == "vjp":
        out = factory(torch)(*ts)
        vk, vt = vectors([out.shape])
        args_k, args_t = (vk[0],), (vt[0],)
    kf, tf = getattr(KF, api), getattr(TF, api)
    _error_case(
        lambda: kf(factory(kiln), k_in, *args_k, strict=True, **kwargs),
        lambda: tf(factory(torch), t_in, *args_t, strict=True, **kwargs),
    )
    # without strict the same call returns (zeros where the strict check failed), as in torch
    if "vectorize" not in kwargs:
        same(
            kf(factory(kiln), k_in, *args_k, **kwargs),
            tf(factory(torch), t_in, *args_t, **kwargs),
        )


def test_strict_create_graph_jacobian_error_names_the_input():
    # torch's message names the output's index here ("input 0"); kiln names the input the jacobian row is
    # independent of (input 1), with the same wording
    ks, ts = _both([(2,), (2,)])

    def fn(x, y):
        return (x * x + y * 2,)

    TF.jacobian(fn, ts, create_graph=False, strict=True)  # the premise: no error without create_graph
    with pytest.raises(RuntimeError) as info:
        TF.jacobian(fn, ts, create_graph=True, strict=True)
    assert "independent of input 0." in str(info.value)
    with pytest.raises(RuntimeError) as info:
        KF.jacobian(fn, ks, create_graph=True, strict=True)
    assert str(info.value) == (
        "The jacobian of the user-provided function is independent of input 1. This is not allowed in strict "
        "mode when create_graph=True."
    )


def test_strict_passes_for_a_function_depending_on_every_input():
    ks, ts = _both([(2,), (3,)])
    vk, vt = vectors([(2,), (3,)])

    def fn(x, y):
        return (x.exp().sum() * y.sin().sum()).reshape(())

    for name in ("jacobian", "hessian"):
        same(getattr(KF, name)(fn, ks, strict=True), getattr(TF, name)(fn, ts, strict=True), name)
    for name in ("jvp", "vhp", "hvp"):
        same(getattr(KF, name)(fn, ks, vk, strict=True), getattr(TF, name)(fn, ts, vt, strict=True), name)
    same(KF.vjp(fn, ks, strict=True), TF.vjp(fn, ts, strict=True))


ALL_APIS = ("jacobian", "hessian", "vjp", "jvp", "vhp", "hvp")


@pytest.mark.parametrize("api", ALL_APIS)
@pytest.mark.parametrize(
    "bad",
    ["list", "number", "tuple-with-number", "numpy", "none"],
)
def test_wrong_input_types(api, bad):
    ks, ts = _both([(2,)])
    value = {
        "list": lambda lib_in: [lib_in[0]],
        "number": lambda lib_in: 1.5,
        "tuple-with-number": lambda lib_in: (lib_in[0], 2),
        "numpy": lambda lib_in: np.ones(2),
        "none": lambda lib_in: None,
    }[bad]
    v_k = (kiln.ones(2, dtype=kiln.float64),) if api in ("vjp", "jvp", "vhp", "hvp") else ()
    v_t = (torch.ones(2, dtype=torch.float64),) if v_k else ()
    _error_case(
        lambda: getattr(KF, api)(lambda *a: a[0].sum(), value(ks), *v_k),
        lambda: getattr(TF, api)(lambda *a: a[0].sum(), value(ts), *v_t),
    )


@pytest.mark.parametrize("api", ALL_APIS)
@pytest.mark.parametrize("returned", ["float", "list", "none", "tuple-with-float", "numpy"])
def test_function_returning_a_non_tensor(api, returned):
    ks, ts = _both([(2,)])
    make = {
        "float": lambda x: 3.0,
        "list": lambda x: [x * 2],
        "none": lambda x: None,
        "tuple-with-float": lambda x: (x * 2, 1.0),
        "numpy": lambda x: np.ones(2),
    }[returned]
    v_k = (kiln.ones(2, dtype=kiln.float64),) if api in ("jvp", "vhp", "hvp") else ()
    v_t = (torch.ones(2, dtype=torch.float64),) if v_k else ()
    _error_case(lambda: getattr(KF, api)(make, ks[0], *v_k), lambda: getattr(TF, api)(make, ts[0], *v_t))


@pytest.mark.parametrize("api", ["hessian", "vhp", "hvp"])
@pytest.mark.parametrize("returned", ["tuple", "one-tuple", "vector", "empty"])
def test_scalar_apis_need_a_single_element(api, returned):
    ks, ts = _both([(3,)])
    make = {
        "tuple": lambda x: (x.sum(), x.sum()),
        "one-tuple": lambda x: (x.sum(),),
        "vector": lambda x: x * x,
        "empty": lambda x: x[:0],
    }[returned]
    v_k = (kiln.ones(3, dtype=kiln.float64),) if api != "hessian" else ()
    v_t = (torch.ones(3, dtype=torch.float64),) if v_k else ()
    _error_case(lambda: getattr(KF, api)(make, ks[0], *v_k), lambda: getattr(TF, api)(make, ts[0], *v_t))


V_CASES = {
    # name: (api, input shapes, function, v shapes (a list: a tuple of v's; a tuple: a single v; None: omitted))
    "vjp-size": ("vjp", [(3,)], lambda x: x * 2, (2,)),
    "vjp-size-2d": ("vjp", [(2, 3)], lambda x: x * 2, (3, 2)),
    "vjp-entry-size": ("vjp", [(3,)], lambda x: (x * 2, x.sum()), [(3,), (1,)]),
    "vjp-tuple-length": ("vjp", [(3,)], lambda x: (x * 2, x.sum()), [(3,)]),
    "vjp-single-given-two": ("vjp", [(3,)], lambda x: x * 2, [(3,), (3,)]),
    "vjp-none-vector-output": ("vjp", [(3,)], lambda x: x * 2, None),
    "vjp-none-tuple-output": ("vjp", [()], lambda x: (x * 2, x * 3), None),
    "jvp-size": ("jvp", [(3,)], lambda x: x * 2, (4,)),
    "jvp-entry-size": ("jvp", [(3,), (2,)], lambda x, y: x * y.sum(), [(3,), (3,)]),
    "jvp-tuple-length": ("jvp", [(3,), (2,)], lambda x, y: x * y.sum(), [(3,)]),
    "jvp-single-given-two": ("jvp", [(3,)], lambda x: x * 2, [(3,), (3,)]),
    "jvp-none-vector-input": ("jvp", [(3,)], lambda x: x * 2, None),
    "jvp-none-two-inputs": ("jvp", [(), ()], lambda x, y: x * y, None),
    "vhp-size": ("vhp", [(3,)], lambda x: (x**3).sum(), (3, 1)),
    "vhp-entry-size": ("vhp", [(3,), (2,)], lambda x, y: (x**3).sum() * y.sum(), [(3,), (1,)]),
    "vhp-tuple-length": ("vhp", [(3,), (2,)], lambda x, y: (x**3).sum() * y.sum(), [(3,), (2,), (1,)]),
    "vhp-none-vector-input": ("vhp", [(3,)], lambda x: (x**3).sum(), None),
    "hvp-size": ("hvp", [(3,)], lambda x: (x**3).sum(), (2,)),
    "hvp-entry-size": ("hvp", [(3,), (2,)], lambda x, y: (x**3).sum() * y.sum(), [(2,), (2,)]),
    "hvp-single-given-two": ("hvp", [(3,)], lambda x: (x**3).sum(), [(3,), (3,)]),
    "hvp-none-vector-input": ("hvp", [(3,)], lambda x: (x**3).sum(), None),
}


@pytest.mark.parametrize("case", list(V_CASES))
def test_wrong_v(case):
    api, shapes, fn, v_shapes = V_CASES[case]
    ks, ts = _both(shapes)
    single = len(shapes) == 1
    k_in, t_in = (ks[0], ts[0]) if single else (ks, ts)
    if v_shapes is None:
        vk = vt = None
    elif isinstance(v_shapes, list):
        vk, vt = vectors(v_shapes)
    else:
        (vk,), (vt,) = vectors([v_shapes])
    _error_case(lambda: getattr(KF, api)(fn, k_in, vk), lambda: getattr(TF, api)(fn, t_in, vt))


@pytest.mark.parametrize("api", ["vjp", "jvp", "vhp", "hvp"])
@pytest.mark.parametrize("bad", ["list", "number", "tuple-with-number"])
def test_v_of_a_wrong_type(api, bad):
    ks, ts = _both([(2,)])
    value = {
        "list": lambda lib: [lib.ones(2, dtype=lib.float64)],
        "number": lambda lib: 1.0,
        "tuple-with-number": lambda lib: (lib.ones(2, dtype=lib.float64), 1.0),
    }[bad]
    _error_case(
        lambda: getattr(KF, api)(lambda x: (x**3).sum() if api in ("vhp", "hvp") else x * 2, ks[0], value(kiln)),
        lambda: getattr(TF, api)(lambda x: (x**3).sum() if api in ("vhp", "hvp") else x * 2, ts[0], value(torch)),
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"strategy": "forward-mode", "create_graph": True},
        {"strategy": "forward-mode", "strict": True},
        {"strategy": "forward-mode"},
        {"strategy": "forward-mode", "create_graph": True, "strict": True, "vectorize": True},
        {"strategy": "reverse"},
        {"strategy": "forward-mode", "strict": True, "vectorize": True},
    ],
    ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()),
)
def test_jacobian_strategy_errors(kwargs):
    ks, ts = _both([(2,)])
    _error_case(
        lambda: KF.jacobian(lambda x: x * x, ks[0], **kwargs),
        lambda: TF.jacobian(lambda x: x * x, ts[0], **kwargs),
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"outer_jacobian_strategy": "forward-mode", "create_graph": True},
        {"outer_jacobian_strategy": "forward-mode", "strict": True},
        {"outer_jacobian_strategy": "forward-mode"},
        {"outer_jacobian_strategy": "reverse"},
    ],
    ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()),
)
def test_hessian_strategy_errors(kwargs):
    ks, ts = _both([(2,)])
    _error_case(
        lambda: KF.hessian(lambda x: (x**3).sum(), ks[0], **kwargs),
        lambda: TF.hessian(lambda x: (x**3).sum(), ts[0], **kwargs),
    )


def test_forward_mode_with_vectorize_needs_forward_ad():
    # torch computes this with forward-mode AD and vmap; kiln has neither, and says so
    ks, ts = _both([(2,)])
    TF.jacobian(lambda x: x * x, ts[0], strategy="forward-mode", vectorize=True)  # the premise: torch supports it
    with pytest.raises(NotImplementedError, match="forward-mode AD"):
        KF.jacobian(lambda x: x * x, ks[0], strategy="forward-mode", vectorize=True)
    with pytest.raises(NotImplementedError, match="forward-mode AD"):
        KF.hessian(lambda x: (x**3).sum(), ks[0], outer_jacobian_strategy="forward-mode", vectorize=True)
    with pytest.raises(TypeError, match="The inputs given to jacobian must be"):
        KF.jacobian(lambda x: x * x, [ks[0]], strategy="forward-mode", vectorize=True)
