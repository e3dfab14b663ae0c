"""What every worker of this folder starts with: the process group (argv: backend, output folder) and
the ``@check`` decorator, which runs a check at once and records ``"ok"`` or ``"FAIL: <traceback>"`` in
``<out>/rank<r>.json`` (read by launch.py)."""

from __future__ import annotations

import datetime
import json
import sys
import traceback
from pathlib import Path

import kiln.distributed as dist

backend, out_dir = sys.argv[1], Path(sys.argv[2])
dist.init_process_group(backend, timeout=datetime.timedelta(seconds=40))
RANK, WORLD = dist.get_rank(), dist.get_world_size()
results: dict[str, str] = {}


def check(fn):
    """Run ``fn`` now as a named check, record its result, then wait for every rank."""
    name = fn.__name__
    try:
        fn()
        results[name] = "ok"
    except Exception:  # noqa: BLE001 - every failure is reported to the test, with its traceback
        results[name] = "FAIL: " + traceback.format_exc()
    (out_dir / f"rank{RANK}.json").write_text(json.dumps(results, indent=1))
    dist.barrier()
    return fn
