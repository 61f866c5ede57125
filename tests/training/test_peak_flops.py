"""MFU is reported against a peak measured on the same device, measured once and cached."""
import json

import torch

from modeling_angpt.training import metrics


def test_peak_is_measured_once_per_device_and_dtype_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("ANGPT_CACHE", str(tmp_path))
    calls = []

    def fake_measure(device, dtype):
        calls.append((str(device), dtype))
        return 1.5e11

    monkeypatch.setattr(metrics, "measure_matmul_flops", fake_measure)
    assert metrics.device_peak_flops(torch.device("cpu"), None, torch.bfloat16) == 1.5e11
    assert metrics.device_peak_flops(torch.device("cpu"), None, torch.bfloat16) == 1.5e11
    assert metrics.device_peak_flops(torch.device("cpu"), None, torch.float32) == 1.5e11
    assert calls == [("cpu", torch.bfloat16), ("cpu", torch.float32)]  # the repeat came from the cache
    cache = json.loads((tmp_path / "peak_flops.json").read_text())
    assert len(cache) == 2 and all(metrics.device_name(torch.device("cpu")) in key for key in cache)
    assert metrics.device_peak_flops(torch.device("cpu"), 7e12) == 7e12  # recipe key peak_flops wins


def test_matmul_benchmark_gives_a_plausible_rate():
    flops = metrics.measure_matmul_flops(torch.device("cpu"), torch.float32, size=128, seconds=0.05)
    assert 1e6 < flops < 1e15  # loose: a shared CI machine can be very busy
