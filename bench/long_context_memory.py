"""Peak memory of a 16k-token forward on CPU through the chunked eager path (SPEC §3: long context on CPU must
not materialise a T×T tensor per head).

Each measurement runs in a fresh interpreter (so peak RSS belongs to that forward alone) and reports the peak
resident set size (ru_maxrss), the wall time and what a full [b, h, T, T] float32 score tensor would take.
Results go to bench/RESULTS.md between this script's markers (other sections are left alone).

    .venv/bin/python bench/long_context_memory.py                 # 16k, scale_invariant, chunks of 512
    .venv/bin/python bench/long_context_memory.py --length 4096 --transforms none scale_invariant
    .venv/bin/python bench/long_context_memory.py --backends angpt_chunked flex_attention --transforms alibi scale_invariant

`flex_attention` runs the compiled kernel: its peak should stay within the chunked path's bound (no [h, T, T]
scores, no dense ALiBi bias).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

from results_file import update_section

CHILD = r"""
import json, resource, sys, time
import torch
from modeling_angpt import AnGPTConfig, AnGPTForCausalLM
args = json.loads(sys.argv[1])
torch.manual_seed(0)
torch.set_num_threads(args["threads"])
config = AnGPTConfig(vocab_size=args["vocab"], hidden_size=args["hidden"], num_hidden_layers=args["layers"],
                     num_attention_heads=args["heads"], max_position_embeddings=4096, architecture="angpt",
                     rope_parameters={"rope_type": "scale_invariant_p"},
                     attention_logit_transform=args["transform"], attention_sparsity=args["sparsity"],
                     attention_query_chunk_size=args["chunk"])
model = AnGPTForCausalLM._from_config(config, attn_implementation=args["backend"]).eval()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
ids = torch.randint(0, args["vocab"], (1, args["length"]))
start = time.perf_counter()
with torch.no_grad():
    logits = model(ids, use_cache=False, logits_to_keep=1).logits
elapsed = time.perf_counter() - start
assert torch.isfinite(logits).all()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
print(json.dumps({"peak_rss_mib": peak / 1024, "rss_before_forward_mib": before / 1024, "seconds": elapsed}))
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


def write_section(args, rows: list[tuple[str, dict]]) -> str:
    lines = ["## Long context on CPU: peak memory of one forward (chunked eager path, FlexAttention)", "",
             f"`bench/long_context_memory.py`: anGPT d={args.hidden}, {args.layers} layers, {args.heads} heads "
             f"(d_h={args.hidden // args.heads}), vocab {args.vocab}, scale-invariant p-RoPE positions, "
             f"sparsity `{args.sparsity}`, batch 1, T={args.length}, float32, no grad, "
             f"`angpt_chunked` with {args.chunk} queries per chunk or compiled `flex_attention`, {args.threads} threads. "
             "Peak RSS of a fresh process (model, input, activations and attention together); the last column is "
             "what one dense score tensor alone would take. Wall times depend on the machine's load.", "",
             "| backend | logit transform | T | peak RSS (MiB) | RSS before forward (MiB) | forward (s) | one full T×T score tensor (MiB) |",
             "|---|---|---|---|---|---|---|"]
    for (backend, transform), r in rows:
        lines.append(f"| {backend} | {transform} | {args.length} | {r['peak_rss_mib']:.0f} | {r['rss_before_forward_mib']:.0f} | "
                     f"{r['seconds']:.1f} | {r['full_scores_mib']:.0f} |")
    return "\n".join(lines)

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--sparsity", default="none")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--transforms", nargs="+", default=["scale_invariant"])
    parser.add_argument("--backends", nargs="+", default=["angpt_chunked"])
    parser.add_argument("--no-write", action="store_true", help="print only, leave RESULTS.md alone")
    args = parser.parse_args()
    no_write = args.no_write
    del args.no_write
    rows = []
    for backend in args.backends:
        for transform in args.transforms:
            rows.append(((backend, transform), measure(args, transform, backend)))
            print(backend, transform, json.dumps(rows[-1][1]), flush=True)
    section = write_section(args, rows)
    print(section)
    if not no_write:
        update_section("long_context_memory", section)


if __name__ == "__main__":
    main()
