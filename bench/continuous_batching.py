#!/usr/bin/env python
"""Continuous batching against one request at a time: transformers' `generate_batch` (paged KV cache) and `generate`
per prompt, greedy, for anGPT, nGPT, GPT+ and transformers' Qwen3 of one shape (docs/tools.md, "continuous
batching").

    python bench/continuous_batching.py [--requests 16 --prompt 32 --new 32 --hidden 256 --layers 4 --repeats 2]

Random-init models, seed 0, float32, sdpa, one torch thread; the two ways alternate repetition by repetition and the
medians are printed, with whether every request got the same tokens both ways. The cache is sized for the workload
(transformers' default sizes it from free memory, on a CPU all of RAM).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch
from transformers import ContinuousBatchingConfig, GenerationConfig, Qwen3Config, Qwen3ForCausalLM

from modeling_angpt import AnGPTConfig, AnGPTForCausalLM
from results_file import help_description


def build(name: str, args):
    shape = dict(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                 num_attention_heads=args.heads, num_key_value_heads=args.heads, max_position_embeddings=512)
    if name == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(intermediate_size=4 * args.hidden, head_dim=args.hidden // args.heads,
                                             **shape))
    else:
        model = AnGPTForCausalLM(AnGPTConfig(architecture=name, **shape))
    model.set_attn_implementation("sdpa")
    return model.eval()


def one_at_a_time(model, prompts, greedy) -> tuple[float, list]:
    start = time.perf_counter()
    with torch.no_grad():
        tokens = [model.generate(torch.tensor([p]), generation_config=greedy)[0, len(p):].tolist() for p in prompts]
    return time.perf_counter() - start, tokens


def batched(model, prompts, greedy, cache) -> tuple[float, list]:
    start = time.perf_counter()
    outputs = model.generate_batch(prompts, generation_config=greedy, continuous_batching_config=cache)
    ordered = sorted(outputs.values(), key=lambda output: int(output.request_id.split("_")[-1]))
    return time.perf_counter() - start, [output.generated_tokens for output in ordered]


def main() -> None:
    parser = argparse.ArgumentParser(description=help_description(__doc__))
    for flag, default in (("requests", 16), ("prompt", 32), ("new", 32), ("hidden", 256), ("layers", 4),
                          ("heads", 4), ("vocab", 4096), ("repeats", 2)):
        parser.add_argument(f"--{flag}", type=int, default=default)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    prompts = [torch.randint(0, args.vocab, (args.prompt,)).tolist() for _ in range(args.requests)]
    greedy = GenerationConfig(max_new_tokens=args.new, do_sample=False, eos_token_id=-1, pad_token_id=0)
    tokens = args.requests * (args.prompt + args.new)
    cache = ContinuousBatchingConfig(page_size=32, num_blocks=-(-tokens // 32) + args.requests, max_batch_tokens=256)
    print(f"{args.requests} requests x ({args.prompt} prompt + {args.new} new tokens), d={args.hidden}, "
          f"{args.layers} layers; {platform.processor() or platform.machine()}, {os.cpu_count()} cores, 1 torch "
          f"thread, torch {torch.__version__}; load average {os.getloadavg()[0]:.1f} at start")
    print("| model | generate, one request at a time (s) | generate_batch (s) | speed-up | same tokens |")
    print("|---|---|---|---|---|")
    for name in ("angpt", "ngpt", "gptplus", "qwen3"):
        torch.manual_seed(0)
        model, alone, together, same = build(name, args), [], [], True
        for _ in range(args.repeats):
            seconds, expected = one_at_a_time(model, prompts, greedy)
            alone.append(seconds)
            seconds, got = batched(model, prompts, greedy, cache)
            together.append(seconds)
            same &= got == expected
        a, b = statistics.median(alone), statistics.median(together)
        print(f"| {name} | {a:.2f} | {b:.2f} | {a / b:.1f}x | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
