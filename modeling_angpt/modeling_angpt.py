"""GPT+, nGPT and anGPT as transformers models, read top to bottom: the model, the one decoder block (attention,
MLP, the residual updates), and the heads. What differs between the architectures comes from their strategies
(architectures_angpt.py) as small modules (layers_angpt.py); attention runs on a registered backend
(attention_angpt.py). See docs/architectures.md.

Names follow transformers' Llama/Qwen3 (`embed_tokens`, `q_proj`, ..., `input_layernorm`, `lm_head`), so state
dicts convert key for key. This file and the files it imports with `from .x import` are what `save_pretrained`
copies next to a checkpoint for `trust_remote_code` loading: it imports nothing else of the project.
"""

import torch
from torch import nn
from transformers import GenerationMixin
from transformers.cache_utils import Cache, DynamicCache
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask, create_masks_for_generate
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.modeling_outputs import (BaseModelOutputWithPast, CausalLMOutputWithPast,
                                           SequenceClassifierOutputWithPast)
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import can_return_tuple, merge_with_config_defaults
from transformers.utils.output_capturing import capture_outputs

from .architectures_angpt import get_architecture
from .attention_angpt import eager_attention_forward, get_attention_function, uses_layout
from .attention_layout_angpt import AttentionLayout, positions_from_padding
from .configuration_angpt import AnGPTConfig
from .layers_angpt import gain_of, project
from .logit_transforms_angpt import LOGIT_TRANSFORMS
from .pretrained_angpt import (AnGPTPreTrainedModel, CheckpointMismatchError,  # noqa: F401 (public names)
                               check_logits_need_no_head)
from .paged_angpt import (check_paged_support, is_paged, paged_attention_function, paged_layout,
                          update_paged_cache)
from .rotary_angpt import AnGPTRotaryEmbedding, apply_rotary


# --- the one decoder block ------------------------------------------------------------------------------------------
class AnGPTAttention(nn.Module):
    """Multi-head or grouped-query attention; the architecture decides the q/k treatment, softmax scale and ν
    constants. The cache holds num_key_value_heads heads; each backend lets a group of query heads share one."""

    def __init__(self, config: AnGPTConfig, layer_idx: int) -> None:
        super().__init__()
        arch = get_architecture(config)
        self.config, self.layer_idx = config, layer_idx
        self.num_heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.num_key_value_heads = config.num_key_value_heads
        # grouped-query attention: query head h reads key/value head h // groups (transformers' repeat_kv)
        self.num_key_value_groups = self.num_heads // self.num_key_value_heads
        self.is_causal = config.is_causal
        self.scaling = arch.softmax_scale(config)
        constants = arch.constants(config)
        self.nu_v, self.nu_o = constants["v"], constants["o"]
        width, kv_width = self.num_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, kv_width, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, kv_width, bias=False)
        self.o_proj = nn.Linear(width, config.hidden_size, bias=False)
        self.o_proj.residual_output = True
        self.q_norm, self.k_norm = arch.qk_norm(config), arch.qk_norm(config)
        self.qk_scale = arch.qk_scale(config)
        self.query_gain = arch.query_gain(config)  # folded form only: c_q = √d_h·s_qk² (docs/inference-fold.md)
        # A query-scaling transform (LogN/SSMax, docs/attention.md): one learnable s per head, q ← s_h·log(n)·q;
        # filled in _init_weights. Checkpoints saved before it had this name store it as `logn_scale`
        # (pretrained_angpt.RENAMED_PARAMETERS renames it on loading).
        self.logit_transform = LOGIT_TRANSFORMS[config.attention_logit_transform]
        self.query_head_scale = None
        if self.logit_transform.query_scale is not None:
            self.query_head_scale = nn.Parameter(torch.full((self.num_heads,),
                                                            self.logit_transform.query_scale_init(config)))

    def forward(self, hidden_states: torch.Tensor, position_embeddings, attention_mask, past_key_values=None,
                output_scale=None, **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`output_scale`: a row scale on o_proj's output on top of ν_o (the residual update's branch factor)."""
        batch, length, _ = hidden_states.shape
        # -1 heads: under a tensor-parallel plan each rank holds a whole number of heads (docs/architectures.md,
        # "Tensor and pipeline parallelism"), and every per-channel scale below comes split the same way
        heads = (batch, length, -1, self.head_dim)
        query = self.q_norm(self.q_proj(hidden_states).view(heads)).transpose(1, 2)  # [b, h, t, d_h]
        key = self.k_norm(self.k_proj(hidden_states).view(heads)).transpose(1, 2)  # [b, h_kv, t, d_h]
        value = project(self.v_proj, hidden_states, self.nu_v).view(heads).transpose(1, 2)
        if position_embeddings is not None:
            query, key = apply_rotary(query, key, *position_embeddings)
        if self.qk_scale is not None:  # s_qk after RoPE: one per key channel, shared by the query heads reading it
            s_qk = self.qk_scale().view(-1, 1, self.head_dim).to(query.dtype)
            query, key = query * s_qk.repeat_interleave(self.num_key_value_groups, dim=0), key * s_qk
        gain = None if self.query_gain is None else gain_of(self.query_gain, query)
        if query.shape[1] != self.num_heads:  # this rank holds some of the heads: were they all split alike?
            self._check_split_heads(query.shape[1], gain)
        if gain is not None:  # folded: all of q's and k's factors merged onto q (docs/inference-fold.md)
            query = query * gain.view(-1, 1, self.head_dim)
        paged = is_paged(past_key_values)  # continuous batching (paged_angpt.py)
        if paged:
            key, value = update_paged_cache(past_key_values, key, value, self.layer_idx, kwargs)
        elif past_key_values is not None:
            key, value = past_key_values.update(key, value, self.layer_idx)
        if self.query_head_scale is not None:  # LogN as a query scaling, so every kernel runs it (docs/attention.md)
            layout = kwargs.get("attention_layout") or AttentionLayout.from_shapes(query, key, attention_mask,
                                                                                   self.is_causal)
            query = query * self.logit_transform.query_scale(self.query_head_scale, layout).to(query.dtype)
        # the registered backend (checked where it was chosen: it computes this variant), else transformers' by name
        attend = get_attention_function(self.config) or ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward)
        if paged:  # transformers' function, which reads the paged batch's keyword arguments
            attend = paged_attention_function(self.config)
        output, weights = attend(self, query, key, value, attention_mask, scaling=self.scaling,
                                 dropout=self.config.attention_dropout if self.training else 0.0, **kwargs)
        output = output.reshape(batch, length, -1)
        scale = self.nu_o if output_scale is None else output_scale * self.nu_o
        return project(self.o_proj, output, scale), weights

    def _check_split_heads(self, heads: int, gain: torch.Tensor | None) -> None:
        """Refuse, in one line, a forward on `heads` of the query heads (a runtime split q_proj) where a per-head
        factor was not split with them: the folded c_q or LogN's s_h left whole (a runtime splitting by other rules
        than the plan's), ALiBi's slopes computed from the config for all heads (docs/architectures.md, "Tensor and
        pipeline parallelism")."""
        if gain is not None and gain.numel() != heads * self.head_dim:
            raise ValueError(f"{QUERY_GAIN_UNSPLIT}: this rank's q has {heads} heads, the gain "
                             f"{gain.numel() // self.head_dim}")
        if self.query_head_scale is not None and self.query_head_scale.numel() != heads:
            raise ValueError(f"{QUERY_HEAD_SCALE_UNSPLIT}: this rank's q has {heads} heads, the scale "
                             f"{self.query_head_scale.numel()}")
        if self.logit_transform.head_values is not None:
            transform = self.config.attention_logit_transform
            raise ValueError(f"attention_logit_transform={transform!r}: {HEAD_VALUES_UNSPLIT}")


# The refusals of AnGPTAttention._check_split_heads.
QUERY_GAIN_UNSPLIT = ("the folded query gain c_q (self_attn.query_gain) was left whole while q_proj was split across "
                      "ranks; split it with q_proj (as transformers' tp_plan and vLLM do: it is a linear layer), or "
                      "run this folded nGPT/anGPT checkpoint without tensor parallelism")


QUERY_HEAD_SCALE_UNSPLIT = ("the per-head query scale s_h (self_attn.query_head_scale, LogN) was left whole while q_proj "
                            "was split across ranks; transformers' tp_plan splits it, a runtime that splits only "
                            "linear layers (vLLM) does not: run this checkpoint there without tensor parallelism")


HEAD_VALUES_UNSPLIT = ("its per-head constants (ALiBi's slopes) come from the config for all heads, and a rank that "
                       "holds some of the heads cannot tell which: this variant runs without tensor parallelism")


class AnGPTMLP(nn.Module):
    """SwiGLU x = ν_d W_down(ν_acf · u ⊙ SiLU(z)), u = ν_uz s_u ⊙ W_up h, z = ν_uz √d s_v ⊙ W_gate h
    (docs/architectures.md, section `angpt`; GPT+ has all factors 1)."""

    def __init__(self, config: AnGPTConfig) -> None:
        super().__init__()
        arch = get_architecture(config)
        constants = arch.constants(config)
        self.nu_up, self.nu_gate, self.nu_down = constants["up"], constants["gate"], constants["down"]
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.down_proj.residual_output = True
        self.up_scale, self.gate_scale = arch.mlp_scales(config)

    def forward(self, x: torch.Tensor, output_scale=None) -> torch.Tensor:
        up_scale, gate_scale = self.nu_up, self.nu_gate
        if self.up_scale is not None:
            up_scale, gate_scale = self.up_scale() * up_scale, self.gate_scale() * gate_scale
        hidden = project(self.up_proj, x, up_scale) * nn.functional.silu(project(self.gate_proj, x, gate_scale))
        down_scale = self.nu_down if output_scale is None else output_scale * self.nu_down
        return project(self.down_proj, hidden, down_scale)


class AnGPTDecoderLayer(GradientCheckpointingLayer):
    """The one block of every architecture: h ← R(h, Attn(n(h))), then h ← R(h, MLP(n(h))); the branch norm n and
    the residual update R come from the architecture (docs/architectures.md, "One block, three architectures")."""

    def __init__(self, config: AnGPTConfig, layer_idx: int) -> None:
        super().__init__()
        arch = get_architecture(config)
        self.self_attn = AnGPTAttention(config, layer_idx)
        self.mlp = AnGPTMLP(config)
        self.input_layernorm = arch.branch_norm(config)
        self.post_attention_layernorm = arch.branch_norm(config)
        self.attn_residual = arch.residual(config)
        self.mlp_residual = arch.residual(config)

    def forward(self, hidden_states: torch.Tensor, attention_mask=None, position_embeddings=None,
                past_key_values: Cache | None = None, **kwargs) -> torch.Tensor:
        # The residual update (layers_angpt.py): GPT+ h + x; nGPT N(lerp(h, N(x), α)); anGPT γ ⊙ h + β ⊙ x, its branch
        # factor β applied to the output projection's rows (a d×d weight, not the B×T×d activations).
        residual_weights = self.attn_residual.weights()  # nGPT: α; anGPT: γ and β (its branch_scale); GPT+: none
        update = self.self_attn(self.input_layernorm(hidden_states), position_embeddings, attention_mask,
                                past_key_values, residual_weights.branch_scale, **kwargs)[0]
        hidden_states = self.attn_residual(hidden_states, update, residual_weights)

        residual_weights = self.mlp_residual.weights()
        update = self.mlp(self.post_attention_layernorm(hidden_states), residual_weights.branch_scale)
        return self.mlp_residual(hidden_states, update, residual_weights)


# The per-layer outputs `output_hidden_states` / `output_attentions` collect (transformers' output capturing).
RECORDED_OUTPUTS = {"hidden_states": AnGPTDecoderLayer, "attentions": AnGPTAttention}


# --- the model and its heads ----------------------------------------------------------------------------------------
class AnGPTModel(AnGPTPreTrainedModel):
    _can_record_outputs = RECORDED_OUTPUTS

    def __init__(self, config: AnGPTConfig) -> None:
        super().__init__(config)
        check_logits_need_no_head(config)  # a runtime that builds this base model alone (vLLM) computes the logits
        arch = get_architecture(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(AnGPTDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = arch.final_norm(config)
        self.rotary_emb = AnGPTRotaryEmbedding(config)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")  # as transformers' Llama
    @merge_with_config_defaults
    @capture_outputs
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache: Cache | None = None,
                inputs_embeds=None, use_cache: bool | None = None,
                **kwargs: Unpack[TransformersKwargs]) -> BaseModelOutputWithPast:
        past_key_values = cache
        if is_paged(past_key_values):  # continuous batching: its manager prepared the batch (paged_angpt.py)
            return self.paged_forward(input_ids, inputs_embeds, attention_mask, position_ids, past_key_values, **kwargs)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("AnGPTModel.forward: pass exactly one of input_ids or inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        # Padding-free packing (transformers' DataCollatorWithFlattening): the caller's position_ids restart inside a
        # row, with no mask and no cache; keys then see only their own sequence (decided without reading values).
        packed = position_ids is not None and attention_mask is None and past_key_values is None
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache(config=self.config)
        past_seen = past_key_values.get_seq_length() if past_key_values is not None else 0
        if isinstance(past_seen, torch.Tensor):  # a static cache's counter, which its update() advances in place
            past_seen = past_seen.clone()
        length = inputs_embeds.shape[1]
        new_index = torch.arange(length, device=inputs_embeds.device) + past_seen  # cache index of each new token
        if position_ids is None and attention_mask is not None and attention_mask.dim() == 2:
            # count real tokens, as generate does, so left padding changes no position (docs/attention.md)
            position_ids = positions_from_padding(attention_mask).index_select(1, new_index)
        elif position_ids is None:
            position_ids = new_index[None]
        # Our backends read positions (O(T)) instead of a T×T mask; transformers' own ones get their usual mask.
        layout = AttentionLayout.build(self.config, attention_mask, position_ids, past_key_values, past_seen,
                                       inputs_embeds.shape[0], packed)
        mask = None
        if not uses_layout(self.config):
            mask_args = dict(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                             cache=past_key_values)
            if self.config.is_causal:
                mask = create_causal_mask(position_ids=position_ids, **mask_args)
            else:
                mask = create_bidirectional_mask(**mask_args)
        hidden_states = inputs_embeds
        position_embeddings = None
        if self.rotary_emb.inv_freq.numel():
            rope_len = self.rotary_emb.sequence_length(position_ids, past_key_values, kwargs.pop("rope_seq_len", None),
                                                       packed)
            position_embeddings = self.rotary_emb(hidden_states, position_ids, rope_len, layout.key_sequence)
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask=mask, position_embeddings=position_embeddings,
                                  past_key_values=past_key_values, position_ids=position_ids,
                                  attention_layout=layout, **kwargs)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(hidden_states), cache=past_key_values)

    def paged_forward(self, input_ids, inputs_embeds, attention_mask, position_ids, cache, **kwargs):
        """Continuous batching: one flattened row of every request's new tokens, their positions, the paged cache and
        the mask come from transformers' batching manager; attention runs on transformers' functions
        (paged_angpt.py; docs/tools.md, "continuous batching")."""
        check_paged_support(self.config, self.layers[0].self_attn.is_causal)  # one line for what it cannot compute
        hidden_states = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        position_embeddings = None
        if self.rotary_emb.inv_freq.numel():
            position_embeddings = self.rotary_emb(hidden_states, position_ids)
        layout = paged_layout(position_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask=attention_mask, position_embeddings=position_embeddings,
                                  past_key_values=cache, position_ids=position_ids, attention_layout=layout, **kwargs)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(hidden_states), cache=cache)


class AnGPTForCausalLM(AnGPTPreTrainedModel, GenerationMixin):
    _can_record_outputs = RECORDED_OUTPUTS
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    # The head splits the vocabulary and gathers the logits, so s_z multiplies whole logits (stays whole).
    _tp_plan = {"lm_head": "colwise_gather_output"}
    _pp_plan = {"lm_head": (["hidden_states"], ["logits"])}
    _can_compile_fullgraph = True  # no data-dependent branch in the forward; the static cache carries positions

    def init_continuous_batching(self, *args, **kwargs):
        """transformers' continuous batching (generate_batch, `transformers serve --continuous-batching`); what its
        paged path cannot compute is refused here in one line, before its worker thread starts (paged_angpt.py)."""
        check_paged_support(self.config)
        return super().init_continuous_batching(*args, **kwargs)

    def create_masks_for_generate(self, config, inputs_embeds, attention_mask, cache=None, position_ids=None,
                                  **kwargs):
        """generate's hook for compileable (static) caches. Our backends read a 2-D padding mask (positions, not a
        T×T mask): hand it over padded to the cache length, so every decoding step has the same shapes (one compiled
        graph). transformers' own backends get transformers' masks."""
        if not uses_layout(config):
            return create_masks_for_generate(config=config, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                                             cache=cache, position_ids=position_ids, **kwargs)
        if attention_mask is None or attention_mask.dim() != 2:
            return attention_mask
        key_length = cache.get_mask_sizes(inputs_embeds.shape[1], 0)[0]
        return nn.functional.pad(attention_mask, (0, key_length - attention_mask.shape[-1]))

    def __init__(self, config: AnGPTConfig) -> None:
        super().__init__(config)
        self.model = AnGPTModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.logit_scale = get_architecture(config).logit_scale(config)  # s_z
        self.post_init()

    def output_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The LM head on final hidden states [b, t, d] -> [b, t, V] (s_z applied): callers that need logits
        for a slice of positions at a time (long-context losses) call it on their own slices."""
        s_z = None if self.logit_scale is None else self.logit_scale()
        return project(self.lm_head, hidden_states, s_z)  # called when wrapped (FSDP2, LoRA, quantized)

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")  # as transformers' Llama
    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache: Cache | None = None,
                inputs_embeds=None, labels=None, use_cache=None, logits_to_keep: int | torch.Tensor = 0,
                **kwargs: Unpack[TransformersKwargs]) -> CausalLMOutputWithPast:
        # return_dict=True: the head reads fields; @can_return_tuple makes the tuple (also for config.return_dict=False)
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             cache=cache, inputs_embeds=inputs_embeds, use_cache=use_cache, return_dict=True,
                             **kwargs)
        hidden_states = outputs.last_hidden_state
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.output_logits(hidden_states[:, keep, :])
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=outputs.cache,
                                      hidden_states=outputs.hidden_states, attentions=outputs.attentions)


class AnGPTForSequenceClassification(AnGPTPreTrainedModel):
    """Sequence classification by pooling the final hidden states (mean over non-padding tokens by default;
    the semantic-focus tasks use it with `is_causal=False`)."""

    _can_record_outputs = RECORDED_OUTPUTS

    def __init__(self, config: AnGPTConfig) -> None:
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = AnGPTModel(config)
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.score = nn.Linear(config.hidden_size, config.num_labels, bias=False)
        self.score.task_head = True
        self.post_init()

    def pool(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        if attention_mask is None:
            attention_mask = torch.ones(hidden_states.shape[:2], device=hidden_states.device)
        mask = attention_mask.to(hidden_states.dtype)
        if self.config.classifier_pooling == "mean":
            summed = (hidden_states * mask.unsqueeze(-1)).sum(1)
            return summed / mask.sum(1, keepdim=True).clamp_min(1.0)
        # "last": the last non-padding position, whether padding is on the left or the right
        positions = torch.arange(mask.shape[1], device=mask.device)
        last = (attention_mask.long() * positions).argmax(-1)
        return hidden_states[torch.arange(hidden_states.shape[0], device=mask.device), last]

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")  # as transformers' Llama
    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache: Cache | None = None,
                inputs_embeds=None, labels=None, use_cache=None,
                **kwargs: Unpack[TransformersKwargs]) -> SequenceClassifierOutputWithPast:
        # return_dict=True: the head reads fields; @can_return_tuple makes the tuple (also for config.return_dict=False)
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             cache=cache, inputs_embeds=inputs_embeds, use_cache=use_cache, return_dict=True,
                             **kwargs)
        pooled = self.pool(outputs.last_hidden_state, attention_mask)
        logits = self.score(self.dropout(pooled))
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, pooled_logits=logits, config=self.config)
        return SequenceClassifierOutputWithPast(loss=loss, logits=logits, cache=outputs.cache,
                                                hidden_states=outputs.hidden_states, attentions=outputs.attentions)


__all__ = ["CheckpointMismatchError", "AnGPTPreTrainedModel", "AnGPTModel", "AnGPTForCausalLM",
           "AnGPTForSequenceClassification"]
