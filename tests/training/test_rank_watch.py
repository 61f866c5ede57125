"""The lost-rank watch on one process, with an in-memory store standing for the rendezvous one and the other ranks
played by this test or by watches of their own in this process (tests/parallel/test_lost_rank.py kills a real
process of a two-machine run, tests/parallel/test_rank_watch_ring.py one of a four-process run)."""
from __future__ import annotations

import collections
import threading
import time

import torch.distributed as dist

from modeling_angpt.training.rank_watch import FINISHED, LOST_RANK_EXIT_CODE, RankWatch, resume_command

BEAT_S, STALE_S = 0.05, 0.5


def _watch(store, exits, rank=0, world=2):
    watch = RankWatch(rank, world, "runs/x", store=store, stale_after=STALE_S, interval=BEAT_S,
                      exit=lambda code: exits.append((rank, code)))
    watch._thread.start()
    return watch


def _peer_beats(store, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        store.add("beat/1", 1)
        time.sleep(BEAT_S)


def _die(watch) -> None:
    """The rank's process ends abruptly: its beats stop and it says nothing."""
    watch._stopped.set()
    watch._thread.join()


class CountingStore:
    """A store that counts the requests of each rank's watch thread (each call is one round trip to a TCPStore)."""

    def __init__(self, store):
        self.store, self.requests, self.lock = store, collections.Counter(), threading.Lock()

    def __getattr__(self, name):
        method = getattr(self.store, name)

        def counted(*args):
            with self.lock:
                self.requests[threading.get_ident()] += 1
            return method(*args)
        return counted


def test_a_peer_that_stops_beating_is_named_with_the_resume_command(capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["angpt", "train", "recipe.yaml", "--overwrite"])
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # two machines of one process each
    store, exits = dist.HashStore(), []
    watch = _watch(store, exits)
    _peer_beats(store, 0.5)
    watch._thread.join(timeout=5)
    assert exits == [(0, LOST_RANK_EXIT_CODE)]
    line = capsys.readouterr().err.strip()
    assert line == ("angpt train: error: rank 0: lost rank 1 of 2 (machine 1): no heartbeat for 0.5 s, its process "
                    "or machine stopped; the checkpoints in runs/x are kept: continue the run with "
                    "`angpt train recipe.yaml --resume` on every machine, launched as before")


def test_a_peer_that_finished_or_never_beat_is_not_lost():
    store, exits = dist.HashStore(), []
    watch = _watch(store, exits)
    time.sleep(0.8)  # rank 1 has not started beating: not lost (the rendezvous is torchrun's business)
    peer = threading.Thread(target=_peer_beats, args=(store, 0.3))
    peer.start()
    peer.join()
    store.add("beat/1", FINISHED)  # rank 1 ended normally
    time.sleep(1.0)
    watch.stop()
    assert exits == [] and store.add("beat/0", 0) >= FINISHED


def test_every_rank_prints_the_line_of_the_rank_that_found_the_loss(capsys, monkeypatch):
    """Only rank 1 watches rank 2; ranks 0 and 3 learn of its loss from the line rank 1 wrote into the store."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # two machines of two processes each
    store, exits = dist.HashStore(), []
    watches = [_watch(store, exits, rank, world=4) for rank in range(4)]
    time.sleep(3 * BEAT_S)
    _die(watches[2])
    for watch in watches:
        watch._thread.join(timeout=5)
    assert sorted(exits) == [(0, LOST_RANK_EXIT_CODE), (1, LOST_RANK_EXIT_CODE), (3, LOST_RANK_EXIT_CODE)]
    lines = sorted(capsys.readouterr().err.strip().splitlines())
    assert [line.split(": lost rank 2 of 4 (machine 1): no heartbeat for 0.5 s")[0] for line in lines] == \
        [f"angpt train: error: rank {rank}" for rank in (0, 1, 3)]


def test_the_watcher_of_a_finished_rank_watches_the_next_one(capsys):
    """Rank 1 ends normally; rank 0, which watched it, takes over rank 2, which then dies."""
    store, exits = dist.HashStore(), []
    watches = [_watch(store, exits, rank, world=3) for rank in range(3)]
    time.sleep(3 * BEAT_S)
    watches[1].stop()
    time.sleep(3 * BEAT_S)
    _die(watches[2])
    watches[0]._thread.join(timeout=5)
    assert exits == [(0, LOST_RANK_EXIT_CODE)]
    assert "rank 0: lost rank 2 of 3" in capsys.readouterr().err


def test_each_rank_makes_three_requests_per_beat_however_many_ranks_there_are():
    """The store's load grows linearly with the ranks (reading every peer made it 3·(W−1) per rank and beat)."""
    for world in (2, 8):
        store, exits = CountingStore(dist.HashStore()), []
        watches = [_watch(store, exits, rank, world) for rank in range(world)]
        time.sleep(0.25)
        for watch in watches:
            watch._stopped.set()
            watch._thread.join()
        beats = [store.store.add(f"beat/{rank}", 0) for rank in range(world)]
        assert exits == [] and min(beats) >= 3
        assert all(store.requests[watch._thread.ident] == 3 * beat for watch, beat in zip(watches, beats)), \
            (world, dict(store.requests), beats)


def test_the_resume_command_is_the_launch_command_with_resume():
    assert resume_command(["angpt", "train", "r.yaml", "--override", "output_dir=a b", "--overwrite"]) == \
        "angpt train r.yaml --override 'output_dir=a b' --resume"
    assert resume_command(["python", "-m", "modeling_angpt.cli", "train", "r.yaml", "--resume"]) == \
        "angpt train r.yaml --resume"
    assert resume_command(["my_script.py"]) == "train(recipe, resume=True) in the same launch"
