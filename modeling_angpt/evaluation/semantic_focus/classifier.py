"""The classifier the semantic-focus protocol trains (protocol.py; docs/evaluation.md, "Semantic-focus tasks"): its
config for a task, on the library's backbone (`model_config`) or the paper's encoder (`paper_config`), a task's
splits as padded tensors, their batches, and the evaluation of a whole split."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .task_definitions import get_task
from .tokenizer import build_tokenizer


def model_config(task: str, *, architecture: str = "gptplus", qk_norm: bool = False, hidden_size: int = 64,
                 intermediate_size: int | None = None, num_layers: int | None = None, num_heads: int = 1,
                 dropout: float = 0.01, attention_sparsity: str = "none", attention_topk: int = 5,
                 attention_window: int = 5, attention_block_size: int = 5, attention_global_tokens: int = 0,
                 rope_type: str = "default", partial_rotary_factor: float | None = None,
                 attn_implementation: str = "eager", max_position_embeddings: int | None = None):
    """The paper's model (module docstring) as an AnGPTConfig for `task`'s vocabulary and classes."""
    from ... import AnGPTConfig

    spec = get_task(task)
    tokenizer = build_tokenizer(spec)
    if intermediate_size is None:  # the paper's MLP 64; anGPT/nGPT's ν constants assume 4d
        intermediate_size = hidden_size if architecture == "gptplus" else 4 * hidden_size
    rope = {"rope_type": rope_type}
    if partial_rotary_factor is not None:
        rope["partial_rotary_factor"] = partial_rotary_factor
    config = AnGPTConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers or spec.num_layers, num_attention_heads=num_heads,
        max_position_embeddings=max_position_embeddings or spec.length, architecture=architecture, qk_norm=qk_norm,
        rope_parameters=rope, attention_sparsity=attention_sparsity, attention_topk=attention_topk,
        attention_window=attention_window, attention_block_size=attention_block_size,
        attention_global_tokens=attention_global_tokens, attention_dropout=dropout, is_causal=False,
        classifier_pooling="mean", num_labels=spec.num_classes, pad_token_id=tokenizer.pad_token_id,
        id2label=dict(enumerate(spec.labels())), label2id={n: i for i, n in enumerate(spec.labels())})
    config._attn_implementation = attn_implementation
    return config


BACKBONES = ("library", "paper")
LIBRARY_ONLY = ("architecture", "qk_norm", "rope_type", "partial_rotary_factor", "attn_implementation")


def paper_config(task: str, *, max_position_embeddings: int | None = None, num_layers: int | None = None,
                 **fields):
    """The paper's encoder (paper_encoder.py) for `task`'s vocabulary and classes; `fields` as PaperEncoderConfig."""
    from .paper_encoder import PaperEncoderConfig

    spec = get_task(task)
    return PaperEncoderConfig(vocab_size=len(build_tokenizer(spec)), num_labels=spec.num_classes,
                              max_position_embeddings=max_position_embeddings or spec.length,
                              num_layers=num_layers or spec.num_layers, **fields)


def paper_width(longest: int, model_kwargs: dict) -> int:
    """The paper pads every sequence to the longest one, rounded up to a multiple of the mask size for sparse
    variants (full attention: no rounding)."""
    sparsity = model_kwargs.get("attention_sparsity", "none")
    size = {"topk": model_kwargs.get("attention_topk", 5), "window": model_kwargs.get("attention_window", 5),
            "block": model_kwargs.get("attention_block_size", 5)}.get(sparsity, 1)
    return -(-longest // size) * size


def as_tensors(split, pad_id: int, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids [n, width or longest] right-padded, lengths [n], labels [n]) of a split, built once per run."""
    rows = list(split["input_ids"])
    lengths = torch.tensor([len(row) for row in rows], dtype=torch.long)
    width = width if width is not None else int(lengths.max()) if rows else 0
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for index, row in enumerate(rows):
        ids[index, :len(row)] = torch.tensor(row, dtype=torch.long)
    return ids, lengths, torch.tensor(list(split["label"]), dtype=torch.long)


def batches(data, batch_size: int, device, order: torch.Tensor | None = None, full_width: bool = False):
    """(input_ids, attention_mask, labels) batches, cut to the longest sequence of the batch (`full_width`: kept
    at the tensor's width, for the paper's encoder, which pools PAD)."""
    ids, lengths, labels = data
    order = torch.arange(len(labels)) if order is None else order
    for start in range(0, len(order), batch_size):
        index = order[start:start + batch_size]
        width = ids.shape[1] if full_width else int(lengths[index].max())
        mask = torch.arange(width)[None] < lengths[index, None]
        yield ids[index, :width].to(device), mask.to(device), labels[index].to(device)


@torch.no_grad()
def evaluate(model, data, batch_size: int, device, full_width: bool = False) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) over a whole split (`as_tensors`), in eval mode."""
    model.eval()
    total_loss, correct = 0.0, 0
    for ids, mask, labels in batches(data, batch_size, device, full_width=full_width):
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
        total_loss += F.cross_entropy(logits, labels, reduction="sum").item()
        correct += (logits.argmax(-1) == labels).sum().item()
    model.train()
    count = max(len(data[2]), 1)
    return total_loss / count, correct / count


def build_classifier(task: str, backbone: str, model_kwargs: dict, longest: int, width: int | None, device):
    """(model in training mode on `device`, its config): the library's classifier, or the paper's encoder
    (`backbone="paper"`, its positions as wide as the padded batches, `width`)."""
    from ... import AnGPTForSequenceClassification
    from .paper_encoder import PaperEncoderForSequenceClassification

    if backbone == "paper":
        config = paper_config(task, **{"max_position_embeddings": width, **model_kwargs})
        return PaperEncoderForSequenceClassification(config).to(device).train(), config
    config = model_config(task, **{"max_position_embeddings": max(longest, 1), **model_kwargs})
    return AnGPTForSequenceClassification(config).to(device).train(), config
