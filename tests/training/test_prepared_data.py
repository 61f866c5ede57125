"""`angpt prepare` and training on its token shards: every document once, on its side of the split; resumable and
idempotent preparing; exact resume after SIGKILL; one line for each bad input."""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from training_fixtures import REPO, TINY, corpus_files, data_cache, single_thread, write_recipe  # noqa: F401 (fixtures)

from modeling_angpt.commands import CommandError
from modeling_angpt.commands import prepare as prepare_command
from modeling_angpt.commands import train as train_command
from modeling_angpt.data import prepare as prepare_module
from modeling_angpt.data.prepare import prepare_corpus as prepare
from modeling_angpt.training.recipe import load_recipe
from modeling_angpt.data.shards import MANIFEST
from modeling_angpt.data.shards import held_out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Four text files cut from the default corpus (about 160 KB)."""
    return corpus_files(tmp_path_factory.mktemp("corpus"), files=4, chars=40_000)


@pytest.fixture
def recipe_for(write_recipe, corpus):
    def make(**overrides):
        return load_recipe(write_recipe(dataset=str(corpus), **overrides))
    return make


def _documents(recipe):
    """The corpus as training reads it (datasets' text builder, one row per paragraph), with each row's side."""
    from modeling_angpt.data.sources import resolve_source
    from modeling_angpt.data.build import load_texts

    rows = [t for t in load_texts(resolve_source(recipe.dataset), recipe)["text"] if t]
    return [(t + "\n\n", held_out(t, recipe.data_seed, recipe.validation_fraction)) for t in rows]


def _shard_tokens(directory, split):
    manifest = json.loads((directory / MANIFEST).read_text())
    dtype = np.dtype(manifest["dtype"])
    return np.concatenate([np.fromfile(directory / e["file"], dtype=dtype)
                           for e in manifest["shards"] if e["split"] == split])


def test_prepare_writes_each_document_once_on_its_side_and_a_second_run_does_nothing(recipe_for, corpus, tmp_path):
    from transformers import AutoTokenizer

    recipe, out = recipe_for(), tmp_path / "prepared"
    result = prepare(recipe, out, num_proc=2, unit_mb=0.05)
    assert not result.done_already and result.units_written == len(result.manifest["shards"]) // 2 >= 3
    tokenizer = AutoTokenizer.from_pretrained(out / "tokenizer")
    documents = _documents(recipe)
    for split, side in (("train", False), ("val", True)):
        expected = "".join(text for text, held in documents if held == side)
        assert tokenizer.decode(_shard_tokens(out, split).tolist()) == expected          # in corpus order
        assert result.manifest["totals"][split]["documents"] == sum(held == side for _, held in documents)
    assert 0 < result.manifest["totals"]["val"]["documents"] < result.manifest["totals"]["train"]["documents"]
    tokens = sum(t["tokens"] for t in result.manifest["totals"].values())
    assert sum(f.stat().st_size for f in out.glob("*.bin")) == 2 * tokens and result.manifest["dtype"] == "uint16"
    before = {f: f.stat().st_mtime_ns for f in out.rglob("*")}

    began = time.perf_counter()
    again = prepare(recipe, out, num_proc=2)
    assert again.done_already and again.units_written == 0 and time.perf_counter() - began < 2.0
    assert {f: f.stat().st_mtime_ns for f in out.rglob("*")} == before
    assert not list(out.glob(".*"))                                              # no temp or progress files left


def test_an_interrupted_prepare_resumes_at_the_first_unfinished_unit(recipe_for, tmp_path, monkeypatch):
    recipe = recipe_for()
    real = prepare_module.prepare_unit

    def dies_at_unit_two(values, output, unit):
        if unit[0] == 2:
            raise KeyboardInterrupt
        return real(values, output, unit)

    monkeypatch.setattr(prepare_module, "prepare_unit", dies_at_unit_two)
    with pytest.raises(KeyboardInterrupt):
        prepare(recipe, tmp_path / "a", unit_mb=0.05)
    assert not (tmp_path / "a" / MANIFEST).exists() and (tmp_path / "a" / "train-00001.bin").exists()
    monkeypatch.setattr(prepare_module, "prepare_unit", real)
    resumed = prepare(recipe, tmp_path / "a", unit_mb=0.05)
    clean = prepare(recipe, tmp_path / "b", unit_mb=0.05)
    assert resumed.units_written == len(clean.manifest["shards"]) // 2 - 2
    assert resumed.manifest["shards"] == clean.manifest["shards"]                # same files, same sha256


def _prepare_cli(recipe_path, output, capsys, *overrides):
    args = argparse.Namespace(recipe=str(recipe_path), output=str(output), num_proc=1, unit_mb=256.0,
                              override=list(overrides))
    try:
        return prepare_command.run(args), capsys.readouterr().out
    except CommandError as error:
        return 2, str(error)


def test_prepare_refuses_what_it_would_overwrite_or_mix(write_recipe, corpus, tmp_path, capsys):
    recipe_path = write_recipe(dataset=str(corpus))
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    status, message = _prepare_cli(recipe_path, tmp_path / "taken", capsys)
    assert status == 2 and "already holds other files" in message
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"

    changed = tmp_path / "changed"
    shutil.copytree(corpus, changed)
    assert _prepare_cli(recipe_path, tmp_path / "out", capsys, f"dataset={changed}")[0] == 0
    with open(changed / "part0.txt", "a") as f:
        f.write("\n\nA new paragraph.\n")
    status, message = _prepare_cli(recipe_path, tmp_path / "out", capsys, f"dataset={changed}")
    assert status == 2 and "the corpus changed since" in message and "\n" not in message
    status, message = _prepare_cli(recipe_path, tmp_path / "out", capsys, f"dataset={changed}", "data_seed=7")
    assert status == 2 and "another data_seed" in message

    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "nothing.txt").write_text("")
    status, message = _prepare_cli(recipe_path, tmp_path / "out-empty", capsys, f"dataset={tmp_path / 'empty'}")
    assert status == 2 and "empty" in message and "\n" not in message


def _train_cli(recipe_path, capsys, *overrides):
    args = argparse.Namespace(recipe=str(recipe_path), override=list(overrides), resume=False, overwrite=False)
    status = train_command.run(args)
    return status, capsys.readouterr().err.strip()


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, corpus, data_cache):
    values = {**TINY, "dataset": str(corpus), "data_cache_dir": str(data_cache)}
    path = tmp_path_factory.mktemp("recipe") / "recipe.yaml"
    path.write_text(yaml.safe_dump(values))
    out = tmp_path_factory.mktemp("prepared") / "data"
    prepare(load_recipe(path), out, unit_mb=0.05)
    return out


def _damaged_copy(prepared, tmp_path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(prepared, copy)
    return copy


@pytest.mark.parametrize("damage, expected", [
    ("truncate", "the shard is truncated"),
    ("corrupt", "outside the vocabulary"),
    ("version", "version 1"),
    ("tokenizer", "is not the one"),
])
def test_damaged_prepared_data_stops_training_with_one_line(damage, expected, prepared, write_recipe, tmp_path,
                                                             capsys):
    data = _damaged_copy(prepared, tmp_path)
    shard = data / "train-00000.bin"
    if damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:-100])
    elif damage == "corrupt":
        shard.write_bytes(b"\xff" * shard.stat().st_size)
    elif damage == "version":
        manifest = json.loads((data / MANIFEST).read_text())
        (data / MANIFEST).write_text(json.dumps({**manifest, "format_version": 99}))
    else:  # another tokenizer saved where the shards' tokenizer was
        from modeling_angpt.data.tokenizer import train_bpe

        shutil.rmtree(data / "tokenizer")
        train_bpe([["another corpus entirely, " * 50]], 300, data / "tokenizer")
    status, err = _train_cli(write_recipe(), capsys, f"dataset={data}", "max_steps=2", "eval_steps=0")
    assert status == 2 and expected in err and len(err.splitlines()) == 1, err
    assert "Traceback" not in err


def test_a_recipe_naming_another_tokenizer_is_refused(prepared, write_recipe, tmp_path, capsys):
    from modeling_angpt.data.tokenizer import train_bpe

    train_bpe([["some other text " * 100]], 300, tmp_path / "other-tokenizer")
    status, err = _train_cli(write_recipe(), capsys, f"dataset={prepared}", f"tokenizer={tmp_path / 'other-tokenizer'}")
    assert status == 2 and "differs from the tokenizer" in err and len(err.splitlines()) == 1


def test_training_killed_by_sigkill_resumes_with_the_same_losses(prepared, write_recipe, tmp_path):
    from modeling_angpt.training.loop import train

    steps = ["max_steps=8", "save_steps=4", "eval_steps=0", "save_total_limit=0"]
    whole = train(load_recipe(write_recipe(dataset=str(prepared), output_dir=str(tmp_path / "whole")), steps))

    recipe = write_recipe(dataset=str(prepared), output_dir=str(tmp_path / "killed"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "modeling_angpt.cli", "train", str(recipe)]
                            + [f"--override={s}" for s in steps], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    checkpoint = tmp_path / "killed" / "checkpoints" / "step_0000004"
    while not checkpoint.exists() and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL and not (tmp_path / "killed" / "final").exists()
    resumed = train(load_recipe(recipe, steps), resume=True)          # what `angpt train ... --resume` runs
    assert 4 <= resumed.start_step < 8
    assert resumed.losses == whole.losses                             # step for step, bit for bit


def test_a_streamed_corpus_prepares_to_the_same_tokens_one_unit_per_source_file(recipe_for, corpus, tmp_path):
    read = prepare(recipe_for(), tmp_path / "read", unit_mb=0.05)
    streamed = prepare(recipe_for(streaming=True), tmp_path / "streamed")
    assert len(streamed.manifest["shards"]) == 2 * len(list(corpus.iterdir()))      # the source's files are the units
    for split in ("train", "val"):
        assert np.array_equal(_shard_tokens(tmp_path / "read", split), _shard_tokens(tmp_path / "streamed", split))


def test_resuming_with_another_global_batch_is_refused_in_one_line(prepared, write_recipe, tmp_path, capsys):
    """A checkpoint of 2 processes × 8 sequences resumes on 1 process only with 16 per device (or 8 × 2 accumulation
    steps): the global batch decides which blocks each step reads (resume.py)."""
    from modeling_angpt.training.loop import train

    recipe = write_recipe(dataset=str(prepared))
    train(load_recipe(recipe, ["max_steps=4", "save_steps=2", "eval_steps=0"]), stop_after_steps=2)
    state_file = tmp_path / "run" / "checkpoints" / "step_0000002" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    assert state["num_processes"] == 1
    state_file.write_text(json.dumps({**state, "num_processes": 2, "batches": 1}))  # as 2 processes would write it
    (state_file.parent / "checkpoint_complete.json").unlink()  # the edit changed its size: a legacy checkpoint
    state_file.write_text(json.dumps({key: value for key, value in json.loads(state_file.read_text()).items()
                                      if key != "format"}))
    overrides = ["max_steps=4", "save_steps=2", "eval_steps=0"]
    args = argparse.Namespace(recipe=str(recipe), override=overrides, resume=True, overwrite=False)
    assert train_command.run(args) == 2
    err = capsys.readouterr().err.strip()
    assert ("global batch of 16 sequences (8 per device × 2 processes × 1 accumulation steps); this launch gives 8 "
            "sequences" in err and "keep the global batch" in err and len(err.splitlines()) == 1), err
    args.override = overrides + ["gradient_accumulation_steps=2"]
    assert train_command.run(args) == 0


def test_a_second_prepare_from_the_command_line_imports_neither_torch_nor_transformers(prepared, write_recipe,
                                                                                       corpus):
    recipe = write_recipe(dataset=str(corpus))
    code = ("import sys; from angpt_cli import main; status = main(['prepare', sys.argv[1], '--output', sys.argv[2]]); "
            "print(status, 'torch' in sys.modules, 'transformers' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, str(recipe), str(prepared)], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "already holds this corpus prepared" in done.stdout and done.stdout.strip().endswith("0 False False"), done
