"""The folded inference form (docs/inference-fold.md) computes what the training form computes, and nothing more."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import AutoModelForCausalLM
from torch.utils._python_dispatch import TorchDispatchMode

from modeling_angpt import AnGPTForCausalLM, AnGPTForSequenceClassification
from modeling_angpt.folding_angpt import FOLDED_TRAINING_ERROR, fold_state_dict

from conftest import ARCHITECTURES

ROPES = {"default": {"rope_type": "default"}, "none": {"rope_type": "none"},
         "proportional": {"rope_type": "proportional", "partial_rotary_factor": 1.0},
         "full": {"rope_type": "default", "partial_rotary_factor": 1.0}}


def tolerance(logits: torch.Tensor, dtype) -> float:
    return (1e-5 if dtype == torch.float32 else 1e-12) * max(1.0, logits.abs().max().item())


@torch.no_grad()
def move_away_from_init(model, spread: float = 0.3):
    """Every 1-D parameter (α, s_qk, s_u, s_v, s_z, RMSNorm gains) randomly away from its initial value, as after
    training; α kept near its init so 1 − α stays away from 0."""
    for name, param in model.named_parameters():
        if param.ndim == 1:
            param.mul_(1 + spread * torch.randn_like(param))


def build(tiny_config, architecture, dtype=torch.float32, attn="eager", rope="default", **overrides):
    rope_parameters = dict(ROPES[rope])
    config = tiny_config(architecture, rope_parameters=rope_parameters, **overrides)
    model = AnGPTForCausalLM._from_config(config, attn_implementation=attn).to(dtype)
    move_away_from_init(model)
    return model.eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rope", sorted(ROPES))
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_folded_logits_match(tiny_config, architecture, rope, dtype):
    model = build(tiny_config, architecture, dtype, rope=rope)
    folded = model.fold()
    assert folded.config.folded and next(folded.parameters()).dtype == dtype
    ids = torch.randint(0, 101, (3, 17))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # left padding
    with torch.no_grad():
        for kwargs in ({}, {"attention_mask": mask}):
            expected, actual = model(ids, **kwargs).logits, folded(ids, **kwargs).logits
            assert (expected - actual).abs().max() <= tolerance(expected, dtype)


# Flags that change what is folded: scalar α, |α|, no ν(α), √d on both u and z, tied embeddings, GPT+ without QK-norm.
VARIANTS = [("angpt", dict(alpha_shape="scalar")), ("angpt", dict(alpha_abs=True, gate_sqrt_d="both")),
            ("angpt", dict(alpha_nu=False)),
            ("angpt", dict(tie_word_embeddings=True, nu_att=0.7)), ("ngpt", dict(alpha_abs=True, gate_sqrt_d="both")),
            ("ngpt", dict(alpha_shape="scalar")), ("gptplus", dict(qk_norm=False)),
            ("gptplus", dict(tie_word_embeddings=True, intermediate_size=48))]


@pytest.mark.parametrize("architecture,overrides", VARIANTS)
def test_folded_flags(tiny_config, architecture, overrides):
    model = build(tiny_config, architecture, torch.float64, **overrides)
    ids = torch.randint(0, 101, (2, 11))
    with torch.no_grad():
        expected, actual = model(ids).logits, model.fold()(ids).logits
    assert (expected - actual).abs().max() <= tolerance(expected, torch.float64)


def _attention_variants():
    """Logit transforms and sparsity patterns the config accepts (they land independently of the fold)."""
    from modeling_angpt.configuration_angpt import LOGIT_TRANSFORMS, SPARSITIES

    return ([dict(attention_logit_transform=t) for t in LOGIT_TRANSFORMS if t != "none"]
            + [dict(attention_sparsity=s, attention_topk=3, attention_window=4, attention_block_size=4)
               for s in SPARSITIES if s != "none"])


@pytest.mark.parametrize("variant", _attention_variants(), ids=lambda v: "-".join(map(str, v.values())))
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_folded_attention_variants(tiny_config, architecture, variant):
    model = build(tiny_config, architecture, torch.float64, **variant)
    ids = torch.randint(0, 101, (2, 13))
    with torch.no_grad():
        expected = model(ids).logits
        actual = model.fold()(ids).logits
    assert (expected - actual).abs().max() <= tolerance(expected, torch.float64)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_fold_after_training_steps(tiny_config, architecture):
    """Adam steps with the weight constraint move α and every scale; the fold still matches in float32."""
    model = AnGPTForCausalLM._from_config(tiny_config(architecture), attn_implementation="sdpa")
    initial = {n: p.detach().clone() for n, p in model.named_parameters() if p.ndim == 1}
    optimizer = torch.optim.Adam(model.optimizer_param_groups(), lr=3e-2)
    model.train()
    for _ in range(8):
        ids = torch.randint(0, 101, (4, 16))
        model(ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        model.apply_weight_constraints()
    model.eval()
    moved = [n for n, p in model.named_parameters() if n in initial and not torch.allclose(p, initial[n])]
    assert len(moved) == len(initial) > 0
    folded = model.fold()
    ids = torch.randint(0, 101, (2, 20))
    with torch.no_grad():
        expected, actual = model(ids).logits, folded(ids).logits
    assert (expected - actual).abs().max() <= tolerance(expected, torch.float32)
    for kind in ("eager", "sdpa"):  # the same folded weights under either backend, with and without the cache
        folded.set_attn_implementation(kind)
        greedy = folded.generate(ids[:1, :5], max_new_tokens=12, do_sample=False)
        assert torch.equal(greedy, model.generate(ids[:1, :5], max_new_tokens=12, do_sample=False))
        assert torch.equal(greedy, folded.generate(ids[:1, :5], max_new_tokens=12, do_sample=False, use_cache=False))


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_fold_sequence_classifier(tiny_config, architecture):
    config = tiny_config(architecture, num_labels=3, is_causal=False)
    model = AnGPTForSequenceClassification(config).double().eval()
    move_away_from_init(model)
    ids = torch.randint(0, 101, (2, 9))
    with torch.no_grad():
        expected, actual = model(ids).logits, model.fold()(ids).logits
    assert (expected - actual).abs().max() <= 1e-12


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_folded_model_refuses_training(tiny_config, architecture):
    folded = build(tiny_config, architecture).fold()
    assert not folded.training
    for attempt in (folded.train, folded.apply_weight_constraints, folded.optimizer_param_groups):
        with pytest.raises(RuntimeError, match="folded inference checkpoint"):
            attempt()
    folded.eval()  # switching to eval stays allowed
    assert "cannot be trained" in FOLDED_TRAINING_ERROR
    with pytest.raises(ValueError, match="already folded"):
        folded.fold()


def test_fold_refuses_division_by_zero(tiny_config):
    # d = 16: s_scale = 1/√16 = 0.25, init 0.5, so a stored 0.5 is exactly α = 1 and γ = ν(α)(1 − α) = 0.
    model = AnGPTForCausalLM(tiny_config("angpt", hidden_size=16, alpha_init=0.5)).double().eval()
    with torch.no_grad():
        model.model.layers[1].mlp_residual.alpha.weight[5] = 0.5
    with pytest.raises(ValueError, match=r"layer 1 MLP \(model\.layers\.1\.mlp_residual\).*channels \[5\]"):
        model.fold()
    # 1 − α < 0 only flips signs: α = 1.5 folds exactly
    with torch.no_grad():
        model.model.layers[1].mlp_residual.alpha.weight[5] = 0.75
    ids = torch.randint(0, 101, (2, 7))
    with torch.no_grad():
        assert (model(ids).logits - model.fold()(ids).logits).abs().max() < 1e-12


def test_fold_refuses_underflow_in_target_dtype(tiny_config):
    model = AnGPTForCausalLM(tiny_config("angpt", alpha_shape="scalar", num_hidden_layers=4)).double().eval()
    with torch.no_grad():  # α = 1 − 1e-3: D ≈ 1e-3 per sublayer, below float16's smallest normal after two
        for layer in model.model.layers:
            for residual in (layer.attn_residual, layer.mlp_residual):
                residual.alpha.weight.fill_((1 - 1e-3) * residual.alpha.scale / residual.alpha.init_value)
    fold_state_dict(model, torch.float64)  # D ≈ 1e-24 at the end: fine in float64 (and float32)
    fold_state_dict(model, torch.float32)
    with pytest.raises(ValueError, match="layer 0 MLP"):
        fold_state_dict(model, torch.float16)


def test_folded_checkpoint_reloads_through_auto_classes(tmp_path, tiny_config):
    model = build(tiny_config, "angpt")
    folded = model.fold()
    folded.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
    assert reloaded.config.folded and not reloaded.training
    ids = torch.randint(0, 101, (2, 9))
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, folded(ids).logits)
    assert "query_gain" in "".join(reloaded.state_dict())
    assert not any("alpha" in k or "scale" in k for k in reloaded.state_dict())


REMOTE_CHILD = textwrap.dedent("""
    import importlib.abc, json, sys
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "modeling_angpt" or name.startswith("modeling_angpt."):
                raise ModuleNotFoundError(name)
    sys.meta_path.insert(0, Block())
    import torch
    from transformers import AutoModelForCausalLM
    ids, answers = torch.tensor(json.loads(sys.argv[1])), {}
    for directory in sys.argv[2:]:  # one interpreter for every checkpoint: its start-up is most of the time
        model = AutoModelForCausalLM.from_pretrained(directory, trust_remote_code=True)
        assert type(model).__module__.startswith("transformers_modules") and model.config.folded
        try:
            model.train()
            raise SystemExit("a folded model accepted train()")
        except RuntimeError:
            pass
        answers[directory] = model.generate(ids, max_new_tokens=6, do_sample=False).tolist()
    print(json.dumps(answers))
""")


def test_folded_checkpoint_trust_remote_code(tmp_path, tiny_config):
    import json

    models, ids = {architecture: build(tiny_config, architecture) for architecture in ("angpt", "gptplus")}, \
        torch.randint(0, 101, (1, 5))
    for architecture, model in models.items():
        model.fold().save_pretrained(tmp_path / architecture)
    result = subprocess.run([sys.executable, "-c", REMOTE_CHILD, json.dumps(ids.tolist()),
                             *(str(tmp_path / architecture) for architecture in models)],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    answers = json.loads(result.stdout.strip().splitlines()[-1])
    for architecture, model in models.items():
        expected = model.generate(ids, max_new_tokens=6, do_sample=False).tolist()
        assert answers[str(tmp_path / architecture)] == expected, architecture


# --- what the folded anGPT forward still computes (docs/inference-fold.md's list) --------------------------------------------------
class ActivationOps(TorchDispatchMode):
    """Counts aten ops whose output is an activation (leading dim = the probe batch size)."""

    def __init__(self, batch: int) -> None:
        super().__init__()
        self.batch, self.ops = batch, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.dim() >= 2 and out.shape[0] == self.batch:
            name = func.overloadpacket.__name__
            self.ops[name] = self.ops.get(name, 0) + 1
        return out


ELEMENTWISE = {"mul", "div", "add", "sub", "addcmul", "lerp", "rsqrt", "pow", "mean", "neg", "sqrt", "exp",
               "clamp_min", "clamp", "norm", "linalg_vector_norm", "sum", "silu", "sigmoid"}


def activation_ops(model, batch=3, length=7):
    ids = torch.randint(0, 101, (batch, length))
    with torch.no_grad(), ActivationOps(batch) as counter:
        model(ids, use_cache=False)
    return {k: v for k, v in counter.ops.items() if k in ELEMENTWISE}


def test_folded_angpt_forward_has_only_spec_ops(tiny_config):
    """Per layer docs/inference-fold.md leaves: two L2 norms (q, k), one multiply on q, RoPE, softmax, SiLU ⊙ gate, two adds."""
    layers = 3
    model = build(tiny_config, "angpt", attn="sdpa", num_hidden_layers=layers)
    folded = model.fold()
    ops = activation_ops(folded)
    rope = {"mul": 4, "add": 2, "neg": 2}  # q and k: x·cos + rotate_half(x)·sin, rotate_half negates one half
    l2 = {"linalg_vector_norm": 2, "clamp_min": 2, "div": 2}  # F.normalize on q and on k
    per_layer = {"mul": rope["mul"] + 1 + 1,  # + c_q on q + u ⊙ SiLU(z)
                 "add": rope["add"] + 2,  # + the two residual adds
                 "neg": rope["neg"], "silu": 1, **{k: v for k, v in l2.items() if k != "div"}, "div": l2["div"]}
    assert ops == {k: v * layers for k, v in per_layer.items()}, ops
    # the training form does more (ν(α), LERP, s_qk on q and k ...): the fold removed it
    unfolded = activation_ops(model)
    assert sum(unfolded.values()) > sum(ops.values()) and "addcmul" in unfolded and "addcmul" not in ops
