"""The chunked path never holds a T×T tensor per head and trains like eager; top-k bidirectional classification
trains and predicts; the compiled FlexAttention kernel equals eager (docs/attention.md)."""
import pytest
import torch

from modeling_angpt import AnGPTConfig, AnGPTForSequenceClassification, attention_angpt, modeling_angpt

from attention_fixtures import assert_close_on, build, logits, make_config, padded_batch
from conftest import fit_classifier


def test_chunked_path_never_holds_a_full_score_matrix(monkeypatch):
    # 2k tokens, chunks of 256: every score block is [b, h, ≤256, T] and no transformers T×T mask is built
    length, chunk = 2048, 256
    config = make_config("scale_invariant", "none", "angpt", {"rope_type": "scale_invariant_p"},
                         attention_query_chunk_size=chunk, max_position_embeddings=length)
    model = build(config, "angpt_chunked")
    shapes, original = [], attention_angpt._attend

    def spy(module, query, key, *args):
        shapes.append((query.shape[-2], key.shape[-2]))
        return original(module, query, key, *args)

    def no_dense_mask(*args, **kwargs):
        raise AssertionError("a T×T transformers mask was built for the chunked path")

    monkeypatch.setattr(attention_angpt, "_attend", spy)
    monkeypatch.setattr(modeling_angpt, "create_causal_mask", no_dense_mask)
    ids = torch.randint(1, 101, (1, length))
    with torch.no_grad():
        out = model(ids, attention_mask=torch.ones_like(ids)).logits
    assert torch.isfinite(out).all()
    assert len(shapes) == 2 * length // chunk and all(q == chunk and kv == length for q, kv in shapes)


@pytest.mark.parametrize("transform,sparsity", [("scale_invariant", "topk"), ("alibi", "window")])
def test_chunked_gradients_equal_eager(transform, sparsity):
    config = make_config(transform, sparsity, "ngpt", {"rope_type": "scale_invariant_p"}, attention_query_chunk_size=5)
    model = build(config, "eager").train()
    ids, mask = padded_batch(length=16)
    grads = []
    for backend in ("eager", "angpt_chunked"):
        model.set_attn_implementation(backend)
        model.zero_grad()
        model(ids, attention_mask=mask, labels=ids).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-4, atol=1e-6, msg=name)


def test_topk_bidirectional_classification_trains_and_predicts():
    # Semantic-focus setting: bidirectional, mean pooling, top-k with k = 5; label = whether token 7 occurs
    config = AnGPTConfig(vocab_size=101, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_labels=2,
                         is_causal=False, attention_sparsity="topk", attention_topk=5, architecture="angpt")
    model = AnGPTForSequenceClassification(config).train()
    assert model.config._attn_implementation == "angpt_chunked"
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(8, 101, (48, 12), generator=generator)
    labels = torch.arange(48) % 2
    ids[labels == 1, torch.randint(0, 12, (24,), generator=generator)] = 7
    train, test = slice(0, 32), slice(32, 48)
    losses = fit_classifier(model, ids[train], labels[train], steps=25, lr=1e-2)
    assert losses[-1] < 0.5 * losses[0]
    with torch.no_grad():
        predictions = model.eval()(ids).logits.argmax(-1)
    assert (predictions[train] == labels[train]).float().mean() >= 0.9
    assert (predictions[test] == labels[test]).float().mean() >= 0.7  # held out (chance: 0.5)


def test_flex_compiled_equals_eager():
    # The compiled kernel (forward on CPU): scale-invariant with a causal window, left-padded batch, then a decode
    config = make_config("scale_invariant", "window", "angpt", {"rope_type": "scale_invariant_p"})
    model = build(config, "eager")
    ids, mask = padded_batch(length=20, pad=3)
    expected = logits(model, ids, mask)
    model.set_attn_implementation("flex_attention")
    assert attention_angpt.FLEX_COMPILE
    assert_close_on(mask, logits(model, ids, mask), expected)
