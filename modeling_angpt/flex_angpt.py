"""FlexAttention for every layout (docs/attention.md), compiled once for every length, batch size and layer.

`score_mod`/`mask_mod` are the registries' elementwise functions (the eager path's math: logit_transforms_angpt,
sparsity_angpt.support) on FlexAttention's scalars. Everything that changes from forward to forward reaches them
only as tensors (positions, padding, packing, the query offset); configuration values are constant per model.
torch.compile then guards on tensor metadata, never on per-forward Python values, and:

- the kernel is compiled with dynamic shapes and without 0/1 specialisation or duck sizing, so a new length or
  batch size (or a decode step, q = 1) reuses the compiled graph instead of recompiling towards
  `recompile_limit`, after which dynamo would run the unfused path that materialises the T×T scores;
- the captured tensors are padded to a capacity (a power of two, at least 1024 positions and 8 rows) and marked
  static. Why: torch 2.13's CPU flex template renames the length/batch symbols inside its loops, and indexing a
  captured tensor whose size is a dynamic symbol (`pos[b, kv_idx]` with pos of size [B, T]) emits a bound check
  naming an undeclared variable (`cur_kvSplitSize7`, `cur_qSplitSize7`: CppCompileError). Constant sizes avoid
  that code; a new capacity (a 2× longer context, a larger batch) compiles once more;
- the BlockMask is built here, eagerly, from the same `mask_mod` over slabs of 128-query block rows: no
  compilation, memory bounded by MASK_CHUNK_ELEMENTS (torch's `create_block_mask` evaluates the whole [B, Q, KV]
  mask at once).

If the compiler still fails, the caller gets None after one warning and runs the chunked eager path (same math).
"""
from __future__ import annotations

import warnings

import torch
from torch.fx.experimental import _config as shape_config

from .attention_layout_angpt import AttentionLayout
from .logit_transforms_angpt import LOGIT_TRANSFORMS, head_tensor
from .sparsity_angpt import support

BLOCK = 128  # FlexAttention's default sparse block size (queries and keys)
MIN_POSITIONS, MIN_ROWS = 1024, 8  # smallest capacities of the captured tensors
# Each variant's score/mask functions, dtype and grad mode compile once: more than dynamo's default 8 in a process
# that runs several variants. Past this limit dynamo would run flex_attention unfused (T×T scores, seen on an H200
# at 16k); it raises instead here, and the chunked path takes over with a warning.
RECOMPILE_LIMIT = 64
# Block-mask building: at most this many (row, query, key) elements per step, by device type. On an H200 at 16k
# tokens the step count, not the arithmetic, sets the time: 2^22 took 23 ms (half a 44 ms flex forward), 2^24 5 ms
# for 64-192 MiB held (docs/results/benchmarks.md, long context on a GPU). A CPU computes rather than launches: 2^22 there.
MASK_CHUNK_ELEMENTS = {"cuda": 1 << 24}
MASK_CHUNK_ELEMENTS_DEFAULT = 1 << 22

_compiled = None
_failed = False  # a compiler error was seen: this process uses the chunked path from then on


def capacity(n: int, minimum: int) -> int:
    """Smallest power of two ≥ max(n, minimum)."""
    return max(minimum, 1 << max(n - 1, 0).bit_length())


def _padded(tensor: torch.Tensor | None, shape: tuple[int, ...], fill) -> torch.Tensor | None:
    if tensor is None:
        return None
    out = tensor.new_full(shape, fill)
    out[tuple(slice(0, n) for n in tensor.shape)] = tensor
    return out


def _static(tensor):
    if tensor is not None and not torch.compiler.is_compiling():
        torch._dynamo.mark_static(tensor)  # its sizes become constants of the compiled kernel (see module doc)
    return tensor


def mods(config, layout: AttentionLayout, device, batch: int, q_len: int, kv_len: int):
    """(mask_mod, score_mod or None) over the layout's tensors, padded to their capacities."""
    rows, cols = capacity(batch, MIN_ROWS), capacity(max(q_len, kv_len), MIN_POSITIONS)
    query_pos = _static(_padded(layout.query_positions, (rows, cols), 0))
    key_pos = _static(_padded(layout.key_positions, (rows, cols), 0))
    valid = _static(_padded(layout.key_valid, (rows, cols), False))
    key_seq = _static(_padded(layout.key_sequence, (rows, cols), -1))
    lengths = None if layout.causal else _static(_padded(layout.lengths(), (rows, cols), 0))
    dense = None if layout.dense_mask is None else _static(_padded(layout.dense_mask[:, 0], (rows, cols, cols), False))
    offset = torch.as_tensor(layout.query_offset, device=device)
    causal = layout.causal
    # `config` reaches the mods as a default argument: dynamo specialises the ints and floats read from it
    # (constants per model). Read through a closure they would become symbols, and torch 2.13's CPU template
    # renames such a symbol into an undeclared variable too (attention_global_tokens: CppCompileError).

    def mask_mod(b, h, q_idx, kv_idx, config=config):
        allowed = support(q_idx + offset, kv_idx, query_pos[b, q_idx], key_pos[b, kv_idx],
                          None if valid is None else valid[b, kv_idx],
                          None if key_seq is None else key_seq[b, q_idx + offset],
                          None if key_seq is None else key_seq[b, kv_idx],
                          None if lengths is None else lengths[b, q_idx], config, causal)
        return allowed if dense is None else allowed & dense[b, q_idx, kv_idx]

    transform = LOGIT_TRANSFORMS[config.attention_logit_transform]
    if transform.score is None:
        return mask_mod, None
    head, function = _static(head_tensor(transform, config, device)), transform.score

    def score_mod(score, b, h, q_idx, kv_idx, config=config):
        return function(score.float(), query_pos[b, q_idx], key_pos[b, kv_idx], None if head is None else head[h],
                        config).to(score.dtype)

    return mask_mod, score_mod


def mask_chunk_elements(device) -> int:
    """At most this many (row, query, key) elements per step of `block_mask` on `device`."""
    return MASK_CHUNK_ELEMENTS.get(torch.device(device).type, MASK_CHUNK_ELEMENTS_DEFAULT)


def block_mask(mask_mod, batch: int, q_len: int, kv_len: int, device):
    """The BlockMask of `mask_mod` (batch × 1 head), evaluated a slab of 128-query block rows and batch rows at a
    time, at most MASK_CHUNK_ELEMENTS[device type] (row, query, key) elements each: few, large steps (one step per
    128 queries made the 16k mask 128 launches of a few dozen small kernels), in bounded memory. Blocks that are
    entirely visible are 'full' (the kernel skips mask_mod there), blocks with some visible keys 'partial';
    positions past the lengths count as hidden."""
    from torch.nn.attention.flex_attention import BlockMask

    q_blocks, kv_blocks = -(-q_len // BLOCK), -(-kv_len // BLOCK)
    kv_idx = torch.arange(kv_blocks * BLOCK, device=device)
    chunk = mask_chunk_elements(device)
    row_elements = BLOCK * kv_blocks * BLOCK  # one batch row, one block row of queries
    group = min(batch, max(1, chunk // row_elements))
    rows = min(q_blocks, max(1, chunk // (row_elements * group)))
    head = torch.zeros((), dtype=torch.long, device=device)
    some, every = [], []
    for start in range(0, q_blocks * BLOCK, rows * BLOCK):
        q_idx = torch.arange(start, start + rows * BLOCK, device=device)
        inside = (q_idx[:, None] < q_len) & (kv_idx[None, :] < kv_len)
        slab_some, slab_every = [], []
        for first in range(0, batch, group):
            b = torch.arange(first, min(first + group, batch), device=device)
            allowed = mask_mod(b[:, None, None], head, q_idx.clamp(max=q_len - 1)[None, :, None],
                               kv_idx.clamp(max=kv_len - 1)[None, None, :]) & inside
            tiles = allowed.reshape(allowed.shape[0], rows, BLOCK, kv_blocks, BLOCK)  # batch dim 1: no b in it
            slab_some.append(tiles.any(4).any(2).expand(len(b), -1, -1))
            slab_every.append(tiles.all(4).all(2).expand(len(b), -1, -1))
        some.append(torch.cat(slab_some))
        every.append(torch.cat(slab_every))
    full = torch.cat(every, 1)[:, None, :q_blocks]  # [B, 1, q_blocks, kv_blocks]
    partial = torch.cat(some, 1)[:, None, :q_blocks] & ~full
    return BlockMask.from_kv_blocks(*_ordered(partial), *_ordered(full), BLOCK_SIZE=BLOCK, mask_mod=mask_mod,
                                    seq_lengths=(q_len, kv_len))


def _ordered(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A [.., kv_blocks] bool block row as (number of blocks, their indices first): BlockMask's layout."""
    dense = dense.to(torch.int32)
    order = torch.argsort(dense, dim=-1, descending=True, stable=True)
    return dense.sum(-1, dtype=torch.int32).contiguous(), order.to(torch.int32).contiguous()


_LIMIT_ERRORS = tuple(getattr(torch._dynamo.exc, name) for name in ("FailOnRecompileLimitHit",)
                      if hasattr(torch._dynamo.exc, name))


def _recompile_limit() -> dict:
    """dynamo settings for RECOMPILE_LIMIT, under the names this torch has (recompile_limit was cache_size_limit)."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    options = {name: max(RECOMPILE_LIMIT, getattr(config, name))}
    if hasattr(config, "fail_on_recompile_limit_hit"):
        options["fail_on_recompile_limit_hit"] = True
    return options


def attend(query, key, value, score_mod, mask, scale: float, enable_gqa: bool, compile: bool):
    """flex_attention, compiled once with dynamic shapes (`compile`); None after a compiler failure (warned once):
    the caller then runs the chunked eager path."""
    global _compiled, _failed
    from torch.nn.attention.flex_attention import flex_attention

    if not compile or torch.compiler.is_compiling():  # inside an outer torch.compile, that one compiles the kernel
        return flex_attention(query, key, value, score_mod=score_mod, block_mask=mask, scale=scale,
                              enable_gqa=enable_gqa)
    if _failed:
        return None
    if _compiled is None:
        _compiled = torch.compile(flex_attention, dynamic=True)
    try:
        # Sizes 1 (batch 1, one block, decoding) and equal sizes would otherwise become guards (a recompile each);
        # Python floats (the scale, config values such as scale_invariant_tau) stay constants: dynamic=True would
        # make them 0-d tensors read with .item() inside score_mod, which inductor cannot lower there.
        with shape_config.patch(backed_size_oblivious=True, use_duck_shape=False), \
                torch._dynamo.config.patch(specialize_float=True, **_recompile_limit()):
            return _compiled(query, key, value, score_mod=score_mod, block_mask=mask, scale=scale,
                             enable_gqa=enable_gqa)
    except (torch._dynamo.exc.BackendCompilerFailed, *_LIMIT_ERRORS) as error:
        _failed = True
        warnings.warn(f"compiling flex_attention failed ({type(error).__name__}: {str(error).splitlines()[0]}); "
                      "this process runs attention through the chunked eager path (angpt_chunked, the same math) "
                      "from now on", RuntimeWarning, stacklevel=3)
        return None
