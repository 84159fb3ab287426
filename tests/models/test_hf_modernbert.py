"""Hugging Face ModernBERT import/export (models/convert/hf_modernbert.py): our ModernBertForMaskedLM and fine-tuning
heads compute what transformers' classes compute on a directory they saved (padding, a sequence longer than the
sliding window, looped and scanned layers), a round trip reproduces every tensor, transformers loads our exports
whole, and the published sizes have transformers' parameter counts."""
from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

import models
from models import stack
from models.convert.hf_io import read_hf_config, read_weights
from models.convert.hf_modernbert import (config_from_hf, hf_state_dict, load_hf_modernbert, params_from_hf,
                                          save_hf_modernbert)
from models.errors import ModelInputError
from models.modernbert import ModernBertConfig, ModernBertForMaskedLM
from models.modernbert_tasks import ModernBertForFineTuning
from objectives.task_heads import head_kind
from tests.helpers.modernbert import write_modernbert_tokenizer

SIZES = {"vocab_size": 320, "hidden_size": 64, "num_hidden_layers": 5, "num_attention_heads": 4,
         "intermediate_size": 96, "max_position_embeddings": 64, "local_attention": 8, "global_attn_every_n_layers": 3,
         "pad_token_id": 0, "cls_token_id": 1, "sep_token_id": 2, "bos_token_id": 1, "eos_token_id": 2}
LENGTH = 24  # > local_attention: the local layers' window cuts
TOLERANCE = 1e-5


def random_hf(cls=transformers.ModernBertForMaskedLM, seed: int = 0, **overrides):
    """A transformers ModernBERT with weights of O(1) activations: every term of the computation shows."""
    torch.manual_seed(seed)
    model = cls(transformers.ModernBertConfig(**{**SIZES, **overrides})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif name.endswith("bias") or "embeddings" in name:  # embeddings: the tied decoder's too
                p.copy_(0.3 * torch.randn_like(p))
            else:
                p.copy_(0.8 * torch.randn_like(p) / p.shape[1] ** 0.5)
    return model


def inputs(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """ids [3, LENGTH] and the mask: a full row, and two padded ones."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, SIZES["vocab_size"], (3, LENGTH))
    mask = np.ones_like(ids)
    mask[1, 17:] = 0
    mask[2, 9:] = 0
    return ids, mask


def hf_outputs(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))


@pytest.fixture(scope="module")
def mlm_dir(tmp_path_factory) -> str:
    directory = str(tmp_path_factory.mktemp("modernbert_mlm"))
    random_hf().save_pretrained(directory)
    return directory


def our_mlm_logits(config: ModernBertConfig, params, ids, mask) -> np.ndarray:
    forward = jax.jit(lambda p, x, m: ModernBertForMaskedLM(config).apply({"params": p}, x, None, m)["mlm_logits"])
    return np.asarray(forward(params, jnp.asarray(ids), jnp.asarray(mask)))


def assert_close_at_real_positions(ours: np.ndarray, theirs: np.ndarray, mask: np.ndarray) -> float:
    real = mask.astype(bool)
    assert np.abs(theirs[real]).max() > 1.0  # logits of a size where a wrong term shows
    difference = float(np.abs(ours[real] - theirs[real]).max())
    assert difference < TOLERANCE, difference
    return difference


@pytest.mark.parametrize("scan_layers", [False, True])
def test_masked_lm_logits_match_transformers_with_padding(mlm_dir, scan_layers):
    config, params = load_hf_modernbert(mlm_dir)
    assert (config.num_layers, config.local_attention, config.window) == (5, 8, 4)
    if scan_layers:
        config, params = dataclasses.replace(config, scan_layers=True), stack.stack_layers(params)
        assert "layers" in params["modernbert"] and "layer_0" in params["modernbert"]  # layer 0 stays looped
    ids, mask = inputs()
    expected = hf_outputs(transformers.ModernBertForMaskedLM.from_pretrained(mlm_dir).eval(), ids, mask).logits.numpy()
    assert_close_at_real_positions(our_mlm_logits(config, params, ids, mask), expected, mask)


def test_one_layer_model_matches_transformers(tmp_path):
    """num_hidden_layers=1: layer 0 alone, built by the model itself, and an empty stack after it."""
    random_hf(num_hidden_layers=1).save_pretrained(tmp_path)
    config, params = load_hf_modernbert(str(tmp_path))
    assert config.num_layers == 1 and "layer_1" not in params["modernbert"]
    ids, mask = inputs()
    expected = hf_outputs(transformers.ModernBertForMaskedLM.from_pretrained(tmp_path).eval(), ids, mask).logits.numpy()
    assert_close_at_real_positions(our_mlm_logits(config, params, ids, mask), expected, mask)


# (head kind, transformers class, its options): the fine-tuning heads of objectives/task_heads
TASKS = [("classification", transformers.ModernBertForSequenceClassification, {"classifier_pooling": "cls"}),
         ("classification", transformers.ModernBertForSequenceClassification, {"classifier_pooling": "mean"}),
         ("tagging", transformers.ModernBertForTokenClassification, {}),
         ("qa", transformers.ModernBertForQuestionAnswering, {})]


@pytest.mark.parametrize("kind, cls, options", TASKS, ids=["cls", "mean", "tagging", "qa"])
def test_fine_tuning_heads_match_transformers(kind, cls, options, tmp_path):
    num_labels = 2 if kind == "qa" else 3
    random_hf(cls, seed=1, num_labels=num_labels, **options).save_pretrained(tmp_path)
    hf_config, _ = read_hf_config(str(tmp_path), "modernbert", "ModernBERT")
    config = config_from_hf(hf_config)
    assert config.classifier_pooling == options.get("classifier_pooling", "cls")
    params = params_from_hf(read_weights(str(tmp_path))[0], config, num_labels=num_labels, architecture=cls.__name__)
    ids, mask = inputs(1)
    model = ModernBertForFineTuning(config, head_kind(kind), num_labels)
    ours = jax.jit(lambda p: model.apply({"params": p}, jnp.asarray(ids), None, jnp.asarray(mask)))(params)
    theirs = hf_outputs(cls.from_pretrained(str(tmp_path)).eval(), ids, mask)
    if kind == "classification":
        assert_close_at_real_positions(np.asarray(ours["logits"]), theirs.logits.numpy(), np.ones(3, int))
    elif kind == "tagging":
        assert_close_at_real_positions(np.asarray(ours["logits"]), theirs.logits.numpy(), mask)
    else:
        for key in ("start_logits", "end_logits"):
            assert_close_at_real_positions(np.asarray(ours[key]), getattr(theirs, key).numpy(), mask)


@pytest.mark.parametrize("scan_layers", [False, True])
def test_import_then_export_reproduces_every_tensor(mlm_dir, scan_layers):
    config, params = load_hf_modernbert(mlm_dir)
    if scan_layers:
        config, params = dataclasses.replace(config, scan_layers=True), stack.stack_layers(params)
    original = read_weights(mlm_dir)[0]
    exported = hf_state_dict(params, config)
    assert sorted(exported) == sorted(original)
    for name, tensor in original.items():
        np.testing.assert_array_equal(exported[name], tensor, err_msg=name)


@pytest.mark.parametrize("cls", [transformers.ModernBertForSequenceClassification,
                                 transformers.ModernBertForQuestionAnswering])
def test_a_fine_tuned_checkpoint_round_trips_with_its_classifier(cls, tmp_path):
    random_hf(cls, seed=2, num_labels=2).save_pretrained(tmp_path)
    hf_config, _ = read_hf_config(str(tmp_path), "modernbert", "ModernBERT")
    config, original = config_from_hf(hf_config), read_weights(str(tmp_path))[0]
    params = params_from_hf(original, config, num_labels=2, architecture=cls.__name__)
    dense = "qa_outputs" if cls is transformers.ModernBertForQuestionAnswering else "classifier"
    assert list(params["head"]) == [dense] and params["head"][dense]["kernel"].shape == (64, 2)
    exported = hf_state_dict(params, config, num_labels=2, architecture=cls.__name__)
    assert sorted(exported) == sorted(original)
    for name, tensor in original.items():
        np.testing.assert_array_equal(exported[name], tensor, err_msg=name)
    # load_hf_modernbert keeps the body and the prediction head: the classifier is the task's
    assert set(load_hf_modernbert(str(tmp_path))[1]) == {"modernbert", "prediction_head"}


def count(tree) -> int:
    return sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(tree))


@pytest.mark.parametrize("size, shape, published", [
    ("base", (22, 768, 12, 1152), 149_655_232), ("large", (28, 1024, 16, 2624), 395_881_664)])
def test_published_sizes_have_transformers_parameter_counts(size, shape, published):
    layers, hidden, heads, inner = shape
    config = ModernBertConfig(vocab_size=50368, num_layers=layers, hidden_size=hidden, num_heads=heads,
                              intermediate_size=inner)
    ids = jnp.zeros((1, 8), jnp.int32)
    ours = count(jax.eval_shape(ModernBertForMaskedLM(config).init, jax.random.key(0), ids, None, ids + 1))
    with torch.device("meta"):  # shapes only: nothing is allocated
        theirs = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(
            vocab_size=50368, num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
            intermediate_size=inner))
    assert ours == sum(p.numel() for p in theirs.parameters()) == published


def test_an_export_loads_whole_in_transformers_with_its_tokenizer(mlm_dir, tmp_path):
    config, params = load_hf_modernbert(mlm_dir)
    tokenizer_file = write_modernbert_tokenizer(str(tmp_path / "tokenizer"), vocab_size=300)  # + 7 added <= 320
    out = str(tmp_path / "export")
    save_hf_modernbert(out, stack.stack_layers(params), dataclasses.replace(config, scan_layers=True),
                       tokenizer_file=tokenizer_file)
    model, info = transformers.ModernBertForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info
    ids, mask = inputs(2)
    expected = hf_outputs(model.eval(), ids, mask).logits.numpy()
    assert_close_at_real_positions(our_mlm_logits(config, params, ids, mask), expected, mask)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    with open(os.path.join(out, "config.json")) as f:
        written = json.load(f)
    assert (written["pad_token_id"], written["cls_token_id"], written["sep_token_id"]) == (
        tokenizer.pad_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id)
    assert tokenizer.mask_token == "[MASK]" and tokenizer("a b")["input_ids"][0] == tokenizer.cls_token_id
    save_hf_modernbert(out, params, config)  # a previous export is replaced
    assert not os.path.exists(os.path.join(out, "tokenizer.json"))


def test_a_fine_tuned_export_loads_with_its_labels(tmp_path):
    model_config = config_from_hf(random_hf().config.to_dict())
    model = ModernBertForFineTuning(model_config, head_kind("classification"), 3)
    ids, mask = inputs(3)
    params = model.init(jax.random.key(0), jnp.asarray(ids), None, jnp.asarray(mask))["params"]
    save_hf_modernbert(str(tmp_path), params, model_config, num_labels=3,
                       architecture="ModernBertForSequenceClassification", id2label=["neg", "neutral", "pos"])
    hf, info = transformers.ModernBertForSequenceClassification.from_pretrained(str(tmp_path),
                                                                                output_loading_info=True)
    assert not any(info.values()), info
    assert hf.config.id2label == {0: "neg", 1: "neutral", 2: "pos"}
    ours = np.asarray(model.apply({"params": params}, jnp.asarray(ids), None, jnp.asarray(mask))["logits"])
    np.testing.assert_allclose(ours, hf_outputs(hf.eval(), ids, mask).logits.numpy(), atol=TOLERANCE, rtol=0)


def test_export_refuses_what_it_cannot_write_in_one_line(mlm_dir, tmp_path):
    config, params = load_hf_modernbert(mlm_dir)
    cases = [({"num_labels": 3}, "is for a fine-tuning class"),
             ({"architecture": "ModernBertForQuestionAnswering", "num_labels": 3}, "question answering: 2"),
             ({"architecture": "BertForSequenceClassification", "num_labels": 3}, "no ModernBERT fine-tuning class"),
             ({"tokenizer_file": str(tmp_path / "none.json")}, "tokenizer not found")]
    big = write_modernbert_tokenizer(str(tmp_path / "big"), vocab_size=400)
    cases.append(({"tokenizer_file": big}, "but the model's vocab_size is 320"))
    for kwargs, expected in cases:
        with pytest.raises(ModelInputError) as info:
            save_hf_modernbert(str(tmp_path / "out"), params, config, **kwargs)
        assert expected in str(info.value) and "\n" not in str(info.value)
        assert not os.path.exists(tmp_path / "out")


def test_a_bert_directory_is_refused_in_one_line(tmp_path):
    transformers.BertModel(transformers.BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1,
                                                   num_attention_heads=2, intermediate_size=32)).save_pretrained(tmp_path)
    with pytest.raises(ModelInputError) as info:
        load_hf_modernbert(str(tmp_path))
    assert str(info.value) == (f"{tmp_path / 'config.json'}: model_type='bert', only 'modernbert' checkpoints can be "
                               "loaded here")
    with pytest.raises(ModelInputError, match="directory not found"):
        load_hf_modernbert(str(tmp_path / "nowhere"))


def test_the_registry_loads_a_modernbert_directory_with_its_tokenizer(mlm_dir, tmp_path):
    family, checkpoint = models.families.hf_checkpoint("modernbert")
    assert family.name == "modernbert" and models.registry.resolve(checkpoint.loader) is load_hf_modernbert
    spec = checkpoint.tokenizer(mlm_dir)
    assert spec == {"kind": "hf_json", "path": os.path.join(mlm_dir, "tokenizer.json"), "lowercase": False}
