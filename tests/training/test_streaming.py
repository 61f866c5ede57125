"""`streaming: true`: each process reads its own parts of the stream, DataLoader workers tokenise, and a resume
restores the stream's saved position (the same batches as an uninterrupted run). A stream resumed on another number
of processes: tests/parallel/test_preemption.py."""
from collections import Counter
from pathlib import Path

import pytest
from training_fixtures import corpus_files, data_cache, single_thread, write_recipe  # noqa: F401 (fixtures)

from modeling_angpt.training.recipe import load_recipe
from modeling_angpt.data.shards import held_out

STREAM = ["streaming=true", "validation_blocks=4", "eval_steps=6", "max_steps=12", "save_steps=6"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return corpus_files(tmp_path_factory.mktemp("stream-corpus"), files=4, chars=30_000)  # four source shards


@pytest.mark.parametrize("parts", [2, 4])
def test_each_process_streams_its_own_documents_and_none_held_out(write_recipe, corpus, parts):
    from modeling_angpt.data.build import build_datasets
    from modeling_angpt.data.sources import resolve_corpus

    recipe = load_recipe(write_recipe(dataset=str(corpus)), STREAM + [f"stream_parts={parts}"])
    corpus = resolve_corpus(recipe)
    read = []
    for rank in (0, 1):
        _, train, val, info = build_datasets(recipe, corpus, _no_context, rank=rank, processes=2, stream_parts=parts)
        assert sorted(train.streams) == list(range(rank, parts, 2)) and info["stream_parts"] == parts
        read += [Counter(row["text"] for row in stream.ds if row["text"]) for stream in train.streams.values()]
        batch = next(train.batches())["input_ids"]
        assert len(val) == 4 and batch.shape == (recipe.per_device_train_batch_size, recipe.block_size)
    every = Counter(row["text"] for row in _whole_stream(recipe) if row["text"])
    assert sum(read, Counter()) == every and all(read)      # every row read once, by one part
    kept = [text for text in every if not held_out(text, recipe.data_seed, recipe.validation_fraction)]
    assert 0 < len(kept) < len(every)            # PackedStream skips the held-out ones (validation's)


def test_a_stream_split_that_a_launch_cannot_share_evenly_is_refused_in_one_line():
    from modeling_angpt.training.resume import check_geometry, check_stream_parts

    four = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 1, "num_processes": 4}
    with pytest.raises(ValueError, match=r"split into 2 parts \(recipe key stream_parts\): it runs on a number of "
                                         "processes that divides 2") as refused:
        check_geometry("ckpt", {**four, "num_processes": 2, "per_device_train_batch_size": 4, "stream_parts": 2},
                       four, streaming=True)
    message = str(refused.value)
    assert message.startswith("--resume: the stream of checkpoint ckpt is") and "\n" not in message
    with pytest.raises(ValueError, match=r"the stream \(streaming: true\) is split into 3 parts"):
        check_stream_parts(3, {**four, "num_processes": 1, "per_device_train_batch_size": 8})  # 3 ∤ 8
    earlier = {**four, "num_processes": 2, "per_device_train_batch_size": 4}  # an earlier version's: a part a process
    check_geometry("ckpt", earlier, {**four, "num_processes": 1, "per_device_train_batch_size": 8}, streaming=True)


def _no_context():
    import contextlib

    return contextlib.nullcontext()


def _whole_stream(recipe):
    from modeling_angpt.data.sources import resolve_source
    from modeling_angpt.data.build import load_texts

    return load_texts(resolve_source(recipe.dataset), recipe, streaming=True)


def test_a_stopped_stream_resumes_where_it_stood_with_workers_tokenising(write_recipe, corpus, tmp_path):
    from modeling_angpt.training.loop import train

    values = STREAM + ["dataloader_num_workers=2"]
    whole = train(load_recipe(write_recipe(dataset=str(corpus), output_dir=str(tmp_path / "whole")), values))
    recipe = write_recipe(dataset=str(corpus), output_dir=str(tmp_path / "parts"))
    first = train(load_recipe(recipe, values), stop_after_steps=6)
    assert (tmp_path / "parts" / "checkpoints" / "step_0000006" / "data_state_0.pt").is_file()
    second = train(load_recipe(recipe, values), resume=True)
    assert second.start_step == 6 and first.losses == whole.losses[:6]
    assert second.losses == whole.losses and second.val_losses[-1] == whole.val_losses[-1]
