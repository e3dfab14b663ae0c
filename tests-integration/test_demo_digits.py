"""The demo job, docs/examples/train_digits.py, end to end on the embedded digits (about 20 s on 2 cores).

The script runs in subprocesses with the running interpreter, so this environment needs what the demo
needs: kiln, kiln-nn, kiln-data, tqdm and matplotlib (the nox ``integration`` session installs them).
Mostly one-epoch runs: the accuracy target of the full run (97 % in under a minute) is the demo's own
job, checked by running ``nox -s demo``; here the script's flags, files, checkpoint reload and resume are.
The one full run pair is mixed precision's promise: ``--amp`` (bfloat16 autocast on cpu) reaches the
float32 run's accuracy within one point; ``--compile`` (kiln-compile) trains the eager run's model.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "docs" / "examples" / "train_digits.py"
TIMEOUT = 120  # one run takes a few seconds; nothing may hang


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KILN_", "MPL"))}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=TIMEOUT, cwd=cwd, env=env
    )


def ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
    return proc.stdout


def epoch_lines(stdout: str) -> dict[int, str]:
    """``{epoch: its summary line}`` from the script's output."""
    return {int(m.group(1)): m.group(0) for m in re.finditer(r"^epoch +(\d+)/\d+ .*$", stdout, re.M)}


def test_train_reload_resume(tmp_path):
    out = tmp_path / "out"
    first = ok(run("--epochs", "1", "--out", str(out), cwd=tmp_path))
    assert "on cpu: digits 1438 train / 359 test images" in first
    (line,) = epoch_lines(first).values()
    accuracy = re.search(r"test accuracy ([\d.]+)%", line).group(1)
    assert float(accuracy) > 50, line  # one epoch already learns most digits
    # the best checkpoint, reloaded into a fresh model, scores what the epoch scored
    assert f"best checkpoint reloaded: test accuracy {accuracy}%" in first
    for name in ("best.safetensors", "last.safetensors", "digits.png"):
        assert (out / name).stat().st_size > 0, name
        assert str(out / name) in first  # the paths written are listed at the end
    assert (out / "digits.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Resume for a second epoch: it must continue exactly as an unbroken 2-epoch run (model, optimizer
    # and RNG states all restored), which here uses 2 DataLoader workers: same seed, same order.
    resumed = ok(run("--epochs", "2", "--out", str(out), "--resume", str(out / "last.safetensors"), cwd=tmp_path))
    assert "resumed from" in resumed and "after epoch 1" in resumed
    assert list(epoch_lines(resumed)) == [2]
    straight = ok(run("--epochs", "2", "--workers", "2", "--out", str(tmp_path / "straight"), cwd=tmp_path))
    assert epoch_lines(straight)[2].split("*")[0] == epoch_lines(resumed)[2].split("*")[0]


def best_accuracy(stdout: str) -> float:
    return float(re.search(r"best checkpoint reloaded: test accuracy ([\d.]+)%", stdout).group(1))


def test_amp_reaches_the_float32_accuracy(tmp_path):
    with ThreadPoolExecutor(2) as pool:  # the two full runs side by side, one per core
        runs = [
            pool.submit(run, *flags, "--out", str(tmp_path / out), cwd=tmp_path)
            for flags, out in (((), "fp32"), (("--amp",), "amp"))
        ]
        full, amp = (ok(r.result()) for r in runs)
    assert "float32" in full.splitlines()[1] and "autocast kiln.bfloat16" in amp.splitlines()[1]
    assert best_accuracy(amp) >= best_accuracy(full) - 1.0, (full, amp)
    # the checkpoint of an --amp run resumes with --amp
    last = str(tmp_path / "amp" / "last.safetensors")
    resumed = ok(run("--amp", "--epochs", "11", "--out", str(tmp_path / "amp"), "--resume", last, cwd=tmp_path))
    assert list(epoch_lines(resumed)) == [11]


def test_compile_trains_the_same_model(tmp_path):
    """``--compile`` replays the traced forward and backward: two epochs give the eager run's losses and
    accuracies (printed to 4 digits and 2 decimals), the same model."""
    with ThreadPoolExecutor(2) as pool:
        runs = [
            pool.submit(run, "--epochs", "2", *flags, "--out", str(tmp_path / out), cwd=tmp_path)
            for flags, out in (((), "eager"), (("--compile",), "compiled"))
        ]
        eager, compiled = (ok(r.result()) for r in runs)
    assert "kiln.compile" in compiled.splitlines()[1] and "kiln.compile" not in eager.splitlines()[1]
    strip = {k: v.split("*")[0] for k, v in epoch_lines(eager).items()}
    assert {k: v.split("*")[0] for k, v in epoch_lines(compiled).items()} == strip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--device", "nosuchdevice"], "--device nosuchdevice: Device type 'nosuchdevice' is not registered"),
        (["--resume", "missing.safetensors"], "--resume missing.safetensors: no such file"),
        (["--epochs", "0"], "--epochs must be >= 1"),
    ],
)
def test_bad_flags_exit_with_a_message(tmp_path, args, message):
    proc = run(*args, "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 2, proc
    assert message in proc.stderr
    assert not (tmp_path / "out").exists()  # nothing written before the flags are checked
