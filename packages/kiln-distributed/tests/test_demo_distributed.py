"""The demo job, docs/examples/train_digits.py, on 2 processes under kiln-run (DistributedDataParallel on gloo).

``python -m kiln.distributed.run --standalone --nproc-per-node 2 docs/examples/train_digits.py`` must train
to the accuracy of the single-process run with the same epochs (within one point, as the demo's mixed
precision test allows; ``--batch-size`` is the global batch, so both take the same number of steps),
with rank 0 alone printing and writing, and its checkpoint must resume in a single process. A few epochs
on each side, the two runs side by side: about 15 s on 2 cores. The demo needs tqdm and matplotlib
(the nox ``distributed`` session installs them); without them the test is skipped.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("tqdm", reason="the demo shows a progress bar with tqdm")
pytest.importorskip("matplotlib", reason="the demo draws its PNG with matplotlib")
pytest.importorskip("torch", reason="the gloo engine is PyTorch's Gloo (kiln-distributed[gloo])")

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "docs" / "examples" / "train_digits.py"
EPOCHS = 5
TIMEOUT = 180  # each run takes seconds; nothing may hang
# What a launcher sets: the single-process run must not see it even when pytest itself runs under one.
LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def run(cmd: list[str], tmp_path: Path, **extra_env: str) -> subprocess.CompletedProcess:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("KILN_", "MPL", "TORCHELASTIC_", "ROLE_")) and k not in LAUNCH_VARS
    }
    env["TMPDIR"] = str(tmp_path)  # the launcher keeps a failed job's logs there
    env.update(extra_env)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, cwd=tmp_path, env=env)


def ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
    return proc.stdout


def best_accuracy(stdout: str) -> float:
    return float(re.search(r"best checkpoint reloaded: test accuracy ([\d.]+)%", stdout).group(1))


def epoch_numbers(stdout: str) -> list[int]:
    return [int(n) for n in re.findall(r"^epoch +(\d+)/\d+ ", stdout, re.M)]


def test_two_processes_reach_the_single_process_accuracy(tmp_path):
    one_out, two_out = tmp_path / "one", tmp_path / "two"
    single = [sys.executable, str(SCRIPT), "--epochs", str(EPOCHS), "--out", str(one_out)]
    launched = [sys.executable, "-m", "kiln.distributed.run", "--standalone", "--nproc-per-node", "2", str(SCRIPT)]
    launched += ["--epochs", str(EPOCHS), "--out", str(two_out)]
    with ThreadPoolExecutor(2) as pool:
        one, two = (ok(f.result()) for f in [pool.submit(run, cmd, tmp_path) for cmd in (single, launched)])

    assert "2 processes (gloo): DistributedDataParallel, 16 per rank" in two
    assert "processes (gloo)" not in one
    # rank 0 alone reports: each epoch once, the final lines once
    assert epoch_numbers(two) == list(range(1, EPOCHS + 1)), two
    assert two.count("best checkpoint reloaded") == 1 and two.count("training time") == 1, two
    for name in ("best.safetensors", "last.safetensors", "digits.png"):
        assert (two_out / name).stat().st_size > 0, name
    assert best_accuracy(two) >= best_accuracy(one) - 1.0, (one, two)

    # The checkpoint is the plain model's (no DDP wrapper in its keys): a single process resumes it.
    last = str(two_out / "last.safetensors")
    resumed = ok(
        run(
            [sys.executable, str(SCRIPT), "--epochs", str(EPOCHS + 1), "--out", str(two_out), "--resume", last],
            tmp_path,
        )
    )
    assert f"after epoch {EPOCHS}" in resumed and epoch_numbers(resumed) == [EPOCHS + 1], resumed


def test_batch_size_must_divide_among_the_processes(tmp_path):
    # what a launcher's rank sees; the flags are checked before the process group is joined
    proc = run(
        [sys.executable, str(SCRIPT), "--batch-size", "33", "--out", str(tmp_path / "out")], tmp_path, WORLD_SIZE="2"
    )
    assert proc.returncode == 2, proc
    assert "--batch-size 33: must be a multiple of the 2 processes" in proc.stderr
    assert not (tmp_path / "out").exists()
