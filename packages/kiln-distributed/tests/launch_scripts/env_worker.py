"""Writes the launcher-given environment (and the pid) to <out_dir>/rank<RANK>.json; optionally uses the
agent's store (a counter every worker of every node adds to)."""

import json
import os
import sys

KEYS = [
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "GROUP_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "KILN_USE_AGENT_STORE",
    "KILN_RUN_ID",
    "KILN_RESTART_COUNT",
    "PMI_RANK",
    "PMI_SIZE",
    "PMI_FD",
    "OMP_NUM_THREADS",
]

out_dir = sys.argv[1]
record = {k: os.environ.get(k) for k in KEYS}
record["pid"] = os.getpid()
record["argv"] = sys.argv[2:]
if "--use-store" in sys.argv:
    import datetime

    from kiln.distributed.store import TCPStore

    store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), timeout=datetime.timedelta(seconds=20))
    world = int(os.environ["WORLD_SIZE"])
    store.set(f"test/rank{os.environ['RANK']}", os.environ["GROUP_RANK"])
    store.wait([f"test/rank{r}" for r in range(world)], datetime.timedelta(seconds=20))
    record["store_nodes"] = [store.get(f"test/rank{r}").decode() for r in range(world)]
    store.close()
with open(os.path.join(out_dir, f"rank{record['RANK']}.json"), "w") as fh:
    json.dump(record, fh)
print(f"env_worker rank {record['RANK']} done", file=sys.stderr)
