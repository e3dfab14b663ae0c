"""Worker for the fault tests (argv[1] names the fault): prints one line, "rank R: <error type>: <message>"."""

import datetime
import os
import sys
import time

import kiln
import kiln.distributed as dist

fault = sys.argv[1]
timeout = datetime.timedelta(seconds=float(os.environ.get("KILN_TEST_TIMEOUT", "20")))
try:
    dist.init_process_group("gloo", timeout=timeout)
except Exception as e:  # noqa: BLE001 - the wrong-address test ends here, whatever the error
    print(f"rank {os.environ['RANK']}: {type(e).__name__}: {e}", flush=True)
    sys.exit(1)
r = dist.get_rank()
start = time.monotonic()
try:
    if fault == "shapes":
        dist.all_reduce(kiln.ones(3 if r == 0 else 4))
    elif fault == "dtypes":
        dist.all_reduce(kiln.ones(3, dtype=kiln.float32 if r == 0 else kiln.float64))
    elif fault == "ops":
        if r == 0:
            dist.all_reduce(kiln.ones(3))
        else:
            dist.broadcast(kiln.ones(3), src=0)
    elif fault == "kill":  # rank 1 dies in the middle of a run of all-reduces
        for i in range(100):
            if r == 1 and i == 20:
                os._exit(17)
            dist.all_reduce(kiln.ones(50_000))
    elif fault == "stall":  # rank 1 stops calling collectives (alive, but never arrives)
        for i in range(100):
            if r == 1 and i == 5:
                time.sleep(float(os.environ.get("KILN_TEST_STALL", "15")))
            dist.all_reduce(kiln.ones(10))
    elif fault == "object":  # an object the receivers must refuse to unpickle

        class Evil:
            def __reduce__(self):
                return (os.system, ("echo pwned",))

        ol = [Evil()] if r == 0 else [None]
        dist.broadcast_object_list(ol, src=0)
        if r != 0:
            print(f"rank {r}: decoded {ol!r}", flush=True)
            sys.exit(0)
        sys.exit(0)
    print(f"rank {r}: no error", flush=True)
except Exception as e:  # noqa: BLE001 - report any error: the test reads its type
    print(f"rank {r}: {type(e).__name__}: {e} [after {time.monotonic() - start:.1f} s]", flush=True)
    sys.exit(1)
