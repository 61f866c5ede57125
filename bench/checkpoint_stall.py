#!/usr/bin/env python
"""How long training stops at a checkpoint: the step time at a save step with accelerate's `save_state` (the
trainer's synchronous checkpoint), with a synchronous `torch.distributed.checkpoint.save`, and with the asynchronous
`AsyncCheckpointer` (modeling_angpt/training/async_checkpoint.py), beside the step time without a save.

Two CPU processes (torchrun, gloo) train an anGPT of at least 100M parameters under DDP (accelerate) with AdamW. The
three kinds of save take turns, round by round, so that drift of the machine affects them alike; medians over the
rounds. A step here is forward, backward, optimiser step, the save (or the asynchronous save's poll) and a barrier, so
a rank that writes alone holds the other one up as in training. After an asynchronous save, the steps that run while
the write goes on are timed too: on a machine with few cores the writer thread takes CPU time from training, and
their extra time over the plain step is what the asynchronous save still costs.

    python bench/checkpoint_stall.py [--processes 2 --hidden 768 --layers 10 --vocab 8192 --seq 64 --rounds 3]
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout

from results_file import (add_output_arguments, command_line, counted, help_description,  # noqa: E402
                          machine_line, update_section)

FLIGHT = "while the asynchronous write runs"
KINDS = ("accelerate save_state (synchronous)", "dcp.save (synchronous)", "AsyncCheckpointer.start (asynchronous)")


def parse(argv=None):
    parser = argparse.ArgumentParser(description=help_description(__doc__))
    parser.add_argument("--processes", type=int, default=2, help="CPU processes torchrun starts (default 2)")
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=10, help="decoder layers (default 10: 107M parameters)")
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=1, help="sequences per process and step")
    parser.add_argument("--seq", type=int, default=64, help="tokens per sequence")
    parser.add_argument("--rounds", type=int, default=3, help="saves of each kind (medians over them)")
    parser.add_argument("--dir", default=None, help="the folder in which a new directory for the checkpoints is "
                        "made (default: the system's temporary folder); it and each checkpoint are removed once timed")
    add_output_arguments(parser, plots=False)
    return parser.parse_args(argv)


def launch(args, argv) -> int:
    """Start this script again under torchrun (one CPU thread per process, as `angpt train` on CPU processes)."""
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ANGPT_BENCH_COMMAND": command_line(__file__, argv)}
    command = [str(torchrun), "--nproc_per_node", str(args.processes), os.path.abspath(__file__), *argv]
    return subprocess.run(command, env=env).returncode


def build(args, accelerator):
    import torch

    from modeling_angpt import AnGPTConfig, AnGPTForCausalLM

    torch.manual_seed(0)
    config = AnGPTConfig(architecture="angpt", vocab_size=args.vocab, hidden_size=args.hidden,
                         intermediate_size=4 * args.hidden, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, max_position_embeddings=max(args.seq, 64), use_cache=False)
    model = AnGPTForCausalLM._from_config(config, attn_implementation="sdpa").train()
    parameters = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=torch.Generator().manual_seed(1))
    return model, optimizer, ids, parameters


def accelerator_broadcast(accelerator, value):
    """Rank 0's `value` on every rank."""
    from accelerate.utils import broadcast_object_list

    return broadcast_object_list([value])[0] if accelerator.num_processes > 1 else value


class Stepper:
    """One timed step: forward, backward, AdamW, then `after` (a save or a poll), then a barrier."""

    def __init__(self, accelerator, model, optimizer, ids):
        self.accelerator, self.model, self.optimizer, self.ids = accelerator, model, optimizer, ids

    def __call__(self, after=lambda: None, name: str = "no save") -> float:
        start = time.perf_counter()
        loss = self.model(input_ids=self.ids, labels=self.ids).loss
        self.accelerator.backward(loss)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        after()
        self.accelerator.wait_for_everyone()
        seconds = time.perf_counter() - start
        if self.accelerator.is_main_process:
            print(f"{name}: {seconds:.2f} s", file=sys.stderr, flush=True)  # progress
        return seconds


def one_round(step: Stepper, checkpointer, root: Path, index: int, times: dict) -> None:
    """A plain step, then one save of each kind with a plain step between (the asynchronous one: steps until its
    write is committed). Each checkpoint is removed once timed."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    accelerator = step.accelerator

    def dcp_save(directory):
        model_state, optimizer_state = get_state_dict(step.model, step.optimizer)
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=directory)

    saves = {KINDS[0]: lambda directory: accelerator.save_state(str(directory), safe_serialization=True),
             KINDS[1]: dcp_save,
             KINDS[2]: lambda directory: checkpointer.start(step.model, step.optimizer, directory, lambda: None)}
    times["no save"].append(step())
    for kind, save in saves.items():
        directory = root / f"round{index}_{KINDS.index(kind)}"
        times[kind].append(step(lambda: save(directory), kind))
        while checkpointer.in_flight:
            times[FLIGHT].append(step(checkpointer.poll, FLIGHT))
        times["no save"].append(step())
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            shutil.rmtree(directory, ignore_errors=True)


def measure(args) -> None:
    from accelerate import Accelerator, DistributedDataParallelKwargs

    from modeling_angpt.training.async_checkpoint import AsyncCheckpointer

    # gradients in DDP's buckets, not beside them: one copy of the gradients less in memory
    accelerator = Accelerator(cpu=True, kwargs_handlers=[DistributedDataParallelKwargs(gradient_as_bucket_view=True)])
    model, optimizer, ids, parameters = build(args, accelerator)
    step = Stepper(accelerator, model, optimizer, ids)
    for _ in range(2):  # warm-up: AdamW's moments exist from the first step on
        step()
    checkpointer = AsyncCheckpointer()
    made = None
    if accelerator.is_main_process:  # a new directory, named by rank 0, shared by both ranks
        if args.dir:
            Path(args.dir).mkdir(parents=True, exist_ok=True)
        made = tempfile.mkdtemp(prefix="angpt_checkpoint_stall_", dir=args.dir)
    root = Path(accelerator_broadcast(accelerator, made))
    times = {"no save": [], **{kind: [] for kind in KINDS}, FLIGHT: []}
    try:
        for index in range(args.rounds):
            one_round(step, checkpointer, root, index, times)
    finally:
        checkpointer.close()
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            shutil.rmtree(root, ignore_errors=True)
    if accelerator.is_main_process:
        report(args, accelerator.num_processes, parameters, times)
    accelerator.end_training()


def report(args, processes: int, parameters: int, times: dict) -> None:
    plain = statistics.median(times["no save"])
    state_gb = parameters * 4 * 3 / 1e9  # float32 weights and AdamW's two moments
    lines = ["## Checkpoint stall: step time at a save step, synchronous vs asynchronous, 2 CPU processes", "",
             f"`{os.environ.get('ANGPT_BENCH_COMMAND', command_line(__file__, None))}`: anGPT of "
             f"{parameters / 1e6:.0f}M parameters (d={args.hidden}, L={args.layers}, V={args.vocab}), AdamW, float32, "
             f"DDP over {processes} CPU processes (torchrun, gloo, one torch thread each), {args.batch}×{args.seq} "
             f"tokens per process and step; {state_gb:.1f} GB of model and optimiser state per save. A step = "
             "forward, backward, AdamW, the save (or the asynchronous save's poll), a barrier. Saves of each kind "
             f"taken in turn over {args.rounds} rounds; medians; every save into a new directory on the local disk.",
             "", machine_line(), "",
             "| step | median (s) | over the plain step (s) | each (s) |", "|---|---|---|---|"]
    for name, values in times.items():
        if values:
            median = statistics.median(values)
            each = ", ".join(f"{v:.2f}" for v in values) if len(values) <= 12 else f"{len(values)} steps"
            lines.append(f"| {name} | {median:.2f} | {median - plain:+.2f} | {each} |")
    flight = times[FLIGHT]
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kB on Linux
    lines += ["", f"The asynchronous writes ran during {counted(len(flight), 'step')} after "
              f"{counted(args.rounds, 'save')} ({len(flight) / max(args.rounds, 1):.1f} per save), which took "
              f"{sum(flight):.2f} s in all against {len(flight) * plain:.2f} s for as many plain steps. Peak resident "
              f"memory of rank 0: {peak_gb:.1f} GB (the asynchronous save keeps a copy of the whole state in CPU "
              "memory, reused from one save to the next)."]
    section = "\n".join(lines)
    print(section)
    if not args.no_write:
        update_section("checkpoint_stall", section, args.results)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if "LOCAL_RANK" not in os.environ:
        return launch(args, argv)
    measure(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
