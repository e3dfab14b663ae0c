"""Recurrent layers: kiln (with kiln-cpu's fused LSTM/GRU kernels) vs PyTorch, one thread, one process.

Run with ``python benchmarks/bench_rnn.py`` in an env with kiln, kiln-cpu, kiln-nn, torch and numpy. Cases:

* a word-level language model's training step (embedding of 10,000 words in 200 dims, a 2-layer LSTM or GRU
  of hidden size 200, a linear decoder back to the 10,000 words, cross entropy, an SGD step) on a batch of
  20 sequences of 35 tokens: the model issue 24 names;
* the recurrent layers alone, forward and backward: ``nn.LSTM(200, 200, 2)`` and ``nn.GRU`` on the same
  ``(35, 20, 200)`` input, and 35 steps of ``nn.LSTMCell(200, 200)`` in a Python loop.

Each case first checks that kiln and PyTorch agree, given the same weights (the loss, or the summed output),
then times ``per_call_seconds`` (the minimum per-call time over repeats). The ratio is kiln/PyTorch
(below 1: kiln is faster). Record: ``benchmarks/results/rnn.json``. Issue 24 asks for the LSTM and GRU
language-model steps at or below 1.5x.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"  # before NumPy, PyTorch or Numba load

import numpy as np  # noqa: E402

sys.path.insert(0, str(HERE))
from bench_overhead import one_thread_arguments, per_call_seconds, write_one_thread_record  # noqa: E402

DEFAULT_OUTPUT = HERE / "results" / "rnn.json"
VOCAB, EMBED, HIDDEN, LAYERS, STEPS, BATCH = 10_000, 200, 200, 2, 35, 20


def _language_model(lib, cell: str):
    nn = lib.nn

    class LanguageModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, EMBED)
            self.rnn = getattr(nn, cell)(EMBED, HIDDEN, LAYERS)
            self.decode = nn.Linear(HIDDEN, VOCAB)

        def forward(self, tokens, state):
            out, state = self.rnn(self.embed(tokens), state)
            return self.decode(out).reshape(-1, VOCAB), state

    return LanguageModel()


def _same_weights(kiln, k_model, t_model) -> None:
    """kiln's parameters set to PyTorch's (the same names in both)."""
    params = dict(k_model.named_parameters())
    with kiln.no_grad():
        for name, p in t_model.named_parameters():
            params[name].copy_(kiln.tensor(p.detach().numpy()))


def _lm_case(kiln, torch, rng, cell: str) -> dict:
    tokens = rng.integers(0, VOCAB, (STEPS, BATCH))
    targets = rng.integers(0, VOCAB, STEPS * BATCH)
    models = {"torch": _language_model(torch, cell), "kiln": _language_model(kiln, cell)}
    _same_weights(kiln, models["kiln"], models["torch"])

    def step_of(lib, model):
        opt = lib.optim.SGD(model.parameters(), lr=0.1)
        x, y = lib.tensor(tokens), lib.tensor(targets)
        h = lib.zeros(LAYERS, BATCH, HIDDEN)
        state = (h, h.clone()) if cell == "LSTM" else h

        def step():
            opt.zero_grad()
            out, _ = model(x, state)
            loss = lib.nn.functional.cross_entropy(out, y)
            loss.backward()
            opt.step()
            return loss.detach()

        return step

    steps = {lib: step_of(mod, models[lib]) for lib, mod in (("kiln", kiln), ("torch", torch))}
    return {
        "name": f"{cell} LM step",
        "what": f"embedding {VOCAB}x{EMBED}, {LAYERS}-layer {cell} {HIDDEN}, decoder, cross entropy, SGD; "
        f"{BATCH} sequences of {STEPS}",
        "check": 1e-4,
        **steps,
    }


def _layer_case(kiln, torch, rng, cell: str, proj: int = 0) -> dict:
    x = rng.standard_normal((STEPS, BATCH, EMBED)).astype(np.float32)
    extra = {"proj_size": proj} if proj else {}
    models = {
        "torch": getattr(torch.nn, cell)(EMBED, HIDDEN, LAYERS, **extra),
        "kiln": getattr(kiln.nn, cell)(EMBED, HIDDEN, LAYERS, **extra),
    }
    _same_weights(kiln, models["kiln"], models["torch"])

    def run_of(lib, model):
        inp = lib.tensor(x, requires_grad=True)

        def run():
            model.zero_grad()
            out, _ = model(inp)
            total = out.sum()
            total.backward()
            return total.detach()

        return run

    args = f"{EMBED}, {HIDDEN}, {LAYERS}" + (f", proj_size={proj}" if proj else "")
    return {
        "name": f"{cell} {'proj ' if proj else ''}layers fwd+bwd",
        "what": f"nn.{cell}({args}) on ({STEPS}, {BATCH}, {EMBED}), output summed, backward",
        "check": 1e-3,
        **{lib: run_of(mod, models[lib]) for lib, mod in (("kiln", kiln), ("torch", torch))},
    }


def _cell_case(kiln, torch, rng) -> dict:
    x = rng.standard_normal((STEPS, BATCH, EMBED)).astype(np.float32)
    models = {"torch": torch.nn.LSTMCell(EMBED, HIDDEN), "kiln": kiln.nn.LSTMCell(EMBED, HIDDEN)}
    _same_weights(kiln, models["kiln"], models["torch"])

    def run_of(lib, model):
        inp = lib.tensor(x, requires_grad=True)

        def run():
            model.zero_grad()
            h = c = lib.zeros(BATCH, HIDDEN)
            total = 0
            for t in range(STEPS):
                h, c = model(inp[t], (h, c))
                total = total + h.sum()
            total.backward()
            return total.detach()

        return run

    return {
        "name": "LSTMCell loop fwd+bwd",
        "what": f"{STEPS} steps of nn.LSTMCell({EMBED}, {HIDDEN}) in Python, batch {BATCH}, backward",
        "check": 1e-3,
        **{lib: run_of(mod, models[lib]) for lib, mod in (("kiln", kiln), ("torch", torch))},
    }


def main(argv: list[str] | None = None) -> int:
    args = one_thread_arguments(__doc__, DEFAULT_OUTPUT, 1.0, argv)

    import torch

    import kiln

    torch.set_num_threads(1)
    kiln.set_num_threads(1)
    rng = np.random.default_rng(0)
    cases = [_lm_case(kiln, torch, rng, c) for c in ("LSTM", "GRU")]
    cases += [_layer_case(kiln, torch, rng, c) for c in ("LSTM", "GRU")]
    cases += [_layer_case(kiln, torch, rng, "LSTM", proj=HIDDEN // 2), _cell_case(kiln, torch, rng)]
    rows = []
    for case in cases:
        # the first call of each agrees (the same weights); the training steps then diverge by rounding
        want, got = float(case["torch"]()), float(case["kiln"]())
        assert abs(got - want) <= case["check"] * max(1.0, abs(want)), (case["name"], got, want)
        ms = {
            lib: per_call_seconds(case[lib], repeat=args.repeat, min_time=args.min_time) * 1e3
            for lib in ("kiln", "torch")
        }
        rows.append(
            {
                "name": case["name"],
                "what": case["what"],
                "unit": "ms",
                "times": ms,
                "kiln/torch": ms["kiln"] / ms["torch"],
            }
        )
    print(f"kiln {kiln.__version__} vs torch {torch.__version__}; 1 thread")
    head = f"{'case':<24} {'kiln ms':>9} {'torch ms':>9} {'kiln/torch':>10}"
    print(head)
    print("-" * len(head))
    for r in rows:
        t = r["times"]
        print(f"{r['name']:<24} {t['kiln']:>9.2f} {t['torch']:>9.2f} {r['kiln/torch']:>9.2f}x")
    write_one_thread_record(args, "rnn", "ms per call (minimum over repeats), 1 thread", rows, torch)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
