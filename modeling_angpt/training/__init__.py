"""Training anGPT, nGPT and GPT+ (SPEC.md §1 recipes) over accelerate, datasets and tokenizers.

    from modeling_angpt.training import load_recipe, train
    result = train(load_recipe("configuration/recipes/demo_cpu.yaml", ["max_steps=100"]))

Importing this package needs the [train] extra only for `train`; the Trainer callback needs only
transformers.
"""
from .callbacks import WeightConstraintCallback
from .loop import NonFiniteLossError, TrainResult, train
from .model_setup import compile_blocks
from .recipe import Recipe, load_recipe

__all__ = ["NonFiniteLossError", "Recipe", "TrainResult", "WeightConstraintCallback", "compile_blocks", "load_recipe",
           "train"]
