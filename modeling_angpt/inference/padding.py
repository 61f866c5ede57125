"""Tokenizers that batch out of the box: what training's final checkpoint and `angpt export` write.

Causal LM tokenizers often come without a padding token, and pad on the right; batched `generate()` and
`pipeline("text-generation", batch_size=N)` then fail or continue after padding. This library's checkpoints
reuse the end-of-text token as padding (attention masks hide it, so it is never read as text) and pad on the
left, where a decoder-only model needs the padding.
"""
from __future__ import annotations


def make_batchable(tokenizer) -> bool:
    """Give `tokenizer` a pad token (its EOS) and left padding, in place; True when something changed."""
    changed = False
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
        changed = True
    if tokenizer.padding_side != "left" or getattr(tokenizer, "init_kwargs", {}).get("padding_side") != "left":
        tokenizer.padding_side = "left"
        # save_pretrained writes the constructor's keyword arguments, not the attribute: record it there too
        if hasattr(tokenizer, "init_kwargs"):
            tokenizer.init_kwargs["padding_side"] = "left"
        changed = True
    return changed


def set_pad_token_id(model, tokenizer) -> None:
    """Tell the model's config and generation config which id pads, so generate() need not guess."""
    if tokenizer.pad_token_id is None:
        return
    model.config.pad_token_id = tokenizer.pad_token_id
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
