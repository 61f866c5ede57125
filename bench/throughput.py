#!/usr/bin/env python
"""Training throughput and MFU: anGPT, GPT+, nGPT and transformers' LlamaForCausalLM of one shape, under one loop,
eager and torch.compile (the anGPT paper reports step times on 4×A100: GPT+ 0.1416 s, anGPT +2.75 %, nGPT +9.6 %).

A step = forward, backward, AdamW step, zero_grad and the architecture's weight constraint (anGPT's row ball,
nGPT's unit norm; GPT+ and Llama have none), under bf16 autocast (--precision; by default float32 on a CPU without
native bfloat16, where bfloat16 runs ~100x slower). The models run interleaved round by round so that drift of the machine
affects them alike; medians are reported. MFU = model FLOPs per step (training.metrics: 6·N per token for the
matrices + the attention term) / the matmul peak measured on the same machine in the same run (best of repeated
n×n matmuls in the same precision, n = --peak-size), so it is "fraction of what this machine's matmul reaches", not of a data sheet.

    python bench/throughput.py                         # d=256, 4 layers, 16×256 tokens on the CPU
    python bench/throughput.py --size quick            # seconds
    python bench/throughput.py --device cuda           # d=1024, 12 layers, 16×1024 tokens on a GPU
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch

import results_file as rf

SIZES = {
    "default": dict(hidden=256, layers=4, heads=4, vocab=8192, batch=16, seq=256, rounds=10, warmup=3, peak_size=2048),
    "quick": dict(hidden=128, layers=2, heads=2, vocab=4096, batch=8, seq=128, rounds=3, warmup=1, peak_size=1024),
    "device": dict(hidden=1024, layers=12, heads=16, vocab=32768, batch=16, seq=1024, rounds=20, warmup=5,
                   peak_size=8192),
}
MODELS = ("gptplus", "angpt", "ngpt", "llama")


def build_model(name: str, cfg: dict):
    from modeling_angpt import AnGPTConfig, AnGPTForCausalLM

    shape = dict(vocab_size=cfg["vocab"], hidden_size=cfg["hidden"], intermediate_size=4 * cfg["hidden"],
                 num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"],
                 max_position_embeddings=cfg["seq"], tie_word_embeddings=False, use_cache=False)
    if name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(**shape, num_key_value_heads=cfg["heads"], attention_bias=False, mlp_bias=False)
        return LlamaForCausalLM._from_config(config, attn_implementation="sdpa")
    return AnGPTForCausalLM._from_config(AnGPTConfig(architecture=name, **shape), attn_implementation="sdpa")


def make_step(name: str, cfg: dict, device: torch.device, compiled: bool, dtype: torch.dtype):
    from modeling_angpt.training.model_setup import compile_blocks

    model = build_model(name, cfg).to(device).train()
    raw = model
    if compiled:  # regional, as the recipes' torch_compile: one block's warm-up (a whole 12-layer model took minutes)
        compile_blocks(model)
    optimizer = torch.optim.AdamW(raw.parameters(), lr=1e-4, weight_decay=0.0)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), generator=generator).to(device)
    autocast = torch.autocast(device.type, dtype=dtype) if dtype != torch.float32 else contextlib.nullcontext()
    constrain = getattr(raw, "apply_weight_constraints", lambda: None)

    def step():
        with autocast:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        constrain()

    return step, raw


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measured_peak(device: torch.device, n: int, dtype: torch.dtype, repeats: int = 5) -> float:
    """FLOP/s of the best of `repeats` n×n×n matmuls in `dtype` (what the models' matmuls run in)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b  # warm-up (library initialisation, clocks)
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        a @ b
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def measure(cfg: dict, device: torch.device, compiled: bool, dtype: torch.dtype) -> dict:
    from modeling_angpt.training.metrics import training_flops_per_token

    steps, flops = {}, {}
    for name in MODELS:
        torch.manual_seed(0)
        steps[name], raw = make_step(name, cfg, device, compiled, dtype)
        flops[name] = training_flops_per_token(raw, cfg["seq"]) * cfg["batch"] * cfg["seq"]
        for _ in range(cfg["warmup"]):  # compile happens here
            steps[name]()
    times = {name: [] for name in MODELS}
    for _ in range(cfg["rounds"]):
        for name, step in steps.items():
            synchronize(device)
            start = time.perf_counter()
            step()
            synchronize(device)
            times[name].append(time.perf_counter() - start)
    return {name: {"median": statistics.median(t), "flops": flops[name], "times": t} for name, t in times.items()}


def precision(choice: str, device: torch.device) -> tuple[torch.dtype, str]:
    """(dtype, words for the section) of --precision; auto = bf16 unless this CPU has no native bfloat16."""
    from modeling_angpt.training.metrics import cpu_lacks_native_bf16

    if choice == "auto":
        ratio = cpu_lacks_native_bf16() if device.type == "cpu" else None
        if ratio is not None:
            return torch.float32, (f"float32 (`--precision auto`: this CPU's bfloat16 matmul runs at {ratio:.3f}× "
                                   "its float32 speed, no native bfloat16)")
        choice = "bf16"
    return (torch.bfloat16, "bf16 autocast") if choice == "bf16" else (torch.float32, "float32")


def section(rows: dict, cfg: dict, peak: dict, command: str, device: torch.device, loads: tuple[str, str],
            precision_text: str) -> str:
    tokens = cfg["batch"] * cfg["seq"]
    where = "" if device.type == "cpu" else f", on {device.type.upper()}"
    lines = [f"## Training throughput and MFU{where}: anGPT, nGPT, GPT+ and Llama, eager and torch.compile "
             "(the anGPT paper: anGPT +2.75 %, nGPT +9.6 % step time over GPT+ on 4×A100)", "", f"`{command}`", "",
             f"{rf.machine_line(device.type)} Load average at the start: {loads[0]}, at the end: {loads[1]}.", "",
             f"Shape (all four): d={cfg['hidden']}, {cfg['layers']} layers, {cfg['heads']} heads, MLP 4d SwiGLU, "
             f"vocab {cfg['vocab']}, untied head; {cfg['batch']}×{cfg['seq']} = {tokens:,} tokens per step, "
             f"{precision_text}, sdpa attention. Step = forward, backward, AdamW, weight constraint; 'compile' "
             "compiles each decoder block (regional compilation, as the recipes' `torch_compile: true`). "
             f"{cfg['rounds']} rounds after {cfg['warmup']} warm-up steps, models interleaved; medians. Llama is transformers' "
             "`LlamaForCausalLM` (full RoPE, gained RMSNorms, no QK-norm). MFU = model FLOPs per step / the "
             f"matmul peak measured in this run in the same precision ({cfg['peak_size']}³ matmul)."]
    for mode in rows:
        lines += [f"Measured peak before the {mode} runs: {peak[mode] / 1e9:,.1f} GFLOP/s."]
    lines += ["", "| model | mode | median step (s) | tokens/s | model GFLOP/step | MFU | step time vs GPT+ (same mode) |",
              "|---|---|---|---|---|---|---|"]
    for mode, measured in rows.items():
        base = measured["gptplus"]["median"]
        for name, m in measured.items():
            lines.append(f"| {name} | {mode} | {m['median']:.4f} | {tokens / m['median']:,.0f} | "
                         f"{m['flops'] / 1e9:.1f} | {m['flops'] / m['median'] / peak[mode]:.1%} | "
                         f"{m['median'] / base:.3f}× |")
    if float(loads[0].split("/")[0]) > 1.0 and device.type == "cpu":
        lines += ["", f"**Not a quiet machine** (load average {loads[0]} on {torch.get_num_threads()} threads): "
                  "other jobs shared the cores, so these times and ratios need a re-run on a quiet machine."]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=rf.help_description(__doc__))
    parser.add_argument("--size", choices=SIZES, default="default")
    parser.add_argument("--device", default=None, help="cpu or cuda (cuda also picks the 'device' size)")
    for name in SIZES["default"]:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, help="override the size's value")
    parser.add_argument("--modes", nargs="+", choices=("eager", "compile"), default=["eager", "compile"])
    parser.add_argument("--threads", type=int, help="torch threads on the CPU")
    parser.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto",
                        help="the models' matmul precision (auto: bf16, float32 on a CPU without native bfloat16)")
    rf.add_output_arguments(parser)
    args = parser.parse_args(argv)
    device = torch.device(args.device or "cpu")
    cfg = dict(SIZES["device" if device.type == "cuda" and args.size == "default" else args.size])
    cfg.update({k: getattr(args, k) for k in SIZES["default"] if getattr(args, k) is not None})
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        dtype, precision_text = precision(args.precision, device)
        start_load = rf.load_average()
        rows, peak = {}, {}
        for mode in args.modes:  # the section is written after each mode: a run stopped in the next keeps this one
            peak[mode] = measured_peak(device, cfg["peak_size"], dtype)
            with torch._dynamo.config.patch(cache_size_limit=64) if mode == "compile" else contextlib.nullcontext():
                rows[mode] = measure(cfg, device, compiled=mode == "compile", dtype=dtype)
            text = section(rows, cfg, peak, rf.command_line(__file__, argv), device,
                           (start_load, rf.load_average()), precision_text)
            if not args.no_write:
                write(text, rows, cfg, device, args)
    finally:
        torch.set_num_threads(threads)
    print(text)


def write(text: str, rows: dict, cfg: dict, device: torch.device, args) -> None:
    """The section and its plot; a GPU's figures go to their own section beside the CPU's."""
    name = "throughput" if device.type == "cpu" else f"throughput_{device.type}"
    plot(rows, cfg, f"{args.plots_dir}/{name}.png")
    text += f"\n\n![tokens/s per model and mode]({rf.plot_link(args.results, f'{args.plots_dir}/{name}.png')})"
    rf.update_section(name, text, args.results)


def plot(rows: dict, cfg: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tokens = cfg["batch"] * cfg["seq"]
    figure, axis = plt.subplots(figsize=(6, 3.6))
    width = 0.8 / len(rows)
    for i, (mode, measured) in enumerate(rows.items()):
        names = list(measured)
        medians = [tokens / measured[n]["median"] for n in names]
        spreads = [[m - tokens / max(measured[n]["times"]) for m, n in zip(medians, names)],
                   [tokens / min(measured[n]["times"]) - m for m, n in zip(medians, names)]]
        axis.bar([j + i * width for j in range(len(names))], medians, width, yerr=spreads, capsize=3, label=mode)
        axis.set_xticks([j + width * (len(rows) - 1) / 2 for j in range(len(names))], names)
    axis.set(ylabel="training tokens/s (median, min–max)", title=f"d={cfg['hidden']}, {cfg['layers']} layers")
    axis.legend()
    rf.save_figure(figure, path)


if __name__ == "__main__":
    main()
