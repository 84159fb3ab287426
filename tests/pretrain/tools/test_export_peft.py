"""pretrain/tools/export_hf_bert.py on parameter-efficient runs, in process, from a tiny random Hugging Face BERT: a
LoRA run (trained by the real fine-tuning loop) exports merged as a BertForSequenceClassification and
unmerged as a peft directory, both giving our model's logits in transformers / peft; prefix and prompt
tuning (random weights, no training) export as peft directories with the same logits; adapters and a base
that no longer matches its fingerprint are one-line errors."""
from __future__ import annotations

import collections
import json
import os
import re
import shutil

import flax
import jax
import numpy as np
import pytest

from tests.helpers.paths import SHARED_DATA

GLUE = os.path.join(SHARED_DATA, "glue")
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> str:
    """A random BERT (D 32, 2 layers, 4 heads) with a vocab.txt of MRPC's most common lowercase words."""
    import torch
    import transformers
    words = collections.Counter()
    with open(os.path.join(GLUE, "MRPC", "train.tsv"), encoding="utf-8-sig") as f:
        for line in list(f)[1:400]:
            for text in line.rstrip("\n").split("\t")[3:]:
                words.update(re.findall(r"[a-z]+|[^\sa-z0-9]", text.lower()))
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [w for w, _ in words.most_common(250)]
    config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=37, max_position_embeddings=64)
    torch.manual_seed(0)
    path = str(tmp_path_factory.mktemp("hf") / "tiny_bert")
    transformers.BertModel(config).save_pretrained(path)
    with open(os.path.join(path, "vocab.txt"), "w") as f:
        f.write("\n".join(vocab) + "\n")
    return path


def _config(base: str, method: str = "lora"):
    from configs import glue
    config = glue.get_config(f"task=mrpc,peft={method}")
    config.init, config.data.glue_dir = base, GLUE
    config.data.max_train_examples, config.data.max_seq_length = 32, 32
    config.batch_size, config.num_epochs, config.write_test_predictions = 16, 1, False
    config.optimizer.learning_rate = 0.1  # two steps that move LoRA's B well away from zero
    return config


@pytest.fixture(scope="module")
def lora_run(base_dir, tmp_path_factory) -> str:
    from pretrain.loops import finetuning
    workdir = str(tmp_path_factory.mktemp("runs") / "mrpc_lora")
    finetuning.finetune(_config(base_dir), workdir)
    return workdir


def _inputs(base: str, tokenizer: str | None = None) -> dict[str, np.ndarray]:
    """Three MRPC dev pairs, tokenized by transformers with the base's vocab.txt (or `tokenizer`'s): [B, L]."""
    import transformers
    with open(os.path.join(GLUE, "MRPC", "dev.tsv"), encoding="utf-8-sig") as f:
        rows = [line.rstrip("\n").split("\t") for line in list(f)[1:4]]
    tokenizer = transformers.BertTokenizer.from_pretrained(tokenizer) if tokenizer else \
        transformers.BertTokenizer(os.path.join(base, "vocab.txt"))
    return dict(tokenizer([r[3] for r in rows], [r[4] for r in rows], padding=True, truncation=True, max_length=32,
                          return_tensors="np"))


def _ours(params: dict, model_config, inputs: dict, peft_config=None) -> np.ndarray:
    """Our fine-tuned model's logits [B, C] (with peft_config's method attached)."""
    from models import peft as peft_modules
    from models.bert_tasks import BertForFineTuning
    from objectives.task_heads import head_kind
    model = BertForFineTuning(model_config, head_kind("classification"), 2, peft=peft_config or peft_modules.NONE)
    out = model.apply({"params": params}, np.asarray(inputs["input_ids"], np.int32),
                      np.asarray(inputs["token_type_ids"], np.int32), np.asarray(inputs["attention_mask"], np.int32))
    return np.asarray(out["logits"])


def _theirs(model, inputs: dict) -> np.ndarray:
    import torch
    model.eval()
    with torch.no_grad():
        return model(**{k: torch.as_tensor(v) for k, v in inputs.items()}).logits.numpy()


def _hf_classifier(base: str):
    import transformers
    return transformers.BertForSequenceClassification.from_pretrained(base, num_labels=2)


def _without_peft(tree):
    """Our parameter tree without its PEFT weights: the base model with the same head."""
    from models.peft import PEFT_NAMES
    if not isinstance(tree, dict):
        return tree
    return {k: _without_peft(v) for k, v in tree.items() if k not in PEFT_NAMES}


def test_lora_run_exports_merged_and_as_peft(lora_run, base_dir, tmp_path):
    import ml_collections
    import peft
    import transformers

    from pretrain.data import tokenizers
    from pretrain.finetuners import registry
    from pretrain.finetuners.base import model_config
    from pretrain.loops import evaluation
    from pretrain.tasks import registry as task_registry
    from pretrain.tools import export_hf_bert
    from pretrain.training import peft as parameter_efficient
    with open(os.path.join(lora_run, "config.json")) as f:
        config = ml_collections.ConfigDict(json.load(f))
    family = registry.for_config(config, task_registry.task_for_config(config), tokenizers.from_config(config.tokenizer))
    part, init, _ = parameter_efficient.load_stored(lora_run)
    params = evaluation.with_peft_base(config, family, part, init, "dev")  # the repo's own rebuild, for comparison
    lora_b = [np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(params) if "lora_b" in str(p)]
    assert len(lora_b) == 4 and all(np.abs(b).max() > 1e-3 for b in lora_b)  # B trained away from zero
    inputs = _inputs(base_dir)
    ours = _ours(params, model_config(config), inputs, parameter_efficient.peft_config(config))
    zero_b = jax.tree_util.tree_map_with_path(lambda p, x: x * 0 if "lora_b" in str(p) else x, params)
    zero_b_outputs = _ours(zero_b, model_config(config), inputs, parameter_efficient.peft_config(config))
    assert np.abs(zero_b_outputs - ours).max() > 10 * TOLERANCE
    # (zero B: LoRA matters)

    merged = str(tmp_path / "merged")
    print(export_hf_bert.export(lora_run, merged))
    assert not {"adapter_config.json", "adapter_model.safetensors"} & set(os.listdir(merged))
    model = transformers.BertForSequenceClassification.from_pretrained(merged)
    assert model.config.num_labels == 2
    np.testing.assert_allclose(_theirs(model, inputs), ours, atol=TOLERANCE)
    for key, value in _inputs(base_dir, tokenizer=merged).items():  # the vocab travelled with the weights
        np.testing.assert_array_equal(value, inputs[key])

    unmerged = str(tmp_path / "peft")
    print(export_hf_bert.export(lora_run, unmerged, peft=True))
    with open(os.path.join(unmerged, "adapter_config.json")) as f:
        adapter = json.load(f)
    assert adapter["base_model_name_or_path"] == os.path.abspath(base_dir)
    loaded = peft.PeftModel.from_pretrained(_hf_classifier(base_dir), unmerged)
    np.testing.assert_allclose(_theirs(loaded, inputs), ours, atol=TOLERANCE)


def test_lora_export_errors_are_one_line(lora_run, tmp_path):
    from pretrain.runtime.errors import UserError
    from pretrain.tools import export_hf_bert

    def refused(workdir, message, **kw):
        with pytest.raises(UserError, match=message) as info:
            export_hf_bert.export(workdir, str(tmp_path / "out"), **kw)
        assert "\n" not in str(info.value) and not os.path.exists(tmp_path / "out")

    def variant(name: str, method: str | None = None) -> str:  # a copy of the run with another config or base
        workdir = str(tmp_path / name)
        shutil.copytree(lora_run, workdir)
        if method:
            with open(os.path.join(workdir, "config.json")) as f:
                config = json.load(f)
            config["peft"]["method"] = method
            with open(os.path.join(workdir, "config.json"), "w") as f:
                json.dump(config, f)
        return workdir

    refused(variant("adapters", "adapters"), "peft.method=adapters: the peft library has no bottleneck adapters "
            r"\(no --peft export\).* cannot be merged")
    refused(variant("adapters2", "adapters"), "cannot be merged", peft=True)
    refused(variant("prefix", "prefix"), "peft.method=prefix.*cannot be merged into BERT: export it with --peft")
    moved = variant("moved")
    (step,) = os.listdir(os.path.join(moved, "checkpoints"))
    metadata = os.path.join(moved, "checkpoints", step, "data", "metadata")
    with open(metadata) as f:
        record = json.load(f)
    record["peft_base"]["fingerprint"] = "0" * 16
    with open(metadata, "w") as f:
        json.dump(record, f)
    refused(moved, "was fine-tuned from .* but the base found at .* has fingerprint")
    refused(moved, "was fine-tuned from .* but the base found at .* has fingerprint", peft=True)


@pytest.mark.parametrize("method, settings", [
    ("lora", {"lora_targets": ("key", "out", "intermediate", "output"), "lora_rank": 4, "lora_alpha": 16.0}),
    ("prefix", {"prefix_length": 3, "prefix_hidden_size": 16}),
    ("prefix", {"prefix_length": 3, "prefix_hidden_size": 0}),
    ("prompt", {"prompt_length": 3}),
])
def test_peft_directories_give_our_logits(base_dir, tmp_path, method, settings):
    """peft_io.save_peft_bert on random PEFT weights and head over the tiny base: every LoRA target's module
    name and layout, the prefix table's slot order (with and without the MLP) and the prompt's embeddings."""
    import peft

    from models import peft as peft_modules
    from models.bert_tasks import BertForFineTuning
    from models.convert import load_hf_bert, peft_io
    from objectives.task_heads import head_kind
    from pretrain.training import peft as parameter_efficient
    config, base = load_hf_bert(base_dir)
    spec = peft_modules.PeftConfig(method=method, **settings)
    inputs = _inputs(base_dir)
    ids = np.asarray(inputs["input_ids"], np.int32)
    params = BertForFineTuning(config, head_kind("classification"), 2, peft=spec).init(jax.random.key(1), ids, ids, ids)["params"]
    params = parameter_efficient.overlay(jax.tree.map(np.asarray, flax.core.meta.unbox(params)), {"bert": base["bert"]})
    rng = np.random.default_rng(0)
    moved = re.compile("lora_b|prefix_encoder|head")  # B away from zero, a prefix MLP and a head of some weight
    params = jax.tree_util.tree_map_with_path(
        lambda p, x: rng.normal(0, 0.3, x.shape).astype(x.dtype) if moved.search(str(p)) else x, params)
    ours = _ours(params, config, inputs, spec)
    without = _ours(_without_peft(params), config, inputs)
    assert np.abs(without - ours).max() > 100 * TOLERANCE  # the PEFT weights matter

    out = str(tmp_path / method)
    peft_io.save_peft_bert(out, params, config, spec)
    loaded = peft.PeftModel.from_pretrained(_hf_classifier(base_dir), out)
    np.testing.assert_allclose(_theirs(loaded, inputs), ours, atol=TOLERANCE)
