"""Grad modes: ``no_grad``, ``enable_grad``, ``set_grad_enabled``, ``inference_mode``.

Each is a context manager and a decorator, thread-local as in PyTorch.
"""

from __future__ import annotations

import functools
import inspect
import threading

from kiln._state import away, inference_away, set_grad_mode, set_state, state

_SWITCHES = threading.local()  # set_multithreading_enabled's switch

__all__ = [
    "no_grad",
    "enable_grad",
    "set_grad_enabled",
    "inference_mode",
    "is_grad_enabled",
    "is_inference_mode_enabled",
    "set_multithreading_enabled",
    "is_multithreading_enabled",
    "enforce_grad_layout_policy",
]


def is_grad_enabled() -> bool:
    """True when operations are recorded for autograd in this thread."""
    return state.grad_enabled if away[0] else True


def is_inference_mode_enabled() -> bool:
    """True inside :class:`inference_mode` in this thread."""
    return state.inference if inference_away[0] else False


class _DecoratorContextManager:
    """Use as ``with mode():`` or ``@mode()`` (or ``@mode`` for the argument-free modes)."""

    def __call__(self, func):
        if inspect.isclass(func):
            raise TypeError("grad-mode decorators apply to functions, not classes")
        if inspect.isgeneratorfunction(func):

            @functools.wraps(func)
            def gen_wrapper(*args, **kwargs):
                gen = func(*args, **kwargs)
                with self.clone():
                    response = gen.send(None)
                while True:
                    try:
                        request = yield response
                    except GeneratorExit:
                        with self.clone():
                            gen.close()
                        raise
                    with self.clone():
                        try:
                            response = gen.send(request)
                        except StopIteration as e:
                            return e.value

            return gen_wrapper

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with self.clone():
                return func(*args, **kwargs)

        return wrapper

    def clone(self):
        return self.__class__()


class _ForceGradMode(_DecoratorContextManager):
    """Set grad mode to ``_mode`` inside the block; usable bare as a decorator too."""

    _mode = False

    def __new__(cls, orig_func=None):
        if orig_func is None or not callable(orig_func):
            return super().__new__(cls)
        return cls()(orig_func)

    def __enter__(self):
        self.prev = set_grad_mode(self._mode)

    def __exit__(self, *exc):
        set_grad_mode(self.prev)


class no_grad(_ForceGradMode):
    """Disable gradient recording inside the block (or the decorated function)."""

    _mode = False


class enable_grad(_ForceGradMode):
    """Enable gradient recording inside the block, even within ``no_grad``."""

    _mode = True


class set_grad_enabled(_DecoratorContextManager):
    """Set grad mode on or off: as a function call (takes effect at once) or a context manager."""

    def __init__(self, mode: bool):
        self.mode = bool(mode)
        self.prev = set_grad_mode(self.mode)

    def __enter__(self):
        pass

    def __exit__(self, *exc):
        set_grad_mode(self.prev)

    def __call__(self, func):
        set_grad_mode(self.prev)  # used as a decorator: the call above must not change the mode
        return super().__call__(func)

    def clone(self):
        return self.__class__(self.mode)


class inference_mode(_DecoratorContextManager):
    """Like ``no_grad``, and tensors made inside are inference tensors that autograd refuses to save."""

    def __init__(self, mode: bool = True):
        self.mode = bool(mode)

    def __new__(cls, mode=True):
        if isinstance(mode, bool):
            return super().__new__(cls)
        return cls()(mode)

    def __enter__(self):
        # inference_mode(False) restores normal autograd, grad mode included (as PyTorch)
        self.prev = (set_grad_mode(not self.mode), set_state("inference", self.mode))

    def __exit__(self, *exc):
        set_grad_mode(self.prev[0])
        set_state("inference", self.prev[1])

    def clone(self):
        return self.__class__(self.mode)


class set_multithreading_enabled(_DecoratorContextManager):
    """Turn multithreaded backward on or off (``torch.autograd.set_multithreading_enabled``), as a context
    manager, a decorator or a call; thread-local.

    PyTorch runs the backward of accelerator ops on per-device worker threads unless this is off; kiln's
    engine runs every backward on the calling thread, which is what this switch set to ``False`` asks for,
    so either value computes the same gradients on the same thread. :func:`is_multithreading_enabled`
    reads the switch.
    """

    def __init__(self, mode: bool) -> None:
        self.prev = is_multithreading_enabled()
        _SWITCHES.multithreading = bool(mode)
        self.mode = mode

    def __call__(self, orig_func):
        _SWITCHES.multithreading = self.prev
        return super().__call__(orig_func)

    def __enter__(self) -> None:
        pass

    def __exit__(self, exc_type, exc_value, traceback) -> None:
        _SWITCHES.multithreading = self.prev

    def clone(self) -> set_multithreading_enabled:
        """A fresh context manager with the same mode."""
        return self.__class__(self.mode)


def is_multithreading_enabled() -> bool:
    """The :class:`set_multithreading_enabled` switch of this thread (True by default)."""
    return getattr(_SWITCHES, "multithreading", True)


class enforce_grad_layout_policy(_DecoratorContextManager):
    """Enforce the gradient layout contract, or relax it (``torch.autograd.enforce_grad_layout_policy``);
    a context manager, a decorator or a call, thread-local.

    The contract: a leaf's accumulated ``.grad`` has the leaf's strides when the leaf is non-overlapping and
    dense, row-major strides otherwise. With ``enable=False`` a gradient the engine alone holds becomes
    ``.grad`` as it is, whatever its layout, instead of being copied into the contract's layout; a new copy
    always follows the contract.
    """

    def __init__(self, enable: bool = True) -> None:
        from kiln.autograd.accumulate import layout_enforced, set_layout_enforced

        self.prev = layout_enforced()
        set_layout_enforced(enable)
        self.mode = enable

    def __call__(self, orig_func):
        from kiln.autograd.accumulate import set_layout_enforced

        set_layout_enforced(self.prev)
        return super().__call__(orig_func)

    def __enter__(self) -> None:
        pass

    def __exit__(self, exc_type, exc_value, traceback) -> None:
        from kiln.autograd.accumulate import set_layout_enforced

        set_layout_enforced(self.prev)

    def clone(self) -> enforce_grad_layout_policy:
        """A fresh context manager with the same setting."""
        return self.__class__(self.mode)
