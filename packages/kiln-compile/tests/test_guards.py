"""One test per guard: changing the guarded thing traces again, and the result is the eager one."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.compile

SCALE = 2.0


def _calls(f, *args, **kwargs):
    """Call twice (trace, then replay) and return the last result."""
    f(*args, **kwargs)
    return f(*args, **kwargs)


def test_shape_dtype_and_strides():
    f = kiln.compile(lambda x: x * 3)
    _calls(f, kiln.ones(2, 3))
    assert f.trace_count == 1
    assert kiln.equal(_calls(f, kiln.ones(3, 3)), kiln.full((3, 3), 3.0)) and f.trace_count == 2
    out = _calls(f, kiln.ones(2, 3, dtype=kiln.float64))
    assert out.dtype == kiln.float64 and f.trace_count == 3
    t = kiln.arange(6.0).reshape(2, 3).t()
    assert kiln.equal(_calls(f, t), t * 3) and f.trace_count == 4
    offset = kiln.arange(8.0)[2:8].reshape(2, 3)
    assert kiln.equal(_calls(f, offset), offset * 3) and f.trace_count == 5


def test_requires_grad_and_grad_mode():
    f = kiln.compile(lambda x: (x * x).sum())
    x = kiln.ones(3)
    _calls(f, x)
    xr = kiln.ones(3, requires_grad=True)
    y = _calls(f, xr)
    assert f.trace_count == 2 and y.requires_grad
    y.backward()
    assert kiln.equal(xr.grad, kiln.full((3,), 2.0))
    with kiln.no_grad():
        y = _calls(f, xr)
    assert f.trace_count == 3 and not y.requires_grad


def test_python_scalar_argument():
    f = kiln.compile(lambda x, k: x * k)
    assert _calls(f, kiln.ones(2), 2).tolist() == [2.0, 2.0]
    assert _calls(f, kiln.ones(2), 5).tolist() == [5.0, 5.0]
    assert _calls(f, kiln.ones(2), 5.0).tolist() == [5.0, 5.0] and f.trace_count == 3  # int and float differ


def test_global_constant_is_not_baked_in():
    global SCALE

    def f(x):
        return x * SCALE

    cf = kiln.compile(f)
    assert _calls(cf, kiln.ones(2)).tolist() == [2.0, 2.0]
    SCALE = 3.0
    try:
        assert cf(kiln.ones(2)).tolist() == [3.0, 3.0] and cf.trace_count == 2
    finally:
        SCALE = 2.0


def test_closure_constant_is_not_baked_in():
    k = 2.0

    def f(x):
        return x + k

    cf = kiln.compile(f)
    assert _calls(cf, kiln.zeros(1)).tolist() == [2.0]
    k = 4.0
    assert cf(kiln.zeros(1)).tolist() == [4.0] and cf.trace_count == 2


WEIGHT = kiln.ones(3)
FACTORS = [2.0]
HELPER_SCALE = 5.0
NP_TABLE = np.array([1.0, 2.0, 3.0], np.float32)


class _Config:
    pass


CONFIG = _Config()
CONFIG.k = 3.0


def _helper(x):
    return x * HELPER_SCALE


def test_what_the_code_reads_beyond_its_own_names_is_guarded():
    """Found by review, each reused stale before: a tensor global rebound, a number read from a global list,
    a plain object's attribute, a global read by a helper function, a NumPy array changed in place."""
    global WEIGHT, HELPER_SCALE
    cases = [
        (lambda x: x * WEIGHT, lambda: globals().__setitem__("WEIGHT", kiln.full((3,), 7.0))),
        (lambda x: x * FACTORS[0], lambda: FACTORS.__setitem__(0, 9.0)),
        (lambda x: x * CONFIG.k, lambda: setattr(CONFIG, "k", 11.0)),
        (lambda x: _helper(x) + 1, lambda: globals().__setitem__("HELPER_SCALE", 13.0)),
        (lambda x: x + kiln.from_numpy(NP_TABLE), lambda: NP_TABLE.__setitem__(1, 20.0)),
    ]
    saved = (WEIGHT, list(FACTORS), CONFIG.k, HELPER_SCALE, NP_TABLE.copy())
    try:
        for f, change in cases:
            cf = kiln.compile(f)
            x = kiln.ones(3)
            _calls(cf, x)
            change()
            assert kiln.equal(cf(x), f(x)) and cf.trace_count == 2
    finally:
        WEIGHT, HELPER_SCALE = saved[0], saved[3]
        FACTORS[:] = saved[1]
        CONFIG.k = saved[2]
        NP_TABLE[:] = saved[4]


def test_an_arguments_attributes_are_guarded():
    class Options:
        pass

    def f(x, opts):
        return x * opts.scale

    cf = kiln.compile(f)
    opts = Options()
    opts.scale = 2.0
    assert _calls(cf, kiln.ones(2), opts).tolist() == [2.0, 2.0]
    opts.scale = 4.0
    assert cf(kiln.ones(2), opts).tolist() == [4.0, 4.0] and cf.trace_count == 2


def test_python_side_effects_run_only_while_tracing():
    """A compiled call replays the graph, not the Python around it: a list the function appends to grows
    while tracing only, and (guarded by its entries) makes the next call trace again."""
    log = []

    def f(x):
        log.append(1.0)
        return x * 2.0

    cf = kiln.compile(f)
    cf(kiln.ones(2))
    cf(kiln.ones(2))
    assert cf.trace_count == 2 and log == [1.0, 1.0]


def test_a_flag_in_a_global_list_steers_python_control_flow():
    def f(x):
        return x * 3.0 if "triple" in MODES else x * 2.0

    cf = kiln.compile(f)
    MODES[:] = ["double"]
    try:
        assert _calls(cf, kiln.ones(1)).tolist() == [2.0]
        MODES[:] = ["triple"]
        assert cf(kiln.ones(1)).tolist() == [3.0]
    finally:
        MODES[:] = ["double"]


MODES = ["double"]


def test_a_huge_container_runs_eagerly_with_the_reason():
    big = list(range(10_000))

    def f(x):
        return x * float(len(big))

    cf = kiln.compile(f)
    assert _calls(cf, kiln.ones(1)).tolist() == [10_000.0]
    assert "cannot be guarded" in cf._entries[0].reason


def test_module_training_flag_attribute_and_parameter_identity():
    class Scaled(kiln.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = kiln.nn.Linear(3, 3)
            self.drop = kiln.nn.Dropout(0.5)
            self.scale = 1.0

        def forward(self, x):
            return self.drop(self.lin(x)) * self.scale

    m = Scaled()
    cm = kiln.compile(m)
    x = kiln.randn(64, 3)  # 192 outputs: dropout at 0.5 zeroes none of them once in 2^192 calls
    m.eval()
    want = m.lin(x)
    assert kiln.allclose(_calls(cm, x), want)
    m.scale = 2.0
    assert kiln.allclose(cm(x), want * 2) and cm._compiled.trace_count == 2
    m.train()
    out = cm(x)
    assert cm._compiled.trace_count == 3 and (out == 0).any()  # dropout is on again
    m.eval()
    m.lin.weight = kiln.nn.Parameter(kiln.zeros(3, 3))  # a new parameter object, not the traced one
    assert kiln.allclose(cm(x), m.lin.bias.expand(64, 3) * 2)


def test_default_dtype_and_autocast():
    f = kiln.compile(lambda x: x + kiln.ones(2))
    _calls(f, kiln.zeros(2, dtype=kiln.float64))
    kiln.set_default_dtype(kiln.float64)
    try:
        f(kiln.zeros(2, dtype=kiln.float64))
    finally:
        kiln.set_default_dtype(kiln.float32)
    assert f.trace_count == 2
    pytest.importorskip("kiln.amp")
    g = kiln.compile(lambda a, b: a @ b)
    a = kiln.randn(4, 4)
    _calls(g, a, a)
    with kiln.autocast("cpu", dtype=kiln.bfloat16):
        out = _calls(g, a, a)
    assert out.dtype == kiln.bfloat16 and g.trace_count == 2


def test_list_dict_and_keyword_structure():
    f = kiln.compile(lambda xs, d, *, k=1: xs[0] + xs[1] * d["w"] * k)
    a, b, w = kiln.ones(2), kiln.ones(2), kiln.full((2,), 3.0)
    assert _calls(f, [a, b], {"w": w}).tolist() == [4.0, 4.0]
    assert _calls(f, [a, b], {"w": w}, k=2).tolist() == [7.0, 7.0] and f.trace_count == 2
    assert _calls(f, (a, b), {"w": w}).tolist() == [4.0, 4.0] and f.trace_count == 3  # tuple, not list
    assert _calls(f, [a, b, a], {"w": w}).tolist() == [4.0, 4.0] and f.trace_count == 4


def test_inputs_sharing_memory():
    def f(a, b):
        a.add_(1)
        return b * 1

    cf = kiln.compile(f)
    x = kiln.zeros(2)
    cf(x, x)
    cf(x, x)
    y = kiln.zeros(2)
    out = cf(y, kiln.zeros(2))  # distinct tensors: b no longer sees a's write
    assert out.tolist() == [0.0, 0.0] and cf.trace_count == 2
    assert x.tolist() == [2.0, 2.0]


def test_tensor_read_by_reference_changes_shape():
    w = kiln.ones(3)
    f = kiln.compile(lambda x: x * w)
    _calls(f, kiln.ones(3))
    w.resize_(1)  # same object, new shape: the trace's spec no longer holds
    assert f(kiln.full((3,), 2.0)).tolist() == [2.0, 2.0, 2.0] and f.trace_count == 2


def test_value_read_into_python_is_guarded():
    def f(x):
        if x.sum() > 0:
            return x * 2
        return x * -1

    cf = kiln.compile(f)
    assert _calls(cf, kiln.ones(2)).tolist() == [2.0, 2.0]
    assert cf.trace_count == 1
    assert cf(-kiln.ones(2)).tolist() == [1.0, 1.0] and cf.trace_count == 2
    assert cf(kiln.ones(2)).tolist() == [2.0, 2.0] and cf.trace_count == 2  # both branches are cached


def test_fullgraph_raises_at_the_line():
    def f(x):
        return x * 2 if x.sum() > 0 else x  # the line named

    with pytest.raises(kiln.compile.GraphBreakError, match=r"test_guards.py:\d+ \(in f\)"):
        kiln.compile(f, fullgraph=True)(kiln.ones(2))


def test_cache_size_limit_then_eager_with_a_warning(monkeypatch):
    monkeypatch.setattr(kiln.compile.config, "cache_size_limit", 2)
    f = kiln.compile(lambda x: x + 1, dynamic=False)  # (with dynamic=None, other shapes do not count: test_dynamic)
    f(kiln.ones(1))
    f(kiln.ones(2))
    with pytest.warns(UserWarning, match="traced 2 times"):
        out = f(kiln.ones(3))
    assert out.tolist() == [2.0, 2.0, 2.0] and f.trace_count == 2


def test_guard_failures_are_named():
    f = kiln.compile(lambda x: x + 1)
    f(kiln.ones(2))
    (entry,) = f._entries
    assert entry.guard.failures((kiln.ones(3),), {}) == [
        "args[0]: Tensor kiln.float32 on cpu, shape [2], strides (1,), offset 0, requires_grad=False"
    ]


def test_the_entry_that_served_last_is_tried_first():
    f = kiln.compile(lambda x: x * 2)
    small, large = kiln.ones(2), kiln.ones(3)
    _calls(f, small)
    (first,) = f._entries
    f(large)  # traced: a second entry, tried after the first
    second = f._entries[1]
    assert f._entries == [first, second]
    assert f(large).tolist() == [2.0, 2.0, 2.0] and f._entries == [second, first]
    assert f(large).tolist() == [2.0, 2.0, 2.0] and f._entries == [second, first]
    assert f(small).tolist() == [2.0, 2.0] and f._entries == [first, second] and f.trace_count == 2


def test_a_module_trees_state_is_tested_after_the_cheap_guards():
    from kiln.compile._guards import ModuleStateGuard

    m = kiln.nn.Sequential(kiln.nn.Linear(2, 2), kiln.nn.ReLU())
    cm = kiln.compile(m)
    _calls(cm, kiln.ones(1, 2))
    (entry,) = cm._compiled._entries
    (name,) = [k for k, v in entry.guard.__globals__.items() if isinstance(v, ModuleStateGuard)]
    tests = [line.strip() for line in entry.guard.source.splitlines() if line.strip().startswith("if not")]
    assert len(tests) > 3 and tests[-1].startswith(f"if not ({name}("), entry.guard.source
    assert not any(t.startswith(f"if not ({name}(") for t in tests[:-1])


def test_a_tensor_attribute_replaced_re_traces():
    """A tensor kept as a plain attribute (neither parameter nor buffer: a mask, a positional table) is read
    by reference: another tensor put there re-traces, never the old one's graph (which read the old one)."""

    class Masked(kiln.nn.Module):
        def __init__(self):
            super().__init__()
            self.mask = kiln.ones(3)

        def forward(self, x):
            return x * self.mask

    m = Masked()
    cm = kiln.compile(m)
    x = kiln.ones(3)
    assert _calls(cm, x).tolist() == [1.0] * 3
    m.mask.mul_(3)  # the same tensor, new values: read by reference, no new trace
    assert cm(x).tolist() == [3.0] * 3 and cm._compiled.trace_count == 1
    m.mask = kiln.full((3,), 2.0)
    assert cm(x).tolist() == [2.0] * 3 and cm._compiled.trace_count == 2


@pytest.mark.parametrize("kind", ["hook", "post-accumulate hook"])
def test_a_hook_on_a_parameter_re_traces_a_step_that_runs_backward(kind):
    """A whole training step runs backward inside the trace, so the hooks its parameters had then are in its
    graph: one registered later (or removed) traces again, and runs as eagerly."""
    lin = kiln.nn.Linear(2, 1)
    opt = kiln.optim.SGD(lin.parameters(), lr=0.1)

    def step(x):
        opt.zero_grad()
        lin(x).sum().backward()
        opt.step()

    cs = kiln.compile(step)
    x = kiln.ones(4, 2)
    _calls(cs, x)
    traces = cs.trace_count
    before = lin.weight.detach().clone()
    if kind == "hook":
        handle = lin.weight.register_hook(lambda g: g * 0)
    else:
        handle = lin.weight.register_post_accumulate_grad_hook(lambda p: p.grad.zero_())
    cs(x)
    assert kiln.equal(lin.weight, before) and cs.trace_count == traces + 1
    handle.remove()
    cs(x)
    assert not kiln.equal(lin.weight, before)


@pytest.mark.parametrize(
    "change", ["list replaced", "list entry set", "dict entry set", "tuple replaced", "sizes", "nested"]
)
def test_a_modules_own_containers_are_guarded_by_their_entries(change):
    """Tensors a module keeps in its own list, tuple or dict are read by reference, and numbers there by
    value: another entry (set in place or in a new container) traces again."""

    class Held(kiln.nn.Module):
        def __init__(self):
            super().__init__()
            self.masks = [kiln.ones(3)]
            self.table = {"scale": kiln.ones(3)}
            self.pair = (kiln.ones(3), kiln.ones(3))
            self.sizes = [3]
            self.nested = {"a": [kiln.ones(3)]}

        def forward(self, x):
            out = x * self.masks[0] * self.table["scale"] * self.pair[1] + self.sizes[0]
            return out * self.nested["a"][0]

    m = Held()
    cm = kiln.compile(m)
    x = kiln.ones(3)
    assert _calls(cm, x).tolist() == [4.0] * 3
    two = kiln.full((3,), 2.0)
    if change == "list replaced":
        m.masks = [two]
    elif change == "list entry set":
        m.masks[0] = two
    elif change == "dict entry set":
        m.table["scale"] = two
    elif change == "tuple replaced":
        m.pair = (m.pair[0], two)
    elif change == "nested":
        m.nested["a"][0] = two
    else:
        m.sizes[0] = 2
    assert cm(x).tolist() == m(x).tolist() and cm._compiled.trace_count == 2


@pytest.mark.parametrize("change", ["class attribute", "method on the class", "forward on the instance", "function"])
def test_code_and_class_attributes_a_module_runs_are_guarded(change):
    """What a module's forward runs besides its instance's values: a class attribute, a method replaced on
    the class or the instance, a function kept as an attribute. Each changed after the trace traces again."""

    class Scaled(kiln.nn.Module):
        scale = 1.0

        def __init__(self):
            super().__init__()
            self.act = kiln.relu

        def forward(self, x):
            return self.act(x) * self.scale

    m = Scaled()
    cm = kiln.compile(m)
    x = kiln.tensor([-1.0, 2.0])
    assert _calls(cm, x).tolist() == [0.0, 2.0]
    if change == "class attribute":
        Scaled.scale = 3.0
    elif change == "method on the class":
        Scaled.forward = lambda self, x: x * 5
    elif change == "forward on the instance":
        m.forward = lambda x: x * 5
    else:
        m.act = kiln.tanh
    assert cm(x).tolist() == m(x).tolist() and cm._compiled.trace_count == 2


def test_a_compiled_method_of_a_plain_object_guards_what_it_reads_of_self():
    class Scaler:
        def __init__(self):
            self.k = 2.0
            self.offset = kiln.zeros(2)

        def run(self, x):
            return x * self.k + self.offset

    o = Scaler()
    cr = kiln.compile(o.run)
    x = kiln.ones(2)
    assert _calls(cr, x).tolist() == [2.0, 2.0]
    o.k = 4.0
    assert cr(x).tolist() == [4.0, 4.0]
    o.offset = kiln.ones(2)
    assert cr(x).tolist() == [5.0, 5.0] and cr.trace_count == 3


def test_module_state_a_forward_stores_settles_or_stays_cheap():
    """A forward that stores its input's shape settles after two traces (sizes compare by value); a huge
    list attribute is compared by identity and length, not entry by entry on every call; a module class
    that cannot be hashed is guarded too; the guard keeps the parameters whose identities it compares
    alive (a new parameter cannot take a replaced one's id)."""
    import weakref

    class Shaped(kiln.nn.Module):
        def __init__(self):
            super().__init__()
            self.vocab = list(range(20_000))
            self.weight = kiln.nn.Parameter(kiln.ones(3))

        def forward(self, x):
            self.in_shape = x.shape
            return x * self.weight.shape[0]

    m = Shaped()
    cm = kiln.compile(m)
    for _ in range(4):
        cm(kiln.ones(2, 3))
    assert cm._compiled.trace_count == 2
    m.vocab = list(range(20_001))
    cm(kiln.ones(2, 3))
    assert cm._compiled.trace_count == 3
    m.vocab.append(0)  # in place: its length
    cm(kiln.ones(2, 3))
    assert cm._compiled.trace_count == 4
    old = weakref.ref(m.weight)
    m.weight = kiln.nn.Parameter(kiln.ones(7))
    assert old() is not None  # held by the guards, so its id stays its own
    assert cm(kiln.ones(2, 3)).tolist() == m(kiln.ones(2, 3)).tolist()

    class Meta(type(kiln.nn.Module)):
        def __eq__(cls, other):
            return cls is other

    class Unhashable(kiln.nn.Module, metaclass=Meta):
        def forward(self, x):
            return x * 2

    assert _calls(kiln.compile(Unhashable()), kiln.ones(2)).tolist() == [2.0, 2.0]


def test_a_hook_registered_after_a_forward_only_trace_runs_once_without_a_new_trace():
    lin = kiln.nn.Linear(3, 2)
    cm = kiln.compile(lin)
    x = kiln.ones(4, 3)
    for _ in range(2):
        cm(x).sum().backward()
    calls = []
    lin.weight.register_hook(lambda g: calls.append(1))
    cm(x).sum().backward()
    assert calls == [1] and cm._compiled.trace_count == 1


SUBMODULE_SCALE = 1.0


def test_what_a_submodules_helper_method_reads_and_a_parameters_dtype_are_guarded():
    """A global read in a helper method of a user's submodule class (not in any forward's own text), and a
    parameter no op reads whose dtype the code reads in Python: both changed after the trace trace again."""
    global SUBMODULE_SCALE

    class Inner(kiln.nn.Module):
        def forward(self, x):
            return self.helper(x)

        def helper(self, x):
            return x * SUBMODULE_SCALE

    class Outer(kiln.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()
            self.w = kiln.nn.Parameter(kiln.ones(2))

        def forward(self, x):
            return self.inner(x).to(self.w.dtype)

    m = Outer()
    cm = kiln.compile(m)
    x = kiln.ones(2)
    try:
        assert _calls(cm, x).tolist() == [1.0, 1.0]
        SUBMODULE_SCALE = 3.0
        assert cm(x).tolist() == [3.0, 3.0]
        m.double()
        assert cm(x).dtype is kiln.float64 and cm._compiled.trace_count == 3
    finally:
        SUBMODULE_SCALE = 1.0


def test_objects_a_module_holds_are_guarded_inside():
    """A config object a module holds (its attributes the code names) and a NumPy array (its values), both
    changed in place after the trace, trace again."""

    class Config:
        def __init__(self):
            self.scale = 1.0

    class Held(kiln.nn.Module):
        def __init__(self):
            super().__init__()
            self.cfg = Config()
            self.arr = np.ones(2, np.float32)

        def forward(self, x):
            return x * self.cfg.scale + float(self.arr[0])

    m = Held()
    cm = kiln.compile(m)
    x = kiln.ones(2)
    assert _calls(cm, x).tolist() == [2.0, 2.0]
    m.cfg.scale = 3.0
    assert cm(x).tolist() == [4.0, 4.0]
    m.arr[0] = 5.0
    assert cm(x).tolist() == [8.0, 8.0] and cm._compiled.trace_count == 3


def test_a_parameter_added_to_an_optimizers_group_re_traces():
    a, b = kiln.nn.Linear(2, 1), kiln.nn.Linear(2, 1)
    opt = kiln.optim.SGD(a.parameters(), lr=0.1)

    def step(x):
        opt.zero_grad()
        (a(x).sum() + b(x).sum()).backward()
        opt.step()

    cs = kiln.compile(step)
    x = kiln.ones(4, 2)
    _calls(cs, x)
    traces = cs.trace_count
    opt.param_groups[0]["params"].append(b.weight)
    before = b.weight.detach().clone()
    cs(x)
    assert cs.trace_count == traces + 1 and not kiln.equal(b.weight, before)


def test_a_tensor_learning_rate_replaced_re_traces():
    w = kiln.nn.Parameter(kiln.ones(3))
    opt = kiln.optim.Adam([w], lr=kiln.tensor(0.1))

    def step():
        opt.zero_grad()
        (w * w).sum().backward()
        opt.step()

    cs = kiln.compile(step)
    for _ in range(3):
        cs()
    traces, before = cs.trace_count, w.detach().clone()
    opt.param_groups[0]["lr"] = kiln.tensor(100.0)
    cs()
    assert cs.trace_count == traces + 1 and float((before - w).min()) > 50


def test_the_module_guard_compares_identities_first_then_values():
    from kiln.compile._guards import ModuleStateGuard

    m = kiln.nn.Sequential(kiln.nn.Linear(2, 2), kiln.nn.Dropout(0.25))
    guard = ModuleStateGuard(m)
    assert guard(m)
    m[1].p = float("0.25")  # an equal new number: not the same object, the same state
    assert guard(m)
    m[1].p = 0.5
    assert not guard(m)
    m[1].p = 0.25
    m[0].register_forward_hook(lambda *a: None)
    assert not guard(m)
    m2 = kiln.nn.Sequential(kiln.nn.Linear(2, 2), kiln.nn.Dropout(0.25))
    guard2 = ModuleStateGuard(m2)
    m2.add_module("extra", kiln.nn.ReLU())
    assert not guard2(m2)
    del m2.extra
    assert guard2(m2)
    m2[0].weight = kiln.nn.Parameter(kiln.zeros(2, 2))
    assert not guard2(m2)
    m3 = kiln.nn.Linear(2, 2)
    m3.vocab = list(range(5000))  # more entries than are compared one by one: its length is
    guard3 = ModuleStateGuard(m3)
    assert guard3(m3)
    m3.vocab.append(0)
    assert not guard3(m3)
    m4 = kiln.nn.Sequential(kiln.nn.Linear(2, 2), kiln.nn.ReLU())
    tag = object()
    m4.tag = tag
    guard4 = ModuleStateGuard(m4)
    del m4.tag
    m4.label = tag  # the same object under another name
    assert not guard4(m4)
    del m4.label
    m4.tag = tag
    assert guard4(m4)
    assert not guard4(kiln.nn.Sequential(kiln.nn.Linear(2, 2), kiln.nn.ReLU()))  # another tree given
    m4[0].register_buffer("extra", kiln.zeros(1))  # a buffer added to a submodule's dict
    assert not guard4(m4)
    del m4[0]._buffers["extra"]
    assert guard4(m4)
    m4[0] = kiln.nn.Linear(2, 2)  # another submodule, with other parameters
    assert not guard4(m4)
    m5 = kiln.nn.Sequential(kiln.nn.Linear(2, 2), kiln.nn.Dropout(0.25))
    guard5 = ModuleStateGuard(m5)
    m5[1].__dict__ = dict(m5[1].__dict__, p=0.5)  # a __dict__ replaced whole
    assert not guard5(m5)
    m6 = kiln.nn.Linear(2, 2)
    m6.register_forward_hook(lambda *a: None)
    guard6 = ModuleStateGuard(m6)
    (key,) = m6._forward_hooks
    m6._forward_hooks[key] = lambda *a: None  # another hook under the same key
    assert not guard6(m6)


def test_a_guard_that_passed_by_value_records_the_new_identities(monkeypatch):
    """After a change that leaves the state equal (an equal new number), the next calls pass by identity
    again, without comparing the whole state."""
    from kiln.compile import _guards

    calls = []
    for name in ("module_state", "optimizer_state"):
        real = getattr(_guards, name)
        monkeypatch.setattr(_guards, name, lambda obj, real=real, name=name: calls.append(name) or real(obj))
    m = kiln.nn.Sequential(kiln.nn.Linear(2, 2), kiln.nn.Dropout(0.25))
    opt = kiln.optim.SGD(m.parameters(), lr=0.1)
    guards = _guards.ModuleStateGuard(m), _guards.OptimizerStateGuard(opt)
    m[1].p = float("0.25")
    opt.param_groups[0]["lr"] = float("0.1")
    calls.clear()
    for _ in range(3):
        assert guards[0](m) and guards[1](opt)
    assert calls == ["module_state", "optimizer_state"]  # by value once, then by identity


def test_the_optimizer_guard_compares_identities_first_then_values():
    from kiln.compile._guards import OptimizerStateGuard

    w, b = kiln.zeros(3, requires_grad=True), kiln.zeros(1, requires_grad=True)
    opt = kiln.optim.Adam([w], lr=0.1)
    w.grad = kiln.ones(3)
    opt.step()  # state: step, exp_avg, exp_avg_sq
    guard = OptimizerStateGuard(opt)
    assert guard(opt)
    opt.param_groups[0]["lr"] = float("0.1")  # an equal new number: the same state
    assert guard(opt)
    opt.param_groups[0]["lr"] = 0.2
    assert not guard(opt)
    opt.param_groups[0]["lr"] = 0.1
    assert guard(opt)
    opt.state = dict(opt.state)  # another dict holding the same per-parameter states
    assert guard(opt)
    old = opt.state[w]["exp_avg"]
    opt.state[w]["exp_avg"] = old.clone()  # another state tensor
    assert not guard(opt)
    opt.state[w]["exp_avg"] = old
    assert guard(opt)
    opt.param_groups[0]["params"].append(b)  # a parameter appended to a group
    assert not guard(opt)
    opt.param_groups[0]["params"].pop()
    assert guard(opt)
    assert not guard(kiln.optim.Adam([w], lr=0.1))  # another optimizer (no state yet)


def test_a_compiled_module_whose_dict_is_replaced_traces_again():
    class Scaled(kiln.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = 2.0

        def forward(self, x):
            return x * self.scale

    m = Scaled()
    compiled = kiln.compile(m)
    compiled(kiln.ones(2))
    compiled(kiln.ones(2))
    m.__dict__ = dict(m.__dict__, scale=5.0)
    assert compiled(kiln.ones(2)).tolist() == [5.0, 5.0]


def test_module_state_reads_the_tree_as_modules_does():
    from kiln.compile._guards import _plain, _submodules

    shared = kiln.nn.Linear(2, 2)
    inner = kiln.nn.Sequential(shared, kiln.nn.Tanh())
    tree = kiln.nn.Sequential(inner, shared, kiln.nn.ModuleList([kiln.nn.ReLU(), inner]))
    tree.add_module("absent", None)
    assert _submodules(tree) == list(tree.modules())

    import collections
    import enum

    class Mode(enum.IntEnum):
        A = 1

    assert _plain(3) and _plain(Mode.A) and _plain((1, ("a", kiln.float32))) and _plain(kiln.device("cpu"))
    assert (
        not _plain(collections.OrderedDict()) and not _plain([1]) and not _plain((1, [2])) and not _plain(kiln.ones(1))
    )


def test_an_entry_moved_to_the_front_keeps_what_another_thread_traced_meanwhile():
    import threading
    import time

    f = kiln.compile(lambda x: x * 2)
    f(kiln.ones(2))
    f(kiln.ones(3))
    first, _ = f._entries
    guard, started = first.guard, threading.Event()

    def slow_guard(args, kwargs):  # the other thread's call stops inside the first entry's guard
        if threading.current_thread().name == "slow":
            started.set()
            time.sleep(0.3)
        return guard(args, kwargs)

    first.guard = slow_guard
    slow = threading.Thread(target=lambda: f(kiln.ones(3)), name="slow")
    slow.start()
    assert started.wait(10)
    f(kiln.ones(4))  # traced while the slow call holds the old list
    slow.join(10)
    assert len(f._entries) == 3 and f._entries[0].guard((kiln.ones(3),), {}) is not None
    assert f(kiln.ones(4)).tolist() == [2.0] * 4 and f.trace_count == 3


def test_a_module_attribute_of_an_unhashable_class_is_guarded():
    class Meta(type):
        def __eq__(cls, other):  # no __hash__: the class can't be a set member
            return cls is other

    class Config(metaclass=Meta):
        pass

    class Net(kiln.nn.Module):
        def __init__(self):
            super().__init__()
            self.cfg = Config()
            self.k = 2.0

        def forward(self, x):
            return x * self.k

    net = Net()
    cn = kiln.compile(net)
    assert _calls(cn, kiln.ones(2)).tolist() == [2.0, 2.0]
    net.k = 3.0
    assert cn(kiln.ones(2)).tolist() == [3.0, 3.0] and cn._compiled.trace_count == 2
