"""Rank <rank> fails on its first attempt only (a marker file remembers); every rank records each attempt
in <out_dir>/attempt<KILN_RESTART_COUNT>_rank<RANK>.

The failing rank waits until every rank has recorded the attempt: a slow-starting peer (a loaded machine, another
node's agent) would otherwise be stopped by the restart before it wrote its file."""

import os
import sys
import time

out_dir, bad = sys.argv[1], int(sys.argv[2])
always = len(sys.argv) > 3 and sys.argv[3] == "always"
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
attempt = os.environ["KILN_RESTART_COUNT"]
with open(os.path.join(out_dir, f"attempt{attempt}_rank{rank}"), "w") as fh:
    fh.write(str(os.getpid()))
marker = os.path.join(out_dir, "failed_once")
if rank == bad and (always or not os.path.exists(marker)):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(
        os.path.exists(os.path.join(out_dir, f"attempt{attempt}_rank{r}")) for r in range(world)
    ):
        time.sleep(0.02)
    open(marker, "w").close()
    print(f"rank {rank} fails on purpose", file=sys.stderr)
    sys.exit(5)
if rank != bad:
    time.sleep(0.5)  # still running when the bad rank fails on the first attempt
