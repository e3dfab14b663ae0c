"""The plugin as kiln sees it: no Numba at import, kernels registered and narrowed, the small-tensor
threshold, and thread control."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from kiln_cpu_helpers import assert_same, make, reference

import kiln
import kiln_cpu
from kiln import _plugins
from kiln_cpu import config, registry


def _python(code: str, base: dict | None = None, **env) -> str:
    run_env = {**(os.environ if base is None else base), **env}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=run_env, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_import_compiles_nothing_and_never_imports_numba():
    out = _python(
        "import sys, kiln, kiln_cpu, kiln_cpu.plugin; a = 'numba' in sys.modules\n"
        "x = kiln.ones(3, 4); y = (x + x).exp().sum()\n"  # loads the plugins; small: the reference runs
        "from kiln._plugins import kernel_owner\n"
        "print(a, 'numba' in sys.modules, any(m.startswith('kiln_cpu._jit') for m in sys.modules), kernel_owner('add', 'cpu', kiln.float32))"
    )
    assert out == "False False False cpu"


def test_the_first_large_op_compiles_or_loads_from_the_cache():
    out = _python(
        "import sys, kiln\nx = kiln.ones(512, 512)\nimport numpy as np\n"
        "np.testing.assert_array_equal((x + x).numpy(), 2 * np.ones((512, 512), np.float32))\n"
        "print('numba' in sys.modules)"
    )
    assert out == "True"


def test_every_kernel_and_op_code_names_an_op_of_the_core():
    """kiln-cpu keeps no op name the core does not define: a renamed op fails here, naming the stale entry,
    instead of failing the plugin's registration at load."""
    import kiln.backend as kb
    from kiln_cpu import _opcodes, registry

    tables = (
        _opcodes.COMPARISONS,
        _opcodes.UNARY_ARITHMETIC,
        _opcodes.UNARY_FLOATING,
        _opcodes.REDUCTIONS,
        _opcodes.SCANS,
    )
    names = set(registry.kernels()).union(*tables)
    assert names - set(kb.ops()) == set()


def test_kernels_are_registered_narrowed_by_dtype():
    for name, (_kernel, dtypes) in registry.kernels().items():
        for d in dtypes:
            assert _plugins.kernel_owner(name, "cpu", d) == "cpu", (name, d)
    assert _plugins.kernel_owner("add", "cpu", kiln.int8) == _plugins.REFERENCE_PLUGIN
    assert _plugins.kernel_owner("exp", "cpu", kiln.int32) == _plugins.REFERENCE_PLUGIN
    assert _plugins.kernel_owner("div", "cpu", kiln.int64) == _plugins.REFERENCE_PLUGIN


def test_dtypes_kiln_cpu_leaves_out_still_compute(spy):
    for d in (kiln.int8, kiln.uint8, kiln.int16, kiln.bool):
        x = make((4, 5), kiln.float32).to(d)
        for fn in (lambda t: t + t, lambda t: t * 3, lambda t: t == t, lambda t: t.sum()):
            assert_same(fn(x), reference(fn, x))
    assert spy == []


def test_small_tensors_go_to_the_reference(monkeypatch, spy):
    monkeypatch.setattr(config, "min_numel", 1000)
    x = make((10, 10), kiln.float32)
    assert_same(x + x, reference(lambda t: t + t, x))
    assert_same(x.exp(), reference(kiln.exp, x), ulps=4)
    assert_same(x.sum(), reference(kiln.sum, x))
    assert spy == []
    y = make((40, 30), kiln.float32)
    assert_same(y + y, reference(lambda t: t + t, y))
    assert spy == [("binary", 0, "flat")]


def test_disabled_by_kiln_disable_plugins():
    out = _python(
        "import json, kiln\nfrom kiln._plugins import kernel_owner\nprint(json.dumps(kernel_owner('add', 'cpu')))",
        KILN_DISABLE_PLUGINS="cpu",
    )
    assert json.loads(out) == _plugins.REFERENCE_PLUGIN


# ------------------------------------------------------------------------------------------ threads


def test_set_and_get_num_threads(monkeypatch):
    monkeypatch.setattr(kiln_cpu._threads, "_requested", None)
    kiln_cpu.set_num_threads(1)
    assert kiln_cpu.get_num_threads() == 1
    kiln_cpu.set_num_threads(3)
    assert kiln_cpu.get_num_threads() == 3
    x = make((300, 1000), kiln.float32)
    assert_same(x * x, reference(lambda t: t * t, x))
    # the same RuntimeError and message as torch.set_num_threads (and kiln.set_num_threads)
    for bad, message in ((0, "a positive integer"), (-1, "a positive integer"), (2.0, "an int, but got float")):
        for lib in (kiln_cpu, kiln):
            with pytest.raises(RuntimeError, match=f"^set_num_threads expects {message}$"):
                lib.set_num_threads(bad)
    assert kiln_cpu.get_num_threads() == 3  # a rejected count changes nothing


def test_work_is_split_over_the_threads(monkeypatch):
    monkeypatch.setattr(kiln_cpu._threads, "_requested", 3)
    seen = []
    kiln_cpu._threads.parallel(lambda lo, hi: seen.append((lo, hi)), (), 100, 10)
    assert sorted(seen) == [(0, 16), (16, 33), (33, 50), (50, 66), (66, 83), (83, 100)]  # 3 threads, 2 ranges each
    seen.clear()
    kiln_cpu._threads.parallel(lambda lo, hi: seen.append((lo, hi)), (), 1000, 10)
    assert sorted(seen) == [(1000 * i // 6, 1000 * (i + 1) // 6) for i in range(6)]  # 2 ranges per thread
    seen.clear()
    kiln_cpu._threads.parallel(lambda lo, hi: seen.append((lo, hi)), (), 40, 10)
    assert sorted(seen) == [(0, 13), (13, 26), (26, 40)]  # 4 grains: one range per thread
    seen.clear()
    kiln_cpu._threads.parallel(lambda lo, hi: seen.append((lo, hi)), (), 15, 10)
    assert seen == [(0, 15)]

    def boom(lo, hi):
        raise ZeroDivisionError(lo)

    with pytest.raises(ZeroDivisionError):
        kiln_cpu._threads.parallel(boom, (), 100, 10)


def test_concurrent_and_nested_calls_run_on_their_own_thread(monkeypatch):
    """The team runs one job at a time: a second user thread's call, and a call from inside a job, run
    on the calling thread; every range of every call runs exactly once."""
    monkeypatch.setattr(kiln_cpu._threads, "_requested", 2)
    par = kiln_cpu._threads.parallel
    seen: dict[int, list] = {k: [] for k in range(4)}
    nested: list[list] = []

    def outer(tag, lo, hi):
        seen[tag].append((lo, hi))
        inner: list = []
        nested.append(inner)
        par(lambda a, b: inner.append((a, b)), (), 40, 10)

    def tiles(ranges, n):
        r = sorted(ranges)
        return r[0][0] == 0 and r[-1][1] == n and all(a[1] == b[0] for a, b in itertools.pairwise(r))

    callers = [threading.Thread(target=par, args=(outer, (k,), 400, 10)) for k in range(1, 4)]
    for t in callers:
        t.start()
    par(outer, (0,), 400, 10)
    for t in callers:
        t.join(timeout=60)
    assert all(tiles(ranges, 400) for ranges in seen.values())
    assert len(nested) >= 4 and all(tiles(inner, 40) for inner in nested)


def test_a_new_thread_count_replaces_the_team(monkeypatch):
    """Workers of a team of another size exit; the new team serves the calls."""
    monkeypatch.setattr(kiln_cpu._threads, "_requested", 3)
    kiln_cpu._threads.parallel(lambda lo, hi: None, (), 100, 10)
    old = kiln_cpu._threads._team
    kiln_cpu.set_num_threads(2)
    seen = []
    kiln_cpu._threads.parallel(lambda lo, hi: seen.append((lo, hi)), (), 100, 10)
    assert sorted(seen) == [(i, i + 25) for i in range(0, 100, 25)] and kiln_cpu._threads._team is not old
    assert old.run(lambda: seen.append("late")) is False and "late" not in seen  # closed: a caller runs alone
    deadline = time.monotonic() + 30
    while len([t for t in threading.enumerate() if t.name.startswith("kiln-cpu-")]) > 1:
        assert time.monotonic() < deadline, "the old team's workers did not exit"
        time.sleep(0.01)


def test_a_job_whose_caller_stopped_waiting_does_not_count_for_the_next(monkeypatch):
    """A worker still running a job its caller gave up on (an interrupt while waiting) is not counted as
    done with the next job: ``run`` returns only once every worker has run the new one."""
    monkeypatch.setattr(kiln_cpu._threads, "_requested", 2)
    team = kiln_cpu._threads._team_of(1)
    started = threading.Event()

    def slow():
        started.set()
        time.sleep(0.3)

    with team.cond:  # post a job and walk away, as an interrupted caller does
        team.posting = (int(team.posted[0]) + 1, slow)
        team.posted[0] += 1
        team.cond.notify_all()
    assert started.wait(10)
    ran: list[int] = []
    main = threading.get_ident()

    def fast():
        if threading.get_ident() != main:
            time.sleep(0.05)  # the worker's part ends well after the old job's
        ran.append(threading.get_ident())

    assert team.run(fast)
    assert len(ran) == 2 and len(set(ran)) == 2


def test_no_thread_keeps_a_job_after_the_call(monkeypatch):
    """A job's arguments (a kernel's arrays) are free once ``parallel`` returns: no worker holds the job
    until the next one."""
    import weakref

    class Payload:
        pass

    monkeypatch.setattr(kiln_cpu._threads, "_requested", 2)
    for _ in range(20):
        payload = Payload()
        ref = weakref.ref(payload)
        kiln_cpu._threads.parallel(lambda p, lo, hi: time.sleep(1e-4), (payload,), 100, 10)
        del payload
        assert ref() is None


@pytest.mark.parametrize("spin", [0, 1, 4000])
def test_jobs_finish_whichever_thread_waits_first(spin, monkeypatch):
    """Every range runs once and every call returns, whether the caller or a worker is done first and
    whether they spin (no spin: the caller sleeps and the workers wake it) or not."""
    monkeypatch.setattr(kiln_cpu._threads, "_requested", 3)
    monkeypatch.setattr(kiln_cpu._threads, "_SPIN", spin)
    rng = np.random.default_rng(spin)
    delays = rng.choice([0.0, 0.0, 1e-4, 1e-3], size=(100, 6))
    seen: list = []

    def part(k, lo, hi):
        if delays[k, lo // 10]:
            time.sleep(delays[k, lo // 10])
        seen.append((k, lo, hi))

    def calls():
        for k in range(100):
            kiln_cpu._threads.parallel(part, (k,), 60, 10)

    caller = threading.Thread(target=calls, daemon=True)
    caller.start()
    caller.join(timeout=120)
    assert not caller.is_alive(), "a call never returned"
    assert sorted(seen) == [(k, lo, lo + 10) for k in range(100) for lo in range(0, 60, 10)]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_gets_a_pool_of_its_own(monkeypatch):
    monkeypatch.setattr(kiln_cpu._threads, "_requested", 2)
    x = make((600, 1000), kiln.float32)
    expected = reference(lambda t: t * 2, x).numpy()
    np.testing.assert_array_equal((x * 2).numpy(), expected)  # the parent's pool exists now
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only if the kernel runs and is right
        try:
            ok = np.array_equal((x * 2).numpy(), expected, equal_nan=True)
        except BaseException:  # noqa: BLE001 - the child must never return into pytest
            ok = False
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"OMP_NUM_THREADS": "1"}, 1),
        ({"NUMBA_NUM_THREADS": "5"}, 5),
        ({"NUMBA_NUM_THREADS": "5", "OMP_NUM_THREADS": "2"}, 2),  # OMP_NUM_THREADS first, as PyTorch
        ({"MKL_NUM_THREADS": "3", "OMP_NUM_THREADS": "2"}, 3),  # MKL_NUM_THREADS over it, as PyTorch
        ({"OMP_NUM_THREADS": "0", "NUMBA_NUM_THREADS": "4"}, 4),  # not a positive count: skipped
        ({}, None),
    ],
)
def test_thread_default_honours_the_environment(env, expected):
    names = ("MKL_NUM_THREADS", "OMP_NUM_THREADS", "NUMBA_NUM_THREADS")
    base = {k: v for k, v in os.environ.items() if k not in names}
    code = (
        "import os, kiln, kiln_cpu\n"
        "from kiln._threads import default_num_threads\n"
        "print(kiln_cpu.get_num_threads(), kiln.get_num_threads(), default_num_threads(),"
        " len(os.sched_getaffinity(0)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**base, **env}, timeout=120
    )
    assert done.returncode == 0, done.stderr
    ours, through_core, rule, cpus = map(int, done.stdout.split())
    assert ours == through_core == rule == (expected or cpus)  # one rule, the core's


def test_kernels_agree_across_thread_counts(monkeypatch):
    monkeypatch.setattr(kiln_cpu._threads, "_requested", None)
    x = kiln.from_numpy(np.random.default_rng(0).standard_normal((257, 1031)).astype(np.float32))
    results = []
    for n in (1, 2, 3):
        kiln_cpu.set_num_threads(n)
        results.append(((x * 2 + 1).exp().numpy(), x.sum().item(), x.sum(0).numpy(), x.amax(1).numpy()))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_loading_the_kernels_sets_glibcs_malloc_thresholds_unless_the_user_chose():
    """kiln_cpu._malloc: the mmap and trim thresholds are set once the kernels load (not at import), and
    never when the environment sets them or opts out."""
    code = (
        "import kiln, kiln_cpu._malloc as m\nbefore = m._tuned\nkiln.ones(2) + 1\n"
        "import ctypes\nglibc = hasattr(ctypes.CDLL(None), 'gnu_get_libc_version')\nprint(before, m._tuned, glibc)"
    )
    clean = {k: v for k, v in os.environ.items() if "MALLOC" not in k and k != "GLIBC_TUNABLES"}
    before, after, glibc = _python(code, clean).split()
    assert (before, after) == ("None", glibc)
    for extra in (
        {"KILN_CPU_MALLOC_TUNING": "0"},
        {"MALLOC_MMAP_THRESHOLD_": "1048576"},
        {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1048576"},
    ):
        assert _python(code, clean, **extra).split()[:2] == ["None", "False"]
