"""Run by tests/test_training_distributed.py under `accelerate launch` with configuration/accelerate/cpu_2proc.yaml:
train from a recipe, then every rank writes what it holds (its rank, the process count, a hash of its
parameters' bytes) so the test can check that two ranks really ran and ended bit-identical."""
import hashlib
import json
import sys
from pathlib import Path

from modeling_angpt.training import load_recipe, train


def main() -> None:
    recipe = load_recipe(sys.argv[1], sys.argv[2:])
    result = train(recipe)
    acc = result.accelerator
    digest = hashlib.sha256()
    for name, param in sorted(result.model.state_dict().items()):
        digest.update(name.encode())
        digest.update(param.detach().cpu().contiguous().numpy().tobytes())
    report = {"rank": acc.process_index, "num_processes": acc.num_processes,
              "distributed_type": str(acc.distributed_type), "backend": str(acc.state.backend),
              "param_sha256": digest.hexdigest(), "losses": result.losses, "steps": result.step}
    Path(recipe.output_dir, f"rank{acc.process_index}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
