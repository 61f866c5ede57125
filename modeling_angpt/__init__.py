"""angpt: approximately normalized transformers (anGPT), nGPT and GPT+ as Hugging Face transformers models.

Importing the package registers the config and models with the Auto classes, and marks them for
`register_for_auto_class` so `save_pretrained` writes `auto_map` and the model files for
`trust_remote_code` loading on machines without this package.
"""
from transformers import (AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification)

from .architectures_angpt import register_architecture
from .attention_angpt import register_attention_backend
from .configuration_angpt import AnGPTConfig
from .logit_transforms_angpt import register_logit_transform
from .rotary_angpt import register_rope_type
from .sparsity_angpt import register_sparsity
from .modeling_angpt import AnGPTForCausalLM, AnGPTForSequenceClassification, AnGPTModel, AnGPTPreTrainedModel

__version__ = "0.1.0"

AutoConfig.register(AnGPTConfig.model_type, AnGPTConfig, exist_ok=True)
AutoModel.register(AnGPTConfig, AnGPTModel, exist_ok=True)
AutoModelForCausalLM.register(AnGPTConfig, AnGPTForCausalLM, exist_ok=True)
AutoModelForSequenceClassification.register(AnGPTConfig, AnGPTForSequenceClassification, exist_ok=True)

AnGPTConfig.register_for_auto_class()
AnGPTModel.register_for_auto_class("AutoModel")
AnGPTForCausalLM.register_for_auto_class("AutoModelForCausalLM")
AnGPTForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")

__all__ = ["AnGPTConfig", "AnGPTModel", "AnGPTForCausalLM", "AnGPTForSequenceClassification",
           "AnGPTPreTrainedModel", "register_architecture", "register_attention_backend", "register_logit_transform",
           "register_rope_type", "register_sparsity"]
