"""The data path's entry for training and evaluation (docs/training.md, "Your own data" and "Corpora larger than
memory"): from a recipe's `Corpus` (sources.resolve_corpus, resolved before any work) to the tokenizer and the
training and validation datasets. The trip goes one way, each stage in its own file and left for good:

    sources.py (resolved before)  ->  build.py: load the texts  ->  tokenizer.py  ->  blocks.py | streaming.py |
    shards.py  ->  loader.py (the batches, built by training from what this returns)

Kinds of data: a corpus tokenised at start into blocks in memory (blocks.py), a stream read once (`streaming:
true`, streaming.py), a directory `angpt prepare` wrote (memory-mapped token shards: shards.py, prepare.py); needle
examples over blocks (`dataset_kind: needle`, blocks.py).
"""
from __future__ import annotations

from pathlib import Path

from .sources import Corpus, DataSource


def load_texts(source: DataSource, recipe, streaming: bool = False):
    """A `datasets` Dataset (or IterableDataset) with the text in `recipe.text_column`."""
    import datasets

    if source.kind == "hub":
        return datasets.load_dataset(source.name, recipe.dataset_config, split=recipe.dataset_split,
                                     streaming=streaming)
    kwargs = {}
    if source.builder == "text":
        # Shakespeare: one row per play; other text files: one row per paragraph (bounded row size).
        kwargs["sample_by"] = "document" if source.name.startswith("shakespeare") else "paragraph"
    ds = datasets.load_dataset(source.builder, data_files=list(source.files), split="train",
                               streaming=streaming, **kwargs)
    if source.builder == "text" and recipe.text_column != "text":
        ds = ds.rename_column("text", recipe.text_column)
    return ds


def limit_chars(ds, column: str, max_chars: int | None):
    """Keep rows up to `max_chars` characters (the last one cut), in corpus order."""
    if max_chars is None:
        return ds
    texts, total = [], 0
    for text in ds[column]:
        texts.append(text[: max_chars - total])
        total += len(texts[-1])
        if total >= max_chars:
            break
    from datasets import Dataset

    return Dataset.from_dict({column: texts})


def build_datasets(recipe, corpus: Corpus, main_process_first, rank: int = 0, processes: int = 1,
                   stream_parts: int | None = None, examples: bool = True):
    """(tokenizer, train_dataset, val_dataset, info). `main_process_first` is accelerate's context manager:
    rank 0 trains the tokenizer and writes the cache, the other ranks then read it. A prepared directory is read
    in place; a stream split into `stream_parts` parts (the run's, resume.stream_parts; default `processes`) gives
    this process (`rank` of `processes`) its parts (streaming.py). With `dataset_kind: needle` the datasets are the
    needle examples; `examples=False` gives the blocks they are built over (what evaluation scores)."""
    source = corpus.source
    if source.kind == "prepared":
        if recipe.dataset_kind == "needle" and examples:
            raise ValueError(f"recipe key dataset_kind='needle' takes its filler from a text corpus, not from the "
                             f"prepared directory {source.name}; set dataset to the corpus itself")
        from .shards import prepared_datasets

        return prepared_datasets(recipe, Path(source.name))
    from .tokenizer import get_tokenizer

    with main_process_first():
        ds = load_texts(source, recipe, streaming=recipe.streaming)
        if not recipe.streaming:
            ds = limit_chars(ds, recipe.text_column, recipe.max_corpus_chars)
        tokenizer = get_tokenizer(recipe, corpus, ds)
        from .blocks import BlockDataset, needle_datasets, packed_blocks, split_blocks

        if recipe.streaming:
            from .streaming import stream_datasets

            parts = stream_parts or processes
            train, val = stream_datasets(ds, tokenizer, recipe, corpus.separator, rank, processes, parts)
            info = {"dataset": source.name, "streaming": True, "stream_parts": parts, "val_blocks": len(val)}
            return tokenizer, train, BlockDataset(val), info
        blocks = packed_blocks(recipe, corpus, ds, tokenizer)
    train, val = split_blocks(blocks, recipe.validation_fraction, recipe.data_seed)
    info = {"dataset": source.name, "train_blocks": len(train), "val_blocks": len(val),
            "train_tokens": int(train.size), "val_tokens": int(val.size), "blocks_cache": str(corpus.blocks_file)}
    if recipe.dataset_kind == "needle" and examples:
        return (tokenizer, *needle_datasets(recipe, tokenizer, BlockDataset(train), BlockDataset(val), info))
    return tokenizer, BlockDataset(train), BlockDataset(val), info
