"""Preemption: a scheduler's stop signal ends the run with a checkpoint of the step it reached (docs/training.md,
"Preemption").

SLURM and Kubernetes stop a job with SIGTERM and kill it a grace period later; SLURM can send a chosen signal earlier
(`#SBATCH --signal=USR1@90`). The handler only sets a flag: a signal may arrive in the middle of a collective, a
backward or a write, where nothing can be saved. The flag travels with the loss the ranks already reduce at every
step (loop.accumulate_gradients), so all ranks learn at the same step boundary that one of them was signalled, also
when the signal reached only some of them, without a collective of its own and without a deadlock. They then write
the checkpoint of that step, the main process prints one line naming the step and the command that continues, and
every process exits with PREEMPTED_EXIT_CODE.
"""
from __future__ import annotations

import contextlib
import signal
import sys

# EX_TEMPFAIL of sysexits.h ("a temporary failure; the user is invited to retry"): the checkpoint of the step reached
# is written and the same command continues the run. Documented for schedulers in docs/training.md.
PREEMPTED_EXIT_CODE = 75
DEFAULT_SIGNALS = ("SIGTERM",)


class Preempted(Exception):
    """The run stopped at a signal after writing the checkpoint of `step` (raised to the command, which exits with
    PREEMPTED_EXIT_CODE)."""

    def __init__(self, step: int, signal_name: str, checkpoint):
        super().__init__(f"stopped by {signal_name} at step {step}; checkpoint {checkpoint} written")
        self.step, self.signal_name, self.checkpoint = step, signal_name, checkpoint


def signal_number(name: str) -> signal.Signals:
    """`name` as SIGUSR1, USR1 or a number; one line naming the recipe key when it is none of them."""
    text = str(name).strip().upper()
    try:
        return signal.Signals(int(text)) if text.isdigit() else signal.Signals[text if text.startswith("SIG")
                                                                               else f"SIG{text}"]
    except (KeyError, ValueError):
        raise ValueError(f"recipe key preemption_signal={name!r}: expected a signal name such as SIGUSR1 or "
                         "USR1") from None


class StopFlag:
    """Set by the signal handlers; read at every step boundary."""

    def __init__(self):
        self.signal_name: str | None = None

    def __bool__(self) -> bool:
        return self.signal_name is not None

    def _handle(self, number, frame) -> None:  # only set the flag: see the module docstring
        self.signal_name = signal.Signals(number).name


@contextlib.contextmanager
def stop_on_signals(extra: str | None = None):
    """Install the handlers for SIGTERM and the recipe's `preemption_signal` for the duration of a run (the previous
    handlers come back after); yields the StopFlag. Outside the main thread (a run started from a worker thread)
    signals cannot be caught and the flag stays unset."""
    flag = StopFlag()
    numbers = {signal_number(name) for name in (*DEFAULT_SIGNALS, *([extra] if extra else []))}
    previous = {}
    try:
        for number in numbers:
            previous[number] = signal.signal(number, flag._handle)
    except ValueError:  # not the main thread
        pass
    try:
        yield flag
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def announce(accelerator, step: int, signal_name: str, checkpoint, command: str) -> None:
    if accelerator.is_main_process:
        print(f"angpt train: stopped by {signal_name} at step {step}, checkpoint {checkpoint} written; continue "
              f"with `{command}` (exit status {PREEMPTED_EXIT_CODE})", file=sys.stderr, flush=True)
