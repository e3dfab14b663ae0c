"""Two hosts on one machine: two network namespaces joined by a veth pair, a kiln-run launcher in each,
Gloo over TCP between them. Needs root and iproute2 (skipped otherwise); the namespaces are removed
whatever happens."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "c10d_scripts"
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root and iproute2"
)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def two_hosts():
    """Namespaces host-a (10.231.<n>.1) and host-b (10.231.<n>.2), joined by a veth pair."""
    n = os.getpid() % 250 + 1
    a, b = f"kiln-a-{os.getpid()}", f"kiln-b-{os.getpid()}"
    va, vb = f"kva{os.getpid() % 100000}", f"kvb{os.getpid() % 100000}"
    try:
        _ip("netns", "add", a)
        _ip("netns", "add", b)
    except subprocess.CalledProcessError as e:
        pytest.skip(f"cannot make network namespaces here: {e.stderr.decode().strip()}")
    try:
        _ip("link", "add", va, "type", "veth", "peer", "name", vb)
        _ip("link", "set", va, "netns", a)
        _ip("link", "set", vb, "netns", b)
        for ns, dev, host in ((a, va, 1), (b, vb, 2)):
            _ip("-n", ns, "addr", "add", f"10.231.{n}.{host}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield (a, f"10.231.{n}.1"), (b, f"10.231.{n}.2")
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def test_gloo_across_two_hosts(two_hosts):
    (ns_a, addr_a), (ns_b, addr_b) = two_hosts
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env["KILN_RDZV_TIMEOUT"] = "60"
    procs = []
    for ns, node in ((ns_a, 0), (ns_b, 1)):
        cmd = [
            "ip", "netns", "exec", ns, sys.executable, "-m", "kiln.distributed.run",
            "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1",
            "--master-addr", addr_a, "--master-port", "29411", str(SCRIPTS / "host_probe.py"),
        ]  # fmt: skip
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=180)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("a launcher hung: " + p.communicate()[0])
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out
    assert f"rank 0: ok from {addr_a}" in outs[0], outs[0]
    assert f"rank 1: ok from {addr_b}" in outs[1], outs[1]
    assert f"ranks at ['{addr_a}', '{addr_b}']" in outs[0]
