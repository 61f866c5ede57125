"""Needle retrieval of a checkpoint (docs/evaluation.md, "Needle in a haystack"): greedy generation with the KV cache
on needle examples (tasks/needle.py) built from the checkpoint's held-out text, at 1×, 4× and 16× its training
length by default.

The prefill runs on the chunked eager attention (no T×T tensor per head), decoding on the same path with one query
per step. Greedy decoding stops at the first newline or after tasks.needle.MAX_NEW_TOKENS tokens, as the lm-eval
task `angpt_needle` does (eval/tasks/angpt_needle), so both report the same answers for the same examples.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..tasks.needle import (MAX_NEW_TOKENS, NeedleGenerator, check_room, exact_match, filler_from_blocks,
                               score_answer)
from .long_context import (held_out_blocks, limit_count, memory_bounded_attention, query_chunk_for, suite_lengths,
                           training_length)
from .options import EvalOptions

DEFAULT_MULTIPLES = (1, 4, 16)
DEFAULT_EXAMPLES = 50  # per length


def held_out_text(checkpoint: Path, tokenizer, train_length: int, multiple: int) -> tuple[str, str]:
    """(text, description) of the checkpoint's held-out blocks, decoded; they must hold one haystack of
    `multiple` × `train_length` tokens (the filler is never repeated within a haystack)."""
    blocks, source = held_out_blocks(checkpoint, train_length)
    if blocks.size < multiple * train_length:
        raise ValueError(f"--lengths {multiple}: {multiple} × {train_length} = {multiple * train_length} tokens of "
                         f"haystack exceed the {blocks.size} tokens of held-out text ({source})")
    return filler_from_blocks(tokenizer, blocks), source


def needle_documents(checkpoint: Path, tokenizer, multiple: int, count: int = DEFAULT_EXAMPLES, seed: int = 0,
                     train_length: int | None = None) -> list[dict]:
    """`count` needle examples at `multiple` × the checkpoint's training length over its held-out text, as dicts
    (prompt, target, cities, numbers, depths, length, tokens): the rows of the lm-eval task `angpt_needle`, and
    the examples `run_suite` scores for the same seed."""
    train_length = training_length(Path(checkpoint), train_length)
    text, _ = held_out_text(Path(checkpoint), tokenizer, train_length, multiple)
    length = multiple * train_length
    check_room(tokenizer, length, f"--lengths {multiple}: {multiple} × {train_length} =")
    generator = NeedleGenerator(text, tokenizer)
    return [example.to_dict() for example in generator.examples(length, count, seed)]


@torch.no_grad()
def generate_answer(model, tokenizer, prompt: str, max_new_tokens: int = MAX_NEW_TOKENS,
                    query_chunk_size: int | None = None) -> str:
    """Greedy continuation of `prompt` (KV cache), up to its first newline."""
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"].to(model.device)
    chunk = query_chunk_for(model.config, 1, ids.shape[1] + max_new_tokens, query_chunk_size)
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"]
    with memory_bounded_attention(model, chunk):
        output = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                do_sample=False, use_cache=True, pad_token_id=tokenizer.eos_token_id,
                                eos_token_id=newline[-1:] if len(newline) == 1 else tokenizer.eos_token_id)
    return tokenizer.decode(output[0, ids.shape[1]:], skip_special_tokens=True).split("\n", 1)[0]


def needle_accuracy(model, tokenizer, filler: str, train_length: int, multiples=DEFAULT_MULTIPLES, *,
                    examples: int = DEFAULT_EXAMPLES, seed: int = 0, query_chunk_size: int | None = None) -> dict:
    """{multiple: {"needles_found", "exact_match", "samples": [...]}} over `examples` needle examples per length
    (the scoring rules: tasks/needle.py)."""
    for multiple in multiples:
        check_room(tokenizer, multiple * train_length, f"--lengths {multiple}: {multiple} × {train_length} =")
    generator = NeedleGenerator(filler, tokenizer)
    model.eval()
    results = {}
    for multiple in sorted(set(int(m) for m in multiples)):
        length = multiple * train_length
        samples = []
        for example in generator.examples(length, examples, seed):
            answer = generate_answer(model, tokenizer, example.prompt, query_chunk_size=query_chunk_size)
            samples.append({"target": example.target, "answer": answer,
                            "needles_found": score_answer(answer, example.cities, example.numbers),
                            "exact_match": exact_match(answer, example.target), "tokens": example.tokens,
                            "depths": [round(d, 4) for d in example.depths]})
        results[multiple] = {key: sum(s[key] for s in samples) / len(samples) for key in ("needles_found", "exact_match")}
        results[multiple]["samples"] = samples
    return results


def preflight(checkpoint: Path, options: EvalOptions) -> None:
    """Checks that need no weights (the front door calls it before loading the model): ValueError, one line."""
    from transformers import AutoTokenizer

    train_length, multiples = suite_lengths(Path(checkpoint), options, DEFAULT_MULTIPLES)
    check_room(AutoTokenizer.from_pretrained(checkpoint), multiples[0] * train_length,
                 f"--lengths {multiples[0]}: {multiples[0]} × {train_length} =")


def run_suite(model, tokenizer, checkpoint: Path, options: EvalOptions,
              output_dir: Path) -> dict[str, dict[str, float]]:
    """`angpt eval CHECKPOINT --suite needle`: options.lengths (multiples; default 1,4,16), limit (examples per
    length, default 50), seed, log_samples, optional train_length; needle.json / needle.md into output_dir."""
    checkpoint, output_dir = Path(checkpoint), Path(output_dir)
    train_length, multiples = suite_lengths(checkpoint, options, DEFAULT_MULTIPLES, model.config)
    text, source = held_out_text(checkpoint, tokenizer, train_length, multiples[-1])
    limit = options.limit  # examples per length (any count); a fraction < 1 scales the default
    count = limit_count(limit, DEFAULT_EXAMPLES if limit is None or float(limit) < 1 else int(float(limit)))
    results = needle_accuracy(model, tokenizer, text, train_length, multiples, examples=count,
                              seed=0 if options.seed is None else int(options.seed),
                              query_chunk_size=options.query_chunk_size)
    metrics = {f"needle_x{m}": {"needles_found": r["needles_found"], "exact_match": r["exact_match"],
                                "tokens": float(m * train_length),
                                "examples": float(len(r["samples"]))} for m, r in results.items()}
    output_dir.mkdir(parents=True, exist_ok=True)
    report = {"train_length": train_length, "source": source, "metrics": metrics}
    if options.log_samples:
        report["samples"] = {f"needle_x{m}": r["samples"] for m, r in results.items()}
    (output_dir / "needle.json").write_text(json.dumps(report, indent=1))
    lines = [f"Needle retrieval (3 needles, greedy), trained at {train_length} tokens; haystacks from {source}.", "",
             "| length | tokens | examples | needles found | exact match |", "|---|---|---|---|---|"]
    lines += [f"| {m}× | {m * train_length} | {len(r['samples'])} | {r['needles_found']:.3f} | {r['exact_match']:.3f} |"
              for m, r in results.items()]
    (output_dir / "needle.md").write_text("\n".join(lines) + "\n")
    return metrics
