"""Bad inputs fail before any work, with one clear line on stderr and exit status 2."""
import argparse
import subprocess
import sys

import pytest
from training_fixtures import REPO, data_cache, single_thread, write_recipe  # noqa: F401 (fixtures)

from modeling_angpt import AnGPTConfig
from modeling_angpt.commands import train as command


def _run(recipe_path, *overrides):
    args = argparse.Namespace(recipe=str(recipe_path), override=list(overrides), resume=False, overwrite=False)
    return command.run(args)


@pytest.mark.parametrize("overrides, expected", [
    (["dataset=/nonexistent/corpus.txt"], "dataset file not found: /nonexistent/corpus.txt"),
    (["learning_rat=0.1"], "unknown recipe key 'learning_rat' in --override; did you mean learning_rate?"),
    (["architecture=transformer"], "AnGPTConfig.architecture='transformer' is not valid"),
    (["model=angpt-7t"], "model preset 'angpt-7t' not found"),
])
def test_bad_inputs_fail_before_training_with_one_line(overrides, expected, write_recipe, tmp_path, capsys):
    assert _run(write_recipe(), *overrides) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "run").exists()          # nothing was written: no work started


def test_unknown_key_in_the_yaml_names_the_file(write_recipe, capsys):
    assert _run(write_recipe(per_device_batch_size=4)) == 2
    err = capsys.readouterr().err
    assert "unknown recipe key 'per_device_batch_size'" in err and "recipe.yaml" in err


def test_folded_checkpoint_is_refused(write_recipe, tmp_path, capsys):
    AnGPTConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                folded=True).save_pretrained(tmp_path / "folded")
    assert _run(write_recipe(), f"init_from={tmp_path / 'folded'}") == 2
    assert "folded (exported inference) checkpoint" in capsys.readouterr().err


def test_cli_entry_point_reports_a_missing_recipe_file(tmp_path):
    # as the `angpt` console script starts (angpt_cli.py): the check runs before torch or transformers is imported
    entry = "import sys; from angpt_cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", entry, "train", str(tmp_path / "nope.yaml")],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"angpt train: error: recipe file not found: {tmp_path / 'nope.yaml'}"
