"""Rank <rank> fails (exit code 3, or SIGKILL with "kill") after writing to stderr; every other rank writes
its pid to <out_dir>/pid<RANK> and sleeps (the launcher must stop it)."""

import os
import signal
import sys
import time

out_dir, bad, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rank = int(os.environ["RANK"])
with open(os.path.join(out_dir, f"pid{rank}"), "w") as fh:
    fh.write(str(os.getpid()))
if rank == bad:
    time.sleep(0.3)
    print(f"rank {rank}: something went wrong (first line)", file=sys.stderr)
    print(f"rank {rank}: ValueError: the last words", file=sys.stderr, flush=True)
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(3)
time.sleep(60)
