"""`angpt semantic-focus`: train the semantic-focus paper's model on one task with one attention configuration.

The protocol of Ram et al. (docs/evaluation.md, "Semantic-focus tasks"); a thin layer over
`modeling_angpt.evaluation.semantic_focus.run_protocol(ProtocolSettings(...))`.

    angpt semantic-focus --task even_pairs --attention-sparsity topk --attention-topk 5 --output-dir runs/ep-topk
    angpt semantic-focus --backbone paper ...   # the paper's own encoder (paper_encoder.py) instead of GPT+
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

TASK_NAMES = ("even_pairs", "parity", "cycle_navigation", "modular_arithmetic", "stack_manipulation",
              "missing_duplicates", "solve_equation", "listops")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.splitlines()[0]
    parser.add_argument("--task", required=True, choices=TASK_NAMES, help="the task to train and evaluate on")
    parser.add_argument("--output-dir", required=True, help="where metrics.jsonl, curves.png, tensorboard/ and the "
                        "model go; a directory that already holds results is refused unless --resume")
    parser.add_argument("--resume", action="store_true", help="continue the run in --output-dir from its resume.pt "
                        "(stopped, or finished and given more --epochs); its other settings must be the same")
    parser.add_argument("--seed", type=int, default=0, help="data and initialisation seed")
    parser.add_argument("--epochs", type=int, default=None, help="default: the paper's budget for the task")
    parser.add_argument("--n-train", type=int, default=5000, help="training examples (default 5000)")
    parser.add_argument("--n-heldout", type=int, default=2000, help="held-out examples (default 2000)")
    parser.add_argument("--lr", type=float, default=None, help="default: 0.1 (ListOps 1.0)")
    parser.add_argument("--gamma", type=float, default=None, help="StepLR factor per epoch; default 0.9995 (ListOps 0.99)")
    parser.add_argument("--batch-size", type=int, default=25, help="training batch size (default 25)")
    parser.add_argument("--grad-clip", type=float, default=0.5, help="gradient-norm clip (0: none)")
    parser.add_argument("--stop-at-train-acc", type=float, default=None, help="end early at this training accuracy")
    parser.add_argument("--time-limit", type=float, default=None, metavar="MINUTES",
                        help="end after the last epoch that fits in this many minutes (state saved: --resume continues)")
    parser.add_argument("--backbone", default="library", choices=("library", "paper"),
                        help="library: AnGPTForSequenceClassification (--architecture, RoPE); paper: the paper's "
                        "encoder (sinusoidal positions, non-affine LayerNorm, ReLU MLP; saved as state_dict + JSON)")
    attention = parser.add_argument_group("attention (docs/attention.md)")
    attention.add_argument("--attention-sparsity", default="none",
                           help="a registered sparsity pattern: none, topk, window, block or your own (default none)")
    attention.add_argument("--attention-topk", type=int, default=5, help="topk: keys kept per query (default 5)")
    attention.add_argument("--attention-window", type=int, default=5, help="window: keys per query (default 5)")
    attention.add_argument("--attention-block-size", type=int, default=5, help="block: block size (default 5)")
    attention.add_argument("--attention-global-tokens", type=int, default=0,
                           help="window/block: leading tokens every query sees (default 0)")
    attention.add_argument("--rope-type", default="default",
                           help="a registered rope type for the library backbone, e.g. default, proportional, "
                           "scale_invariant_p, none (default: standard RoPE)")
    attention.add_argument("--partial-rotary-factor", type=float, default=None,
                           help="fraction of each head's dimensions that rotate (default: the rope type's)")
    attention.add_argument("--attn-implementation", default="eager", help="attention backend (default eager)")
    model = parser.add_argument_group("model (paper: 5 blocks, ListOps 10; d 64; MLP 64; 1 head; dropout 0.01)")
    model.add_argument("--architecture", default="gptplus",
                       help="library backbone's architecture (default gptplus)")
    model.add_argument("--qk-norm", action=argparse.BooleanOptionalAction, default=False,
                       help="GPT+'s QK-norm (off by default: the paper's model has none)")
    model.add_argument("--num-layers", type=int, default=None, help="blocks (default: the paper's, 5; ListOps 10)")
    model.add_argument("--hidden-size", type=int, default=64, help="model width d (default 64)")
    model.add_argument("--intermediate-size", type=int, default=None, help="default 64 (gptplus), 4d otherwise")
    model.add_argument("--num-heads", type=int, default=1, help="attention heads (default 1)")
    model.add_argument("--dropout", type=float, default=0.01,
                       help="attention-probability dropout (paper backbone: also embeddings, MLP, residuals)")
    model.add_argument("--activation", default="relu", choices=("relu", "gelu", "mish"), help="paper backbone's MLP")
    parser.add_argument("--listops-min-length", type=int, default=501, help="ListOps: shortest sequence (default 501)")
    parser.add_argument("--listops-max-length", type=int, default=599, help="ListOps: longest sequence (default 599)")
    parser.add_argument("--length-generalisation", action="store_true",
                        help="NNCH's split: train on lengths 1-40, evaluate on lengths 41-500 (not ListOps)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--no-tensorboard", action="store_true", help="write no TensorBoard events")


def _error(message: str) -> int:
    print(f"angpt semantic-focus: error: {message}", file=sys.stderr)
    return 2


def _check_arguments(args: argparse.Namespace) -> str | None:
    """The first argument error, or None (checked against the registries the config validates against: no list of
    names here)."""
    from ..architectures_angpt import ARCHITECTURES
    from ..rotary_angpt import ROPE_TYPES
    from ..sparsity_angpt import SPARSITIES

    out = Path(args.output_dir)
    if args.time_limit is not None and args.time_limit <= 0:
        return f"--time-limit {args.time_limit:g}: expected a positive number of minutes"
    if not args.resume and ((out / "metrics.jsonl").exists() or (out / "summary.json").exists()):
        return f"{out} already holds results (metrics.jsonl); continue it with --resume or choose another --output-dir"
    for option, value, registry in (("--architecture", args.architecture, ARCHITECTURES),
                                    ("--rope-type", args.rope_type, ROPE_TYPES),
                                    ("--attention-sparsity", args.attention_sparsity, SPARSITIES)):
        if value not in registry:
            return f"{option} {value!r} is not registered; expected one of {sorted(registry)}"
    if args.length_generalisation and args.task == "listops":
        return ("--length-generalisation is NNCH's split; ListOps sets its lengths with --listops-min-length and "
                "--listops-max-length")
    return None


def protocol_settings(args: argparse.Namespace, started: float):
    """The protocol's settings from the command line."""
    from ..evaluation.semantic_focus import ProtocolSettings

    task_kwargs = ({"min_length": args.listops_min_length, "max_length": args.listops_max_length}
                   if args.task == "listops" else {})
    if args.length_generalisation:
        task_kwargs["length_generalisation"] = True
    model = dict(
        num_layers=args.num_layers, hidden_size=args.hidden_size, num_heads=args.num_heads, dropout=args.dropout,
        attention_sparsity=args.attention_sparsity, attention_topk=args.attention_topk,
        attention_window=args.attention_window, attention_block_size=args.attention_block_size,
        attention_global_tokens=args.attention_global_tokens)
    if args.backbone == "paper":  # the library-only flags (--architecture, --rope-type, ...) do not apply
        model.update(intermediate_size=args.intermediate_size or 64, activation=args.activation)
    else:
        model.update(intermediate_size=args.intermediate_size, architecture=args.architecture, qk_norm=args.qk_norm,
                     rope_type=args.rope_type, partial_rotary_factor=args.partial_rotary_factor,
                     attn_implementation=args.attn_implementation)
    return ProtocolSettings(
        task=args.task, output_dir=Path(args.output_dir), model=model, backbone=args.backbone,
        task_kwargs=task_kwargs, seed=args.seed, epochs=args.epochs, n_train=args.n_train, n_heldout=args.n_heldout,
        batch_size=args.batch_size, lr=args.lr, gamma=args.gamma, grad_clip=args.grad_clip or None,
        device=args.device, stop_at_train_acc=args.stop_at_train_acc, resume=args.resume,
        deadline=None if args.time_limit is None else started + 60 * args.time_limit,
        tensorboard=not args.no_tensorboard)


def run(args: argparse.Namespace) -> int:
    started = time.time()
    if (problem := _check_arguments(args)) is not None:
        return _error(problem)
    import torch

    from ..evaluation.semantic_focus import run_protocol

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        summary = run_protocol(protocol_settings(args, started))
    except (ValueError, FileExistsError, FloatingPointError) as error:
        return _error(str(error))
    final, baselines = summary["final"], summary["baselines"]
    stopped = " (stopped at --time-limit; --resume continues it)" if summary["stopped_at_deadline"] else ""
    accuracy = ("no epoch trained" if final is None else f"final train acc {final['train_acc']:.3f}, held-out acc "
                f"{final['heldout_acc']:.3f}")
    print(f"{args.task}: {summary['epochs_run']} epochs{stopped}, epochs to 95 % train accuracy: "
          f"{summary['epochs_to_95'] or 'not reached'}; {accuracy} (held-out baselines: majority class "
          f"{baselines['majority_class']['heldout_acc']:.3f}, one position "
          f"{baselines['one_position']['heldout_acc']:.3f}); results in {Path(args.output_dir)}")
    return 0
