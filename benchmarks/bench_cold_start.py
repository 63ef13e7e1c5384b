#!/usr/bin/env python3
"""What a fresh process pays before its first call can put work on a Dask cluster named by its
address, measured over several fresh processes against one scheduler on this machine.

    python benchmarks/bench_cold_start.py [--runs 7]

Each process is a new interpreter (as a harness starts one per call). Part 1 times each step
before the first submission: the interpreter's start, ``import nbbudget``, ``import
distributed``, connecting a ``Client``, installing nbbudget's ledger on the scheduler (what a
call does with a client it has not used), and the first call itself, detached at once (its
task submitted, its future published). Part 2 is the call a harness makes:
``nb.call(fn, detach=True, budget="500ms", cluster="tcp://...")`` from a fresh process: when
it answers and with what (``starting`` past its budget, or its result), when the process has
exited (it waits for the work to reach the
cluster), and when the task began on the worker; every time is from the moment the process was
spawned. Medians, with min..max.

Needs ``nbbudget[dask]``; about 30 s on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from distributed import Client, LocalCluster

STEPS = '''
import json, sys, time
spawned, address = float(sys.argv[1]), sys.argv[2]
marks = {"interpreter": time.time() - spawned}
def mark(name, since=[time.perf_counter()]):
    now = time.perf_counter()
    marks[name] = now - since[0]
    since[0] = now
import nbbudget as nb
mark("import nbbudget")
import distributed
mark("import distributed")
client = distributed.Client(address, set_as_default=False)
mark("connect")
from nbbudget.backends.dask.ledger import on_cluster
on_cluster(client)
mark("install the ledger")
def stamp():
    return time.time()
response = nb.call(stamp, detach=True, budget="1ms", cluster=client, key=repr(spawned))
mark("first call, detached")
assert response.data["state"] == "running", response.to_json()
marks["total"] = time.time() - spawned
print(json.dumps(marks))
'''

HARNESS = '''
import json, sys, time
spawned, address, marker = float(sys.argv[1]), sys.argv[2], sys.argv[3]
import nbbudget as nb
def stamp(path):
    with open(path, "a") as out:
        out.write(f"{time.time()}\\n")
    return "ran"
response = nb.call(stamp, marker, detach=True, budget="500ms", cluster=address)
done = not isinstance(response.data, dict)  # within the budget: the result itself
print(json.dumps({"answered": time.time() - spawned,
                  "state": "done" if done else response.data["state"],
                  "budget_ms": response.meta["budget_ms"],
                  "duration_ms": response.meta["duration_ms"]}))
'''


def fresh(script: str, *args: str) -> tuple[dict[str, float], float]:
    """Run *script* in a new interpreter; what it printed, and when it exited (s after spawn)."""
    spawned = time.time()
    done = subprocess.run([sys.executable, "-c", script, repr(spawned), *args],
                          capture_output=True, text=True, timeout=120, check=False)
    exited = time.time() - spawned
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1]), exited


def spread(values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return f"{statistics.median(ms):7.0f} ms   ({min(ms):.0f}..{max(ms):.0f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    runs = parser.parse_args().runs
    with tempfile.TemporaryDirectory() as home:
        os.environ["NBBUDGET_HOME"] = home
        os.environ["NBBUDGET_INTERACTIVE"] = "0"
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                          dashboard_address=":0") as cluster, Client(cluster) as client:
            address = cluster.scheduler_address
            print(f"scheduler at {address}, 1 worker process; Python {sys.version.split()[0]}; "
                  f"load {os.getloadavg()[0]:.1f}; {runs} fresh processes each\n")
            steps = [fresh(STEPS, address)[0] for _ in range(runs)]
            print("1. before the first submission, step by step")
            for name in steps[0]:
                print(f"   {name:28} {spread([s[name] for s in steps])}")
            answered, exited, began, states = [], [], [], set()
            for k in range(runs):
                marker = Path(home) / f"ran-{k}.txt"
                spawned = time.time()
                said, took = fresh(HARNESS, address, str(marker))
                answered.append(said["answered"])
                exited.append(took)
                states.add(said["state"])
                deadline = time.time() + 30
                while not marker.exists() and time.time() < deadline:
                    time.sleep(0.01)
                began.append(float(marker.read_text().split()[0]) - spawned)
            for name in client.list_datasets():  # the jobs the runs left: forgotten
                client.unpublish_dataset(name)
            print("\n2. nb.call(fn, detach=True, budget='500ms', cluster='tcp://...') from a "
                  "fresh process")
            print(f"   answered                     {spread(answered)}   state: "
                  f"{', '.join(sorted(states))}")
            print(f"   process exited               {spread(exited)}")
            print(f"   task began on the worker     {spread(began)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
