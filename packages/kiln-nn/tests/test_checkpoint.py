"""A checkpoint round trip across processes: train, ``kiln.save`` the model and optimizer state, load
both in a new process, resume, and get exactly the losses of an uninterrupted run."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import kiln
    import kiln.nn as nn

    mode, path, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    kiln.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16, 3)
    )
    opt = kiln.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = kiln.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    data = kiln.Generator().manual_seed(1)
    x = kiln.randn(24, 1, 4, 4, generator=data)
    y = kiln.randint(0, 3, (24,), generator=data)

    start = 0
    if mode == "resume":
        ckpt = kiln.load(path)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        sched.load_state_dict(ckpt["scheduler"])
        start = ckpt["step"]
    losses = []
    for step in range(start, start + steps):
        batch = slice(8 * (step % 3), 8 * (step % 3) + 8)
        loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    if mode == "save":
        state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict()}
        kiln.save({**state, "step": start + steps}, path)
    print(json.dumps(losses))
    """
)


def _run(tmp_path, *args) -> list[float]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), *map(str, args)], capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_resume_in_a_new_process_continues_exactly(tmp_path):
    ckpt = tmp_path / "ckpt.safetensors"
    uninterrupted = _run(tmp_path, "full", ckpt, 8)
    first = _run(tmp_path, "save", ckpt, 4)
    resumed = _run(tmp_path, "resume", ckpt, 4)
    assert first == uninterrupted[:4]
    assert resumed == uninterrupted[4:]
    assert uninterrupted[6] < uninterrupted[3] < uninterrupted[0]  # the same batch: training makes progress
