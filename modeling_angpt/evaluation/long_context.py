"""What the length-generalisation and needle suites share: the training length of a checkpoint, its held-out
text, the lengths they may evaluate at, and the memory-bounded attention path they run on.

Training length: `block_size` of the recipe in `training_metadata.json` beside the weights (what `angpt train`
wrote and `angpt export` copies), or an explicit value; never guessed from `max_position_embeddings` (the presets
set 1024 while the demo trains at 128).

Held-out text: the validation blocks of the run that produced the checkpoint (same corpus, tokenizer, block size
and split seed as training, rebuilt through the training data pipeline and its cache). Without metadata, the
default corpus split the same way a default recipe splits it, tokenised with the checkpoint's own tokenizer.
The validation blocks are a uniform random sample of the corpus (`data.blocks.split_blocks`), kept in that
order: a window of m training lengths is m held-out blocks, each a stretch of contiguous text, like packed
documents in training.

Which lengths a checkpoint allows: anGPT-family models have no learned position table; every rope type of
`rotary_angpt.py` computes its angles from the position (`position × inv_freq` in float32) and the logit
transforms from the distance, so `max_position_embeddings` is not a ceiling (exceeding it is the point of the
experiment). The ceiling is where float32 stops representing every integer position: 2**24 tokens; beyond it
positions collide and the rotary angles are wrong. Lengths must also fit in the held-out text (checked where the
text is known).
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np

from .options import EvalOptions

MAX_EXACT_POSITIONS = 2 ** 24  # float32 integers are exact up to here (RoPE angles are position × inv_freq)
SCORE_BUDGET = 2 ** 24         # elements of one query chunk's score tensor [b, h, C, T] (64 MiB in float32)


def read_metadata(checkpoint: Path) -> dict | None:
    path = Path(checkpoint) / "training_metadata.json"
    return json.loads(path.read_text()) if path.is_file() else None


def training_length(checkpoint: Path, explicit: int | None = None) -> int:
    """The context length the checkpoint was trained at (recipe block_size), or `explicit` when the checkpoint has
    no metadata. An explicit value that contradicts the metadata is refused: held-out blocks of another size come
    from another split of the corpus and would hold training text."""
    metadata = read_metadata(checkpoint)
    recorded = (metadata or {}).get("recipe", {}).get("block_size")
    if explicit is not None:
        if int(explicit) <= 0:
            raise ValueError(f"training length {explicit} must be a positive number of tokens")
        if recorded is not None and int(explicit) != int(recorded):
            raise ValueError(f"train_length={explicit} contradicts {checkpoint}/training_metadata.json (block_size "
                             f"{recorded}); held-out text split at another length overlaps the training split: "
                             "leave train_length out")
        return int(explicit)
    if metadata is None or "block_size" not in metadata.get("recipe", {}):
        raise ValueError(f"{checkpoint} has no training_metadata.json with the recipe's block_size, so its training "
                         "length is unknown; pass it explicitly (train_length=N)")
    return int(metadata["recipe"]["block_size"])


def resolve_multiples(lengths, default: tuple[int, ...]) -> list[int]:
    """`--lengths` as given (ints, or a '1,4,16' string) or the suite's default; each a positive integer."""
    if lengths is None:
        return list(default)
    if isinstance(lengths, str):
        lengths = [part for part in lengths.split(",") if part.strip()]
    multiples = []
    for value in lengths:
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = float("nan")
        if not number.is_integer() or number <= 0:
            raise ValueError(f"--lengths {value}: expected positive integer multiples of the training length, "
                             "e.g. --lengths 1,4,16")
        multiples.append(int(number))
    if not multiples:
        raise ValueError("--lengths is empty; expected positive integer multiples of the training length, e.g. 1,4,16")
    return sorted(set(multiples))


def check_lengths(config, train_length: int, multiples: list[int], where) -> None:
    """Refuse lengths the model cannot compute (module docstring): one line naming the length and the limit."""
    if getattr(config, "model_type", None) != "angpt":
        raise ValueError(f"{where}: the length and needle suites evaluate anGPT-family checkpoints (model_type "
                         f"'angpt'); this one has model_type {getattr(config, 'model_type', None)!r}")
    for multiple in multiples:
        tokens = multiple * train_length
        if tokens > MAX_EXACT_POSITIONS:
            rope = config.rope_parameters["rope_type"]
            raise ValueError(f"--lengths {multiple}: {multiple} × {train_length} = {tokens} tokens exceeds the "
                             f"{MAX_EXACT_POSITIONS} positions that rope_type={rope!r} represents exactly in float32 "
                             f"({where})")


def suite_lengths(checkpoint: Path, options: EvalOptions, default: tuple[int, ...],
                  config=None) -> tuple[int, list[int]]:
    """(training length, multiples) of a suite run, checked (`check_lengths`); without `config` it is read from
    the checkpoint, so the front door can refuse bad input before it loads the weights."""
    if config is None:
        from transformers import AutoConfig

        from .. import register_auto_classes

        register_auto_classes()  # model_type "angpt"
        config = AutoConfig.from_pretrained(checkpoint)
    train_length = training_length(checkpoint, options.train_length)
    multiples = resolve_multiples(options.lengths, default)
    check_lengths(config, train_length, multiples, checkpoint)
    return train_length, multiples


def held_out_blocks(checkpoint: Path, train_length: int) -> tuple[np.ndarray, str]:
    """([n, train_length] token ids, description): the checkpoint's validation blocks (module docstring)."""
    from ..data.sources import resolve_corpus
    from ..data.build import build_datasets
    from ..training.recipe import recipe_from_dict

    metadata = read_metadata(checkpoint)
    if metadata is not None and "recipe" in metadata:
        values = dict(metadata["recipe"])
        where = f"{checkpoint}/training_metadata.json"
        if values.get("init_from"):  # that run took init_from's tokenizer and saved it beside the weights
            values.update(tokenizer=values["tokenizer"] or str(checkpoint), init_from=None)
    else:
        values = {"tokenizer": str(checkpoint)}
        where = f"default corpus, tokenised with {checkpoint}'s tokenizer"
    values.update(block_size=train_length, streaming=False)  # needs every block at once (no Hub-scale stream)
    recipe = recipe_from_dict(values, where=where)
    _, _, val, info = build_datasets(recipe, resolve_corpus(recipe), contextlib.nullcontext, examples=False)
    return np.asarray(val.blocks), f"validation split of {info['dataset']} ({len(val.blocks)} blocks of {train_length})"


def batch_size_of(options: EvalOptions, default: int = 1) -> int:
    """options.batch_size as an int (lm-eval's 'auto' and None give `default`)."""
    value = str(options.batch_size or default)
    return int(value) if value.isdigit() and int(value) > 0 else default


def limit_count(limit, available: int) -> int:
    """lm-eval's --limit: a count (>= 1) or a fraction (< 1) of what is available; None = all."""
    if limit is None:
        return available
    limit = float(limit)
    if limit <= 0:
        raise ValueError(f"--limit {limit:g} must be positive")
    return max(1, min(available, int(limit * available) if limit < 1 else int(limit)))


def query_chunk_for(config, batch: int, length: int, requested: int | None = None) -> int:
    """Queries per chunk so that one chunk's scores [b, h, C, T] stay within SCORE_BUDGET elements."""
    if requested is not None:
        return max(1, int(requested))
    fitting = SCORE_BUDGET // max(1, batch * config.num_attention_heads * length)
    return max(1, min(config.attention_query_chunk_size, fitting))


@contextlib.contextmanager
def memory_bounded_attention(model, query_chunk_size: int):
    """Run `model` on the chunked eager path (attention_angpt.CHUNKED: the eager math over query chunks, so no
    T×T tensor per head exists) with the given chunk size; the previous settings are restored afterwards."""
    from ..attention_angpt import CHUNKED

    config = model.config
    previous = (config._attn_implementation, config.attention_query_chunk_size)
    model.set_attn_implementation(CHUNKED)
    config.attention_query_chunk_size = int(query_chunk_size)
    try:
        yield model
    finally:
        config.attention_query_chunk_size = previous[1]
        model.set_attn_implementation(previous[0] or "eager")
