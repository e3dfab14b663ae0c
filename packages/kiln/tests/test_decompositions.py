"""Every op's decomposition computes what the op computes.

For each op with a decomposition (``kiln.backend.decompositions()``), the conformance kit's sample cases
(kiln-testing's spec table) run through the op itself and through its decomposition on the reference
backend; the results must have the same dtype and shape, and values within the kit's tolerances. A
device that implements only the primitive set (``kiln.backend.primitives()``) runs these
decompositions, so this is what makes such a device right.
"""

from __future__ import annotations

import pytest

import kiln
import kiln.backend as kb

kiln_testing = pytest.importorskip("kiln_testing")

from kiln._plugins import decomposed_kernel  # noqa: E402
from kiln_testing._runner import ReferenceMode, _build, _compare, _tolerances  # noqa: E402
from kiln_testing._specs import Ctx, spec_for  # noqa: E402

CPU = kiln.device("cpu")
DECOMPOSED = sorted(kb.decompositions())


def test_there_are_decompositions_and_a_primitive_set():
    prims = set(kb.primitives())
    assert DECOMPOSED and prims
    assert not prims & set(DECOMPOSED)
    assert not any(kb.op(n).device_generic for n in prims)
    # every op is a primitive, device-generic, or has a decomposition
    for name, o in kb.ops().items():
        assert (name in prims) != (o.device_generic or o.decompose is not None), name


def test_fused_ops_have_decompositions():
    fused = kb.ops("fused")
    assert {"_softmax_backward_data", "_log_softmax_backward_data", "_native_norm_backward"} <= set(fused)
    assert all(o.decompose is not None for o in fused.values())


def check_decomposition(name: str) -> int:
    """Compare op ``name`` with its decomposition over its spec's cases in every dtype; the number of
    cases compared."""
    opdef = kb.op(name)
    spec = spec_for(opdef)
    assert spec is not None, f"op {name!r} has no conformance spec to test its decomposition with"
    compared = 0
    for dtype in kb.ALL_DTYPES:
        for case in spec.cases(Ctx(name, dtype, kb.ALL_DTYPES)):
            args, kwargs, _ = _build(case, CPU)
            try:
                with ReferenceMode():
                    expected = opdef.public(*args, **kwargs)
            except Exception:  # noqa: BLE001 - the meta function rejects the case: no kernel runs
                continue
            if case.inplace is not None:
                continue
            # the decomposition as a device without the op's kernel runs it: the op's arguments bound to its
            # signature, the meta function's spec, then the decomposed kernel (its inner ops on the CPU)
            args, kwargs, _ = _build(case, CPU)
            bound = opdef.signature.bind(*args, **kwargs)
            bound.apply_defaults()
            op_args = tuple(bound.arguments.values())
            actual = decomposed_kernel(opdef)(opdef.meta(*op_args), *op_args)
            _compare(
                actual,
                expected,
                CPU,
                what=f"{name} [{dtype}] {case.label}: decomposition",
                values=case.values,
                **_tolerances(spec),
            )
            compared += 1
    return compared


@pytest.mark.parametrize("name", DECOMPOSED)
def test_decomposition_matches_the_op(name):
    assert check_decomposition(name) > 0, f"no case of {name!r} ran: its decomposition went untested"


def test_a_wrong_decomposition_fails(monkeypatch):
    """The check catches a decomposition that is off (here ``silu`` without its division)."""
    opdef = kb.op("silu")
    monkeypatch.setattr(opdef, "decompose", lambda input: input * 1.0)
    with pytest.raises(AssertionError):
        check_decomposition("silu")
