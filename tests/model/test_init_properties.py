"""docs/architectures.md sanity properties at initialisation, the ν constants, and the weight constraints."""
import math

import pytest
import torch

from modeling_angpt import AnGPTForCausalLM
from modeling_angpt.architectures_angpt import get_architecture, silu_second_moment
from modeling_angpt.layers_angpt import lerp_nu


def unit_rows(n, d):
    x = torch.randn(n, d, dtype=torch.float64)
    return x / x.norm(dim=-1, keepdim=True)


def test_nu_constants_are_derived(tiny_config):
    config = tiny_config("angpt", hidden_size=1024, num_attention_heads=16, vocab_size=8)
    nu = get_architecture(config).constants(config)
    assert nu["v"] == pytest.approx(4.0) and nu["o"] == pytest.approx(0.25) and nu["down"] == pytest.approx(2.0)
    assert nu["gate"] == pytest.approx(0.5 * 32)
    # up = ν_uz · ν_acf with ν_acf = 1/√E[SiLU(z)²], z ~ N(0, 1/4): 3.720 (docs/architectures.md)
    assert nu["up"] / 0.5 == pytest.approx(3.720, abs=1e-3)
    assert silu_second_moment(0.5) == pytest.approx(0.07225, abs=1e-5)


def test_lerp_nu_scalar_and_vector():
    assert lerp_nu(torch.tensor([0.05])).item() == pytest.approx(1 / math.sqrt(0.05**2 + 0.95**2))
    alpha = torch.rand(64)
    assert lerp_nu(alpha).item() == pytest.approx((alpha**2 + (1 - alpha) ** 2).mean().rsqrt().item())


def test_angpt_linear_outputs_have_unit_norm_at_init(tiny_config):
    """Unit-norm inputs → q, k, v per head, u and the MLP output x_M have norm ≈ 1 (within 10 %)."""
    torch.manual_seed(0)
    config = tiny_config("angpt", hidden_size=256, num_attention_heads=4, num_hidden_layers=1)
    model = AnGPTForCausalLM(config).double()
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    nu = get_architecture(config).constants(config)
    h = unit_rows(512, 256)
    d_h = config.head_dim
    for name, weight in (("q", attn.q_proj.weight), ("k", attn.k_proj.weight), ("v", attn.v_proj.weight)):
        per_head = (nu["v"] * h @ weight.T).view(512, 4, d_h).norm(dim=-1)  # ν_qkv on q, k, v alike
        assert per_head.mean().item() == pytest.approx(1.0, abs=0.1), name
    u = (nu["up"] / (nu["up"] / 0.5)) * h @ mlp.up_proj.weight.T  # ν_uz · W_up h
    assert u.norm(dim=-1).mean().item() == pytest.approx(1.0, abs=0.1)
    with torch.no_grad():
        x_m = mlp(h)
    assert x_m.norm(dim=-1).mean().item() == pytest.approx(1.0, abs=0.1)


def test_angpt_residual_stream_norm_through_24_layers(tiny_config):
    config = tiny_config("angpt", hidden_size=256, num_attention_heads=4, num_hidden_layers=24, vocab_size=512,
                         max_position_embeddings=128)
    model = AnGPTForCausalLM(config).eval()
    ids = torch.randint(0, 512, (4, 128))
    with torch.no_grad():
        states = model(ids, output_hidden_states=True).hidden_states
    assert len(states) == 25
    norms = torch.stack([s.norm(dim=-1).mean() for s in states])
    assert norms.min() >= 0.8 and norms.max() <= 1.25, norms


def test_attention_output_is_below_one_at_init(tiny_config):
    """Diffuse attention averages many unit values: measured, not corrected."""
    config = tiny_config("angpt", hidden_size=256, num_attention_heads=4, num_hidden_layers=1, vocab_size=512,
                         max_position_embeddings=256)
    model = AnGPTForCausalLM._from_config(config, attn_implementation="eager").eval()
    ids = torch.randint(0, 512, (2, 256))
    with torch.no_grad():
        probs = model(ids, output_attentions=True).attentions[0]  # [b, h, q, kv], layer 0
        h = model.model.embed_tokens(ids)  # layer 0's input: anGPT has no pre-norm
        nu_v = get_architecture(config).constants(config)["v"]
        value = (nu_v * h @ model.model.layers[0].self_attn.v_proj.weight.T).view(2, 256, 4, -1).transpose(1, 2)
        outputs = [(probs @ value).transpose(1, 2)]  # [b, t, h, d_h]
    head_norms = outputs[0].norm(dim=-1)  # [b, t, h]
    # t = 0 sees a single value vector (‖ν_qkv v‖ ≈ 1); far positions average many: ≈ 0.07 mean at T = 2048
    # ≈ 0.1-0.2 here at T = 256.
    assert head_norms[:, 0].mean().item() == pytest.approx(1.0, abs=0.1)
    assert head_norms[:, 128:].mean().item() < 0.5


def test_ngpt_hidden_states_have_unit_norm(tiny_config):
    model = AnGPTForCausalLM(tiny_config("ngpt", num_hidden_layers=3)).eval()
    with torch.no_grad():
        states = model(torch.randint(0, 101, (2, 16)), output_hidden_states=True).hidden_states
    for state in states:
        torch.testing.assert_close(state.norm(dim=-1), torch.ones(2, 16), rtol=0, atol=1e-5)


def perturb(model):
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(3.0).add_(0.1 * torch.randn_like(parameter))


def test_angpt_constraint_projects_rows_into_the_ball(tiny_config):
    model = AnGPTForCausalLM(tiny_config("angpt"))
    perturb(model)
    model.apply_weight_constraints()
    matrices = list(model.constrained_matrices())
    assert len(matrices) == 2 + 7 * 2  # embedding, head, 7 per layer
    for weight, _ in matrices:
        assert weight.norm(dim=-1).max() <= 1 + 1e-6
    small = torch.full_like(matrices[0][0], 1e-3)  # rows already inside the ball are left alone
    matrices[0][0].data.copy_(small)
    model.apply_weight_constraints()
    assert torch.equal(matrices[0][0], small)


def test_ngpt_constraint_unit_norm_along_d_model(tiny_config):
    model = AnGPTForCausalLM(tiny_config("ngpt"))
    perturb(model)
    model.apply_weight_constraints()
    layer = model.model.layers[0]
    for weight in (model.model.embed_tokens.weight, model.lm_head.weight, layer.self_attn.q_proj.weight,
                   layer.mlp.up_proj.weight, layer.mlp.gate_proj.weight):
        torch.testing.assert_close(weight.norm(dim=-1), torch.ones(weight.shape[0]))
    for weight in (layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight):  # columns: along d_model
        torch.testing.assert_close(weight.norm(dim=0), torch.ones(weight.shape[1]))


def test_gptplus_has_no_constraint_and_decays_only_matrices(tiny_config):
    model = AnGPTForCausalLM(tiny_config("gptplus"))
    before = [p.clone() for p in model.parameters()]
    model.apply_weight_constraints()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    decay, no_decay = model.optimizer_param_groups(0.1)
    assert decay["weight_decay"] == 0.1 and all(p.ndim == 2 for p in decay["params"])
    assert no_decay["weight_decay"] == 0.0 and all(p.ndim == 1 for p in no_decay["params"])


def test_init_matches_each_architecture(tiny_config):
    angpt = AnGPTForCausalLM(tiny_config("angpt"))
    for weight, _ in angpt.constrained_matrices():
        torch.testing.assert_close(weight.norm(dim=-1), torch.ones(weight.shape[0]))
    gptplus = AnGPTForCausalLM(tiny_config("gptplus", num_hidden_layers=8))
    std = gptplus.model.layers[0].mlp.down_proj.weight.std().item()
    assert std == pytest.approx(0.02 / 4, rel=0.1)  # 0.02/√(2L)
    alpha = angpt.model.layers[0].attn_residual.alpha
    torch.testing.assert_close(alpha(), torch.full((32,), 0.05))
    assert alpha.weight[0].item() == pytest.approx(1 / math.sqrt(32))  # stored ŝ starts at s_scale
