"""The argument-spec table covers the op registry, its cases are valid calls, and the runner's oracle
is the reference backend even when a plugin overrides a CPU kernel."""

from __future__ import annotations

import warnings

import pytest

import kiln
from kiln import _dtype, plugins
from kiln._dispatch import OPS
from kiln_testing._runner import ReferenceMode, _build, call_on_device, cpu_fallback, run_forward
from kiln_testing._specs import SPECS, Ctx, spec_for

ALL_DTYPES = _dtype.ALL_DTYPES  # the core's one list, in promotion order
BINDING_ERRORS = ("required argument", "unexpected keyword", "positional argument", "takes ")


def test_every_op_has_a_spec():
    missing = [name for name, opdef in OPS.items() if spec_for(opdef) is None]
    assert not missing, (
        f"ops without an argument spec: {missing}. Add an entry to SPECS in "
        "packages/kiln-testing/src/kiln_testing/_specs.py, so the conformance suite can call them."
    )
    stale = sorted(set(SPECS) - set(OPS))
    assert not stale, f"SPECS lists ops the core does not define: {stale}"


@pytest.mark.parametrize("op_name", list(OPS))
def test_cases_are_valid_calls(op_name):
    opdef = OPS[op_name]
    spec = spec_for(opdef)
    computed = 0
    problems = []
    for dtype in ALL_DTYPES:
        for case in spec.cases(Ctx(op_name, dtype, ALL_DTYPES)):
            args, kwargs, _ = _build(case, kiln.device("cpu"))
            try:
                with ReferenceMode():
                    opdef.public(*args, **kwargs)
            except TypeError as exc:
                if any(s in str(exc) for s in BINDING_ERRORS):
                    problems.append(f"{dtype} [{case.label}]: {exc}")
            except Exception:  # noqa: BLE001 - the op rejects the case: a legitimate error case
                pass
            else:
                computed += 1
    assert not problems, "cases that do not match the op's signature:\n" + "\n".join(problems)
    assert computed >= len(ALL_DTYPES) // 2, f"only {computed} cases of {op_name} compute a value"


def test_cases_are_deterministic():
    a = SPECS["add"].cases(Ctx("add", kiln.float32, ALL_DTYPES))
    b = SPECS["add"].cases(Ctx("add", kiln.float32, ALL_DTYPES))
    assert [c.label for c in a] == [c.label for c in b]
    assert all((x.base == y.base).all() for ca, cb in zip(a, b) for x, y in zip(ca.tensors(), cb.tensors()))


class WrongNeg:
    """A CPU kernel override that gets neg wrong (as a buggy kiln-cpu might)."""

    @staticmethod
    def kiln_register_kernels(register):
        def neg(spec, input):
            return kiln.full(spec[0], 5.0, dtype=spec[1])

        register("neg", "cpu", neg, dtypes=(kiln.float32,))


def test_oracle_is_the_reference_not_the_cpu_plugin():
    x = kiln.tensor([1.0, -2.0])
    plugins.register_plugin(WrongNeg, name="wrong-neg")
    try:
        assert kiln.neg(x).tolist() == [5.0, 5.0]
        with ReferenceMode():
            assert kiln.neg(x).tolist() == [-1.0, 2.0]
        # so the conformance run against device "cpu" catches the override, and only in float32
        bad = run_forward(OPS["neg"], spec_for(OPS["neg"]), kiln.float32, kiln.device("cpu"), ALL_DTYPES)
        assert [o.kind for o in bad] and all(o.kind == "mismatch" for o in bad if o.label != "empty")
        good = run_forward(OPS["neg"], spec_for(OPS["neg"]), kiln.float64, kiln.device("cpu"), ALL_DTYPES)
        assert {o.kind for o in good} == {"ok"}
    finally:
        plugins.unregister_plugin("wrong-neg")


def test_cpu_fallback_toggle_refills_the_kernel_cache(toydev, monkeypatch):
    monkeypatch.delenv("KILN_CPU_FALLBACK", raising=False)
    x = kiln.ones(3, device=toydev)
    with pytest.raises(NotImplementedError, match="'mul'"):
        x * 2
    with cpu_fallback(True), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback warns once per op and process
        assert (x * 2).cpu().tolist() == [2.0, 2.0, 2.0]
    with pytest.raises(NotImplementedError, match="'mul'"):  # the cached fallback kernel is gone again
        x * 2


def test_call_on_device_tells_missing_kernels_apart(toydev):
    x = kiln.ones(3, device=toydev)
    out, served = call_on_device(OPS["add"].public, OPS["add"], toydev, (x, x), {})
    assert served and out.cpu().tolist() == [2.0, 2.0, 2.0]
    with cpu_fallback(False):
        assert call_on_device(OPS["mul"].public, OPS["mul"], toydev, (x, x), {}) == (None, False)
    with cpu_fallback(True):
        out, served = call_on_device(OPS["mul"].public, OPS["mul"], toydev, (x, x), {})
        assert not served and out.cpu().tolist() == [1.0, 1.0, 1.0]  # the fallback ran it
    with pytest.raises(RuntimeError, match="same device"):  # other errors pass through
        call_on_device(OPS["add"].public, OPS["add"], toydev, (x, kiln.ones(3)), {})


def _fake_op(params: list[tuple], num_outputs: int = 1):
    """An object with what infer_spec reads: a signature (annotations as strings, as the core's) and num_outputs."""
    import inspect
    import types

    P = inspect.Parameter
    signature = inspect.Signature(
        [P(name, kind, default=default, annotation=ann) for name, ann, default, kind in params]
    )
    return types.SimpleNamespace(name="new", signature=signature, num_outputs=num_outputs)


def test_specs_are_inferred_for_familiar_signatures():
    import inspect

    from kiln_testing._specs import infer_spec

    POS, KW, NO = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.empty
    new_unary = [("input", "Tensor", NO, POS), ("option", "int", 0, KW)]
    new_binary = [("input", "Tensor", NO, POS), ("other", "Tensor | Number", NO, POS)]
    new_reduction = [("input", "Tensor", NO, POS), ("dim", "Dims", None, POS), ("keepdim", "bool", False, POS)]
    new_ternary = [("input", "Tensor", NO, POS), ("a", "Tensor", NO, POS), ("b", "Tensor", NO, POS)]
    labels = {
        name: [c.label for c in infer_spec(_fake_op(params)).cases(Ctx(name, kiln.float32, ALL_DTYPES))]
        for name, params in (("unary", new_unary), ("binary", new_binary), ("reduction", new_reduction))
    }
    assert "strided" in labels["unary"] and "specials" in labels["unary"]
    assert "broadcast" in labels["binary"] and "scalar-1.5" in labels["binary"]
    assert "contiguous[dim=1]" in labels["reduction"]
    assert infer_spec(_fake_op(new_ternary)) is None  # needs a hand-written spec
    assert infer_spec(_fake_op(new_unary, num_outputs=2)) is None
