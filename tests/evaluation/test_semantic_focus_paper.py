"""The semantic-focus paper's own encoder (paper_encoder.py; docs/evaluation.md) against oracles
written independently of the library: attention by hand (top-k by an explicit sort, the window and the blocks
from their definitions), permutation (in)variance, initialisation and shapes, and the protocol and CLI with
`backbone="paper"` at smoke sizes (the experiment: experiments/semantic_focus/)."""
from __future__ import annotations

import json
import math

import pytest
import torch

from modeling_angpt.evaluation.semantic_focus.paper_encoder import (
    PaperEncoderConfig, PaperEncoderForSequenceClassification, sinusoidal_positions)

L, D = 40, 64


def encoder(sparsity="none", positions="sinusoidal", layers=2, heads=1, vocab=4):
    torch.manual_seed(0)
    config = PaperEncoderConfig(vocab_size=vocab, num_labels=2, max_position_embeddings=L, num_layers=layers,
                                num_heads=heads, positions=positions, attention_sparsity=sparsity)
    return PaperEncoderForSequenceClassification(config).eval()


def allowed_keys(sparsity, scores):
    """[b, h, L, L] bool from the paper's definitions (note §1.2–1.4), written without masks_angpt."""
    b, h, n, _ = scores.shape
    keep = torch.zeros(b, h, n, n, dtype=torch.bool)
    for i in range(n):
        if sparsity == "none":
            keep[..., i, :] = True
        elif sparsity == "topk":  # the 5 largest logits, by a full descending sort
            keep[..., i, :].scatter_(-1, scores[..., i, :].sort(-1, descending=True).indices[..., :5], True)
        elif sparsity == "window":  # 2 left, 2 right, shifted inside [0, L) at the ends: exactly 5 keys
            start = min(max(i - 2, 0), n - 5)
            keep[..., i, start:start + 5] = True
        elif sparsity == "block":  # disjoint blocks of 5
            keep[..., i, (i // 5) * 5:(i // 5) * 5 + 5] = True
    return keep


@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("sparsity", ["none", "topk", "window", "block"])
def test_attention_equals_a_hand_written_softmax_over_exactly_the_selected_keys(sparsity, heads):
    attention = encoder(sparsity, heads=heads).blocks[0].attention
    x = torch.randn(3, L, D, generator=torch.Generator().manual_seed(1))
    out, probs = attention(x)
    # heads are d wide, not split (the paper's d_qkv = d_emb), logits ⟨q, k⟩ / √d
    q, k, v = (proj(x).view(3, L, heads, D).transpose(1, 2)
               for proj in (attention.q_proj, attention.k_proj, attention.v_proj))
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)
    keep = allowed_keys(sparsity, scores)
    weights = torch.exp(scores - scores.max(-1, keepdim=True).values) * keep
    weights = weights / weights.sum(-1, keepdim=True)
    expected = attention.o_proj((weights @ v).transpose(1, 2).reshape(3, L, heads * D))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert ((probs > 0) == keep).all()
    assert (probs > 0).sum(-1).unique().tolist() == [L if sparsity == "none" else 5]


def test_sinusoidal_positions_make_the_encoder_order_sensitive_and_without_them_it_is_invariant():
    ids = torch.randint(0, 4, (4, L), generator=torch.Generator().manual_seed(2))
    permuted = ids[:, torch.randperm(L, generator=torch.Generator().manual_seed(3))]
    with_positions, without = encoder("none"), encoder("none", positions="none")
    assert not torch.allclose(with_positions(input_ids=ids).logits, with_positions(input_ids=permuted).logits,
                              atol=1e-4)
    # full attention, no positions, mean pooling: a permutation of the tokens permutes every row alike
    torch.testing.assert_close(without(input_ids=ids).logits, without(input_ids=permuted).logits,
                               atol=1e-5, rtol=1e-5)
    table = sinusoidal_positions(L, D)  # Vaswani et al.: sin(p / 10000^(2i/d)) on 2i, cos on 2i + 1
    assert table[7, 10].item() == pytest.approx(math.sin(7 / 10000 ** (10 / D)), abs=1e-6)
    assert table[7, 11].item() == pytest.approx(math.cos(7 / 10000 ** (10 / D)), abs=1e-6)


def test_parameters_and_initialisation_follow_the_paper():
    model = encoder(layers=5, vocab=4)
    per_block = 4 * (D * D + D) + 2 * (D * D + D)  # Q, K, V, O and W₁, W₂, all with biases (MLP 64)
    assert sum(p.numel() for p in model.parameters()) == 5 * per_block + 4 * D + (D * 2 + 2)
    assert model.embed.weight.abs().max() <= 0.1 and model.embed.weight.abs().max() > 0.09
    assert model.classifier.weight.abs().max() <= 0.1 and (model.classifier.bias == 0).all()
    for block in model.blocks:
        for norm in (block.attention_norm, block.mlp_norm):
            assert norm.weight is None and norm.bias is None  # non-affine LayerNorm
        for linear in (block.attention.q_proj, block.attention.k_proj, block.attention.v_proj,
                       block.attention.o_proj, block.up, block.down):
            assert linear.bias is not None
            bound = 1 / math.sqrt(linear.in_features)  # PyTorch's default: U(±1/√fan_in) for weight and bias
            assert linear.weight.abs().max() <= bound and linear.weight.abs().max() > 0.9 * bound
            assert linear.bias.abs().max() <= bound
    assert model.blocks[0].attention_norm.eps == 0.0 and model.blocks[1].attention_norm.eps == 1e-5
    assert not any("norm" in name for name, _ in model.named_parameters())
    dropouts = [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert dropouts and set(dropouts) == {0.01}


def test_embedding_is_scaled_and_padding_is_pooled():
    model = encoder(layers=1)
    model.blocks = torch.nn.ModuleList()  # embeddings + positions, mean-pooled, classified
    ids = torch.tensor([[1, 2, 0, 0]])
    pooled = (model.embed(ids) * math.sqrt(D) + sinusoidal_positions(4, D)).mean(1)
    torch.testing.assert_close(model(input_ids=ids, attention_mask=torch.tensor([[1, 1, 0, 0]])).logits,
                               model.classifier(pooled))


def test_run_protocol_with_the_paper_backbone_saves_and_reloads(tmp_path):
    from modeling_angpt.evaluation.semantic_focus import (ProtocolSettings, build_splits, build_tokenizer, get_task,
                                                          run_protocol)
    from modeling_angpt.evaluation.semantic_focus.classifier import as_tensors, evaluate
    from modeling_angpt.evaluation.semantic_focus.protocol import OutputExistsError

    out = tmp_path / "run"
    summary = run_protocol(ProtocolSettings("parity", out, epochs=2, n_train=50, n_heldout=20, backbone="paper",
                                            model=dict(num_layers=2, attention_sparsity="topk"), tensorboard=False),
                           log=lambda line: None)
    assert summary["backbone"] == "paper" and summary["architecture"] == "paper" and summary["epochs_run"] == 2
    run = json.loads((out / "run.json").read_text())
    assert run["backbone"] == "paper" and run["model_config"]["attention_sparsity"] == "topk"
    loaded = PaperEncoderForSequenceClassification.load(out / "model").eval()
    data = as_tensors(build_splits("parity", seed=0, n_train=50, n_heldout=20)["heldout"],
                      build_tokenizer(get_task("parity")).pad_token_id, 40)
    assert evaluate(loaded, data, 10, "cpu", True)[1] == pytest.approx(summary["final"]["heldout_acc"])
    with pytest.raises(OutputExistsError):
        run_protocol(ProtocolSettings("parity", out, epochs=1, n_train=10, n_heldout=5, backbone="paper"))
    with pytest.raises(ValueError, match="rope_type"):
        run_protocol(ProtocolSettings("parity", None, epochs=1, n_train=10, n_heldout=5, backbone="paper",
                                      model=dict(rope_type="none")))


def test_listops_runs_padded_to_a_multiple_of_the_mask_size():
    from modeling_angpt.evaluation.semantic_focus import ProtocolSettings, run_protocol
    from modeling_angpt.evaluation.semantic_focus.classifier import paper_width

    summary = run_protocol(ProtocolSettings("listops", None, epochs=1, n_train=10, n_heldout=5, backbone="paper",
                                            model=dict(num_layers=1, attention_sparsity="block"),
                                            task_kwargs={"min_length": 21, "max_length": 33}), log=lambda line: None)
    assert summary["epochs_run"] == 1
    assert paper_width(33, {"attention_sparsity": "block", "attention_block_size": 5}) == 35
    assert paper_width(33, {"attention_sparsity": "none"}) == 33


def test_command_with_the_paper_backbone(tmp_path):
    """(The experiment with this backbone: experiments/semantic_focus/test_semantic_focus_experiment.py.)"""
    from modeling_angpt.cli import main

    out = tmp_path / "cli"
    assert main(["semantic-focus", "--backbone", "paper", "--task", "even_pairs", "--epochs", "1", "--n-train",
                 "30", "--n-heldout", "10", "--num-layers", "1", "--attention-sparsity", "window",
                 "--output-dir", str(out), "--no-tensorboard", "--threads", "1"]) == 0
    assert json.loads((out / "model" / "config.json").read_text())["backbone"] == "paper"
    assert (out / "model" / "model.pt").exists() and (out / "model" / "tokenizer.json").exists()


