"""Every kernel the simulator ran in this session also compiles for a real GPU.

The simulator runs kernels as Python, which accepts code numba.cuda's compiler would reject (a cast it cannot
type, a float64 constant in a float32 kernel...). This test takes every launch the other tests made —
generator and argument types — and compiles it again on the GPU path with ``compile_ptx``, which needs NVVM
(the ``cu13`` extra) but no GPU and no driver. It runs last (file order) in a child process without
``NUMBA_ENABLE_CUDASIM``.
"""

import json
import os
import subprocess
import sys

import pytest

from kiln_cuda import _driver, codegen

CHILD = r"""
import json, sys
from kiln_cuda import codegen
launches = json.load(open(sys.argv[1]))
try:
    from numba.cuda.cudadrv import nvvm
    nvvm.NVVM()
except Exception as exc:
    print(f"no NVVM to compile with: {exc}")
    sys.exit(3)
failed = []
for name, described, types in launches:
    try:
        ptx = codegen.replay(name, described, types)
        assert ".entry" in ptx
    except Exception as exc:
        failed.append(f"{name}{tuple(described)} {types}: {type(exc).__name__}: {str(exc)[:2000]}")
print(f"compiled {len(launches) - len(failed)} of {len(launches)} kernels to PTX")
for f in failed[:20]:
    print(f)
sys.exit(1 if failed else 0)
"""


@pytest.mark.skipif(not _driver.SIM, reason="on a GPU the kernels were compiled by running them")
def test_every_simulated_kernel_compiles_for_a_gpu(tmp_path):
    launches = codegen.recorded()
    if len(launches) < 20:
        pytest.skip("run with the rest of kiln-cuda's tests: too few kernels recorded to check")
    path = tmp_path / "launches.json"
    path.write_text(json.dumps(launches))
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    r = subprocess.run([sys.executable, "-c", CHILD, str(path)], env=env, capture_output=True, text=True, timeout=1500)
    if r.returncode == 3:
        pytest.skip(r.stdout.strip())
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert "compiled" in r.stdout
    print(r.stdout.splitlines()[0])  # "compiled N of N kernels to PTX" (pytest -s shows it)
