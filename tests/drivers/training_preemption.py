"""Run by tests/parallel/test_preemption.py, as one process or under torchrun: train from a recipe and record what
each optimiser step trained on (a hash of every sequence of every micro-batch, in the order the ranks and
micro-batches of the step hold them) into steps_rank<R>_<label>.jsonl. With --signal-after K, rank --signal-rank
sends itself SIGTERM after step K's batches were read (only that rank gets it): the run must stop at a step boundary
with a checkpoint, exit 75, and name the step."""
import argparse
import hashlib
import json
import os
import signal
import sys
from pathlib import Path

import modeling_angpt.training.checkpoints as checkpoints
import modeling_angpt.training.loop as loop
from modeling_angpt.training import load_recipe, train
from modeling_angpt.training.preemption import PREEMPTED_EXIT_CODE, Preempted


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("recipe")
    parser.add_argument("--label", required=True)
    parser.add_argument("--resume", default=False)
    parser.add_argument("--signal-after", type=int)
    parser.add_argument("--signal-rank", type=int, default=0)
    parser.add_argument("--override", action="append", default=[])
    parser.add_argument("--kill-in-save")
    args = parser.parse_args()
    if args.kill_in_save:
        _kill_in_save(*args.kill_in_save.split(":"))
    recipe = load_recipe(args.recipe, args.override)
    rank = int(os.environ.get("RANK", "0"))
    records = []
    original = loop.accumulate_gradients

    def recording(accelerator, model, batches, recipe, stop=False):
        hashes = [[hashlib.sha1(row.numpy().tobytes()).hexdigest()[:16] for row in batch["input_ids"].cpu()]
                  for batch in batches]
        result = original(accelerator, model, batches, recipe, stop)
        records.append(hashes)
        if args.signal_after is not None and rank == args.signal_rank and len(records) == args.signal_after:
            os.kill(os.getpid(), signal.SIGTERM)  # a real signal, to this rank only
        return result

    loop.accumulate_gradients = recording
    status, start = 0, None
    try:
        result = train(recipe, resume="auto" if args.resume == "auto" else bool(args.resume))
        start = result.start_step
    except Preempted as stopped:
        status, start = PREEMPTED_EXIT_CODE, stopped.step - len(records)
    out = Path(recipe.output_dir) / f"steps_rank{rank}_{args.label}.jsonl"
    out.write_text("".join(json.dumps({"step": start + i + 1, "micro_batches": hashes}) + "\n"
                           for i, hashes in enumerate(records)))
    return status


def _kill_in_save(step: str, moment: str) -> None:
    assert moment in ("before-marker", "before-rename"), moment
    write_marker = checkpoints.write_marker

    def killing(directory: Path) -> None:
        doomed = directory.name == f".tmp_{checkpoints.checkpoint_path(Path('.'), int(step)).name}"
        if doomed and moment == "before-marker":
            os.kill(os.getpid(), signal.SIGKILL)
        write_marker(directory)
        if doomed:
            os.kill(os.getpid(), signal.SIGKILL)

    checkpoints.write_marker = killing


if __name__ == "__main__":
    sys.exit(main())
