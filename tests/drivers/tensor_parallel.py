"""Run by tests/parallel/test_tensor_parallel.py under `torchrun --nproc_per_node 2` (gloo, CPU): every checkpoint
of WORK/cases.json split across the two processes the ways users split a model, each result written to
WORK/<case>/ by rank 0 for the test to compare with one process (docs/architectures.md, "Tensor and pipeline
parallelism"). One launch for every case keeps the suite's time down.

- tensor parallelism by transformers: `from_pretrained(DIR, distributed_config=DistributedConfig(tp_size=2))` (the
  checkpoint's own plan), its logits, greedy cached `generate`, `save_pretrained` from the split model;
  for a training checkpoint one AdamW step with the weight constraint on the shards
  (modeling_angpt.training.distributed.apply_weight_constraints), and that constraint alone on weights moved off it;
- vLLM's rule, emulated: the model built as vLLM's Transformers backend builds it (attn_implementation "vllm"), every
  `nn.Linear` the plan names replaced by this file's column- or row-split layer, every other parameter whole (vLLM's
  Transformers backend shards nothing else);
- pipeline parallelism by transformers: `DistributedConfig(pp_size=2)`, two stages, the last one's logits;
- Accelerate's `ParallelismConfig(tp_size=2)` on these CPU processes: what it answers.

With `2d` (under `--nproc_per_node 4`): the training checks on a 2-D mesh, FSDP2 (2) × tensor parallelism (2).
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn
from transformers import AttentionInterface, AutoModelForCausalLM
from transformers.distributed import DistributedConfig
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import modeling_angpt  # noqa: F401 (registers the Auto classes)
from modeling_angpt.training.distributed import apply_weight_constraints

LEARNING_RATE, WEIGHT_DECAY, CONSTRAINT_STRETCH = 1e-3, 0.1, 1.7


def probe(vocab_size: int) -> torch.Tensor:
    """The token ids every check runs on (the test builds the same ones)."""
    return (torch.arange(24).view(2, 12) * 7 + 3) % vocab_size


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor gathered (every rank must call it); any other tensor as it is."""
    return tensor.full_tensor() if type(tensor).__name__ == "DTensor" else tensor


def full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole."""
    return {name: whole(p).detach().clone().contiguous() for name, p in model.named_parameters()}


def load(case: Path, split: DistributedConfig | None = None) -> nn.Module:
    """The case's checkpoint in float32, split across the processes by `split` (whole in each without it)."""
    return AutoModelForCausalLM.from_pretrained(case / "checkpoint", distributed_config=split, dtype=torch.float32)


def save_on_rank0(tensors: dict[str, torch.Tensor], path: Path, rank: int) -> None:
    """What the test reads, written once (every rank holds the same whole tensors)."""
    if rank == 0:
        save_file({k: v.contiguous() for k, v in tensors.items()}, path)


def stretch_constrained(model: nn.Module) -> None:
    """Move every constrained matrix off its constraint (the same on every rank and in the one-process oracle)."""
    with torch.no_grad():
        for weight, _ in model.constrained_matrices():
            weight.mul_(CONSTRAINT_STRETCH)


def one_training_step(model: nn.Module, ids: torch.Tensor) -> float:
    """What the test's one process runs too: loss on `ids`, AdamW over the architecture's groups, the constraint.
    The gradients stay on the parameters (the test compares them)."""
    model.train()
    groups = model.optimizer_param_groups(WEIGHT_DECAY) if hasattr(model, "optimizer_param_groups") else \
        [{"params": list(model.parameters()), "weight_decay": WEIGHT_DECAY}]
    optimizer = torch.optim.AdamW(groups, lr=LEARNING_RATE, foreach=False)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    apply_weight_constraints(model)
    return loss.item()


def training_checks(case: Path, split: DistributedConfig, out: dict, report: dict) -> None:
    """The constraint alone on weights moved off it, then one training step, from fresh loads split by `split`."""
    model = load(case, split)
    if hasattr(model, "constrained_matrices"):
        stretch_constrained(model)
        apply_weight_constraints(model)
        out.update({f"constrained.{k}": v for k, v in full_state(model).items()})
        model = load(case, split)
    report["loss"] = one_training_step(model, probe(model.config.vocab_size))
    out.update({f"stepped.{k}": v for k, v in full_state(model).items()})
    out.update({f"grad.{name}": whole(p.grad).clone() for name, p in model.named_parameters()})


def two_dimensional_checks(case: Path, rank: int) -> dict:
    """Four processes: a 2-D mesh of FSDP2 (2) × tensor parallelism (2), training only."""
    out, report = {}, {}
    training_checks(case, DistributedConfig(tp_size=2, fsdp_size=2), out, report)
    save_on_rank0(out, case / "two_dimensional.safetensors", rank)
    return report


def tensor_parallel_checks(case: Path, training: bool, rank: int) -> dict:
    split = DistributedConfig(tp_size=2)
    model = load(case, split)
    ids = probe(model.config.vocab_size)
    sharded = sorted(name for name, p in model.named_parameters()
                     if type(p).__name__ == "DTensor" and any(pl.is_shard() for pl in p.placements))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        tokens = model.generate(ids[:, :6], max_new_tokens=8, do_sample=False, min_new_tokens=8, pad_token_id=0)
    model.save_pretrained(case / "saved_from_split")
    out = {"logits": logits, "tokens": tokens}
    report = {"sharded": sharded}
    if training:
        training_checks(case, split, out, report)
    save_on_rank0(out, case / "tensor_parallel.safetensors", rank)
    return report


# --- vLLM's rule (its Transformers backend): only the nn.Linear modules the plan names are split --------------------
class SplitLinear(nn.Module):
    """Stands for vLLM's ColumnParallelLinear (`dim` 0: this rank's slice of the output features) or RowParallelLinear
    (`dim` 1: of the input features, the partial sums all-reduced); not an nn.Linear."""

    def __init__(self, linear: nn.Linear, rank: int, world: int, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.weight = nn.Parameter(linear.weight.detach().chunk(world, dim=dim)[rank].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output = F.linear(x, self.weight)
        if self.dim == 1:
            dist.all_reduce(output)
        return output


VLLM_SPLIT_DIMS = {"colwise": 0, "rowwise": 1}
# vLLM registers its attention function as "vllm" and sets that name before it builds the model; the model builds for
# it what it splits (layers_angpt.gain_for). Here the name stands for transformers' sdpa while the model is built.
AttentionInterface.register("vllm", sdpa_attention_forward)


def split_as_vllm(model: nn.Module, rank: int, world: int) -> list[str]:
    """Replace each nn.Linear of the base model whose name the config's plan matches (vLLM matches the plan's keys as
    regular expressions); a style vLLM has no layer for is refused, as vLLM refuses it. Returns the names split."""
    base = model.base_model_prefix
    plan = {f"{base}.{key}": style for key, style in (model.config.base_model_tp_plan or {}).items()}
    split = []
    for name, module in list(model.named_modules()):
        if not isinstance(module, nn.Linear) or not name.startswith(base + "."):
            continue
        style = next((plan[key] for key in plan if re.match(key, name)), "replicate")
        if style == "replicate":
            continue
        if style not in VLLM_SPLIT_DIMS:
            raise ValueError(f"vLLM: unsupported parallel style {style!r} for {name}")
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, SplitLinear(module, rank, world, VLLM_SPLIT_DIMS[style]))
        split.append(name)
    return split


def vllm_rule_checks(case: Path, rank: int) -> dict:
    model = AutoModelForCausalLM.from_pretrained(case / "checkpoint", dtype=torch.float32,
                                                 attn_implementation="vllm").eval()
    model.set_attn_implementation("sdpa")  # the logits by transformers' attention: vLLM's own kernel is not here
    split = split_as_vllm(model, rank, dist.get_world_size())
    try:
        with torch.no_grad():
            logits = model(input_ids=probe(model.config.vocab_size)).logits
    except ValueError as error:  # the same on both ranks, before any collective of the forward
        return {"vllm_split": split, "vllm_error": str(error)}
    save_on_rank0({"logits": logits}, case / "vllm_rule.safetensors", rank)
    return {"vllm_split": split}


def pipeline_checks(case: Path, rank: int) -> dict:
    model = load(case, DistributedConfig(pp_size=2)).eval()
    held = sorted({name.split(".")[2] for name, _ in model.named_parameters() if name.startswith("model.layers.")})
    with torch.no_grad():
        logits = model(input_ids=probe(model.config.vocab_size)).logits
    save_on_rank0({"logits": logits}, case / "pipeline.safetensors", rank)
    return {f"stage{rank}_layers": held}


def accelerate_tensor_parallel() -> str:
    """What Accelerate says to ParallelismConfig(tp_size=2) on CPU processes (the model does not enter into it: the
    Accelerator refuses before any model is prepared); "ran" if it ever accepts."""
    from accelerate import Accelerator
    from accelerate.utils import ParallelismConfig

    try:
        Accelerator(parallelism_config=ParallelismConfig(tp_size=2), cpu=True)
    except ValueError as error:
        return str(error)
    return "ran"


def main() -> None:
    work, two_dimensional = Path(sys.argv[1]), sys.argv[2:] == ["2d"]
    torch.manual_seed(0)
    cases = json.loads((work / "cases.json").read_text())
    reports, rank = {}, int(os.environ["RANK"])
    for name, spec in cases.items():
        case = work / name
        if two_dimensional:
            reports[name] = two_dimensional_checks(case, rank)
            continue
        try:
            report = tensor_parallel_checks(case, spec["training"], rank)
        except ValueError as error:  # refused on every rank alike (a checkpoint that cannot be split)
            report = {"tensor_parallel_error": str(error)}
        if spec["vllm"]:
            report.update(vllm_rule_checks(case, rank))
        report.update(pipeline_checks(case, rank))
        reports[name] = report
    if not two_dimensional:
        reports["accelerate_tp_size_2"] = accelerate_tensor_parallel()
    all_reports = [None] * dist.get_world_size()
    dist.all_gather_object(all_reports, reports)
    if dist.get_rank() == 0:
        (work / "reports.json").write_text(json.dumps(all_reports))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
