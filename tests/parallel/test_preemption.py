"""A run preempted, resumed on another number of processes, preempted again and resumed once more trains on the
same blocks, step by step and in the same order, as a run never interrupted, and ends with the same weights
(docs/training.md, "Preemption" and "Checkpoints and resuming"). The signal reaches one rank only; the others learn of
it in the step's loss reduction (modeling_angpt/training/preemption.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from training_fixtures import REPO, corpus_files, data_cache, write_recipe  # noqa: F401 (fixtures)

pytestmark = pytest.mark.parallel

DRIVER = REPO / "tests" / "drivers" / "training_preemption.py"
PREEMPTED = 75


def _launch(recipe: Path, label: str, processes: int | str, *overrides: str, resume: str | None = None,
            signal_after: int | None = None, signal_rank: int = 0,
            kill_in_save: str | None = None) -> subprocess.CompletedProcess:
    """`processes`: 1, 2 (DDP under torchrun) or "fsdp2" (2 processes, FSDP2, launched by accelerate)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    if processes == 1:
        command = [sys.executable, str(DRIVER)]
    elif processes == "fsdp2":
        env["ACCELERATE_USE_CPU"] = "true"
        command = [str(Path(sys.executable).with_name("accelerate")), "launch", "--config_file",
                   str(REPO / "configuration" / "accelerate" / "cpu_2proc_fsdp2.yaml"), str(DRIVER)]
    else:
        command = [str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc_per_node",
                   str(processes), str(DRIVER)]
    command += [str(recipe), "--label", label]
    if resume:
        command += ["--resume", resume]
    if signal_after is not None:
        command += ["--signal-after", str(signal_after), "--signal-rank", str(signal_rank)]
    if kill_in_save:
        command += ["--kill-in-save", kill_in_save]
    command += [a for o in overrides for a in ("--override", o)]
    return subprocess.run(command, capture_output=True, text=True, timeout=400, env=env, cwd=REPO)


def _global_order(run: Path, label: str, processes: int) -> dict[int, list[str]]:
    """{step: the sequences it trained on, in the order of the run's global positions: micro-batch by micro-batch,
    each the slices of rank 0, 1, ...}."""
    ranks = [[json.loads(line) for line in (run / f"steps_rank{r}_{label}.jsonl").read_text().splitlines()]
             for r in range(processes)]
    order = {}
    for records in zip(*ranks):
        step = records[0]["step"]
        assert all(record["step"] == step for record in records)
        micro = len(records[0]["micro_batches"])
        order[step] = [h for m in range(micro) for record in records for h in record["micro_batches"][m]]
    return order


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "final" / "model.safetensors"))


def test_preempted_and_resumed_on_other_process_counts_trains_as_one_uninterrupted_run(write_recipe, tmp_path):
    common = dict(max_steps=12, eval_steps=0, save_steps=100, logging_steps=4, report_to=["jsonl"])
    whole = write_recipe("whole.yaml", output_dir=str(tmp_path / "whole"), per_device_train_batch_size=4, **common)
    done = _launch(whole, "whole", 2)
    assert done.returncode == 0, done.stderr[-3000:]
    expected = _global_order(tmp_path / "whole", "whole", 2)
    assert sorted(expected) == list(range(1, 13)) and all(len(seqs) == 8 for seqs in expected.values())
    assert len({h for seqs in expected.values() for h in seqs}) == 96   # 96 distinct blocks: hashes name blocks

    parted = write_recipe("parted.yaml", output_dir=str(tmp_path / "parted"), per_device_train_batch_size=4,
                          **common)
    run = tmp_path / "parted"
    # 2 processes × 4: rank 1 alone gets SIGTERM while step 4 runs, so every rank stops after step 5
    first = _launch(parted, "a", 2, signal_after=4, signal_rank=1)
    assert first.returncode != 0 and f"exitcode  : {PREEMPTED}" in first.stderr, first.stderr[-3000:]
    lines = [line for line in first.stderr.splitlines() if line.startswith("angpt train: stopped by")]
    assert len(lines) == 1 and "a signal to another rank at step 5" in lines[0] and "resume=True" in lines[0], lines
    # 1 process × 4 × 2 accumulation steps: SIGTERM after its third step (step 8), so it stops after step 9
    second = _launch(parted, "b", 1, "per_device_train_batch_size=4", "gradient_accumulation_steps=2",
                     resume="auto", signal_after=3)
    assert second.returncode == PREEMPTED, second.stderr[-3000:]
    assert "stopped by SIGTERM at step 9" in second.stderr
    # 2 processes × 2 × 2 accumulation steps to the end
    third = _launch(parted, "c", 2, "per_device_train_batch_size=2", "gradient_accumulation_steps=2", resume="auto")
    assert third.returncode == 0, third.stderr[-3000:]

    resumed = {**_global_order(run, "a", 2), **_global_order(run, "b", 1), **_global_order(run, "c", 2)}
    assert sorted(_global_order(run, "a", 2)) == [1, 2, 3, 4, 5]
    assert sorted(_global_order(run, "b", 1)) == [6, 7, 8, 9]
    assert sorted(_global_order(run, "c", 2)) == [10, 11, 12]
    assert resumed == expected
    before, after = _weights(tmp_path / "whole"), _weights(run)
    assert before.keys() == after.keys()
    worst = max(float((before[k] - after[k]).abs().max()) for k in before)
    print(f"max |Δweight| against the uninterrupted run: {worst:.2e}")
    assert worst < 1e-5, worst


def test_fsdp2_checkpoints_reshard_to_one_process_and_back(write_recipe, tmp_path):
    """FSDP2 on 2 processes → 1 process → FSDP2 on 2 processes: the sharded checkpoint (torch.distributed.checkpoint)
    loads whole into one process, and one process's whole checkpoint into the shards, with the same blocks and
    weights as one uninterrupted process."""
    common = dict(max_steps=8, eval_steps=0, save_steps=100, logging_steps=4, report_to=["jsonl"])
    whole = write_recipe("whole.yaml", output_dir=str(tmp_path / "whole"), per_device_train_batch_size=8, **common)
    done = _launch(whole, "whole", 1)
    assert done.returncode == 0, done.stderr[-3000:]
    parted = write_recipe("parted.yaml", output_dir=str(tmp_path / "parted"), per_device_train_batch_size=4,
                          **common)
    first = _launch(parted, "a", "fsdp2", signal_after=2, signal_rank=0)
    assert "angpt train: stopped by SIGTERM at step 3" in first.stderr, first.stderr[-3000:]
    assert (tmp_path / "parted" / "checkpoints" / "step_0000003" / "pytorch_model_fsdp_0").is_dir()
    second = _launch(parted, "b", 1, "per_device_train_batch_size=8", resume="auto", signal_after=2)
    assert second.returncode == PREEMPTED and "stopped by SIGTERM at step 6" in second.stderr, second.stderr[-3000:]
    third = _launch(parted, "c", "fsdp2", resume="auto")
    assert third.returncode == 0, third.stderr[-3000:]
    run = tmp_path / "parted"
    resumed = {**_global_order(run, "a", 2), **_global_order(run, "b", 1), **_global_order(run, "c", 2)}
    assert resumed == _global_order(tmp_path / "whole", "whole", 1) and sorted(resumed) == list(range(1, 9))
    # FSDP2's reduce-scatter sums gradients in another order than one process does, and Adam's normalised step
    # carries that rounding into the weights (about 1e-5 after 8 steps here): the resharded run must be as close to
    # the one-process run as an uninterrupted FSDP2 run is
    sharded = write_recipe("sharded.yaml", output_dir=str(tmp_path / "sharded"), per_device_train_batch_size=4,
                           **common)
    assert _launch(sharded, "s", "fsdp2").returncode == 0
    one = _weights(tmp_path / "whole")
    floor, worst = (max(float((one[k] - other[k]).abs().max()) for k in one)
                    for other in (_weights(tmp_path / "sharded"), _weights(run)))
    print(f"max |Δweight| against one process: uninterrupted FSDP2 {floor:.2e}, resharded twice {worst:.2e}")
    assert worst <= max(1e-5, 2 * floor), (worst, floor)


def test_a_stream_resumed_on_other_process_counts_trains_on_the_blocks_of_an_uninterrupted_run(write_recipe, tmp_path):
    """A stream split into 2 parts (stream_parts): 2 processes, preempted; 1 process with 2 accumulation steps,
    preempted; 2 processes to the end. Every step trains on the blocks the uninterrupted run trained on (each part
    gives each step the same blocks; their order within the step follows the processes)."""
    corpus = corpus_files(tmp_path / "corpus", files=4, chars=30_000)  # four source files: two per part
    common = dict(dataset=str(corpus), streaming=True, stream_parts=2, validation_blocks=4, max_steps=8, eval_steps=0,
                  save_steps=100, logging_steps=4, report_to=["jsonl"])
    whole = write_recipe("whole.yaml", output_dir=str(tmp_path / "whole"), per_device_train_batch_size=4,
                         gradient_accumulation_steps=2, **common)
    assert _launch(whole, "whole", 1).returncode == 0
    expected = {step: sorted(seqs) for step, seqs in _global_order(tmp_path / "whole", "whole", 1).items()}
    assert sorted(expected) == list(range(1, 9)) and len({h for s in expected.values() for h in s}) == 64

    parted = write_recipe("parted.yaml", output_dir=str(tmp_path / "parted"), per_device_train_batch_size=4,
                          **common)
    first = _launch(parted, "a", 2, signal_after=2)
    assert first.returncode != 0 and f"exitcode  : {PREEMPTED}" in first.stderr, first.stderr[-3000:]
    second = _launch(parted, "b", 1, "per_device_train_batch_size=4", "gradient_accumulation_steps=2",
                     resume="auto", signal_after=2)
    assert second.returncode == PREEMPTED and "stopped by SIGTERM at step 6" in second.stderr, second.stderr[-3000:]
    third = _launch(parted, "c", 2, "per_device_train_batch_size=2", "gradient_accumulation_steps=2", resume="auto")
    assert third.returncode == 0, third.stderr[-3000:]
    run = tmp_path / "parted"
    orders = [_global_order(run, "a", 2), _global_order(run, "b", 1), _global_order(run, "c", 2)]
    assert [sorted(order) for order in orders] == [[1, 2, 3], [4, 5, 6], [7, 8]]
    assert {step: sorted(seqs) for order in orders for step, seqs in order.items()} == expected
    # the blocks of a step are summed in another order on 2 processes than on 1, and Adam's normalised step carries
    # that rounding into the weights: the resumed run must be as close to the one-process run as an uninterrupted
    # 2-process run is
    two = write_recipe("two.yaml", output_dir=str(tmp_path / "two"), per_device_train_batch_size=4, **common)
    assert _launch(two, "two", 2).returncode == 0
    one = _weights(tmp_path / "whole")
    floor, worst = (max(float((one[k] - other[k]).abs().max()) for k in one)
                    for other in (_weights(tmp_path / "two"), _weights(run)))
    print(f"stream: max |Δweight| against one process: uninterrupted on 2 {floor:.2e}, resumed twice {worst:.2e}")
    assert worst <= max(1e-5, 2 * floor), (worst, floor)


def _start_cli(*args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([str(Path(sys.executable).with_name("angpt")), "train", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)


def _wait_for(condition, process: subprocess.Popen, timeout: float = 240.0) -> None:
    import time

    start = time.monotonic()
    while not condition():
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() - start < timeout, "timed out"
        time.sleep(0.05)


def _logged_steps(run: Path) -> list[int]:
    metrics = run / "metrics.jsonl"
    return [json.loads(line)["step"] for line in metrics.read_text().splitlines()] if metrics.is_file() else []


def test_the_named_signal_stops_the_command_with_a_checkpoint_and_resume_auto_continues(write_recipe, tmp_path):
    """SLURM's `--signal=USR1@90` as a recipe key; `--resume auto` is the one command line of every start."""
    import signal

    run = tmp_path / "run"
    recipe = write_recipe(max_steps=400, eval_steps=0, save_steps=1000, logging_steps=1, report_to=["jsonl"],
                          preemption_signal="USR1")
    cli = _start_cli(str(recipe), "--resume", "auto")
    _wait_for(lambda: len(_logged_steps(run)) >= 3, cli)
    cli.send_signal(signal.SIGUSR1)
    out, err = cli.communicate(timeout=120)
    assert cli.returncode == PREEMPTED, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("angpt train: stopped by SIGUSR1 at step ")]
    assert len(lines) == 1 and f"angpt train {recipe} --resume auto`" in lines[0], err[-3000:]
    step = int(lines[0].split(" at step ")[1].split(",")[0])
    assert step >= 3 and [p.name for p in (run / "checkpoints").iterdir()] == [f"step_{step:07d}"]
    cli = _start_cli(str(recipe), "--resume", "auto", "-o", f"max_steps={step + 2}")
    out, err = cli.communicate(timeout=300)
    assert cli.returncode == 0 and f"resumed from {run / 'checkpoints' / f'step_{step:07d}'}" in out + err, err


@pytest.mark.parametrize("moment", ["before-marker", "before-rename"])
def test_a_kill_during_a_save_leaves_no_checkpoint_that_resume_would_take(write_recipe, tmp_path, moment):
    """SIGKILL while step 8's checkpoint is committed (every file written; the marker not yet, or the marker but not
    the rename): --resume takes step 4, and the next save of step 8 replaces the debris."""
    run = tmp_path / "run"
    recipe = write_recipe(max_steps=12, eval_steps=0, save_steps=4, save_total_limit=1, logging_steps=1)
    killed = _launch(recipe, "killed", 1, kill_in_save=f"8:{moment}")
    assert killed.returncode == -9, killed.stderr[-3000:]
    root = run / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == [".tmp_step_0000008", "step_0000004"]
    cli = _start_cli(str(recipe), "--resume", "-o", "max_steps=8")
    out, err = cli.communicate(timeout=300)
    assert cli.returncode == 0 and f"resumed from {root / 'step_0000004'}" in out + err, err[-3000:]
    assert sorted(p.name for p in root.iterdir()) == ["step_0000008"]
