"""The route matrix, PEFT LoRA (docs/tools.md, "Routes and forms tested"): through PEFT's own API
(`get_peft_model`) and through transformers' (`model.add_adapter(LoraConfig)`), on each projection, on
`target_modules="all-linear"`, and `merge_and_unload`; the three architectures in both forms, a transformers Qwen3
beside them.

transformers' route asks for PEFT ≥ its MIN_PEFT_VERSION (0.22.0 in transformers 5.x), newer than any release on
PyPI (the extra pins 0.21.2): it refuses in one line, on Qwen3 as on ours, and its cells record that refusal; once a
PEFT that it takes is installed, the same cells assert the effect.

Each cell asserts the effect: one adapter per targeted layer (all-linear: the seven projections of each layer, never
the folded c_q nor the head), the adapter changes the logits, an all-linear adapter trains where the form trains (3
Adam steps, the constraint callback after each: every B leaves zero and the loss falls; the folded form refuses
training in one line), and the merged model computes what the adapted one did. Figures: the smallest max |Δlogit| an
adapter made over the projections; all-linear's count, Δ and loss before → after; the merge's max |Δlogit|."""
from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from modeling_angpt.training.callbacks import WeightConstraintCallback

from route_matrix_fixtures import (LAYERS, PROJECTIONS, ROW_IDS, ROWS, record, refusal_figure,  # noqa: F401
                                   route_checkpoints)

pytestmark = pytest.mark.tools  # make test-tools

ROUTES = ["get_peft_model", "add_adapter"]


def transformers_route_refusal() -> str | None:
    """transformers' refusal of the installed PEFT, in one line (None: it takes it)."""
    from importlib.metadata import version

    from packaging.version import Version
    from transformers.integrations.peft import MIN_PEFT_VERSION

    if Version(version("peft")) >= Version(MIN_PEFT_VERSION):
        return None
    return f"transformers asks for PEFT >= {MIN_PEFT_VERSION}, installed {version('peft')}"


def refused_route(route, mode, row, path, record) -> bool:
    """For transformers' route with a PEFT it refuses: the refusal checked (one line, naming PEFT) and recorded."""
    if route != "add_adapter" or transformers_route_refusal() is None:
        return False
    model = AutoModelForCausalLM.from_pretrained(path)
    with pytest.raises(ValueError, match="version of PEFT") as refusal:
        model.add_adapter(LoraConfig(r=4, target_modules="all-linear"))
    refusal_figure(refusal.value)
    record("PEFT", route, mode, row, "refused: " + transformers_route_refusal())
    return True


def adapted(path, route: str, target_modules, init_lora_weights=False):
    """(adapted model, names of the layers that got an adapter); `init_lora_weights=False` starts B random."""
    config = LoraConfig(r=4, lora_alpha=8, target_modules=target_modules, init_lora_weights=init_lora_weights)
    model = AutoModelForCausalLM.from_pretrained(path)
    if route == "get_peft_model":
        model = get_peft_model(model, config)
        return model, list(model.targeted_module_names)
    model.add_adapter(config)
    return model, [name for name, module in model.named_modules() if hasattr(module, "lora_A")]


@torch.no_grad()
def logits(model, batch):
    return model(batch).logits


@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS)
@pytest.mark.parametrize("route", ROUTES)
def test_each_projection(route, row, route_checkpoints, record):
    path, batch = route_checkpoints(row)
    if refused_route(route, "each projection", row, path, record):
        return
    base = logits(AutoModelForCausalLM.from_pretrained(path).eval(), batch)
    deltas = []
    for projection in PROJECTIONS:
        model, targeted = adapted(path, route, [projection])
        assert len(targeted) == LAYERS and all(name.endswith(projection) for name in targeted), targeted
        deltas.append((logits(model.eval(), batch) - base).abs().max().item())
    record("PEFT", route, "each projection", row, f"min Δ {min(deltas):.3g}")
    assert min(deltas) > 1e-4, dict(zip(PROJECTIONS, deltas))


def train_three_steps(model, batch) -> tuple[float, float]:
    """3 Adam steps on the adapter with the constraint callback after each, as a Trainer runs them: the first and
    the last loss."""
    model.train()
    optimizer = torch.optim.Adam([param for param in model.parameters() if param.requires_grad], lr=1e-2)
    callback, losses = WeightConstraintCallback(), []
    callback.on_train_begin(None, None, None, model=model)
    for _ in range(4):
        loss = model(batch, labels=batch).loss
        losses.append(loss.item())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        callback.on_optimizer_step(None, None, None, model=model)
    return losses[0], losses[-1]


@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS)
@pytest.mark.parametrize("route", ROUTES)
def test_all_linear(route, row, route_checkpoints, record):
    path, batch = route_checkpoints(row)
    if refused_route(route, "all-linear", row, path, record):
        return
    base = logits(AutoModelForCausalLM.from_pretrained(path).eval(), batch)
    model, targeted = adapted(path, route, "all-linear")
    assert len(targeted) == len(PROJECTIONS) * LAYERS, targeted  # no adapter on c_q nor on the head
    delta = (logits(model.eval(), batch) - base).abs().max().item()
    assert delta > 1e-4
    figure = f"{len(targeted)} adapters, Δ {delta:.3g}"
    model, _ = adapted(path, route, "all-linear", init_lora_weights=True)  # B = 0: PEFT's default, trained
    if row[1] == "folded":
        with pytest.raises(RuntimeError, match="folded inference checkpoint") as refusal:
            model.train()
        refusal_figure(refusal.value)  # one line
        figure += "; training refused in one line (folded)"
    else:
        first, last = train_three_steps(model, batch)
        lora_b = [param for name, param in model.named_parameters() if "lora_B" in name]
        assert len(lora_b) == len(targeted) and all(param.abs().max() > 0 for param in lora_b)
        assert last < first, (first, last)
        figure += f"; loss {first:.3f} → {last:.3f}"
    record("PEFT", route, "all-linear", row, figure)


@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS)
def test_merge_and_unload(row, route_checkpoints, record):
    path, batch = route_checkpoints(row)
    model, _ = adapted(path, "get_peft_model", "all-linear")
    expected = logits(model.eval(), batch)
    merged = model.merge_and_unload()
    assert not any("lora_" in name for name, _ in merged.named_parameters())
    assert type(merged.model.layers[0].mlp.up_proj) is torch.nn.Linear
    delta = (logits(merged, batch) - expected).abs().max().item()
    record("PEFT", "get_peft_model", "merge_and_unload", row, f"Δ {delta:.2g}")
    assert delta <= 1e-4 * max(1.0, expected.abs().max().item())
