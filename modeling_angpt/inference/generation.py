"""Text from a checkpoint: `generate_text(checkpoint, prompt, ...)` loads the model and its tokenizer through the
Auto classes and continues the prompt (greedy at temperature 0, sampling above). `angpt generate`
(modeling_angpt/commands/generate.py) is a thin layer over it."""
from __future__ import annotations

import math


class GenerationError(ValueError):
    """Arguments or a checkpoint that generation cannot use; nothing was loaded or nothing generated."""


def check_generation_args(max_new_tokens: int, temperature: float, top_k: int | None) -> None:
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise GenerationError(f"max_new_tokens={max_new_tokens!r}: expected an integer >= 1")
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
        raise GenerationError(f"temperature={temperature!r}: expected a number >= 0 (0 = greedy)")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise GenerationError(f"top_k={top_k!r}: expected an integer >= 1")


def generate_text(checkpoint, prompt: str = "", max_new_tokens: int = 50, temperature: float = 0.0,
                  top_k: int | None = None, seed: int = 0, dtype: str | None = None) -> str:
    """The prompt and its continuation, decoded. An empty prompt starts from the tokenizer's BOS token."""
    check_generation_args(max_new_tokens, temperature, top_k)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .. import register_auto_classes
    from .checkpoint_check import check_checkpoint

    register_auto_classes()

    check_checkpoint(checkpoint)
    try:
        tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    except (OSError, ValueError) as error:
        raise GenerationError(f"{checkpoint}: no usable tokenizer ({error})") from error
    encoded = tokenizer(prompt or (tokenizer.bos_token or ""), return_tensors="pt")
    if encoded["input_ids"].shape[1] == 0:
        raise GenerationError("the prompt is empty and the tokenizer has no BOS token: pass a prompt")
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=getattr(torch, dtype) if dtype else None).eval()
    torch.manual_seed(seed)
    sampling = temperature > 0
    pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with torch.no_grad():
        output = model.generate(**encoded, max_new_tokens=max_new_tokens, do_sample=sampling,
                                temperature=temperature if sampling else None, top_k=top_k if sampling else None,
                                pad_token_id=pad_token_id)
    return tokenizer.decode(output[0], skip_special_tokens=True)
