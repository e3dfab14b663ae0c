"""Worker for the two-host test: which address this rank's traffic leaves from, then an all-reduce."""

import datetime
import os
import socket

import kiln
import kiln.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
r = dist.get_rank()
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    s.connect((os.environ["MASTER_ADDR"], 9))
    address = s.getsockname()[0]
addresses = [None] * dist.get_world_size()
dist.all_gather_object(addresses, address)
t = kiln.full((1000,), float(r + 1))
dist.all_reduce(t)
assert t.tolist() == [3.0] * 1000, t
print(f"rank {r}: ok from {address}; ranks at {addresses}", flush=True)
dist.destroy_process_group()
