"""``torch.compiler.set_stance``: what every compiled function does on its next calls, process-wide.

The stance is one global :class:`DynamoStance` (PyTorch's too). A compiled function reads it on each call;
the default one costs a single identity test there, and any other routes the call through :func:`call`:

* ``"force_eager"``: the function's own code runs, nothing traced nor compiled;
* ``"eager_on_recompile"``: a trace whose guards hold runs; a call that would compile anew runs eagerly;
* ``"fail_on_recompile"``: such a call raises ``RuntimeError`` (PyTorch's message, with the guards that failed);
* ``"eager_then_compile"`` and ``"aot_eager_then_compile"``: a function's first call runs eagerly, the next
  compiles, with the dims whose sizes differ between the two compiled for varying sizes;
* ``force_backend`` (with ``"default"``): traces compile with that backend, and only traces compiled with
  it serve calls, as PyTorch's backend-keyed cache;
* ``skip_guard_eval_unsafe``: each trace tests its kept guards (the structure of the call's arguments and its
  tensors' metadata, the tensors read by reference's, grad mode and the like: what the compiled code relies
  on) and those that failed on a call that was traced (the ones that tell the traces apart), and a call none
  serves raises PyTorch's ``RuntimeError`` ("Recompilation triggered with skip_guard_eval_unsafe stance...")
  instead of compiling anew.

What counts as compiling anew follows PyTorch: a call at another size of a dim the serving trace holds
dynamic (marked with ``mark_dynamic``, ``dynamic=True``, or one whose size already changed among that
program's traces) is no recompile. kiln still traces it (one eager call: it has no symbolic shapes), so it
learns only afterwards whether the code took another path at that size (a Python branch on the size); then
``fail_on_recompile`` raises after the call ran, and ``eager_on_recompile`` keeps no trace of it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any

from kiln.compile._graph import GuardFailure
from kiln.compile._guards import first_failure, reduced
from kiln.compile._marks import _refuse_in_trace

__all__ = [
    "DEFAULT",
    "MISS",
    "UNSAFE_RECOMPILE",
    "DynamoStance",
    "call",
    "current",
    "fail_message",
    "forced",
    "note_failures",
    "recompile_message",
    "serve",
    "set_stance",
]

UNSAFE_RECOMPILE = (
    "Recompilation triggered with skip_guard_eval_unsafe stance. This usually means that you have not warmed up "
    "your model with enough inputs such that you can guarantee no more recompilations."
)
"""PyTorch's message for a call no trace serves under ``set_stance(skip_guard_eval_unsafe=True)``."""

_STANCES = frozenset(
    {
        "default",
        "force_eager",
        "eager_on_recompile",
        "fail_on_recompile",
        "eager_then_compile",
        "aot_eager_then_compile",
    }
)


@dataclasses.dataclass
class DynamoStance:
    """A stance: its name, ``skip_guard_eval_unsafe`` and the backend it forces (PyTorch's ``DynamoStance``)."""

    stance: str = "default"
    skip_guard_eval_unsafe: bool = False
    backend: str | Callable | None = None


DEFAULT = DynamoStance()
_current = DEFAULT


def current() -> DynamoStance:
    """The stance in force."""
    return _current


def _set(stance: DynamoStance, who: Callable | None = None) -> DynamoStance:
    """Put ``stance`` in force; the one it replaces. ``who`` (what the user called: :class:`set_stance`, a
    function it decorates) raises PyTorch's ``AssertionError`` inside a compiled function."""
    global _current
    if who is not None:
        _refuse_in_trace(who)
    prior, _current = _current, (DEFAULT if stance == DEFAULT else stance)
    return prior


def forced() -> Callable | None:
    """The backend the stance in force forces (``force_backend``, looked up), or None."""
    st = _current
    if st.backend is None:
        return None
    from kiln.compile._backends import lookup_backend

    return lookup_backend(st.backend)


class set_stance:  # noqa: N801 - PyTorch's name; a function call, a context manager and a decorator at once
    """Set the compiler's stance (``torch.compiler.set_stance``): as a call, for every later call of every
    compiled function; as a context manager, for the block (the stance before it comes back after it,
    exception or not); as a decorator, for each call of the function.

    ``stance`` is ``"default"``, ``"force_eager"`` (compiled functions run their own code: nothing is traced
    or compiled), ``"eager_on_recompile"`` (a trace whose guards hold still runs; a call that would compile
    anew runs eagerly instead), ``"fail_on_recompile"`` (such a call raises ``RuntimeError``),
    ``"eager_then_compile"`` (a compiled function's first call runs eagerly; the next compiles, with the dims
    whose sizes differ between the two compiled for varying sizes) or ``"aot_eager_then_compile"`` (the
    same in kiln, whose eager run is the only one). Another value is accepted here and raises
    ``RuntimeError`` at the next call of a compiled function, as in PyTorch. ``skip_guard_eval_unsafe=True``
    tests only the guards that have failed on some call (unsafe: a change the others would have caught
    goes unseen), with each trace's kept guards still tested (the arguments' structure, the tensors' dtype,
    shape, strides, device and ``requires_grad``: what the compiled code relies on) and a call no trace
    serves raising PyTorch's ``RuntimeError`` instead of compiling. ``force_backend`` (only with
    ``"default"``; else ``RuntimeError``) compiles with that backend instead of each function's own. Calling
    it (or a function it decorates) while a compiled function traces raises PyTorch's ``AssertionError``.
    Decorating a class wraps its constructor, with PyTorch's ``FutureWarning``; decorating what is not
    callable raises ``TypeError`` at once (PyTorch's wrapper fails when called). A decorated function runs
    with the stance less ``skip_guard_eval_unsafe`` (PyTorch's decorator sets its :meth:`clone`); a decorated
    generator has the stance set while it runs, its ``send``, ``throw`` and ``close`` included.

    A call at another size of a dim a trace holds dynamic (``kiln._dynamo.mark_dynamic``,
    ``dynamic=True``, a size that already changed) is not a recompile, as in PyTorch; kiln traces it all the
    same (one eager call), so where the code branches on that size, ``"fail_on_recompile"`` raises only
    after the call ran.
    """

    def __init__(
        self,
        stance: str = "default",
        *,
        skip_guard_eval_unsafe: bool = False,
        force_backend: str | Callable | None = None,
    ) -> None:
        if force_backend is not None and stance != "default":
            raise RuntimeError("non-default stance cannot have force_backend set")
        self.stance = DynamoStance(stance, skip_guard_eval_unsafe, force_backend)
        self.prev = _set(self.stance, set_stance)

    def __enter__(self) -> None:
        from kiln.compile._runtime import is_compiling

        if is_compiling():  # (one made before: PyTorch refuses entering it in a compiled region, in these words)
            raise RuntimeError("attempted to set_stance in a torch.compile region")
        _set(self.stance)

    def __exit__(self, *exc: Any) -> None:
        _set(self.prev)

    def __call__(self, fn: Callable) -> Callable:
        _set(self.prev)  # (as a decorator, the stance is for the function's calls only)
        if isinstance(fn, type):  # (PyTorch: its constructor, with this warning)
            warnings.warn(
                "Decorating classes is deprecated and will be disabled in future versions. You should only decorate "
                "functions or methods. To preserve the current behavior of class decoration, you can directly "
                "decorate the `__init__` method and nothing else.",
                FutureWarning,
                stacklevel=2,
            )
            cls = fn
            fn = lambda *args, **kwargs: cls(*args, **kwargs)
        if not callable(fn):
            raise TypeError(f"set_stance: can only decorate a callable, got {type(fn).__name__}")
        stance = self._cloned()
        if inspect.isgeneratorfunction(fn):
            return _generator(fn, stance)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            prior = _set(stance, wrapper)
            try:
                return fn(*args, **kwargs)
            finally:
                _set(prior)

        return wrapper

    def _cloned(self) -> DynamoStance:
        """The stance :meth:`clone` sets (and a decorated function runs with): this one less
        ``skip_guard_eval_unsafe``, as in PyTorch."""
        return DynamoStance(self.stance.stance, False, self.stance.backend)

    def clone(self) -> set_stance:
        """Another such context manager (PyTorch's ``clone``); making it sets its stance, as making this did.
        As PyTorch's, it leaves out ``skip_guard_eval_unsafe``."""
        stance = self._cloned()
        return type(self)(
            stance.stance, skip_guard_eval_unsafe=stance.skip_guard_eval_unsafe, force_backend=stance.backend
        )

    def __repr__(self) -> str:
        return f"set_stance({self.stance})"


def _generator(fn: Callable, stance: DynamoStance) -> Callable:
    """``fn``, a generator function, with ``stance`` set while its generator runs: for each value it makes,
    and for what ``send``, ``throw`` and ``close`` pass on to it (not between its values)."""

    @functools.wraps(fn)
    def generator(*args, **kwargs):
        gen = fn(*args, **kwargs)
        resume, value = gen.send, None
        while True:
            prior = _set(stance, generator)
            try:
                response = resume(value)
            except StopIteration as stop:
                return stop.value
            finally:
                _set(prior)
            try:
                value, resume = (yield response), gen.send
            except GeneratorExit:
                prior = _set(stance)
                try:
                    gen.close()
                finally:
                    _set(prior)
                raise
            except BaseException as exc:  # noqa: BLE001 - thrown in: passed on to the generator
                value, resume = exc, gen.throw

    return generator


def call(fn, args: tuple, kwargs: dict):
    """A call of the compiled function ``fn`` (a ``CompiledFunction``) under a stance other than the default."""
    st = _current
    if st.stance not in _STANCES:
        raise RuntimeError(f"invalid torch.compile stance '{st}'")
    if st.stance == "force_eager":
        return fn._fn(*args, **kwargs)
    backend = forced()
    result = serve(fn, args, kwargs, backend, st.skip_guard_eval_unsafe)
    if result is not MISS:
        return result
    if st.skip_guard_eval_unsafe or st.stance in ("eager_on_recompile", "fail_on_recompile"):
        expected = "skip_guard_eval_unsafe" if st.skip_guard_eval_unsafe else st.stance
        if fn._covered_variant(args, kwargs):  # no recompile in PyTorch: traced all the same (kiln's new size)
            return fn._miss(args, kwargs, backend, expected=expected, depth=5)
        if expected == "eager_on_recompile":
            return fn._fn(*args, **kwargs)
        raise RuntimeError(recompile_message(fn, args, kwargs, expected))
    if st.stance in ("eager_then_compile", "aot_eager_then_compile") and fn._eager_first_call(args, kwargs):
        return fn._fn(*args, **kwargs)
    return fn._miss(args, kwargs, backend, depth=5)


MISS = object()
"""What :func:`serve` returns when no trace serves the call."""


def serve(fn, args: tuple, kwargs: dict, backend: Callable | None, unsafe: bool):
    """The loop of ``CompiledFunction.__call__`` under a stance: over the traces of ``fn`` compiled by
    ``backend`` (a forced one, or the function's own), testing each trace's
    :func:`~kiln.compile._guards.reduced` guard where ``unsafe`` (``skip_guard_eval_unsafe``); the result of
    the first that serves, or :data:`MISS`."""
    backend = backend or fn._backend
    for i, entry in enumerate(fn._entries):
        if entry.backend is not backend:
            continue
        try:
            inputs = (reduced(entry.guard, fn._diff) if unsafe else entry.guard)(args, kwargs)
        except Exception:  # noqa: BLE001 - as in __call__
            continue
        if inputs is None:
            continue
        if i:
            fn._to_front(entry)
        if entry.forward is None:
            return fn._fn(*args, **kwargs)
        try:
            return entry.run(inputs)
        except GuardFailure:
            continue
    return MISS


def note_failures(fn, args: tuple, kwargs: dict) -> None:
    """Before a trace of ``fn``: remember the first guard of each of its traces that fails on this call, among
    those ``skip_guard_eval_unsafe`` skips (PyTorch's guards on the sources that caused a recompile). A trace
    whose kept guards fail (another shape: the usual miss) is told apart by them already, at the cost of its
    input tensors' metadata only."""
    found = set()
    for entry in fn._entries:
        guard = entry.guard
        if not hasattr(guard, "order"):
            continue
        try:
            if reduced(guard, frozenset())(args, kwargs) is None:
                continue
        except Exception:  # noqa: BLE001 - another structure of arguments: told apart
            continue
        i = first_failure(guard, args, kwargs, skip=guard.kept)
        if i is not None:
            found.add(guard.keys[i])
    if not found <= fn._diff:
        with fn._lock:
            fn._diff = fn._diff | found  # (a new set: the reduced guards are made per set)


def recompile_message(fn, args: tuple, kwargs: dict, stance: str, after: bool = False) -> str:
    """The message of the ``RuntimeError`` that ``stance`` (``"fail_on_recompile"`` or
    ``"skip_guard_eval_unsafe"``) raises for a call of ``fn`` no trace serves (``after``: one that ran, let
    through as another size, and turned out to be another program)."""
    if stance == "skip_guard_eval_unsafe":
        return UNSAFE_RECOMPILE
    return fail_message(fn, args, kwargs, after=after)


def fail_message(fn, args: tuple, kwargs: dict, after: bool = False) -> str:
    """PyTorch's ``fail_on_recompile`` message for a call of ``fn`` no trace serves, with each trace's first
    guard that fails (``after``: the call ran, and turned out to be another program)."""
    from kiln.compile._guards import mismatch
    from kiln.compile._marks import source_names, user_function

    target = user_function(fn._fn)
    code = getattr(target, "__code__", None) or getattr(getattr(target, "__func__", None), "__code__", None)
    where = (code.co_filename, code.co_name, code.co_firstlineno) if code else ("<unknown>", repr(target), 0)
    text = (
        "Detected recompile when torch.compile stance is 'fail_on_recompile'. "
        f"filename: '{where[0]}', function name: '{where[1]}', line number: {where[2]}"
    )
    names = [n.removeprefix("L['").replace("']", "", 1) for n in source_names(fn._fn, args, kwargs)]
    reasons = []
    for entry in fn._entries:
        why = mismatch(entry.guard, args, kwargs, names)
        if why is not None:
            reasons.append(f"    - 0/{entry.number}: {why}")
    if reasons:
        text += "\n    triggered by the following guard failure(s):\n" + "\n".join(reasons)
    if after:
        text += (
            "\n    (kiln.compile: this call, at a size the trace holds dynamic, took another path through the code: "
            "it ran eagerly, and its result is lost)"
        )
    return text
