"""Training anGPT, nGPT and GPT+ (docs/architectures.md recipes) over accelerate, datasets and tokenizers.

    from modeling_angpt.training import load_recipe, train
    result = train(load_recipe("configuration/recipes/demo_cpu.yaml", ["max_steps=100"]))

Importing this package needs the [train] extra only for `train`; the Trainer callback needs only
transformers. The names below are imported on first use, so `modeling_angpt.training.recipe` (what
`angpt train` validates a recipe with) loads without torch.
"""
import importlib

_EXPORTS = {"WeightConstraintCallback": ".callbacks", "NonFiniteLossError": ".loop", "TrainResult": ".loop",
            "train": ".loop", "prepare_corpus": "..data.prepare", "compile_blocks": ".model_setup", "Recipe": ".recipe",
            "load_recipe": ".recipe"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
