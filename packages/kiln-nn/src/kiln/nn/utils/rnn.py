"""Variable-length sequence helpers (``torch.nn.utils.rnn``).

:class:`PackedSequence`, :func:`pack_padded_sequence`, :func:`pad_packed_sequence`, :func:`pad_sequence`,
:func:`unpad_sequence`, :func:`pack_sequence`, :func:`unpack_sequence` and :func:`invert_permutation`.
Packing and padding are written with kiln ops (slicing, ``cat``, ``index_select``), so gradients flow
through them to the padded input and back.
"""

from __future__ import annotations

from typing import NamedTuple

from kiln import Tensor

__all__ = [
    "PackedSequence",
    "invert_permutation",
    "pack_padded_sequence",
    "pad_packed_sequence",
    "pad_sequence",
    "unpad_sequence",
    "pack_sequence",
    "unpack_sequence",
]


class PackedSequence_(NamedTuple):
    data: Tensor
    batch_sizes: Tensor
    sorted_indices: Tensor | None
    unsorted_indices: Tensor | None


def _bind(optional, fn):
    return None if optional is None else fn(optional)


class PackedSequence(PackedSequence_):
    """A packed batch of variable-length sequences (``torch.nn.utils.rnn.PackedSequence``).

    ``data`` holds the time steps of all sequences interleaved (step 0 of every sequence, then step 1 of
    every sequence still running, ...), ``batch_sizes`` (CPU int64) how many sequences run at each step,
    ``sorted_indices``/``unsorted_indices`` the permutation that sorted the batch by decreasing length
    (``None`` when the input was already sorted). Build one with :func:`pack_padded_sequence` or
    :func:`pack_sequence`; every recurrent layer accepts it.
    """

    def __new__(cls, data, batch_sizes=None, sorted_indices=None, unsorted_indices=None):
        return super().__new__(cls, *_packed_sequence_init_args(data, batch_sizes, sorted_indices, unsorted_indices))

    def to(self, *args, **kwargs) -> PackedSequence:
        """Convert ``data`` (dtype and/or device) like :meth:`Tensor.to`; the indices follow its device."""
        data = self.data.to(*args, **kwargs)
        if data is self.data:
            return self

        def call_to(t: Tensor) -> Tensor:
            return t.to(data.device)

        return type(self)(
            data, self.batch_sizes, _bind(self.sorted_indices, call_to), _bind(self.unsorted_indices, call_to)
        )

    def cpu(self) -> PackedSequence:
        """The sequence with ``data`` on the CPU."""
        return self.to("cpu")

    def double(self) -> PackedSequence:
        """``data`` as float64."""
        import kiln

        return self.to(dtype=kiln.float64)

    def float(self) -> PackedSequence:
        """``data`` as float32."""
        import kiln

        return self.to(dtype=kiln.float32)

    def half(self) -> PackedSequence:
        """``data`` as float16."""
        import kiln

        return self.to(dtype=kiln.float16)

    def long(self) -> PackedSequence:
        """``data`` as int64."""
        import kiln

        return self.to(dtype=kiln.int64)

    def int(self) -> PackedSequence:
        """``data`` as int32."""
        import kiln

        return self.to(dtype=kiln.int32)

    @property
    def is_cuda(self) -> bool:
        """Whether ``data`` lives on a CUDA device."""
        return self.data.device.type == "cuda"


def _packed_sequence_init_args(data, batch_sizes=None, sorted_indices=None, unsorted_indices=None):
    if unsorted_indices is None:
        unsorted_indices = invert_permutation(sorted_indices)
    if batch_sizes is not None:
        if batch_sizes.device.type != "cpu":
            raise ValueError(
                "batch_sizes should always be on CPU. "
                "Instances of PackedSequence should never be created manually. "
                "They should be instantiated by functions like pack_sequence "
                "and pack_padded_sequences in nn.utils.rnn. "
                "https://pytorch.org/docs/stable/nn.html#torch.nn.utils.rnn.pack_sequence"
            )
        return data, batch_sizes, sorted_indices, unsorted_indices
    if not (isinstance(data, (list, tuple)) and len(data) == 2):
        raise AssertionError("Expected data to be a list or tuple of length 2")
    return data[0], data[1], sorted_indices, unsorted_indices


def invert_permutation(permutation: Tensor | None) -> Tensor | None:
    """The inverse of a 1-D permutation of ``0..n-1`` (``None`` stays ``None``)."""
    if permutation is None:
        return None
    from kiln import arange, empty_like

    return empty_like(permutation).scatter(0, permutation, arange(permutation.numel(), device=permutation.device))


def _lengths_tensor(lengths):
    import kiln

    if isinstance(lengths, Tensor):
        return lengths.to(dtype=kiln.int64)
    return kiln.as_tensor(lengths, dtype=kiln.int64, device="cpu")


def pack_padded_sequence(
    input: Tensor, lengths, batch_first: bool = False, enforce_sorted: bool = True
) -> PackedSequence:
    """Pack a padded batch ``T × B × *`` (``B × T × *`` when ``batch_first``) of sequences of ``lengths``.

    With ``enforce_sorted=True`` the lengths must decrease; otherwise the batch is sorted first and the
    permutation is kept in the result. Differentiable with respect to ``input``.
    """
    import kiln

    lengths = _lengths_tensor(lengths)
    sorted_indices = None
    x = input
    if not enforce_sorted:
        lengths, sorted_indices = kiln.sort(lengths, descending=True)
        sorted_indices = sorted_indices.to(x.device)
        x = x.index_select(0 if batch_first else 1, sorted_indices)
    data, batch_sizes = _pack_padded(x, lengths, batch_first)
    return PackedSequence(data, batch_sizes, sorted_indices, None)


def _pack_padded(input: Tensor, lengths: Tensor, batch_first: bool):
    """torch's ``_pack_padded_sequence``: checks, then one slice per distinct length, concatenated."""
    import kiln

    x = input.transpose(0, 1) if batch_first else input
    if lengths.dim() != 1 or lengths.device.type != "cpu":
        raise RuntimeError(
            f"'lengths' argument should be a 1D CPU int64 tensor, but got {lengths.dim()}D "
            f"{lengths.device.type} Long tensor"
        )
    batch_size = x.size(1)
    if x.numel() == 0:
        raise RuntimeError("Cannot pack empty tensors.")
    lens = [int(v) for v in lengths.tolist()]
    if len(lens) != batch_size:
        raise RuntimeError(
            f"Expected `len(lengths)` to be equal to batch_size, but got {len(lens)} (batch_size={batch_size})"
        )
    if lens[-1] <= 0:
        raise RuntimeError(
            "Length of all samples has to be greater than 0, but found an element in 'lengths' that is <= 0"
        )
    for i in range(batch_size - 1):
        if lens[batch_size - 1 - i] > lens[batch_size - 2 - i]:
            raise RuntimeError(
                "`lengths` array must be sorted in decreasing order when `enforce_sorted` is True. You can pass "
                "`enforce_sorted=False` to pack_padded_sequence and/or pack_sequence to sidestep this requirement "
                "if you do not need ONNX exportability."
            )
    trailing = tuple(x.shape[2:])
    steps, batch_sizes = [], []
    prev = 0
    for i in range(batch_size):
        length = lens[batch_size - 1 - i]
        if length > prev:
            current = batch_size - i
            steps.append(x[prev:length, :current].reshape(-1, *trailing))
            batch_sizes.extend([current] * (length - prev))
            prev = length
    return kiln.cat(steps, 0), kiln.tensor(batch_sizes, dtype=kiln.int64)


def _packed_offsets(batch_sizes: list[int]) -> list[int]:
    offsets, total = [], 0
    for b in batch_sizes:
        offsets.append(total)
        total += b
    return offsets


def pad_packed_sequence(
    sequence: PackedSequence, batch_first: bool = False, padding_value: float = 0.0, total_length: int | None = None
) -> tuple[Tensor, Tensor]:
    """Undo :func:`pack_padded_sequence`: ``(padded, lengths)`` in the batch's original order.

    ``padded`` is ``T × B × *`` (``B × T × *`` when ``batch_first``), padded with ``padding_value`` up to
    ``total_length`` when given. Differentiable with respect to ``sequence.data``.
    """
    import kiln

    max_seq_length = sequence.batch_sizes.size(0)
    if total_length is not None:
        if total_length < max_seq_length:
            raise ValueError(
                "Expected total_length to be at least the length "
                "of the longest sequence in input, but got "
                f"total_length={total_length} and max sequence length being {max_seq_length}"
            )
        max_seq_length = total_length
    data = sequence.data
    bs = [int(b) for b in sequence.batch_sizes.tolist()]
    max_batch = bs[0]
    n = data.size(0)
    # one gather: position (t, b) reads packed row offsets[t] + b, or the padding row n
    offsets = _packed_offsets(bs)
    index = []
    for t in range(max_seq_length):
        for b in range(max_batch):
            index.append(offsets[t] + b if t < len(bs) and b < bs[t] else n)
    pad_row = kiln.full((1, *data.shape[1:]), padding_value, dtype=data.dtype, device=data.device)
    ext = kiln.cat([data, pad_row], 0)
    idx = kiln.tensor(index, dtype=kiln.int64, device=data.device)
    padded = ext.index_select(0, idx).reshape(max_seq_length, max_batch, *data.shape[1:])
    lengths = [sum(1 for b_t in bs if b_t > b) for b in range(max_batch)]
    lengths_t = kiln.tensor(lengths, dtype=kiln.int64)
    if batch_first:
        padded = padded.transpose(0, 1)
    unsorted = sequence.unsorted_indices
    if unsorted is not None:
        return padded.index_select(0 if batch_first else 1, unsorted), lengths_t[unsorted.cpu()]
    return padded, lengths_t


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


def unpad_sequence(padded_sequences: Tensor, lengths: Tensor, batch_first: bool = False) -> list[Tensor]:
    """Split a padded batch back into its ``len(lengths)`` sequences (``L_i × *``)."""
    x = padded_sequences if batch_first else padded_sequences.transpose(0, 1)
    lens = lengths.tolist() if isinstance(lengths, Tensor) else list(lengths)
    if len(lens) != x.size(0):
        raise ValueError(f"zip() argument 2 is {'shorter' if len(lens) < x.size(0) else 'longer'} than argument 1")
    return [x[b, : int(n)] for b, n in enumerate(lens)]


def pack_sequence(sequences: list[Tensor], enforce_sorted: bool = True) -> PackedSequence:
    """Pack a list of ``L_i × *`` sequences (``pad_sequence`` then ``pack_padded_sequence``)."""
    import kiln

    lengths = kiln.as_tensor([v.size(0) for v in sequences], dtype=kiln.int64)
    return pack_padded_sequence(pad_sequence(sequences), lengths, enforce_sorted=enforce_sorted)


def unpack_sequence(packed_sequences: PackedSequence) -> list[Tensor]:
    """The list of sequences a :class:`PackedSequence` holds, in their original order."""
    padded, lengths = pad_packed_sequence(packed_sequences, batch_first=True)
    return unpad_sequence(padded, lengths, batch_first=True)
