"""The plugin manager (architecture page, "Plugins"): lazy, guarded discovery of entry points in group ``kiln``.

Nothing here runs at ``import kiln``. The first time kiln needs a device type, a kernel or the plugin
list, :func:`load` discovers the entry points, imports each plugin in a guard, and calls its hooks one
plugin at a time. A plugin that fails to import or whose hook raises is recorded with its traceback
(``kiln plugins`` shows it); what it registered is discarded, and everything else keeps working. Using
something only a broken plugin would have provided raises an error that names the plugin.

After loading, kernels sit in plain dicts (``OpDef.kernels[device_type]``); the hot path never comes
here again for a (op, device type) pair it has seen.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import sys
import threading
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from kiln import _dtype as dt
from kiln._device import device as Device

ENTRY_POINT_GROUP = "kiln"
REFERENCE_PLUGIN = "kiln.reference"

__all__ = [
    "PluginInfo",
    "DeviceType",
    "load",
    "plugins",
    "device_type",
    "resolve_kernel",
    "fallback_counts",
    "describe_kernel_source",
]


@dataclasses.dataclass
class PluginInfo:
    """What kiln knows about one plugin: where it came from, what it registered, and how it failed."""

    name: str
    module: str
    distribution: str | None = None
    version: str | None = None
    hooks: list[str] = dataclasses.field(default_factory=list)
    devices: list[str] = dataclasses.field(default_factory=list)
    kernels: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # device -> op names
    modes: list[str] = dataclasses.field(default_factory=list)
    collectives: list[str] = dataclasses.field(default_factory=list)
    compilers: list[str] = dataclasses.field(default_factory=list)
    threading: list[str] = dataclasses.field(default_factory=list)
    fused_updates: list[str] = dataclasses.field(default_factory=list)  # "name@device_type"
    extensions: list[dict] = dataclasses.field(default_factory=list)
    error: str | None = None
    disabled: bool = False

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (what ``kiln plugins --json`` prints)."""
        return dataclasses.asdict(self)


@dataclasses.dataclass
class DeviceType:
    """The contract a device plugin fulfils (all buffers are 1-D, in elements of one dtype).

    ``empty(numel, dtype, index)`` allocates storage; ``to_host(storage)`` copies a whole storage to a
    1-D NumPy array; ``from_host(array, index)`` makes new storage from a 1-D NumPy array;
    ``write(storage, start, array)`` copies a 1-D NumPy array into storage at element ``start``.
    Storage objects support ``len()``, in elements. ``dtypes`` lists the dtypes the device holds;
    ``autocast_dtype`` is the dtype ``kiln.autocast`` casts to on it by default (None: float16, as on
    cuda). ``empty_cache()`` releases an allocator's cached memory (``kiln.<name>.empty_cache``).
    ``module`` is an object (usually a module) whose public names extend ``kiln.<name>`` beyond
    the generic ones (streams, device properties... as kiln-cuda's ``kiln.cuda.Stream``).
    ``pin_memory(numel, np_dtype)`` allocates a 1-D host array in page-locked memory the device copies
    from directly (``Tensor.pin_memory()``), and ``is_pinned(array)`` says whether a host array lies in
    such memory (``Tensor.is_pinned()``); None where the device has no such memory. The rest have
    defaults suited to a single always-available device.
    """

    name: str
    empty: Callable
    to_host: Callable
    from_host: Callable
    write: Callable
    plugin: str = ""
    synchronize: Callable = lambda index=None: None
    memory_stats: Callable = lambda index=None: {}
    device_count: Callable = lambda: 1
    is_available: Callable = lambda: True
    data_ptr: Callable = id
    dtypes: tuple = dt.ALL_DTYPES
    autocast_dtype: dt.dtype | None = None
    empty_cache: Callable | None = None
    module: Any = None
    pin_memory: Callable | None = None
    is_pinned: Callable | None = None


_lock = threading.RLock()
_loaded = False
_load_error: RuntimeError | None = None
_loading = False
_plugins: dict[str, PluginInfo] = {}
_devices: dict[str, DeviceType] = {}
# (op name, device type) -> [(dtypes or None, kernel, plugin name)] in precedence order
_kernels: dict[tuple[str, str], list[tuple[Any, Callable, str]]] = {}
# the same, for in-place kernels (``register(..., inplace=True)``): ``add_``'s write into ``self``
_inplace_kernels: dict[tuple[str, str], list[tuple[Any, Callable, str]]] = {}
_modes: dict[str, Any] = {}
_collectives: dict[str, Any] = {}
_compilers: dict[str, Any] = {}
_threading: dict[str, tuple[Callable[[int], None], Callable[[], int]]] = {}  # name -> (setter, getter)
# (algorithm, device type) -> [(fn, plugin name)] in precedence order
_fused_updates: dict[tuple[str, str], list[tuple[Callable, str]]] = {}
_extensions: dict[str, dict] = {}
_fallback_counts: dict[tuple[str, str], int] = {}
_fallback_warned: set[tuple[str, str]] = set()


def _env_list(name: str) -> list[str] | None:
    """The comma-separated names in environment variable ``name``; None when it is unset or names
    nothing (empty, blanks, commas): ``KILN_PLUGINS=`` is how a shell clears a variable, not a request
    to load no plugin at all."""
    raw = os.environ.get(name)
    if raw is None:
        return None
    names = [x.strip() for x in raw.split(",") if x.strip()]
    return names or None


def _normalize_dist(name: str) -> str:
    """A distribution name as packaging compares them: case-insensitive, runs of ``-_.`` alike."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _selected_plugins(var: str, eps: list, *, deny: bool) -> set[str] | None:
    """The entry-point names that environment variable ``var`` (``KILN_PLUGINS`` or
    ``KILN_DISABLE_PLUGINS``) selects, or None when it is unset or empty.

    A name selects the plugin with that entry-point name and every plugin of the distribution with
    that name (``kiln-cpu`` selects the entry point ``cpu``: users write either). Names that select
    nothing are reported in one ``UserWarning`` listing the installed plugins, since a typo would
    otherwise silently load (or, in the allow list, drop) plugins the user did not mean to.
    """
    names = _env_list(var)
    if names is None:
        return None
    by_dist: dict[str, list[str]] = {}
    dist_names: dict[str, str] = {}  # entry-point name -> distribution name, for the message
    for ep in eps:
        dist = getattr(ep, "dist", None)
        if dist is not None:
            dname = dist.metadata["Name"]
            by_dist.setdefault(_normalize_dist(dname), []).append(ep.name)
            dist_names[ep.name] = dname
    ep_names = {ep.name for ep in eps}
    selected: set[str] = set()
    unknown: list[str] = []
    builtin: list[str] = []
    for name in names:
        hits = ({name} & ep_names) | set(by_dist.get(_normalize_dist(name), ()))
        if hits:
            selected |= hits
            _trace(f"{var}: {name!r} selects {', '.join(sorted(hits))}")
        elif name == REFERENCE_PLUGIN or _normalize_dist(name) == "kiln":
            builtin.append(name)  # the reference backend: always loaded, allowed or not
        else:
            unknown.append(name)
    if builtin and deny:
        warnings.warn(
            f"{var}: {', '.join(map(repr, builtin))} is kiln's built-in reference backend "
            f"({REFERENCE_PLUGIN!r}), which always loads; ignored.",
            UserWarning,
            stacklevel=4,
        )
    if unknown:
        installed = ", ".join(f"{n} ({dist_names[n]})" if n in dist_names else n for n in sorted(ep_names)) or "none"
        candidates = sorted(ep_names | set(dist_names.values()) | {REFERENCE_PLUGIN})
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, candidates, n=1)
            if close:
                hints.append(f" Did you mean {close[0]!r} instead of {name!r}?")
        effect = "no plugin is disabled by them" if deny else "they load nothing"
        warnings.warn(
            f"{var} names no installed kiln plugin: {', '.join(map(repr, unknown))} ({effect}). "
            f"Installed plugins, by entry-point name (distribution): {installed}; the built-in "
            f"{REFERENCE_PLUGIN!r} always loads. Entry-point and distribution names are both accepted."
            + "".join(hints),
            UserWarning,
            stacklevel=4,
        )
    return selected


def _trace(msg: str) -> None:
    if os.environ.get("KILN_TRACE_PLUGINS") == "1":
        print(f"[kiln plugins] {msg}", file=sys.stderr)


def _strict() -> bool:
    return os.environ.get("KILN_STRICT_PLUGINS") == "1"


def _entry_points() -> list:
    from importlib.metadata import entry_points

    return sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)


def load() -> None:
    """Discover and load every plugin once (thread-safe; later calls return at once).

    Under ``KILN_STRICT_PLUGINS=1`` a failing plugin makes this raise, and keep raising on every
    later call: a process never continues with half its plugins.
    """
    global _load_error, _loading
    if _loaded:
        return
    with _lock:
        if _loaded:
            return
        if _loading:  # the same thread, from inside a plugin's import or hook
            raise RuntimeError(
                "a kiln plugin used kiln (an op, a device or the plugin list) while plugins were loading; plugins "
                "must only register things at import and in their hooks (run KILN_TRACE_PLUGINS=1 to see which)"
            )
        if _load_error is not None:
            raise RuntimeError(str(_load_error)) from _load_error.__cause__
        _loading = True
        try:
            _load_all()
        except RuntimeError as exc:
            _load_error = exc
            raise
        finally:
            _loading = False


def _load_all() -> None:
    global _loaded
    import pluggy

    from kiln import hookspecs

    class _Manager(pluggy.PluginManager):
        # A plugin may define plain ``kiln_*`` functions without importing pluggy's marker.
        def parse_hookimpl_opts(self, plugin, name):
            opts = super().parse_hookimpl_opts(plugin, name)
            if opts is None and name.startswith("kiln_") and callable(getattr(plugin, name, None)):
                opts = {}
            return opts

    pm = _Manager(ENTRY_POINT_GROUP)
    pm.add_hookspecs(hookspecs)
    eps = _entry_points()
    allow = _selected_plugins("KILN_PLUGINS", eps, deny=False)
    deny = _selected_plugins("KILN_DISABLE_PLUGINS", eps, deny=True) or set()
    order: list[tuple[PluginInfo, Any]] = []
    for ep in eps:
        dist = getattr(ep, "dist", None)
        info = PluginInfo(
            name=ep.name,
            module=ep.value,
            distribution=dist.metadata["Name"] if dist is not None else None,
            version=dist.version if dist is not None else None,
        )
        if info.name in _plugins:  # the same entry point seen twice on sys.path
            continue
        _plugins[info.name] = info
        if ep.name in deny or (allow is not None and ep.name not in allow):
            info.disabled = True
            _trace(f"{ep.name}: disabled by environment")
            continue
        _trace(f"importing {ep.name} ({ep.value})")
        try:
            module = ep.load()
            pm.register(module, name=ep.name)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            info.error = "".join(traceback.format_exception(exc))
            _trace(f"{ep.name} failed to load: {exc!r}")
            if _strict():
                raise RuntimeError(f"kiln plugin {ep.name!r} failed to load (KILN_STRICT_PLUGINS=1)") from exc
            continue
        order.append((info, module))
    # The reference backend is the built-in plugin, registered through the same hooks, last.
    from kiln import _reference

    ref = PluginInfo(name=REFERENCE_PLUGIN, module="kiln._reference", distribution="kiln")
    from kiln import __version__

    ref.version = __version__
    _plugins[ref.name] = ref
    pm.register(_reference, name=REFERENCE_PLUGIN)
    order.append((ref, _reference))

    for hook in _HOOKS:
        impls = {impl.plugin_name: impl for impl in getattr(pm.hook, hook).get_hookimpls()}
        for info, _module in order:
            impl = impls.get(info.name)
            if impl is None or info.error is not None:
                continue
            info.hooks.append(hook)
            _run_hook(info, hook, impl.function)
    _install_kernels()
    _loaded = True


_HOOKS = (
    "kiln_register_devices",
    "kiln_register_kernels",
    "kiln_register_modes",
    "kiln_register_collectives",
    "kiln_register_compilers",
    "kiln_register_threading",
    "kiln_register_fused_updates",
    "kiln_register_extensions",
)


def register_plugin(plugin: Any, name: str | None = None) -> PluginInfo:
    """Register a plugin object (a module or any object with ``kiln_*`` hook functions) at run time.

    Its kernels take precedence over every plugin loaded before it. Useful for tests and notebooks;
    distributions should use the ``kiln`` entry-point group instead.
    """
    load()
    with _lock:
        name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
        if name in _plugins:
            raise ValueError(f"a kiln plugin named {name!r} is already registered")
        info = PluginInfo(name=name, module=getattr(plugin, "__name__", type(plugin).__name__))
        _plugins[name] = info
        for hook in _HOOKS:
            fn = getattr(plugin, hook, None)
            if callable(fn) and info.error is None:
                info.hooks.append(hook)
                _run_hook(info, hook, fn, prepend=True)
        _install_kernels()
        if info.error and _strict():
            raise RuntimeError(f"kiln plugin {name!r} failed to register (KILN_STRICT_PLUGINS=1)")
        return info


def unregister_plugin(name: str) -> None:
    """Remove a plugin registered with :func:`register_plugin` and everything it registered."""
    load()
    with _lock:
        _discard(_plugins.pop(name))
        _install_kernels()


def _discard(info: PluginInfo) -> None:
    """Withdraw everything a plugin registered (it is being removed, or one of its hooks failed)."""
    name = info.name
    for dev in info.devices:
        _devices.pop(dev, None)
    for table in (_kernels, _inplace_kernels):
        for key in list(table):
            table[key] = [e for e in table[key] if e[2] != name]
            if not table[key]:
                del table[key]
    for table, names in (
        (_modes, info.modes),
        (_collectives, info.collectives),
        (_compilers, info.compilers),
        (_threading, info.threading),
    ):
        for n in names:
            table.pop(n, None)
    for key in list(_fused_updates):
        _fused_updates[key] = [e for e in _fused_updates[key] if e[1] != name]
        if not _fused_updates[key]:
            del _fused_updates[key]
    for ext in info.extensions:
        if _extensions.get(ext["name"]) is ext:
            del _extensions[ext["name"]]
    info.devices, info.kernels, info.modes, info.collectives, info.compilers = [], {}, [], [], []
    info.threading, info.extensions, info.fused_updates = [], [], []


def _run_hook(info: PluginInfo, hook: str, fn: Callable, prepend: bool = False) -> None:
    """Call one plugin's hook, committing its registrations only if the hook completes."""
    pending: list[Callable[[], None]] = []
    register = _REGISTRARS[hook](info, pending, prepend)
    try:
        fn(register)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        info.error = "".join(traceback.format_exception(exc))
        _discard(info)  # what its earlier hooks registered goes too: a plugin loads whole or not at all
        _trace(f"{info.name}.{hook} failed: {exc!r}")
        if _strict():
            raise RuntimeError(f"kiln plugin {info.name!r} failed in {hook} (KILN_STRICT_PLUGINS=1)") from exc
        return
    for commit in pending:
        commit()


def _device_registrar(info: PluginInfo, pending: list, prepend: bool = False):
    def register(name: str, **contract) -> None:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"device type name must be an identifier, got {name!r}")
        if name in _devices:
            raise ValueError(f"device type {name!r} is already registered by plugin {_devices[name].plugin!r}")
        if name == "cpu" and info.name != REFERENCE_PLUGIN:
            raise ValueError("device type 'cpu' belongs to kiln's reference backend; register kernels for it instead")
        dtypes = contract.pop("dtypes", None)
        dev = DeviceType(name=name, plugin=info.name, **contract)
        if dtypes is not None:
            dev.dtypes = tuple(dtypes)

        def commit():
            _devices[name] = dev
            info.devices.append(name)

        pending.append(commit)

    return register


def _kernel_registrar(info: PluginInfo, pending: list, prepend: bool = False):
    from kiln._dispatch import OPS

    def register(op_name: str, device_type: str, kernel: Callable, dtypes=None, *, inplace: bool = False) -> None:
        if op_name not in OPS:
            raise KeyError(f"kiln has no op named {op_name!r}")
        if not callable(kernel):
            raise TypeError(f"kernel for {op_name!r} on {device_type!r} is not callable")
        if inplace and OPS[op_name].bind is None:
            raise ValueError(f"op {op_name!r} has no in-place variant to register an in-place kernel for")
        dts = None if dtypes is None else frozenset(dtypes)
        table = _inplace_kernels if inplace else _kernels

        def commit():
            entries = table.setdefault((op_name, device_type), [])
            entries.insert(0, (dts, kernel, info.name)) if prepend else entries.append((dts, kernel, info.name))
            ops = info.kernels.setdefault(device_type, [])
            if op_name not in ops:  # an op registered for several dtype sets is listed once
                ops.append(op_name)

        pending.append(commit)

    return register


def _named_registrar(table: dict, field: str):
    def make(info: PluginInfo, pending: list, prepend: bool = False):
        def register(name: str, obj: Any) -> None:
            def commit():
                table.setdefault(name, obj)
                getattr(info, field).append(name)

            pending.append(commit)

        return register

    return make


def _threading_registrar(info: PluginInfo, pending: list, prepend: bool = False):
    def register(name: str, *, set_num_threads: Callable[[int], None], get_num_threads: Callable[[], int]) -> None:
        if not (callable(set_num_threads) and callable(get_num_threads)):
            raise TypeError(f"kiln_register_threading: {name!r} needs callable set_num_threads and get_num_threads")

        def commit():
            from kiln._threads import _apply_requested

            _threading.setdefault(name, (set_num_threads, get_num_threads))
            info.threading.append(name)
            _apply_requested(set_num_threads)  # kiln.set_num_threads ran before this backend loaded

        pending.append(commit)

    return register


def _fused_update_registrar(info: PluginInfo, pending: list, prepend: bool = False):
    def register(name: str, device_type: str, fn: Callable) -> None:
        if not callable(fn):
            raise TypeError(f"kiln_register_fused_updates: the update for {name!r} on {device_type!r} is not callable")

        def commit():
            entries = _fused_updates.setdefault((name, device_type), [])
            entries.insert(0, (fn, info.name)) if prepend else entries.append((fn, info.name))
            info.fused_updates.append(f"{name}@{device_type}")

        pending.append(commit)

    return register


def _extension_registrar(info: PluginInfo, pending: list, prepend: bool = False):
    def register(name: str, version: str, **extra) -> None:
        entry = {"name": name, "version": version, "plugin": info.name, **extra}

        def commit():
            _extensions.setdefault(name, entry)
            info.extensions.append(entry)

        pending.append(commit)

    return register


_REGISTRARS = {
    "kiln_register_devices": _device_registrar,
    "kiln_register_kernels": _kernel_registrar,
    "kiln_register_modes": _named_registrar(_modes, "modes"),
    "kiln_register_collectives": _named_registrar(_collectives, "collectives"),
    "kiln_register_compilers": _named_registrar(_compilers, "compilers"),
    "kiln_register_threading": _threading_registrar,
    "kiln_register_fused_updates": _fused_update_registrar,
    "kiln_register_extensions": _extension_registrar,
}


def op_defined(opdef) -> None:
    """An op defined after plugins loaded (a feature package's own op): give it its reference kernel."""
    if not _loaded or opdef.reference is None:
        return
    with _lock:
        from kiln._reference import inplace_reference, wrap_reference

        _kernels.setdefault((opdef.name, "cpu"), []).append((None, wrap_reference(opdef), REFERENCE_PLUGIN))
        _plugins[REFERENCE_PLUGIN].kernels.setdefault("cpu", []).append(opdef.name)
        opdef.kernels["cpu"] = _select(opdef, "cpu", _kernels[(opdef.name, "cpu")])
        opdef._checked.clear()
        inplace = inplace_reference(opdef) if opdef.bind is not None else None
        if inplace is not None:
            entries = _inplace_kernels.setdefault((opdef.name, "cpu"), [])
            entries.append((None, inplace, REFERENCE_PLUGIN))
            opdef.inplace_kernels["cpu"] = _inplace_select(opdef.name, "cpu", entries)


def refresh_kernels() -> None:
    """Rebuild every op's kernel table from the registrations (e.g. after changing ``KILN_CPU_FALLBACK``:
    resolved fallbacks are cached per op and device type)."""
    load()
    with _lock:
        _install_kernels()


def _install_kernels() -> None:
    """Fill each op's plain ``kernels`` dict from the registrations (once, after loading)."""
    from kiln._dispatch import OPS

    for opdef in OPS.values():
        opdef.kernels.clear()
        opdef.inplace_kernels.clear()
        opdef._checked.clear()  # the checked-kernel cache goes too: new kernels are checked on first use
    for (op_name, dev_type), entries in _kernels.items():
        OPS[op_name].kernels[dev_type] = _select(OPS[op_name], dev_type, entries)
    for (op_name, dev_type), entries in _inplace_kernels.items():
        OPS[op_name].inplace_kernels[dev_type] = _inplace_select(op_name, dev_type, entries)


def _inplace_select(op_name: str, dev_type: str, entries: list) -> Callable:
    """One in-place kernel for a (op, device type): the in-place kernel of the plugin whose kernel runs the op
    there for ``self``'s dtype (its first registration for that dtype), so an in-place variant computes
    what the op computes. A plugin that overrides an op but not its in-place form leaves the in-place
    variant to that kernel and a copy (None: no in-place kernel)."""
    out_entries = _kernels.get((op_name, dev_type), [])
    picked: dict = {}

    def pick(d):
        owner = next((p for dts, _k, p in out_entries if dts is None or d in dts), None)
        k = next((k for dts, k, p in entries if p == owner and (dts is None or d in dts)), None)
        picked[d] = k
        return k

    def inplace(spec, *args):
        d = spec.dtype
        k = picked[d] if d in picked else pick(d)
        return None if k is None else k(spec, *args)

    return inplace


def _select(opdef, dev_type: str, entries: list) -> Callable:
    """One callable for a (op, device type): the first registration wins, per output dtype when narrowed;
    a dtype nobody registered goes down the unregistered chain (generic kernel, CPU fallback, error)."""
    if entries[0][0] is None:
        return entries[0][1]
    by_dtype: dict = {}
    catch_all = None
    for dtypes, kernel, _plugin in entries:
        if dtypes is None:
            catch_all = catch_all or kernel
            continue
        for d in dtypes:
            by_dtype.setdefault(d, kernel)
    single = opdef.num_outputs == 1

    def by_dtype_kernel(spec, *args):
        d = spec.dtype if single else spec[0].dtype
        k = by_dtype.get(d, catch_all)
        if k is None:
            k = by_dtype[d] = _unregistered_kernel(opdef, dev_type, d)
        return k(spec, *args)

    # which kernel serves an output dtype, for describe_kernel_source and the dispatcher's cache of
    # checked kernels (which then calls the picked kernel directly)
    by_dtype_kernel.kiln_pick = lambda d: by_dtype.get(d, catch_all)
    return by_dtype_kernel


# ---------------------------------------------------------------------------------------- lookups


def plugins() -> list[PluginInfo]:
    """Every discovered plugin (loaded, disabled or broken), the reference backend last."""
    load()
    return list(_plugins.values())


def device_type(dev: Device | str) -> DeviceType:
    """The registered contract for a device (or its type name); raises naming what is missing."""
    name = dev if isinstance(dev, str) else dev.type
    d = _devices.get(name)
    if d is not None:
        return d
    load()
    d = _devices.get(name)
    if d is None:
        raise RuntimeError(_missing_device_message(name))
    return d


def _missing_device_message(name: str) -> str:
    broken = [p for p in _plugins.values() if p.error]
    hint = {
        "cuda": " Install kiln-cuda (pip install kiln-cuda) on a machine with an NVIDIA GPU.",
    }.get(name, "")
    msg = f"Device type '{name}' is not registered by any installed kiln plugin.{hint}"
    if broken:
        names = ", ".join(p.name for p in broken)
        msg += f" These plugins failed to load and may provide it: {names} (run `kiln plugins` for details)."
    disabled = [p.name for p in _plugins.values() if p.disabled]
    if disabled:
        msg += f" Disabled by KILN_PLUGINS/KILN_DISABLE_PLUGINS: {', '.join(disabled)}."
    return msg


def devices() -> dict[str, DeviceType]:
    """Registered device types by name."""
    load()
    return dict(_devices)


def extensions() -> dict[str, dict]:
    """Feature packages that announced themselves, by name."""
    load()
    return dict(_extensions)


def modes() -> dict[str, Any]:
    """Dispatch modes registered by plugins, by name."""
    load()
    return dict(_modes)


def collectives() -> dict[str, Any]:
    """Process-group backends registered by plugins, by name."""
    load()
    return dict(_collectives)


def compilers() -> dict[str, Any]:
    """Compile and export targets registered by plugins, by name."""
    load()
    return dict(_compilers)


def threading_controls() -> dict[str, tuple[Callable[[int], None], Callable[[], int]]]:
    """Thread controls registered by backends: name -> (set_num_threads, get_num_threads)."""
    load()
    return dict(_threading)


def fused_update(name: str, device_type: str) -> Callable | None:
    """The fused optimizer update a plugin registered for algorithm ``name`` on ``device_type`` (the
    first registration wins, one made at run time first of all), or None."""
    load()
    entries = _fused_updates.get((name, device_type))
    return entries[0][0] if entries else None


def kernel_owner(op_name: str, dev_type: str, dtype=None) -> str | None:
    """The plugin whose kernel runs ``op_name`` on ``dev_type`` (for ``dtype`` when narrowed)."""
    load()
    for dtypes, _kernel, plugin in _kernels.get((op_name, dev_type), ()):
        if dtypes is None or dtype is None or dtype in dtypes:
            return plugin
    return None


def op_coverage() -> dict[str, dict[str, str]]:
    """device type -> op name -> owning plugin, over every registered kernel."""
    load()
    out: dict[str, dict[str, str]] = {}
    for (op_name, dev_type), entries in sorted(_kernels.items()):
        out.setdefault(dev_type, {})[op_name] = entries[0][2]
    return out


def describe_kernel_source(opdef, dev_type: str, dtype=None) -> str:
    """Who provided the kernel that runs ``opdef`` on ``dev_type`` for output ``dtype``, in words, for
    error messages: ``"plugin 'cpu' (distribution kiln-cpu 0.1.0)"``, the core's device-generic kernel,
    or the CPU fallback around the ``cpu`` kernel's provider."""
    kernel = opdef.kernels.get(dev_type)
    pick = getattr(kernel, "kiln_pick", None)
    if pick is not None and dtype is not None:
        kernel = pick(dtype)
    for _dtypes, k, plugin in _kernels.get((opdef.name, dev_type), ()):
        if k is kernel:
            return _plugin_label(plugin)
    if getattr(kernel, "kiln_cpu_fallback", False):
        return f"the CPU fallback (KILN_CPU_FALLBACK=1) running the cpu kernel of {describe_kernel_source(opdef, 'cpu', dtype)}"
    if getattr(kernel, "kiln_decomposition", False):
        return f"kiln's decomposition of '{opdef.name}' into other ops, run on the {dev_type} device"
    if opdef.device_generic:
        contract = _devices.get(dev_type)
        on = f" on the device contract of {_plugin_label(contract.plugin)}" if contract is not None else ""
        return f"kiln's device-generic kernel{on}"
    owner = kernel_owner(opdef.name, dev_type, dtype)  # the table was changed by hand: the registrations' view
    return f"an unregistered kernel ({getattr(kernel, '__qualname__', kernel)!r}; registered owner: {owner})"


def _plugin_label(name: str) -> str:
    info = _plugins.get(name)
    if info is None or info.distribution is None:
        return f"plugin '{name}' (registered at run time)"
    return f"plugin '{name}' (distribution {info.distribution} {info.version})"


def fallback_counts() -> dict[tuple[str, str], int]:
    """How often each (op, device type) ran through the opt-in CPU fallback."""
    return dict(_fallback_counts)


def resolve_kernel(opdef, dev: Device) -> Callable:
    """The kernel for ``opdef`` on ``dev``'s type, cached in ``opdef.kernels`` (slow path, once per pair)."""
    load()
    with _lock:
        k = opdef.kernels.get(dev.type)
        if k is not None:
            return k
        device_type(dev)  # raises for unknown device types
        k = opdef.kernels[dev.type] = _unregistered_kernel(opdef, dev.type)
        opdef._checked.clear()  # the dispatcher caches checked kernels: keep that cache in step with the table
        return k


def _unregistered_kernel(opdef, dev_type: str, dtype=None) -> Callable:
    """What runs an op no plugin registered for this device type (or dtype): a device-generic kernel,
    the op's decomposition into other ops (run on the device), the opt-in CPU fallback, or PyTorch's
    NotImplementedError naming the op, device, plugin and way out."""
    from kiln._reference import generic_kernel

    contract = _devices[dev_type]
    k = generic_kernel(opdef, contract)
    if k is not None:
        return k
    if opdef.decompose is not None:
        return decomposed_kernel(opdef)
    if os.environ.get("KILN_CPU_FALLBACK") == "1" and dev_type != "cpu":
        return _cpu_fallback(opdef, dev_type)
    what = f"the {dev_type} device" if dtype is None else f"dtype {dtype} on the {dev_type} device"
    raise NotImplementedError(
        f"The operator '{opdef.name}' is not currently implemented for {what} (plugin '{contract.plugin}'). "
        "Install a plugin that provides it, or set the environment variable KILN_CPU_FALLBACK=1 to run it on "
        "the CPU (slower: data is copied)."
    )


def decomposed_kernel(opdef) -> Callable:
    """A kernel that runs ``opdef.decompose`` (the op written in other kiln ops) on the arguments' device.

    It runs below autograd and the dispatch modes (the op itself is what they record), so its inner ops
    run with gradients off and no mode active. A result that aliases an argument (a decomposition may
    return its input unchanged) is copied: a kernel's result is always new storage.
    """
    from kiln._state import set_grad_mode, state
    from kiln._tensor import Tensor

    decompose = opdef.decompose
    params = list(opdef.signature.parameters.values())
    # the op's arguments arrive as one tuple in signature order: keyword-only ones go by name
    n_positional = sum(p.kind is not p.KEYWORD_ONLY for p in params)
    keyword_only = tuple(p.name for p in params[n_positional:])

    def fresh(out, args):
        storages = [a._storage for a in args if isinstance(a, Tensor)]
        if isinstance(out, Tensor) and any(out._storage is st for st in storages):
            return out.clone()
        return out

    def decomposed(spec, *args):
        grad = set_grad_mode(False)
        modes = state.pre_autograd_modes, state.post_autograd_modes
        state.pre_autograd_modes = state.post_autograd_modes = ()  # toward the defaults, restored below
        try:
            if keyword_only:
                out = decompose(*args[:n_positional], **dict(zip(keyword_only, args[n_positional:])))
            else:
                out = decompose(*args)
        finally:
            state.pre_autograd_modes, state.post_autograd_modes = modes
            set_grad_mode(grad)
        if isinstance(out, tuple):
            return tuple(fresh(o, args) for o in out)
        return fresh(out, args)

    decomposed.__name__ = decomposed.__qualname__ = f"decomposed_{opdef.name}"
    decomposed.kiln_decomposition = True  # for describe_kernel_source
    return decomposed


def _cpu_fallback(opdef, dev_type: str) -> Callable:
    """Run an op on the CPU for a device without a kernel: copy in, compute, copy out, warn once."""
    from kiln._device import CPU
    from kiln._ops.copy import to_device_raw, write_from_host
    from kiln._tensor import Tensor

    cpu_kernel = opdef.kernels.get("cpu") or resolve_kernel(opdef, CPU)
    key = (opdef.name, dev_type)

    def to_cpu(x):
        if isinstance(x, Tensor):
            return to_device_raw(x, CPU) if x._device.type == dev_type else x
        if isinstance(x, (list, tuple)):
            items = [to_cpu(v) for v in x]
            return type(x)._make(items) if hasattr(x, "_fields") else type(x)(items)  # namedtuples too
        return x

    def fallback(spec, *args):
        _fallback_counts[key] = _fallback_counts.get(key, 0) + 1
        if key not in _fallback_warned:
            _fallback_warned.add(key)
            warnings.warn(
                f"The operator '{opdef.name}' is not implemented for the {dev_type} device; running it on the "
                "CPU (KILN_CPU_FALLBACK=1). Data is copied both ways.",
                UserWarning,
                stacklevel=4,
            )
        if opdef.num_outputs == 1:
            target = spec.device
            cpu_spec = spec.replace(device=CPU)
        else:
            target = spec[0].device
            cpu_spec = tuple(s.replace(device=CPU) for s in spec)
        cpu_args = tuple(to_cpu(a) for a in args)
        out = cpu_kernel(cpu_spec, *cpu_args)
        # in-place ops write through to their device-resident first argument
        for a, ca in zip(args, cpu_args):
            if isinstance(a, Tensor) and ca is not a and out is ca:
                write_from_host(a, ca._numpy())
                return a
        if isinstance(out, tuple):
            return tuple(to_device_raw(o, target) for o in out)
        return to_device_raw(out, target)

    fallback.kiln_cpu_fallback = True  # for describe_kernel_source
    return fallback


def host_copy(t) -> np.ndarray:
    """The elements of a tensor on any device as a new (strided view of a) host array."""
    dev = device_type(t._device)
    buf = dev.to_host(t._storage)
    if 0 in t._shape:  # nothing to read; an empty view's offset may point past the end of its storage
        return np.empty(t._shape, buf.dtype)
    isz = t._dtype.itemsize
    return np.ndarray(t._shape, buf.dtype, buf, t._offset * isz, tuple(s * isz for s in t._stride))
