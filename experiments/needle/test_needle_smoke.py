"""The needle experiment runs end to end at a smoke size on the length-generalisation models (trained first, as the
script does), and its diagnostics are checked on made-up answers and logs. Every output goes under tmp_path, never
into the study folders."""
from __future__ import annotations

import json

import pytest
from experiments.smoke_arguments import TINY, needle_recipe


def test_length_generalisation_and_needle_smoke(experiment, tmp_path):
    out, results, corpus, recipe = experiment
    import needle  # puts the length-generalisation folder on the path
    import length_generalisation

    models = [*TINY, "--length", "256", "--batch", "2", "--steps", "2", "--variants", "RoPE",
              "scale-invariant p-RoPE", "--dataset", str(corpus), "--recipe", str(recipe),
              "--output-dir", str(tmp_path / "runs")]
    length_generalisation.main([*models, "--windows", "1", *out])
    needle.main([*models, "--ft-steps", "2", "--ft-batch", "2", "--examples", "1", "--needle-recipe",
                 str(needle_recipe(tmp_path)), *out])
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


def test_split_digits_models_get_their_own_tokenizer_sections_and_are_never_mixed_with_others(experiment, tmp_path):
    """--split-digits: the base models' tokenizer gives every digit its own token, the length and needle sections
    and plots are written beside the default ones, and a directory of models trained either way is refused for
    the other way (a checkpoint from before the recipe key existed counts as trained without it)."""
    out, results, corpus, recipe = experiment
    import needle  # puts the length-generalisation folder on the path
    import length_generalisation
    from transformers import AutoTokenizer

    models = [*TINY, "--length", "256", "--batch", "2", "--steps", "1", "--variants", "NoPE", "--windows", "1",
              "--dataset", str(corpus), "--recipe", str(recipe)]
    length_generalisation.main([*models, "--output-dir", str(tmp_path / "plain"), *out])
    length_generalisation.main([*models, "--output-dir", str(tmp_path / "digits"), "--split-digits", *out])
    needle.main([*models, "--output-dir", str(tmp_path / "digits"), "--split-digits", "--ft-steps", "1",
                 "--ft-batch", "2", "--examples", "1", "--needle-recipe", str(needle_recipe(tmp_path)), *out])
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


def test_first_seed_trains_the_model_a_run_of_more_seeds_trains(experiment, tmp_path):
    """--seeds 1 --first-seed 1 trains seed 1 alone, into the directory and with the result that seed 1 of --seeds 2
    has (so a later session can add a seed), and the sections name the seeds they hold."""
    out, results, corpus, recipe = experiment
    import needle  # puts the length-generalisation folder on the path
    import length_generalisation

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
    needle.main([*models, "--seeds", "1", "--first-seed", "1", "--output-dir", str(tmp_path / "later"),
                 "--ft-steps", "1", "--ft-batch", "2", "--examples", "1", "--needle-recipe",
                 str(needle_recipe(tmp_path)), *out])
    section = results.read_text().split("<!-- needle:start -->")[1]
    assert "seeds [1])" in section and "| RoPE | 1 |" in section and "| RoPE | 0 |" not in section
    assert (tmp_path / "later" / "rope-s1" / "needle_finetune" / "final").is_dir()
    with pytest.raises(SystemExit, match="--first-seed -1: expected 0 or a positive integer"):
        length_generalisation.main([*models, "--first-seed", "-1", *out])


def test_needle_recall_diagnostics(experiment, tmp_path):
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


def test_needle_accuracy_by_distance_from_the_question(experiment, tmp_path):
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


def test_needle_finetune_curve(experiment, tmp_path):
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
