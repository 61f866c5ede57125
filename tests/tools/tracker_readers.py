"""What each experiment tracker stored for a run, read back with the tracker's own reader (tests of
training/trackers.py): {metric: {step: value}}, the value written last for a step winning (a resumed run logs again
the steps the interrupted one logged after its checkpoint)."""
from __future__ import annotations

import glob
import json
import struct
from collections import defaultdict
from pathlib import Path


def jsonl_series(path: Path, keys: tuple[str, ...]) -> dict[str, dict[int, float]]:
    series = defaultdict(dict)
    for line in Path(path).read_text().splitlines():
        row = json.loads(line)
        for key in keys:
            if key in row:
                series[key][row["step"]] = row[key]
    return dict(series)


def tensorboard_series(run_logs: Path, keys: tuple[str, ...]) -> dict[str, dict[int, float]]:
    """TensorBoard's EventAccumulator, which applies the purge a resumed writer records."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_logs), size_guidance={"scalars": 0})
    events.Reload()
    tags = events.Tags()["scalars"]
    return {key: {e.step: e.value for e in events.Scalars(key)} for key in keys if key in tags}


def mlflow_series(tracking_uri: str, run_id: str, keys: tuple[str, ...]) -> dict[str, dict[int, float]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    series = {}
    for key in keys:
        history = sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp)
        series[key] = {m.step: m.value for m in history}
    return series


def trackio_series(project: str, run: str, keys: tuple[str, ...]) -> dict[str, dict[int, float]]:
    """trackio's local store (TRACKIO_DIR, set before trackio is imported)."""
    from trackio.sqlite_storage import SQLiteStorage

    series = defaultdict(dict)
    for row in SQLiteStorage.get_logs(project, run):
        for key in keys:
            if key in row:
                series[key][row["step"]] = row[key]
    return dict(series)


# wandb 0.2x writes a run as a LevelDB-style log of protobuf Records (`run-<id>.wandb`): a 7-byte header (":W&B",
# magic 0xBEE1, version 1), then 32 KiB blocks of chunks, each with a 7-byte header (CRC-32C, length, type: full,
# first, middle, last). wandb no longer ships a Python scanner for it (its Go core reads it), so the framing is
# read here and every record is parsed with wandb's own protobuf schema (wandb.proto.wandb_internal_pb2.Record).
_BLOCK, _HEADER = 32 * 1024, 7


def _wandb_records(path: Path):
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a wandb run file"
    position, pending = _HEADER, b""
    while position + _HEADER <= len(data):
        left_in_block = _BLOCK - position % _BLOCK
        if left_in_block < _HEADER:  # a block's tail too short for a header is padding
            position += left_in_block
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + _HEADER])
        chunk = data[position + _HEADER:position + _HEADER + length]
        position += _HEADER + length
        if kind == 0 and length == 0:  # zero padding at the end of a file still being written
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            yield pending
            pending = b""


def wandb_series(run_dir_wandb: Path, run_id: str, keys: tuple[str, ...]) -> dict[str, dict[int, float]]:
    """Every offline run file of `run_id` (a resumed run writes a second one), oldest first."""
    from wandb.proto import wandb_internal_pb2

    series = defaultdict(dict)
    files = sorted(glob.glob(str(Path(run_dir_wandb) / f"offline-run-*-{run_id}" / f"run-{run_id}.wandb")))
    assert files, f"no offline wandb run {run_id} under {run_dir_wandb}"
    for file in files:
        for data in _wandb_records(Path(file)):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(data)
            if record.WhichOneof("record_type") != "history":
                continue
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            for key in keys:
                if key in row:
                    series[key][int(row["_step"])] = row[key]
    return dict(series)
