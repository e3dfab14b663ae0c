"""What a trace reads besides its tensors (kiln.compile._reads): the code it reaches (helpers in any user
module, methods, properties, hooks, partials), the objects that code names (held by modules, globals,
defaults, arguments) and the Python state of its arguments. Changing any of it traces again, and the result
is the eager one; what the code cannot read (a library's internals, a metric the loop calls outside) is
not guarded, so it does not make the call trace again."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.compile


class _Scaler:
    """A callable object (not a module)."""

    def __init__(self):
        self.k = 2.0

    def __call__(self, x):
        return x * self.k


class _Slotted:
    __slots__ = ("k",)

    def __init__(self):
        self.k = 2.0


class _ClassConfig:
    k = 2.0


class _Getter:
    @property
    def k(self):
        return 2.0


class _TaggedList(list):
    pass


class _Holder(kiln.nn.Module):
    """Runs ``read(self, x)``: what it holds is set up by each case."""

    def __init__(self, read, **held):
        super().__init__()
        self.read = read
        for k, v in held.items():
            setattr(self, k, v)

    def forward(self, x):
        return self.read(self, x)


FLAGS: set = set()
PARTS: dict = {}


class _Reader:
    def __init__(self):
        self.k = 2.0

    def get(self):
        return self.k


def _stale_cases():
    """(name, compiled function, change, the value it must then return for ones(64)): each change left the
    old graph running before the guard that catches it. (Each change binds what it changes: ``m`` is
    reassigned case after case.)"""
    import functools

    s = _Scaler()
    yield "a callable object's attribute", kiln.compile(s), lambda: setattr(s, "k", 3.0), 3.0
    m = _Holder(lambda self, x: x * self.cfg.k, cfg=_Slotted())
    yield "a __slots__ attribute", kiln.compile(m), lambda m=m: setattr(m.cfg, "k", 3.0), 3.0
    cls = type("Config", (), {"k": 2.0})  # (a class of its own: the case changes it)
    m = _Holder(lambda self, x: x * self.cfg.k, cfg=cls())
    yield "a held object's class attribute", kiln.compile(m), lambda cls=cls: setattr(cls, "k", 3.0), 3.0
    m = _Holder(lambda self, x: x * self.cfg.k, cfg=_ClassConfig())
    yield "an instance attribute shadowing it", kiln.compile(m), lambda m=m: setattr(m.cfg, "k", 4.0), 4.0
    m = _Holder(lambda self, x: x * self.cfg.k, cfg=_Getter())
    yield "a property replaced", kiln.compile(m), lambda: setattr(_Getter, "k", property(lambda s: 3.0)), 3.0
    m = _Holder(lambda self, x: self.layers[0](x), layers=[kiln.nn.Dropout(0.5).eval()])
    yield "a module in a plain list", kiln.compile(m), lambda m=m: m.layers[0].train(), "dropout"
    m = _Holder(lambda self, x: x * self.cfgs[0].k, cfgs=[_Scaler()])
    yield "an object in a module's list", kiln.compile(m), lambda m=m: setattr(m.cfgs[0], "k", 3.0), 3.0
    m = _Holder(lambda self, x: x * (3.0 if 2 in self.skip else 2.0), skip={1})
    yield "a module's set", kiln.compile(m), lambda m=m: m.skip.add(2), 3.0
    m = _Holder(lambda self, x: x * self.vals[0], vals=_TaggedList([2.0]))
    yield "a list subclass", kiln.compile(m), lambda m=m: m.vals.__setitem__(0, 3.0), 3.0
    f = kiln.compile(lambda x: x * (3.0 if "big" in FLAGS else 2.0))
    yield "a global set", f, lambda: FLAGS.add("big"), 3.0
    m = _Holder(lambda self, x: x * getattr(self, "gain", 2.0))
    yield "an nn.Module class attribute", kiln.compile(m), lambda: setattr(kiln.nn.Module, "gain", 3.0), 3.0
    o = _Scaler()

    def with_default(x, o=o):
        return x * o.k

    yield "a default's attribute", kiln.compile(with_default), lambda: setattr(o, "k", 3.0), 3.0

    def with_defaults(x, k=2.0):
        return x * k

    yield "defaults replaced", kiln.compile(with_defaults), lambda: setattr(with_defaults, "__defaults__", (3.0,)), 3.0
    o2 = _Scaler()
    part = kiln.compile(functools.partial(lambda o, x: x * o.k, o2))
    yield "a partial's bound object", part, lambda: setattr(o2, "k", 3.0), 3.0
    p = functools.partial(lambda x, k: x * k, k=2.0)
    yield "a partial's keyword", kiln.compile(p), lambda: p.keywords.__setitem__("k", 3.0), 3.0
    PARTS["times"] = functools.partial(lambda x, k: x * k, k=2.0)
    f = kiln.compile(lambda x: PARTS["times"](x))
    yield "a global partial's keyword", f, lambda: PARTS["times"].keywords.__setitem__("k", 3.0), 3.0
    cls = type("Config", (), {"k": 2.0})
    PARTS["cls"] = cls
    f = kiln.compile(lambda x: x * PARTS["cls"].k)
    yield "a global class's attribute", f, lambda cls=cls: setattr(cls, "k", 3.0), 3.0
    g = _Reader()
    f = kiln.compile(lambda x: x * g.get())  # "k" is named by get(), read after g was met
    yield "what a method of a global object reads", f, lambda: setattr(g, "k", 3.0), 3.0


@pytest.mark.parametrize("case", list(_stale_cases()), ids=lambda c: c[0])
def test_what_else_a_trace_reads_is_guarded(case):
    _name, f, change, want = case
    x = kiln.ones(64)
    try:
        f(x)
        first = f(x)
        assert kiln.equal(first, x) if want == "dropout" else first.tolist() == [2.0] * 64
        change()
        got = f(x)
        if want == "dropout":  # training: about half the entries dropped, the rest doubled
            assert set(got.unique().tolist()) == {0.0, 2.0}
        else:
            assert got.tolist() == [want] * 64
    finally:
        if "gain" in vars(kiln.nn.Module):
            del kiln.nn.Module.gain
        FLAGS.clear()


LIST_SCALE = 2.0


def test_a_module_kept_in_a_plain_list_is_read_as_a_submodule_is():
    """Its forward's globals and the objects it holds are guarded, not only its state."""

    class Cfg:
        def __init__(self):
            self.k = 1.0

    class Sub(kiln.nn.Module):
        def __init__(self):
            super().__init__()
            self.cfg = Cfg()

        def forward(self, x):
            return x * LIST_SCALE + self.cfg.k

    class Holder(kiln.nn.Module):
        def __init__(self, layers):
            super().__init__()
            self.layers = layers  # a plain list: no submodule

        def forward(self, x):
            return self.layers[0](x)

    global LIST_SCALE
    m = Holder([Sub()])
    cm = kiln.compile(m)
    x = kiln.ones(2)
    cm(x)
    assert cm(x).tolist() == [3.0, 3.0]
    try:
        LIST_SCALE = 3.0
        assert cm(x).tolist() == [4.0, 4.0]
        m.layers[0].cfg.k = 5.0
        assert cm(x).tolist() == [8.0, 8.0]
    finally:
        LIST_SCALE = 2.0


def test_what_the_code_does_not_read_is_not_guarded():
    """State the compiled call never reads must not fail its guards: a logger it calls (its methods are the
    standard library's: not read, or every logger of the process would be guarded), a metric object the
    model holds that the training loop calls outside, an optimizer the model keeps (a scheduler changes
    its learning rate every step), NaN defaults, a set reassigned in another order."""
    import logging

    for i in range(50):
        logging.getLogger(f"kiln-test-lib{i % 5}.sub{i}")
    log = logging.getLogger("kiln-test-model")

    class Meter:
        def __init__(self):
            self.count = 0

        def __call__(self, v):
            self.count += 1

    class Net(kiln.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = kiln.nn.Linear(4, 2)
            self.meter = Meter()
            self.skip = {1, 9}
            self.optimizer = kiln.optim.SGD(self.fc.parameters(), lr=0.1)

        def forward(self, x, fill=float("nan")):
            log.debug("forward")
            return self.fc(x).nan_to_num(fill) * (2.0 if 9 in self.skip else 1.0)

    net = Net()
    sched = kiln.optim.lr_scheduler.StepLR(net.optimizer, 1, 0.5)
    cm = kiln.compile(net)
    x = kiln.randn(3, 4)
    for i in range(10):
        assert kiln.allclose(cm(x), net(x))
        net.meter(1.0)
        net.optimizer.step()  # (no gradients: nothing changes; the scheduler's order check passes)
        sched.step()
        net.skip = {9, 1} if i % 2 else {1, 9}
        logging.getLogger(f"kiln-test-new{i}")
    entry = cm._compiled._entries[0]
    assert cm._compiled.trace_count == 1 and entry.guard.source.count("\n") < 40


def test_what_helpers_hooks_and_other_user_modules_read_is_guarded(tmp_path, monkeypatch):
    """A helper in another user module (``helpers.apply(self, x)``), a forward hook, and a held optimizer's
    learning rate the forward reads: each is read as the function's own code is."""
    import importlib
    import sys

    (tmp_path / "guard_test_helpers_mod.py").write_text("def apply(mod, x):\n    return x * mod.cfg.scale\n")
    pkg = tmp_path / "guard_test_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "utils.py").write_text(
        "FACTOR = 1.0\ndef scale(x):\n    return x * FACTOR\ndef step():\n    return BIG\nBIG = list(range(5000))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    helpers = importlib.import_module("guard_test_helpers_mod")
    utils = importlib.import_module("guard_test_pkg.utils")
    try:
        # a package path (pkg.utils.scale), its global, the function replaced; a function of the same module
        # that only shares a name with an attribute the code reads (opt.step) is not read
        def f(x, opt):
            opt.step()
            return guard_test_pkg.utils.scale(x)

        import guard_test_pkg  # (a closure variable of f)

        opt = kiln.optim.SGD([kiln.zeros(1, requires_grad=True)], lr=0.1)
        cf = kiln.compile(f)
        cf(kiln.ones(2), opt)
        assert cf(kiln.ones(2), opt).tolist() == [1.0, 1.0] and cf._entries[0].forward is not None
        utils.FACTOR = 3.0
        assert cf(kiln.ones(2), opt).tolist() == [3.0, 3.0]
        utils.scale = lambda x: x * 10
        assert cf(kiln.ones(2), opt).tolist() == [10.0, 10.0]

        class Cfg:
            scale = 2.0

        class Net(kiln.nn.Module):
            def __init__(self):
                super().__init__()
                self.cfg = Cfg()
                self.table = np.array([1.0])
                self.fc = kiln.nn.Linear(2, 2)
                self.opt = kiln.optim.SGD(self.fc.parameters(), lr=0.1)

            def forward(self, x):
                return helpers.apply(self, x) * self.opt.param_groups[0]["lr"]

        net = Net()
        net.register_forward_hook(lambda mod, args, out: out * float(mod.table[0]))
        cm = kiln.compile(net)
        x = kiln.ones(2)
        cm(x)
        assert kiln.allclose(cm(x), net(x))
        net.cfg.scale = 5.0
        assert kiln.allclose(cm(x), kiln.full((2,), 0.5))
        net.table[0] = 3.0
        assert kiln.allclose(cm(x), kiln.full((2,), 1.5))
        net.opt.param_groups[0]["lr"] = 1.0
        assert kiln.allclose(cm(x), kiln.full((2,), 15.0))
    finally:
        for name in ("guard_test_helpers_mod", "guard_test_pkg", "guard_test_pkg.utils"):
            sys.modules.pop(name, None)


def test_hooks_that_are_objects_are_read():
    import functools

    class Scale:
        def __init__(self):
            self.k = 1.0

        def __call__(self, mod, args, out):
            return out * self.k

    state = {"k": 1.0}
    sc = Scale()
    lin = kiln.nn.Linear(2, 2)
    lin.register_forward_hook(sc)
    lin.register_forward_hook(functools.partial(lambda mod, args, out, f: out * f["k"], f=state))
    cm = kiln.compile(lin)
    x = kiln.ones(2)
    cm(x)
    assert kiln.allclose(cm(x), lin(x))
    sc.k = 5.0
    assert kiln.allclose(cm(x), lin(x))
    state["k"] = 3.0
    assert kiln.allclose(cm(x), lin(x)) and cm._compiled.trace_count == 3


def test_nan_arguments_and_odd_objects_keep_one_trace():
    """NaN compares as NaN; a logger argument (its cache fills on first use) and an object whose
    ``__getattr__`` raises ``KeyError`` neither make the call eager nor crash it."""
    import logging

    class Odd:
        __slots__ = ("k",)

        def __init__(self):
            self.k = 2.0

        def __getattr__(self, name):
            raise KeyError(name)

    log = logging.getLogger("kiln-test-arg-logger")
    odd = Odd()

    def f(x, fill, log, o):
        log.info("step")
        return x.nan_to_num(fill) * o.k

    cf = kiln.compile(f)
    x = kiln.tensor([float("nan"), 1.0])
    for fill in (float("nan"), np.float64("nan")):
        for _ in range(4):
            assert cf(x, fill, log, odd).tolist()[1] == 2.0
    assert cf.trace_count == 2 and all(e.forward is not None for e in cf._entries)


PARTIAL_SCALE = 1.0
loss = None  # a global named like a dict key the compiled code uses (see the test below)


def _scaled(x, alpha):
    return x * alpha * PARTIAL_SCALE


def test_a_partial_a_module_holds_is_read_and_a_string_is_no_global_read():
    """A ``functools.partial`` kept as ``self.act``: its bound keywords and the globals its function reads
    are guarded. A string constant (``out["loss"]``) is no read of the global of that name, which the
    training loop reassigns every call."""
    import functools

    global PARTIAL_SCALE, loss

    class Net(kiln.nn.Module):
        def __init__(self):
            super().__init__()
            self.act = functools.partial(_scaled, alpha=1.0)

        def forward(self, x):
            out = {"loss": self.act(x)}
            return out["loss"]

    net = Net()
    cm = kiln.compile(net)
    x = kiln.ones(2)
    try:
        for _ in range(3):
            loss = cm(x)
        assert loss.tolist() == [1.0, 1.0] and cm._compiled.trace_count == 1
        PARTIAL_SCALE = 2.0
        assert cm(x).tolist() == [2.0, 2.0]
        net.act.keywords["alpha"] = 3.0
        assert cm(x).tolist() == [6.0, 6.0] and cm._compiled.trace_count == 3
    finally:
        PARTIAL_SCALE, loss = 1.0, None


def test_kiln_itself_is_not_read_as_user_code():
    """``kiln.nn.functional.relu(x)`` in the compiled code: kiln's modules (an editable install lives
    outside the installed packages' directories too) are not walked, so no guard reads ``kiln.nn``."""
    cf = kiln.compile(lambda x: kiln.nn.functional.relu(x) * 2)
    cf(kiln.ones(2))
    cf(kiln.ones(2))
    assert "'functional'" not in cf._entries[0].guard.source and "'nn'" not in cf._entries[0].guard.source
