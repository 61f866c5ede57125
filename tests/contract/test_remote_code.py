"""A saved checkpoint loads with trust_remote_code in a fresh interpreter that cannot import modeling_angpt."""
import json
import subprocess
import sys
import textwrap

import torch
from safetensors.torch import load_file, save_file

from modeling_angpt import AnGPTForCausalLM

from conftest import ARCHITECTURES
from contract_fixtures import BLOCK_THE_PACKAGE

CHILD = BLOCK_THE_PACKAGE + textwrap.dedent("""
    import torch
    from transformers import AutoModelForCausalLM
    ids, answers = torch.tensor(json.loads(sys.argv[1])), {}
    for directory in sys.argv[2:]:  # one interpreter for every checkpoint: its start-up is most of the time
        model = AutoModelForCausalLM.from_pretrained(directory, trust_remote_code=True, attn_implementation="eager")
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        with torch.no_grad():
            logits = model(ids).logits
        generated = model.generate(ids[:1, :4], max_new_tokens=5, do_sample=False)
        answers[directory] = {"logits": logits.tolist(), "generated": generated.tolist()}
    print(json.dumps(answers))
""")


# The nGPT checkpoint carries LogN, its per-head query scale stored under the name checkpoints saved before the rename
# use (`logn_scale`; pretrained_angpt.RENAMED_PARAMETERS): the fresh interpreter loads it under today's name.
OLD_NAMES = {"ngpt": dict(attention_logit_transform="logn", logn_init=0.4)}


def store_old_names(checkpoint) -> None:
    tensors = load_file(checkpoint)
    old = {key.replace("self_attn.query_head_scale", "self_attn.logn_scale"): value for key, value in tensors.items()}
    assert sum(key.endswith("self_attn.logn_scale") for key in old) == 2  # one per layer
    save_file(old, checkpoint, metadata={"format": "pt"})


def test_trust_remote_code_in_fresh_interpreter(tmp_path, tiny_config):
    models, ids = {}, torch.randint(0, 101, (2, 10))
    for architecture in ARCHITECTURES:
        config = tiny_config(architecture, **OLD_NAMES.get(architecture, {}))
        model = AnGPTForCausalLM._from_config(config, attn_implementation="eager").eval()
        with torch.no_grad():  # a learned scale away from its init, so a scale left at init shows
            for layer in model.model.layers:
                if layer.self_attn.query_head_scale is not None:
                    layer.self_attn.query_head_scale.mul_(3.0)
        model.save_pretrained(tmp_path / architecture)
        if architecture in OLD_NAMES:
            store_old_names(tmp_path / architecture / "model.safetensors")
        models[architecture] = model
    result = subprocess.run([sys.executable, "-c", CHILD, json.dumps(ids.tolist()),
                             *(str(tmp_path / architecture) for architecture in ARCHITECTURES)],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    answers = json.loads(result.stdout.strip().splitlines()[-1])
    for architecture, model in models.items():
        child = answers[str(tmp_path / architecture)]
        with torch.no_grad():
            expected = model(ids).logits
        assert torch.equal(torch.tensor(child["logits"]), expected), architecture
        assert child["generated"] == model.generate(ids[:1, :4], max_new_tokens=5, do_sample=False).tolist(), \
            architecture
