"""Tensor and pipeline parallelism on two CPU processes (torchrun, gloo) against one process: GPT+, nGPT and anGPT
with grouped-query attention, training and folded form, and a transformers Qwen3 of the same shape as the control
(docs/architectures.md, "Tensor and pipeline parallelism"). One launch of tests/drivers/tensor_parallel.py runs every
split; the one-process oracle runs here. Run with `make test-parallel` (CI), not `make test`.

Every 1-D parameter (s_qk, s_u, s_v, s_z, α, gains) is moved off its initial value first, so a scale split the wrong
way, or left whole next to a split projection, changes the logits."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

from modeling_angpt import AnGPTConfig, AnGPTForCausalLM
from modeling_angpt.pretrained_angpt import LEGACY_SPLIT_ERROR
from modeling_angpt.training.distributed import apply_weight_constraints
from drivers.tensor_parallel import one_training_step, probe, stretch_constrained
from training_fixtures import REPO

pytestmark = pytest.mark.parallel

SHAPE = dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=8)
TOLERANCE = 1e-5  # the bound on |Δ| against one process
ADAM_EPS = 1e-8  # torch.optim.AdamW's default, which the step uses
# which cases run vLLM's rule: it serves GPT+ (either form) and the folded nGPT/anGPT; their training forms are
# refused before any split (pretrained_angpt.check_logits_need_no_head).
CASES = {"gptplus": dict(training=True, vllm=True), "gptplus_folded": dict(training=False, vllm=True),
         "ngpt": dict(training=True, vllm=False), "ngpt_folded": dict(training=False, vllm=True),
         "angpt": dict(training=True, vllm=False), "angpt_folded": dict(training=False, vllm=True),
         "ngpt_logn": dict(training=True, vllm=False),  # LogN's per-head query scale s_h, split with q_proj
         "qwen3": dict(training=True, vllm=True),
         # a folded anGPT saved when c_q was a vector [H·d_h] (tests/model/golden): transformers' split refuses it in
         # one line (saved again, it splits); vLLM's rule and the pipeline take it
         "angpt_folded_saved_before": dict(training=False, vllm=True)}
GOLDEN = Path(__file__).resolve().parents[1] / "model" / "golden"
DELTAS: dict[tuple[str, str], float] = {}
TWO_DIMENSIONAL = ("ngpt", "angpt", "qwen3")


def _perturbed(model):
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.ndim == 1:
                parameter.mul_(1 + 0.3 * torch.rand(parameter.shape, generator=generator))
    return model


def _write_checkpoints(work: Path) -> None:
    torch.manual_seed(0)
    for architecture in ("gptplus", "ngpt", "angpt"):
        model = _perturbed(AnGPTForCausalLM(AnGPTConfig(architecture=architecture, **SHAPE)))
        model.save_pretrained(work / architecture / "checkpoint")
        model.fold().save_pretrained(work / f"{architecture}_folded" / "checkpoint")
    logn = AnGPTConfig(architecture="ngpt", attention_logit_transform="logn", **SHAPE)
    _perturbed(AnGPTForCausalLM(logn)).save_pretrained(work / "ngpt_logn" / "checkpoint")
    qwen = Qwen3ForCausalLM(Qwen3Config(intermediate_size=64, **SHAPE))
    _perturbed(qwen).save_pretrained(work / "qwen3" / "checkpoint")
    shutil.copytree(GOLDEN / "angpt_folded", work / "angpt_folded_saved_before" / "checkpoint")


def _launch(work: Path, processes: int, *args: str) -> list[dict]:
    """tests/drivers/tensor_parallel.py under torchrun: every rank's report."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    proc = subprocess.run([str(Path(sys.executable).with_name("torchrun")), "--nproc_per_node", str(processes),
                           str(REPO / "tests" / "drivers" / "tensor_parallel.py"), str(work), *args],
                          capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads((work / "reports.json").read_text())


@pytest.fixture(scope="module")
def split_runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("tensor-parallel")
    _write_checkpoints(work)
    (work / "cases.json").write_text(json.dumps(CASES))
    yield work, _launch(work, 2)
    print("\nmax |Δ| against one process:")
    for (case, check), delta in sorted(DELTAS.items()):
        print(f"  {case:15s} {check:22s} {delta:.2e}")


@pytest.fixture(scope="module")
def two_dimensional_runs(tmp_path_factory):
    """Four processes, a 2-D mesh: FSDP2 (2) × tensor parallelism (2), the training cases."""
    work = tmp_path_factory.mktemp("two-dimensional")
    _write_checkpoints(work)
    (work / "cases.json").write_text(json.dumps({case: CASES[case] for case in TWO_DIMENSIONAL}))
    return work, _launch(work, 4, "2d")


def _one_process(work: Path, case: str):
    return AutoModelForCausalLM.from_pretrained(work / case / "checkpoint", dtype=torch.float32).eval()


def _one_process_logits(work: Path, case: str) -> torch.Tensor:
    model = _one_process(work, case)
    with torch.no_grad():
        return model(input_ids=probe(model.config.vocab_size)).logits


def _record(case: str, check: str, delta: float) -> float:
    DELTAS[(case, check)] = delta
    return delta


@pytest.mark.parametrize("case", CASES)
def test_tensor_parallel_inference_generate_and_save_match_one_process(split_runs, case):
    work, reports = split_runs
    if case == "angpt_folded_saved_before":
        assert reports[0][case]["tensor_parallel_error"] == f"checkpoint {work / case / 'checkpoint'}: " \
            + LEGACY_SPLIT_ERROR
        return
    model = _one_process(work, case)
    ids = probe(model.config.vocab_size)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        tokens = model.generate(ids[:, :6], max_new_tokens=8, do_sample=False, min_new_tokens=8, pad_token_id=0)
    split = load_file(str(work / case / "tensor_parallel.safetensors"))
    assert _record(case, "TP inference", (split["logits"] - logits).abs().max().item()) <= TOLERANCE
    assert torch.equal(split["tokens"], tokens)
    DELTAS[(case, "TP generate")] = 0.0
    # every projection and the head are split, and every per-feature scale with them (the plan's parameters)
    sharded = set(reports[0][case]["sharded"])
    for layer in range(model.config.num_hidden_layers):
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                     "mlp.up_proj", "mlp.down_proj"):
            assert f"model.layers.{layer}.{name}.weight" in sharded
        scales = [name for name, _ in model.named_parameters() if name.startswith(f"model.layers.{layer}.")
                  and any(part in name for part in ("qk_scale", "up_scale", "gate_scale", "query_gain", "query_head"))]
        assert set(scales) <= sharded and (scales or case in ("gptplus", "gptplus_folded", "qwen3"))
    assert "lm_head.weight" in sharded
    # save_pretrained from the split model: the checkpoint one process loads bit for bit
    saved, original = (load_file(str(work / case / d / "model.safetensors")) for d in ("saved_from_split", "checkpoint"))
    assert saved.keys() == original.keys() and all(torch.equal(saved[k], original[k]) for k in saved)
    reloaded = AutoModelForCausalLM.from_pretrained(work / case / "saved_from_split", dtype=torch.float32).eval()
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=ids).logits, logits)
    DELTAS[(case, "TP save/reload")] = 0.0


def _check_training_step(work: Path, reports: list[dict], case: str, results: str, label: str) -> None:
    """The split step in `results` against one process's: loss, gradients, weights, and the constraint after it."""
    model = _one_process(work, case)
    loss = one_training_step(model, probe(model.config.vocab_size))
    split = load_file(str(work / case / results))
    assert reports[0][case]["loss"] == pytest.approx(loss, rel=1e-6)
    stepped = {name[len("stepped."):]: value for name, value in split.items() if name.startswith("stepped.")}
    assert stepped.keys() == dict(model.named_parameters()).keys()
    gradient_delta = max((split[f"grad.{name}"] - p.grad).abs().max().item() for name, p in model.named_parameters())
    # the split sums in another order: float32 round-off, which grows with the gradients' size (anGPT's, scaled by
    # its ν constants, reached 1.4e-6 in one CI run, the others stay below 2e-7), held to the 1e-5
    assert _record(case, f"{label} gradients", gradient_delta) <= TOLERANCE
    # Adam's first step moves a weight by lr·g/(|g| + eps): where |g| is below eps (1e-8) the step is proportional to
    # g itself, which is round-off there (one process summing in another order moves it as much), so those few
    # entries are held to the gradients' bound above, every other to the issue's 1e-5.
    delta = max(((stepped[name] - p.detach()).abs() * (p.grad.abs() >= ADAM_EPS)).max().item()
                for name, p in model.named_parameters())
    _record(case, f"{label} step, all entries", max((stepped[name] - p.detach()).abs().max().item()
                                                    for name, p in model.named_parameters()))
    assert _record(case, f"{label} training step", delta) <= TOLERANCE
    strategy = getattr(model, "architecture_strategy", None)
    if strategy is None or strategy.norm_axis is None:  # Qwen3, GPT+: no constraint
        return
    # nGPT's and anGPT's constraints hold on the weights the split step wrote
    for weight, residual_output in model.constrained_matrices():
        name = next(n for n, p in model.named_parameters() if p is weight)
        norms = stepped[name].norm(dim=strategy.norm_axis(residual_output))
        if model.config.architecture == "ngpt":
            torch.testing.assert_close(norms, torch.ones_like(norms), rtol=0, atol=1e-5)
        else:
            assert norms.max() <= 1 + 1e-6


def _check_constraint(work: Path, case: str, results: str, label: str) -> None:
    model = _one_process(work, case)
    stretch_constrained(model)
    apply_weight_constraints(model)
    split = load_file(str(work / case / results))
    delta = max((split[f"constrained.{name}"] - weight.detach()).abs().max().item()
                for name, weight in model.named_parameters() if weight.ndim == 2)
    assert _record(case, f"{label} constraint on shards", delta) <= 1e-6


@pytest.mark.parametrize("case", [name for name, spec in CASES.items() if spec["training"]])
def test_one_tensor_parallel_training_step_matches_one_process(split_runs, case):
    _check_training_step(*split_runs, case, "tensor_parallel.safetensors", "TP")


@pytest.mark.parametrize("case", TWO_DIMENSIONAL)
def test_one_training_step_on_a_two_dimensional_mesh_matches_one_process(two_dimensional_runs, case):
    _check_training_step(*two_dimensional_runs, case, "two_dimensional.safetensors", "2-D")
    if case != "qwen3":
        _check_constraint(two_dimensional_runs[0], case, "two_dimensional.safetensors", "2-D")


@pytest.mark.parametrize("case", ["ngpt", "angpt", "ngpt_logn"])
def test_the_weight_constraint_on_shards_is_the_whole_matrix_projection(split_runs, case):
    _check_constraint(split_runs[0], case, "tensor_parallel.safetensors", "TP")


@pytest.mark.parametrize("case", [name for name, spec in CASES.items() if spec["vllm"]])
def test_vllm_rule_split_only_the_linear_layers(split_runs, case):
    work, reports = split_runs
    report = reports[0][case]
    # every projection the plan names, and the folded nGPT's/anGPT's c_q (built for vLLM as a linear layer,
    # layers_angpt.gain_for)
    per_layer = 8 if case.startswith(("ngpt_folded", "angpt_folded")) else 7
    assert len(report["vllm_split"]) == per_layer * 2 and "vllm_error" not in report  # 2 layers in every case
    logits = _one_process_logits(work, case)
    split = load_file(str(work / case / "vllm_rule.safetensors"))["logits"]
    assert _record(case, "vLLM-rule emulation", (split - logits).abs().max().item()) <= TOLERANCE


@pytest.mark.parametrize("case", CASES)
def test_two_pipeline_stages_give_the_whole_models_logits(split_runs, case):
    work, reports = split_runs
    assert reports[0][case]["stage0_layers"] == ["0"] and reports[1][case]["stage1_layers"] == ["1"]
    logits = _one_process_logits(work, case)
    split = load_file(str(work / case / "pipeline.safetensors"))["logits"]
    assert _record(case, "pipeline split", (split - logits).abs().max().item()) <= TOLERANCE


def test_accelerate_refuses_tensor_parallelism_on_cpu_processes(split_runs):
    """Accelerate 1.16 accepts ParallelismConfig only for FSDP2, accelerator devices or DeepSpeed: on CPU processes it
    refuses before a model (ours or Qwen3) is involved, so the split training step is tested through transformers'
    split model and torch above. When this starts to pass through, Accelerate's path can be tested here too."""
    _, reports = split_runs
    assert reports[0]["accelerate_tp_size_2"].startswith("ParallelismConfig is only compatible")
    assert "MULTI_CPU" in reports[0]["accelerate_tp_size_2"]
