"""Writes its pid to <out_dir>/pid<RANK> and sleeps; with "ignore-term", rank 0 ignores SIGTERM (the
launcher must SIGKILL it); it also starts a grandchild that must die with it."""

import os
import signal
import subprocess
import sys
import time

out_dir = sys.argv[1]
rank = int(os.environ["RANK"])
if "ignore-term" in sys.argv and rank == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
with open(os.path.join(out_dir, f"pid{rank}.tmp"), "w") as fh:
    fh.write(f"{os.getpid()} {child.pid}")
os.replace(os.path.join(out_dir, f"pid{rank}.tmp"), os.path.join(out_dir, f"pid{rank}"))
time.sleep(60)
