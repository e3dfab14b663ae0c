"""Running one op's cases on a device and on the reference backend, and comparing the two.

The oracle is the NumPy reference backend, reached through :class:`ReferenceMode`: a dispatch mode
that sends every op — forward and the ops autograd runs for backward — to the op's reference kernel,
whatever plugin owns the ``"cpu"`` kernels (so testing device ``cpu`` with kiln-cpu installed still
compares against the reference, not against itself).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
from collections.abc import Iterator

import numpy as np

import kiln
import kiln.plugins as _plugins
from kiln.backend import DispatchMode, ops, reference_kernel
from kiln.testing import assert_close
from kiln_testing._specs import DEVICE, Case, Ctx, OpSpec, T, resolve

__all__ = [
    "ReferenceMode",
    "cpu_fallback",
    "kernel_source",
    "is_missing_error",
    "needs_missing_kernel",
    "call_on_device",
    "CaseOutcome",
    "run_forward",
    "run_backward",
]

FALLBACK_WARNING = r"The operator '.*' is not implemented for the .* device; running it on the CPU"


class ReferenceMode(DispatchMode):
    """Within this context every op runs its NumPy reference kernel (CPU tensors only)."""

    level = "post_autograd"
    _kernels: dict = {}

    def dispatch(self, op, args, redispatch):
        kernel = self._kernels.get(op.name)
        if kernel is None:
            if op.reference is None:
                return redispatch(op, args)
            kernel = self._kernels[op.name] = reference_kernel(op)
        return kernel(op.meta(*args), *args)


def _reset_kernel_cache() -> None:
    # The dispatcher caches the kernel it resolved for an (op, device type) pair, the CPU fallback
    # included, so a change of KILN_CPU_FALLBACK needs the cache refilled from the registrations.
    _plugins.refresh_kernels()


@contextlib.contextmanager
def cpu_fallback(enabled: bool) -> Iterator[None]:
    """``KILN_CPU_FALLBACK`` on or off for the duration of the block (the process's setting afterwards)."""
    old = os.environ.get("KILN_CPU_FALLBACK")
    if enabled:
        os.environ["KILN_CPU_FALLBACK"] = "1"
    else:
        os.environ.pop("KILN_CPU_FALLBACK", None)
    _reset_kernel_cache()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("KILN_CPU_FALLBACK", None)
        else:
            os.environ["KILN_CPU_FALLBACK"] = old
        _reset_kernel_cache()


def fallback_enabled() -> bool:
    return os.environ.get("KILN_CPU_FALLBACK") == "1"


def is_generic(opdef) -> bool:
    """True when every device gets the op from the core, built on its device contract alone."""
    return opdef.device_generic


def kernel_source(opdef, dev_type: str) -> str | None:
    """Who serves ``opdef`` on ``dev_type``: the plugin that registered a kernel (possibly for some dtypes
    only), ``"generic"`` (the core, from the device contract), ``"decomposed"`` (the op's decomposition into
    other ops, run on the device), or None."""
    owner = _plugins.kernel_owner(opdef.name, dev_type)
    if owner is not None:
        return owner
    if is_generic(opdef):
        return "generic"
    return "decomposed" if opdef.decompose is not None else None


def is_missing_error(exc: BaseException, opdef) -> bool:
    """True for the dispatcher's "no kernel" error about ``opdef`` (not an error a kernel raised)."""
    return isinstance(exc, NotImplementedError) and f"The operator '{opdef.name}' is not currently implemented" in str(
        exc
    )


def needs_missing_kernel(exc: BaseException, dev_type: str) -> bool:
    """True for the dispatcher's "no kernel" error about any op on ``dev_type``: an op that runs as its
    decomposition cannot be served where the decomposition reaches a primitive the device lacks."""
    return isinstance(exc, NotImplementedError) and f"is not currently implemented for the {dev_type} device" in str(
        exc
    )


def call_on_device(fn, opdef, dev_type: str, args: tuple, kwargs: dict):
    """``(result, served)``: the op's result, and whether the device served it — False when the dispatcher
    found no kernel for it, or for an op its decomposition uses (it raised its "no kernel" error, or the CPU
    fallback ran instead)."""
    key = (opdef.name, dev_type)
    before = _plugins.fallback_counts().get(key, 0)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", FALLBACK_WARNING, UserWarning)
            out = fn(*args, **kwargs)
    except NotImplementedError as exc:
        if is_missing_error(exc, opdef) or needs_missing_kernel(exc, dev_type):
            return None, False
        raise
    return out, _plugins.fallback_counts().get(key, 0) == before


@dataclasses.dataclass
class CaseOutcome:
    """What happened to one case: ``kind`` is "ok", "error-agrees", "mismatch", "skipped"; ``detail`` says why."""

    label: str
    kind: str
    detail: str = ""


# ---------------------------------------------------------------------------------------- building


def _build(case: Case, device, *, grad: bool = False) -> tuple[tuple, dict, list[tuple[kiln.Tensor, T]]]:
    """The case's arguments built on ``device`` (T placeholders made, DEVICE resolved), and the leaves."""
    leaves: list[tuple[kiln.Tensor, T]] = []

    def make(a):
        if isinstance(a, T):
            rg = grad and a.grad and a.on != "cpu" and a.dtype.is_floating_point
            leaf, view = a.build(device, requires_grad=rg)
            leaves.append((leaf, a))
            return view
        if isinstance(a, (list, tuple)) and any(isinstance(x, T) for x in a):  # e.g. cat's list of tensors
            return type(a)(make(x) for x in a)
        return resolve(a, device)

    args = tuple(make(a) for a in case.args)
    kwargs = {k: make(v) for k, v in case.kwargs.items()}
    return args, kwargs, leaves


def _flat(out) -> list:
    if isinstance(out, (tuple, list)):
        flat = []
        for o in out:
            flat.extend(_flat(o))
        return flat
    return [out]


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _undeclared(case: Case, device_dtypes: tuple) -> str | None:
    for t in case.tensors():
        if t.on != "cpu" and t.dtype not in device_dtypes:
            return f"needs {t.dtype}, which the device does not declare"
    for a in (*case.args, *case.kwargs.values()):
        if isinstance(a, kiln.dtype) and a not in device_dtypes and DEVICE in case.args:
            return f"creates {a}, which the device does not declare"
    return None


def _compare(actual, expected, device, *, what: str, values: bool = True, rtol=None, atol=None) -> None:
    """``actual`` (computed on ``device``) equals ``expected`` (the reference, on the CPU)."""
    a_flat, e_flat = _flat(actual), _flat(expected)
    assert len(a_flat) == len(e_flat), f"{what}: {len(a_flat)} outputs, the reference gives {len(e_flat)}"
    for i, (a, e) in enumerate(zip(a_flat, e_flat)):
        where = f"{what}[{i}]" if len(e_flat) > 1 else what
        if not isinstance(e, kiln.Tensor):
            assert_close(a, e, equal_nan=True, msg=lambda m, w=where: f"{w}: {m}")
            continue
        assert isinstance(a, kiln.Tensor), f"{where}: expected a kiln.Tensor, got {type(a).__name__}"
        assert a.device == device, f"{where}: on {a.device}, expected on {device}"
        assert a.dtype == e.dtype, f"{where}: dtype {a.dtype}, the reference gives {e.dtype}"
        assert tuple(a.shape) == tuple(e.shape), (
            f"{where}: shape {tuple(a.shape)}, the reference gives {tuple(e.shape)}"
        )
        if values:
            assert_close(
                a.detach().cpu(),
                e.detach(),
                rtol=rtol,
                atol=atol,
                equal_nan=True,
                msg=lambda m, w=where: f"{w}: {m}",
            )


def _tolerances(spec: OpSpec) -> dict:
    return {"rtol": spec.rtol, "atol": spec.atol} if spec.rtol is not None else {}


# ---------------------------------------------------------------------------------------- forward


def run_forward(opdef, spec: OpSpec, dtype, device, device_dtypes: tuple) -> list[CaseOutcome]:
    """Every case of ``opdef`` for ``dtype``: on ``device`` and on the reference, compared."""
    fn = opdef.public
    outcomes = []
    cpu = kiln.device("cpu")
    for case in spec.cases(Ctx(opdef.name, dtype, device_dtypes)):
        why = _undeclared(case, device_dtypes)
        if why:
            outcomes.append(CaseOutcome(case.label, "skipped", why))
            continue
        # the reference, on the CPU
        r_args, r_kwargs, _ = _build(case, cpu)
        try:
            with ReferenceMode():
                expected = fn(*r_args, **r_kwargs)
            ref_error = None
        except Exception as exc:  # noqa: BLE001 - the reference rejects the case: the device must too
            ref_error = exc
        d_args, d_kwargs, _ = _build(case, device)
        untouched = [(x, a) for x, a in zip(d_args, case.args) if isinstance(a, T)] if case.inplace is None else []
        try:
            actual, served = call_on_device(fn, opdef, device.type, d_args, d_kwargs)
        except Exception as exc:  # noqa: BLE001 - compared with what the reference did below
            if ref_error is not None and isinstance(exc, type(ref_error)):
                outcomes.append(CaseOutcome(case.label, "error-agrees", _describe(exc)))
            elif ref_error is not None:
                outcomes.append(
                    CaseOutcome(
                        case.label,
                        "mismatch",
                        f"raised {_describe(exc)}; the reference raises {_describe(ref_error)}",
                    )
                )
            else:
                outcomes.append(
                    CaseOutcome(case.label, "mismatch", f"raised {_describe(exc)}; the reference computes it")
                )
            continue
        if not served:  # e.g. a kernel registered for some dtypes only: these inputs have none
            outcomes.append(CaseOutcome(case.label, "missing", "no kernel on the device serves these inputs"))
            continue
        if ref_error is not None:
            outcomes.append(
                CaseOutcome(case.label, "mismatch", f"returned a result; the reference raises {_describe(ref_error)}")
            )
            continue
        tol = _tolerances(spec)
        try:
            if case.inplace is not None:
                assert actual is d_args[case.inplace], "an in-place op must return the tensor it wrote into"
                _compare(d_args[case.inplace], r_args[case.inplace], device, what="written tensor", **tol)
                for i in case.also_written:
                    _compare(d_args[i], r_args[i], device, what=f"argument {i} after the call", **tol)
            else:
                _compare(actual, expected, device, what="result", values=case.values, **tol)
                if spec.view:
                    src = d_args[0]
                    assert actual.untyped_storage() is src.untyped_storage(), (
                        "result is not a view: it does not share its input's storage on the device"
                    )
            for x, t in untouched:  # kernels must not write into their inputs
                fresh = t.build(cpu)[1]
                _compare(x, fresh, x.device, what="input after the call")
        except AssertionError as exc:
            outcomes.append(CaseOutcome(case.label, "mismatch", str(exc)))
            continue
        outcomes.append(CaseOutcome(case.label, "ok"))
    return outcomes


# ---------------------------------------------------------------------------------------- backward


def _grads_for(outs: list, rng: np.random.Generator, device) -> tuple[list, list]:
    diff, grads = [], []
    for o in outs:
        if isinstance(o, kiln.Tensor) and o.requires_grad and o.dtype.is_floating_point:
            diff.append(o)
            g = rng.uniform(-1.0, 1.0, size=tuple(o.shape)).astype(o.dtype.numpy)
            grads.append(kiln.tensor(g, dtype=o.dtype, device=device))
    return diff, grads


def _reference_backward(fn, case: Case) -> tuple[bool, list]:
    """Forward and backward of a case on the reference: (anything to differentiate?, the leaves)."""
    cpu = kiln.device("cpu")
    args, kwargs, leaves = _build(case, cpu, grad=True)
    with ReferenceMode():
        out = fn(*args, **kwargs)
        diff, grads = _grads_for(_flat(out), np.random.default_rng(7919), cpu)
        if diff:
            kiln.autograd.backward(diff, grads)
    return bool(diff), [leaf for leaf, _ in leaves]


def run_backward(opdef, spec: OpSpec, dtype, device, device_dtypes: tuple) -> list[CaseOutcome]:
    """Forward and backward of every case with floating inputs, on ``device`` and on the reference;
    the gradients of every leaf are compared (and must live on the device)."""
    fn = opdef.public
    outcomes = []
    for case in spec.cases(Ctx(opdef.name, dtype, device_dtypes)):
        if not case.grad or not case.values or case.inplace is not None:
            continue
        why = _undeclared(case, device_dtypes)
        if why:
            outcomes.append(CaseOutcome(case.label, "skipped", why))
            continue
        try:
            differentiable, ref_leaves = _reference_backward(fn, case)
        except Exception:  # noqa: BLE001 - an invalid case (its forward raises): the forward check covers it
            continue
        if not differentiable:
            continue
        args, kwargs, leaves = _build(case, device, grad=True)
        dev_leaves = [leaf for leaf, _ in leaves]
        try:
            out, served = call_on_device(fn, opdef, device.type, args, kwargs)
        except Exception as exc:  # noqa: BLE001 - reported with the case that raised
            outcomes.append(CaseOutcome(case.label, "mismatch", f"forward raised {_describe(exc)}"))
            continue
        if not served:
            outcomes.append(CaseOutcome(case.label, "missing", "no kernel on the device serves these inputs"))
            continue
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", FALLBACK_WARNING, UserWarning)
                diff, grads = _grads_for(_flat(out), np.random.default_rng(7919), device)
                kiln.autograd.backward(diff, grads)
        except Exception as exc:  # noqa: BLE001 - reported with the case that raised
            if needs_missing_kernel(exc, device.type):  # the gradient formula needs a primitive the device lacks
                outcomes.append(CaseOutcome(case.label, "missing", f"the backward needs a kernel: {exc}"))
                continue
            hint = "" if fallback_enabled() or "KILN_CPU_FALLBACK" in str(exc) else " (try KILN_CPU_FALLBACK=1)"
            outcomes.append(CaseOutcome(case.label, "mismatch", f"backward raised {_describe(exc)}{hint}"))
            continue
        try:
            for i, (d_leaf, r_leaf) in enumerate(zip(dev_leaves, ref_leaves)):
                if r_leaf.grad is None:
                    assert d_leaf.grad is None, f"input {i}: has a gradient; the reference gives none"
                    continue
                assert d_leaf.grad is not None, f"input {i}: no gradient; the reference computes one"
                assert d_leaf.grad.device == d_leaf.device, (
                    f"input {i}: gradient on {d_leaf.grad.device}, its input on {d_leaf.device}"
                )
                _compare(d_leaf.grad, r_leaf.grad, d_leaf.device, what=f"grad of input {i}", **_tolerances(spec))
        except AssertionError as exc:
            outcomes.append(CaseOutcome(case.label, "mismatch", str(exc)))
            continue
        outcomes.append(CaseOutcome(case.label, "ok"))
    return outcomes


def op_names() -> list[str]:
    """Every op in the registry, in definition order."""
    _plugins.plugins()  # loads every plugin, so ops they define are registered too
    return list(ops())
