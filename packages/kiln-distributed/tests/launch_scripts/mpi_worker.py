"""An MPI program: Allreduce over COMM_WORLD; writes rank, size and the sums to <out_dir>/mpi<rank>.json.
With "abort", rank 1 calls MPI_Abort(7) instead."""

import json
import os
import sys

from mpi4py import MPI

out_dir = sys.argv[1]
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
if "abort" in sys.argv and rank == 1:
    print("rank 1 aborts", file=sys.stderr, flush=True)
    comm.Abort(7)
send = [rank + 1.0, 10.0 * rank]
recv = [0.0, 0.0]
# A buffer Allreduce (MPI_Allreduce on doubles) and an object one.
import array  # noqa: E402

buf = array.array("d", send)
out = array.array("d", recv)
comm.Allreduce([buf, MPI.DOUBLE], [out, MPI.DOUBLE], op=MPI.SUM)
total = comm.allreduce(rank, op=MPI.SUM)
with open(os.path.join(out_dir, f"mpi{rank}.json"), "w") as fh:
    json.dump({"rank": rank, "size": size, "sum": list(out), "obj": total, "env_rank": os.environ["RANK"]}, fh)
