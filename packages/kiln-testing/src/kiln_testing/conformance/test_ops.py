"""Every op the device serves, in every dtype it declares, against the reference backend.

One test per (op, dtype) cell runs all of the op's cases (random, strided, broadcast, 0-d, empty,
scalar operands, mixed dtypes, IEEE specials — see :mod:`kiln_testing._specs`) on the device and on
the reference, and reports every disagreement at once. Where the reference rejects a case (a dtype
the op does not support, shapes that do not match), the device must raise the same exception type.
Backward cells do the same for gradients, with the leaves created on the device.
"""

from __future__ import annotations

import pytest

import kiln_testing
from kiln.backend import op as op_record
from kiln_testing._runner import run_backward, run_forward

pytestmark = pytest.mark.kiln_conformance


def _id(cell) -> str:
    op, dtype = cell
    return f"{op}-{str(dtype).removeprefix('kiln.')}"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    plan = kiln_testing.plan(metafunc.config)
    if "forward_cell" in metafunc.fixturenames:
        cells = plan.forward_cells()
        metafunc.parametrize("forward_cell", cells, ids=[_id(c) for c in cells])
    if "backward_cell" in metafunc.fixturenames:
        cells = plan.backward_cells()
        metafunc.parametrize("backward_cell", cells, ids=[_id(c) for c in cells])


def _report(op: str, dtype, outcomes, what: str, record) -> str:
    """The cell's status; fails listing every mismatching case."""
    bad = [o for o in outcomes if o.kind == "mismatch"]
    if bad:
        by_detail: dict[str, list[str]] = {}
        for o in bad:
            by_detail.setdefault(o.detail, []).append(o.label)
        lines = [f"{op} ({what}, {dtype}): {len(bad)} of {len(outcomes)} cases disagree with the reference:"]
        lines += [f"  [{', '.join(labels)}] {detail}" for detail, labels in by_detail.items()]
        pytest.fail("\n".join(lines), pytrace=False)
    kinds = {o.kind for o in outcomes}
    if "ok" in kinds:
        return "pass"
    reasons = sorted({o.detail for o in outcomes}) or ["no case of this op is differentiable in this dtype"]
    if "missing" in kinds:  # the op computes these inputs on the reference, but no device kernel serves them
        record("missing")
        pytest.skip(f"{op} ({what}, {dtype}): no kernel on the device serves these inputs (missing)")
    if "error-agrees" in kinds:
        return "n/a"
    pytest.skip(f"{op} ({what}, {dtype}): no case ran: {'; '.join(reasons)}")


def test_forward(forward_cell, kiln_conformance_plan, kiln_cell):
    op, dtype = forward_cell
    record = kiln_cell("forward", op, dtype)
    info = kiln_conformance_plan.ops[op]
    if info.spec is None:
        record("no spec")
        pytest.skip(f"kiln-testing has no argument spec for op '{op}' (add one to kiln_testing/_specs.py)")
    plan = kiln_conformance_plan
    outcomes = run_forward(op_record(op), info.spec, dtype, plan.device, plan.dtypes)
    record(_report(op, dtype, outcomes, "forward", record))


def test_backward(backward_cell, kiln_conformance_plan, kiln_cell):
    op, dtype = backward_cell
    record = kiln_cell("backward", op, dtype)
    info = kiln_conformance_plan.ops[op]
    if info.spec is None:
        record("no spec")
        pytest.skip(f"kiln-testing has no argument spec for op '{op}' (add one to kiln_testing/_specs.py)")
    plan = kiln_conformance_plan
    outcomes = run_backward(op_record(op), info.spec, dtype, plan.device, plan.dtypes)
    record(_report(op, dtype, outcomes, "backward", record))
