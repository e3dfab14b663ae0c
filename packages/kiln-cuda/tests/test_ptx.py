"""Every kernel the simulator ran in this session also compiles for a real GPU.

The simulator runs kernels as Python, which accepts code numba.cuda's compiler would reject (a cast it cannot
type, a float64 constant in a float32 kernel...). This test takes every launch the other tests made —
generator and argument types — and compiles it again on the GPU path with ``compile_ptx``, which needs NVVM
(the ``cu13`` extra) but no GPU and no driver. It runs last (file order), in child processes without
``NUMBA_ENABLE_CUDASIM``: one per core, each compiling its share of the launches (compiling is most of the
cell's time on one core).
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
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    children = []
    shares = max(1, min(os.cpu_count() or 1, 4))
    for i in range(shares):  # every share-th launch: the costly generators spread over the children
        path = tmp_path / f"launches-{i}.json"
        path.write_text(json.dumps(launches[i::shares]))
        cmd = [sys.executable, "-c", CHILD, str(path)]
        children.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    try:
        for child in children:
            out, err = child.communicate(timeout=1500)
            results.append((child.returncode, out, err))
    finally:
        for child in children:
            child.kill()
    for code, out, _ in results:
        if code == 3:
            pytest.skip(out.strip())
    for code, out, err in results:
        assert code == 0, out[-6000:] + err[-3000:]
        assert "compiled" in out
        print(out.splitlines()[0])  # "compiled N of N kernels to PTX" (pytest -s shows it)
