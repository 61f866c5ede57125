"""The data path's tokenizer stage: the recipe's tokenizer by name (or the checkpoint's it starts from), or a
byte-level BPE trained with `tokenizers` on the corpus and cached (as a PreTrainedTokenizerFast, so AutoTokenizer
reloads it) where sources.resolve_corpus says. Either way it pads with its end-of-text token on the left, so the
checkpoints training writes batch out of the box (inference/padding.py)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..inference.padding import make_batchable
from .sources import EOS, Corpus


def train_bpe(text_batches, vocab_size: int, out_dir: Path, split_digits: bool = False):
    """Byte-level BPE with `tokenizers`, saved with save_pretrained so AutoTokenizer reloads it. `split_digits`
    isolates every digit before the byte-level split, so no merge spans digits: a number is the same tokens
    wherever it stands (` 9004803.` and `=9004803;` share the seven digit tokens), which copying tasks need."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                         if split_digits else byte_level)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(text_batches, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, unk_token=EOS)
    tmp = out_dir.with_name(out_dir.name + f".tmp{os.getpid()}")
    fast.save_pretrained(tmp)
    if out_dir.exists():  # another job cached the same tokenizer meanwhile
        shutil.rmtree(tmp)
    else:
        os.replace(tmp, out_dir)  # atomic: readers never see a half-written tokenizer


def _documents(texts, separator: str) -> list[str]:
    """The non-empty texts, each followed by the corpus's separator (sources.Corpus), as training packs them."""
    return [text + separator for text in texts if text]


def _text_batches(ds, column: str, separator: str, size: int = 1000):
    for start in range(0, len(ds), size):
        yield _documents(ds[start: start + size][column], separator)


def get_tokenizer(recipe, corpus: Corpus, ds):
    """The tokenizer that encodes the corpus: `corpus.tokenizer_name`, else the BPE in `corpus.bpe_dir`, trained
    there first when it is not cached yet."""
    from transformers import AutoTokenizer

    if corpus.tokenizer_name:
        tok = AutoTokenizer.from_pretrained(corpus.tokenizer_name)
    elif corpus.bpe_dir.is_dir():
        tok = AutoTokenizer.from_pretrained(corpus.bpe_dir)
    else:
        corpus.bpe_dir.parent.mkdir(parents=True, exist_ok=True)
        texts = (_text_batches(ds, recipe.text_column, corpus.separator) if not recipe.streaming
                 else _stream_sample(ds, recipe.text_column, corpus.separator))
        train_bpe(texts, recipe.tokenizer_vocab_size, corpus.bpe_dir, split_digits=recipe.tokenizer_split_digits)
        tok = AutoTokenizer.from_pretrained(corpus.bpe_dir)  # reloaded, so name_or_path is the cache path
    if tok.eos_token_id is None:
        raise ValueError(f"tokenizer {recipe.tokenizer!r} has no eos token; packing needs one between documents")
    make_batchable(tok)  # pad token and left padding: the saved checkpoints batch out of the box
    return tok


def _stream_sample(ds, column: str, separator: str, chars: int = 20_000_000):
    """The first `chars` characters of a streamed corpus, to train the tokenizer on."""
    batch, seen = [], 0
    for row in ds:
        batch.append(row[column])
        seen += len(batch[-1])
        if len(batch) == 1000 or seen >= chars:
            yield _documents(batch, separator)
            batch = []
        if seen >= chars:
            return
    if batch:
        yield _documents(batch, separator)
