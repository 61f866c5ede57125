"""Needle in a haystack (docs/evaluation.md): the scorer, the generator (checked by a regex over the
haystack, written apart from the generator), the fine-tuning recipe with its answer-only loss, and the evaluation
at 1×, 4× and 16× through the Python API and the lm-eval task."""
import json
import re
import warnings
from pathlib import Path

import pytest
import torch
from evallong_fixtures import tiny_checkpoint  # noqa: F401 (fixture)
from training_fixtures import data_cache, single_thread  # noqa: F401 (fixtures)

from modeling_angpt.evaluation import EvalOptions, needle
from modeling_angpt.tasks.needle import (QUESTION, NeedleGenerator, check_room, exact_match, filler_from_blocks,
                                             independent_depth_length, minimum_length, score_answer,
                                             training_features)

REPO = Path(__file__).resolve().parents[2]
TRAIN_LENGTH = 192  # three needles, question and answer take ~176 tokens of the tests' 512-token BPE
CITIES, NUMBERS = ("Oslo", "Lima", "Kyoto"), ("1234567", "7654321", "5550123")


@pytest.mark.parametrize("answer,score", [
    ("Oslo=1234567;Lima=7654321;Kyoto=5550123", 1.0),
    (" Oslo = 1234567 ; Lima=7654321;Kyoto=5550123;\nmore text", 1.0),   # spaces, trailing ';', stops at newline
    ("Kyoto=5550123;Oslo=1234567;Lima=7654321", 1.0),                     # reordered
    ("Lima=7654321;Oslo=1234567", 2 / 3),                                  # partial
    ("Oslo=1234567;Lima=7654000;Kyoto=5550123", 2 / 3),                   # right city, wrong number
    ("Oslo=1234567;Lima=5550123;Kyoto=7654321", 1 / 3),                   # numbers swapped between cities
    ("Paris=1234567;Rome=7654321;Tokyo=5550123", 0.0),                    # right numbers, wrong cities
    ("oslo=1234567", 0.0),                                                 # city case matters
    ("", 0.0), ("   ", 0.0), ("\nOslo=1234567", 0.0),                     # empty (the answer is the first line)
    ("the numbers are 1234567 and 7654321", 0.0),                          # garbage
    ("Numbers: Oslo=1234567;Lima=7654321;Kyoto=5550123", 0.0),            # no pair at the start
    ("Oslo=1234567;Lima=7654321;Kyoto=5550123.", 1.0),                    # trailing punctuation
    ("Oslo=1234567;Lima=7654321;Kyoto=5550123. These are the numbers.", 1.0),  # text after the last pair
    ("Oslo=1234567;Lima=7654321;Kyoto=5550124", 2 / 3),                   # one wrong digit
    ("Oslo=1234567 Lima=7654321 Kyoto=5550123", 1 / 3),                   # pairs read up to the missing ';'
    ("Oslo=1234567Lima=7654321;Kyoto=5550123", 1 / 3),
    ("Oslo=1234567;;Kyoto=5550123", 1 / 3),                                # up to the empty pair
    ("Oslo:1234567;Lima:7654321;Kyoto:5550123", 0.0),                     # wrong pair syntax
    ("Oslo=1234567;Lima=7654321;Kyoto=5550123;Rome=1111111", 0.0),        # extra needle
    ("Oslo=1234567;Oslo=7654321;Kyoto=5550123", 0.0),                     # a city twice
])
def test_scorer(answer, score):
    assert score_answer(answer, CITIES, NUMBERS) == pytest.approx(score)


@pytest.mark.parametrize("answer,match", [
    ("Oslo=1234567;Lima=7654321;Kyoto=5550123", 1.0), ("  Oslo=1234567;Lima=7654321;Kyoto=5550123 \nmore", 1.0),
    ("Kyoto=5550123;Oslo=1234567;Lima=7654321", 0.0),                     # every needle found, not the target string
    ("Oslo=1234567;Lima=7654321;Kyoto=5550123.", 0.0), ("Oslo=1234567; Lima=7654321;Kyoto=5550123", 0.0)])
def test_exact_match_is_a_string_match(answer, match):
    assert exact_match(answer, "Oslo=1234567;Lima=7654321;Kyoto=5550123") == match


NEEDLE_RE = re.compile(r"^The special magic (\w+) number is (\d{7})\.$", re.MULTILINE)


@pytest.fixture(scope="module")
def generator(tiny_checkpoint):  # noqa: F811
    from transformers import AutoTokenizer

    from modeling_angpt.evaluation.long_context import held_out_blocks

    directory = tiny_checkpoint(TRAIN_LENGTH)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    blocks, _ = held_out_blocks(directory, TRAIN_LENGTH)
    return NeedleGenerator(filler_from_blocks(tokenizer, blocks), tokenizer), tokenizer


@pytest.mark.parametrize("length", [TRAIN_LENGTH, 4 * TRAIN_LENGTH])
def test_generator_places_three_needles_where_it_says(generator, length):
    gen, tokenizer = generator
    examples = gen.examples(length, 12, seed=7)
    again = NeedleGenerator("\n".join(gen.units), tokenizer).examples(length, 12, seed=7)
    assert examples == again                                               # a function of (text, seed, index)
    assert examples != gen.examples(length, 12, seed=8)
    assert len({e.target for e in examples}) == 12
    for example in examples:
        assert example.prompt.endswith(QUESTION) and example.tokens <= length
        haystack = example.prompt[: -len(QUESTION)]
        found = NEEDLE_RE.findall(haystack)
        assert len(found) == 3 and len({city for city, _ in found}) == 3
        assert example.target == ";".join(f"{c}={n}" for c, n in found)   # order of appearance
        assert (example.cities, example.numbers) == tuple(zip(*found))
        # Realised depth = share of the filler's characters before the needle: recompute it from the haystack.
        lines = haystack.split("\n")
        filler = "\n".join(line for line in lines if not NEEDLE_RE.match(line))
        for match, depth in zip(NEEDLE_RE.finditer(haystack), example.depths):
            before = "\n".join(line for line in haystack[: match.start()].split("\n") if not NEEDLE_RE.match(line))
            assert len(before.rstrip("\n")) / max(len(filler), 1) == pytest.approx(depth, abs=1e-9)
        assert len(filler) > (0 if length == TRAIN_LENGTH else 1000)
        features = training_features(example, tokenizer, length)
        tokens = torch.tensor(features["input_ids"])
        answer = torch.tensor(features["labels"]) != -100
        assert answer.sum() == example.tokens - len(tokenizer(example.prompt)["input_ids"])
        assert tokenizer.decode(tokens[answer]) == f" {example.target}\n"  # loss on the answer only
        assert len(tokens) == length
    depths = [d for e in gen.examples(length, 60, seed=1) for d in e.depths]
    assert 0.35 < sum(depths) / len(depths) < 0.65 and min(depths) < 0.15 and max(depths) > 0.85  # uniform-ish


def test_needle_like_filler_lines_are_dropped(generator):
    gen, tokenizer = generator
    lines = gen.units[:400]
    lures = ["The special magic Paris number is 1234567.", "What are the special magic numbers? Some say none.",
             "And here the SPECIAL   MAGIC Oslo number is 7654321, they say."]
    text = "\n".join(line for i, line in enumerate(lines) for line in ([line, lures[i % 3]] if i % 4 == 0 else [line]))
    examples = NeedleGenerator(text, tokenizer).examples(4 * TRAIN_LENGTH, 20, seed=5)
    for example in examples:
        haystack = example.prompt[: -len(QUESTION)]
        assert len(NEEDLE_RE.findall(haystack)) == 3 and len(re.findall("special magic", haystack, re.I)) == 3


def test_short_lengths_warn_with_the_length_that_places_needles_independently(generator):
    tokenizer = generator[1]
    needed = independent_depth_length(tokenizer)
    assert needed == 2 * minimum_length(tokenizer)
    with pytest.warns(UserWarning, match=rf"length {TRAIN_LENGTH} leaves .* at least {needed} tokens"):
        check_room(tokenizer, TRAIN_LENGTH)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_room(tokenizer, needed)


def test_generator_refuses_a_length_without_room_for_the_needles(generator):
    with pytest.raises(ValueError, match=r"a needle example needs at least \d+ tokens .* length 64 is too short"):
        generator[0].example(64, 0, 0)
    tokenizer = generator[1]
    minimum = minimum_length(tokenizer)
    assert 150 < minimum <= TRAIN_LENGTH
    check_room(tokenizer, minimum)
    with pytest.raises(ValueError, match=rf"needle examples take up to {minimum} tokens before any filler .*; "
                                         rf"block_size {minimum - 1} is too short"):
        check_room(tokenizer, minimum - 1, "block_size")


def options(**values):
    return EvalOptions(**{**dict(limit=1, seed=0, device="cpu", log_samples=True), **values})


def test_finetune_recipe_trains_on_answers_then_evaluates_at_1_4_16x(tiny_checkpoint, data_cache,  # noqa: F811
                                                                     tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from modeling_angpt.training import load_recipe, train
    from modeling_angpt.training.loop import build_run, preflight

    pretrained = tiny_checkpoint(TRAIN_LENGTH)
    overrides = [f"init_from={pretrained}", f"output_dir={tmp_path / 'run'}", f"block_size={TRAIN_LENGTH}",
                 f"data_cache_dir={data_cache}", "max_corpus_chars=200000", "max_steps=3", "bf16=false",
                 "per_device_train_batch_size=2", "eval_steps=3", "eval_max_batches=1", "save_steps=0",
                 "needle_examples=40", "report_to=[none]", "disable_tqdm=true"]
    recipe = load_recipe(REPO / "configuration" / "recipes" / "needle_finetune.yaml", overrides)
    assert recipe.dataset_kind == "needle" and recipe.init_from == str(pretrained)
    run = build_run(recipe, *preflight(recipe, resume=False)[:2])
    batch = next(iter(run.train_dl))
    labels, ids = batch["labels"], batch["input_ids"]
    assert ids.shape == labels.shape == (2, TRAIN_LENGTH)
    for row_ids, row_labels in zip(ids, labels):
        kept = row_labels != -100
        assert torch.equal(row_labels[kept], row_ids[kept])
        answer = run.tokenizer.decode(row_ids[kept])
        assert re.fullmatch(r" (\w+=\d{7};){2}\w+=\d{7}\n", answer)
        assert run.tokenizer.decode(row_ids[:int(kept.nonzero()[0])]).endswith(QUESTION)  # all before: prompt, no loss

    result = train(recipe)
    assert len(result.losses) == 3 and all(torch.isfinite(torch.tensor(result.losses)))
    final = result.final_dir
    assert json.loads((final / "training_metadata.json").read_text())["recipe"]["dataset_kind"] == "needle"
    model = AutoModelForCausalLM.from_pretrained(final).eval()
    tokenizer = AutoTokenizer.from_pretrained(final)
    metrics = needle.run_suite(model, tokenizer, final, options(), tmp_path / "out")
    assert list(metrics) == ["needle_x1", "needle_x4", "needle_x16"]
    assert [metrics[k]["tokens"] for k in metrics] == [TRAIN_LENGTH, 4 * TRAIN_LENGTH, 16 * TRAIN_LENGTH]
    assert all(0.0 <= row["needles_found"] <= 1.0 and row["examples"] == 1 for row in metrics.values())
    saved = json.loads((tmp_path / "out" / "needle.json").read_text())
    sample = saved["samples"]["needle_x16"][0]
    assert sample["tokens"] <= 16 * TRAIN_LENGTH and sample["needles_found"] == score_answer(
        sample["answer"], *zip(*(pair.split("=") for pair in sample["target"].split(";"))))
    assert sample["exact_match"] == float(sample["answer"].strip() == sample["target"])
    assert "| 16× |" in (tmp_path / "out" / "needle.md").read_text()


def test_suite_refuses_a_training_length_without_room_before_loading_the_model(tiny_checkpoint):  # noqa: F811
    directory = tiny_checkpoint(TRAIN_LENGTH)
    needle.preflight(directory, options())
    needle.preflight(directory, options(train_length=TRAIN_LENGTH))
    # another training length would re-split the corpus: held-out blocks of 64 overlap the training blocks of 192
    with pytest.raises(ValueError, match=rf"train_length=64 contradicts .*training_metadata.json \(block_size "
                                         rf"{TRAIN_LENGTH}\); held-out text split at another length overlaps"):
        needle.preflight(directory, options(train_length=64, lengths="1,4"))
    from transformers import AutoTokenizer
    with pytest.raises(ValueError, match=r"train_length=256 contradicts"):  # the lm-eval task's metadata alike
        needle.needle_documents(directory, AutoTokenizer.from_pretrained(directory), 1, 2, 0, train_length=256)


def test_needle_recipe_refuses_another_length_than_the_checkpoints(tiny_checkpoint, data_cache, tmp_path):  # noqa: F811
    from modeling_angpt.training import load_recipe, train

    recipe = load_recipe(REPO / "configuration" / "recipes" / "needle_finetune.yaml", [
        f"init_from={tiny_checkpoint(TRAIN_LENGTH)}", f"output_dir={tmp_path}", "block_size=256",
        f"data_cache_dir={data_cache}", "max_corpus_chars=200000", "bf16=false"])
    with pytest.raises(ValueError, match=rf"block_size=256 differs from the training length {TRAIN_LENGTH}"):
        train(recipe)


def test_lm_eval_task_gives_the_suites_answer(tiny_checkpoint):  # noqa: F811
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = tiny_checkpoint(TRAIN_LENGTH)
    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    model.set_attn_implementation("angpt_chunked")  # the suite's backend: no float noise between the two greedy runs
    tokenizer = AutoTokenizer.from_pretrained(directory)
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=1, device="cpu", max_length=8 * TRAIN_LENGTH)
    manager = TaskManager(include_path=str(REPO / "eval" / "tasks"), include_defaults=False,
                          metadata={"pretrained": str(directory), "num_samples": 2, "seed": 3})
    out = simple_evaluate(model=lm, tasks=["angpt_needle_x4"], task_manager=manager, bootstrap_iters=0,
                          log_samples=True)
    docs = needle.needle_documents(directory, tokenizer, 4, count=2, seed=3)
    samples = sorted(out["samples"]["angpt_needle_x4"], key=lambda s: s["doc_id"])
    assert [s["doc"]["target"] for s in samples] == [d["target"] for d in docs]
    answers = [needle.generate_answer(model, tokenizer, d["prompt"]) for d in docs]
    assert [s["filtered_resps"][0] for s in samples] == answers
    expected = sum(score_answer(a, d["cities"], d["numbers"]) for a, d in zip(answers, docs)) / 2
    assert out["results"]["angpt_needle_x4"]["needles_found,none"] == pytest.approx(expected)
    exact = sum(a.strip() == d["target"] for a, d in zip(answers, docs)) / 2  # a string match, nothing else
    assert out["results"]["angpt_needle_x4"]["exact_match,none"] == pytest.approx(exact)


def test_front_door_runs_the_length_and_needle_suites_and_the_needle_task(tiny_checkpoint, tmp_path):  # noqa: F811
    """`angpt eval --suite length,needle --tasks angpt_needle_x1` end to end (evaluation/runner.py wiring): the
    own suites' metrics and the lm-eval task's accuracy land in one report, next to their artifacts."""
    from modeling_angpt.evaluation import evaluate

    directory = tiny_checkpoint(TRAIN_LENGTH)
    report = evaluate(directory, suite="length,needle", tasks="angpt_needle_x1", lengths="1,2", limit=1,
                      output_path=str(tmp_path / "out"), bootstrap_iters=0, write=True)
    results = report["results"]
    assert {"length_x1", "length_x2", "needle_x1", "needle_x2", "angpt_needle_x1"} <= set(results)
    assert 0.0 <= results["angpt_needle_x1"]["needles_found"] <= 1.0
    assert results["length_x2"]["loss"] > 0
    assert {"results.json", "results.md", "length.png", "needle.json"} <= {p.name for p in (tmp_path / "out").iterdir()}
