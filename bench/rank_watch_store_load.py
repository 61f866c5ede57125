#!/usr/bin/env python
"""The lost-rank watch's load on the rendezvous store: the requests per second that W processes' watches send to
it, at 2, 4 and 8 processes, for the watch in this checkout and for the watch of an earlier commit (by default the
one that read every peer's heartbeat), with the growth law each follows.

Each process runs the module's `RankWatch` as a training run does (no store handed in: the address check and the
store client of `modeling_angpt/training/rank_watch.py`), against a TCPStore this script hosts, with the store
client wrapped so that every call (one round trip) is counted; the processes start their watches together, count
over the same window of `--seconds`, and only then stop. The figures go into docs/results/benchmarks.md, section
`rank_watch_store_load` (docs/training.md, "A lost rank").

    python bench/rank_watch_store_load.py [--processes 2 4 8 --seconds 20 --before cd8a39f]
"""
from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from results_file import (  # noqa: E402, I001
    REPO, add_output_arguments, command_line, help_description, machine_line, update_section)

WATCH = "modeling_angpt/training/rank_watch.py"
BEFORE = "cd8a39f"  # the last commit whose watch read every peer's heartbeat
# requests per interval: before, each rank's own beat and 3 per peer (`check` done, `check` beat, `get` beat); now,
# each rank's beat, its successor's counter and the loss line's counter
LAWS = {"before": ("W·(3W−2)", lambda w: w * (3 * w - 2)), "now": ("3·W", lambda w: 3 * w)}


class CountingStore:
    """The watch's store client, each call counted by name (one call is one round trip to the TCPStore)."""

    def __init__(self, store):
        self.store, self.requests = store, collections.Counter()

    def __getattr__(self, name):
        method = getattr(self.store, name)

        def counted(*args, **kwargs):
            self.requests[name] += 1
            return method(*args, **kwargs)
        return counted


def child(source: str, rank: int, world: int, port: int, seconds: float, run: str) -> dict:
    """One process of a run: the watch of `source` for `world` ranks, its requests counted over the window."""
    import torch.distributed as dist

    spec = importlib.util.spec_from_file_location("rank_watch_under_test", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    control = dist.PrefixStore(f"bench/{run}/", dist.TCPStore("127.0.0.1", port, is_master=False,
                                                              timeout=timedelta(seconds=300)))
    clients, connections = [], collections.Counter()
    rendezvous_store, check_reachable = module._rendezvous_store, module._check_reachable

    def counted_store():
        clients.append(CountingStore(rendezvous_store()))
        return clients[-1]

    def counted_check(address):
        connections["connect"] += 1
        return check_reachable(address)

    module._rendezvous_store, module._check_reachable = counted_store, counted_check
    watch = module.RankWatch(rank, world, "unused", exit=lambda code: None)
    control.add("ready", 1)
    control.wait(["go"])  # every process's watch starts at once
    watch._thread.start()
    time.sleep(watch.interval + 0.5)  # every watch beats: the first sweeps are behind
    first, first_connect, start = dict(clients[0].requests), connections["connect"], time.monotonic()
    time.sleep(seconds)
    last, last_connect, window = dict(clients[0].requests), connections["connect"], time.monotonic() - start
    control.add("measured", 1)
    control.wait(["stop"])  # no watch stops (and changes the others' sweeps) before every window ended
    watch.stop()
    return {"requests": {name: (last[name] - first.get(name, 0)) / window for name in last},
            "connections": (last_connect - first_connect) / window, "interval": watch.interval}


def run_world(source: str, world: int, seconds: float, run: str, master) -> dict:
    """Start `world` processes watching each other; their summed requests per second, by operation."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master.port), "LOCAL_WORLD_SIZE": "1",
           "TORCHELASTIC_RUN_ID": run, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, __file__, "--child", source, str(rank), str(world), str(master.port),
                               str(seconds), run], env=env, stdout=subprocess.PIPE, text=True, cwd=REPO)
             for rank in range(world)]
    control = _control(master, run)
    for counter, release in (("ready", "go"), ("measured", "stop")):  # the two barriers `child` waits at
        while int(control.add(counter, 0)) < world:
            if any(proc.poll() not in (None, 0) for proc in procs):
                raise SystemExit(f"rank_watch_store_load.py: error: a process of the {world}-process run failed")
            time.sleep(0.1)
        control.set(release, "1")
    reports = [json.loads(proc.communicate(timeout=120)[0].strip().splitlines()[-1]) for proc in procs]
    total = collections.Counter()
    for report in reports:
        total.update(report["requests"])
    return {"requests": dict(total), "per_second": sum(total.values()), "interval": reports[0]["interval"],
            "connections": sum(report["connections"] for report in reports)}


def _control(master, run: str):
    import torch.distributed as dist

    return dist.PrefixStore(f"bench/{run}/", master)


def _source_at(commit: str, folder: str) -> str:
    """The watch module of an earlier commit, written to a file of `folder`."""
    try:
        text = subprocess.run(["git", "show", f"{commit}:{WATCH}"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        raise SystemExit(f"rank_watch_store_load.py: error: --before {commit}: no {WATCH} at that commit in this "
                         f"checkout ({str(getattr(error, 'stderr', '') or error).strip()})") from None
    path = Path(folder, f"rank_watch_{commit}.py")
    path.write_text(text)
    return str(path)


def table(results: dict, worlds: list[int], commit: str) -> str:
    interval = next(iter(results.values()))["interval"]
    lines = [f"| processes W | before ({commit}): requests/s | its law {LAWS['before'][0]} per {interval:g} s | "
             f"now: requests/s | its law {LAWS['now'][0]} per {interval:g} s | by request, before; now | "
             "address checks, connections/s (before / now) |", "|---|---|---|---|---|---|---|"]
    for world in worlds:
        before, now = results[("before", world)], results[("now", world)]
        by_request = "; ".join(", ".join(f"{name} {rate:.2f}" for name, rate in sorted(run["requests"].items()))
                               for run in (before, now))
        lines.append(f"| {world} | {before['per_second']:.2f} | {LAWS['before'][1](world) / interval:.2f} | "
                     f"{now['per_second']:.2f} | {LAWS['now'][1](world) / interval:.2f} | {by_request} | "
                     f"{before['connections']:.2f} / {now['connections']:.2f} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=help_description(__doc__))
    parser.add_argument("--processes", type=int, nargs="+", default=[2, 4, 8], help="numbers of processes (ranks)")
    parser.add_argument("--seconds", type=float, default=20.0, help="the counting window of each run")
    parser.add_argument("--before", default=BEFORE, help=f"the commit whose watch is measured as 'before' "
                        f"(default {BEFORE}, the watch that read every peer)")
    parser.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    add_output_arguments(parser, plots=False)
    args = parser.parse_args(argv)
    if args.child:
        source, rank, world, port, seconds, run = args.child
        print(json.dumps(child(source, int(rank), int(world), int(port), float(seconds), run)))
        return
    import torch.distributed as dist

    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=300))
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        sources = {"before": _source_at(args.before, folder), "now": str(REPO / WATCH)}
        for world in args.processes:
            for version, source in sources.items():
                results[(version, world)] = run_world(source, world, args.seconds, f"{version}-{world}", master)
                print(f"{version}, {world} processes: {results[(version, world)]['per_second']:.2f} requests/s",
                      flush=True)
    body = section(results, args, argv)
    print(body)
    if not args.no_write:
        update_section("rank_watch_store_load", body, args.results)


def section(results: dict, args, argv) -> str:
    interval = next(iter(results.values()))["interval"]
    at_scale = 512
    return f"""## The lost-rank watch's load on the rendezvous store

Command: `{command_line(__file__, argv)}`. {machine_line()}

{table(results, args.processes, args.before)}

Each row: W processes on this machine, each running the watch against one TCPStore; every store call of the watches
(one round trip each) counted over the same {args.seconds:g} s window, summed over the processes, per second. "Law":
the requests per interval the code makes, divided by its {interval:g} s interval. The address check (a TCP connection
opened and closed before each beat) is no store request; both versions make one per process and beat. At {at_scale}
ranks the laws give {LAWS['before'][1](at_scale) / interval:,.0f} requests/s before and \
{LAWS['now'][1](at_scale) / interval:,.0f} now."""


if __name__ == "__main__":
    main()
