"""transformers' generation contract for all three architectures (GenerationTesterMixin as the yardstick): dict
outputs, beam search with and without cache, continuing from past_key_values, inputs_embeds, an explicit
DynamicCache, prompt-lookup and assisted decoding, generating without input_ids, logits_to_keep.
Left padding and sampling: test_modeling.py."""
import pytest
import torch
from transformers import DynamicCache
from transformers.generation import GenerateBeamDecoderOnlyOutput, GenerateDecoderOnlyOutput

from conftest import ARCHITECTURES
from contract_fixtures import VOCAB, causal_lm, ids, single_thread  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("single_thread")

GREEDY = dict(do_sample=False, pad_token_id=0)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_generation_contract(architecture):
    model = causal_lm(architecture)
    prompt = ids(batch=2, length=6, low=1)
    new = 5
    out = model.generate(prompt, max_new_tokens=new, return_dict_in_generate=True, output_scores=True,
                         output_logits=True, output_hidden_states=True, output_attentions=True, **GREEDY)
    assert isinstance(out, GenerateDecoderOnlyOutput) and out.sequences.shape == (2, 6 + new)
    assert len(out.scores) == len(out.logits) == len(out.hidden_states) == len(out.attentions) == new
    assert out.scores[0].shape == (2, VOCAB)
    assert len(out.hidden_states[0]) == model.config.num_hidden_layers + 1
    assert out.hidden_states[0][0].shape == (2, 6, 32)
    assert out.hidden_states[1][0].shape == (2, 1, 32)  # cached steps see one new token
    assert out.attentions[0][0].shape == (2, 4, 6, 6) and out.attentions[-1][0].shape == (2, 4, 1, 6 + new - 1)
    sequences = out.sequences

    # the same tokens: without cache, from inputs_embeds, with an explicit DynamicCache, by prompt lookup
    assert torch.equal(model.generate(prompt, max_new_tokens=new, use_cache=False, **GREEDY), sequences)
    from_embeds = model.generate(inputs_embeds=model.model.embed_tokens(prompt), max_new_tokens=new, **GREEDY)
    assert torch.equal(from_embeds, sequences[:, 6:])
    cache = DynamicCache(config=model.config)
    assert torch.equal(model.generate(prompt, max_new_tokens=new, cache=cache, **GREEDY), sequences)
    assert cache.get_seq_length() == 6 + new - 1
    lookup = model.generate(prompt[:1], max_new_tokens=new, prompt_lookup_num_tokens=2, **GREEDY)
    assert torch.equal(lookup, sequences[:1])
    assisted = model.generate(prompt[:1], max_new_tokens=new, assistant_model=model, **GREEDY)
    assert torch.equal(assisted, sequences[:1])

    # continuing from the returned cache equals one longer generation (test_generate_continue_from_past_key_values)
    first = model.generate(prompt, max_new_tokens=3, return_dict_in_generate=True, **GREEDY)
    continued = model.generate(first.sequences, max_new_tokens=new - 3, cache=first.cache,
                               **GREEDY)
    assert torch.equal(continued, sequences)

    # beam search: cache on and off agree, and the dict output has one score per returned sequence
    beams = dict(num_beams=3, num_return_sequences=2, max_new_tokens=4, **GREEDY)
    beam = model.generate(prompt, return_dict_in_generate=True, output_scores=True, **beams)
    assert isinstance(beam, GenerateBeamDecoderOnlyOutput) and beam.sequences.shape == (4, 10)
    assert beam.sequences_scores.shape == (4,)
    assert torch.equal(model.generate(prompt, use_cache=False, **beams), beam.sequences)

    model.generation_config.bos_token_id = 1  # generate() without input_ids starts from BOS
    assert model.can_generate() and model.generate(max_new_tokens=3, **GREEDY).shape == (1, 4)

    with torch.no_grad():  # logits_to_keep: only the last positions' logits, the same values
        full = model(prompt).logits
        torch.testing.assert_close(model(prompt, logits_to_keep=2).logits, full[:, -2:], rtol=0, atol=1e-6)
