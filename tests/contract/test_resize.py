"""resize_token_embeddings: embedding, head and the per-token output scale s_z move together, new rows
satisfy the architecture's weight constraint, old tokens' logits do not change, and the result folds."""
import pytest
import torch

from conftest import ARCHITECTURES
from contract_fixtures import VOCAB, causal_lm, ids, single_thread  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("tied", [False, True])
def test_resize_token_embeddings(architecture, tied):
    model = causal_lm(architecture, tie_word_embeddings=tied)
    tokens = ids()
    with torch.no_grad():
        before = model(tokens).logits
    old_rows = model.model.embed_tokens.weight.detach().clone()

    model.resize_token_embeddings(VOCAB + 19, pad_to_multiple_of=8)  # 120 → padded to 120
    size = model.config.vocab_size
    assert size == 120 and model.model.embed_tokens.weight.shape[0] == model.lm_head.weight.shape[0] == size
    assert (model.lm_head.weight is model.model.embed_tokens.weight) is tied
    assert torch.equal(model.model.embed_tokens.weight[:VOCAB], old_rows)
    if model.logit_scale is not None:  # s_z: old entries kept, new ones at the architecture's init value
        s_z = model.logit_scale()
        assert s_z.shape == (size,)
        torch.testing.assert_close(s_z[VOCAB:], torch.full((size - VOCAB,), model.logit_scale.init_value))
    with torch.no_grad():
        after = model(torch.cat([tokens, torch.tensor([[VOCAB + 5], [size - 1]])], 1)).logits
    assert after.shape[-1] == size and torch.equal(after[:, :-1, :VOCAB], before)
    for weight in (model.model.embed_tokens.weight, model.lm_head.weight):  # already inside the constraint
        projected = weight.detach().clone()
        model.architecture_strategy.constrain(projected, residual_output=False)
        torch.testing.assert_close(projected[VOCAB:], weight[VOCAB:].detach(), rtol=0, atol=1e-6)
    with torch.no_grad():  # the folded inference form of the resized model is still the same function
        torch.testing.assert_close(model.fold()(tokens).logits, model(tokens).logits, rtol=0, atol=1e-5)

    model.resize_token_embeddings(VOCAB - 11)
    assert model.config.vocab_size == VOCAB - 11
    assert model.logit_scale is None or model.logit_scale.weight.shape == (VOCAB - 11,)
    with torch.no_grad():
        assert model(tokens.clamp(max=VOCAB - 12)).logits.shape[-1] == VOCAB - 11


@pytest.mark.parametrize("architecture", ["ngpt", "angpt"])
def test_resize_without_mean_resizing_uses_the_architecture_init(architecture):
    model = causal_lm(architecture)
    model.resize_token_embeddings(VOCAB + 10, mean_resizing=False)
    norms = model.model.embed_tokens.weight[VOCAB:].norm(dim=-1)
    torch.testing.assert_close(norms, torch.ones(10), rtol=0, atol=1e-5)  # unit rows, as at initialisation
    loss = model.train()(ids(low=VOCAB - 5).clamp(max=VOCAB + 9), labels=ids()).loss  # and it trains
    loss.backward()
    assert model.logit_scale.weight.grad.shape == (VOCAB + 10,)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_post_init_after_resize_keeps_the_resized_head(architecture):
    """transformers marks the resized head initialised; post_init() (e.g. after adding a module) must not re-draw it."""
    model = causal_lm(architecture, tie_word_embeddings=False)
    tokens = ids()
    model.resize_token_embeddings(VOCAB + 7)
    with torch.no_grad():
        before = model(tokens).logits
    model.post_init()
    with torch.no_grad():
        after = model(tokens).logits
    assert torch.equal(after, before)
