"""kiln's conformance kit as a pytest plugin: ``pytest --kiln-device=NAME``.

pytest loads this module through the ``pytest11`` entry point of the kiln-testing distribution (or
with ``-p kiln_testing``). It stays idle unless ``--kiln-device`` is given; then it adds the
conformance suite (:mod:`kiln_testing.conformance`) to the run — alone when no test paths are given,
beside them otherwise — checks it against the named device, and prints the coverage tables
(op x dtype: pass / FAIL / missing / n/a) at the end.

Plugin authors' own tests can use the ``kiln_device`` fixture (the device under test, ``cpu`` without
the option) and the helpers of :mod:`kiln.testing`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

__all__ = ["Plan", "plan", "CONFORMANCE_DIR"]

CONFORMANCE_DIR = Path(__file__).resolve().parent / "conformance"

_PLAN = pytest.StashKey["Plan"]()
_CELL = pytest.StashKey[tuple]()
_CELL_PROPERTY = "kiln_conformance_cell"  # the user property a cell's status travels in
_CONFIG: list[pytest.Config] = []  # the session's config, for pytest_runtest_logreport (which has none)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kiln", "kiln conformance suite (kiln-testing)")
    group.addoption(
        "--kiln-device",
        metavar="NAME",
        default=None,
        help="run kiln's conformance suite against device type NAME (e.g. cpu, cuda, or a plugin's device)",
    )
    group.addoption(
        "--kiln-dtypes",
        metavar="NAMES",
        default=None,
        help="check only these dtypes of the device's (comma-separated, e.g. float32,int64): for slow devices "
        "such as a simulator; the default is every dtype the device declares",
    )
    group.addoption(
        "--kiln-coverage-json",
        metavar="PATH",
        default=None,
        help="also write the conformance coverage tables to PATH as JSON",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kiln_conformance: a test of kiln's device conformance suite")
    _CONFIG.append(config)
    if config.getoption("kiln_device", None):
        # Ops a device lacks may run through the opt-in CPU fallback; its once-per-op warning is not news here.
        config.addinivalue_line(
            "filterwarnings",
            r"ignore:The operator '.*' is not implemented for the .* device; running it on the CPU:UserWarning",
        )
        _check_every_kernel_call(config)


_SAVED_CHECKS = pytest.StashKey[tuple]()


def _check_every_kernel_call(config: pytest.Config) -> None:
    """Have the dispatcher check every kernel call's output against its op's spec, not just the first
    per (op, device type, dtype): a kernel right on its first case and wrong on a later one (0-d, empty,
    broadcast inputs) then fails with the dispatcher's message naming the kernel's plugin. The variable
    is for subprocesses the tests start; this process may have imported kiln already, so it is also
    switched on directly. :func:`pytest_unconfigure` puts both back."""
    import kiln.backend as kb

    config.stash[_SAVED_CHECKS] = (os.environ.get("KILN_CHECK_KERNELS"), kb.kernel_outputs_checked_always())
    os.environ["KILN_CHECK_KERNELS"] = "1"
    kb.check_kernel_outputs(True)


def pytest_unconfigure(config: pytest.Config) -> None:
    if config in _CONFIG:
        _CONFIG.remove(config)
    saved = config.stash.get(_SAVED_CHECKS, None)
    if saved is None:
        return
    env, always = saved
    if env is None:
        os.environ.pop("KILN_CHECK_KERNELS", None)
    else:
        os.environ["KILN_CHECK_KERNELS"] = env
    import kiln.backend as kb

    kb.check_kernel_outputs(always)


def pytest_sessionstart(session: pytest.Session) -> None:
    config = session.config
    name = config.getoption("kiln_device", None)
    if not name:
        return
    plan(config)  # validates the device (a usage error names what is registered)
    # The folder, not its files: node ids of tests outside the rootdir are relative to the argument that
    # collected them, so a folder gives "test_ops.py::test_forward[add-int32]" where a file would give "".
    suite = str(CONFORMANCE_DIR)
    if config.args_source is pytest.Config.ArgsSource.ARGS:
        config.args = [*config.args, suite]  # the user's tests and the suite
    else:
        config.args = [suite]  # `pytest --kiln-device=NAME` alone: just the suite


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    if not config.getoption("kiln_device", None):
        return None
    p = plan(config)
    dtypes = ", ".join(_short(d) for d in p.dtypes)
    fallback = "on" if _fallback_on() else "off"
    return [f"kiln conformance: {p.describe()}", f"  dtypes: {dtypes}; KILN_CPU_FALLBACK: {fallback}"]


def _fallback_on() -> bool:
    return os.environ.get("KILN_CPU_FALLBACK") == "1"


def _short(dtype) -> str:
    return str(dtype).removeprefix("kiln.")


# ---------------------------------------------------------------------------------------- the plan


@dataclasses.dataclass
class OpInfo:
    """One op as the device serves it: its spec (None: no spec) and who serves it — the plugin that
    registered a kernel (for some dtypes at least), ``"generic"`` (built on the device contract by the
    core), ``"decomposed"`` (its decomposition into other ops, run on the device), or None (no kernel:
    only the CPU fallback can run it)."""

    name: str
    spec: Any
    source: str | None
    differentiable: bool


@dataclasses.dataclass
class Plan:
    """What the suite checks: the device, its contract and plugin, its dtypes and every op's coverage."""

    device: Any  # kiln.device, index 0
    contract: Any  # kiln.plugins.DeviceType
    plugin: Any  # kiln.plugins.PluginInfo or None
    dtypes: tuple
    ops: dict[str, OpInfo]
    results: dict = dataclasses.field(default_factory=dict)  # (table, op, dtype) -> status

    def describe(self) -> str:
        who = "built in"
        if self.plugin is not None:
            dist = (
                f"{self.plugin.distribution} {self.plugin.version}"
                if self.plugin.distribution
                else "registered at run time"
            )
            who = f"plugin '{self.plugin.name}' ({dist})"
        return f"device '{self.device.type}' from {who}, {self.contract.device_count()} device(s)"

    def forward_cells(self) -> list[tuple[str, Any]]:
        """(op, dtype) for every op the device serves (some dtypes may turn out "missing") and declared dtype."""
        return [(op.name, d) for op in self.ops.values() if op.source is not None for d in self.dtypes]

    def backward_cells(self) -> list[tuple[str, Any]]:
        return [
            (op.name, d)
            for op in self.ops.values()
            if op.differentiable and op.source is not None
            for d in self.dtypes
            if d.is_floating_point
        ]

    def missing_ops(self) -> list[str]:
        """Ops without any kernel for the device (only the CPU fallback can run them)."""
        return [op.name for op in self.ops.values() if op.source is None]


def plan(config: pytest.Config) -> Plan:
    """The conformance plan for this run (built once; device ``cpu`` without ``--kiln-device``)."""
    p = config.stash.get(_PLAN, None)
    if p is None:
        p = config.stash[_PLAN] = _make_plan(config.getoption("kiln_device", None) or "cpu", config)
    return p


def _chosen_dtypes(config: pytest.Config, declared: tuple) -> tuple:
    """The declared dtypes, narrowed to ``--kiln-dtypes`` when given (an unknown or undeclared name is a
    usage error, never silently nothing)."""
    raw = config.getoption("kiln_dtypes", None)
    if not raw:
        return declared
    by_name = {_short(d): d for d in declared}
    names = [n.strip() for n in raw.split(",") if n.strip()]
    unknown = [n for n in names if n not in by_name]
    if unknown or not names:
        raise pytest.UsageError(
            f"--kiln-dtypes={raw}: {', '.join(unknown) or 'nothing'} is not among the device's dtypes "
            f"({', '.join(by_name)})"
        )
    return tuple(d for d in declared if _short(d) in names)


def _make_plan(name: str, config: pytest.Config | None = None) -> Plan:
    import kiln
    import kiln.backend as kb
    import kiln.plugins as _plugins
    from kiln_testing._runner import kernel_source
    from kiln_testing._specs import spec_for

    try:
        dev = kiln.device(name)
    except RuntimeError as exc:
        raise pytest.UsageError(f"--kiln-device={name}: {exc}") from None
    devices = _plugins.devices()
    if dev.type not in devices:
        try:
            _plugins.device_type(dev.type)
        except RuntimeError as exc:  # the core's message: which plugin may provide it, which failed to load
            msg = str(exc)
        raise pytest.UsageError(f"--kiln-device={name}: {msg} Registered device types: {', '.join(sorted(devices))}.")
    contract = devices[dev.type]
    if not contract.is_available() or contract.device_count() < 1:
        raise pytest.UsageError(f"--kiln-device={name}: device type '{dev.type}' reports no available device")
    # as the core places tensors: "cpu" has no index, other device types default to index 0
    device = kiln.device("cpu") if dev.type == "cpu" else kiln.device(dev.type, dev.index or 0)
    info = next((p for p in _plugins.plugins() if p.name == contract.plugin), None)
    dtypes = tuple(d for d in _all_dtypes() if d in contract.dtypes)
    if config is not None:
        dtypes = _chosen_dtypes(config, dtypes)
    ops = {}
    for op_name, opdef in kb.ops().items():
        ops[op_name] = OpInfo(
            name=op_name,
            spec=spec_for(opdef),
            source=kernel_source(opdef, dev.type),
            differentiable=opdef.backward is not None,
        )
    return Plan(device=device, contract=contract, plugin=info, dtypes=dtypes, ops=ops)


def _all_dtypes() -> tuple:
    from kiln.backend import ALL_DTYPES

    return ALL_DTYPES


# ---------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def kiln_device(request: pytest.FixtureRequest):
    """The device under test (``--kiln-device``; ``cpu`` without it), as a ``kiln.device`` with index 0."""
    return plan(request.config).device


@pytest.fixture(scope="session")
def kiln_device_dtypes(request: pytest.FixtureRequest) -> tuple:
    """The dtypes the device under test declares."""
    return plan(request.config).dtypes


@pytest.fixture(scope="session")
def kiln_conformance_plan(request: pytest.FixtureRequest) -> Plan:
    """The conformance plan: device, contract, plugin, dtypes and per-op coverage."""
    return plan(request.config)


@pytest.fixture
def kiln_cell(request: pytest.FixtureRequest):
    """``kiln_cell(table, op, dtype)`` ties this test to one cell of a coverage table; returns a
    function that records the cell's status ("pass", "n/a", ...) when the test does not fail."""
    box: dict[str, str] = {}

    def bind(table: str, op: str, dtype) -> Any:
        request.node.stash[_CELL] = (table, op, dtype, box)

        def record(status: str) -> None:
            box["status"] = status

        return record

    return bind


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    cell = item.stash.get(_CELL, None)
    if cell is not None and (report.when == "call" or report.outcome != "passed"):
        table, op, dtype, box = cell
        status = "FAIL" if report.failed else box.get("status") or ("skip" if report.skipped else "pass")
        # on the report, which pytest-xdist carries from a worker to the process that prints the tables
        report.user_properties.append((_CELL_PROPERTY, (table, op, getattr(dtype, "name", dtype), status)))
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Record a cell's status where the tables are printed: in this process, or in pytest-xdist's
    controller for the reports of its workers."""
    if not _CONFIG or not _CONFIG[-1].getoption("kiln_device", None):
        return
    for key, value in report.user_properties:
        if key == _CELL_PROPERTY:
            table, op, dtype, status = value
            p = plan(_CONFIG[-1])
            by_name = {getattr(d, "name", d): d for d in p.dtypes}
            p.results[(table, op, by_name.get(dtype, dtype))] = status


# ---------------------------------------------------------------------------------------- the tables


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    if not config.getoption("kiln_device", None):
        return
    p = plan(config)
    tables = coverage_tables(p)
    tr = terminalreporter
    tr.section(f"kiln conformance coverage: {p.describe()}")
    for title, table in tables.items():
        tr.write_line("")
        tr.write_line(
            f"{title} (op x dtype): pass | FAIL | missing: no kernel on the device | "
            "n/a: the reference rejects it too | skip | no spec | -: not run"
        )
        for line in _render(table, p):
            tr.write_line(line)
    totals = {}
    for table in tables.values():
        for row in table.values():
            for status in row["cells"].values():
                totals[status] = totals.get(status, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(totals.items()))
    tr.write_line("")
    tr.write_line(f"cells: {summary}")
    missing = p.missing_ops()
    if missing:
        tr.write_line(f"ops without a kernel on '{p.device.type}' ({len(missing)}): {', '.join(missing)}")
    import kiln.plugins as _plugins

    used = {op: n for (op, dev), n in _plugins.fallback_counts().items() if dev == p.device.type}
    if used:
        tr.write_line(
            "served by the CPU fallback during the run: " + ", ".join(f"{op} x{n}" for op, n in sorted(used.items()))
        )
    out = config.getoption("kiln_coverage_json", None)
    if out:
        data = {
            "device": p.device.type,
            "plugin": p.plugin.name if p.plugin else None,
            "dtypes": [_short(d) for d in p.dtypes],
            "tables": {
                t: {op: {"source": row["source"], "cells": row["cells"]} for op, row in table.items()}
                for t, table in tables.items()
            },
        }
        Path(out).write_text(json.dumps(data, indent=1) + "\n")
        tr.write_line(f"coverage written to {out}")


def coverage_tables(p: Plan) -> dict[str, dict[str, dict]]:
    """{"forward": {op: {"source": ..., "cells": {dtype: status}}}, "backward": {...}}."""
    tables: dict[str, dict[str, dict]] = {"forward": {}, "backward": {}}
    for op in p.ops.values():
        for table in ("forward", "backward"):
            if table == "backward" and not op.differentiable:
                continue
            cells = {}
            for d in p.dtypes:
                if table == "backward" and not d.is_floating_point:
                    continue
                if op.source is None:
                    status = "missing"
                elif op.spec is None:
                    status = "no spec"
                else:
                    status = p.results.get((table, op.name, d), "-")
                cells[_short(d)] = status
            tables[table][op.name] = {"source": op.source or "-", "cells": cells}
    return tables


def _render(table: dict[str, dict], p: Plan) -> list[str]:
    if not table:
        return []
    columns = list(next(iter(table.values()))["cells"])
    name_w = max(len("op"), *(len(n) for n in table))
    src_w = min(max(len("kernel"), *(len(r["source"]) for r in table.values())), 24)
    width = max(7, *(len(c) for c in columns))
    lines = [(f"{'op':<{name_w}}  {'kernel':<{src_w}}  " + " ".join(f"{c:<{width}}" for c in columns)).rstrip()]
    for op, row in table.items():
        cells = " ".join(f"{row['cells'][c]:<{width}}" for c in columns)
        lines.append(f"{op:<{name_w}}  {row['source'][:src_w]:<{src_w}}  {cells}".rstrip())
    return lines
