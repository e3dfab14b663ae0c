"""Variable-length sequence helpers (``torch.nn.utils.rnn``): :func:`pad_sequence`."""

from __future__ import annotations

from kiln._tensor import Tensor

__all__ = ["pad_sequence"]


def pad_sequence(
    sequences: list[Tensor] | Tensor, batch_first: bool = False, padding_value: float = 0.0, padding_side: str = "right"
) -> Tensor:
    """Stack sequences of different lengths (``L_i × *``) into ``T × B × *`` (``B × T × *`` when ``batch_first``).

    Shorter sequences are padded with ``padding_value`` on ``padding_side`` (``"right"`` or ``"left"``).
    Differentiable with respect to every sequence.
    """
    from kiln import cat, full, stack

    if padding_side not in ("left", "right"):
        raise ValueError(f"Expected padding_side to be one of left or right, but got {padding_side}.")
    if isinstance(sequences, Tensor):
        sequences = list(sequences.unbind(0))
    if len(sequences) == 0:
        raise RuntimeError("received an empty list of sequences")
    max_len = max(s.size(0) for s in sequences)
    trailing = tuple(sequences[0].shape[1:])
    padded = []
    for s in sequences:
        n = max_len - s.size(0)
        if n == 0:
            padded.append(s)
            continue
        pad = full((n, *trailing), padding_value, dtype=s.dtype, device=s.device)
        padded.append(cat([s, pad]) if padding_side == "right" else cat([pad, s]))
    out = stack(padded, 0)
    return out if batch_first else out.transpose(0, 1)
