"""The names of issue 19's math, reduction, comparison and linear-algebra share exist in kiln as in torch 2.13,
with a docstring and torch's signature: parameter names, defaults and keyword-only markers, read from
``inspect.signature`` where torch exposes one and from the signature line of torch's docstring otherwise.
The differences listed in ``KNOWN`` are reasons, not omissions."""

from __future__ import annotations

import ast
import inspect
import re

import pytest
import torch

import kiln
import kiln.linalg

TOP = [
    "isclose",
    "allclose",
    "greater",
    "greater_equal",
    "less",
    "less_equal",
    "not_equal",
    "isin",
    "isreal",
    "signbit",
    "heaviside",
    "gcd",
    "gcd_",
    "lcm",
    "lcm_",
    "ldexp",
    "ldexp_",
    "frexp",
    "nextafter",
    "float_power",
    "fmax",
    "fmin",
    "logaddexp",
    "logaddexp2",
    "rad2deg",
    "rad2deg_",
    "deg2rad",
    "deg2rad_",
    "abs_",
    "acos_",
    "acosh_",
    "addmv_",
    "arccos_",
    "arccosh_",
    "arcsin_",
    "arcsinh_",
    "arctan_",
    "arctanh_",
    "asin_",
    "asinh_",
    "atan_",
    "atanh_",
    "ceil_",
    "clamp_",
    "clamp_max_",
    "clamp_min_",
    "clip_",
    "cos_",
    "cosh_",
    "exp2_",
    "exp_",
    "expm1_",
    "fix_",
    "floor_",
    "frac_",
    "log10_",
    "log1p_",
    "log2_",
    "log_",
    "logit_",
    "nan_to_num_",
    "neg_",
    "negative_",
    "reciprocal_",
    "relu_",
    "round_",
    "rsqrt_",
    "sigmoid_",
    "sin_",
    "sinh_",
    "sqrt_",
    "square_",
    "tan_",
    "tanh_",
    "trunc_",
    "dropout_",
    "alpha_dropout_",
    "feature_alpha_dropout_",
    "feature_dropout",
    "feature_dropout_",
    "rsub",
    "addr",
    "cross",
    "kron",
    "inner",
    "vdot",
    "chain_matmul",
    "cdist",
    "dist",
    "diff",
    "gradient",
    "cov",
    "corrcoef",
    "trapezoid",
    "trapz",
    "cumulative_trapezoid",
    "renorm",
    "cummax",
    "cummin",
    "logcumsumexp",
    "nanmedian",
    "quantile",
    "nanquantile",
    "mode",
    "aminmax",
    "histogram",
    "histogramdd",
    "logdet",
    "matrix_exp",
    "matrix_power",
    "cholesky",
    "cholesky_inverse",
    "cholesky_solve",
    "lu",
    "lu_solve",
    "lu_unpack",
    "triangular_solve",
    "qr",
    "svd",
    "pinverse",
]
LIN = [
    "cond",
    "diagonal",
    "householder_product",
    "inv_ex",
    "cholesky_ex",
    "solve_ex",
    "lstsq",
    "lu",
    "lu_factor",
    "lu_factor_ex",
    "lu_solve",
    "ldl_factor",
    "ldl_factor_ex",
    "ldl_solve",
    "matmul",
    "matrix_exp",
    "matrix_power",
    "matrix_rank",
    "multi_dot",
    "pinv",
    "solve_triangular",
    "tensorinv",
    "tensorsolve",
    "vander",
]
METH = [
    "isclose",
    "allclose",
    "greater",
    "greater_",
    "greater_equal",
    "greater_equal_",
    "less",
    "less_",
    "less_equal",
    "less_equal_",
    "not_equal",
    "not_equal_",
    "isreal",
    "signbit",
    "heaviside",
    "heaviside_",
    "gcd",
    "gcd_",
    "lcm",
    "lcm_",
    "ldexp",
    "ldexp_",
    "frexp",
    "nextafter",
    "nextafter_",
    "float_power",
    "float_power_",
    "fmax",
    "fmin",
    "logaddexp",
    "logaddexp2",
    "rad2deg",
    "rad2deg_",
    "deg2rad",
    "deg2rad_",
    "addmv_",
    "addr",
    "addr_",
    "baddbmm_",
    "addbmm_",
    "addmm_",
    "cumsum_",
    "cumprod_",
    "cross",
    "kron",
    "inner",
    "vdot",
    "dist",
    "diff",
    "cov",
    "corrcoef",
    "renorm",
    "renorm_",
    "cummax",
    "cummin",
    "logcumsumexp",
    "nanmedian",
    "quantile",
    "nanquantile",
    "mode",
    "aminmax",
    "histogram",
    "logdet",
    "matrix_exp",
    "matrix_power",
    "cholesky",
    "cholesky_inverse",
    "cholesky_solve",
    "lu",
    "lu_solve",
    "triangular_solve",
    "qr",
    "svd",
    "pinverse",
]


# where kiln's signature differs from torch's documented line, and why
KNOWN = {
    "top.allclose": "torch's line is typed; the parameter names are the binding's",
    "top.rad2deg": "torch's line documents out=",
    "top.qr": "torch's line is typed (some: bool = True)",
    "top.chain_matmul": "both take *matrices",
    "top.cdist": "torch's signature reads None for parameters without defaults",
    "top.trapz": "one signature for torch's two overloads (x or dx)",
    "top.nanmedian": "one signature for torch's two overloads (with and without dim)",
    "top.cholesky_solve": "torch documents (B, L); its binding takes input, input2, as kiln",
    "top.lu": "torch's is a Python wrapper taking *args, **kwargs",
    "Tensor.frexp": "torch documents the method with input",
    "Tensor.cumsum_": "dtype is keyword-only in torch's schema as in kiln",
    "Tensor.cumprod_": "dtype is keyword-only in torch's schema as in kiln",
    "Tensor.mode": "torch documents dim=None; its schema's default is -1, as kiln's",
    "Tensor.histogram": "torch documents the method with input",
    "Tensor.pinverse": "torch documents no parameters; the method takes rcond, as kiln's",
}


def torch_params(fn, name):
    try:
        sig = inspect.signature(fn)
        return [
            (p.name, p.kind == p.KEYWORD_ONLY, None if p.default is p.empty else p.default)
            for p in sig.parameters.values()
        ], "inspect"
    except (ValueError, TypeError):
        pass
    doc = fn.__doc__ or ""
    for line in doc.strip().splitlines():
        m = re.match(r"^\s*(?:torch\.)?(?:linalg\.)?" + re.escape(name) + r"\((.*)\)", line)
        if m:
            break
    else:
        return None, "nodoc"
    text = m.group(1)
    depth = 0
    cur = ""
    parts = []
    for ch in text:
        if ch in "([{":
            depth += 1
        if ch in ")]}":
            depth -= 1
            if depth < 0:
                break
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    out = []
    kw = False
    for p in parts:
        p = p.strip()
        if not p:
            continue
        if p == "*":
            kw = True
            continue
        if "=" in p:
            n, d = p.split("=", 1)
            n = n.strip().split()[-1].split(":")[0]
            try:
                d = ast.literal_eval(d.strip())
            except (ValueError, SyntaxError):
                d = d.strip()
            out.append((n, kw, d))
        else:
            out.append((p.split()[-1].split(":")[0], kw, "REQ"))
    return out, "doc"


def kiln_params(fn, method=False):
    sig = inspect.signature(fn)
    ps = list(sig.parameters.values())
    if method:
        ps = ps[1:]
    return [(p.name, p.kind == p.KEYWORD_ONLY, "REQ" if p.default is p.empty else p.default) for p in ps]


def norm(ps):
    return [(n, k, d) for n, k, d in ps if n != "out"]


CASES = [("top", n, torch, kiln, False) for n in TOP] + [("linalg", n, torch.linalg, kiln.linalg, False) for n in LIN]
CASES += [("Tensor", n, torch.Tensor, kiln.Tensor, True) for n in METH]


@pytest.mark.parametrize("where,name,tmod,kmod,method", CASES, ids=[f"{c[0]}.{c[1]}" for c in CASES])
def test_name_exists_with_torchs_signature(where, name, tmod, kmod, method):
    assert hasattr(tmod, name), f"torch lacks {where}.{name}: the list is wrong"
    kf = getattr(kmod, name, None)
    assert kf is not None, f"kiln lacks {where}.{name}"
    assert (kf.__doc__ or "").strip(), f"{where}.{name} has no docstring"
    key = f"{where}.{name}"
    tp, how = torch_params(getattr(tmod, name), name)
    if tp is None or key in KNOWN:
        return
    if how == "inspect" and method:
        tp = tp[1:]
    tp, kp = norm(tp), norm(kiln_params(kf, method))
    assert [p[:2] for p in kp] == [p[:2] for p in tp], f"{key}: kiln {kp} != torch ({how}) {tp}"
    assert [str(p[2]) for p in kp] == [str(p[2]) for p in tp], f"{key}: defaults: kiln {kp} != torch {tp}"


def test_known_differences_are_still_differences():
    stale = []
    for where, name, tmod, kmod, method in CASES:
        key = f"{where}.{name}"
        if key not in KNOWN:
            continue
        tp, how = torch_params(getattr(tmod, name), name)
        if tp is None:
            continue
        if how == "inspect" and method:
            tp = tp[1:]
        if norm(tp) == norm(kiln_params(getattr(kmod, name), method)):
            stale.append(key)
    assert not stale, f"these now match torch: drop them from KNOWN: {stale}"
