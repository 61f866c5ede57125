"""The rotary pairs of a length model's attention, and wraps of its attention call that record, drop or scale them
(length_rotary_pairs.py).

The raw logit S = s·q·k (s the softmax scale, q and k after the rotation) is a sum over the head's channel pairs:
pair c (channels c and c + r/2, turning at ω_c radians per token) adds s·(q_c·k_c + q_{c+r/2}·k_{c+r/2}), and the
channels that do not turn add the rest. The decoder's attention call is the one place where q and k are seen after
the rotation and LogN's query scale, so every measurement and change here is a wrap of that call.
"""
from __future__ import annotations

import contextlib

import numpy as np

STATIC = "ω = 0"  # the label of the channels that do not turn


def components(config) -> tuple[list[str], np.ndarray]:
    """(labels, membership [d_h, parts]) for a model's config: one part per rotating pair (channels c and c + r/2 with
    ω_c > 0), labelled by its frequency ("1/141": 1/141 radians per token), then one part for every channel that does
    not turn. The frequencies are the library's own (`compute_inv_freq`, what the model's rotary table holds)."""
    from modeling_angpt.rotary_angpt import compute_inv_freq

    inv_freq = compute_inv_freq(config)[0].double().numpy()
    half, head_dim = len(inv_freq), config.head_dim
    rotating = [c for c in range(half) if inv_freq[c] > 0]
    membership = np.zeros((head_dim, len(rotating) + 1))
    for part, c in enumerate(rotating):
        membership[[c, c + half], part] = 1.0
    membership[:, -1] = 1.0 - membership[:, :-1].sum(1)
    labels = [("1" if inv_freq[c] == 1 else f"1/{1 / inv_freq[c]:.0f}") for c in rotating] + [STATIC]
    return labels, membership


def static_pairs(membership: np.ndarray) -> list[tuple[str, list[int]]]:
    """(label, channels) of the channels that do not turn, two at a time (the i-th with the i-th of their second
    half: the partners the rotation would give them). Dropped like a turning pair, one carries no position: the
    control for what dropping any pair does."""
    channels = [int(c) for c in np.flatnonzero(membership[:, -1])]
    half = len(channels) // 2
    return [(f"{STATIC}: channels {channels[i]}, {channels[i + half]}", [channels[i], channels[i + half]])
            for i in range(half)]


def spread_units(labels: list[str], membership: np.ndarray) -> tuple[list[str], list[list[int]]]:
    """(labels, channels) of the parts whose spread is measured, from `components`: each turning pair, each pair of
    channels that do not turn (what --drop all drops), all the channels that do not turn, and all channels (S)."""
    turning = [[int(c) for c in np.flatnonzero(membership[:, part])] for part in range(membership.shape[1] - 1)]
    static = static_pairs(membership)
    return ([*labels[:-1], *(label for label, _ in static), STATIC, "S"],
            [*turning, *(channels for _, channels in static), [int(c) for c in np.flatnonzero(membership[:, -1])],
             list(range(membership.shape[0]))])


class PairRecorder:
    """Per layer, head, part and distance octave (0: t = 0; k ≥ 1: t ∈ [2^(k−1), 2^k)): the summed part of the raw
    logits over the visible keys of the recorded queries, and the number of those keys; and, for each of `units`
    (lists of channels), its part's variance over the keys of the octave and its covariance there with S, each
    query's own, summed over every `stride`-th query. The keys of an octave are a contiguous range of positions, so
    their sums come from prefix sums of k and of k⊗k: no [queries, keys] matrix is formed."""

    def __init__(self, layers: int, heads: int, membership: np.ndarray, octaves: int, rows: slice,
                 units: list[list[int]] = (), stride: int = 1):
        self.total = np.zeros((layers, heads, membership.shape[1], octaves))
        self.count = np.zeros((layers, octaves))
        self.variance, self.covariance = (np.zeros((layers, heads, len(units), octaves)) for _ in range(2))
        self.queries = np.zeros((layers, octaves))  # spread's queries with at least one key in the octave
        self.membership, self.units, self.rows, self.stride, self.layer = membership, units, rows, stride, 0

    def record(self, query, key, scaling: float) -> None:
        """One causal layer's query [b, h, T, d_h] and key [b, h_kv, T, d_h], as the attention call gets them."""
        for window in range(query.shape[0]):
            self._record(query[window], key[window], scaling)
        self.layer += 1

    def _record(self, query, key, scaling: float) -> None:
        import torch

        def prefix_sums(x):  # prefix[:, n] = Σ_{j<n} x_j over the key positions
            return torch.cat([torch.zeros_like(x[:, :1]), x.cumsum(1)], dim=1)

        q = query[:, self.rows].double() * scaling  # [h, r, d]: S = q·k
        k = key.double().repeat_interleave(query.shape[0] // key.shape[0], dim=0)  # [h, T, d]
        prefix = prefix_sums(k)
        outer = prefix_sums(k[..., :, None] * k[..., None, :]) if self.units else None  # [h, T + 1, d, d]
        position = torch.arange(self.rows.start, self.rows.stop, device=q.device)
        membership = torch.as_tensor(self.membership, device=q.device)
        units = torch.zeros(q.shape[-1], len(self.units), dtype=q.dtype, device=q.device)  # [d, units]
        for unit, channels in enumerate(self.units):
            units[channels, unit] = 1.0
        blocks = (units[:, None] * units[None]).flatten(0, 1)  # [d·d, units]: which products c·e a unit's square has
        layer = self.layer % self.total.shape[0]
        for octave in range(self.total.shape[-1]):
            near, far = (0, 0) if octave == 0 else (2 ** (octave - 1), 2 ** octave - 1)  # t ∈ [near, far]
            first, last = (position - far).clamp(min=0), position - near  # keys j ∈ [first, last], none if last < 0
            stop = (last + 1).clamp(min=0)  # ≥ first, as far ≥ near
            keys = prefix[:, stop] - prefix[:, first]  # [h, r, d]: Σ of the octave's keys
            self.total[layer, :, :, octave] += ((q * keys).sum(1) @ membership).cpu().numpy()
            number = (stop - first).double()
            self.count[layer, octave] += float(number.sum())
            if outer is None:
                continue
            # over a query's keys, for every unit at once: E[part²] − E[part]² and E[part·S] − E[part]·E[S], for
            # every stride-th query (the d×d sums are what costs; a few hundred queries per window are enough for
            # averages over queries, layers and heads)
            sub = slice(None, None, self.stride)
            first, stop, number, qs, keys = first[sub], stop[sub], number[sub], q[:, sub], keys[:, sub]
            self.queries[layer, octave] += float((number > 0).sum())
            number = number.clamp(min=1)[:, None]  # a query without keys there has all its sums 0
            squares = outer[:, stop] - outer[:, first]  # [h, r, d, d]: Σ k⊗k over the octave's keys
            mean = (qs * keys) @ units / number  # [h, r, units]
            mean_s = (qs * keys).sum(-1, keepdim=True) / number
            with_s = ((qs[..., None, :] @ squares).squeeze(-2) * qs) @ units / number
            alone = (qs[..., :, None] * squares * qs[..., None, :]).flatten(-2) @ blocks / number
            self.variance[layer, :, :, octave] += (alone - mean.square()).sum(1).cpu().numpy()
            self.covariance[layer, :, :, octave] += (with_s - mean * mean_s).sum(1).cpu().numpy()

    def mean(self) -> np.ndarray:
        """Mean part of S per layer, head, part and octave."""
        with np.errstate(invalid="ignore"):
            return self.total / self.count[:, None, None, :]

    def spread(self) -> dict:
        """Per layer, head, unit and octave, the mean over queries of each unit's part's variance over the keys and
        of its covariance with S ("variance", "covariance")."""
        with np.errstate(invalid="ignore"):
            return {name: sums / self.queries[:, None, None, :]
                    for name, sums in (("variance", self.variance), ("covariance", self.covariance))}


@contextlib.contextmanager
def attention_calls(wrap):
    """Route the decoder's attention calls through `wrap(attend)`: the one place where q and k are seen after the
    rotation and LogN's query scale (the test suite's oracle for length_attention.py taps the same call)."""
    import modeling_angpt.modeling_angpt as decoder
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    original = decoder.get_attention_function

    def wrapped(config):
        attend = original(config) or ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation,
                                                                           decoder.eager_attention_forward)
        return wrap(attend)

    decoder.get_attention_function = wrapped
    try:
        yield
    finally:
        decoder.get_attention_function = original


def recording(recorders: dict):
    """A wrap for attention_calls: hands each call's q and k to the recorder for its window length."""
    def wrap(attend):
        def run(module, query, key, value, attention_mask, scaling, **kwargs):
            recorder = recorders.get(query.shape[-2])
            if recorder is not None:
                recorder.record(query, key, scaling)
            return attend(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
        return run
    return wrap


def dropping(channels: list[int]):
    """A wrap for attention_calls: the query's `channels` set to zero, so their pair adds nothing to S."""
    def wrap(attend):
        def run(module, query, key, value, attention_mask, scaling, **kwargs):
            query = query.clone()
            query[..., channels] = 0
            return attend(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
        return run
    return wrap


def scaling(factor: float):
    """A wrap for attention_calls: the query times `factor`, so every part of S, and its spread, shrinks alike."""
    def wrap(attend):
        def run(module, query, key, value, attention_mask, scaling, **kwargs):
            return attend(module, query * factor, key, value, attention_mask, scaling=scaling, **kwargs)
        return run
    return wrap


def shuffled_past(part, past, generator):
    """`part` [b, h, c, T] with each query's keys in `past` (a prefix of its row, keys in position order) given the
    part of another past key of the same query, a random permutation per query: the same values for that query's
    past keys, so the same mean and spread, but no longer on the keys that earned them."""
    import torch

    if not torch.equal(past, past.int().cummin(-1).values.bool()):
        raise ValueError("shuffled_past: the past keys of a query must come first (positions in order)")
    noise = torch.rand(past.shape, generator=generator).to(part.device)
    order = torch.where(past, noise, 2.0).argsort(-1)  # a query's past keys first, in random order
    return part.gather(-1, order.expand_as(part))


def editing_past(length: int, channels: list[int], factor: float = 0.0, shuffle: bool = False, seed: int = 0):
    """A wrap for attention_calls that changes the raw logit S only on keys at distance t ≥ `length` (keys within L
    keep theirs, and windows of at most L tokens are untouched): the part of S from `channels` times `factor`
    (0: that pair dropped past L; every channel and √share: the scaled query past L), or, with `shuffle`, each
    query's part moved to another of its keys past L (shuffled_past). It edits the scores the eager path hands to
    the logit transform, so the model must run on the eager or chunked path (as the length evaluation does)."""
    import torch
    from transformers.integrations.sdpa_attention import repeat_kv

    import modeling_angpt.attention_angpt as attention
    from modeling_angpt.attention_layout_angpt import every_row

    generator = torch.Generator().manual_seed(seed)

    def wrap(attend):
        def run(module, query, key, value, attention_mask, scaling, **kwargs):
            if query.shape[-2] <= length:  # no key as far as L
                return attend(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
            keys = repeat_kv(key, query.shape[1] // key.shape[1])[..., channels]
            transform, seen = attention._transformed_scores, []

            def edited(config, scores, layout, rows):
                seen.append(rows)
                rows_ = every_row(rows)
                part = query[:, :, rows_][..., channels] @ keys.transpose(-1, -2) * scaling
                past = (layout.query_positions[:, None, rows_, None] - layout.key_positions[:, None, None, :]) >= length
                new = shuffled_past(part, past, generator) if shuffle else part * factor
                return transform(config, scores + (new - part) * past, layout, rows)

            attention._transformed_scores = edited
            try:
                output = attend(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
            finally:
                attention._transformed_scores = transform
            if not seen:  # another backend: S was never edited
                raise RuntimeError("editing_past: the attention call did not take the eager or chunked path")
            return output
        return run
    return wrap
