"""The ``kiln`` command (also ``python -m kiln``): ``kiln plugins [--json]`` and ``kiln doctor``."""

from __future__ import annotations

import argparse
import json
import platform
import sys


def _plugin_rows() -> list[dict]:
    from kiln import _plugins

    rows = []
    coverage = _plugins.op_coverage()
    for info in _plugins.plugins():
        row = info.as_dict()
        row["status"] = "disabled" if info.disabled else ("error" if info.error else "loaded")
        row["op_coverage"] = {
            dev: sorted(op for op, owner in ops.items() if owner == info.name) for dev, ops in coverage.items()
        }
        row["op_coverage"] = {d: ops for d, ops in row["op_coverage"].items() if ops}
        rows.append(row)
    return rows


def cmd_plugins(args) -> int:
    """List every plugin: distribution, version, hooks, devices, op coverage per device, load errors."""
    from kiln import _plugins
    from kiln._dispatch import OPS

    rows = _plugin_rows()
    if args.json:
        out = {
            "plugins": rows,
            "devices": sorted(_plugins.devices()),
            "ops": sorted(OPS),
            "fallback_counts": {f"{o}@{d}": n for (o, d), n in _plugins.fallback_counts().items()},
        }
        json.dump(out, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
        return 0
    total = len(OPS)
    for row in rows:
        dist = f"{row['distribution']} {row['version']}" if row["distribution"] else "(no distribution)"
        print(f"{row['name']}  [{row['status']}]  {dist}  ({row['module']})")
        if row["hooks"]:
            print(f"    hooks:   {', '.join(h.removeprefix('kiln_register_') for h in row['hooks'])}")
        if row["devices"]:
            print(f"    devices: {', '.join(row['devices'])}")
        for dev, ops in row["op_coverage"].items():
            print(f"    kernels: {dev}: {len(ops)}/{total} ops")
        for ext in row["extensions"]:
            print(f"    provides: {ext['name']} {ext['version']}")
        if row["error"]:
            last = row["error"].strip().splitlines()[-1]
            print(f"    error:   {last}")
            if args.verbose:
                print("    " + row["error"].replace("\n", "\n    "))
    broken = sum(1 for r in rows if r["error"])
    if broken and not args.verbose:
        print(f"\n{broken} plugin(s) failed to load; `kiln plugins --verbose` shows the tracebacks.")
    return 0


def cmd_doctor(args) -> int:
    """Say what is installed, what is missing, and what to install for this machine."""
    import importlib
    import importlib.util
    import os
    import shutil

    from kiln import __version__, _plugins

    print(f"kiln {__version__} on Python {platform.python_version()} ({platform.system()} {platform.machine()})")
    import numpy

    print(f"numpy {numpy.__version__}")
    if importlib.util.find_spec("kiln_cpu") is not None:  # which BLAS runs the products: MKL or OpenBLAS
        try:
            print(f"BLAS: {importlib.import_module('kiln_cpu').blas()}")
        except Exception as exc:  # noqa: BLE001 - report, never crash the doctor
            print(f"BLAS: unknown ({exc!r})")
    plugins = _plugins.plugins()
    devices = _plugins.devices()
    print(f"devices: {', '.join(sorted(devices))}")
    advice = []
    for name, dev in sorted(devices.items()):
        try:
            avail = dev.is_available()
            count = dev.device_count() if avail else 0
        except Exception as exc:  # noqa: BLE001 - report, never crash the doctor
            print(f"  {name}: error asking the plugin: {exc!r}")
            continue
        print(f"  {name}: {'available' if avail else 'not available'}, {count} device(s) (plugin {dev.plugin})")
        report = getattr(dev.module, "kiln_doctor", None)  # a device plugin's own diagnosis
        if report is not None:
            try:
                for kind, text in report():
                    (advice.append(text) if kind == "advice" else print(f"    {text}"))
            except Exception as exc:  # noqa: BLE001 - report, never crash the doctor
                print(f"    error asking the plugin for its diagnosis: {exc!r}")
    exts = _plugins.extensions()
    names = ", ".join(f"{n} {e['version']}" for n, e in sorted(exts.items()))
    print(f"extensions: {names}")
    engines = _plugins.collectives()
    if engines:
        print("collective engines (kiln.distributed backends):")
        usable = []
        for name, engine in sorted(engines.items()):
            try:
                ok = bool(engine.is_available())
            except Exception as exc:  # noqa: BLE001 - report, never crash the doctor
                print(f"  {name}: error asking the plugin: {exc!r}")
                continue
            devs = ", ".join(getattr(engine, "devices", ()))
            print(f"  {name}: {'usable' if ok else 'not usable (its library is missing)'}, for {devs} tensors")
            if ok:
                usable.append(name)
        if not usable:
            advice.append(
                "no collective engine is usable: pip install torch==2.13.0 'kiln-distributed[gloo]' "
                "(Gloo) or 'kiln-distributed[mpi]' (MPI)"
            )
    for p in plugins:
        if p.error:
            advice.append(f"plugin {p.name} ({p.distribution}) failed to load: {p.error.strip().splitlines()[-1]}")
    if "kiln_cpu" not in {p.module.split(":")[0] for p in plugins} and importlib.util.find_spec("kiln_cpu") is None:
        advice.append("install kiln-cpu for fast Numba CPU kernels (pip install kiln-cpu)")
    has_nvidia = shutil.which("nvidia-smi") is not None or os.path.exists("/proc/driver/nvidia/version")
    if has_nvidia and "cuda" not in devices:
        advice.append("an NVIDIA driver is present: install kiln-cuda to use the GPU (pip install kiln-cuda)")
    for feature in ("nn", "data", "amp", "distributed", "compile"):
        if importlib.util.find_spec(f"kiln.{feature}") is None:
            advice.append(f"kiln.{feature} is not installed (pip install kiln-{feature})")
    if os.environ.get("KILN_CPU_FALLBACK") == "1":
        advice.append("KILN_CPU_FALLBACK=1: ops missing on a device run on the CPU (slow, warns once per op)")
    if os.environ.get("KILN_CHECK_KERNELS") == "1":
        advice.append("KILN_CHECK_KERNELS=1: every kernel call's result is checked against its op's spec (slower)")
    if advice:
        print("advice:")
        for a in advice:
            print(f"  - {a}")
    else:
        print("advice: none, everything kiln knows about is installed")
    return 1 if any(p.error for p in plugins) else 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``kiln`` command."""
    parser = argparse.ArgumentParser(prog="kiln", description="kiln: plugins and environment diagnostics")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plugins", help="list plugins, their devices, op coverage and load errors")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("-v", "--verbose", action="store_true", help="show full tracebacks of broken plugins")
    p.set_defaults(func=cmd_plugins)
    d = sub.add_parser("doctor", help="what is installed, what is missing, what to install")
    d.set_defaults(func=cmd_doctor)
    v = sub.add_parser("version", help="print the kiln version")
    v.set_defaults(func=lambda a: print(__import__("kiln").__version__) or 0)
    args = parser.parse_args(argv)
    return args.func(args)
