"""The normalization health an evaluation reports (training/norm_health.py; docs/architectures.md, "Watching the norms
during training"), against the block recomputed from the docs' formulas."""
import pytest
import torch
from training_fixtures import single_thread  # noqa: F401 (fixture)

from modeling_angpt import AnGPTConfig, AnGPTForCausalLM
from modeling_angpt.layers_angpt import lerp_nu
from modeling_angpt.training.norm_health import NormProbe


class OneProcess:
    device = torch.device("cpu")

    def gather(self, tensor):
        return tensor


def _model(architecture: str) -> AnGPTForCausalLM:
    torch.manual_seed(0)
    config = AnGPTConfig(architecture=architecture, vocab_size=97, hidden_size=32, intermediate_size=128,
                         num_hidden_layers=3, num_attention_heads=2, max_position_embeddings=64)
    model = AnGPTForCausalLM(config).eval()
    with torch.no_grad():  # a trained model's α, not the initial one, so that x = x̃/β is not trivially exact
        for layer in model.model.layers:
            for residual in (layer.attn_residual, layer.mlp_residual):
                if hasattr(residual, "alpha"):  # GPT+ has none
                        residual.alpha.weight.mul_(1 + torch.rand_like(residual.alpha.weight))
    return model


def _lerp(residual, h, x):
    """anGPT's update as docs/architectures.md writes it: ν(α)·((1 − α) ⊙ h + α ⊙ x)."""
    alpha = residual.alpha()
    alpha = alpha.abs() if residual.alpha_abs else alpha
    return lerp_nu(alpha) * ((1 - alpha) * h + alpha * x)


def _recomputed(model, ids) -> dict[str, torch.Tensor]:
    """Per-token norms of every block's input and unscaled branch outputs (output_scale None: ν_p W_o o, ν_d W_down a),
    each block run from the docs' formulas with the arguments the model passed it."""
    calls = []
    handles = [layer.register_forward_pre_hook(lambda m, args, kwargs: calls.append((args[0], kwargs)),
                                               with_kwargs=True) for layer in model.model.layers]
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
    for handle in handles:
        handle.remove()
    norms = {}
    for i, (layer, (h, kwargs)) in enumerate(zip(model.model.layers, calls)):
        kwargs = dict(kwargs)
        args = (kwargs.pop("position_embeddings"), kwargs.pop("attention_mask"), kwargs.pop("past_key_values", None))
        with torch.no_grad():
            x_a = layer.self_attn(layer.input_layernorm(h), *args, None, **kwargs)[0]
            h_mid = _lerp(layer.attn_residual, h, x_a)
            x_m = layer.mlp(layer.post_attention_layernorm(h_mid))
            h_out = _lerp(layer.mlp_residual, h_mid, x_m)
        torch.testing.assert_close(h_out, out.hidden_states[i + 1], rtol=1e-4, atol=1e-5)  # the oracle is the block
        norms.update({f"h/layer{i}": h.norm(dim=-1), f"attn/layer{i}": x_a.norm(dim=-1),
                      f"mlp/layer{i}": x_m.norm(dim=-1)})
    return norms


def test_angpt_block_inputs_and_branch_outputs_match_the_recomputed_block():
    model = _model("angpt")
    batches = [torch.randint(0, 97, (4, 16), generator=torch.Generator().manual_seed(s)) for s in (1, 2)]
    with NormProbe(model) as probe:
        with torch.no_grad():
            for ids in batches:
                model(input_ids=ids)
    summary = probe.summary(OneProcess())
    expected = [_recomputed(model, ids) for ids in batches]  # mean and max over both evaluation batches
    assert len(summary) == 2 * 3 * 3
    for key in expected[0]:
        values = torch.cat([e[key].flatten() for e in expected])
        quantity, layer = key.split("/")
        assert summary[f"norm/{quantity}_mean/{layer}"] == pytest.approx(float(values.mean()), rel=1e-5)
        assert summary[f"norm/{quantity}_max/{layer}"] == pytest.approx(float(values.max()), rel=1e-5)
    assert all(not layer._forward_pre_hooks and not layer.mlp_residual._forward_pre_hooks
               for layer in model.model.layers)  # removed after the evaluation


def test_ngpt_reports_the_distance_from_the_unit_sphere_and_gptplus_nothing():
    model = _model("ngpt")
    ids = torch.randint(0, 97, (4, 16), generator=torch.Generator().manual_seed(1))
    with NormProbe(model) as probe, torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
    summary = probe.summary(OneProcess())
    for i in range(3):
        distance = (out.hidden_states[i].norm(dim=-1) - 1).abs()
        assert summary[f"norm/h_dist_max/layer{i}"] == pytest.approx(float(distance.max()), abs=1e-7)
        assert summary[f"norm/h_dist_max/layer{i}"] < 1e-5  # float32 on the sphere
    assert set(summary) == {f"norm/h_dist_{s}/layer{i}" for s in ("mean", "max") for i in range(3)}

    model = _model("gptplus")
    with NormProbe(model) as probe, torch.no_grad():
        model(input_ids=ids)
    assert probe.summary(OneProcess()) == {}


def test_compiled_blocks_report_the_same_norms_as_eager_ones():
    """With `torch_compile`'s regional compilation (compile_blocks) the probed evaluation still sees every hooked
    module: the same summary as the uncompiled model."""
    from modeling_angpt.training.model_setup import compile_blocks

    eager, compiled = _model("angpt"), _model("angpt")
    compile_blocks(compiled, backend="aot_eager")
    ids = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        compiled(input_ids=ids)  # traced before the probe, as training steps come before an evaluation
    summaries = []
    for model in (eager, compiled):
        with NormProbe(model) as probe, torch.no_grad():
            model(input_ids=ids)
        summaries.append(probe.summary(OneProcess()))
    assert set(summaries[1]) == set(summaries[0]) and len(summaries[0]) == 2 * 3 * 3
    assert all(summaries[1][key] == pytest.approx(value, rel=1e-5) for key, value in summaries[0].items())
