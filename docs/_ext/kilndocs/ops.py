"""Op coverage: op x backend x dtype, probed from the live registry when the docs are built.

Which plugin owns each (op, device type) comes from :func:`kiln.plugins.op_coverage` and
:func:`kiln.plugins.kernel_owner`; which dtypes a device takes from :attr:`kiln.plugins.DeviceType.dtypes`.
Kernels carry no declarative dtype list, so dtype support is *measured*: each public op is called
through the dispatcher (meta function, kernel lookup, kernel) on tiny tensors of each dtype on each
available device. A call that returns is a ✓; one that raises is a ✗, and the page quotes the
message. The table is therefore what a user gets today, with no list to keep in sync by hand.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import warnings

import kiln
import kiln.plugins
from kiln._dispatch import OPS, OpDef

SHORT = {
    "bool": "b",
    "uint8": "u8",
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "float16": "f16",
    "bfloat16": "bf16",
    "float32": "f32",
    "float64": "f64",
}


def dtype_name(d: kiln.dtype) -> str:
    """``kiln.float32`` -> ``"float32"``."""
    return str(d).removeprefix("kiln.")


def public_ops() -> list[OpDef]:
    """Registered ops with a public name (``kiln.<name>``), sorted by name."""
    return [o for name, o in sorted(OPS.items()) if not name.startswith("_")]


def internal_ops() -> list[OpDef]:
    """Registered ops that public functions and autograd formulas call (names starting with ``_``)."""
    return [o for name, o in sorted(OPS.items()) if name.startswith("_")]


def _sample(dtype: kiln.dtype, device: str) -> kiln.Tensor:
    return kiln.tensor([[1, 2], [3, 4]], dtype=dtype, device=device)


def probe_args(opdef: OpDef, dtype: kiln.dtype, device: str) -> tuple | None:
    """Arguments for one call of ``opdef`` on 2x2 inputs of ``dtype`` on ``device``; None if the
    signature asks for something this probe cannot invent."""
    args = []
    ints = iter(range(2))
    for p in opdef.signature.parameters.values():
        ann = p.annotation if isinstance(p.annotation, str) else ""
        if p.name == "condition":  # where(condition, input, other): the condition is always bool
            args.append(_sample(kiln.bool, device))
        elif "Sequence[Tensor]" in ann:
            args.append([_sample(dtype, device), _sample(dtype, device)])
        elif "Tensor" in ann:
            args.append(_sample(dtype, device))
        elif p.default is not inspect.Parameter.empty:
            break  # the rest keep their defaults
        elif p.name in ("dims",):
            args.append((1, 0))
        elif p.name in ("size", "shape"):
            args.append((2, 2))
        elif p.name == "stride":
            args.append((2, 1))
        elif ann == "int" or p.name.startswith("dim"):
            args.append(next(ints, 0))
        else:
            return None
    return tuple(args)


# The dispatcher's words for "this device has no kernel for this op (or this dtype)" (kiln._plugins).
_NO_KERNEL = re.compile(r"is not currently implemented for (the|dtype)|has no kernel for dtype")


@dataclasses.dataclass
class Cell:
    """One (op, device, dtype) result."""

    status: str  # "ok", "error", "missing" (no kernel), "not probed", "n/a" (the device does not take this dtype)
    owner: str | None = None  # plugin whose kernel ran, when narrowed by dtype
    message: str = ""


def probe(opdef: OpDef, device: str, dtype: kiln.dtype) -> Cell:
    """Call ``opdef`` once on ``device`` with ``dtype`` inputs and report what happened."""
    args = probe_args(opdef, dtype, device)
    if args is None:
        return Cell("not probed")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            opdef.public(*args)
        except (RuntimeError, TypeError, ValueError, NotImplementedError, IndexError) as exc:
            message = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
            if isinstance(exc, NotImplementedError) and _NO_KERNEL.search(str(exc)):
                return Cell("missing", message=message)
            return Cell("error", message=message)
    return Cell("ok", owner=kiln.plugins.kernel_owner(opdef.name, device, dtype))


@dataclasses.dataclass
class DeviceCoverage:
    """The coverage table of one device type."""

    device: str
    plugin: str
    available: bool
    dtypes: list[kiln.dtype]
    owners: dict[str, str]  # op name -> plugin of its first-registered kernel
    cells: dict[str, dict[str, Cell]]  # op name -> dtype name -> cell


def coverage() -> list[DeviceCoverage]:
    """The coverage of every registered device type, ``cpu`` first."""
    registry = kiln.plugins.op_coverage()
    devices = kiln.plugins.devices()
    out = []
    for name in sorted(devices, key=lambda n: (n != "cpu", n)):
        contract = devices[name]
        available = bool(contract.is_available())
        all_dtypes = [getattr(kiln, n) for n in SHORT]
        cells: dict[str, dict[str, Cell]] = {}
        for opdef in public_ops():
            row = cells[opdef.name] = {}
            for d in all_dtypes:
                if d not in contract.dtypes:
                    row[dtype_name(d)] = Cell("n/a")
                elif not available:
                    row[dtype_name(d)] = Cell("not probed")
                else:
                    row[dtype_name(d)] = probe(opdef, name, d)
        out.append(DeviceCoverage(name, contract.plugin, available, all_dtypes, dict(registry.get(name, {})), cells))
    return out


# ------------------------------------------------------------------------------------------ rendering

_MARK = {"ok": "✓", "error": "✗", "missing": "○", "not probed": "?", "n/a": "—"}


def _cell_text(cell: Cell, row_owner: str | None) -> str:
    mark = _MARK[cell.status]
    if cell.status == "ok" and cell.owner and cell.owner != row_owner:
        mark += f" ({cell.owner})"
    return mark


def _device_table(cov: DeviceCoverage) -> str:
    head = ["op", "grad", "autocast", "kernel from"] + [SHORT[dtype_name(d)] for d in cov.dtypes]
    lines = [
        ".. list-table::",
        "   :header-rows: 1",
        "   :class: kiln-op-coverage",
        "",
        "   * - " + "\n     - ".join(head),
    ]
    for opdef in public_ops():
        owner = cov.owners.get(opdef.name)
        generic = opdef.device_generic
        source = f"``{owner}``" if owner else ("any device (generic)" if generic else "none")
        row = [
            f":func:`~kiln.{opdef.name}`" if hasattr(kiln, opdef.name) else f"``{opdef.name}``",
            "✓" if opdef.backward is not None else "—",
            f"``{opdef.autocast}``" if opdef.autocast else "—",
            source,
        ]
        row += [_cell_text(cov.cells[opdef.name][dtype_name(d)], owner) for d in cov.dtypes]
        lines.append("   * - " + "\n     - ".join(row))
    return "\n".join(lines) + "\n"


# PyTorch's scalar type names, as error messages quote them ("not implemented for 'Float'")
_SCALAR_NAME = re.compile(r"\b(Bool|Byte|Char|Short|Int|Long|Half|BFloat16|Float|Double)\b")


def _errors(cov: DeviceCoverage) -> str:
    """What the ✗ cells raise: one line per op and kind of message, with the dtypes that raise it."""
    items = []
    for opdef in public_ops():
        by_kind: dict[str, tuple[str, list[str]]] = {}
        for dname, cell in cov.cells[opdef.name].items():
            if cell.status == "error":
                kind = _SCALAR_NAME.sub("<dtype>", cell.message)
                by_kind.setdefault(kind, (cell.message, []))[1].append(SHORT[dname])
        for message, dts in by_kind.values():
            more = " (and likewise for the others)" if len(dts) > 1 else ""
            items.append(f"* ``{opdef.name}`` ({', '.join(dts)}): ``{message}``{more}")
    if not items:
        return ""
    return "What the ✗ cells raise (the op's own error, as a user sees it):\n\n" + "\n".join(items) + "\n"


def render() -> str:
    """The reStructuredText of the coverage tables (one section per device type)."""
    ops = public_ops()
    out = [
        f"{len(ops)} public ops and {len(internal_ops())} internal ones are registered; "
        f"{len(kiln.plugins.devices())} device type(s): "
        + ", ".join(f"``{d}``" for d in sorted(kiln.plugins.devices()))
        + ".\n",
        "Columns: **grad** — the op has an autograd formula; **autocast** — its mixed-precision policy "
        "(read by kiln-amp); **kernel from** — the plugin whose kernel runs it (*generic*: the op needs only "
        "the device's storage contract, so every device has it); then one column per dtype "
        "(" + ", ".join(f"{v} = ``{k}``" for k, v in SHORT.items()) + "). "
        "✓ the call ran; ✗ the op rejects that dtype (the error is quoted below the table); ○ the device "
        "has no kernel for it; — the device does not take that dtype; ? not probed. A plugin name in a cell "
        "marks a dtype-narrowed kernel from another plugin.\n",
    ]
    for cov in coverage():
        title = f"Device ``{cov.device}`` (plugin ``{cov.plugin}``)"
        out.append(f"{title}\n{'-' * len(title)}\n")
        if not cov.available:
            out.append(
                "This device type is registered but was not available on the machine that built these docs, "
                "so its dtype columns were not probed.\n"
            )
        out.append(_device_table(cov))
        errors = _errors(cov)
        if errors:
            out.append(errors)
    composite = composite_functions()
    if composite:
        out.append(
            "These public functions are not registry ops: they compute metadata only, or are built from the "
            "ops above and the internal ones below, so they need no kernels of their own: "
            + ", ".join(f":func:`~kiln.{n}`" for n in composite)
            + ".\n"
        )
    internal = internal_ops()
    if internal:
        title = "Internal ops"
        out.append(f"{title}\n{'-' * len(title)}\n")
        out.append(
            "Ops that public functions and autograd formulas call (copies, fills, indexing, backward helpers). "
            "Users never call them, but a backend that registers them speeds up the public ops built on them. "
            "Kernel owner per device type:\n"
        )
        registry = kiln.plugins.op_coverage()
        devices = sorted(kiln.plugins.devices(), key=lambda n: (n != "cpu", n))
        lines = [
            ".. list-table::",
            "   :header-rows: 1",
            "",
            "   * - op\n     - grad\n     - " + "\n     - ".join(devices),
        ]
        for opdef in internal:
            cells = []
            for d in devices:
                owner = registry.get(d, {}).get(opdef.name)
                generic = opdef.device_generic
                cells.append(f"``{owner}``" if owner else ("generic" if generic else "—"))
            grad = "✓" if opdef.backward is not None else "—"
            lines.append(f"   * - ``{opdef.name}``\n     - {grad}\n     - " + "\n     - ".join(cells))
        out.append("\n".join(lines) + "\n")
    return "\n".join(out)


def composite_functions() -> list[str]:
    """Public ``kiln`` functions that are not ops themselves but compose ops (``max``, ``reshape``, ...)."""
    op_publics = {id(o.public) for o in OPS.values()}
    out = []
    for name in sorted(getattr(kiln, "__all__", ())):
        obj = getattr(kiln, name)
        if inspect.isfunction(obj) and id(obj) not in op_publics and obj.__module__.startswith("kiln._ops"):
            out.append(name)
    return out


def op_list() -> str:
    """The public ops as one paragraph of links (for the PyTorch users' page)."""
    return ", ".join(f":func:`~kiln.{o.name}`" for o in public_ops() if hasattr(kiln, o.name)) + ".\n"
