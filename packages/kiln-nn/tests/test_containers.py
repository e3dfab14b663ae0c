"""Containers against torch: Sequential, ModuleList, ModuleDict, ParameterList, ParameterDict."""

from __future__ import annotations

import copy
import pickle
from collections import OrderedDict

import pytest
import torch
from kiln_nn_helpers import to_np

import kiln
import kiln.nn as nn


def names(mod):
    return [n for n, _ in mod.named_parameters()]


def seq(lib, n=4):
    return lib.nn.Sequential(*[lib.nn.Linear(i + 1, i + 2) for i in range(n)])


def test_sequential_indexing_and_mutation_like_torch():
    k, t = seq(kiln), seq(torch)
    assert len(k) == len(t) == 4
    assert repr(k[1]) == repr(t[1]) and repr(k[-1]) == repr(t[-1])
    assert type(k[1:3]) is nn.Sequential and repr(k[1:3]) == repr(t[1:3])
    assert repr(k[::2]) == repr(t[::2])
    for m in (k, t):
        del m[1]
        m.append(type(m[0])(5, 5))
        m.insert(0, type(m[0])(9, 9))
        m.insert(-1, type(m[0])(8, 8))
        m.extend([type(m[0])(7, 7)])
        m.pop(2)
        m[0] = type(m[0])(6, 6)
    assert repr(k) == repr(t) and names(k) == names(t)
    with pytest.raises(IndexError, match="index 10 is out of range"):
        k[10]
    assert repr(k + seq(kiln, 1)) == repr(t + seq(torch, 1))
    assert repr(seq(kiln, 1) * 2) == repr(seq(torch, 1) * 2)
    od_k = nn.Sequential(OrderedDict(a=nn.Linear(1, 1), b=nn.Identity()))
    od_t = torch.nn.Sequential(OrderedDict(a=torch.nn.Linear(1, 1), b=torch.nn.Identity()))
    assert repr(od_k) == repr(od_t) and list(od_k.state_dict()) == list(od_t.state_dict())
    assert [type(m).__name__ for m in od_k] == ["Linear", "Identity"]
    assert "0" not in dir(k)


def test_module_list_like_torch():
    mk = nn.ModuleList([nn.Linear(1, 1) for _ in range(3)])
    mt = torch.nn.ModuleList([torch.nn.Linear(1, 1) for _ in range(3)])
    for m, lib in ((mk, kiln), (mt, torch)):
        m.append(lib.nn.Linear(2, 2))
        m.insert(1, lib.nn.Identity())
        m.extend([lib.nn.Linear(3, 3)])
        m += [lib.nn.Linear(1, 1)]
        del m[0]
        m.pop(-2)
        m[0] = lib.nn.Flatten()
    assert repr(mk) == repr(mt) and names(mk) == names(mt)
    assert type(mk[1:]) is nn.ModuleList and repr(mk[1:]) == repr(mt[1:])
    assert repr(mk + nn.ModuleList([nn.Identity()])) == repr(mt + torch.nn.ModuleList([torch.nn.Identity()]))
    with pytest.raises(IndexError, match="index 9 is out of range"):
        mk[9]


def test_module_dict_like_torch():
    mk = nn.ModuleDict({"b": nn.Linear(1, 1), "a": nn.Identity()})
    mt = torch.nn.ModuleDict({"b": torch.nn.Linear(1, 1), "a": torch.nn.Identity()})
    for m, lib in ((mk, kiln), (mt, torch)):
        m["c"] = lib.nn.Linear(2, 2)
        m.update([("d", lib.nn.Flatten())])
        m.pop("a")
    assert list(mk.keys()) == list(mt.keys()) and repr(mk) == repr(mt)
    assert "c" in mk and len(mk) == 3 and list(mk) == ["b", "c", "d"]
    mk.clear()
    assert len(mk) == 0


def test_parameter_list_and_dict():
    pl = nn.ParameterList([kiln.ones(2), nn.Parameter(kiln.zeros(3))])
    assert all(isinstance(p, nn.Parameter) for p in pl) and names(pl) == ["0", "1"]
    pl.append(kiln.ones(1))
    pl.extend([kiln.ones(4)])
    assert len(pl) == 4 and [tuple(p.shape) for p in pl[1:3]] == [(3,), (1,)]
    with pytest.raises(RuntimeError, match=r"ParameterList should not be called\."):
        pl(1)
    pd = nn.ParameterDict({"b": kiln.ones(1), "a": kiln.ones(2)})
    pt = torch.nn.ParameterDict({"b": torch.ones(1), "a": torch.ones(2)})
    assert list(pd.keys()) == list(pt.keys()) and names(pd) == [n for n, _ in pt.named_parameters()]
    pd["c"] = nn.Parameter(kiln.ones(3))
    assert isinstance(pd["c"], nn.Parameter) and "c" in pd and pd.get("zz") is None
    assert pd.pop("c").shape == (3,) and len(pd) == 2
    pt.pop("b")
    pd.pop("b")
    pt["c"] = torch.ones(1)
    pd["c"] = kiln.ones(1)
    merged_t = pt | torch.nn.ParameterDict({"z": torch.ones(1)})
    assert list((pd | nn.ParameterDict({"z": kiln.ones(1)})).keys()) == list(merged_t.keys())


def test_module_deepcopy_pickle_and_kiln_save(tmp_path):
    m = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    m.register_buffer("steps", kiln.tensor(3))
    c = copy.deepcopy(m)
    assert c[0].weight is not m[0].weight and isinstance(c[0].weight, nn.Parameter)
    assert to_np(c[0].weight).tolist() == to_np(m[0].weight).tolist()
    p = pickle.loads(pickle.dumps(m))
    assert repr(p) == repr(m) and isinstance(p[1].bias, nn.Parameter)
    path = tmp_path / "model.kiln"
    kiln.save(m.state_dict(), path)
    fresh = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    fresh.register_buffer("steps", kiln.tensor(0))
    fresh.load_state_dict(kiln.load(path))
    x = kiln.randn(2, 3)
    assert to_np(fresh(x)).tolist() == to_np(m(x)).tolist() and fresh.steps.item() == 3
