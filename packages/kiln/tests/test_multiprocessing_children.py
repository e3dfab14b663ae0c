"""What the children of the kiln.multiprocessing tests run (no tests here).

Module level and importable by name (the tests put this directory on ``sys.path``), so that children
started by ``spawn`` and ``forkserver`` can unpickle these functions.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import kiln


class Tagged(kiln.Tensor):
    """A Tensor subclass defined after kiln.multiprocessing was imported."""


def sgd_steps(rank: int, w, b, x, y, counts, steps: int, lr: float) -> None:
    """Hogwild on leaf tensors: plain SGD on a linear least-squares problem, counting each step."""
    for _ in range(steps):
        w.grad = None
        b.grad = None
        loss = ((x @ w + b - y) ** 2).mean()
        loss.backward()
        with kiln.no_grad():
            w -= lr * w.grad
            b -= lr * b.grad
            counts[rank] += 1


def module_steps(rank: int, model, x, y, counts, steps: int) -> None:
    """Hogwild on a kiln.nn module with kiln.optim.SGD (each process its own optimizer)."""
    opt = kiln.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
        with kiln.no_grad():
            counts[rank] += 1


def add_and_report(inbox, outbox) -> None:
    """Take tensors from ``inbox``, add 1 to each in place, and report what it saw (until ``None``)."""
    while True:
        item = inbox.get(timeout=30)
        if item is None:
            return
        report = []
        for t in item if isinstance(item, (list, tuple)) else [item]:
            report.append((t.is_shared(), str(t.dtype), tuple(t.shape)))
            with kiln.no_grad():
                t.add_(1)
        outbox.put(report)


def views_in_child(inbox, outbox) -> None:
    """Receive a base and a view of it in one message; write through the view; report the base."""
    base, view = inbox.get(timeout=30)
    view.fill_(7)
    outbox.put((base.tolist(), base.untyped_storage() is view.untyped_storage()))


def send_from_child(outbox, done) -> None:
    """Make a tensor here, send it, and stay alive until the parent has written to it and says so."""
    t = kiln.arange(5.0)
    outbox.put(t)
    done.wait(30)
    outbox.put(t.tolist())


def hold_then_sleep(inbox, outbox) -> None:
    """Receive a tensor, say so, and sleep until killed."""
    t = inbox.get(timeout=30)
    outbox.put(t.is_shared())
    time.sleep(60)


def raise_in(i: int, which: int) -> None:
    """Rank ``which`` raises; the others wait to be stopped."""
    if i == which:
        raise ValueError(f"rank {i} failed on purpose")
    time.sleep(30)


def exit_with(i: int, code: int) -> None:
    """Exit at once with ``code``."""
    sys.exit(code)


def kill_self(i: int) -> None:
    """Die by SIGKILL."""
    os.kill(os.getpid(), signal.SIGKILL)


def sleep_for(i: int, seconds: float) -> None:
    """Sleep."""
    time.sleep(seconds)


def ignore_sigterm_and_sleep(i: int) -> None:
    """Rank 0 fails; rank 1 ignores SIGTERM (only SIGKILL stops it)."""
    if i == 0:
        time.sleep(0.5)
        raise RuntimeError("rank 0 failed")
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(60)


def write_rank(i: int, t) -> None:
    """Write ``i + 1`` into row ``i`` of a shared tensor."""
    t[i] = i + 1
