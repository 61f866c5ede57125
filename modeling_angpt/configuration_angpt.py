"""AnGPTConfig: one config for GPT+, nGPT and anGPT (SPEC.md §1) and the attention axes (SPEC.md §3).

Field names follow transformers' Llama/Qwen3 configs so users and tools (lm-eval, Accelerate, vLLM's
transformers backend) find what they expect. Every choice SPEC.md marks **[flag]** is a field here.
"""
from __future__ import annotations

from transformers import PreTrainedConfig

from .logit_transforms_angpt import LOGIT_TRANSFORMS
from .masks_angpt import SPARSITIES

ARCHITECTURES = ("angpt", "ngpt", "gptplus")
ALPHA_SHAPES = ("vector", "scalar")
GATE_SQRT_D_PLACEMENTS = ("gate", "both")
# anGPT's s_z speed (logit_scale_speed): the logit temperature the data asks for (a few nats) does not depend on the
# width, so neither does the speed; 256 was measured against √d and d at d = 256, 512 and 1024 (bench/RESULTS.md).
ANGPT_LOGIT_SCALE_SPEED = 256.0
# Attention axes (SPEC.md §3): the logit transforms and sparsity patterns are registries of behaviour
# (logit_transforms_angpt.py, masks_angpt.py); users add their own with register_logit_transform/register_sparsity.
ROPE_TYPES = ("default", "proportional", "scale_invariant_p", "dynamic", "yarn", "linear", "none")
BACKENDS = ("eager", "angpt_chunked", "sdpa", "flex_attention", "flash_attention_2")


def backend_computes(implementation: str, transform: str, sparsity: str) -> bool:
    """Whether a backend computes a (logit transform, sparsity) exactly (SPEC §3), from what each registered variant
    is: positions are applied to q and k outside every kernel and a query scaling (LogN) runs anywhere; the explicit
    math (eager, chunked eager) runs everything; FlexAttention runs any elementwise `score` and any `pattern`; SDPA
    an additive `score` (as a bias) and any `pattern`; flash-attn only ALiBi natively and no sparsity; any other
    transformers backend (vLLM, paged, ...) neither a score nor a sparsity."""
    scored = LOGIT_TRANSFORMS[transform].score is not None
    rule = SPARSITIES[sparsity]
    if implementation in ("eager", "angpt_chunked"):
        return True
    if implementation == "flex_attention":
        return rule.select is None
    if implementation == "sdpa":
        return (not scored or LOGIT_TRANSFORMS[transform].additive) and rule.select is None
    if implementation == "flash_attention_2":
        return (not scored or LOGIT_TRANSFORMS[transform].flash_alibi) and rule.pattern is None and rule.select is None
    return not scored and rule.pattern is None and rule.select is None


def attention_backends_supporting(transform: str, sparsity: str) -> list[str]:
    return [name for name in BACKENDS if backend_computes(name, transform, sparsity)]


def check_attention_backend(config, implementation: str | None) -> None:
    """Raise a ValueError naming the variant and the backends that compute it, never fall back silently."""
    implementation = implementation or "eager"
    transform, sparsity = config.attention_logit_transform, config.attention_sparsity
    if not backend_computes(implementation, transform, sparsity):
        raise ValueError(
            f"attention_logit_transform={transform!r} with attention_sparsity={sparsity!r} cannot run on "
            f"attn_implementation={implementation!r}; backends that compute it: "
            f"{attention_backends_supporting(transform, sparsity)} (set it with "
            f"model.set_attn_implementation(...) or from_pretrained(..., attn_implementation=...))")


def _check_registered(field: str, value, registry: dict, register: str) -> None:
    if value not in registry:
        raise ValueError(
            f"AnGPTConfig.{field}={value!r} is not a registered variant; registered: {list(registry)}. A custom "
            f"variant does not travel with a checkpoint: call modeling_angpt.{register}({value!r}, ...) in this "
            "process before creating or loading the config (a trust_remote_code checkpoint needs it registered in "
            "the downloaded module, so prefer installing the angpt package).")


POOLINGS = ("mean", "last")


def _check_choice(field: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"AnGPTConfig.{field}={value!r} is not valid; expected one of {list(allowed)}")


def _check_positive(field: str, value, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"AnGPTConfig.{field}={value!r} is not valid; expected a positive number")


class AnGPTConfig(PreTrainedConfig):
    r"""Configuration of an approximately normalized transformer and its baselines.

    Args (beyond the usual transformers ones):
        architecture: `"angpt"` (SPEC §1.3), `"ngpt"` (§1.2) or `"gptplus"` (§1.1).
        intermediate_size: MLP width; `None` means 4·hidden_size, the width the ν constants assume.
        num_key_value_heads: key/value heads for grouped-query attention (`None`: one per query head); query head
            h reads key/value head h // (num_attention_heads / num_key_value_heads), as in transformers' `repeat_kv`.
        head_dim: channels per head; `None` means hidden_size / num_attention_heads. Any value works: the ν
            constants are derived from it (architectures_angpt.AnGPT.constants).
        qk_norm: GPT+ only; per-head RMSNorm with gain on q and k (off = Llama).
        alpha_shape: `"vector"` (one α per hidden dimension) or `"scalar"` (one per sublayer) [flag].
        alpha_init: initial LERP weight α for nGPT/anGPT (0.05; the anGPT paper also mentions 0.01) [flag]. Deep
            anGPT models need less: the presets from 12 layers use 0.12 / layers, and training warns above
            alpha_init × layers = 0.4 (docs/architectures.md, "Three departures").
        alpha_abs: use |α| as the NVIDIA nGPT code does, instead of α with its sign [flag].
        alpha_nu: anGPT only; multiply each LERP residual by ν(α) (SPEC §1.3). False is the paper's ablation.
        gate_sqrt_d: where nGPT/anGPT put the √d factor of the MLP: `"gate"` (paper) or `"both"` (NVIDIA code) [flag].
        nu_att: constant factor on the attention output o (1 = none, SPEC §1.3) [flag].
        logit_scale_speed: nGPT/anGPT; s_z is stored reparameterised as ŝ with s_z = speed·ŝ, so Adam moves s_z by
            about lr·speed a step. `None` picks the architecture's: √d for nGPT (its paper, SPEC §1.2) and 256 for
            anGPT. Why anGPT needs a fast s_z: with no final norm its logit temperature is s_z·‖h‖, and when s_z
            cannot grow fast enough the last block lengthens h instead, so the stream stops being normalised and
            the loss spikes (docs/architectures.md, "Three departures"; bench/RESULTS.md, width stability) [flag].
        rope_parameters: transformers 5 RoPE dict: `rope_type`, `rope_theta`, `partial_rotary_factor` (default 0.5).
            rope_type `none` is NoPE; `proportional` is Barbero et al.'s p-RoPE (keep the highest-frequency
            fraction p of the pairs); `scale_invariant_p` is the scale-invariant paper's p-RoPE (p·d_h/2 rotating
            pairs spaced 1 … 1/`effective_base`, default 1024); `dynamic` (NTK, `factor` 1), `yarn`, `linear`.
        attention_logit_transform / scale_invariant_tau / logn_init: SPEC §3.2 (`logn_init` None means
            1/log(max_position_embeddings): plain attention at the end of the training window).
        attention_sparsity / attention_topk / attention_window / attention_block_size /
        attention_global_tokens: SPEC §3.3. The first `attention_global_tokens` positions see and are seen by
            every token (attention sinks); only with `window` or `block`.
        attention_query_chunk_size: queries per chunk of the chunked eager path (long context on CPU). Not
            `attention_chunk_size`: transformers reads that name as Llama-4 chunked attention (its caches and masks
            would silently drop keys).
        is_causal: False for bidirectional (encoder-style) sequence classification.
        classifier_pooling: `"mean"` over non-padding tokens (semantic-focus tasks) or `"last"` token.
        folded: True for an exported inference checkpoint (SPEC §2); such a model refuses training.
    """

    model_type = "angpt"
    keys_to_ignore_at_inference = ["past_key_values"]

    vocab_size: int = 32000
    hidden_size: int = 256
    intermediate_size: int | None = None
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int = 1024
    architecture: str = "angpt"
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-6
    qk_norm: bool = True
    alpha_shape: str = "vector"
    alpha_init: float = 0.05
    alpha_abs: bool = False
    alpha_nu: bool = True
    gate_sqrt_d: str = "gate"
    nu_att: float = 1.0
    logit_scale_speed: float | None = None
    rope_parameters: dict | None = None
    attention_logit_transform: str = "none"
    scale_invariant_tau: float = 10.0
    logn_init: float | None = None
    attention_sparsity: str = "none"
    attention_topk: int = 5
    attention_window: int = 256
    attention_block_size: int = 64
    attention_global_tokens: int = 0
    attention_query_chunk_size: int = 1024
    attention_dropout: float = 0.0
    is_causal: bool = True
    classifier_pooling: str = "mean"
    classifier_dropout: float = 0.0
    folded: bool = False
    use_cache: bool = True
    tie_word_embeddings: bool = False
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    def __post_init__(self, **kwargs):
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size
        if self.logit_scale_speed is None:
            self.logit_scale_speed = ANGPT_LOGIT_SCALE_SPEED if self.architecture == "angpt" else self.hidden_size**0.5
        if self.rope_parameters is None:
            self.rope_parameters = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
        else:
            self.rope_parameters = dict(self.rope_parameters)
            self.rope_parameters.setdefault("rope_type", "default")
            self.rope_parameters.setdefault("rope_theta", 10000.0)
            self.rope_parameters.setdefault("partial_rotary_factor", 0.5)
        if self.rope_parameters["rope_type"] in ("dynamic", "linear"):
            self.rope_parameters.setdefault("factor", 1.0)  # dynamic NTK with factor 1 is the paper's θ (L/L_train)^(d/(d-2))
        if self.rope_parameters["rope_type"] == "scale_invariant_p":
            self.rope_parameters.setdefault("effective_base", 1024.0)  # ω from 1 down to 1/1024 (SPEC §3.1)
        super().__post_init__(**kwargs)
        self._validate()
        if self._attn_implementation is None and "sdpa" not in attention_backends_supporting(
                self.attention_logit_transform, self.attention_sparsity):
            # transformers would default to sdpa, which cannot compute this variant; the chunked eager path
            # computes the same math as the eager reference (an explicit choice still raises, see above).
            self._attn_implementation = "angpt_chunked"

    def _validate(self) -> None:
        _check_choice("architecture", self.architecture, ARCHITECTURES)
        for field in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                      "intermediate_size", "max_position_embeddings", "attention_query_chunk_size"):
            _check_positive(field, getattr(self, field))
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(
                    f"AnGPTConfig.hidden_size={self.hidden_size} must be divisible by "
                    f"num_attention_heads={self.num_attention_heads} (or set head_dim)")
            self.head_dim = self.hidden_size // self.num_attention_heads
        _check_positive("head_dim", self.head_dim)
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        _check_positive("num_key_value_heads", self.num_key_value_heads)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"AnGPTConfig.num_key_value_heads={self.num_key_value_heads} must divide "
                             f"num_attention_heads={self.num_attention_heads} (each key/value head serves a group)")
        if self.head_dim % 2:
            raise ValueError(f"AnGPTConfig.head_dim={self.head_dim} must be even (RoPE rotates channel pairs)")
        _check_choice("alpha_shape", self.alpha_shape, ALPHA_SHAPES)
        _check_choice("gate_sqrt_d", self.gate_sqrt_d, GATE_SQRT_D_PLACEMENTS)
        _check_positive("nu_att", self.nu_att)
        _check_positive("logit_scale_speed", self.logit_scale_speed)
        _check_choice("classifier_pooling", self.classifier_pooling, POOLINGS)
        self._validate_rope()
        _check_registered("attention_logit_transform", self.attention_logit_transform, LOGIT_TRANSFORMS,
                          "register_logit_transform")
        _check_positive("scale_invariant_tau", self.scale_invariant_tau)
        _check_positive("logn_init", self.logn_init, allow_none=True)
        _check_registered("attention_sparsity", self.attention_sparsity, SPARSITIES, "register_sparsity")
        for field in ("attention_topk", "attention_window", "attention_block_size"):
            _check_positive(field, getattr(self, field))
        if not isinstance(self.attention_global_tokens, int) or self.attention_global_tokens < 0:
            raise ValueError(f"AnGPTConfig.attention_global_tokens={self.attention_global_tokens!r} is not valid; "
                             "expected an integer >= 0")
        if self.attention_global_tokens and SPARSITIES[self.attention_sparsity].pattern is None:
            raise ValueError(f"AnGPTConfig.attention_global_tokens={self.attention_global_tokens} is not valid with "
                             f"attention_sparsity={self.attention_sparsity!r}; global tokens extend a pattern "
                             "('window', 'block' or a registered pattern)")
        if self.architecture != "gptplus" and self.hidden_size * 4 != self.intermediate_size:
            # ν_uz = √(d/4d) and ν_d = √(4d/d) (SPEC §1.3) assume the 4d width; nGPT shares the shapes.
            raise ValueError(f"AnGPTConfig.intermediate_size={self.intermediate_size} is not valid for "
                             f"architecture={self.architecture!r}; expected 4*hidden_size={4 * self.hidden_size}")

    def _validate_rope(self) -> None:
        rope = self.rope_parameters
        if not isinstance(rope, dict):
            raise ValueError(f"AnGPTConfig.rope_parameters={rope!r} is not valid; expected a dict")
        _check_choice("rope_parameters['rope_type']", rope.get("rope_type"), ROPE_TYPES)
        factor = rope.get("partial_rotary_factor")
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0.0 <= factor <= 1.0:
            raise ValueError(f"AnGPTConfig.rope_parameters['partial_rotary_factor']={factor!r} is not valid; "
                             "expected a number in [0, 1]")
        _check_positive("rope_parameters['rope_theta']", rope.get("rope_theta"))
        if rope["rope_type"] in ("dynamic", "yarn", "linear"):
            _check_positive("rope_parameters['factor']", rope.get("factor"))
        if rope["rope_type"] == "scale_invariant_p":
            _check_positive("rope_parameters['effective_base']", rope.get("effective_base"))

    # transformers' validate_rope (run again by save_pretrained) looks up `_validate_<rope_type>_rope_parameters` and
    # logs "Missing validation function" for each type it does not ship; these name our types' keys the way its own
    # validators do (a missing key raises, an unknown one warns). The values are checked by _validate_rope.
    def _validate_scale_invariant_p_rope_parameters(self, rope_parameters: dict, ignore_keys=None) -> None:
        self._check_received_keys("scale_invariant_p", set(rope_parameters), {"rope_type", "effective_base"},
                                  optional_keys={"rope_theta", "partial_rotary_factor"}, ignore_keys=ignore_keys)

    def _validate_none_rope_parameters(self, rope_parameters: dict, ignore_keys=None) -> None:
        self._check_received_keys("none", set(rope_parameters), {"rope_type"},
                                  optional_keys={"rope_theta", "partial_rotary_factor"}, ignore_keys=ignore_keys)


__all__ = ["AnGPTConfig"]
