"""A saved tiny checkpoint with its scales moved off their init values, and a small byte-level BPE tokenizer
beside it: the sources the export and command-line tests start from."""
from __future__ import annotations

import torch

from modeling_angpt import AnGPTForCausalLM
from modeling_angpt.export.hub import save_pretrained


@torch.no_grad()
def save_source(path, tiny_config, architecture="angpt", **overrides):
    model = AnGPTForCausalLM(tiny_config(architecture, **overrides)).eval()
    for param in model.parameters():
        if param.ndim == 1:
            param.mul_(1 + 0.3 * torch.randn_like(param))
    save_pretrained(model, path, card_info={"datasets": ["shakespeare"], "train_tokens": 123456, "val_loss": 4.56})
    return model


def write_tokenizer(path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(["To be, or not to be, that is the question."] * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>", unk_token="<unk>")
    fast.save_pretrained(path)
    return fast
