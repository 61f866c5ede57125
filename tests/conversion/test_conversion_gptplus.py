"""GPT+ converted from transformers' own Qwen3 and Llama reproduces their logits (docs/architectures.md)."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from modeling_angpt import AnGPTForCausalLM
from modeling_angpt.conversion.llama_qwen3 import gptplus_from_transformers

SCRIPT = Path(__file__).resolve().parents[2] / "conversion" / "llama_qwen3_to_gptplus.py"
SHAPE = dict(vocab_size=113, hidden_size=48, intermediate_size=88, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=4, max_position_embeddings=64, rope_parameters={"rope_type": "default",
                                                                                  "rope_theta": 5000.0})


def randomised(model):
    # Gains away from 1 so the test sees whether every RMSNorm/QK-norm weight reaches the right place.
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.uniform_(0.5, 1.5)
    return model.eval()


@pytest.mark.parametrize("source_class, config_class, extra", [
    (Qwen3ForCausalLM, Qwen3Config, dict(head_dim=16)),
    (Qwen3ForCausalLM, Qwen3Config, dict(head_dim=8, tie_word_embeddings=True)),
    (LlamaForCausalLM, LlamaConfig, dict()),
])
def test_conversion_matches_source_logits(source_class, config_class, extra):
    source = randomised(source_class(config_class(**SHAPE, **extra, attn_implementation="eager")))
    model = gptplus_from_transformers(source)
    assert model.config.architecture == "gptplus"
    assert model.config.qk_norm is (source_class is Qwen3ForCausalLM)
    ids = torch.randint(0, 113, (2, 20))
    mask = torch.ones_like(ids)
    mask[1, :6] = 0
    with torch.no_grad():
        expected = source(ids, attention_mask=mask).logits
        got = model(ids, attention_mask=mask).logits
    assert (got - expected)[mask.bool()].abs().max() <= 1e-5


def test_conversion_script_round_trip(tmp_path):
    source = randomised(Qwen3ForCausalLM(Qwen3Config(**SHAPE, head_dim=12)))
    source.save_pretrained(tmp_path / "qwen3")
    result = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "qwen3"), str(tmp_path / "gptplus")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    converted = AnGPTForCausalLM.from_pretrained(tmp_path / "gptplus").eval()
    ids = torch.randint(0, 113, (1, 16))
    with torch.no_grad():
        assert (converted(ids).logits - source(ids).logits).abs().max() <= 1e-5
