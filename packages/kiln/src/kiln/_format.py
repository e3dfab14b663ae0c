"""``repr(tensor)`` in PyTorch's style: ``tensor([1., 2.], requires_grad=True)``.

The rules are PyTorch's printing rules with its default print options:

* one width per tensor; for floats it is measured over the nonzero finite values only, so ``-0.``,
  ``nan`` and ``inf`` may stick out (``tensor([-0., 1.])``);
* floats use 4 decimals, or scientific notation when the nonzero magnitudes span more than 1000x
  or leave ``[1e-4, 1e8]``; all-integral floats print as ``1.``;
* beyond 1000 elements only the first and last 3 entries of each dimension are shown, the gap
  written as ``...`` (inside a row the gap is one more element, `` ...``, so it reads ``2,  ...,``);
* rows wrap at 80 columns, and so do the ``dtype=``/``grad_fn=`` suffixes.

:func:`set_printoptions` changes these numbers (``torch.set_printoptions``), for every thread.
"""

from __future__ import annotations

import math

import numpy as np

from kiln import _dtype as dt

__all__ = ["set_printoptions"]


class _PrintOptions:
    """The options :func:`set_printoptions` sets: PyTorch's, with its defaults."""

    def __init__(self) -> None:
        self.precision = 4
        self.threshold: float = 1000
        self.edgeitems = 3
        self.linewidth = 80
        self.sci_mode: bool | None = None


OPTIONS = _PrintOptions()

_PROFILES = {  # precision, threshold, edgeitems, linewidth
    "default": (4, 1000, 3, 80),
    "short": (2, 1000, 2, 80),
    "full": (4, math.inf, 3, 80),
}


def set_printoptions(
    precision: int | None = None,
    threshold: float | None = None,
    edgeitems: int | None = None,
    linewidth: int | None = None,
    profile: str | None = None,
    sci_mode: bool | None = None,
) -> None:
    """Set how tensors print: ``precision`` (digits after the point, default 4), ``threshold`` (elements
    beyond which a tensor is summarised, 1000), ``edgeitems`` (entries shown at each end of a summarised dim,
    3), ``linewidth`` (columns per line, 80); ``profile`` sets all four at once (``"default"``, ``"short"``:
    precision 2 and 2 edge items, ``"full"``: never summarise) before the others apply; ``sci_mode`` forces
    scientific notation on (True) or off (False), or leaves it to the values (None)."""
    if profile in _PROFILES:
        OPTIONS.precision, OPTIONS.threshold, OPTIONS.edgeitems, OPTIONS.linewidth = _PROFILES[profile]
    if precision is not None:
        OPTIONS.precision = precision
    if threshold is not None:
        OPTIONS.threshold = threshold
    if edgeitems is not None:
        OPTIONS.edgeitems = edgeitems
    if linewidth is not None:
        OPTIONS.linewidth = linewidth
    OPTIONS.sci_mode = sci_mode


class _Formatter:
    """Formats single values of one tensor to a common width."""

    def __init__(self, values: np.ndarray, kind: str):
        # kind: "float", "int" or "bool"; values: the (summarised) elements, flattened
        self.floating = kind == "float"
        self.int_mode = True
        self.sci_mode = False
        self.precision = OPTIONS.precision
        self.width = 1
        if not self.floating:
            self.width = max([1] + [len(self._plain(v)) for v in values.tolist()])
            return
        self.precision = OPTIONS.precision
        vals = values[np.isfinite(values) & (values != 0)].astype(np.float64)
        if vals.size == 0:
            if OPTIONS.sci_mode is not None:
                self.sci_mode = OPTIONS.sci_mode
            return
        mag = np.abs(vals)
        lo, hi = mag.min(), mag.max()
        self.int_mode = bool(np.all(vals == np.ceil(vals)))
        self.sci_mode = bool(hi / lo > 1000.0 or hi > 1.0e8 or lo < 1.0e-4)
        if OPTIONS.sci_mode is not None:
            self.sci_mode = OPTIONS.sci_mode
        p = self.precision
        if self.sci_mode:
            widths = [len(f"{v:.{p}e}") for v in vals.tolist()]
        elif self.int_mode:
            widths = [len(f"{v:.0f}") + 1 for v in vals.tolist()]
        else:
            widths = [len(f"{v:.{p}f}") for v in vals.tolist()]
        self.width = max(widths)

    @staticmethod
    def _plain(v) -> str:
        return str(bool(v)) if isinstance(v, (bool, np.bool_)) else str(v)

    def format(self, v) -> str:
        """``v`` as text, right-aligned to the common width (never cut)."""
        if not self.floating:
            s = self._plain(v)
        elif self.sci_mode:
            s = f"{v:.{self.precision}e}"
        elif self.int_mode:
            s = f"{v:.0f}" + ("." if np.isfinite(v) else "")
        else:
            s = f"{v:.{self.precision}f}"
        return s.rjust(self.width)


def _summarized(a: np.ndarray) -> np.ndarray:
    """The elements that a summarised print shows: the edge entries of every dimension."""
    if a.ndim == 0:
        return a.reshape(-1)
    edge = OPTIONS.edgeitems
    rows = range(a.shape[0])
    if a.shape[0] > 2 * edge:
        rows = [*range(edge), *range(a.shape[0] - edge, a.shape[0])]
    if a.ndim == 1:
        return a[list(rows)]
    return np.concatenate([_summarized(a[i]) for i in rows])


def _fmt(a: np.ndarray, f: _Formatter, indent: int, summarize: bool) -> str:
    """The bracketed text of ``a``, whose first bracket sits at column ``indent``."""
    if a.ndim == 0:
        return f.format(a.item())
    edge = OPTIONS.edgeitems
    cut = summarize and a.shape[0] > 2 * edge
    if a.ndim == 1:
        if cut:
            items = [f.format(v) for v in a[:edge].tolist()] + [" ..."]
            items += [f.format(v) for v in a[a.shape[0] - edge :].tolist()]
        else:
            items = [f.format(v) for v in a.tolist()]
        per_line = max(1, (OPTIONS.linewidth - indent) // (f.width + 2))
        lines = [", ".join(items[i : i + per_line]) for i in range(0, len(items), per_line)]
        return "[" + (",\n" + " " * (indent + 1)).join(lines) + "]"
    if cut:
        body = [_fmt(a[i], f, indent + 1, summarize) for i in range(edge)] + ["..."]
        body += [_fmt(a[i], f, indent + 1, summarize) for i in range(a.shape[0] - edge, a.shape[0])]
    else:
        body = [_fmt(a[i], f, indent + 1, summarize) for i in range(a.shape[0])]
    return "[" + ("," + "\n" * (a.ndim - 1) + " " * (indent + 1)).join(body) + "]"


def _add_suffixes(text: str, suffixes: list[str], indent: int) -> str:
    """Append ``, suffix`` items, moving one to a new line when it would pass the line width.

    Lengths are measured as PyTorch measures them (a line counts one more than it shows, and a
    ``dtype=kiln.x`` suffix counts as PyTorch's ``dtype=torch.x``), so the breaks fall where its do.
    """
    out = [text]
    line_len = len(text) - text.rfind("\n") + 1
    for s in suffixes:
        n = len(s.replace("=kiln.", "=torch."))
        if line_len + n + 2 > OPTIONS.linewidth:
            out.append(",\n" + " " * indent + s)
            line_len = indent + n
        else:
            out.append(", " + s)
            line_len += n + 2
    return "".join(out) + ")"


def format_tensor(t) -> str:
    """The PyTorch-style repr of a tensor."""
    from kiln._ops.copy import host_array

    a = host_array(t.detach())
    if t._dtype in (dt.float16, dt.bfloat16):
        a = a.astype(np.float32)
    kind = "bool" if t._dtype is dt.bool else "float" if t._dtype.is_floating_point else "int"
    prefix = "tensor("
    suffixes = []
    if t._device.type != "cpu":
        suffixes.append(f"device='{t._device}'")
    default = dt.get_default_dtype()
    if a.size == 0:
        body = "[]"
        if a.ndim != 1:
            suffixes.append(f"size={tuple(a.shape)}")
        # an empty tensor has no values to infer a dtype from, so any non-default one is shown
        if t._dtype is not default:
            suffixes.append(f"dtype={t._dtype!r}")
    else:
        summarize = a.size > OPTIONS.threshold
        f = _Formatter(_summarized(a) if summarize else a.reshape(-1), kind)
        body = _fmt(a, f, len(prefix), summarize)
        # PyTorch hides the dtypes it infers from data
        if t._dtype not in (default, dt.int64, dt.bool):
            suffixes.append(f"dtype={t._dtype!r}")
    try:
        fn = t.grad_fn
    except RuntimeError:  # a view whose base was written since, which may not take its base's history
        suffixes.append("grad_fn=<Invalid>")  # (PyTorch's repr of it)
    else:
        if fn is not None:
            suffixes.append(f"grad_fn=<{fn.name()}>")
        elif t.requires_grad:
            suffixes.append("requires_grad=True")
    return _add_suffixes(prefix + body, suffixes, len(prefix))
