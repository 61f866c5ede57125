"""Loading as transformers does it (issues 10.8, 10.9/11.5): a classifier from a causal-LM checkpoint, shape
mismatches and ignore_mismatched_sizes, head classes from a base checkpoint, and what the model card promises about
the Auto classes, checked in a fresh interpreter."""
import json
import subprocess
import sys
import textwrap

import pytest
import torch
import transformers.modeling_utils
from safetensors.torch import load_file, save_file
from transformers import AutoModel, AutoModelForSequenceClassification
from transformers.testing_utils import CaptureLogger

from modeling_angpt import AnGPTForCausalLM, AnGPTForSequenceClassification, AnGPTModel

from conftest import ARCHITECTURES
from contract_fixtures import causal_lm, config, ids, single_thread  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_classifier_from_a_causal_lm_checkpoint(tmp_path, architecture):
    """Issue 10.8: the new head is initialised, transformers' load report names it, the backbone is the LM's."""
    lm = causal_lm(architecture)
    lm.save_pretrained(tmp_path)
    with CaptureLogger(transformers.modeling_utils.logger) as log:
        classifier, info = AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=3,
                                                                              output_loading_info=True)
    assert type(classifier) is AnGPTForSequenceClassification
    assert set(info["missing_keys"]) == {"score.weight"}
    assert "score.weight" in log.out and "MISSING" in log.out
    lm_state = lm.model.state_dict()
    assert all(torch.equal(v, lm_state[k]) for k, v in classifier.model.state_dict().items())
    assert torch.isfinite(classifier.score.weight).all() and classifier.score.weight.std() < 0.1
    labels = torch.tensor([0, 2])
    loss = classifier(ids(), labels=labels).loss  # fine-tunes like any classifier
    loss.backward()
    assert classifier.score.weight.grad is not None


def test_shape_mismatch_raises_unless_ignored(tmp_path):
    """transformers' test_load_with_mismatched_shapes: RuntimeError by default, re-initialised with the flag."""
    source = AnGPTForSequenceClassification(config("angpt", num_labels=3))
    source.save_pretrained(tmp_path)
    with pytest.raises(RuntimeError, match=r"score\.weight.*ignore_mismatched_sizes"):
        AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=5)
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        AutoModel.from_pretrained(tmp_path, vocab_size=10)
    with CaptureLogger(transformers.modeling_utils.logger) as log:
        model = AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=5, ignore_mismatched_sizes=True)
    assert "score.weight" in log.out and model.score.weight.shape == (5, 32)
    assert torch.equal(model.model.embed_tokens.weight, source.model.embed_tokens.weight)
    assert model(ids()).logits.shape == (2, 5)


def test_missing_backbone_tensor_is_still_an_error(tmp_path):
    """The new head may be missing; a tensor of the backbone may not (never a half-loaded model)."""
    causal_lm("angpt").save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["model.layers.1.self_attn.k_proj.weight"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    for model_class in (AnGPTForSequenceClassification, AnGPTForCausalLM):
        with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.k_proj\.weight: missing"):
            model_class.from_pretrained(tmp_path, num_labels=2)


def test_head_classes_from_a_base_model_checkpoint(tmp_path):
    """transformers' test_correct_missing_keys: the head a base checkpoint lacks is reported missing and initialised."""
    AnGPTModel(config("angpt")).save_pretrained(tmp_path)
    model, info = AnGPTForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert set(info["missing_keys"]) == {"lm_head.weight", "logit_scale.weight"}
    torch.testing.assert_close(model.logit_scale(), torch.ones(101))  # s_z at its init value
    torch.testing.assert_close(model.lm_head.weight.norm(dim=-1), torch.ones(101))  # anGPT rows start at unit norm


def test_from_pretrained_with_a_state_dict_and_no_checkpoint():
    """transformers' test_from_pretrained_no_checkpoint."""
    model = causal_lm("ngpt")
    loaded = AnGPTForCausalLM.from_pretrained(None, config=model.config, state_dict=model.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), loaded.parameters()))


CHILD = textwrap.dedent("""
    import json, sys
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification
    directory, result = sys.argv[1], {}
    try:
        AutoModelForCausalLM.from_pretrained(directory)
        result["installed_only"] = "loaded"
    except ValueError as error:
        result["installed_only"] = str(error)
    import modeling_angpt
    model = AutoModelForCausalLM.from_pretrained(directory)
    result["after_import"] = type(model).__module__
    result["classifier"] = type(AutoModelForSequenceClassification.from_pretrained(directory, num_labels=2)).__name__
    print("RESULT " + json.dumps(result))  # after transformers' [y/N] prompt, which ends without a newline
""")


def test_model_card_states_exactly_what_loads(tmp_path):
    """Issue 10.9/11.5: the package being installed does not register the Auto classes (transformers has no plugin
    mechanism for model types); `import modeling_angpt` does, and trust_remote_code=True always works
    (test_remote_code.py). The card says exactly that, and a fresh interpreter shows each clause."""
    from modeling_angpt.export.hub import LOADING_NOTE, save_pretrained

    checkpoint = tmp_path / "checkpoint"  # the child's working directory must not hold the saved modeling_angpt.py
    save_pretrained(causal_lm("angpt"), checkpoint)
    card = (checkpoint / "README.md").read_text()
    assert LOADING_NOTE in card and "find it without remote code" not in card
    assert "`import modeling_angpt`" in LOADING_NOTE and "`trust_remote_code=True`" in LOADING_NOTE
    result = subprocess.run([sys.executable, "-c", CHILD, str(checkpoint)], capture_output=True, text=True,
                            timeout=300, cwd=tmp_path, stdin=subprocess.DEVNULL)  # the prompt reads EOF: "no"
    assert result.returncode == 0, result.stderr[-3000:]
    child = json.loads(result.stdout.split("RESULT ")[-1])
    assert "trust_remote_code=True" in child["installed_only"]
    assert child["after_import"] == "modeling_angpt.modeling_angpt"
    assert child["classifier"] == "AnGPTForSequenceClassification"
