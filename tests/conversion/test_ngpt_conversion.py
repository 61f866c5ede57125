"""NVIDIA nGPT reference checkpoints -> our nGPT, against an in-test re-implementation of the reference model.

`ReferenceGPT` follows NVIDIA/ngpt model.py (use_nGPT=1): the same module and parameter names (so the same
state-dict keys), fused c_fc with `u, v = chunk(uv, 2)` and SiLU on v, suv·√d on both halves, |α| in the
LERP, s_qk after RoPE and normalisation, softmax scale √d_h, s_z on the logits, no final norm. Two
deliberate differences: the RoPE is the corrected interleaved rotation (the published function is not a
rotation, NVIDIA/ngpt issue #10), and flash-attn is replaced by SDPA (CPU).
"""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from modeling_angpt.conversion.ngpt import convert_state_dict, config_from_model_args, ngpt_from_reference

ARGS = dict(n_layer=2, n_head=4, n_embd=32, vocab_size=101, block_size=64, use_nGPT=1, bias=False)


def rope_interleaved(x, theta=10000.0):  # x [B, H, T, d_h]; pairs (2j, 2j+1) at frequency θ^(-2j/d_h)
    # Tables in float32 like the reference's get_sinusoidal_embeddings; the frequencies written as 1/θ^(2j/d_h)
    # (transformers' form) rather than the reference's exp(-2j·ln θ/d_h), which differs by float32 rounding.
    d_h, length = x.shape[-1], x.shape[-2]
    freq = 1.0 / theta ** (torch.arange(0, d_h, 2, dtype=torch.float32) / d_h)
    angle = torch.arange(length, dtype=torch.float32)[:, None] * freq[None]
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, n_embd, n_head, base_scale):
        super().__init__()
        self.n_embd, self.n_head, self.base_scale = n_embd, n_head, base_scale
        self.key = nn.Linear(n_embd, n_embd, bias=False)
        self.query = nn.Linear(n_embd, n_embd, bias=False)
        self.value = nn.Linear(n_embd, n_embd, bias=False)
        self.att_c_proj = nn.Linear(n_embd, n_embd, bias=False)
        self.c_fc = nn.Linear(n_embd, 8 * n_embd, bias=False)
        self.mlp_c_proj = nn.Linear(4 * n_embd, n_embd, bias=False)
        self.attn_alpha = nn.Parameter(base_scale * torch.ones(n_embd))
        self.mlp_alpha = nn.Parameter(base_scale * torch.ones(n_embd))
        self.sqk = nn.Parameter(base_scale * torch.ones(n_embd))
        self.suv = nn.Parameter(torch.ones(8 * n_embd))

    @staticmethod
    def justnorm(x):
        return x / x.norm(p=2, dim=-1, keepdim=True)

    def forward(self, h):
        B, T, C = h.shape
        d_h = C // self.n_head
        q, k, v = (f(h).view(B, T, self.n_head, d_h).transpose(1, 2) for f in (self.query, self.key, self.value))
        q, k = rope_interleaved(q), rope_interleaved(k)
        sqk = (self.sqk * (1.0 / self.base_scale)).view(1, self.n_head, 1, d_h)
        q, k = sqk * self.justnorm(q), sqk * self.justnorm(k)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=math.sqrt(d_h))
        h_att = self.att_c_proj(y.transpose(1, 2).reshape(B, T, C))
        lr = torch.abs(self.attn_alpha * (0.05 / self.base_scale))
        h = self.justnorm(self.justnorm(h) + lr * (self.justnorm(h_att) - self.justnorm(h)))
        uv = self.c_fc(h) * (self.suv * (1.0 * C ** 0.5))
        u, v = torch.chunk(uv, 2, dim=-1)
        h_mlp = self.mlp_c_proj(u * F.silu(v))
        lr = torch.abs(self.mlp_alpha * (0.05 / self.base_scale))
        return self.justnorm(self.justnorm(h) + lr * (self.justnorm(h_mlp) - self.justnorm(h)))


class ReferenceGPT(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, vocab_size, base_scale, **_):
        super().__init__()
        self.base_scale = base_scale
        self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(vocab_size, n_embd),
                                              h=nn.ModuleList(Block(n_embd, n_head, base_scale)
                                                              for _ in range(n_layer))))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.sz = nn.Parameter(base_scale * torch.ones(vocab_size))

    def forward(self, idx):
        x = self.transformer.wte(idx)
        for block in self.transformer.h:
            x = block(x)
        return (self.sz * (1.0 / self.base_scale)) * self.lm_head(x)


@torch.no_grad()
def trained_reference(dtype, base_scale):
    """A reference model with unit-norm matrices (as its train.py keeps them) and every scale moved off init."""
    model = ReferenceGPT(**ARGS, base_scale=base_scale).to(dtype)
    for name, param in model.named_parameters():
        if param.ndim == 2:
            dim = 0 if name.endswith("c_proj.weight") else 1  # along d_model, as normalize_matrices() does
            param.copy_(F.normalize(torch.randn_like(param), dim=dim))
        else:
            param.mul_(1 + 0.3 * torch.randn_like(param))
    return model.eval()


def test_reference_key_names():
    keys = set(ReferenceGPT(**ARGS, base_scale=1.0).state_dict())
    expected = {"transformer.wte.weight", "lm_head.weight", "sz"} | {
        f"transformer.h.{i}.{k}" for i in range(2) for k in
        ("query.weight", "key.weight", "value.weight", "att_c_proj.weight", "c_fc.weight", "mlp_c_proj.weight",
         "attn_alpha", "mlp_alpha", "sqk", "suv")}
    assert keys == expected


# float64: 1e-8, not 1e-12, because both models build their RoPE tables in float32 and float32 cos/sin of
# differently shaped tensors can differ by an ulp; a wrong key mapping gives errors of order 1e-2.
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-8), (torch.float32, 1e-5)])
@pytest.mark.parametrize("base_scale", [1 / math.sqrt(32), 0.1])
def test_conversion_matches_reference(dtype, tol, base_scale):
    reference = trained_reference(dtype, base_scale)
    state = {"_orig_mod." + k: v for k, v in reference.state_dict().items()}  # torch.compile'd save
    model = ngpt_from_reference(state, {**ARGS, "base_scale": base_scale}).to(dtype)
    ids = torch.randint(0, 101, (2, 16))
    with torch.no_grad():
        expected, actual = reference(ids), model(ids).logits
    assert (expected - actual).abs().max() <= tol * max(1.0, expected.abs().max().item())
    folded = model.fold()  # and the converted model folds like any nGPT
    with torch.no_grad():
        assert (folded(ids).logits - expected).abs().max() <= 10 * tol * max(1.0, expected.abs().max().item())


def test_conversion_refuses_unknown_and_missing_keys():
    config = config_from_model_args(ARGS)
    state = ReferenceGPT(**ARGS, base_scale=1.0).state_dict()
    with pytest.raises(KeyError, match="rmsnorm_att"):
        convert_state_dict({**state, "transformer.h.0.rmsnorm_att.weight": torch.ones(32)}, config)
    del state["transformer.h.1.sqk"]
    with pytest.raises(KeyError, match="transformer.h.1.sqk"):
        convert_state_dict(state, config)
    with pytest.raises(ValueError, match="baseline GPT"):
        config_from_model_args({**ARGS, "use_nGPT": 0})


def test_conversion_script(tmp_path):
    reference = trained_reference(torch.float32, 1 / math.sqrt(32))
    torch.save({"model": reference.state_dict(), "model_args": {**ARGS, "base_scale": 1 / math.sqrt(32)},
                "iter_num": 10, "best_val_loss": 3.0}, tmp_path / "ckpt.pt")
    result = subprocess.run([sys.executable, "conversion/ngpt_to_angpt.py", str(tmp_path / "ckpt.pt"),
                             str(tmp_path / "out")], capture_output=True, text=True, timeout=300,
                            cwd=__import__("pathlib").Path(__file__).parents[2])
    assert result.returncode == 0, result.stderr[-2000:]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architecture"] == "ngpt"
    ids = torch.randint(0, 101, (1, 12))
    with torch.no_grad():
        assert (model(ids).logits - reference(ids)).abs().max() < 1e-4
