"""AnGPTConfig: one config for GPT+, nGPT and anGPT (docs/architectures.md) and the attention axes
(docs/attention.md).

Field names follow transformers' Llama/Qwen3 configs so users and tools (lm-eval, Accelerate, vLLM's transformers
backend) find what they expect. Every choice the papers or their code leave open is a field here. Names of
architectures, rope types, logit transforms, sparsity patterns and attention backends are validated against their
registries (architectures_angpt, rotary_angpt, logit_transforms_angpt, sparsity_angpt, attention_angpt): there is
no second list of them.
"""
from __future__ import annotations

from transformers import PreTrainedConfig

from .architectures_angpt import ARCHITECTURES, get_architecture
from .attention_angpt import attention_backends_supporting, backend_computes, check_attention_backend  # noqa: F401
from .logit_transforms_angpt import LOGIT_TRANSFORMS
from .rotary_angpt import ROPE_TYPES
from .sparsity_angpt import SPARSITIES

ALPHA_SHAPES = ("vector", "scalar")
GATE_SQRT_D_PLACEMENTS = ("gate", "both")


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
        architecture: `"angpt"`, `"ngpt"` or `"gptplus"` (docs/architectures.md), or one registered with
            `register_architecture`.
        intermediate_size: MLP width; `None` means 4·hidden_size, the width the ν constants assume.
        num_key_value_heads: key/value heads for grouped-query attention (`None`: one per query head); query head
            h reads key/value head h // (num_attention_heads / num_key_value_heads), as in transformers' `repeat_kv`.
        head_dim: channels per head; `None` means hidden_size / num_attention_heads. Any value works: the ν
            constants are derived from it (architectures_angpt.AnGPT.constants).
        qk_norm: GPT+ only; per-head RMSNorm with gain on q and k (off = Llama).
        alpha_shape: `"vector"` (one α per hidden dimension) or `"scalar"` (one per sublayer) [flag].
        alpha_init: initial LERP weight α for nGPT/anGPT [flag]. `None` picks the architecture's: the papers' 0.05
            (the anGPT paper also mentions 0.01), except for an anGPT so deep that 0.05 × layers exceeds
            architectures_angpt.ALPHA_DEPTH_LIMIT (α·L = 0.10), which starts at 0.10 / layers.
            Training warns when a fresh anGPT has alpha_init × layers above that limit (docs/architectures.md,
            "Deep models start with a smaller α"). A value given, or stored in a checkpoint, is used as it is.
        alpha_abs: use |α| as the NVIDIA nGPT code does, instead of α with its sign [flag].
        alpha_nu: anGPT only; multiply each LERP residual by ν(α) (docs/architectures.md). False is the paper's
            ablation.
        gate_sqrt_d: where nGPT/anGPT put the √d factor of the MLP: `"gate"` (paper) or `"both"` (NVIDIA code) [flag].
        nu_att: constant factor on the attention output o (1 = none; docs/architectures.md) [flag].
        logit_scale_speed: nGPT/anGPT; s_z is stored reparameterised as ŝ with s_z = speed·ŝ, so Adam moves s_z by
            about lr·speed a step. `None` picks the architecture's: √d for nGPT (its paper) and 256 for anGPT. Why
            anGPT needs a fast s_z: with no final norm its logit temperature is s_z·‖h‖, and when s_z cannot grow
            fast enough the last block lengthens h instead, so the stream stops being normalised and the loss
            spikes (docs/architectures.md, "Three departures"; experiments/width_depth_stability) [flag].
        rope_parameters: transformers 5 RoPE dict: `rope_type`, `rope_theta`, `partial_rotary_factor` (default 0.5).
            Any type in rotary_angpt.ROPE_TYPES: `none` is NoPE; `proportional` is Barbero et al.'s p-RoPE (keep
            the highest-frequency fraction p of the pairs); `scale_invariant_p` is the scale-invariant paper's
            p-RoPE (p·d_h/2 rotating pairs spaced 1 … 1/`effective_base`, default 1024); `dynamic` (NTK, `factor`
            1), `yarn`, `linear`.
        attention_logit_transform / scale_invariant_tau / logn_init: docs/attention.md (`logn_init` None means
            1/log(max_position_embeddings): plain attention at the end of the training window).
        attention_sparsity / attention_topk / attention_window / attention_block_size /
        attention_global_tokens: docs/attention.md, "Sparsity". The first `attention_global_tokens` positions
            see and are seen by every token (attention sinks); only with `window` or `block`.
        attention_query_chunk_size: queries per chunk of the chunked eager path (long context on CPU). Not
            `attention_chunk_size`: transformers reads that name as Llama-4 chunked attention (its caches and masks
            would silently drop keys).
        is_causal: False for bidirectional (encoder-style) sequence classification.
        classifier_pooling: `"mean"` over non-padding tokens (semantic-focus tasks) or `"last"` token.
        folded: True for an exported inference checkpoint (docs/inference-fold.md); such a model refuses training.
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
    alpha_init: float | None = None
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

    # transformers' pipeline plan: each stage's module, the inputs it takes and the outputs it hands on (the same for
    # every architecture; nGPT's and anGPT's `norm` is an identity).
    base_model_pp_plan = {"embed_tokens": (["input_ids"], ["inputs_embeds"]),
                          "layers": (["hidden_states", "attention_mask"], ["hidden_states"]),
                          "norm": (["hidden_states"], ["hidden_states"])}

    @property
    def base_model_tp_plan(self) -> dict[str, str]:
        """The tensor-parallel plan of this architecture and form (architectures_angpt.Architecture.tp_plan): which
        scale splits with which projection differs between them (docs/architectures.md, "Tensor and pipeline
        parallelism")."""
        plan = get_architecture(self).tp_plan(self)
        if LOGIT_TRANSFORMS[self.attention_logit_transform].query_scale is not None:
            # a query-scaling transform's per-head s_h (LogN) multiplies q's heads: split with q_proj, the attention
            # module run on this rank's part of its own parameters
            plan.update({"layers.*.self_attn.query_head_scale": "colwise", "layers.*.self_attn": "local_params"})
        return plan

    def __post_init__(self, **kwargs):
        _check_choice("architecture", self.architecture, ARCHITECTURES)
        if self.rope_parameters is not None and not isinstance(self.rope_parameters, dict):
            raise ValueError(f"AnGPTConfig.rope_parameters={self.rope_parameters!r} is not valid; expected a dict")
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size
        if self.logit_scale_speed is None:
            self.logit_scale_speed = ARCHITECTURES[self.architecture].default_logit_scale_speed(self)
        rope = dict(self.rope_parameters or {})
        rope.setdefault("rope_type", "default")
        rope.setdefault("rope_theta", 10000.0)
        rope.setdefault("partial_rotary_factor", 0.5)
        for key, value in getattr(ROPE_TYPES.get(rope["rope_type"]), "defaults", {}).items():
            rope.setdefault(key, value)
        self.rope_parameters = rope
        super().__post_init__(**kwargs)
        self._validate()
        if self._attn_implementation is None and "sdpa" not in attention_backends_supporting(
                self.attention_logit_transform, self.attention_sparsity):
            # transformers would default to sdpa, which cannot compute this variant; the chunked eager path
            # computes the same math as the eager reference (an explicit choice still raises, see above).
            self._attn_implementation = "angpt_chunked"

    # The attention backend is checked where it is chosen, once (docs/attention.md, "Backends"): transformers sets
    # `_attn_implementation` through this property at init, from from_pretrained's `attn_implementation=`, and a
    # serving runtime (vLLM's Transformers backend) assigns its own registered name here too, so a backend that cannot
    # compute this variant is refused in one line before any forward. The model checks what transformers resolves at
    # `__init__` and in `set_attn_implementation` (pretrained_angpt.py). No check runs per forward.
    @property
    def _attn_implementation(self):
        return self._attn_implementation_internal

    @_attn_implementation.setter
    def _attn_implementation(self, value: str | dict | None):
        name = value.get("", getattr(self, "_attn_implementation_internal", None)) if isinstance(value, dict) else value
        variant_known = (getattr(self, "attention_logit_transform", None) in LOGIT_TRANSFORMS
                         and getattr(self, "attention_sparsity", None) in SPARSITIES)
        if name is not None and variant_known:  # an unknown variant name: _validate's error says which registry
            check_attention_backend(self, name)
        PreTrainedConfig._attn_implementation.fset(self, value)

    def _validate(self) -> None:
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
        if self.alpha_init is None:
            self.alpha_init = ARCHITECTURES[self.architecture].default_alpha_init(self)
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
        ARCHITECTURES[self.architecture].validate(self)

    def _validate_rope(self) -> None:
        rope = self.rope_parameters
        _check_registered("rope_parameters['rope_type']", rope.get("rope_type"), ROPE_TYPES, "register_rope_type")
        factor = rope.get("partial_rotary_factor")
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0.0 <= factor <= 1.0:
            raise ValueError(f"AnGPTConfig.rope_parameters['partial_rotary_factor']={factor!r} is not valid; "
                             "expected a number in [0, 1]")
        _check_positive("rope_parameters['rope_theta']", rope.get("rope_theta"))
        rope_type = ROPE_TYPES[rope["rope_type"]]
        for key in rope_type.positive:
            _check_positive(f"rope_parameters[{key!r}]", rope.get(key))
        validator = f"_validate_{rope_type.name}_rope_parameters"
        if not hasattr(type(self), validator):
            setattr(type(self), validator, _transformers_rope_validator(rope_type))


def _transformers_rope_validator(rope_type):
    """transformers' validate_rope (run again by save_pretrained) looks up `_validate_<rope_type>_rope_parameters`
    and logs "Missing validation function" for each type it does not ship. This names a registered type's keys the
    way its own validators do (a missing key raises, an unknown one warns); the values are checked by
    AnGPTConfig._validate_rope."""
    def validate(self, rope_parameters: dict, ignore_keys=None) -> None:
        self._check_received_keys(rope_type.name, set(rope_parameters), {"rope_type", *rope_type.defaults},
                                  optional_keys={"rope_theta", "partial_rotary_factor"}, ignore_keys=ignore_keys)
    return validate


__all__ = ["AnGPTConfig"]
