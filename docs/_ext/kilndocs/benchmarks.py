"""The benchmarks page, from the JSON records the benchmark scripts write to ``benchmarks/results/``.

Each ``benchmarks/bench_*.py`` writes one record (``{"benchmark", "machine", "settings", "results"}``,
see ``benchmarks/README.md``). For each benchmark the latest record (by ``machine.date``) becomes a
section: the machine it was measured on and a table of times and ratios. With no record the page says
so; an unreadable record is named on the page. Neither is a build warning: results are optional.
"""

from __future__ import annotations

import json
from pathlib import Path

from kilndocs import ROOT

RESULTS = ROOT / "benchmarks" / "results"

UNITS = {"us": "µs per call", "ms": "ms", "s": "s", "instructions": "instructions per call"}
LIB_TITLES = {"kiln": "kiln", "torch": "PyTorch", "numpy": "NumPy"}
MACHINE_FIELDS = [
    ("date", "measured (UTC)"),
    ("platform", "platform"),
    ("machine", "architecture"),
    ("processor", "processor"),
    ("cpu_model", "CPU"),
    ("cpu_count", "CPU cores"),
    ("python", "Python"),
    ("kiln", "kiln"),
    ("torch", "PyTorch"),
    ("numpy", "NumPy"),
    ("torch_threads", "PyTorch threads"),
    ("kiln_blas", "kiln's BLAS"),
]


def load_records(results: Path = RESULTS) -> tuple[dict[str, tuple[Path, dict]], list[str]]:
    """benchmark name -> (file, latest record); and a note per file that could not be read."""
    latest: dict[str, tuple[Path, dict]] = {}
    problems = []
    for path in sorted(results.glob("*.json")) if results.is_dir() else []:
        try:
            record = json.loads(path.read_text())
            name = str(record["benchmark"])
            rows = record["results"]
            if not isinstance(rows, list):
                raise TypeError("'results' is not a list")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            problems.append(f"``{path.relative_to(ROOT)}`` could not be read: {type(exc).__name__}: {escape(exc)}")
            continue
        date = str(record.get("machine", {}).get("date", ""))
        if name not in latest or date > str(latest[name][1].get("machine", {}).get("date", "")):
            latest[name] = (path, record)
    return latest, problems


def escape(text: object) -> str:
    """``text`` as literal reStructuredText: markup characters backslash-escaped."""
    out = str(text).replace("\\", "\\\\")
    for ch in "*`|_[]<>:":
        out = out.replace(ch, "\\" + ch)
    return out.replace("\n", " ")


def _fmt(value: object, digits: int = 2) -> str:
    if isinstance(value, bool) or value is None:
        return "—" if value is None else str(value)
    if isinstance(value, int):  # counts (instructions per call)
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return escape(value)


def _section(name: str, path: Path, record: dict) -> str:
    title = f"``{name}``"
    out = [f"{title}\n{'-' * len(title)}\n"]
    out.append(f"From ``{path.relative_to(ROOT)}``.\n")
    machine = record.get("machine") or {}
    fields = [(label, machine[key]) for key, label in MACHINE_FIELDS if machine.get(key) not in (None, "")]
    threads = machine.get("thread_env")
    if isinstance(threads, dict) and threads:
        fields.append(("thread variables", ", ".join(f"{k}={v}" for k, v in sorted(threads.items()))))
    settings = record.get("settings")
    if isinstance(settings, dict) and settings:
        fields.append(("settings", ", ".join(f"{k}={v}" for k, v in sorted(settings.items()))))
    if fields:
        out.append("\n".join(f":{label}: {escape(value)}" for label, value in fields) + "\n")
    rows = [r for r in record["results"] if isinstance(r, dict)]
    order = list(LIB_TITLES)
    rank = lambda lib: (order.index(lib) if lib in order else len(order), lib)
    libs = sorted(dict.fromkeys(lib for r in rows for lib in (r.get("times") or {})), key=rank)
    ratios = sorted(
        dict.fromkeys(k for r in rows for k in r if "/" in k), key=lambda k: [rank(p) for p in k.split("/")]
    )
    head = ["case", "unit"] + [LIB_TITLES.get(lib, lib) for lib in libs]
    head += ["/".join(LIB_TITLES.get(p, p) for p in k.split("/")) for k in ratios]
    lines = [".. list-table::", "   :header-rows: 1", "", "   * - " + "\n     - ".join(head)]
    for r in rows:
        times = r.get("times") or {}
        cells = [f"``{r.get('name', '?')}``", UNITS.get(r.get("unit"), escape(r.get("unit", "")))]
        cells += [_fmt(times.get(lib)) for lib in libs]
        cells += [f"**{r[k]:.2f}x**" if isinstance(r.get(k), (int, float)) else "—" for k in ratios]
        lines.append("   * - " + "\n     - ".join(cells))
    out.append("\n".join(lines) + "\n")
    whats = [(r.get("name"), r.get("what")) for r in rows if r.get("what")]
    if whats:
        out.append("\n".join(f"* ``{n}``: {escape(w)}" for n, w in whats) + "\n")
    return "\n".join(out)


def render(results: Path = RESULTS) -> str:
    """The reStructuredText of every benchmark's latest record (or the note that there is none)."""
    latest, problems = load_records(results)
    out = []
    if not latest:
        out.append(
            "No benchmark record was found in ``benchmarks/results/`` when these docs were built. Run "
            "``python3 -m nox -s bench`` and build the docs again to see the tables here.\n"
        )
    for name in sorted(latest):
        path, record = latest[name]
        out.append(_section(name, path, record))
    if problems:
        out.append("Records that could not be read:\n\n" + "\n".join(f"* {p}" for p in problems) + "\n")
    return "\n".join(out)
