"""Instructions per eager op call, counted by Valgrind's callgrind: per-op overhead measured exactly.

Wall-clock benchmarks (``bench_overhead.py``) on a shared machine wander by 5-10% from run to run, more
than a change to the dispatch path moves them. The number of instructions one call executes does not
wander: it is what a change to the hot path should be judged by, with the wall-clock ratios against
PyTorch as the user-facing measure.

For each case of ``bench_overhead.py`` (kiln's side only), two interpreters run under
``valgrind --tool=callgrind``: one builds the case and calls it a few times, the other also calls it
``--calls`` more times; the difference over ``--calls`` is the cost of one call, import and set-up
cancelled out. ``PYTHONHASHSEED`` is fixed so that both runs hash alike.

Compare two trees by running this script once per tree, e.g. with ``PYTHONPATH`` naming the other
checkout's ``packages/kiln/src`` (and ``packages/kiln-cpu/src``): the script measures whichever kiln
its interpreter imports. A run takes a few minutes (callgrind runs Python about 50 times slower).
Needs ``valgrind`` on ``PATH``; writes ``benchmarks/results/instructions.json`` atomically.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_overhead import machine_info, make_cases, write_json_atomically  # noqa: E402

DEFAULT_OUTPUT = HERE / "results" / "instructions.json"
WARMUP = 3  # calls before counting starts to matter: first-call kernel checks, lazy imports, caches
_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


def _cases() -> dict:
    """case name -> (kiln callable, what it runs)."""
    import kiln

    return {c["name"]: (c["kiln"], c["what"]) for c in make_cases(kiln, None)}


def worker(case: str, calls: int) -> None:
    """Run inside callgrind: build the cases, call ``case`` WARMUP + ``calls`` times."""
    fn = _cases()[case][0]
    for _ in range(WARMUP):
        fn()
    # Everything built so far (the imported modules, the cases) moves out of the collector's generations: a
    # full collection would otherwise traverse it in some runs and not others, a cost of the heap's size
    # rather than of the op, which moved the count per call by thousands between runs.
    gc.collect()
    gc.freeze()
    for _ in range(calls):
        fn()


def count(case: str, calls: int, timeout: float) -> int:
    """Instructions executed by a whole interpreter that calls ``case`` WARMUP + ``calls`` times."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env.update(PYTHONHASHSEED="0", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__]
    out = subprocess.run(
        [*cmd, "--worker", case, str(calls)], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )
    found = _COLLECTED.search(out.stderr)
    if out.returncode != 0 or found is None:
        raise RuntimeError(f"callgrind run of {case!r} failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000, help="counted calls per case (fwd+bwd: a tenth)")
    parser.add_argument("--case", action="append", help="only this case (repeatable); default: all")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per callgrind run")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="where to write the JSON record")
    parser.add_argument("--worker", nargs=2, metavar=("CASE", "CALLS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker[0], int(args.worker[1]))
        return 0
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not on PATH (Debian: apt install valgrind)")
    cases = _cases()
    names = list(cases)
    unknown = sorted(set(args.case or ()) - set(names))
    if unknown:
        parser.error(f"unknown case(s) {unknown}; the cases are {names}")
    rows = []
    for name in args.case or names:
        calls = max(1, args.calls // 10) if "bwd" in name else args.calls
        base = count(name, 0, args.timeout)
        total = count(name, calls, args.timeout)
        per_call = (total - base) / calls
        # the shape of the wall-clock records (``times`` per library), so the docs' benchmark page shows it
        rows.append({"name": name, "what": cases[name][1], "unit": "instructions", "times": {"kiln": round(per_call)}})
        print(f"{name:<16} {per_call:>12,.0f} instructions per call", flush=True)

    import kiln

    record = {
        "benchmark": "instructions",
        "units": "instructions per call (callgrind, differential over --calls calls)",
        "machine": machine_info(None) | {"kiln_path": str(Path(kiln.__file__).parent)},
        "settings": {"calls": args.calls, "warmup": WARMUP},
        "results": rows,
    }
    write_json_atomically(args.output, record)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
