"""Writes the golden checkpoints that tests/model/test_golden_logits.py loads: tiny models of the three architectures
and several attention variants (one folded), each with the logits it gave when it was saved.

Run once, before a change that must leave the numerics alone (`python tests/model/golden/make_golden.py`); the test
then checks that the current code gives the same logits from the same files. Rerunning it replaces the reference:
do that only on purpose, for a change that is meant to alter the numerics.
"""
from __future__ import annotations

import json
import pathlib
import platform

import torch
from safetensors.torch import save_file

HERE = pathlib.Path(__file__).resolve().parent
VOCAB = 61
SMALL = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=64)

# name -> (config overrides, attn_implementation or None for the config's default, fold after building)
CASES = {
    "angpt": (dict(architecture="angpt"), None, False),
    "ngpt": (dict(architecture="ngpt"), None, False),
    "gptplus": (dict(architecture="gptplus"), None, False),
    "angpt_folded": (dict(architecture="angpt"), None, True),
    "ngpt_folded": (dict(architecture="ngpt"), None, True),
    "angpt_scale_invariant": (dict(architecture="angpt", attention_logit_transform="scale_invariant",
                                   rope_parameters={"rope_type": "scale_invariant_p", "partial_rotary_factor": 0.5}),
                              "eager", False),
    "angpt_topk": (dict(architecture="angpt", attention_sparsity="topk", attention_topk=3), None, False),
    "gptplus_alibi_window_gqa": (dict(architecture="gptplus", num_attention_heads=4, num_key_value_heads=2,
                                      attention_logit_transform="alibi", attention_sparsity="window",
                                      attention_window=5, rope_parameters={"rope_type": "none"}), "sdpa", False),
    "ngpt_logn_block": (dict(architecture="ngpt", attention_logit_transform="logn", attention_sparsity="block",
                             attention_block_size=4, rope_parameters={"rope_type": "proportional",
                                                                      "partial_rotary_factor": 0.5}), None, False),
}


def probe_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of 12 tokens, the second left-padded by 3 (so positions count real tokens)."""
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(7))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    return ids, mask


def logits_of(model) -> torch.Tensor:
    ids, mask = probe_inputs()
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


def main() -> None:
    from modeling_angpt import AnGPTConfig, AnGPTForCausalLM

    torch.set_num_threads(1)
    manifest = {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
                "machine": platform.machine(), "cases": {}}
    for name, (overrides, implementation, fold) in CASES.items():
        torch.manual_seed(0)
        config = AnGPTConfig(**{**SMALL, **overrides})
        model = AnGPTForCausalLM(config).eval()
        with torch.no_grad():  # move every scale off its init value, so a fold or load that drops one shows
            for parameter in model.parameters():
                if parameter.ndim == 1:
                    parameter.mul_(1 + 0.1 * torch.randn_like(parameter))
        if fold:
            model = model.fold().eval()
        if implementation:
            model.set_attn_implementation(implementation)
        model.save_pretrained(HERE / name)
        for extra in (HERE / name).iterdir():  # keep the config and the weights, not the model code or the card
            if extra.name not in ("config.json", "model.safetensors"):
                extra.unlink()
        save_file({"logits": logits_of(model).contiguous()}, str(HERE / name / "logits.safetensors"))
        manifest["cases"][name] = implementation
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
