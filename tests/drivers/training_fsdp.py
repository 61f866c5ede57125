"""Run by tests/parallel/test_fsdp2.py under `accelerate launch` (2 CPU processes, FSDP2 or none): train from a recipe,
optionally stop early (to resume later), and write what rank 0 saw: the losses, whether parameters were
DTensors, and the largest constraint violation of the gathered weights."""
import json
import sys
from pathlib import Path

import torch

from modeling_angpt.training import load_recipe, train


def main() -> None:
    mode, recipe_path, *overrides = sys.argv[1:]
    recipe = load_recipe(recipe_path, overrides)
    result = train(recipe, resume=mode == "resume", stop_after_steps=None if mode != "stop" else recipe.max_steps // 2)
    acc = result.accelerator
    weights = [p for p in result.model.parameters() if p.ndim == 2]
    dtensor = type(weights[0]).__name__ == "DTensor"
    state = acc.get_state_dict(result.model)  # gathers the shards (every rank must call it)
    if acc.is_main_process:
        worst, unit_error = 0.0, 0.0
        for name, w in state.items():
            if w.ndim == 2:
                worst = max(worst, float(w.float().norm(dim=-1).max()) - 1.0)
                # nGPT: unit norm along d_model, i.e. columns of o_proj/down_proj (dim 0, the sharded one)
                dim = 0 if name.endswith(("o_proj.weight", "down_proj.weight")) else -1
                unit_error = max(unit_error, float((w.float().norm(dim=dim) - 1).abs().max()))
        report = {"losses": result.losses, "dtensor": dtensor, "num_processes": acc.num_processes,
                  "distributed_type": str(acc.distributed_type), "max_row_norm_excess": worst,
                  "max_unit_norm_error": unit_error,
                  "start_step": result.start_step, "step": result.step}
        Path(recipe.output_dir, f"report_{mode}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
