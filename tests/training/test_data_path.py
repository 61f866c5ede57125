"""A recipe's trip through the data path (modeling_angpt/data/, docs/training.md "Your own data"): from `train`'s
preflight through the building of the run, every function of the data path in the order the run first calls it.
The trip goes in and comes out without returning to a file it left: each file of the data path is one stretch of
the trip, in the order of the stages (`pytest -s` prints the trip of each kind of data)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from training_fixtures import corpus_files, data_cache, single_thread, write_recipe  # noqa: F401 (fixtures)

import modeling_angpt.data
from modeling_angpt.training.recipe import load_recipe

DATA_PATH = Path(modeling_angpt.data.__file__).parent
READERS = {"__len__", "__getitem__", "__iter__", "__next__"}


def data_path_trip(recipe) -> list[str]:
    """`file:function` of every function of modeling_angpt/data/ in the order `train` first calls it while it
    checks the recipe and builds the run (the batches of the loop come later, from loader.py)."""
    from modeling_angpt.training.loop import build_run, preflight

    seen, trip = set(), []

    def first_calls(frame, event, _arg):
        code = frame.f_code
        if event != "call" or code in seen or not code.co_filename.startswith(str(DATA_PATH)):
            return
        # not stages: a module's own code as it is imported (and its class bodies), and the protocol methods a
        # dataset answers whoever reads it (its length, an item, an iterator)
        caller = frame.f_back.f_code.co_name if frame.f_back is not None else ""
        imported = "<module>" in (code.co_name, caller)
        if not imported and code.co_name not in READERS:
            seen.add(code)
            trip.append(f"{Path(code.co_filename).stem}:{getattr(code, 'co_qualname', code.co_name)}")

    sys.setprofile(first_calls)
    try:
        build_run(recipe, *preflight(recipe, resume=False)[:2])
    finally:
        sys.setprofile(None)
    return trip


def stretches(trip: list[str]) -> list[str]:
    """The files of the trip, one entry per stretch: a file listed twice was returned to after it was left."""
    files = [step.split(":")[0] for step in trip]
    return [name for index, name in enumerate(files) if index == 0 or files[index - 1] != name]


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory) -> Path:
    return corpus_files(tmp_path_factory.mktemp("data-path-corpus"), files=2, chars=40_000)


def _recipe(kind: str, write_recipe, corpus: Path, tmp_path: Path):
    if kind == "prepared":
        from modeling_angpt.data.prepare import prepare_corpus

        prepare_corpus(load_recipe(write_recipe("prepare.yaml", dataset=str(corpus))), tmp_path / "prepared")
        return load_recipe(write_recipe(dataset=str(tmp_path / "prepared")))
    extra = {"streaming": True, "validation_blocks": 4} if kind == "stream" else {}
    return load_recipe(write_recipe(dataset=str(corpus), **extra))


@pytest.mark.parametrize("kind, stages", [
    ("blocks", ["sources", "build", "tokenizer", "blocks", "loader"]),
    ("stream", ["sources", "build", "tokenizer", "streaming", "shards", "blocks", "loader"]),
    ("prepared", ["sources", "build", "shards", "loader"])])
def test_a_recipe_passes_each_file_of_the_data_path_once(kind, stages, write_recipe, small_corpus, tmp_path):
    trip = data_path_trip(_recipe(kind, write_recipe, small_corpus, tmp_path))
    print(f"\n{kind}: {' → '.join(stretches(trip))}\n  " + "\n  ".join(trip))  # pytest -s shows the trip
    assert stretches(trip) == stages, "\n".join(trip)
