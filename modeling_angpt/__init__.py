"""angpt: approximately normalized transformers (anGPT), nGPT and GPT+ as Hugging Face transformers models.

Importing the package registers the config and models with the Auto classes (`register_auto_classes`), and marks
them for `register_for_auto_class` so `save_pretrained` writes `auto_map` and the model files for
`trust_remote_code` loading on machines without this package. Registering needs torch and transformers.

The package's names (AnGPTConfig, the model classes, the register_* functions) are loaded from their modules on
first access. With the environment variable ANGPT_DEFER_REGISTRATION=1 set during the import, the import itself
loads nothing heavy and registers nothing; the Auto classes are then registered on the first access to one of the
package's names or by calling `register_auto_classes()`. The `angpt` console script imports the package so
(angpt_cli.py), which lets `angpt --help` and usage errors answer without importing torch, and registers before it
runs a command.
"""
from __future__ import annotations

import importlib
import logging
import os

__version__ = "0.1.0"


class _StartupNoise(logging.Filter):
    """Drops two warnings torchao causes on every start once it is installed (the [tools] extra; transformers imports
    it with its quantizers): compiled kernels it ships for other Pythons and GPUs that do not load here, and torch's
    note on the enums it registers. Neither is anything a user can act on, and they would bury the one-line messages
    of the command line (docs/tools.md). Only these records are dropped; every other warning stays."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ((message.startswith("Failed to load ") and ".so" in message)
                    or "is an Enum subclass and is now natively supported by torch.compile" in message)


for _noisy in ("torchao", "torch.utils._pytree"):
    logging.getLogger(_noisy).addFilter(_StartupNoise())

DEFER_REGISTRATION = "ANGPT_DEFER_REGISTRATION"

# name -> the module that defines it
_EXPORTS = {
    "AnGPTConfig": ".configuration_angpt",
    "AnGPTModel": ".modeling_angpt",
    "AnGPTForCausalLM": ".modeling_angpt",
    "AnGPTForSequenceClassification": ".modeling_angpt",
    "AnGPTPreTrainedModel": ".modeling_angpt",
    "register_architecture": ".architectures_angpt",
    "register_attention_backend": ".attention_angpt",
    "register_logit_transform": ".logit_transforms_angpt",
    "register_rope_type": ".rotary_angpt",
    "register_sparsity": ".sparsity_angpt",
}
__all__ = [*_EXPORTS, "register_auto_classes"]

_registered = False


def register_auto_classes() -> None:
    """Register AnGPTConfig and the models with transformers' Auto classes and for `register_for_auto_class`
    (what `import modeling_angpt` does unless deferred; calling it again does nothing)."""
    global _registered
    if _registered:
        return
    _registered = True
    try:
        from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

        from .configuration_angpt import AnGPTConfig
        from .modeling_angpt import AnGPTForCausalLM, AnGPTForSequenceClassification, AnGPTModel

        AutoConfig.register(AnGPTConfig.model_type, AnGPTConfig, exist_ok=True)
        AutoModel.register(AnGPTConfig, AnGPTModel, exist_ok=True)
        AutoModelForCausalLM.register(AnGPTConfig, AnGPTForCausalLM, exist_ok=True)
        AutoModelForSequenceClassification.register(AnGPTConfig, AnGPTForSequenceClassification, exist_ok=True)

        AnGPTConfig.register_for_auto_class()
        AnGPTModel.register_for_auto_class("AutoModel")
        AnGPTForCausalLM.register_for_auto_class("AutoModelForCausalLM")
        AnGPTForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")
    except BaseException:
        _registered = False
        raise


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    register_auto_classes()
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value  # later accesses skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if os.environ.get(DEFER_REGISTRATION) != "1":
    register_auto_classes()
