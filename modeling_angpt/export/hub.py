"""Sharing a checkpoint: the model card (README.md) that training and `angpt export` write next to a checkpoint,
`save_pretrained` (transformers' save followed by that card) and `push_to_hub` (the same, uploaded).

Hub metadata (YAML front matter through huggingface_hub's ModelCardData): library, license, pipeline tag,
tags for the architecture and attention variant, training data, and the validation loss as a model-index
entry when known. What is known about training comes from `card_info` (a dict: `datasets`, `train_tokens`,
`val_loss`, `license`, `repo_id`, `base_model`), given to `save_pretrained(model, dir, card_info=...)` or set
as `model.card_info` by the training code; `read_card_info(dir)` recovers it from a written card.

Not a model file: the model's own `save_pretrained`/`push_to_hub` are transformers' (with transformers' generic
card); these functions are the ones that write this library's card.
"""
from __future__ import annotations

import os

from ..architectures_angpt import ARCHITECTURES

CARD_KEYS = ("datasets", "train_tokens", "val_loss", "license", "repo_id", "base_model")
# What loads this checkpoint, exactly (tests/contract/test_loading.py checks each clause in a fresh interpreter).
# transformers has no plugin mechanism that would find an installed model type without importing it.
LOADING_NOTE = (
    "The model code ships with the checkpoint: the Auto classes load it with `trust_remote_code=True`, as below. "
    "With the `angpt` package installed, `import modeling_angpt` registers it with the Auto classes, and they then "
    "load it without `trust_remote_code`; installing the package alone does not (without the import they ask for "
    "`trust_remote_code=True`).")

# Fine-tuning the training form with transformers' Trainer or TRL's trainers (tests/tools/test_trl.py checks the card
# names the callback and that the callback keeps the constraint: docs/tools.md, row "TRL").
FINE_TUNING_NOTE = (
    "transformers' `Trainer` and TRL's trainers (`SFTTrainer`, packing included) fine-tune this checkpoint, but they "
    "know nothing of the weight constraint of {title} on its matrices: pass `WeightConstraintCallback` from the "
    "`angpt` package, which applies it after every optimiser step (without it the constraint is lost in a few steps):")
FINE_TUNING_SNIPPET = (
    "from modeling_angpt.training import WeightConstraintCallback\n"
    "trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, callbacks=[WeightConstraintCallback()])")


def fine_tuning_section(config) -> list[str]:
    """The card's "Fine-tuning" lines: which callback keeps the weight constraint (none for a folded checkpoint,
    which refuses training, or for an architecture without a constraint)."""
    strategy = ARCHITECTURES.get(config.architecture)
    if config.folded or getattr(strategy, "norm_axis", None) is None:
        return []
    title = getattr(strategy, "title", None) or config.architecture
    return ["## Fine-tuning", "", FINE_TUNING_NOTE.format(title=title), "",
            "```python", FINE_TUNING_SNIPPET, "```", ""]


def attention_summary(config) -> dict:
    rope = config.rope_parameters or {}
    return {"rope_type": rope.get("rope_type", "default"),
            "partial_rotary_factor": rope.get("partial_rotary_factor"),
            "logit_transform": config.attention_logit_transform,
            "sparsity": config.attention_sparsity,
            "causal": bool(config.is_causal)}


def _usage(model_id: str, causal: bool, has_tokenizer: bool) -> str:
    where = f"checkpoint = {model_id!r}  # this directory's path, or its Hub repo id once pushed\n"
    imports, rest = _usage_body("checkpoint", causal, has_tokenizer).split("\n\n", 1)
    return f"{imports}\n\n{where}{rest}"


def _usage_body(model_id: str, causal: bool, has_tokenizer: bool) -> str:
    if not causal:
        return (f"import torch\nfrom transformers import AutoModelForSequenceClassification\n\n"
                f"model = AutoModelForSequenceClassification.from_pretrained({model_id}, trust_remote_code=True)\n"
                "print(model(torch.tensor([[1, 2, 3, 4]])).logits)\n")
    if has_tokenizer:
        return (f"from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
                f"tokenizer = AutoTokenizer.from_pretrained({model_id}, trust_remote_code=True)\n"
                f"model = AutoModelForCausalLM.from_pretrained({model_id}, trust_remote_code=True)\n"
                "inputs = tokenizer(\"To be, or not to be\", return_tensors=\"pt\")\n"
                "output = model.generate(**inputs, max_new_tokens=20, do_sample=False)\n"
                "print(tokenizer.decode(output[0], skip_special_tokens=True))\n")
    return (f"import torch\nfrom transformers import AutoModelForCausalLM\n\n"
            f"model = AutoModelForCausalLM.from_pretrained({model_id}, trust_remote_code=True)\n"
            "input_ids = torch.tensor([[1, 2, 3, 4]])  # token ids of your tokenizer\n"
            "output = model.generate(input_ids, max_new_tokens=20, do_sample=False)\n"
            "print(output[0].tolist())\n")


def model_card_text(config, card_info: dict | None = None, model_id: str | None = None,
                    has_tokenizer: bool = False, class_name: str = "AnGPTForCausalLM") -> str:
    from huggingface_hub import EvalResult, ModelCardData

    info = {k: v for k, v in (card_info or {}).items() if v is not None}
    model_id = info.get("repo_id") or model_id or "path/to/checkpoint"
    arch = config.architecture
    title = getattr(ARCHITECTURES.get(arch), "title", None) or arch
    attention = attention_summary(config)
    causal = "CausalLM" in class_name
    datasets = info.get("datasets")
    if isinstance(datasets, str):
        datasets = [datasets]
    tags = ["angpt", arch, "custom_code", f"rope-{attention['rope_type']}",
            f"attention-{attention['logit_transform']}", f"sparsity-{attention['sparsity']}"]
    if config.folded:
        tags.append("folded")
    eval_results = None
    if info.get("val_loss") is not None and datasets:
        eval_results = [EvalResult(task_type="text-generation", dataset_type=datasets[0], dataset_name=datasets[0],
                                   metric_type="loss", metric_name="validation loss",
                                   metric_value=float(info["val_loss"]))]
    data = ModelCardData(
        library_name="transformers", license=info.get("license", "apache-2.0"),
        pipeline_tag="text-generation" if causal else "text-classification", tags=tags, datasets=datasets,
        base_model=info.get("base_model"), model_name=model_id.rstrip("/").split("/")[-1],
        eval_results=eval_results,
        angpt={"architecture": arch, "folded": bool(config.folded), "attention": attention,
               "hidden_size": config.hidden_size, "num_hidden_layers": config.num_hidden_layers,
               "num_attention_heads": config.num_attention_heads, "vocab_size": config.vocab_size,
               "train_tokens": info.get("train_tokens"), "val_loss": info.get("val_loss")})
    form = ("**Folded inference form**: every constant is in the weights; this checkpoint runs "
            "inference only and refuses training." if config.folded else
            "Training form: fine-tune it, or fold it for inference with `angpt export SRC DST`.")
    lines = [
        "---", data.to_yaml(), "---", "",
        f"# {model_id.rstrip('/').split('/')[-1]}", "",
        f"Model: {title}, `{class_name}`, from the `angpt` library. {form}", "",
        "| | |", "|---|---|",
        f"| architecture | `{arch}` |",
        f"| size | d={config.hidden_size}, {config.num_hidden_layers} layers, {config.num_attention_heads} heads, "
        f"vocab {config.vocab_size} |",
        f"| attention | RoPE `{attention['rope_type']}` (rotary fraction {attention['partial_rotary_factor']}), "
        f"logit transform `{attention['logit_transform']}`, sparsity `{attention['sparsity']}` |",
        f"| training data | {', '.join(datasets) if datasets else 'unknown'} |",
        f"| training tokens | {info.get('train_tokens', 'unknown')} |",
        f"| validation loss | {info.get('val_loss', 'unknown')} |", "",
        "## Usage", "",
        LOADING_NOTE, "",
        "```python", _usage(model_id, causal, has_tokenizer).rstrip(), "```", "",
        *fine_tuning_section(config),
    ]
    return "\n".join(lines)


def write_model_card(model, directory, card_info: dict | None = None) -> str:
    """Write README.md into `directory` (after the weights and tokenizer files, which it looks for)."""
    info = dict(getattr(model, "card_info", None) or {})
    info.update(card_info or {})
    has_tokenizer = any(os.path.exists(os.path.join(directory, f)) for f in ("tokenizer.json", "tokenizer_config.json"))
    # Named by its own directory name, never by the writing machine's absolute path (the card travels).
    model_id = info.get("repo_id") or os.path.basename(os.path.abspath(directory))
    text = model_card_text(model.config, info, model_id=model_id,
                           has_tokenizer=has_tokenizer, class_name=type(model).__name__)
    path = os.path.join(directory, "README.md")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    return path


def read_card_info(directory) -> dict:
    """The `card_info` recorded in a card written by `write_model_card` ({} when there is none)."""
    path = os.path.join(directory, "README.md")
    if not os.path.isfile(path):
        return {}
    from huggingface_hub import ModelCard

    data = ModelCard.load(path).data.to_dict()
    info = {"license": data.get("license"), "datasets": data.get("datasets"), "base_model": data.get("base_model")}
    info.update({k: v for k, v in (data.get("angpt") or {}).items() if k in ("train_tokens", "val_loss")})
    return {k: v for k, v in info.items() if v is not None}


def create_hub_repo(repo_id: str, private: bool | None = None, token=None) -> str:
    """Create (or find) a model repository on the Hub; its full id."""
    import huggingface_hub

    return huggingface_hub.HfApi(token=token).create_repo(repo_id, private=private, token=token, exist_ok=True).repo_id


def upload_directory(directory, repo_id: str, token=None, commit_message: str = "Upload model",
                     commit_description: str | None = None, create_pr: bool = False, revision: str | None = None):
    """Every file under `directory` in one commit, through huggingface_hub's public API only (HfApi.create_branch
    for a new revision, HfApi.create_commit), not transformers' private upload helpers."""
    import huggingface_hub

    api = huggingface_hub.HfApi(token=token)
    if revision is not None and not revision.startswith("refs/pr"):
        api.create_branch(repo_id=repo_id, branch=revision, token=token, exist_ok=True)
    paths = sorted(os.path.join(folder, name) for folder, _, names in os.walk(directory) for name in names)
    operations = [huggingface_hub.CommitOperationAdd(path_in_repo=os.path.relpath(path, directory).replace(os.sep, "/"),
                                                     path_or_fileobj=path) for path in paths]
    return api.create_commit(repo_id=repo_id, operations=operations, commit_message=commit_message,
                             commit_description=commit_description, token=token, create_pr=create_pr,
                             revision=revision)


def save_pretrained(model, directory, card_info: dict | None = None, **kwargs):
    """`model.save_pretrained(directory, **kwargs)`, then this library's model card in README.md (on the main
    process only, as transformers writes the weights)."""
    result = model.save_pretrained(directory, **kwargs)
    if kwargs.get("is_main_process", True):
        write_model_card(model, directory, card_info)
    return result


def push_to_hub(model, repo_id: str, *, card_info: dict | None = None, commit_message: str | None = None,
                private: bool | None = None, token=None, max_shard_size="50GB", create_pr: bool = False,
                revision: str | None = None, commit_description: str | None = None):
    """Upload the model with this library's model card: saved to a temporary folder, then one commit of every file
    through huggingface_hub's public API (`upload_directory`)."""
    import tempfile

    repo_id = create_hub_repo(repo_id, private=private, token=token)
    with tempfile.TemporaryDirectory() as tmp_dir:
        save_pretrained(model, tmp_dir, card_info={**(card_info or {}), "repo_id": repo_id},
                        max_shard_size=max_shard_size)
        return upload_directory(tmp_dir, repo_id, token=token, commit_message=commit_message or "Upload model",
                                commit_description=commit_description, create_pr=create_pr, revision=revision)


__all__ = ["save_pretrained", "push_to_hub", "model_card_text", "write_model_card", "read_card_info",
           "attention_summary", "LOADING_NOTE", "create_hub_repo", "upload_directory"]
