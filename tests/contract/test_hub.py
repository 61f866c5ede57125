"""modeling_angpt.export.hub.push_to_hub against a fake Hub that copies each upload into a local folder.

The fake stands in for huggingface_hub.HfApi: push_to_hub may call only its public create_repo, create_branch and
create_commit (any other method, e.g. transformers' private upload helpers, fails on the fake)."""
from __future__ import annotations

import shutil
import types
from pathlib import Path
from unittest import mock

import pytest
import torch
import huggingface_hub
from transformers import AutoModelForCausalLM

from modeling_angpt import AnGPTForCausalLM
from modeling_angpt.export.hub import push_to_hub


class FakeHub:
    def __init__(self, root: Path) -> None:
        self.root, self.commits = root, []

    def create_repo(self, repo_id, **kwargs):
        (self.root / repo_id).mkdir(parents=True, exist_ok=True)
        return types.SimpleNamespace(repo_id=repo_id)

    def create_branch(self, **kwargs):
        pass

    def create_commit(self, repo_id, operations, commit_message=None, **kwargs):
        for op in operations:
            target = self.root / repo_id / op.path_in_repo
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(op.path_or_fileobj, target)
        self.commits.append(commit_message)
        return types.SimpleNamespace(commit_url="fake", oid="0" * 40, pr_url=None)


@pytest.mark.parametrize("folded", [False, True])
def test_push_to_hub(tmp_path, tiny_config, folded):
    hub = FakeHub(tmp_path / "hub")
    model = AnGPTForCausalLM(tiny_config("angpt")).eval()
    if folded:
        model = model.fold()
    with mock.patch.object(huggingface_hub, "HfApi", lambda **kwargs: hub):
        push_to_hub(model, "someone/tiny-angpt", card_info={"val_loss": 3.5, "datasets": ["shakespeare"]})
    repo = tmp_path / "hub" / "someone" / "tiny-angpt"
    files = {p.name for p in repo.iterdir()}
    assert {"config.json", "model.safetensors", "README.md"} <= files
    # The remote code is what transformers' save_pretrained copies (the model files and their relative imports),
    # nothing of the library around them: no card or upload code, no training or evaluation.
    model.save_pretrained(tmp_path / "plain")
    model_files = {p.name for p in (tmp_path / "plain").glob("*.py")}
    assert {"modeling_angpt.py", "configuration_angpt.py", "folding_angpt.py"} <= model_files
    assert {p for p in files if p.endswith(".py")} == model_files
    assert not {"hub.py", "card_angpt.py", "export.py", "cli.py"} & files
    card = (repo / "README.md").read_text()
    assert "library_name: transformers" in card and "someone/tiny-angpt" in card and "validation loss" in card
    assert ("folded: true" in card) == folded
    reloaded = AutoModelForCausalLM.from_pretrained(repo, trust_remote_code=True)
    ids = torch.randint(0, 101, (2, 8))
    with torch.no_grad():
        assert (reloaded(ids).logits - model(ids).logits).abs().max() < 1e-6
