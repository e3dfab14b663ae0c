"""Real PyTorch programs run unchanged with kiln standing in for torch (issue 19).

Each program in ``pytorch_programs/`` is ordinary PyTorch code: ``import torch``, ``from torch.utils.data
import DataLoader``, ``torch.cuda.manual_seed_all``, ``torch.backends.cudnn.benchmark = True``,
``torch.save``/``torch.load``... It runs twice in a subprocess: once with PyTorch, to prove it is real
PyTorch code that passes its own check, and once through ``_as_kiln.py``, which makes every ``torch``
import resolve to ``kiln`` without changing the source. Each program exits non-zero unless its training
worked (loss fell, accuracy reached), so both runs must finish and succeed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("kiln.nn")
pytest.importorskip("kiln.utils.data")

HERE = Path(__file__).resolve().parent / "pytorch_programs"
PROGRAMS = sorted(p.name for p in HERE.glob("*.py") if not p.name.startswith("_"))


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", KILN_BACKEND=os.environ.get("KILN_BACKEND", "reference"))
    return subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize("library", ["torch", "kiln"])
def test_program_runs_unchanged(program, library, tmp_path):
    args = [str(HERE / program)] if library == "torch" else [str(HERE / "_as_kiln.py"), str(HERE / program)]
    done = _run(args, tmp_path)
    assert done.returncode == 0, f"{program} with {library}:\n{done.stdout}\n{done.stderr[-4000:]}"


def test_the_alias_reaches_kiln(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import torch, torch.nn.functional as F\nprint(torch.__name__, F.__name__)\n")
    done = _run([str(HERE / "_as_kiln.py"), str(probe)], tmp_path)
    assert done.stdout.split() == ["kiln", "kiln.nn.functional"], done.stderr
