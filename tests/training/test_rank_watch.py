"""The lost-rank watch on one process, with an in-memory store standing for the rendezvous one and the other rank
played by this test (tests/parallel/test_lost_rank.py kills a real process of a two-machine run)."""
from __future__ import annotations

import threading
import time

import torch.distributed as dist

from modeling_angpt.training.rank_watch import LOST_RANK_EXIT_CODE, RankWatch, resume_command


def _watch(store, exits):
    watch = RankWatch(0, 2, "runs/x", store=store, stale_after=0.5, interval=0.05, exit=exits.append)
    watch._thread.start()
    return watch


def _peer_beats(store, seconds: float) -> None:
    end, beat = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        beat += 1
        store.set("beat/1", str(beat))
        time.sleep(0.05)


def test_a_peer_that_stops_beating_is_named_with_the_resume_command(capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["angpt", "train", "recipe.yaml", "--overwrite"])
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # two machines of one process each
    store, exits = dist.HashStore(), []
    watch = _watch(store, exits)
    _peer_beats(store, 0.5)
    watch._thread.join(timeout=5)
    assert exits == [LOST_RANK_EXIT_CODE]
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
    store.set("done/1", "1")  # rank 1 ended normally
    time.sleep(1.0)
    watch.stop()
    assert exits == [] and store.get("done/0") == b"1"


def test_the_resume_command_is_the_launch_command_with_resume():
    assert resume_command(["angpt", "train", "r.yaml", "--override", "output_dir=a b", "--overwrite"]) == \
        "angpt train r.yaml --override 'output_dir=a b' --resume"
    assert resume_command(["python", "-m", "modeling_angpt.cli", "train", "r.yaml", "--resume"]) == \
        "angpt train r.yaml --resume"
    assert resume_command(["my_script.py"]) == "train(recipe, resume=True) in the same launch"
