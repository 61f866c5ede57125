"""The offline lm-eval tasks (eval/tasks/angpt_offline): the same numbers from the lm_eval CLI, HFLM in-process
and `angpt eval`; data deterministic for a seed, cached, held out, and the cloze answer really the next sentence."""
from __future__ import annotations

import contextlib
import glob
import json
import subprocess
import sys

import pytest
from eval_fixtures import REPO, child_env, eval_env  # noqa: F401 (fixture)

from modeling_angpt.evaluation import offline_data

TASKS = list(offline_data.TASKS)
LIMIT = 6


def _values(lm_eval_results: dict) -> dict:
    """{task: {metric: value}} of lm-eval's results section (no stderr, alias or sample_len)."""
    return {task: {k: v for k, v in metrics.items()
                   if isinstance(v, float) and "stderr" not in k}
            for task, metrics in lm_eval_results.items() if task in TASKS}


# lm-eval's command line as docs/evaluation.md gives it, beside two more routes: about 40 s of two interpreters,
# with the docs' commands (make test-docs), out of make test's 4 minutes
@pytest.mark.docs_commands
def test_lm_eval_cli_hflm_and_angpt_eval_give_the_same_numbers(eval_env, tmp_path):
    checkpoint, corpus, cache = eval_env
    offline_data.task_files(corpus)      # build once; the three routes read the same cached files
    env = child_env(cache)
    cli = subprocess.Popen(
        [sys.executable, "-m", "lm_eval", "--model", "hf",
         "--model_args", f"pretrained={checkpoint},trust_remote_code=True", "--include_path", "eval/tasks",
         "--tasks", ",".join(TASKS), "--limit", str(LIMIT), "--batch_size", "4", "--device", "cpu",
         "--metadata", json.dumps({"corpus": str(corpus)}), "--output_path", str(tmp_path / "lm_eval")],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    front_door = subprocess.Popen(
        [sys.executable, "-m", "modeling_angpt.cli", "eval", str(checkpoint), "--tasks", ",".join(TASKS),
         "--limit", str(LIMIT), "--batch-size", "4", "--device", "cpu", "--corpus", str(corpus), "--log-samples",
         "--output-path", str(tmp_path / "angpt")],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(checkpoint, trust_remote_code=True)
    lm = HFLM(pretrained=model, tokenizer=AutoTokenizer.from_pretrained(checkpoint), batch_size=4)
    manager = TaskManager(include_path=str(REPO / "eval" / "tasks"), include_defaults=False,
                          metadata={"corpus": str(corpus)})
    in_process = _values(simple_evaluate(model=lm, tasks=TASKS, limit=LIMIT, task_manager=manager,
                                         bootstrap_iters=0)["results"])

    out, err = cli.communicate(timeout=600)
    assert cli.returncode == 0, err[-3000:]
    (cli_file,) = glob.glob(str(tmp_path / "lm_eval" / "**" / "results_*.json"), recursive=True)
    from_cli = _values(json.loads(open(cli_file).read())["results"])
    out, err = front_door.communicate(timeout=600)
    assert front_door.returncode == 0, err[-3000:]
    report = json.loads((tmp_path / "angpt" / "results.json").read_text())
    from_angpt = _values(report["lm_eval"]["results"])

    assert set(in_process) == set(TASKS)
    assert {m for t in in_process.values() for m in t} == {
        "acc,none", "acc_norm,none", "perplexity,none", "word_perplexity,none", "byte_perplexity,none",
        "bits_per_byte,none"}
    for task in TASKS:
        for metric, value in in_process[task].items():
            assert from_cli[task][metric] == pytest.approx(value, rel=1e-9, abs=1e-12), (task, metric)
            assert from_angpt[task][metric] == pytest.approx(value, rel=1e-9, abs=1e-12), (task, metric)
    # the front door's own summary, table and per-sample logs
    assert report["results"]["angpt_cloze"]["acc"] == from_angpt["angpt_cloze"]["acc,none"]
    assert all(len(report["samples"][task]) == LIMIT for task in TASKS)
    assert "| angpt_cloze |" in out and (tmp_path / "angpt" / "results.md").is_file()


def _sentence_end(text: str) -> int:
    """Index just past the first sentence end of text: . ! or ? (repeated, then closing quotes or brackets)
    followed by whitespace or the end of the text. Written as a scan, independently of the generator's regex."""
    i = 0
    while i < len(text):
        if text[i] in ".!?":
            j = i + 1
            while j < len(text) and text[j] in ".!?'\")]’”":
                j += 1
            if j == len(text) or text[j].isspace():
                return j
            i = j
        else:
            i += 1
    return -1


def test_cloze_answer_is_the_next_sentence_and_lastword_the_last_word(eval_env):
    _, corpus, _ = eval_env
    text = corpus.read_text()
    files = offline_data.task_files(corpus)["files"]
    cloze = [json.loads(line) for line in open(files["angpt_cloze"])]
    assert len(cloze) >= 100
    for row in cloze:
        context, choices, label = row["context"], row["choices"], row["label"]
        true = choices[label]
        position = text.find(context + true)
        assert position >= 0, row
        after = text[position + len(context):]
        lead = len(after) - len(after.lstrip())
        assert lead > 0 and _sentence_end(context[-3:] + " ") > 0   # the context ends a sentence
        assert true == after[: lead + _sentence_end(after[lead:])]  # the whole next sentence, nothing more
        for k, choice in enumerate(choices):
            assert choice[:lead] == after[:lead]                     # one separator for every choice
            if k != label:
                assert choice != true and choice[lead:] in text       # a real sentence from elsewhere
    labels = [row["label"] for row in cloze]
    assert len(set(labels)) == offline_data.N_CHOICES               # the answer is not always in one place

    lastword = [json.loads(line) for line in open(files["angpt_lastword"])]
    for row in lastword:
        word = row["target"].strip()
        assert row["target"][0].isspace() and word.replace("'", "").isalpha()
        position = text.find(row["context"] + row["target"])
        assert position >= 0, row
        rest = text[position + len(row["context"]) + len(row["target"]):]
        end = _sentence_end(rest)
        assert end >= 0 and not any(c.isalnum() for c in rest[:end])  # only the final punctuation follows

    rolling = [json.loads(line) for line in open(files["angpt_rolling_perplexity"])]
    assert rolling and all(row["text"] in text for row in rolling)


def test_offline_data_are_deterministic_for_a_seed_and_cached(eval_env, tmp_path, monkeypatch):
    _, corpus, _ = eval_env
    monkeypatch.setenv("ANGPT_EVAL_CACHE", str(tmp_path / "a"))
    first = offline_data.task_files(corpus, 5)
    assert first["built"]
    stamps = {task: (tmp_path / "a" / path).stat().st_mtime_ns for task, path in first["files"].items()}
    again = offline_data.task_files(corpus, 5)
    assert not again["built"] and again["files"] == first["files"]
    assert stamps == {task: (tmp_path / "a" / path).stat().st_mtime_ns for task, path in again["files"].items()}

    monkeypatch.setenv("ANGPT_EVAL_CACHE", str(tmp_path / "b"))
    elsewhere = offline_data.task_files(corpus, 5)
    assert elsewhere["built"]
    for task in TASKS:
        assert open(elsewhere["files"][task], "rb").read() == open(first["files"][task], "rb").read()
    other_seed = offline_data.task_files(corpus, 6)
    assert open(other_seed["files"]["angpt_cloze"], "rb").read() != open(first["files"]["angpt_cloze"], "rb").read()
    # what lm-eval receives through custom_dataset: the cached rows, in order
    dataset = offline_data.load_task("angpt_cloze", corpus=str(corpus), data_seed=5, pretrained="ignored")
    assert dataset["test"].to_list() == [json.loads(line) for line in open(first["files"]["angpt_cloze"])]
    assert not list((tmp_path / "b").glob(".*tmp*"))   # atomic writes leave no temporary files


def test_recipe_corpus_draws_only_on_the_validation_split(eval_env, tmp_path):
    import yaml

    from modeling_angpt.data.sources import resolve_corpus
    from modeling_angpt.data.build import build_datasets
    from modeling_angpt.training.recipe import load_recipe

    checkpoint, corpus, _ = eval_env
    recipe_path = tmp_path / "recipe.yaml"
    recipe_path.write_text(yaml.safe_dump({"dataset": str(corpus), "tokenizer": str(checkpoint), "block_size": 32,
                                           "validation_fraction": 0.2, "data_seed": 7,
                                           "data_cache_dir": str(tmp_path / "data")}))
    files = offline_data.task_files(recipe_path, 3)["files"]
    recipe = load_recipe(recipe_path)
    tokenizer, train, val, _ = build_datasets(recipe, resolve_corpus(recipe), contextlib.nullcontext)
    # the training text, block by block (joined by a character no item contains)
    training_text = "\0".join(tokenizer.decode(block, clean_up_tokenization_spaces=False) for block in train.blocks)
    cloze = [json.loads(line) for line in open(files["angpt_cloze"])]
    lastword = [json.loads(line) for line in open(files["angpt_lastword"])]
    assert cloze and lastword
    for row in cloze:
        assert row["context"] + row["choices"][row["label"]] not in training_text
    for row in lastword:
        assert row["context"] + row["target"] not in training_text


def test_default_corpus_is_the_demo_recipes_validation_split():
    spec = offline_data.resolve_corpus(None)
    assert spec.kind == "recipe" and spec.path.name == "demo_cpu.yaml" and "Shakespeare" in spec.description
    with pytest.raises(FileNotFoundError, match="corpus text file not found"):
        offline_data.resolve_corpus("/nonexistent/heldout.txt")


@pytest.mark.slow
def test_demo_corpus_builds(tmp_path, monkeypatch):
    monkeypatch.setenv("ANGPT_EVAL_CACHE", str(tmp_path))
    info = offline_data.task_files(None)
    counts = {task: sum(1 for _ in open(path)) for task, path in info["files"].items()}
    assert counts["angpt_cloze"] > 1000 and counts["angpt_lastword"] > 1000 and counts["angpt_rolling_perplexity"] > 300
