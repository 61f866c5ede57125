"""`angpt eval`: bad input is one line and exit 2 before any model loads and without writing anything; the
paper suite fails within seconds without the Hub; the own suites (perplexity, length, needle) are wired in;
every result file carries its provenance and nothing is overwritten."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import types

import pytest
from eval_fixtures import REPO, child_env, eval_env, run_cli, snapshot  # noqa: F401 (fixture)

from modeling_angpt import cli


@pytest.fixture(scope="module")
def broken_checkpoints(eval_env, tmp_path_factory):
    """Directories that are not evaluable checkpoints, each for one reason."""
    checkpoint, corpus, _ = eval_env
    root = tmp_path_factory.mktemp("broken")
    (root / "empty").mkdir()
    shutil.copytree(checkpoint, root / "bad_config")
    (root / "bad_config" / "config.json").write_text('{"model_type": "angpt", "hidden_size": ')
    shutil.copytree(checkpoint, root / "no_weights")
    (root / "no_weights" / "model.safetensors").unlink()
    shutil.copytree(checkpoint, root / "truncated")
    weights = root / "truncated" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    shutil.copytree(checkpoint, root / "moved_corpus")
    metadata = json.loads((checkpoint / "training_metadata.json").read_text())
    metadata["recipe"]["dataset"] = str(root / "corpus_moved_away.txt")
    (root / "moved_corpus" / "training_metadata.json").write_text(json.dumps(metadata))
    (root / "existing").mkdir()
    (root / "existing" / "results.json").write_text("{}")
    return root


def test_bad_inputs_are_one_line_exit_2_no_traceback_nothing_written(eval_env, broken_checkpoints, tmp_path):
    checkpoint, _, cache = eval_env
    broken = broken_checkpoints
    cases = {
        "missing dir": ([tmp_path / "nowhere"], "no such directory"),
        "not a model dir": ([broken / "empty"], "not a model directory (no config.json)"),
        "bad config.json": ([broken / "bad_config"], "config.json: not a valid config"),
        "no weights": ([broken / "no_weights"], "no model.safetensors"),
        "truncated weights": ([broken / "truncated"], "corrupted or truncated safetensors file"),
        "unknown task": ([checkpoint, "--tasks", "hellaswg"], "unknown task 'hellaswg'"),
        "suite as task": ([checkpoint, "--tasks", "offline"], "offline is a suite, use --suite offline"),
        "unknown suite": ([checkpoint, "--suite", "lenght"], "unknown suite 'lenght'"),
        "corpus moved": ([broken / "moved_corpus", "--suite", "perplexity"], "has moved or is gone since training"),
        "no offline corpus": ([checkpoint, "--corpus", tmp_path / "nope.txt"], "corpus text file not found"),
        "negative limit": ([checkpoint, "--limit", "-1"], "--limit -1: expected a positive integer"),
        "zero batch size": ([checkpoint, "--batch-size", "0"], "--batch-size 0: expected a positive integer"),
        "bad lengths": ([checkpoint, "--suite", "length", "--lengths", "1,x"], "--lengths 1,x: expected positive"),
        "result exists": ([checkpoint, "--output-path", broken / "existing"], "results.json exists"),
    }
    before = {name: snapshot(broken / name) for name in os.listdir(broken)} | {"ckpt": snapshot(checkpoint)}
    env = child_env(cache)
    # every case in one fresh interpreter through cli.main (tests/drivers/eval_cli.py: stderr captured at file
    # descriptor 2, escaping exceptions become tracebacks); each separate process would pay ~4 s of imports
    argv = {name: ["eval", *map(str, args)] for name, (args, _) in cases.items()}
    driver = subprocess.run([sys.executable, str(REPO / "tests" / "drivers" / "eval_cli.py"), json.dumps(argv)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert driver.returncode == 0, driver.stderr[-3000:]
    outcomes = json.loads(driver.stdout.strip().splitlines()[-1])
    for name, (_, expected) in cases.items():
        err = outcomes[name]["stderr"]
        assert outcomes[name]["returncode"] == 2, (name, err)
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, (name, err)
        assert err.startswith("angpt eval: ") and expected in err, (name, err)
    # and one case as its own process, through the module entry point
    proc = run_cli(["eval", tmp_path / "nowhere"], cwd=tmp_path, env=env)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"angpt eval: checkpoint {tmp_path / 'nowhere'}: no such directory\n"
    assert os.listdir(tmp_path) == []                               # no eval_results/, nothing else
    after = {name: snapshot(broken / name) for name in os.listdir(broken)} | {"ckpt": snapshot(checkpoint)}
    assert after == before


def test_paper_suite_without_the_hub_fails_within_seconds(eval_env, tmp_path, monkeypatch):
    checkpoint, _, cache = eval_env
    started = time.monotonic()
    proc = run_cli(["eval", checkpoint, "--suite", "paper"], cwd=tmp_path, env=child_env(cache))
    elapsed = time.monotonic() - started
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("angpt eval: task hellaswag needs the Hub dataset Rowan/hellaswag")
    assert "HF_HUB_OFFLINE=1" in line and "--suite offline" in line and "angpt_offline" in line
    assert os.listdir(tmp_path) == []
    assert elapsed < 60, elapsed   # mostly the start-up (torch, transformers); lm-eval alone retried 70 s

    # In-process: no waiting for retries at all (time.sleep is never called), and little work.
    import time as time_module

    from modeling_angpt.evaluation import EvalOptions
    from modeling_angpt.evaluation.runner import EvalInputError, prepare

    def no_sleep(seconds):
        raise AssertionError(f"slept {seconds} s (a retry loop)")

    monkeypatch.setattr(time_module, "sleep", no_sleep)
    cpu = time.process_time()
    with pytest.raises(EvalInputError, match="Rowan/hellaswag"):
        prepare(checkpoint, EvalOptions(suite="paper"))
    assert time.process_time() - cpu < 5


def _fake_suite(name: str, calls: list, error: Exception | None = None):
    def run_suite(model, tokenizer, checkpoint, options, output_dir):
        calls.append({"suite": name, "model": type(model).__name__, "checkpoint": checkpoint, "options": options,
                      "output_dir": output_dir, "vocab": len(tokenizer)})
        if error is not None:
            raise error
        (output_dir / f"{name}.png").write_bytes(b"png")
        return {f"angpt_{name}": {"loss_1x": 1.5, "loss_2x": 2}}

    module = types.ModuleType(f"modeling_angpt.evaluation.{name}")
    module.run_suite = run_suite
    return module


def test_length_and_needle_suites_are_wired_to_their_run_suite(eval_env, tmp_path, monkeypatch, capsys):
    checkpoint, _, _ = eval_env
    calls = []
    for name in ("length", "needle"):
        monkeypatch.setitem(sys.modules, f"modeling_angpt.evaluation.{name}", _fake_suite(name, calls))
    out_dir = tmp_path / "out"
    assert cli.main(["eval", str(checkpoint), "--suite", "length,needle", "--lengths", "1,4", "--limit", "3",
                     "--batch-size", "2", "--seed", "5", "--output-path", str(out_dir)]) == 0
    assert [c["suite"] for c in calls] == ["length", "needle"]
    options = calls[0]["options"]
    from modeling_angpt.evaluation import EvalOptions

    assert type(options) is EvalOptions and calls[0]["model"] == "AnGPTForCausalLM"   # the suites get typed options
    assert (options.lengths, options.batch_size, options.limit, options.seed, options.device, options.dtype,
            options.log_samples) == ([1, 4], 2, 3, 5, "cpu", "auto", False)
    assert calls[0]["checkpoint"] == checkpoint and calls[0]["output_dir"] != out_dir   # staged, then moved
    assert sorted(os.listdir(out_dir)) == ["length.png", "needle.png", "results.json", "results.md"]
    report = json.loads((out_dir / "results.json").read_text())
    assert report["results"]["angpt_length"] == {"loss_1x": 1.5, "loss_2x": 2.0}
    assert "| angpt_needle |" in capsys.readouterr().out

    # a suite's ValueError is the one line of a bad input, and nothing is left behind
    monkeypatch.setitem(sys.modules, "modeling_angpt.evaluation.length", _fake_suite(
        "length", calls, ValueError("--lengths 64: 64 x 256 tokens exceeds max_position_embeddings")))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["eval", str(checkpoint), "--suite", "length", "--lengths", "64"]) == 2
    err = capsys.readouterr().err
    assert err == "angpt eval: --lengths 64: 64 x 256 tokens exceeds max_position_embeddings\n"
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_perplexity_suite_and_the_provenance_of_a_result_file(eval_env, tmp_path, monkeypatch, capsys):
    import contextlib

    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    from modeling_angpt.data.sources import resolve_corpus
    from modeling_angpt.data.build import build_datasets
    from modeling_angpt.training.recipe import recipe_from_dict

    checkpoint, _, _ = eval_env
    monkeypatch.chdir(tmp_path)
    assert cli.main(["eval", str(checkpoint), "--suite", "perplexity", "--seed", "3"]) == 0
    (results,) = list((tmp_path / "eval_results").glob("*/*/results.json"))
    report = json.loads(results.read_text())

    # the same held-out loss, computed here from the recipe in training_metadata.json: training's 2 x 4 blocks
    metadata = json.loads((checkpoint / "training_metadata.json").read_text())
    recipe = recipe_from_dict(metadata["recipe"])
    _, _, val, _ = build_datasets(recipe, resolve_corpus(recipe), contextlib.nullcontext)
    ids = torch.stack([val[i]["input_ids"] for i in range(8)])
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    with torch.no_grad():
        expected = F.cross_entropy(model(ids).logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none").mean()
    heldout = report["results"]["angpt_heldout_loss"]
    assert heldout["sequences"] == 8 and heldout["loss"] == pytest.approx(expected.item(), rel=1e-5)

    # provenance
    weights = hashlib.sha256((checkpoint / "model.safetensors").read_bytes()).hexdigest()
    assert report["checkpoint"] == {"path": str(checkpoint.resolve()), "weights_sha256": weights,
                                    "weight_files": {"model.safetensors": weights}}
    assert report["model_config"] == json.loads((checkpoint / "config.json").read_text())
    assert set(report["versions"]) >= {"angpt", "torch", "transformers", "lm_eval"}
    assert all(report["versions"][k] for k in ("angpt", "torch", "transformers", "lm_eval"))
    assert report["seeds"]["random"] == report["seeds"]["torch"] == 3 and report["options"]["suite"] == ["perplexity"]
    assert (results.parent / "results.md").read_text().count("angpt_heldout_loss") == 1

    # a second run never overwrites the first: a new directory, the old file untouched
    first = results.read_bytes()
    assert cli.main(["eval", str(checkpoint), "--suite", "perplexity", "--limit", "4"]) == 0   # no effect here
    second = [p for p in (tmp_path / "eval_results").glob("*/*/results.json") if p != results]
    assert len(second) == 1 and results.read_bytes() == first
    assert json.loads(second[0].read_text())["results"]["angpt_heldout_loss"] == heldout
