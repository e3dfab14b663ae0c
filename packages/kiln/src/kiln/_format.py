"""``repr(tensor)`` in PyTorch's style: ``tensor([1., 2.], requires_grad=True)``.

Formatting follows PyTorch's printing rules: 4 significant decimals, scientific notation when the
magnitudes span more than 1000x or leave [1e-4, 1e8), integral floats printed as ``1.``, a common
width per tensor, and summarisation with ``...`` beyond 1000 elements.
"""

from __future__ import annotations

import numpy as np

from kiln import _dtype as dt

PRECISION = 4
THRESHOLD = 1000
EDGEITEMS = 3
LINEWIDTH = 80


class _Formatter:
    def __init__(self, values: np.ndarray, floating: bool):
        self.floating = floating
        self.int_mode = True
        self.sci_mode = False
        self.width = 1
        if values.size == 0:
            return
        if not floating:
            self.width = max(len(str(v)) for v in values.tolist())
            return
        finite = values[np.isfinite(values)]
        if finite.size == 0:
            self.width = max(len(_special(v)) for v in values.tolist())
            return
        nonzero = np.abs(finite[finite != 0])
        self.int_mode = bool(np.all(finite == np.ceil(finite)))
        if self.int_mode:
            if nonzero.size and (nonzero.max() / nonzero.min() > 1000.0 or nonzero.max() > 1e8):
                self.sci_mode = True
                self.width = max(len(f"{v:.{PRECISION}e}") for v in finite.tolist())
            else:
                self.width = max(len(f"{v:.0f}.") for v in finite.tolist())
        else:
            if nonzero.size and (nonzero.max() / nonzero.min() > 1000.0 or nonzero.max() > 1e8 or nonzero.min() < 1e-4):
                self.sci_mode = True
                self.width = max(len(f"{v:.{PRECISION}e}") for v in finite.tolist())
            else:
                self.width = max(len(f"{v:.{PRECISION}f}") for v in finite.tolist())
        if finite.size != values.size:
            self.width = max(self.width, 3 + int(bool((values == -np.inf).any())))

    def format(self, v) -> str:
        if not self.floating:
            return str(v).rjust(self.width)
        if not np.isfinite(v):
            return _special(v).rjust(self.width)
        if self.sci_mode:
            s = f"{v:.{PRECISION}e}"
        elif self.int_mode:
            s = f"{v:.0f}."
        else:
            s = f"{v:.{PRECISION}f}"
        return s.rjust(self.width)


def _special(v) -> str:
    if np.isnan(v):
        return "nan"
    return "inf" if v > 0 else "-inf"


def _summarize(a: np.ndarray) -> np.ndarray:
    if a.ndim == 0:
        return a.reshape(-1)
    if a.shape[0] > 2 * EDGEITEMS:
        parts = [a[:EDGEITEMS], a[-EDGEITEMS:]]
    else:
        parts = [a]
    return (
        np.concatenate([_summarize(p[i]) for p in parts for i in range(p.shape[0])])
        if a.ndim > 1
        else np.concatenate(parts)
    )


def _fmt(a: np.ndarray, f: _Formatter, indent: int, summarize: bool) -> str:
    if a.ndim == 0:
        return f.format(a.item())
    if a.ndim == 1:
        items = [f.format(v) for v in a.tolist()]
        if summarize and a.shape[0] > 2 * EDGEITEMS:
            items = items[:EDGEITEMS] + ["..."] + items[-EDGEITEMS:]
        per_line = max(1, (LINEWIDTH - indent) // (f.width + 2))
        lines = [", ".join(items[i : i + per_line]) for i in range(0, len(items), per_line)]
        return "[" + (",\n" + " " * (indent + 1)).join(lines) + "]"
    rows = [a[i] for i in range(a.shape[0])]
    if summarize and a.shape[0] > 2 * EDGEITEMS:
        body = [_fmt(r, f, indent + 1, summarize) for r in rows[:EDGEITEMS]] + ["..."]
        body += [_fmt(r, f, indent + 1, summarize) for r in rows[-EDGEITEMS:]]
    else:
        body = [_fmt(r, f, indent + 1, summarize) for r in rows]
    sep = "," + "\n" * (a.ndim - 1) + " " * (indent + 1)
    return "[" + sep.join(body) + "]"


def format_tensor(t) -> str:
    """The PyTorch-style repr of a tensor."""
    from kiln._ops.copy import host_array

    a = host_array(t.detach())
    if t._dtype in (dt.float16, dt.bfloat16):
        a = a.astype(np.float32)
    floating = t._dtype.is_floating_point
    summarize = a.size > THRESHOLD
    values = _summarize(a) if summarize else a.reshape(-1)
    if t._dtype is dt.bool:
        f = _Formatter(np.array([]), False)
        f.width = max((len(str(bool(v))) for v in values.tolist()), default=1)
        f.format = lambda v: str(bool(v)).rjust(f.width)
    else:
        f = _Formatter(values, floating)
    prefix = "tensor("
    suffixes = []
    if t._device.type != "cpu":
        suffixes.append(f"device='{t._device}'")
    if a.size == 0 and a.ndim != 1:
        body = "[]"
        suffixes.insert(0, f"size={tuple(a.shape)}")
    else:
        body = _fmt(a, f, len(prefix), summarize)
    default = dt.get_default_dtype()
    # PyTorch hides the dtypes it infers from data, except that an empty tensor shows any non-default one
    if t._dtype not in (default, dt.int64, dt.bool) or (a.size == 0 and t._dtype is not default):
        suffixes.append(f"dtype={t._dtype!r}")
    if t.grad_fn is not None:
        suffixes.append(f"grad_fn=<{t.grad_fn.name()}>")
    elif t._requires_grad:
        suffixes.append("requires_grad=True")
    return prefix + body + "".join(", " + s for s in suffixes) + ")"
