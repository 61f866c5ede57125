"""transformers' own common tests (ModelTesterMixin, ConfigTester; GenerationTesterMixin where the source distribution
ships it) against GPT+, nGPT and anGPT, from the source distribution of the installed transformers version
(tests/contract/transformers_sdist.py fetches and caches it with pip).

Marked `transformers_common`: about 150 tests per architecture, so `make test` leaves them out and
`make test-transformers` runs them (CI does, after `make test`). Without the sdist (no package index reachable)
the module skips with that reason.

`NOT_APPLICABLE` is the one list of their tests that do not apply here, each with its reason;
docs/transformers-compat.md's table is this module's output when run as a script
(`.venv/bin/python tests/contract/test_transformers_common.py`), and tests/contract/test_transformers_exceptions.py
checks the two agree.
"""
from __future__ import annotations

import os
import unittest

import pytest

ARCHITECTURES = ("gptplus", "ngpt", "angpt")

# test name -> reason it does not apply (every architecture)
NOT_APPLICABLE = {
    "test_model_weights_reload_no_missing_tied_weights":
        "loads a checkpoint with every tensor missing; refused on purpose: a checkpoint missing a backbone tensor is "
        "an error naming it, never a silently re-initialised model (only a new head of another class may be missing)",
    "test_reverse_loading_mapping":
        "checks weight conversions that rename keys; the one conversion here renames none: it reshapes the folded "
        "form's c_q, which older versions saved as a vector (the architectures guide, \"Tensor and pipeline "
        "parallelism\"), and these tests build the training form, which has no c_q",
}
# (architecture, test name) -> reason it does not apply to that architecture
NGPT_RESIZE = ("expects new rows' mean ≈ old rows' mean; nGPT's constraint puts every row on the unit sphere, so new "
               "rows are the old mean's direction at norm 1 (the architectures guide, \"Weight constraints\")")
NOT_APPLICABLE_TO = {
    ("ngpt", "test_resize_tokens_embeddings"): NGPT_RESIZE,
    ("ngpt", "test_resize_embeddings_untied"): NGPT_RESIZE,
}
# what the sdist lacks: test name -> the missing module's content it needs (filled in below when loaded)
NEEDS_MISSING = {
    "test_generation_tester_mixin_inheritance": "generation/test_utils.py",
}

# test_bc_cache_name_forward passes the old cache name on purpose and expects this warning (setup.cfg makes it an
# error elsewhere, to catch our own calls)
pytestmark = [pytest.mark.transformers_common,
              pytest.mark.filterwarnings("default:`past_key_values` is deprecated:FutureWarning")]


def reasons(architecture: str) -> dict[str, str]:
    """The tests skipped for `architecture` and why (the table of docs/transformers-compat.md)."""
    table = dict(NOT_APPLICABLE)
    table.update({name: why for (arch, name), why in NOT_APPLICABLE_TO.items() if arch == architecture})
    return table


def markdown_table() -> str:
    rows = {}
    for architecture in ARCHITECTURES:
        for name, why in reasons(architecture).items():
            rows.setdefault((name, why), []).append(architecture)
    lines = ["| their test | architectures | why it does not apply |", "|---|---|---|"]
    for (name, why), archs in rows.items():
        lines.append(f"| `{name}` | {'all' if len(archs) == len(ARCHITECTURES) else ', '.join(archs)} | {why} |")
    return "\n".join(lines)


if __name__ != "__main__":
    import torch
    import transformers

    from transformers_sdist import load

    try:
        common, config_common, MISSING = load(transformers.__version__)
    except RuntimeError as error:
        # a plain pytest run offline skips them; `make test-transformers` (CI) exists to run them, so it fails
        if os.environ.get("ANGPT_REQUIRE_TRANSFORMERS_TESTS"):
            pytest.fail(str(error), pytrace=False)
        pytest.skip(f"transformers' common tests come from its source distribution, not reachable here: {error}",
                    allow_module_level=True)

    from transformers.models.auto import modeling_auto

    from modeling_angpt import AnGPTConfig, AnGPTForCausalLM, AnGPTForSequenceClassification, AnGPTModel

    # Their tests find a model's base class and head kinds by name in transformers' own tables (the rope, causal-LM
    # loss and head tests skip otherwise); list ours there, as a model inside transformers would be.
    modeling_auto.MODEL_MAPPING_NAMES.setdefault("angpt", "AnGPTModel")
    modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.setdefault("angpt", "AnGPTForCausalLM")
    modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES.setdefault("angpt", "AnGPTForSequenceClassification")

    class AnGPTModelTester:
        """Tiny models like the contract suite's (tests/contract_fixtures.py), in the shape ModelTesterMixin reads."""

        batch_size, seq_length, is_training = 3, 7, True
        vocab_size, hidden_size, num_hidden_layers, num_attention_heads = 99, 32, 2, 4

        def __init__(self, parent, architecture: str):
            self.parent, self.architecture = parent, architecture

        def get_config(self) -> AnGPTConfig:
            return AnGPTConfig(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                               num_hidden_layers=self.num_hidden_layers, num_attention_heads=self.num_attention_heads,
                               max_position_embeddings=64, num_labels=3, pad_token_id=0,
                               architecture=self.architecture)

        def prepare_config_and_inputs_for_common(self):
            ids = torch.randint(1, self.vocab_size, (self.batch_size, self.seq_length))
            mask = torch.ones_like(ids)
            mask[1, :2] = 0  # one left-padded row
            return self.get_config(), {"input_ids": ids, "attention_mask": mask}

    def skipped(name: str, why: str):
        @unittest.skip(why)
        def test(self):
            pass

        test.__name__ = name
        return test

    def common_case(architecture: str):
        members = {name: skipped(name, why) for name, why in reasons(architecture).items()}
        for name, module in NEEDS_MISSING.items():
            if module in MISSING:
                members[name] = skipped(name, f"tests/{module} is not in transformers' sdist: {MISSING[module]}")
        for module, what in MISSING.items():  # the mixins the sdist lacks: say so once per class
            members[f"test_sdist_lacks_{module.split('/')[0]}"] = skipped(
                f"test_sdist_lacks_{module.split('/')[0]}", f"tests/{module} is not in transformers' sdist: {what}")

        def setUp(self):
            self.model_tester = AnGPTModelTester(self, architecture)
            self.config_tester = config_common.ConfigTester(self, config_class=AnGPTConfig, hidden_size=32,
                                                            architecture=architecture)

        def test_config(self):
            tester = self.config_tester
            checks = ["create_and_test_config_common_properties", "create_and_test_config_to_json_string",
                      "create_and_test_config_to_json_file", "create_and_test_config_from_and_save_pretrained",
                      "create_and_test_config_from_and_save_pretrained_subfolder",
                      "create_and_test_config_from_and_save_pretrained_composite",
                      "create_and_test_config_with_num_labels",
                      "create_and_test_config_from_pretrained_custom_kwargs", "check_config_can_be_init_without_params"]
            if "utils/test_configuration_utils.py" not in MISSING:
                checks.append("check_config_arguments_init")
            for check in checks:
                getattr(tester, check)()

        members.update(setUp=setUp, test_config=test_config,
                       all_model_classes=(AnGPTModel, AnGPTForCausalLM, AnGPTForSequenceClassification))
        bases = (common.ModelTesterMixin, common.GenerationTesterMixin, unittest.TestCase)
        return type(f"Test{architecture.capitalize()}Common", bases, members)

    TestGptplusCommon = common_case("gptplus")
    TestNgptCommon = common_case("ngpt")
    TestAngptCommon = common_case("angpt")

if __name__ == "__main__":
    print(markdown_table())
