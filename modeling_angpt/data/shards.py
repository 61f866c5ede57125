"""Prepared token shards: the on-disk format `angpt prepare` writes and training memory-maps (docs/training.md,
section "Corpora larger than memory").

A prepared directory holds `manifest.json`, the tokenizer in `tokenizer/`, and flat binary token files
`train-NNNNN.bin` / `val-NNNNN.bin` (uint16 when the vocabulary fits, else uint32; documents concatenated with the
separators training uses for that corpus). The manifest is written last and atomically, so a directory with a
manifest is complete; everything it says about the shards (token counts, byte sizes, the tokenizer's hash) is
checked before a run reads a token, and every failure is one line naming the file.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

MANIFEST = "manifest.json"
FORMAT = "angpt-token-shards"
FORMAT_VERSION = 1
TOKENIZER_DIR = "tokenizer"


class PreparedDataError(ValueError):
    """A prepared directory that cannot be trained on as it is (one line, names the file)."""


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def tokenizer_hash(tokenizer) -> str:
    """The tokenizer's identity: its full serialised form (vocabulary, merges, normaliser, special tokens)."""
    blob = tokenizer.backend_tokenizer.to_str() if hasattr(tokenizer, "backend_tokenizer") else repr(tokenizer)
    return hashlib.sha256(blob.encode()).hexdigest()


def held_out(text: str, seed: int, fraction: float) -> bool:
    """Whether a document is validation: a keyed hash of its text below `fraction`. Depends on the text and
    data_seed only, not on where the document sits, so prepare's workers, a per-process stream and a rerun all agree,
    and a document that occurs twice is on one side only."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8,
                             key=int(seed).to_bytes(8, "little", signed=True)).digest()
    return int.from_bytes(digest, "little") < fraction * 2.0 ** 64


def read_manifest(directory) -> dict:
    directory = Path(directory)
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise PreparedDataError(f"{path}: not a readable manifest ({error.__class__.__name__}); run angpt prepare "
                                "again into a new directory") from None
    if manifest.get("format") != FORMAT or manifest.get("format_version") != FORMAT_VERSION:
        raise PreparedDataError(
            f"{path}: written as format {manifest.get('format')!r} version {manifest.get('format_version')!r}, this "
            f"angpt reads {FORMAT!r} version {FORMAT_VERSION}; prepare the corpus again with this version")
    return manifest


def load_prepared_tokenizer(directory, manifest: dict):
    """The tokenizer saved beside the shards, checked against the hash the manifest recorded."""
    from transformers import AutoTokenizer

    from ..inference.padding import make_batchable

    path = Path(directory) / TOKENIZER_DIR
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as error:
        raise PreparedDataError(f"{path}: no loadable tokenizer ({str(error).splitlines()[0]})") from None
    if tokenizer_hash(tokenizer) != manifest["tokenizer"]["sha256"]:
        raise PreparedDataError(f"{path}: this tokenizer is not the one {Path(directory) / MANIFEST} was written with "
                                f"({manifest['tokenizer']['name']}); the shards' token ids would mean other text")
    make_batchable(tokenizer)
    return tokenizer


def check_recipe_tokenizer(tokenizer_name: str | None, manifest: dict, directory) -> None:
    """A recipe that names a tokenizer must name the prepared data's (compared by content, not by name)."""
    if not tokenizer_name:
        return
    from transformers import AutoTokenizer

    if tokenizer_hash(AutoTokenizer.from_pretrained(tokenizer_name)) != manifest["tokenizer"]["sha256"]:
        raise PreparedDataError(f"recipe key tokenizer={tokenizer_name!r} differs from the tokenizer {directory} was "
                                f"prepared with ({manifest['tokenizer']['name']}); leave tokenizer unset to use the "
                                "prepared one, or prepare the corpus with this tokenizer")


class ShardedBlocks:
    """Fixed-length blocks cut from memory-mapped shards of one split; block i is a view into one shard (a shard's
    last partial block is not used), so memory holds one small offset table, whatever the corpus size. A map-style
    dataset for torch's DataLoader (torch is imported only when a block is read: `angpt prepare` needs none)."""

    def __init__(self, directory, manifest: dict, split: str, block_size: int):
        self.directory, self.block_size = Path(directory), block_size
        self.dtype = np.dtype(manifest["dtype"])
        self.vocab_size = manifest["tokenizer"]["vocab_size"]
        self.shards = [entry for entry in manifest["shards"] if entry["split"] == split]
        for entry in self.shards:
            self._check_size(entry)
        counts = [entry["tokens"] // block_size for entry in self.shards]
        self.offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        self._maps: dict[int, np.memmap] = {}

    def _check_size(self, entry: dict) -> None:
        path = self.directory / entry["file"]
        expected = entry["tokens"] * self.dtype.itemsize
        if not path.is_file():
            raise PreparedDataError(f"{path}: missing; {self.directory / MANIFEST} lists it")
        actual = path.stat().st_size
        if actual != expected:
            raise PreparedDataError(f"{path}: {actual} bytes, the manifest says {expected} ({entry['tokens']} tokens): "
                                    "the shard is truncated or was replaced; prepare the corpus again")

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @property
    def tokens(self) -> int:
        return len(self) * self.block_size

    def _map(self, shard: int) -> np.memmap:
        # Opened lazily, per process: DataLoader workers each map the files themselves.
        if shard not in self._maps:
            entry = self.shards[shard]
            self._maps[shard] = np.memmap(self.directory / entry["file"], dtype=self.dtype, mode="r",
                                          shape=(entry["tokens"],))
        return self._maps[shard]

    def block(self, index: int) -> np.ndarray:
        if not 0 <= index < len(self):
            raise IndexError(index)
        shard = int(np.searchsorted(self.offsets, index, side="right")) - 1
        start = (index - int(self.offsets[shard])) * self.block_size
        ids = np.asarray(self._map(shard)[start: start + self.block_size], dtype=np.int64)
        if ids.max(initial=0) >= self.vocab_size:
            raise PreparedDataError(f"{self.directory / self.shards[shard]['file']}: token id {int(ids.max())} at "
                                    f"block {index} is outside the vocabulary ({self.vocab_size}): the shard is "
                                    "corrupted; prepare the corpus again")
        return ids

    def __getitem__(self, index: int) -> dict:
        import torch

        return {"input_ids": torch.from_numpy(self.block(index))}

    @property
    def blocks(self) -> np.ndarray:
        """All blocks as one array (for evaluation's held-out text; a validation split is small)."""
        return np.stack([self.block(i) for i in range(len(self))]) if len(self) else np.zeros((0, self.block_size),
                                                                                               np.int64)

    def __getstate__(self):  # DataLoader workers re-open the maps themselves
        return {**self.__dict__, "_maps": {}}


def prepared_datasets(recipe, directory: Path):
    """(tokenizer, train, val, info) from a directory `angpt prepare` wrote: memory-mapped, nothing loaded."""
    manifest = read_manifest(directory)
    check_recipe_tokenizer(recipe.tokenizer, manifest, directory)
    tokenizer = load_prepared_tokenizer(directory, manifest)
    train, val = (ShardedBlocks(directory, manifest, split, recipe.block_size) for split in ("train", "val"))
    if len(val) == 0:
        raise ValueError(f"{directory}: the held-out documents ({manifest['totals']['val']['tokens']} tokens) do not "
                         f"fill one block of block_size={recipe.block_size} tokens; lower block_size or prepare with "
                         "a larger validation_fraction")
    info = {"dataset": manifest["dataset"], "prepared": str(directory), "train_blocks": len(train),
            "val_blocks": len(val), "train_tokens": train.tokens, "val_tokens": val.tokens}
    return tokenizer, train, val, info
