"""GPT+, nGPT and anGPT as transformers models: one decoder block, architecture strategies (SPEC.md §1).

Names follow transformers' Llama/Qwen3 (`embed_tokens`, `q_proj`, ..., `input_layernorm`, `lm_head`), so state
dicts convert key for key. This file and the files it imports with `from .x import` are what
`save_pretrained` copies next to a checkpoint for `trust_remote_code` loading: it imports nothing else of the project.
"""
from __future__ import annotations

import inspect

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask, create_masks_for_generate
from transformers.modeling_outputs import (BaseModelOutputWithPast, CausalLMOutputWithPast,
                                           SequenceClassifierOutputWithPast)
from transformers.utils.generic import can_return_tuple, merge_with_config_defaults
from transformers.utils.output_capturing import capture_outputs

from .architectures_angpt import get_architecture
from .attention_angpt import uses_layout
from .configuration_angpt import AnGPTConfig
from .decoder_angpt import AnGPTAttention, AnGPTDecoderLayer, AnGPTMLP  # noqa: F401 (AnGPTMLP: a public name)
from .folding_angpt import FOLDED_TRAINING_ERROR, Gain, fold_model
from .layers_angpt import RMSNorm, RowScaledLinear, Scale
from .masks_angpt import AttentionLayout, positions_from_padding
from .rotary_angpt import AnGPTRotaryEmbedding


# transformers 5.24 renamed the KV cache argument and output field `past_key_values` to `cache` (generate passes
# `cache=`; 5.23 passes `past_key_values=`). Both names are accepted in, and outputs carry whichever field this
# transformers has, so one checkpoint's code runs under either.
OUTPUT_CACHE_FIELD = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"
_MASK_CACHE_ARGUMENT = ("cache" if "cache" in inspect.signature(create_causal_mask).parameters  # the mask helpers'
                        else "past_key_values")  # name (5.24 deprecates the old one, to be removed in 5.40)


def cache_argument(past_key_values, kwargs: dict):
    """The KV cache under either name (`cache` is popped from kwargs); both at once is a caller's error."""
    cache = kwargs.pop("cache", None)
    if cache is not None and past_key_values is not None and cache is not past_key_values:
        raise ValueError("pass the KV cache as `cache` or as `past_key_values`, not both")
    return past_key_values if cache is None else cache


def output_cache(outputs):
    return getattr(outputs, OUTPUT_CACHE_FIELD)


class CheckpointMismatchError(RuntimeError, ValueError):
    """A checkpoint tensor whose shape differs from the model's: a RuntimeError as transformers raises it, and a
    ValueError as this project's command-line tools report a bad checkpoint (one line, no traceback)."""


class AnGPTPreTrainedModel(PreTrainedModel):
    config_class = AnGPTConfig
    config: AnGPTConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["AnGPTDecoderLayer"]
    _skip_keys_device_placement = ["past_key_values"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_record_outputs = {"hidden_states": AnGPTDecoderLayer, "attentions": AnGPTAttention}

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """transformers' loader, with its usual behaviour where transformers has one: a head the checkpoint lacks
        because it was saved from another class (a classifier from a causal-LM checkpoint) is initialised and named
        in transformers' load report; a shape mismatch raises a RuntimeError as transformers does (naming the
        tensors; CheckpointMismatchError) unless `ignore_mismatched_sizes=True`, which re-initialises them. Stricter than transformers: any other
        missing tensor (of the base model, or of the head the checkpoint was saved with) is an error naming the
        tensors, never a silently re-initialised, half-loaded model."""
        ignore_mismatched = kwargs.pop("ignore_mismatched_sizes", False)
        wants_info = kwargs.pop("output_loading_info", False)
        source = args[0] if args else kwargs.get("pretrained_model_name_or_path")
        try:
            model, info = super().from_pretrained(*args, output_loading_info=True, ignore_mismatched_sizes=True,
                                                  **kwargs)
        except Exception as error:  # safetensors' own error names neither the checkpoint nor the problem kind
            if type(error).__name__ != "SafetensorError":
                raise
            raise OSError(f"checkpoint {source}: a safetensors file is corrupted or truncated ({error})") from error
        mismatched = [f"{name}: checkpoint {tuple(saved)} vs model {tuple(expected)}"
                      for name, saved, expected in sorted(info["mismatched_keys"])]
        if mismatched and not ignore_mismatched:
            raise CheckpointMismatchError(
                f"checkpoint {source} does not match its config ({len(mismatched)} tensors): "
                + "; ".join(mismatched[:8])
                + ". You set `ignore_mismatched_sizes` to `False`, thus raising an error (True re-initialises them).")
        saved_as = getattr(model.config, "architectures", None) or [cls.__name__]
        new_head = set()
        if cls.__name__ not in saved_as and model.base_model is not model:
            prefix = model.base_model_prefix + "."
            new_head = {key for key in model.state_dict() if not key.startswith(prefix)}
        missing = [f"{name}: missing from the checkpoint" for name in sorted(set(info["missing_keys"]) - new_head)]
        if missing:
            raise ValueError(f"checkpoint {source} does not match its config ({len(missing)} tensors): "
                             + "; ".join(missing[:8]))
        return (model, info) if wants_info else model

    def train(self, mode: bool = True):
        if mode and getattr(self.config, "folded", False):
            raise RuntimeError(FOLDED_TRAINING_ERROR)
        return super().train(mode)

    def fold(self, dtype: torch.dtype | None = None):
        """A new model in the inference form of SPEC §2 (config.folded=True): no ν, no scales, no LERP."""
        return fold_model(self, dtype)

    @property
    def architecture_strategy(self):
        return get_architecture(self.config)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        arch = self.architecture_strategy
        if isinstance(module, (nn.Linear, nn.Embedding)):
            if getattr(module, "task_head", False):  # classifier heads are ordinary, unconstrained layers
                init.normal_(module.weight, std=self.config.initializer_range)
            else:
                residual_output = getattr(module, "residual_output", False)
                init.copy_(module.weight, arch.init_matrix(module.weight, self.config, residual_output))
        elif isinstance(module, RMSNorm) and module.weight is not None:
            init.ones_(module.weight)
        elif isinstance(module, Scale):
            init.constant_(module.weight, module.scale)
        elif isinstance(module, Gain):
            init.ones_(module.weight)
        elif isinstance(module, AnGPTAttention) and module.logn_scale is not None:
            init.constant_(module.logn_scale, module.logit_transform.query_scale_init(self.config))
        elif isinstance(module, AnGPTRotaryEmbedding):
            # Non-persistent buffer: from_pretrained builds on the meta device, so it must be re-filled here.
            init.copy_(module.inv_freq, module.reset_parameters())

    def resize_token_embeddings(self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None,
                                mean_resizing: bool = True) -> nn.Embedding:
        """transformers' resize (embedding and head, tied or not), then what it does not know: the per-token output
        scale s_z follows the vocabulary (new entries at s_z's init value), and new embedding/head rows are projected
        by the architecture's weight constraint (nGPT: unit norm, anGPT: into the unit ball; GPT+: unchanged).
        New rows start as transformers makes them: at the old rows' mean (`mean_resizing=True`), or at the
        architecture's own init (`mean_resizing=False`: unit-norm rows for nGPT/anGPT, N(0, 0.02²) for GPT+)."""
        old = self.get_input_embeddings().weight.shape[0]
        embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        new = embeddings.weight.shape[0]
        with torch.no_grad():
            if new > old:
                head = self.get_output_embeddings()
                for weight in {id(m.weight): m.weight for m in (embeddings, head) if m is not None}.values():
                    self.architecture_strategy.constrain(weight[old:], residual_output=False)
            scale = getattr(self, "logit_scale", None)
            if scale is not None and scale.weight.shape[0] != new:
                kept = scale.weight[:new]
                added = torch.full((new - kept.shape[0],), scale.scale, dtype=kept.dtype, device=kept.device)
                scale.weight = nn.Parameter(torch.cat([kept, added]), requires_grad=scale.weight.requires_grad)
        return embeddings

    def constrained_matrices(self):
        """(weight, residual_output) for every matrix the architecture's constraint covers (not task heads)."""
        seen = set()
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)) and not getattr(module, "task_head", False):
                if id(module.weight) not in seen:  # tied head and embedding share one tensor
                    seen.add(id(module.weight))
                    yield module.weight, getattr(module, "residual_output", False)

    @torch.no_grad()
    def apply_weight_constraints(self) -> None:
        """Project the weights after an optimiser step: nothing (GPT+), unit norm along d_model (nGPT),
        rows into the unit ball (anGPT). Call it on every rank after every step (SPEC §1)."""
        self.architecture_strategy.constrain_all(list(self.constrained_matrices()))

    def optimizer_param_groups(self, weight_decay: float = 0.0) -> list[dict]:
        """Parameter groups for torch optimisers, weight decay where the architecture wants it."""
        return self.architecture_strategy.optimizer_param_groups(self, weight_decay)


class AnGPTModel(AnGPTPreTrainedModel):
    def __init__(self, config: AnGPTConfig) -> None:
        super().__init__(config)
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

    @merge_with_config_defaults
    @capture_outputs
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values: Cache | None = None,
                inputs_embeds=None, use_cache: bool | None = None, **kwargs) -> BaseModelOutputWithPast:
        past_key_values = cache_argument(past_key_values, kwargs)
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
            # count real tokens, as generate does, so left padding changes no position (SPEC §3)
            position_ids = positions_from_padding(attention_mask).index_select(1, new_index)
        elif position_ids is None:
            position_ids = new_index[None]
        # Our backends read positions (O(T)) instead of a T×T mask; transformers' own ones get their usual mask.
        layout = AttentionLayout.build(self.config, attention_mask, position_ids, past_key_values, past_seen,
                                       inputs_embeds.shape[0], packed)
        mask = None
        if not uses_layout(self.config):
            mask_args = dict(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                             **{_MASK_CACHE_ARGUMENT: past_key_values})
            if self.config.is_causal:
                mask = create_causal_mask(position_ids=position_ids, **mask_args)
            else:
                mask = create_bidirectional_mask(**mask_args)
        hidden_states = inputs_embeds
        position_embeddings = None
        if self.rotary_emb.inv_freq.numel():
            rope_len = self.rotary_emb.sequence_length(position_ids, past_key_values, kwargs.pop("rope_seq_len", None))
            position_embeddings = self.rotary_emb(hidden_states, position_ids, rope_len)
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask=mask, position_embeddings=position_embeddings,
                                  past_key_values=past_key_values, position_ids=position_ids,
                                  attention_layout=layout, **kwargs)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(hidden_states),
                                       **{OUTPUT_CACHE_FIELD: past_key_values})


class AnGPTForCausalLM(AnGPTPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _can_compile_fullgraph = True  # no data-dependent branch in the forward; the static cache carries positions

    def create_masks_for_generate(self, config, inputs_embeds, attention_mask, past_key_values=None, position_ids=None,
                                  **kwargs):
        """generate's hook for compileable (static) caches. Our backends read a 2-D padding mask (positions, not a
        T×T mask): hand it over padded to the cache length, so every decoding step has the same shapes (one compiled
        graph). transformers' own backends get transformers' masks."""
        past_key_values = cache_argument(past_key_values, kwargs)
        if not uses_layout(config):
            return create_masks_for_generate(config=config, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                                             position_ids=position_ids, **{_MASK_CACHE_ARGUMENT: past_key_values},
                                             **kwargs)
        if attention_mask is None or attention_mask.dim() != 2:
            return attention_mask
        key_length = past_key_values.get_mask_sizes(inputs_embeds.shape[1], 0)[0]
        return nn.functional.pad(attention_mask, (0, key_length - attention_mask.shape[-1]))

    def __init__(self, config: AnGPTConfig) -> None:
        super().__init__(config)
        self.model = AnGPTModel(config)
        self.lm_head = RowScaledLinear(config.hidden_size, config.vocab_size, bias=False)
        self.logit_scale = get_architecture(config).logit_scale(config)  # s_z
        self.post_init()

    def set_output_embeddings(self, new_embeddings: nn.Module) -> None:
        """transformers' resize_token_embeddings builds a plain nn.Linear head: keep its weight in a RowScaledLinear,
        whose call takes s_z (output_logits)."""
        if type(new_embeddings) is nn.Linear:
            head = RowScaledLinear(new_embeddings.in_features, new_embeddings.out_features, bias=False, device="meta")
            head.weight = new_embeddings.weight
            new_embeddings = head
        self.lm_head = new_embeddings

    def output_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The LM head on final hidden states [b, t, d] -> [b, t, V] (s_z applied): callers that need logits
        for a slice of positions at a time (long-context losses) call it on their own slices."""
        s_z = None if self.logit_scale is None else self.logit_scale()
        return self.lm_head(hidden_states, s_z)  # the module, so FSDP gathers its sharded weight

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, labels=None, use_cache=None, logits_to_keep: int | torch.Tensor = 0,
                **kwargs) -> CausalLMOutputWithPast:
        past_key_values = cache_argument(past_key_values, kwargs)
        # return_dict=True: the head reads fields; @can_return_tuple makes the tuple (also for config.return_dict=False)
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache,
                             return_dict=True, **kwargs)
        hidden_states = outputs.last_hidden_state
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.output_logits(hidden_states[:, keep, :])
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{OUTPUT_CACHE_FIELD: output_cache(outputs)},
                                      hidden_states=outputs.hidden_states, attentions=outputs.attentions)


class AnGPTForSequenceClassification(AnGPTPreTrainedModel):
    """Sequence classification by pooling the final hidden states (mean over non-padding tokens by default;
    the semantic-focus tasks use it with `is_causal=False`)."""

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

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, labels=None, use_cache=None, **kwargs) -> SequenceClassifierOutputWithPast:
        past_key_values = cache_argument(past_key_values, kwargs)
        # return_dict=True: the head reads fields; @can_return_tuple makes the tuple (also for config.return_dict=False)
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache,
                             return_dict=True, **kwargs)
        pooled = self.pool(outputs.last_hidden_state, attention_mask)
        logits = self.score(self.dropout(pooled))
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, pooled_logits=logits, config=self.config)
        return SequenceClassifierOutputWithPast(loss=loss, logits=logits, **{OUTPUT_CACHE_FIELD: output_cache(outputs)},
                                                hidden_states=outputs.hidden_states, attentions=outputs.attentions)


__all__ = ["CheckpointMismatchError", "AnGPTPreTrainedModel", "AnGPTModel", "AnGPTForCausalLM",
           "AnGPTForSequenceClassification"]
