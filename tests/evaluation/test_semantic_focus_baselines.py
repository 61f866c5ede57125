"""The trivial baselines every semantic-focus result carries (evaluation/semantic_focus/baselines.py): the majority
class and the best one-position rule, on the held-out split."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from modeling_angpt.evaluation.semantic_focus import TASKS, generate_samples
from modeling_angpt.evaluation.semantic_focus.baselines import trivial_baselines
from modeling_angpt.evaluation.semantic_focus.protocol import ProtocolSettings, run_protocol


def test_one_position_rule_finds_the_position_that_decides_the_label():
    rng = random.Random(0)
    rows = [[rng.choice("abc") for _ in range(rng.randint(4, 9))] for _ in range(600)]
    data = [(row, {"a": 0, "b": 1, "c": 1}[row[-2]]) for row in rows]  # label: the second-to-last symbol
    result = trivial_baselines(data[:400], data[400:])
    assert result["one_position"] == {"position": -2, "train_acc": 1.0, "heldout_acc": 1.0}
    labels = Counter(label for _, label in data[:400])
    assert result["majority_class"]["label"] == labels.most_common(1)[0][0] == 1
    assert result["majority_class"]["heldout_acc"] == sum(label == 1 for _, label in data[400:]) / 200


def test_stack_manipulation_one_position_rule_is_the_last_action_shortcut():
    samples = generate_samples("stack_manipulation", 3000, seed=1)
    train, heldout = samples[:2000], samples[2000:]
    result = trivial_baselines(train, heldout)
    # the shortcut written out: a final PUSH_s answers s, a final POP the commonest label after a final POP
    after_pop = Counter(label for symbols, label in train if symbols[-1] == "POP").most_common(1)[0][0]
    shortcut = sum((symbols[-1][-1] if symbols[-1] != "POP" else str(after_pop)) == str(label)
                   for symbols, label in heldout) / len(heldout)
    assert result["one_position"]["position"] in (39, -1)
    assert result["one_position"]["heldout_acc"] == pytest.approx(shortcut)
    assert shortcut > result["majority_class"]["heldout_acc"] + 0.25  # ~0.83 against ~0.50


@pytest.mark.parametrize("task", sorted(TASKS))
def test_every_task_result_carries_its_baselines(task):
    kwargs = {"min_length": 30, "max_length": 60, "max_depth": 3} if task == "listops" else {}
    summary = run_protocol(ProtocolSettings(task, None, epochs=0, n_train=60, n_heldout=30, task_kwargs=kwargs,
                                            model=dict(num_layers=1)), log=lambda _: None)
    baselines = summary["baselines"]
    assert set(baselines) == {"majority_class", "one_position"}
    assert 0.0 <= baselines["majority_class"]["heldout_acc"] <= 1.0
    assert 0.0 <= baselines["one_position"]["heldout_acc"] <= 1.0
    assert baselines["one_position"]["train_acc"] >= max(Counter(
        label for _, label in generate_samples(task, 60, 0, **kwargs)).values()) / 60  # never below the majority
