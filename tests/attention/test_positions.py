"""Explicit position_ids and a 2-D padding mask describe the same positions to every attention variant."""
import pytest
import torch

from modeling_angpt import AnGPTForCausalLM
from modeling_angpt.configuration_angpt import attention_backends_supporting

VARIANTS = [dict(attention_logit_transform="scale_invariant"),
            dict(attention_sparsity="window", attention_window=4),
            dict(attention_sparsity="block", attention_block_size=4, attention_global_tokens=1),
            dict(attention_logit_transform="logn")]


# Every backend that computes the variant (the others raise, tests/test_attention_backends.py).
CASES = [(variant, backend) for variant in VARIANTS for backend in ("eager", "angpt_chunked", "sdpa")
         if backend in attention_backends_supporting(variant.get("attention_logit_transform", "none"),
                                                     variant.get("attention_sparsity", "none"))]


@pytest.mark.parametrize("variant, implementation", CASES,
                         ids=[f"{b}-{'-'.join(map(str, v.values()))}" for v, b in CASES])
def test_shifted_position_ids_with_and_without_mask(tiny_config, variant, implementation):
    config = tiny_config("angpt", attention_query_chunk_size=5, **variant)
    model = AnGPTForCausalLM._from_config(config, attn_implementation=implementation).eval()
    ids = torch.randint(0, 101, (2, 12))
    positions = torch.arange(12)[None] + 5
    with torch.no_grad():
        without_mask = model(ids, position_ids=positions).logits
        with_mask = model(ids, position_ids=positions, attention_mask=torch.ones_like(ids)).logits
    torch.testing.assert_close(with_mask, without_mask, rtol=1e-5, atol=1e-5)
