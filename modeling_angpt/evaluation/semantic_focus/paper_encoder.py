"""The semantic-focus paper's own encoder (Ram et al., NeurIPS 2025; docs/evaluation.md, "Semantic-focus tasks"),
as the authors' code builds it.

The library's `AnGPTForSequenceClassification` (RoPE, RMSNorm, SwiGLU, no biases, N(0, 0.02) init) stays at chance
on Even Pairs under the paper's protocol (experiments/semantic_focus/README.md), so this module rebuilds the
paper's model to tell "the protocol/attention does not reproduce" from "the backbone differs":

- token embedding U(−0.1, 0.1), multiplied by √d; fixed sinusoidal absolute positions added, then dropout;
- T pre-LN blocks, LayerNorm non-affine (eps 1e-5; the attention LN of block 0 has eps 0, a quirk of the
  authors' code), `x + Drop(W_O·Attn(LN x))` and `x + Drop(W₂·act(Drop(W₁·LN x + b₁)) + b₂)` (the MLP's
  inner dropout sits before the activation, as in the paper's code);
- Q, K, V and W_O with biases, each head d wide (the paper's `d_qkv = d_emb`: heads are not split), logits ⟨q,k⟩/√d;
- no final LN, mean pooling over every position (PAD included: the paper masks nothing), a linear classifier
  U(−0.1, 0.1) with bias 0; every other linear layer keeps PyTorch's default initialisation.

The attention is the library's eager path (`attention_angpt.eager_attention_forward` with an `AttentionLayout`), so
top-k / window / block select keys exactly as `AnGPTForSequenceClassification` does (attention_angpt.py,
sparsity_angpt.py), bidirectional.
One difference from the paper remains: the library's global tokens are the first g positions; the paper appends
g extra tokens after the padding. Attention dropout is gated on `training` (the paper's code leaves it on at
evaluation; at p = 0.01 the difference is tiny).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from ...attention_angpt import eager_attention_forward
from ...attention_layout_angpt import AttentionLayout

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "mish": nn.Mish}  # the paper's three


@dataclass
class PaperEncoderConfig:
    vocab_size: int
    num_labels: int
    max_position_embeddings: int = 64
    hidden_size: int = 64  # d = d_qkv
    intermediate_size: int = 64  # d_mlp
    num_layers: int = 5  # NNCH tasks 5, ListOps 10
    num_heads: int = 1
    dropout: float = 0.01  # embedding, attention probabilities, MLP inner, residual
    activation: str = "relu"
    positions: str = "sinusoidal"  # "none": no positional signal at all (tests: permutation invariance)
    attention_sparsity: str = "none"  # names and fields as in AnGPTConfig, read by sparsity_angpt.py
    attention_topk: int = 5
    attention_window: int = 5
    attention_block_size: int = 5
    attention_global_tokens: int = 0
    architecture: str = "paper"  # so summaries and titles name the backbone like AnGPTConfig.architecture does

    def to_dict(self) -> dict:
        return asdict(self)

    def attention_config(self):
        """An AnGPTConfig carrying only what the library's eager attention reads (sparsity fields, bidirectional)."""
        from ... import AnGPTConfig

        return AnGPTConfig(vocab_size=self.vocab_size, hidden_size=self.hidden_size * self.num_heads,
                           num_attention_heads=self.num_heads, num_hidden_layers=1, is_causal=False,
                           attention_sparsity=self.attention_sparsity, attention_topk=self.attention_topk,
                           attention_window=self.attention_window, attention_block_size=self.attention_block_size,
                           attention_global_tokens=self.attention_global_tokens, attention_dropout=self.dropout)


def sinusoidal_positions(length: int, dim: int) -> torch.Tensor:
    """Vaswani et al.'s fixed table [length, dim]: sin on even, cos on odd channels, wavelengths 2π…10000·2π."""
    position = torch.arange(length, dtype=torch.float32)[:, None]
    frequency = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency)[:, : dim // 2]
    return table


class PaperAttention(nn.Module):
    """Multi-head attention with biases, heads d wide, scores through the library's eager sparse attention."""

    def __init__(self, config: PaperEncoderConfig, attention_config):
        super().__init__()
        d, heads = config.hidden_size, config.num_heads
        self.config = attention_config  # eager_attention_forward reads module.config and module.training
        self.is_causal = False
        self.num_key_value_groups = 1
        self.heads, self.head_dim, self.dropout = heads, d, config.dropout
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d, heads * d) for _ in range(3))
        self.o_proj = nn.Linear(heads * d, d)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch, length, _ = x.shape
        q, k, v = (proj(x).view(batch, length, self.heads, self.head_dim).transpose(1, 2)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        # No padding mask: the paper lets PAD keys be attended to and selected by top-k.
        layout = AttentionLayout.from_shapes(q, k, None, causal=False)
        out, probs = eager_attention_forward(self, q, k, v, None, scaling=self.head_dim ** -0.5,
                                             dropout=self.dropout, attention_layout=layout)
        return self.o_proj(out.reshape(batch, length, self.heads * self.head_dim)), probs


class PaperBlock(nn.Module):
    def __init__(self, config: PaperEncoderConfig, attention_config, first: bool):
        super().__init__()
        d = config.hidden_size
        # Non-affine LNs; block 0's attention LN has eps 0 in the authors' code.
        self.attention_norm = nn.LayerNorm(d, eps=0.0 if first else 1e-5, elementwise_affine=False)
        self.mlp_norm = nn.LayerNorm(d, eps=1e-5, elementwise_affine=False)
        self.attention = PaperAttention(config, attention_config)
        self.up, self.down = nn.Linear(d, config.intermediate_size), nn.Linear(config.intermediate_size, d)
        self.activation = ACTIVATIONS[config.activation]()
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attention(self.attention_norm(x))[0])
        # The paper's quirk: dropout on W₁·LN(x) + b₁ *before* the activation.
        return x + self.drop(self.down(self.activation(self.drop(self.up(self.mlp_norm(x))))))


class PaperEncoderForSequenceClassification(nn.Module):
    """Callable like a transformers classifier in the protocol: `model(input_ids=...).logits` [b, labels]."""

    def __init__(self, config: PaperEncoderConfig):
        super().__init__()
        self.config = config
        d = config.hidden_size
        attention_config = config.attention_config()
        self.embed = nn.Embedding(config.vocab_size, d)
        nn.init.uniform_(self.embed.weight, -0.1, 0.1)
        if config.positions not in ("sinusoidal", "none"):
            raise ValueError(f"positions={config.positions!r}: 'sinusoidal' or 'none'")
        table = (sinusoidal_positions(config.max_position_embeddings, d) if config.positions == "sinusoidal"
                 else torch.zeros(config.max_position_embeddings, d))
        self.register_buffer("position_table", table, persistent=False)  # fixed, rebuilt from the config
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(PaperBlock(config, attention_config, first=i == 0)
                                    for i in range(config.num_layers))
        self.classifier = nn.Linear(d, config.num_labels)
        nn.init.uniform_(self.classifier.weight, -0.1, 0.1)
        nn.init.zeros_(self.classifier.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **unused):
        """`attention_mask` is ignored on purpose: the paper attends to and pools PAD."""
        from transformers.modeling_outputs import SequenceClassifierOutput

        length = input_ids.shape[1]
        if length > self.position_table.shape[0]:
            raise ValueError(f"sequence of {length} tokens > max_position_embeddings {self.position_table.shape[0]}")
        x = self.embed(input_ids) * math.sqrt(self.config.hidden_size) + self.position_table[:length]
        x = self.drop(x)
        for block in self.blocks:
            x = block(x)
        return SequenceClassifierOutput(logits=self.classifier(x.mean(dim=1)))  # no final LN; mean over all positions

    def apply_weight_constraints(self) -> None:
        """The protocol's per-step hook (nGPT/anGPT projections); the paper's encoder constrains nothing."""

    def save_pretrained(self, directory: str | Path) -> None:
        """Not a transformers model: `config.json` (this dataclass) and `model.pt` (the state_dict)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text(json.dumps({"backbone": "paper", **self.config.to_dict()}, indent=1))
        torch.save(self.state_dict(), directory / "model.pt")

    @classmethod
    def load(cls, directory: str | Path) -> "PaperEncoderForSequenceClassification":
        directory = Path(directory)
        fields = json.loads((directory / "config.json").read_text())
        fields.pop("backbone", None)
        model = cls(PaperEncoderConfig(**fields))
        model.load_state_dict(torch.load(directory / "model.pt", map_location="cpu", weights_only=True))
        return model


__all__ = ["PaperEncoderConfig", "PaperEncoderForSequenceClassification", "sinusoidal_positions"]
