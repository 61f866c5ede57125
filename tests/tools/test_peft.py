"""PEFT LoRA on the three architectures, in both forms (docs/tools.md, "PEFT (LoRA)"): an adapter on any projection
takes effect, merges into the same function, trains, saves and reloads; the weight constraint projects the base
layers under an adapter and the merged weights, never the adapter's own matrices (docs/architectures.md, "Weight
constraints")."""
from __future__ import annotations

import copy

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

from modeling_angpt import AnGPTForCausalLM
from modeling_angpt.architectures_angpt import FOLDED_TRAINING_ERROR
from modeling_angpt.export.fold import export_checkpoint
from modeling_angpt.training.callbacks import WeightConstraintCallback

from checkpoint_fixtures import save_source
from conftest import ARCHITECTURES

pytestmark = pytest.mark.tools  # make test-tools

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def lora(model, target_modules, init_lora_weights=False, rank=4):
    """A LoRA adapter; `init_lora_weights=False` starts B random (PEFT's default starts it at zero, a no-op)."""
    config = LoraConfig(r=rank, lora_alpha=8, target_modules=target_modules, init_lora_weights=init_lora_weights)
    return get_peft_model(model, config)


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def adapter_weights(peft_model):
    return {name: param for name, param in peft_model.named_parameters() if "lora_" in name}


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_lora_on_each_projection_takes_effect_and_merges(tiny_config, architecture):
    model = AnGPTForCausalLM(tiny_config(architecture)).eval()
    ids = torch.randint(0, 101, (2, 12))
    base = logits(model, ids)
    for projection in PROJECTIONS:
        adapted_model = lora(copy.deepcopy(model), [projection])
        assert len(adapted_model.targeted_module_names) == 2, projection  # one per layer
        adapted = logits(adapted_model, ids)
        assert (adapted - base).abs().max() > 1e-4, f"LoRA on {projection} did not change the logits"
        merged_model = adapted_model.merge_and_unload()
        assert type(merged_model.model.layers[0].mlp.up_proj) is torch.nn.Linear  # unwrapped again
        torch.testing.assert_close(logits(merged_model, ids), adapted, atol=1e-5, rtol=0)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_all_linear_adapter_trains_every_lora_b(tiny_config, architecture):
    """PEFT's default init (B = 0) trained 3 Adam steps with the constraint callback, as a Trainer would run it:
    every B moves and the frozen base does not."""
    peft_model = lora(AnGPTForCausalLM(tiny_config(architecture)), "all-linear", init_lora_weights=True)
    frozen = {name: param.detach().clone() for name, param in peft_model.named_parameters() if not param.requires_grad}
    lora_b = {name: param for name, param in adapter_weights(peft_model).items() if "lora_B" in name}
    assert len(lora_b) == 2 * len(PROJECTIONS) and all(not param.any() for param in lora_b.values())
    optimizer = torch.optim.Adam([param for param in peft_model.parameters() if param.requires_grad], lr=1e-2)
    callback, ids = WeightConstraintCallback(), torch.randint(0, 101, (4, 16))
    callback.on_train_begin(None, None, None, model=peft_model)
    for _ in range(3):
        peft_model(ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        callback.on_optimizer_step(None, None, None, model=peft_model)
    assert all(param.abs().max() > 0 for param in lora_b.values()), [n for n, p in lora_b.items() if not p.any()]
    for name, param in peft_model.named_parameters():
        if name in frozen:  # re-projecting rows already in the set moves them only by rounding
            torch.testing.assert_close(param, frozen[name], atol=1e-6, rtol=0, msg=name)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_adapter_saves_and_reloads(tmp_path, tiny_config, architecture):
    save_source(tmp_path / "base", tiny_config, architecture)
    peft_model = lora(AutoModelForCausalLM.from_pretrained(tmp_path / "base"), "all-linear").eval()
    ids = torch.randint(0, 101, (2, 12))
    expected = logits(peft_model, ids)
    peft_model.save_pretrained(tmp_path / "adapter")
    fresh_base = AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    assert (logits(fresh_base, ids) - expected).abs().max() > 1e-4  # the adapter is what the reload must restore
    reloaded = PeftModel.from_pretrained(fresh_base, tmp_path / "adapter").eval()
    torch.testing.assert_close(logits(reloaded, ids), expected, atol=1e-6, rtol=0)


def test_folded_form_accepts_an_adapter(tmp_path, tiny_config):
    """An adapter on the inference form runs, merges and reloads; training it is refused as training the folded
    weights is (the folded form carries no constraint and no learnable scales: docs/tools.md, "PEFT (LoRA)")."""
    save_source(tmp_path / "src", tiny_config, "angpt")
    export_checkpoint(tmp_path / "src", tmp_path / "folded")
    folded = AutoModelForCausalLM.from_pretrained(tmp_path / "folded")
    ids = torch.randint(0, 101, (2, 12))
    base = logits(folded, ids)
    peft_model = lora(folded, "all-linear")
    adapted = logits(peft_model, ids)
    assert (adapted - base).abs().max() > 1e-4
    peft_model.save_pretrained(tmp_path / "adapter")
    with pytest.raises(RuntimeError, match="folded inference checkpoint"):
        peft_model.train()
    fresh = AutoModelForCausalLM.from_pretrained(tmp_path / "folded")
    torch.testing.assert_close(logits(PeftModel.from_pretrained(fresh, tmp_path / "adapter"), ids), adapted,
                               atol=1e-6, rtol=0)
    torch.testing.assert_close(logits(peft_model.merge_and_unload(), ids), adapted, atol=1e-5, rtol=0)
    assert "Train the unfolded checkpoint" in FOLDED_TRAINING_ERROR


@pytest.mark.parametrize("architecture", ("ngpt", "angpt"))
def test_constraint_on_an_adapted_model_projects_base_layers_only(tiny_config, architecture):
    """On a PeftModel, `apply_weight_constraints()` (reached through PEFT's attribute forwarding) and the callback
    project the wrapped `base_layer` weights and leave lora_A/lora_B as they are. Oracle: the architecture's own
    per-matrix `constrain` on a copy."""
    model = AnGPTForCausalLM(tiny_config(architecture))
    strategy = model.architecture_strategy
    peft_model = lora(model, "all-linear")
    down = model.model.layers[0].mlp.down_proj.base_layer
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim == 2:
                param.mul_(3.0)  # every matrix, adapter's included, out of the constraint set
    adapters = {name: param.detach().clone() for name, param in adapter_weights(peft_model).items()}
    expected_down = down.weight.detach().clone()
    strategy.constrain(expected_down, residual_output=True)
    peft_model.apply_weight_constraints()
    torch.testing.assert_close(down.weight, expected_down, atol=1e-6, rtol=0)
    for name, param in adapter_weights(peft_model).items():
        assert torch.equal(param, adapters[name]), f"the constraint changed the adapter's {name}"
    with torch.no_grad():
        down.weight.mul_(3.0)
    WeightConstraintCallback().on_optimizer_step(None, None, None, model=peft_model)
    torch.testing.assert_close(down.weight, expected_down, atol=1e-6, rtol=0)


@pytest.mark.parametrize("architecture", ("ngpt", "angpt"))
def test_merged_weights_take_the_constraint(tiny_config, architecture):
    """The adapter trains unconstrained; merged into the base, its rows can leave the unit ball (anGPT) or the
    unit sphere (nGPT), and the merged model's `apply_weight_constraints()` projects them as it projects any
    trained matrix, along the same axis (`residual_output` survives the merge)."""
    model = AnGPTForCausalLM(tiny_config(architecture))
    strategy = model.architecture_strategy
    merged = lora(model, "all-linear", rank=8).merge_and_unload()
    layer = merged.model.layers[1]
    assert layer.mlp.down_proj.residual_output and layer.self_attn.o_proj.residual_output
    dim = 0 if architecture == "ngpt" else -1  # nGPT's down_proj: unit columns (docs/architectures.md)
    assert (layer.mlp.down_proj.weight.norm(dim=dim) - 1).abs().max() > 1e-2  # the merge moved them
    expected = {name: weight.detach().clone() for name, weight in
                (("up", layer.mlp.up_proj.weight), ("down", layer.mlp.down_proj.weight))}
    strategy.constrain(expected["up"], residual_output=False)
    strategy.constrain(expected["down"], residual_output=True)
    merged.apply_weight_constraints()
    torch.testing.assert_close(layer.mlp.up_proj.weight, expected["up"], atol=1e-6, rtol=0)
    torch.testing.assert_close(layer.mlp.down_proj.weight, expected["down"], atol=1e-6, rtol=0)
    norms = layer.mlp.down_proj.weight.norm(dim=dim)
    assert (norms <= 1 + 1e-5).all() if architecture == "angpt" else torch.allclose(norms, torch.ones_like(norms))
