"""vLLM's Transformers backend, emulated on the CPU: what it requires of a remote-code model holds (docs/tools.md,
"vLLM"). vLLM itself needs a GPU and is not installed here, so the emulation is the test.

What the backend does with a checkpoint it has no model file for: it sets `config._attn_implementation = "vllm"`,
builds the base model with `AutoModel.from_config`, replaces every `nn.Linear` with its own layer (a module that is
not an nn.Linear) and the embedding with its own, and calls the base model on one flattened row holding every
request (input_ids [1, N], position_ids restarting at each request, no attention mask, no cache). Attention runs
through the function it registered as "vllm" in transformers' AttentionInterface, which reads `module.layer_idx`
and the `scaling` keyword and knows each request's span from its own metadata. Logits are its own
`lm_head(hidden) × config.logit_scale` (1 when the config has none): nothing of the causal-LM class runs.
"""
from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface, AutoModel

from modeling_angpt import AnGPTForCausalLM

from conftest import ARCHITECTURES
from contract_fixtures import BLOCK_THE_PACKAGE

pytestmark = pytest.mark.tools  # make test-tools

VLLM = "vllm"


def vllm_attention(module, query, key, value, attention_mask, scaling=None, request_spans=(), **kwargs):
    """What vLLM's function computes: q, k, v [1, h, N, d_h] of the flattened row -> [N, h·d_h], causal within each
    request (vLLM reads the spans from its attention metadata; here they come as a keyword, as its
    `attention_instances` do). The mask is ignored, as vLLM ignores it."""
    assert isinstance(module.layer_idx, int)
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    output = torch.empty_like(query)
    for start, stop in request_spans:
        output[:, :, start:stop] = F.scaled_dot_product_attention(
            query[:, :, start:stop], key[:, :, start:stop], value[:, :, start:stop], is_causal=True, scale=scaling)
    return output.transpose(1, 2).reshape(query.shape[-2], -1), None


AttentionInterface.register(VLLM, vllm_attention)


class ReplacedLinear(nn.Module):
    """Stands for vLLM's ReplicatedLinear/QKVParallelLinear: holds the weight, is not an nn.Linear, counts calls."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach().clone())
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return F.linear(x, self.weight)


class ReplacedEmbedding(nn.Module):
    """Stands for vLLM's VocabParallelEmbedding (set with set_input_embeddings)."""

    def __init__(self, embedding: nn.Embedding) -> None:
        super().__init__()
        self.weight = nn.Parameter(embedding.weight.detach().clone())

    def forward(self, ids):
        return F.embedding(ids, self.weight)


def as_vllm_builds_it(causal_lm: AnGPTForCausalLM):
    """The base model as vLLM's backend builds and loads it: from the config with attn_implementation "vllm", the
    checkpoint's base weights, every nn.Linear and the embedding replaced by vLLM's own modules."""
    config = copy.deepcopy(causal_lm.config)
    config._attn_implementation = VLLM
    base = AutoModel.from_config(config).eval()
    base.load_state_dict(causal_lm.model.state_dict())
    replaced = []

    def replace(module):
        for name, child in module.named_children():
            if isinstance(child, nn.Linear):
                setattr(module, name, ReplacedLinear(child))
                replaced.append(getattr(module, name))
            else:
                replace(child)

    replace(base)
    base.set_input_embeddings(ReplacedEmbedding(base.get_input_embeddings()))
    return base, replaced


def flattened_requests(lengths, vocab_size):
    ids = [torch.randint(0, vocab_size, (n,)) for n in lengths]
    stops = torch.tensor(lengths).cumsum(0).tolist()
    spans = list(zip([0] + stops[:-1], stops))
    positions = torch.cat([torch.arange(n) for n in lengths])
    return ids, spans, torch.cat(ids)[None], positions[None]


def vllm_logits(base, lm_head_weight, flat_ids, positions, spans):
    with torch.no_grad():
        hidden = base(input_ids=flat_ids, position_ids=positions, use_cache=False, return_dict=False,
                      request_spans=spans)[0][0]
    return hidden @ lm_head_weight.T * getattr(base.config, "logit_scale", 1.0)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_a_folded_checkpoint_runs_as_vllm_runs_it(tiny_config, architecture):
    """Folded (s_z in the head): vLLM's logits from the base model, its own layers and lm_head × logit_scale equal
    the model's own logits for each request run alone, and every projection went through vLLM's layer."""
    folded = AnGPTForCausalLM(tiny_config(architecture, num_key_value_heads=2)).eval().fold()
    base, replaced = as_vllm_builds_it(folded)
    ids, spans, flat_ids, positions = flattened_requests([5, 9, 3], folded.config.vocab_size)
    logits = vllm_logits(base, folded.lm_head.weight, flat_ids, positions, spans)
    with torch.no_grad():
        expected = torch.cat([folded(request[None]).logits[0] for request in ids])
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)
    # seven projections a layer, and the folded nGPT's/anGPT's c_q, a linear layer so that vLLM splits it with q_proj
    # (layers_angpt.Gain; docs/architectures.md, "Tensor and pipeline parallelism")
    per_layer = 7 + (architecture != "gptplus")
    assert len(replaced) == per_layer * folded.config.num_hidden_layers and all(layer.calls == 1 for layer in replaced)


def test_the_gptplus_training_form_runs_as_vllm_runs_it(tiny_config):
    """GPT+ has no learned logit scale: its training form is already what vLLM computes."""
    model = AnGPTForCausalLM(tiny_config("gptplus")).eval()
    base, _ = as_vllm_builds_it(model)
    ids, spans, flat_ids, positions = flattened_requests([4, 6], model.config.vocab_size)
    logits = vllm_logits(base, model.lm_head.weight, flat_ids, positions, spans)
    with torch.no_grad():
        expected = torch.cat([model(request[None]).logits[0] for request in ids])
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("architecture", ["ngpt", "angpt"])
def test_the_training_form_with_a_logit_scale_is_refused_in_one_line(tiny_config, architecture):
    """nGPT's and anGPT's training form multiply the logits by the learned s_z in the causal-LM head, which vLLM
    never runs: refused where vLLM builds the model, naming the export that folds s_z into lm_head."""
    model = AnGPTForCausalLM(tiny_config(architecture)).eval()
    with pytest.raises(ValueError, match="angpt export") as refusal:
        base, _ = as_vllm_builds_it(model)
        base(input_ids=torch.tensor([[1, 2, 3]]), position_ids=torch.tensor([[0, 1, 2]]), use_cache=False)
    assert "\n" not in str(refusal.value)


@pytest.mark.parametrize("variant", [dict(attention_logit_transform="alibi"),
                                     dict(attention_logit_transform="scale_invariant"),
                                     dict(attention_sparsity="topk", attention_topk=2),
                                     dict(attention_sparsity="window", attention_window=4),
                                     dict(attention_sparsity="block", attention_block_size=4)])
def test_variants_vllm_cannot_compute_are_refused_in_one_line(tiny_config, variant):
    folded = AnGPTForCausalLM(tiny_config("angpt", **variant)).eval().fold()
    with pytest.raises(ValueError, match=VLLM) as refusal:
        base, _ = as_vllm_builds_it(folded)
        base(input_ids=torch.tensor([[1, 2, 3]]), position_ids=torch.tensor([[0, 1, 2]]), use_cache=False,
             request_spans=[(0, 3)])
    assert "\n" not in str(refusal.value)


# A fresh interpreter that cannot import modeling_angpt: the files saved beside each checkpoint provide the model.
CHILD = BLOCK_THE_PACKAGE + textwrap.dedent("""
    import torch
    from transformers import AutoConfig, AutoModel
    ids = torch.tensor(json.loads(sys.argv[1]))
    hidden = {}
    for directory in sys.argv[2:]:
        model = AutoModel.from_pretrained(directory, trust_remote_code=True, attn_implementation="eager")
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        AutoModel.from_config(AutoConfig.from_pretrained(directory, trust_remote_code=True), trust_remote_code=True)
        with torch.no_grad():
            hidden[directory] = model(ids).last_hidden_state.tolist()
    print(json.dumps(hidden))
""")


def test_automodel_loads_a_saved_checkpoint_in_a_fresh_interpreter(tmp_path, tiny_config):
    """auto_map names AutoModel (and the sequence-classification class); for a folded checkpoint, the base model's
    hidden states × lm_head × config.logit_scale equal the logits."""
    ids = torch.randint(0, 101, (2, 7))
    folded = {}
    for architecture in ARCHITECTURES:
        model = AnGPTForCausalLM(tiny_config(architecture)).eval().fold()
        model.save_pretrained(tmp_path / architecture)
        folded[str(tmp_path / architecture)] = model
        auto_map = json.loads((tmp_path / architecture / "config.json").read_text())["auto_map"]
        assert {"AutoConfig", "AutoModel", "AutoModelForCausalLM", "AutoModelForSequenceClassification"} <= set(auto_map)
    result = subprocess.run([sys.executable, "-c", CHILD, json.dumps(ids.tolist()), *folded], capture_output=True,
                            text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    hidden = json.loads(result.stdout.strip().splitlines()[-1])
    for directory, model in folded.items():
        with torch.no_grad():
            logits = model(ids).logits
        from_base = torch.tensor(hidden[directory]) @ model.lm_head.weight.T * getattr(model.config, "logit_scale", 1.0)
        torch.testing.assert_close(from_base, logits, rtol=0, atol=1e-5)
