"""Run by tests/parallel/test_multi_machine.py on each machine of a multi-machine `accelerate launch`
(configuration/accelerate/cpu_2machines.yaml): train from a recipe, or stop after its first checkpoint, or resume,
and then every rank writes what it saw: the machine it ran on (torchrun's GROUP_RANK), its ranks, the losses and a
hash of its parameters' bytes."""
import hashlib
import json
import os
import sys
from pathlib import Path

from modeling_angpt.training import load_recipe, train


def main() -> None:
    mode, recipe_path, *overrides = sys.argv[1:]
    recipe = load_recipe(recipe_path, overrides)
    result = train(recipe, resume=mode == "resume", stop_after_steps=recipe.save_steps if mode == "stop" else None)
    acc = result.accelerator
    digest = hashlib.sha256()
    for name, param in sorted(result.model.state_dict().items()):
        digest.update(name.encode())
        digest.update(param.detach().cpu().contiguous().numpy().tobytes())
    report = {"machine": int(os.environ["GROUP_RANK"]), "rank": acc.process_index,
              "local_rank": acc.local_process_index, "num_processes": acc.num_processes,
              "distributed_type": str(acc.distributed_type), "backend": str(acc.state.backend),
              "losses": result.losses, "start_step": result.start_step, "step": result.step,
              "param_sha256": digest.hexdigest()}
    Path(recipe.output_dir, f"report_{mode}_rank{acc.process_index}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
