"""Semantic-focus tasks (docs/evaluation.md): every generator's labels against an independent checker written differently
from it, seeded disjoint splits, the fixed tokenizers, and `angpt semantic-focus` end to end (the experiment at
a smoke size: experiments/semantic_focus/)."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from modeling_angpt.evaluation.semantic_focus import TASKS, build_splits, build_tokenizer, generate_samples, get_task

REPO = pathlib.Path(__file__).resolve().parents[2]
NNCH = [name for name in TASKS if name != "listops"]


# --- independent checkers: each recomputes the label another way than task_definitions.py / listops.py ---------
def check_even_pairs(s):  # count the ab/ba transitions (the generator compares first and last)
    return sum(a != b for a, b in zip(s, s[1:])) % 2


def check_parity(s):  # counting (the generator XOR-folds)
    return s.count("1") % 2


def check_cycle_navigation(s):  # sum of the moves mod 5 (the generator walks state by state)
    return sum(int(move) for move in s) % 5


def check_modular_arithmetic(s):  # Python's integer eval of the whole bracket expression (the generator: mod 5 bottom-up)
    return eval("".join(s)) % 5  # noqa: S307 - digits, + - * ( ) only, asserted below


def check_solve_equation(s):  # substitution: the only digit for x that makes the equation hold
    lhs, rhs = "".join(s).split("=")
    solutions = [d for d in range(5) if eval(lhs.replace("x", str(d))) % 5 == int(rhs)]  # noqa: S307
    assert len(solutions) == 1, s
    return solutions[0]


def check_stack_manipulation(s):  # simulate on a string, top at the end
    stack = "".join(t for t in s if t in "01")  # the initial stack precedes every action
    actions = s[len(stack):]
    assert all(a in ("POP", "PUSH_0", "PUSH_1") for a in actions) and actions
    for action in actions:
        stack = stack[:-1] if action == "POP" else stack + action[-1]
    return int(stack[-1]) if stack else 2


def check_missing_duplicates(s):  # s‖s holds an even number of 1s, so the hidden bit is the visible count's parity
    assert s.count("_") == 1
    return s.count("1") % 2


CHECKERS = {"even_pairs": check_even_pairs, "parity": check_parity, "cycle_navigation": check_cycle_navigation,
            "modular_arithmetic": check_modular_arithmetic, "solve_equation": check_solve_equation,
            "stack_manipulation": check_stack_manipulation, "missing_duplicates": check_missing_duplicates}


def parse_listops(tokens):
    """Recursive descent: a tree of (op, [children]) / int, and its depth (root = 1)."""
    position = 0

    def node(depth):
        nonlocal position
        token = tokens[position]
        position += 1
        if token.isdigit():
            return int(token), depth
        children, deepest = [], depth
        while tokens[position] != "]":
            child, child_depth = node(depth + 1)
            children.append(child)
            deepest = max(deepest, child_depth)
        position += 1
        return (token, children), deepest

    tree, depth = node(1)
    assert position == len(tokens)
    return tree, depth


def evaluate_listops(tree):
    import statistics

    if isinstance(tree, int):
        return tree
    op, children = tree
    assert 2 <= len(children) <= 10, len(children)
    values = [evaluate_listops(child) for child in children]
    return {"[MIN": min, "[MAX": max, "[SM": lambda v: sum(v) % 10,
            "[MED": lambda v: int(statistics.median(v))}[op](values)


@pytest.mark.parametrize("task", NNCH)
def test_nnch_labels_match_an_independent_checker(task):
    samples = generate_samples(task, 400, seed=3)
    allowed = set(TASKS[task].symbols)
    for symbols, label in samples:
        assert len(symbols) == 40 and set(symbols) <= allowed
        assert CHECKERS[task](symbols) == label, (task, symbols, label)
    labels = {label for _, label in samples}
    assert labels <= set(range(TASKS[task].num_classes)) and len(labels) >= 2


def test_listops_labels_lengths_depth_and_arguments():
    samples = generate_samples("listops", 40, seed=1)
    for tokens, label in samples:
        assert 501 <= len(tokens) <= 599
        tree, depth = parse_listops(tokens)
        assert depth <= 10
        assert evaluate_listops(tree) == label
    assert len({label for _, label in samples}) >= 5  # 10 classes, several present in 40 samples
    short = generate_samples("listops", 20, seed=1, min_length=21, max_length=40, max_depth=4, max_args=3)
    for tokens, label in short:
        tree, depth = parse_listops(tokens)
        assert 21 <= len(tokens) <= 40 and depth <= 4 and evaluate_listops(tree) == label


@pytest.mark.parametrize("task", TASKS)
def test_splits_are_seeded_disjoint_and_sized(task):
    kwargs = {"min_length": 21, "max_length": 60} if task == "listops" else {}
    first = build_splits(task, seed=7, n_train=60, n_heldout=30, **kwargs)
    again = build_splits(task, seed=7, n_train=60, n_heldout=30, **kwargs)
    other = build_splits(task, seed=8, n_train=60, n_heldout=30, **kwargs)
    assert (len(first["train"]), len(first["heldout"])) == (60, 30)
    assert first["train"].to_dict() == again["train"].to_dict()
    assert first["heldout"].to_dict() == again["heldout"].to_dict()
    assert first["train"]["text"] != other["train"]["text"]
    assert not set(first["train"]["text"]) & set(first["heldout"]["text"])
    assert len(set(first["train"]["text"])) == 60
    assert first["train"].features["label"].num_classes == TASKS[task].num_classes


def test_paper_sizes_and_fixed_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    splits = build_splits("solve_equation", seed=0)  # the paper's 5000 / 2000
    assert (len(splits["train"]), len(splits["heldout"])) == (5000, 2000)
    assert {len(ids) for ids in splits["heldout"]["input_ids"]} == {40}
    tokenizer = build_tokenizer(get_task("solve_equation"))
    assert len(tokenizer) == 2 + len(TASKS["solve_equation"].symbols) and tokenizer.pad_token_id == 0
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    row = splits["train"][0]
    assert loaded(row["text"], add_special_tokens=False)["input_ids"] == row["input_ids"]
    assert loaded.convert_ids_to_tokens(row["input_ids"]) == row["text"].split()
    assert loaded("x ? =", add_special_tokens=False)["input_ids"][1] == loaded.unk_token_id


def test_command_runs_the_protocol_end_to_end_and_refuses_to_overwrite(tmp_path, capsys):
    out = tmp_path / "run"
    angpt = pathlib.Path(sys.executable).with_name("angpt")
    command = [str(angpt)] if angpt.exists() else [sys.executable, "-m", "modeling_angpt.cli"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(command + ["semantic-focus", "--task", "parity", "--epochs", "2", "--n-train", "50",
                                     "--n-heldout", "20", "--num-layers", "2", "--attention-sparsity", "topk",
                                     "--output-dir", str(out), "--threads", "1"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in rows] == [1, 2]
    assert {"train_acc", "heldout_acc", "train_loss", "heldout_loss", "lr"} <= set(rows[0])
    assert rows[1]["lr"] == pytest.approx(0.1 * 0.9995)
    assert (out / "curves.png").stat().st_size > 1000
    assert any((out / "tensorboard").iterdir())
    run = json.loads((out / "run.json").read_text())
    assert run["model_config"]["is_causal"] is False and run["model_config"]["attention_sparsity"] == "topk"
    assert (out / "model" / "tokenizer.json").exists() and (out / "model" / "config.json").exists()

    from modeling_angpt.cli import main

    assert main(["semantic-focus", "--task", "parity", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "already holds results" in err and str(out) in err




@pytest.mark.parametrize("task", [name for name in TASKS if name != "listops"])
def test_length_generalisation_split_trains_up_to_40_and_holds_out_41_to_500(task):
    splits = build_splits(task, seed=3, n_train=120, n_heldout=40, length_generalisation=True)
    train = [len(text.split()) for text in splits["train"]["text"]]
    heldout = [len(text.split()) for text in splits["heldout"]["text"]]
    assert max(train) <= 40 < 41 <= min(heldout) and max(heldout) <= 500
    assert min(train) <= 10 and max(train) >= 35 and max(heldout) - min(heldout) > 200  # lengths spread out
    assert all(n % 2 == 0 for n in train + heldout) or task != "missing_duplicates"
    checker = CHECKERS[task]  # the labels still follow the task's definition at every length
    assert all(checker(text.split()) == label for text, label in zip(splits["heldout"]["text"],
                                                                      splits["heldout"]["label"]))
    with pytest.raises(ValueError, match="ListOps has its own lengths"):
        build_splits("listops", n_train=5, n_heldout=5, length_generalisation=True)


def test_command_offers_the_length_generalisation_split(tmp_path, capsys):
    from modeling_angpt.cli import main

    out = tmp_path / "lg"
    assert main(["semantic-focus", "--task", "parity", "--length-generalisation", "--epochs", "1", "--n-train", "30",
                 "--n-heldout", "10", "--num-layers", "1", "--no-tensorboard", "--output-dir", str(out)]) == 0
    assert json.loads((out / "run.json").read_text())["task_kwargs"] == {"length_generalisation": True}
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["baselines"]) == {"majority_class", "one_position"}
    assert "held-out baselines: majority class" in capsys.readouterr().out
    assert main(["semantic-focus", "--task", "listops", "--length-generalisation", "--output-dir",
                 str(tmp_path / "no")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--length-generalisation is NNCH's split" in err
