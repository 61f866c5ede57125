"""Peak memory of a 16k-token forward on CPU, chunked eager path vs compiled FlexAttention (docs/attention.md:
long context on CPU must not materialise a T×T tensor per head).

Each measurement runs in a fresh interpreter: a short warm-up forward (FlexAttention compiles there), then the
peak resident set size is reset (/proc/self/clear_refs) and the long forward's own peak (VmHWM) measured, next to
the warm-up's peak (compilation included), the wall time and what a full [b, h, T, T] float32
score tensor would take. A flex row must not recompile or fall back to the chunked path during the long forward.
Results go to docs/results/benchmarks.md between this script's markers (other sections are left alone).

    .venv/bin/python bench/long_context_memory.py    # 16k, chunked (512 queries) and flex, alibi and scale_invariant
    .venv/bin/python bench/long_context_memory.py --length 4096 --backends angpt_chunked --transforms none
    ... --rows-from run.log --reading "..."   # rewrite the section from a run's printed rows, with a reading

`flex_attention` runs the compiled kernel: its peak should stay within the chunked path's bound (no [h, T, T]
scores, no dense ALiBi bias); the table says whether it does, per transform.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

from results_file import add_output_arguments, help_description, machine_line, update_section

CHILD = r"""
import json, sys, time
import torch
from modeling_angpt import AnGPTConfig, AnGPTForCausalLM, flex_angpt
from torch._dynamo.utils import counters
args = json.loads(sys.argv[1])
torch.manual_seed(0)
torch.set_num_threads(args["threads"])
# flex: the captured position tensors get the long length's capacity already in the short warm-up, so the
# measured forward reuses its compiled kernel (flex_angpt.py: a new capacity compiles once more)
flex_angpt.MIN_POSITIONS = max(flex_angpt.MIN_POSITIONS, args["length"])
config = AnGPTConfig(vocab_size=args["vocab"], hidden_size=args["hidden"], num_hidden_layers=args["layers"],
                     num_attention_heads=args["heads"], max_position_embeddings=4096, architecture="angpt",
                     rope_parameters={"rope_type": "scale_invariant_p"},
                     attention_logit_transform=args["transform"], attention_sparsity=args["sparsity"],
                     attention_query_chunk_size=args["chunk"])
model = AnGPTForCausalLM._from_config(config, attn_implementation=args["backend"]).eval()


def hwm_mib():  # peak RSS since the last reset (VmHWM)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024


with torch.no_grad():  # warm-up at a short length: compilation (flex) and first-call allocations
    model(torch.randint(0, args["vocab"], (1, 256)), use_cache=False, logits_to_keep=1)
warmup_peak = hwm_mib()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak RSS: what follows measures the long forward alone
before = hwm_mib()
graphs = counters["stats"]["unique_graphs"]
ids = torch.randint(0, args["vocab"], (1, args["length"]))
start = time.perf_counter()
with torch.no_grad():
    logits = model(ids, use_cache=False, logits_to_keep=1).logits
elapsed = time.perf_counter() - start
assert torch.isfinite(logits).all()
assert not flex_angpt._failed, "flex_attention fell back to the chunked path"
assert counters["stats"]["unique_graphs"] == graphs, "the long forward compiled again"
print(json.dumps({"peak_rss_mib": hwm_mib(), "rss_before_forward_mib": before, "seconds": elapsed,
                  "warmup_peak_rss_mib": warmup_peak}))
"""


def measure(args, transform: str, backend: str) -> dict:
    settings = dict(vars(args), transform=transform, backend=backend)
    settings.pop("transforms")
    settings.pop("backends")
    output = subprocess.run([sys.executable, "-c", CHILD, json.dumps(settings)], check=True, capture_output=True,
                            text=True).stdout
    result = json.loads(output.strip().splitlines()[-1])
    result["full_scores_mib"] = 4 * args.heads * args.length**2 / 2**20  # one [1, h, T, T] float32 tensor
    return result


def write_section(args, rows: list[tuple[str, dict]], reading: str = "") -> str:
    bound = {t: r["peak_rss_mib"] for (b, t), r in rows if b == "angpt_chunked"}
    lines = ["## Long context on CPU: peak memory of one forward (chunked eager path, FlexAttention)", "",
             f"`bench/long_context_memory.py`: anGPT d={args.hidden}, {args.layers} layers, {args.heads} heads "
             f"(d_h={args.hidden // args.heads}), vocab {args.vocab}, scale-invariant p-RoPE positions, "
             f"sparsity `{args.sparsity}`, batch 1, T={args.length}, float32, no grad, "
             f"`angpt_chunked` with {args.chunk} queries per chunk or compiled `flex_attention`, {args.threads} threads. "
             "Each row is a fresh process: a 256-token warm-up forward (FlexAttention compiles there, once), then "
             "the peak RSS is reset and the T-token forward measured alone (model, input, activations and attention "
             "together); 'warm-up peak' is the process's peak before that (model, compilation). 'Within chunked bound': the forward's "
             "peak is at most the chunked path's for the same transform. The last column is what one dense score "
             "tensor alone would take. Wall times depend on the machine's load. " + machine_line(), "",
             "| backend | logit transform | T | forward peak RSS (MiB) | RSS before forward (MiB) | warm-up peak RSS (MiB) "
             "| within chunked bound | forward (s) | one full T×T score tensor (MiB) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (backend, transform), r in rows:
        within = "—" if backend == "angpt_chunked" or transform not in bound else (
            "yes" if r["peak_rss_mib"] <= bound[transform] else f"no (+{r['peak_rss_mib'] - bound[transform]:.0f} MiB)")
        lines.append(f"| {backend} | {transform} | {args.length} | {r['peak_rss_mib']:.0f} | "
                     f"{r['rss_before_forward_mib']:.0f} | {r['warmup_peak_rss_mib']:.0f} | {within} | "
                     f"{r['seconds']:.1f} | {r['full_scores_mib']:.0f} |")
    if reading:
        lines += ["", reading]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[tuple[tuple[str, str], dict]]:
    parser = argparse.ArgumentParser(description=help_description(__doc__))
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--sparsity", default="none")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--transforms", nargs="+", default=["alibi", "scale_invariant"])
    parser.add_argument("--backends", nargs="+", default=["angpt_chunked", "flex_attention"])
    parser.add_argument("--reading", default="", help="a paragraph interpreting the figures, written below the table")
    parser.add_argument("--rows-from", default="", help="write the section from a log of an earlier run's printed "
                        "rows (same settings) instead of measuring again")
    add_output_arguments(parser, plots=False)
    args = parser.parse_args(argv)
    no_write, reading, rows_from, results = args.no_write, args.reading, args.rows_from, args.results
    del args.no_write, args.reading, args.rows_from, args.results
    rows = []
    if rows_from:  # the per-row lines this script printed in an earlier run with the same settings
        for line in open(rows_from):
            backend, transform, row = (line.split(" ", 2) + ["", ""])[:3]
            if backend in args.backends and transform in args.transforms and row.startswith("{"):
                rows.append(((backend, transform), json.loads(row)))
    for backend in [] if rows_from else args.backends:
        for transform in args.transforms:
            rows.append(((backend, transform), measure(args, transform, backend)))
            print(backend, transform, json.dumps(rows[-1][1]), flush=True)
    import torch

    torch.set_num_threads(args.threads)  # machine_line names the children's thread count
    section = write_section(args, rows, reading)
    print(section)
    if not no_write:
        update_section("long_context_memory", section, results)
    return rows


if __name__ == "__main__":
    main()
