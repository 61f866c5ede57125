"""The model class every angpt model shares (AnGPTPreTrainedModel): loading, initialisation, resizing, the weight
constraint and the fold. The forward lives in modeling_angpt.py.

A model file: `save_pretrained` copies it next to a checkpoint for `trust_remote_code` loading, so it imports
nothing of the project but the other flat *_angpt.py files.
"""
from __future__ import annotations

import sys

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.conversion_mapping import register_checkpoint_conversion_mapping
from transformers.core_model_loading import ConversionOps, WeightConverter

from .architectures_angpt import FOLDED_TRAINING_ERROR, get_architecture
from .attention_angpt import check_attention_backend
from .configuration_angpt import AnGPTConfig
from .folding_angpt import fold_model
from .layers_angpt import GAINS, RMSNorm, Scale


# The Auto class -> model class entries a remote-code checkpoint's auto_map carries (the classes of modeling_angpt.py).
AUTO_CLASSES = {"AutoModel": "AnGPTModel", "AutoModelForCausalLM": "AnGPTForCausalLM",
                "AutoModelForSequenceClassification": "AnGPTForSequenceClassification"}


# Runtimes that build the base model alone and compute the logits themselves, as lm_head(h) × config.logit_scale; each
# names itself in config._attn_implementation (vLLM's Transformers backend sets "vllm").
RUNTIMES_WITH_THEIR_OWN_HEAD = ("vllm",)


def check_logits_need_no_head(config) -> None:
    """Refuse, in one line, a runtime that computes logits without our causal-LM head when the model's logits need
    it: the training form of nGPT/anGPT multiplies them by the learned s_z there (docs/tools.md, "vLLM")."""
    runtime = config._attn_implementation
    if runtime in RUNTIMES_WITH_THEIR_OWN_HEAD and get_architecture(config).logit_scale(config) is not None:
        raise ValueError(f"attn_implementation={runtime!r} computes logits as lm_head(h) x config.logit_scale, without "
                         f"the learned per-token logit scale s_z of this {config.architecture} training checkpoint; "
                         "serve the folded checkpoint instead (`angpt export SRC DST` folds s_z into lm_head)")


# Parameters renamed since checkpoints were first saved: the name a checkpoint saved before stores -> the name now.
# from_pretrained renames them with transformers' `key_mapping` (a checkpoint loaded so is saved again in its own
# format, as transformers does), torch's `load_state_dict` (training's resume) with `rename_old_parameters`.
# LogN's per-head scale was `logn_scale`; it holds any query-scaling transform's scale (docs/attention.md).
RENAMED_PARAMETERS = {"self_attn.logn_scale": "self_attn.query_head_scale"}


# Parameters whose shape changed since checkpoints were first saved: the name -> the old tensor in today's shape. The
# folded c_q was a vector [H·d_h]; it is now the weight [H·d_h, 1] of a map from 1, so that runtimes that split only
# linear layers can build it as one and split it with q_proj (layers_angpt.Gain). from_pretrained reshapes it with a
# weight conversion registered with transformers (`LegacyShape`, also in a remote-code checkpoint's copy of this
# file), torch's load_state_dict (training's resume) in `rename_old_parameters`.
LEGACY_SHAPES = {"self_attn.query_gain.weight": lambda old: old.unsqueeze(-1) if old.ndim == 1 else old}


def _legacy_rule(key: str):
    return next((rule for name, rule in LEGACY_SHAPES.items() if key.endswith("." + name)), None)


def rename_old_parameters(module: nn.Module, state_dict: dict, prefix: str, *args) -> None:
    """A load_state_dict pre-hook: the keys of `state_dict` under `prefix` that carry an old name get the new one, and
    tensors saved in an old shape get today's."""
    for key in [key for key in state_dict if key.startswith(prefix)]:
        for old, new in RENAMED_PARAMETERS.items():
            if key.endswith("." + old):
                state_dict[key[:-len(old)] + new] = state_dict.pop(key)
    for key in [key for key in state_dict if key.startswith(prefix)]:
        rule = _legacy_rule(key)
        if rule is not None:
            state_dict[key] = rule(state_dict[key])


LEGACY_SPLIT_ERROR = ("this folded checkpoint stores c_q (self_attn.query_gain) as a vector, as checkpoints saved "
                      "before it became a linear layer do; it loads in one process, but cannot be split across ranks: "
                      "load it in one process and save_pretrained it once again, then split that checkpoint")


class LegacyShape(ConversionOps):
    """transformers' weight conversion for one entry of LEGACY_SHAPES: a tensor saved in an old shape gets today's on
    loading; saving writes today's shape as it is."""

    refused = False

    def __init__(self, rule) -> None:
        self.rule = rule

    def convert(self, input_dict, source_patterns, target_patterns, model=None, full_layer_name=None, **kwargs):
        tensors = next(iter(input_dict.values()))
        tensors = tensors if isinstance(tensors, list) else [tensors]
        parameter = model.get_parameter(full_layer_name) if model is not None and full_layer_name else None
        if type(parameter).__name__ == "DTensor" and (not tensors or tensors[0].ndim != parameter.ndim):
            # transformers splits a tensor on reading it, by today's shape: an old one cannot be split (every rank)
            LegacyShape.refused = True  # transformers reraises a conversion's error as its own, in a table
            raise ValueError(LEGACY_SPLIT_ERROR)
        return {target_patterns[0]: self.rule(tensors[0])}

    @property
    def reverse_op(self) -> ConversionOps:
        return SaveAsIs()


class SaveAsIs(ConversionOps):
    """The reverse of `LegacyShape`: a model saves its tensors in today's shape (transformers' own pass-through op is
    private, modeling_angpt/dependencies/ledger.py)."""

    def convert(self, input_dict, source_patterns=None, target_patterns=None, **kwargs):
        return input_dict


register_checkpoint_conversion_mapping(AnGPTConfig.model_type, [
    WeightConverter(name, name, [LegacyShape(rule)]) for name, rule in LEGACY_SHAPES.items()], overwrite=True)


class CheckpointMismatchError(RuntimeError, ValueError):
    """A checkpoint tensor whose shape differs from the model's: a RuntimeError as transformers raises it, and a
    ValueError as this project's command-line tools report a bad checkpoint (one line, no traceback)."""


def _adapter_modules(model: nn.Module) -> list[nn.Module]:
    """The modules an adapter added: inside every layer that wraps a `base_layer` (PEFT's tuner layers: LoRA,
    IA³, ...), all but the base layer's own. Found by that attribute, as PEFT names it, so that a model file needs
    no PEFT import."""
    added = []
    for wrapper in model.modules():
        base = getattr(wrapper, "base_layer", None)
        if isinstance(base, nn.Module) and wrapper is not base:
            kept = set(map(id, base.modules()))
            added += [m for m in wrapper.modules() if m is not wrapper and id(m) not in kept]
    return added


def _is_float_matrix(weight) -> bool:
    """False for a weight a quantization tool stores in its own format (bitsandbytes' Int8Params/Params4bit hold
    integers, torchao's a tensor subclass): no optimiser step moves it, and dividing its storage would corrupt it.
    FSDP2's DTensor shards are ordinary weights (training/distributed.py projects them)."""
    return weight.dtype.is_floating_point and (type(weight) in (torch.Tensor, nn.Parameter)
                                               or type(weight).__name__ == "DTensor")


def restore_4bit_layout(model: nn.Module, keep_generic: bool = False) -> int:
    """Give every bitsandbytes 4-bit layer that ran on its AVX512-BF16 path the storage of its generic path back;
    with `keep_generic`, keep every 4-bit layer on the generic path from then on. Returns how many it restored.

    Why (docs/tools.md, "bitsandbytes on a CPU: two 4-bit paths"): on a CPU with AVX512-BF16, bitsandbytes 0.50
    repacks a layer's weight for its bfloat16 kernel the first time the layer runs in eval mode without gradients,
    and keeps that layout. The packed kernel passes no gradient back to the layer's input, so an adapter trained
    afterwards learns from wrong gradients; and bitsandbytes' own inverse, which its saving calls, leaves the block
    scales in bfloat16 and transposed, so the saved checkpoint holds other weights (a transformers Qwen3 the same).
    The inverse here is bitsandbytes' own, then the scales back in their flat float32 order; their bfloat16
    rounding stays (the packed path computed with it too)."""
    functional = sys.modules.get("bitsandbytes.functional")
    if functional is None:  # bitsandbytes was never imported: no model holds its layers
        return 0
    restored, inverse = 0, getattr(functional, "_convert_weight_packed_for_cpu_inverse", None)
    for module in model.modules():
        if not hasattr(module, "support_avx512bf16_for_cpu"):
            continue
        if keep_generic:
            module.support_avx512bf16_for_cpu = False
        state = getattr(module.weight, "quant_state", None)
        if getattr(state, "packing_format_for_cpu", False):
            if inverse is None:  # a private function of bitsandbytes (checked with 0.50.2): say so, not AttributeError
                raise RuntimeError(f"bitsandbytes {getattr(sys.modules.get('bitsandbytes'), '__version__', '?')} has "
                                   "no functional._convert_weight_packed_for_cpu_inverse, which restores a 4-bit "
                                   "layer packed for its AVX512-BF16 kernel; install bitsandbytes==0.50.2")
            nested = state.original_nested
            module.weight.data, state = inverse(module.weight.data, state)
            if not nested:  # bitsandbytes' inverse flattens the scales back only when it re-quantizes them
                state.absmax = state.absmax.T.reshape(-1).float()
            module.weight.quant_state = state
            restored += 1
    return restored


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
    # by class name: the classes live in modeling_angpt.py, which builds on this one
    _can_record_outputs = {"hidden_states": "AnGPTDecoderLayer", "attentions": "AnGPTAttention"}

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """transformers' loader, with its usual behaviour where transformers has one: a head the checkpoint lacks
        because it was saved from another class (a classifier from a causal-LM checkpoint) is initialised and named
        in transformers' load report; a shape mismatch raises a RuntimeError as transformers does (naming the
        tensors; CheckpointMismatchError) unless `ignore_mismatched_sizes=True`, which re-initialises them. Stricter than transformers: any other
        missing tensor (of the base model, or of the head the checkpoint was saved with) is an error naming the
        tensors, never a silently re-initialised, half-loaded model. A checkpoint saved before a parameter was renamed
        loads under the new name (RENAMED_PARAMETERS)."""
        kwargs["key_mapping"] = {**RENAMED_PARAMETERS, **(kwargs.get("key_mapping") or {})}
        ignore_mismatched = kwargs.pop("ignore_mismatched_sizes", False)
        wants_info = kwargs.pop("output_loading_info", False)
        source = args[0] if args else kwargs.get("pretrained_model_name_or_path")
        try:
            model, info = super().from_pretrained(*args, output_loading_info=True, ignore_mismatched_sizes=True,
                                                  **kwargs)
        except Exception as error:  # safetensors' own error names neither the checkpoint nor the problem kind
            if LegacyShape.refused:
                LegacyShape.refused = False
                raise ValueError(f"checkpoint {source}: {LEGACY_SPLIT_ERROR}") from None
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

    def post_init(self):
        """transformers' post_init; then torch's load_state_dict also takes a parameter's old name (training resumes
        a run saved before the rename). A model with the folded c_q (layers_angpt.Gain, a gain held as a map from 1)
        keeps it out of quantization (quantizers match these patterns from the start of a module or parameter name)
        and in float32 where transformers keeps modules so."""
        if get_architecture(self.config).query_gain(self.config) is not None:
            self._keep_in_fp32_modules = [".*self_attn.query_gain"]
        super().post_init()
        self.register_load_state_dict_pre_hook(rename_old_parameters)

    def save_pretrained(self, *args, **kwargs):
        """transformers' saving; a checkpoint saved for remote code names every Auto class in `auto_map`, not only
        the saving class's (transformers writes that one alone), because runtimes load the class they need: vLLM
        builds the base model with `AutoModel` (docs/tools.md, "vLLM"). 4-bit layers packed for bitsandbytes'
        AVX512-BF16 kernel are saved in their generic layout, restored correctly (restore_4bit_layout)."""
        restore_4bit_layout(self)
        if self._auto_class is not None:
            self.config.auto_map = {**(getattr(self.config, "auto_map", None) or {}),
                                    **{auto: f"modeling_angpt.{name}" for auto, name in AUTO_CLASSES.items()}}
        return super().save_pretrained(*args, **kwargs)

    def _check_and_adjust_attn_implementation(self, attn_implementation, is_init_check: bool = False,
                                              allow_all_kernels: bool = False) -> str:
        """transformers' resolution of the attention backend (at `__init__`, in `set_attn_implementation`), then the
        check that it computes this attention variant, once, where it is chosen (docs/attention.md, "Backends"; the
        config checks an assignment to `_attn_implementation`). A requested name is checked first, so that a variant
        flash-attn cannot compute is refused even where flash-attn is not installed."""
        if isinstance(attn_implementation, str):
            check_attention_backend(self.config, attn_implementation)
        chosen = super()._check_and_adjust_attn_implementation(attn_implementation, is_init_check=is_init_check,
                                                               allow_all_kernels=allow_all_kernels)
        check_attention_backend(self.config, chosen)
        return chosen

    def train(self, mode: bool = True):
        if mode and getattr(self.config, "folded", False):
            raise RuntimeError(FOLDED_TRAINING_ERROR)
        return super().train(mode)

    def fold(self, dtype: torch.dtype | None = None):
        """A new model in the inference form (config.folded=True, docs/inference-fold.md): no ν, no scales, no
        LERP."""
        return fold_model(self, dtype)

    @property
    def architecture_strategy(self):
        return get_architecture(self.config)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        arch = self.architecture_strategy
        if isinstance(module, GAINS):  # a gain held as a map from 1, not a matrix
            init.ones_(module.weight)
        elif isinstance(module, (nn.Linear, nn.Embedding)):
            if getattr(module, "task_head", False):  # classifier heads are ordinary, unconstrained layers
                init.normal_(module.weight, std=self.config.initializer_range)
            else:
                residual_output = getattr(module, "residual_output", False)
                init.copy_(module.weight, arch.init_matrix(module.weight, self.config, residual_output))
        elif isinstance(module, RMSNorm) and module.weight is not None:
            init.ones_(module.weight)
        elif isinstance(module, Scale):
            init.constant_(module.weight, module.scale)
        elif getattr(module, "query_head_scale", None) is not None:  # AnGPTAttention with a query-scaling transform
            init.constant_(module.query_head_scale, module.logit_transform.query_scale_init(self.config))
        elif isinstance(getattr(module, "inv_freq", None), torch.Tensor):  # the rotary embedding
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
        """(weight, residual_output) for every matrix the architecture's constraint covers: the model's own
        projections, embedding and head, also where an adapter wraps them (its `base_layer`). Not task heads, not
        an adapter's own matrices (PEFT's lora_A/lora_B are nn.Linear too), not quantized weights
        (docs/architectures.md, "Weight constraints")."""
        adapters, seen = set(map(id, _adapter_modules(self))), set()
        for module in self.modules():
            if (not isinstance(module, (nn.Linear, nn.Embedding)) or getattr(module, "task_head", False)
                    or isinstance(module, GAINS)  # vLLM's build of c_q is a linear layer holding a gain
                    or id(module) in adapters or id(module.weight) in seen):  # a tied head shares the embedding's
                continue
            seen.add(id(module.weight))
            if _is_float_matrix(module.weight):
                yield module.weight, getattr(module, "residual_output", False)

    @torch.no_grad()
    def apply_weight_constraints(self) -> None:
        """Project the weights after an optimiser step: nothing (GPT+), unit norm along d_model (nGPT),
        rows into the unit ball (anGPT). Call it on every rank after every step (docs/architectures.md, "Weight
        constraints"; parameters sharded by FSDP2 go through modeling_angpt.training.distributed)."""
        self.architecture_strategy.constrain_all(list(self.constrained_matrices()))

    def optimizer_param_groups(self, weight_decay: float = 0.0) -> list[dict]:
        """Parameter groups for torch optimisers, weight decay where the architecture wants it."""
        return self.architecture_strategy.optimizer_param_groups(self, weight_decay)


__all__ = ["CheckpointMismatchError", "AnGPTPreTrainedModel"]
