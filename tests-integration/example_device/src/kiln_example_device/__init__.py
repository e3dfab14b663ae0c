"""kiln-example-device: an out-of-tree kiln device plugin, written the way a vendor would write one.

It provides device type ``example`` (two devices, ``example:0`` and ``example:1``) whose memory is
``bytearray`` blocks from its own allocator (:mod:`.memory`), the device contract over them
(:mod:`.device`), kernels for a subset of kiln's ops (:mod:`.kernels`), and the two plugin hooks
(:mod:`.plugin`) that the ``kiln`` entry point names. Nothing here is imported by ``import kiln``.
"""

__version__ = "0.1.0"
