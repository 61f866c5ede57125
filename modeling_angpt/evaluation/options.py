"""The options of an evaluation: `EvalOptions`, what `evaluate`/`prepare` take and every suite receives.

    from modeling_angpt.evaluation import EvalOptions, evaluate
    report = evaluate("runs/demo/folded", EvalOptions(suite=["offline"], limit=50))
    report = evaluate("runs/demo/folded", suite="offline,perplexity", batch_size=16)   # the same, as keywords

The fields are the options of `angpt eval` with its defaults (commands/eval.py builds an EvalOptions from the
command line), plus two that only Python callers set (`train_length`, `query_chunk_size`). Numbers and lists may
be given as the command line gives them, as text ("1,4,16", "0.5"); `normalized()` parses and checks them and is
what the suites receive.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from .inputs import EvalInputError, check_device

DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class EvalOptions:
    # --- what to evaluate (`--suite`, `--tasks`; several names comma-separated or as a list) ----------------------
    suite: list[str] | str | None = None          # own suites and groups: offline, paper, perplexity, length, needle;
                                                  # offline when neither suite nor tasks is given
    tasks: list[str] | str | None = None          # lm-eval task or group names (eval/tasks is always included)
    include_path: list[str] | str | None = field(default_factory=list)   # extra directories of lm-eval task YAMLs
    # --- lm-eval's options, under its names ------------------------------------------------------------------------
    num_fewshot: int | str | None = None          # few-shot examples per prompt
    batch_size: int | str = 1                     # a positive integer, "auto" or "auto:N" (lm-eval finds the largest)
    limit: int | float | str | None = None        # examples per task (a fraction if below 1); also the length and
                                                  # needle suites' windows and examples
    seed: int | str | None = None                 # one seed for lm-eval's random, numpy, torch and few-shot seeds
    log_samples: bool = False                     # keep every example's inputs and outputs in the report
    bootstrap_iters: int | str = 100000           # bootstrap resamples for stderr (0: none)
    output_path: str | None = None                # results directory (default eval_results/<checkpoint>/<UTC time>)
    # --- the model ---------------------------------------------------------------------------------------------------
    device: str | None = None                     # cpu, cuda, cuda:N, mps, xpu (default: cuda when available)
    dtype: str = "auto"                           # auto (the checkpoint's), float32, bfloat16 or float16
    # --- the project's own suites and offline tasks -----------------------------------------------------------------
    lengths: list[int] | str | None = None        # length/needle suites: multiples of the training context
    corpus: str | None = None                     # offline tasks and length suite: held-out text file or recipe YAML
    data_seed: int | str | None = None            # offline tasks: data seed (default 1234)
    train_length: int | None = None               # length/needle suites: the training context of a checkpoint
                                                  # without training_metadata.json (Python only)
    query_chunk_size: int | None = None           # length/needle suites: attention query chunk (default: the largest
                                                  # the memory bound allows; Python only)

    def normalized(self) -> "EvalOptions":
        """A copy with the numbers and lists parsed and checked (one-line EvalInputError naming the option) and the
        device resolved; the suites receive this form."""
        return normalize_options(self)


def _as_list(value) -> list[str]:
    if value is None:
        return []
    items = value if isinstance(value, (list, tuple)) else [value]
    return [part.strip() for item in items for part in str(item).split(",") if part.strip()]


def _integer(value, name: str, minimum: int) -> int | None:
    """An integer option given as a number or as text; None stays None."""
    if value is None:
        return None
    try:
        number = int(str(value))
    except ValueError:
        number = None
    if number is None or number < minimum:
        raise EvalInputError(f"--{name.replace('_', '-')} {value}: expected an integer >= {minimum}")
    return number


def normalize_options(options: EvalOptions) -> EvalOptions:
    """`options.normalized()`: parsed and checked (one-line EvalInputError), leaving `options` as it was."""
    tasks, suite = _as_list(options.tasks), _as_list(options.suite)
    if not tasks and not suite:
        suite = ["offline"]

    batch = str(options.batch_size).strip()
    if re.fullmatch(r"auto(:\d+(\.\d+)?)?", batch):
        batch_size = batch
    elif re.fullmatch(r"\d+", batch) and int(batch) > 0:
        batch_size = int(batch)
    else:
        raise EvalInputError(f"--batch-size {options.batch_size}: expected a positive integer, 'auto' or 'auto:N'")
    limit = options.limit
    if limit is not None:
        try:
            number = float(limit)
        except (TypeError, ValueError):
            raise EvalInputError(f"--limit {limit}: expected a number of examples per task (or a fraction "
                                 "below 1)") from None
        if not number > 0 or (number >= 1 and not number.is_integer()):
            raise EvalInputError(f"--limit {limit}: expected a positive integer, or a fraction in (0, 1)")
        limit = int(number) if number >= 1 else number
    numbers = {name: _integer(getattr(options, name), name, 0)
               for name in ("num_fewshot", "seed", "bootstrap_iters", "data_seed")}
    lengths = options.lengths
    if lengths is not None and not isinstance(lengths, list):
        parts = [p.strip() for p in str(lengths).split(",")]
        if not all(re.fullmatch(r"\d+", p) and int(p) > 0 for p in parts):
            raise EvalInputError(f"--lengths {lengths}: expected positive integers separated by commas "
                                 "(multiples of the training context), e.g. 1,2,4,8,16")
        lengths = [int(p) for p in parts]
    if options.dtype not in DTYPES:
        raise EvalInputError(f"--dtype {options.dtype}: expected one of {', '.join(DTYPES)}")
    return dataclasses.replace(options, tasks=tasks, suite=suite, include_path=_as_list(options.include_path),
                               batch_size=batch_size, limit=limit, lengths=lengths, device=check_device(options.device),
                               **numbers)
