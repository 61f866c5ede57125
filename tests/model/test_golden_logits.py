"""The numerics do not move: checkpoints saved by an earlier version of the code (tests/model/golden, written by its
make_golden.py before the model files were reorganised) load and give the logits recorded when they were saved.

Bit-identical on a CPU with the kernels the recording used (the manifest's `cpu_capability` and torch release, one
thread); another instruction set or torch release (make test-min-versions' torch floor) sums in another order, so there
the check is float32 round-off (1e-6)."""
from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest
import torch
from safetensors.torch import load_file

GOLDEN = pathlib.Path(__file__).resolve().parent / "golden"
MANIFEST = json.loads((GOLDEN / "manifest.json").read_text())


def _probe_inputs():
    spec = importlib.util.spec_from_file_location("make_golden", GOLDEN / "make_golden.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.probe_inputs()


@pytest.mark.parametrize("name", sorted(MANIFEST["cases"]))
def test_saved_checkpoint_gives_the_recorded_logits(name):
    from modeling_angpt import AnGPTForCausalLM

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        implementation = MANIFEST["cases"][name]
        model = AnGPTForCausalLM.from_pretrained(GOLDEN / name, **({"attn_implementation": implementation}
                                                                   if implementation else {})).eval()
        ids, mask = _probe_inputs()
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits
    finally:
        torch.set_num_threads(threads)
    recorded = load_file(str(GOLDEN / name / "logits.safetensors"))["logits"]
    same_kernels = (torch.backends.cpu.get_cpu_capability() == MANIFEST["cpu_capability"]
                    and torch.__version__.split("+")[0] == MANIFEST["torch"].split("+")[0])
    if same_kernels:
        assert torch.equal(logits, recorded), (logits - recorded).abs().max()
    else:
        torch.testing.assert_close(logits, recorded, rtol=0, atol=1e-6)


def test_a_state_dict_saved_before_a_rename_loads_with_torch_too():
    """Training resumes with torch's load_state_dict, not from_pretrained: the LogN checkpoint stores its per-head
    query scale as `logn_scale` (its name before the rename), and it loads under today's name there too
    (pretrained_angpt.RENAMED_PARAMETERS)."""
    from modeling_angpt import AnGPTConfig, AnGPTForCausalLM

    directory = GOLDEN / "ngpt_logn_block"
    saved = load_file(str(directory / "model.safetensors"))
    assert sum(key.endswith("self_attn.logn_scale") for key in saved) == AnGPTConfig.from_pretrained(
        directory).num_hidden_layers
    model = AnGPTForCausalLM(AnGPTConfig.from_pretrained(directory))
    model.load_state_dict(saved, strict=True)
    reference = AnGPTForCausalLM.from_pretrained(directory).state_dict()
    assert model.state_dict().keys() == reference.keys()
    assert all(torch.equal(value, reference[key]) for key, value in model.state_dict().items())
