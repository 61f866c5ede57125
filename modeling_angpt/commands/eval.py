"""`angpt eval CHECKPOINT [--suite ...] [--tasks ...]`: evaluate a checkpoint, print a table, write results.

A thin layer over modeling_angpt.evaluation (lm_eval.simple_evaluate on an HFLM built on the loaded model,
and the project's own suites). Bad input (unknown task or suite, unreachable data, not a checkpoint, bad
numbers, an existing result file) is one line on stderr with exit status 2, checked before the model loads.

The options are the fields of modeling_angpt.evaluation.EvalOptions. Those that lm-eval also has keep lm-eval's
names on purpose (--output-path, --num-fewshot, --batch-size, --limit, --log-samples, --bootstrap-iters,
--include-path), so an lm-eval command line carries over; the output directory is therefore --output-path here,
where the other commands say --output-dir.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

SUITE_HELP = ("offline: lm-eval group angpt_offline (cloze, last word, rolling perplexity on local held-out "
              "text; no Hub); paper: angpt_paper (hellaswag, arc_easy, arc_challenge, piqa, winogrande, "
              "lambada_openai; Hub data); perplexity: held-out loss on the checkpoint's training validation "
              "split; length: loss at multiples of the training context; needle: needle-in-a-haystack "
              "retrieval. Comma-separated; default offline when no --tasks are given")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="checkpoint directory (training form or folded) with its tokenizer")
    parser.add_argument("--suite", action="append", default=None, metavar="NAMES", help=SUITE_HELP)
    parser.add_argument("--tasks", action="append", default=None, metavar="NAMES",
                        help="comma-separated lm-eval task/group names (e.g. angpt_cloze, arc_easy); "
                             "eval/tasks is always included")
    parser.add_argument("--num-fewshot", default=None, metavar="N", help="lm-eval: few-shot examples per prompt")
    parser.add_argument("--batch-size", default="1", metavar="N|auto",
                        help="batch size (lm-eval and own suites); 'auto' lets lm-eval find the largest (default 1)")
    parser.add_argument("--limit", default=None, metavar="N",
                        help="examples per lm-eval task (a fraction if below 1), also passed to the length "
                             "and needle suites; the perplexity suite always scores what training evaluated")
    parser.add_argument("--seed", default=None, metavar="N",
                        help="one seed for lm-eval's random, numpy, torch and few-shot seeds (default "
                             "lm-eval's 0,1234,1234,1234)")
    parser.add_argument("--log-samples", action="store_true", help="keep every example's inputs and outputs "
                        "in results.json")
    parser.add_argument("--bootstrap-iters", default=100000, metavar="N",
                        help="lm-eval: bootstrap resamples for stderr (0 = no stderr; default 100000)")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:N, mps (default: cuda if available)")
    parser.add_argument("--dtype", default="auto", help="auto (the checkpoint's), float32, bfloat16 or float16")
    parser.add_argument("--output-path", default=None, metavar="DIR",
                        help="directory for results.json and results.md (default eval_results/<checkpoint>/"
                             "<UTC time>); an existing result file is never overwritten. Named after lm-eval's "
                             "--output_path on purpose, like the other lm-eval options here (other angpt commands "
                             "say --output-dir)")
    parser.add_argument("--include-path", action="append", default=None, metavar="DIR",
                        help="extra directory of lm-eval task YAMLs (eval/tasks is always included)")
    parser.add_argument("--lengths", default=None, metavar="M1,M2,...",
                        help="length/needle suites: multiples of the training context, e.g. 1,2,4,8,16")
    parser.add_argument("--corpus", default=None, metavar="PATH",
                        help="offline tasks: held-out text: a text file (used whole) or a training recipe YAML "
                             "(its validation split); default: the demo recipe's validation split")
    parser.add_argument("--data-seed", default=None, metavar="N", help="offline tasks: data seed (default 1234)")


def eval_options(args: argparse.Namespace):
    """The EvalOptions of the command line: every option of `add_arguments` is a field of the same name (the numbers
    as given, text; EvalOptions.normalized parses and checks them)."""
    from ..evaluation.options import EvalOptions

    return EvalOptions(**{f.name: getattr(args, f.name) for f in dataclasses.fields(EvalOptions)
                          if hasattr(args, f.name)})


def run(args: argparse.Namespace) -> int:
    from ..evaluation.report import markdown_table
    from ..evaluation.runner import EvalInputError, execute, prepare, quiet_lm_eval_logging

    try:
        plan = prepare(args.checkpoint, eval_options(args))
    except EvalInputError as error:
        print(f"angpt eval: {error}", file=sys.stderr)
        return 2
    quiet_lm_eval_logging()
    try:
        report = execute(plan, write=True)
    except (ValueError, FileNotFoundError) as error:  # the suites' one-line messages (their contract)
        print(f"angpt eval: {_first_line(error)}", file=sys.stderr)
        return 2
    except (ConnectionError, OSError) as error:        # data that failed to load while running
        print(f"angpt eval: {type(error).__name__}: {_first_line(error)}", file=sys.stderr)
        return 1
    print(f"{plan.checkpoint} (weights sha256 {report['checkpoint']['weights_sha256'][:12]}, {report['dtype']} "
          f"on {report['device']}, {report['seconds']} s)")
    print(markdown_table(report))
    print(f"results: {report['files']} (table: results.md beside it)")
    return 0


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
