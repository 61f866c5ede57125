#!/usr/bin/env python
"""Quantized checkpoints against the float model: next-token agreement and max |Δlogit| of bitsandbytes (8-bit,
4-bit NF4) and torchao (int8 weight-only, int8 dynamic, int4 weight-only) on the folded and the training form of the
three architectures, written into docs/tools.md ("Quantization, measured").

    python bench/quantization.py [--steps 60 --hidden 64 --layers 2 --seed 0 --threads 1] [--no-write]

Why a trained model: a random-init model's logits are near-uniform, so which token wins is noise and any
quantization flips it. Each architecture's tiny byte-level model (vocabulary 256) trains `--steps` Adam steps, its
weight constraint after each, on a repetitive text held in this file; it is saved (training form) and exported
(`export_checkpoint`, folded form). Every tool loads each form as a user would, through transformers'
`from_pretrained(path, quantization_config=..., device_map="cpu")`, which quantizes every projection and leaves the
embedding and `lm_head` in float. Both models then read the same windows of the text: agreement is the share of
positions where the argmax of the logits is the same token, max |Δlogit| the largest difference over all positions
and vocabulary entries.

bitsandbytes has two CPU paths for a 4-bit layer (docs/tools.md, "bitsandbytes on a CPU: two 4-bit paths"): the
generic one (dequantize, matmul in the compute dtype, float32 here) and, on a CPU with AVX512-BF16, a packed bfloat16
kernel that it takes in eval mode without gradients. The script measures each by name, forcing the path
(`bnb-4bit`: generic, `bnb-4bit-avx512bf16`: packed, left out where the CPU lacks the instruction set), and names the
8-bit path's integer matmul (torch's `_int_mm` where torch dispatches AVX-512 kernels, a float32 matmul elsewhere).
"""
from __future__ import annotations

import argparse
import logging
import os
import tempfile

import torch

from results_file import REPO, add_output_arguments, command_line, help_description, machine_line, update_section

TOOLS_PAGE = REPO / "docs" / "tools.md"
ARCHITECTURES = ("gptplus", "ngpt", "angpt")
FORMS = ("folded", "training")
TEXT = (  # a repetitive passage, written for this benchmark: the model learns it within a few dozen steps
    "The miller grinds the grain at dawn, and the baker bakes the bread at noon. "
    "The river turns the wheel, the wheel turns the stone, the stone turns the grain to flour. "
    "When the bell rings at noon the children run home, and the bread is warm on the table. "
) * 24
WINDOW = 64


def tokens(text: str = TEXT) -> torch.Tensor:
    """The text as bytes: a tokenizer of its own (vocabulary 256), nothing to download or train."""
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


def windows(ids: torch.Tensor, count: int, length: int = WINDOW, seed: int = 0) -> torch.Tensor:
    starts = torch.randint(0, len(ids) - length, (count,), generator=torch.Generator().manual_seed(seed))
    return torch.stack([ids[start:start + length] for start in starts.tolist()])


def train_tiny(architecture: str, steps: int = 60, hidden: int = 64, layers: int = 2, seed: int = 0,
               learning_rate: float = 3e-3):
    """A tiny model trained on TEXT: Adam, batches of 8 windows, the weight constraint after each step (as training
    runs it: docs/architectures.md, "Weight constraints")."""
    from modeling_angpt import AnGPTConfig, AnGPTForCausalLM

    torch.manual_seed(seed)
    config = AnGPTConfig(vocab_size=256, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                         max_position_embeddings=128, architecture=architecture)
    model = AnGPTForCausalLM(config)
    model.apply_weight_constraints()
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    ids = tokens()
    for step in range(steps):
        batch = windows(ids, 8, seed=seed * 100_000 + step + 1)
        model(batch, labels=batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        model.apply_weight_constraints()
    return model.eval()


def write_forms(model, directory) -> dict[str, str]:
    """{"training": the saved model, "folded": its export}, under `directory`."""
    from modeling_angpt.export.fold import export_checkpoint
    from modeling_angpt.export.hub import save_pretrained

    paths = {"training": os.path.join(directory, "training"), "folded": os.path.join(directory, "folded")}
    save_pretrained(model, paths["training"])
    export_checkpoint(paths["training"], paths["folded"])
    return paths


def quantization_config(name: str):
    """transformers' quantization config of each measured mode (imports only the tool it names)."""
    from transformers import BitsAndBytesConfig, TorchAoConfig

    if name == "bnb-8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    if name in FOUR_BIT_PATHS:
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32)
    from torchao.quantization import (Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig,
                                      IntxWeightOnlyConfig, PerGroup)

    configs = {"torchao-int8-weight": Int8WeightOnlyConfig,
               "torchao-int8-dynamic": Int8DynamicActivationInt8WeightConfig,
               # torchao's Int4WeightOnlyConfig packs for CUDA kernels only; the intx int4 layout runs on a CPU
               "torchao-int4-weight": lambda: IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32))}
    return TorchAoConfig(configs[name]())


MODES = {  # name -> (tool, mode as docs/tools.md names it)
    "bnb-8bit": ("bitsandbytes", "8-bit (LLM.int8)"),
    "bnb-4bit": ("bitsandbytes", "4-bit NF4, generic path (float32)"),
    "bnb-4bit-avx512bf16": ("bitsandbytes", "4-bit NF4, AVX512-BF16 path (bfloat16)"),
    "torchao-int8-weight": ("torchao", "int8 weight-only"),
    "torchao-int8-dynamic": ("torchao", "int8 dynamic (int8 activations and weights)"),
    "torchao-int4-weight": ("torchao", "int4 weight-only (intx, group 32)"),
}


# bitsandbytes' 4-bit CPU path per mode: the value of each `Linear4bit`'s `support_avx512bf16_for_cpu`, which it sets
# from the CPU at load time and reads in every forward (packed bfloat16 kernel when set, in eval mode without grad)
FOUR_BIT_PATHS = {"bnb-4bit": False, "bnb-4bit-avx512bf16": True}


def has_avx512bf16() -> bool:
    from bitsandbytes.functional import has_avx512bf16 as bitsandbytes_sees_it

    return bool(bitsandbytes_sees_it())


def use_4bit_path(model, packed: bool):
    """Every 4-bit layer of `model` on bitsandbytes' packed AVX512-BF16 path (`packed`) or its generic one."""
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = packed
    return model


def int8_path() -> str:
    """The integer matmul bitsandbytes' 8-bit layers run here: it registers torch's `_int_mm` only where torch
    dispatches AVX-512 kernels (`ATEN_CPU_CAPABILITY` can lower that), else multiplies the int8 values in float32;
    both are exact for these widths (products of int8 summed over fewer than 1,040 terms fit float32's mantissa)."""
    capability = torch.backends.cpu.get_cpu_capability()
    return "torch._int_mm" if capability == "AVX512" else f"float32 matmul ({capability} dispatch)"


def load_quantized(path, name: str):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, quantization_config=quantization_config(name),
                                                 device_map="cpu").eval()
    return use_4bit_path(model, FOUR_BIT_PATHS[name]) if name in FOUR_BIT_PATHS else model


@torch.no_grad()
def compare(reference, candidate, batch: torch.Tensor) -> tuple[float, float]:
    """(next-token agreement, max |Δlogit|) of `candidate` against `reference` on every position of `batch`."""
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)  # on the CPU it notes each float32 -> float16 cast
    expected, actual = reference(batch).logits.float(), candidate(batch).logits.float()
    agreement = (expected.argmax(-1) == actual.argmax(-1)).float().mean().item()
    return agreement, (expected - actual).abs().max().item()


@torch.no_grad()
def accuracy(model, batch: torch.Tensor) -> tuple[float, float]:
    """The float model's own next-token accuracy on the text (how far training got) and its max |logit| (the scale
    max |Δlogit| compares with)."""
    logits = model(batch).logits
    return (logits[:, :-1].argmax(-1) == batch[:, 1:]).float().mean().item(), logits.abs().max().item()


def measure(args) -> tuple[list[tuple], dict[str, tuple[float, float]]]:
    """The table's rows (tool, mode, form, architecture, agreement, max |Δlogit|) and each float model's accuracy
    and max |logit|."""
    from transformers import AutoModelForCausalLM

    batch = windows(tokens(), args.windows, seed=12345)
    if "bnb-4bit-avx512bf16" in args.modes and not has_avx512bf16():
        print("bnb-4bit-avx512bf16 left out: this CPU has no AVX512-BF16, which bitsandbytes' packed kernel needs")
        args.modes = [name for name in args.modes if name != "bnb-4bit-avx512bf16"]
    rows, accuracies = [], {}
    with tempfile.TemporaryDirectory() as directory:
        for architecture in args.architectures:
            model = train_tiny(architecture, args.steps, args.hidden, args.layers, args.seed)
            accuracies[architecture] = accuracy(model, batch)
            paths = write_forms(model, os.path.join(directory, architecture))
            for form in args.forms:
                reference = AutoModelForCausalLM.from_pretrained(paths[form]).eval()
                for name in args.modes:
                    agreement, delta = compare(reference, load_quantized(paths[form], name), batch)
                    rows.append((*MODES[name], form, architecture, agreement, delta))
                    print(f"{name:22s} {form:8s} {architecture:8s} agreement {agreement:.4f}  max|Δlogit| {delta:.4g}")
    return rows, accuracies


def section(rows, accuracies, args, argv) -> str:
    trained = ", ".join(f"{arch} {acc:.1%} (max |logit| {top:.3g})" for arch, (acc, top) in accuracies.items())
    table = ["| tool | mode | form | architecture | next-token agreement | max \\|Δlogit\\| |",
             "|---|---|---|---|---|---|"]
    table += [f"| {tool} | {mode} | {form} | {arch} | {agreement:.1%} | {delta:.3g} |"
              for tool, mode, form, arch, agreement, delta in rows]
    return "\n".join([
        f"Command: `{command_line(__file__, argv)}` (seed {args.seed}; float32; torch threads "
        f"{torch.get_num_threads()}). {machine_line()}",
        "",
        f"Models: d = {args.hidden}, {args.layers} layers, 4 heads, byte vocabulary (256), trained {args.steps} Adam "
        f"steps on the script's repetitive text; their float next-token accuracy on it: {trained}. Measured on "
        f"{args.windows} windows of {WINDOW} tokens ({args.windows * WINDOW} positions) against the float model of "
        "the same form. Each quantized model comes from `from_pretrained(path, quantization_config=...)`: every "
        "projection quantized, the embedding and `lm_head` left in float (transformers' default for both tools).",
        "",
        f"bitsandbytes' paths on this machine: 8-bit integer matmul {int8_path()}; 4-bit NF4 on the generic path "
        "(dequantized weights, float32 matmul) on any CPU"
        + (", and on the packed AVX512-BF16 path (bfloat16 kernel; each layer's input at least 64 wide)."
           if has_avx512bf16() else "; this CPU has no AVX512-BF16, so the packed 4-bit path was not measured."),
        "",
        *table,
    ])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=help_description(__doc__))
    parser.add_argument("--architectures", nargs="+", default=list(ARCHITECTURES), choices=ARCHITECTURES)
    parser.add_argument("--forms", nargs="+", default=list(FORMS), choices=FORMS)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--steps", type=int, default=60, help="Adam steps of the float model")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--windows", type=int, default=16, help="evaluation windows of 64 tokens")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (one is fastest on a busy machine)")
    add_output_arguments(parser, plots=False, results=TOOLS_PAGE)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows, accuracies = measure(args)
    body = section(rows, accuracies, args, argv)
    if not args.no_write:
        update_section("quantization", body, args.results)
    print(body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
