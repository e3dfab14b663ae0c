"""The torch.utils.data paths: kiln.utils.data re-exports kiln.data."""

import subprocess
import sys

import pytest

import kiln
import kiln.data
import kiln.utils.data

torch_data = pytest.importorskip("torch.utils.data")


def test_all_is_kiln_data_all():
    assert kiln.utils.data.__all__ == kiln.data.__all__
    for name in kiln.data.__all__:
        assert getattr(kiln.utils.data, name) is getattr(kiln.data, name)


def test_torch_names_kiln_has_are_importable():
    have = [n for n in torch_data.__all__ if hasattr(kiln.data, n)]
    assert {"DataLoader", "Dataset", "TensorDataset", "random_split", "DistributedSampler"} <= set(have)
    for name in have:
        assert getattr(kiln.utils.data, name) is getattr(kiln.data, name)


@pytest.mark.parametrize("sub", ["dataloader", "dataset", "sampler", "distributed"])
def test_submodule_paths(sub):
    import importlib

    mod = importlib.import_module(f"kiln.utils.data.{sub}")
    tmod = importlib.import_module(f"torch.utils.data.{sub}")
    names = [n for n in tmod.__all__ if hasattr(kiln.data, n)]
    assert names
    for n in names:
        assert getattr(mod, n) is getattr(kiln.data, n)
    for n in mod.__all__:
        assert getattr(mod, n) is getattr(kiln.data, n)


def test_attribute_path():
    assert kiln.utils.data.DataLoader is kiln.data.DataLoader
    assert kiln.utils.data.dataloader.default_collate is kiln.data.default_collate


def test_import_forms_in_a_fresh_process():
    code = (
        "import kiln as torch\n"
        "import kiln.utils.data as d\n"
        "from kiln.utils.data import DataLoader, TensorDataset\n"
        "from kiln.utils.data.dataloader import default_collate\n"
        "from kiln.utils.data.distributed import DistributedSampler\n"
        "assert torch.utils.data.DataLoader is DataLoader is d.DataLoader\n"
        "ds = TensorDataset(torch.arange(6.0))\n"
        "print([b[0].tolist() for b in DataLoader(ds, batch_size=4)])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[[0.0, 1.0, 2.0, 3.0], [4.0, 5.0]]"
