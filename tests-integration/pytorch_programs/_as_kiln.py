"""Run a PyTorch program with kiln standing in for torch: ``python _as_kiln.py program.py [args]``.

Every ``import torch`` / ``import torch.X`` / ``from torch.X import Y`` of the program (and of anything it
imports) resolves to ``kiln`` / ``kiln.X``: the program's source is not changed at all.
"""

import importlib
import importlib.abc
import importlib.machinery
import runpy
import sys


class _TorchIsKiln(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torch" or fullname.startswith("torch."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = importlib.import_module("kiln" + spec.name[len("torch") :])
        sys.modules[spec.name] = module
        return module

    def exec_module(self, module):
        return None


sys.meta_path.insert(0, _TorchIsKiln())
program = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(program, run_name="__main__")
