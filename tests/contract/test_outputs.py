"""transformers' model contract, forward side, for all three architectures (ModelTesterMixin as the yardstick):
output classes and tuples, hidden states and attentions, labels, masks, inputs_embeds, past_key_values, 4-D masks,
classification losses, tied weights. Generation and caches: test_contract_generation.py."""
import pytest
import torch
import torch.nn.functional as F
from transformers.modeling_outputs import (BaseModelOutputWithPast, CausalLMOutputWithPast,
                                           SequenceClassifierOutputWithPast)

from modeling_angpt import AnGPTForCausalLM, AnGPTForSequenceClassification, AnGPTModel

from conftest import ARCHITECTURES
from contract_fixtures import VOCAB, causal_lm, config, ids, single_thread  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("single_thread")

CLASSES = ((AnGPTModel, BaseModelOutputWithPast), (AnGPTForCausalLM, CausalLMOutputWithPast),
           (AnGPTForSequenceClassification, SequenceClassifierOutputWithPast))


def assert_same(a, b):
    assert type(a) is type(b)
    if isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_return_dict_false_gives_the_tuple_of_the_output_class(architecture):
    """Issue 10.1: every class returns its ModelOutput, or with return_dict=False (argument or config) to_tuple()."""
    tokens = ids()
    for model_class, output_class in CLASSES:
        model = model_class._from_config(config(architecture, num_labels=3), attn_implementation="eager").eval()
        labels = tokens if model_class is AnGPTForCausalLM else torch.tensor([0, 2])
        for extra in ({}, {"output_hidden_states": True, "output_attentions": True, "use_cache": False}):
            if model_class is not AnGPTModel:
                extra = {**extra, "labels": labels}
            with torch.no_grad():
                as_dict = model(tokens, **extra)
                as_tuple = model(tokens, return_dict=False, **extra)
            assert type(as_dict) is output_class and isinstance(as_tuple, tuple)
            assert_same(as_tuple, as_dict.to_tuple())
        model.config.return_dict = False
        with torch.no_grad():
            assert isinstance(model(tokens), tuple)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_hidden_states_and_attentions(architecture):
    model = causal_lm(architecture)
    tokens = ids()
    with torch.no_grad():
        out = model(tokens, output_hidden_states=True, output_attentions=True)
        base = model.model(tokens)
    assert len(out.hidden_states) == model.config.num_hidden_layers + 1
    assert all(h.shape == (2, 9, 32) for h in out.hidden_states)
    assert torch.equal(out.hidden_states[0], model.model.embed_tokens(tokens))
    assert torch.equal(out.hidden_states[-1], base.last_hidden_state)  # transformers ties the last to the output
    assert len(out.attentions) == model.config.num_hidden_layers
    for probs in out.attentions:
        assert probs.shape == (2, 4, 9, 9)
        torch.testing.assert_close(probs.sum(-1), torch.ones(2, 4, 9))
        assert not probs.triu(1).any()  # causal
    model.config.output_hidden_states = model.config.output_attentions = True  # the config flags work the same
    again = model(tokens)
    assert_same(again.hidden_states, out.hidden_states) and assert_same(again.attentions, out.attentions)
    again.hidden_states[0].retain_grad()  # test_retain_grad_hidden_states_attentions
    again.attentions[0].retain_grad()
    again.logits.flatten()[0].backward()
    assert again.hidden_states[0].grad is not None and again.attentions[0].grad is not None


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_labels_loss_is_shifted_cross_entropy(architecture):
    model = causal_lm(architecture)
    tokens = ids()
    labels = tokens.clone()
    labels[0, :3] = -100  # ignored positions, as transformers' collators write them
    with torch.no_grad():
        out = model(tokens, labels=labels)
    manual = F.cross_entropy(out.logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out.loss, manual, rtol=0, atol=1e-6)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_all_ones_mask_equals_no_mask_and_embeds_equal_ids(architecture, implementation):
    model = causal_lm(architecture, implementation)
    tokens = ids()
    with torch.no_grad():
        plain = model(tokens).logits
        assert torch.equal(model(tokens, attention_mask=torch.ones_like(tokens)).logits, plain)
        assert torch.equal(model(inputs_embeds=model.model.embed_tokens(tokens)).logits, plain)
        assert torch.equal(model(tokens).logits, plain)  # determinism


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_past_key_values_reuse(architecture):
    """A prefix's cache continued by a chunk of several tokens equals the whole forward."""
    model = causal_lm(architecture)
    tokens = ids(length=12)
    with torch.no_grad():
        full = model(tokens).logits
        prefix = model(tokens[:, :7], use_cache=True)
        rest = model(tokens[:, 7:], cache=prefix.cache, use_cache=True)
    assert prefix.cache.get_seq_length() == 12
    torch.testing.assert_close(torch.cat([prefix.logits, rest.logits], 1), full, rtol=0, atol=1e-5)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_custom_4d_attention_mask(architecture):
    """transformers' test_custom_4d_attention_mask: a shared prefix with three endings that do not see each other."""
    model = causal_lm(architecture)
    tokens = torch.tensor([[10, 11, 12, 13], [10, 11, 12, 14], [10, 11, 12, 15]])
    shared = torch.tensor([[10, 11, 12, 13, 14, 15]])
    visible = torch.tensor([[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0],
                            [1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 1, 0], [1, 1, 1, 0, 0, 1]])
    mask = (visible == 0).float()[None, None] * torch.finfo(torch.float32).min
    with torch.no_grad():
        separate = model(tokens, position_ids=torch.arange(4).expand(3, 4)).logits[:, -1]
        together = model(shared, attention_mask=mask, position_ids=torch.tensor([[0, 1, 2, 3, 3, 3]])).logits[0, -3:]
    torch.testing.assert_close(together, separate, rtol=0, atol=1e-5)


@pytest.mark.parametrize("problem_type, labels", [
    ("single_label_classification", torch.tensor([0, 2])),
    ("multi_label_classification", torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])),
    ("regression", torch.tensor([[0.5, -1.0, 2.0], [1.0, 0.0, -0.5]])),
])
def test_sequence_classification_problem_types(problem_type, labels):
    model = AnGPTForSequenceClassification(config("angpt", num_labels=3, problem_type=problem_type))
    loss = model(ids(), labels=labels).loss
    loss.backward()
    assert loss.ndim == 0 and torch.isfinite(loss) and model.score.weight.grad is not None


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_tied_and_untied_heads(architecture):
    tied, untied = causal_lm(architecture, tie_word_embeddings=True), causal_lm(architecture)
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    assert untied.lm_head.weight is not untied.model.embed_tokens.weight
    assert tied.get_output_embeddings() is tied.lm_head and tied.get_input_embeddings() is tied.model.embed_tokens
    assert len(list(tied.parameters())) == len(list(untied.parameters())) - 1
    assert AnGPTForCausalLM.main_input_name == "input_ids"
