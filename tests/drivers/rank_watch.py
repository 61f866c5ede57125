"""Run by tests/parallel/test_rank_watch_ring.py on each machine of a multi-machine torchrun launch: the lost-rank
watch alone (modeling_angpt/training/rank_watch.py) against the launch's rendezvous store, with a short beat, and
then a wait for the end (the test kills a rank; the watch ends the others). Each rank marks that its watch runs by a
file `ready_RANK` in the folder given."""
import os
import sys
import time
from pathlib import Path

from modeling_angpt.training.rank_watch import RankWatch


def main() -> None:
    folder, stale_after, interval = Path(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    watch = RankWatch(rank, world, str(folder), stale_after=stale_after, interval=interval)
    watch._thread.start()
    (folder / f"ready_{rank}").write_text(str(os.getpid()))
    time.sleep(600)


if __name__ == "__main__":
    main()
