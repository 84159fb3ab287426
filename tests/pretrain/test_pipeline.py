"""load_documents (raw text) and prefetch; the fake tokenizer, objective and documents test_streaming uses."""
import types

import ml_collections
import numpy as np
import pytest

from objectives import build_objective
from pretrain.data.documents import load_documents
from pretrain.data.prefetch import prefetch

VOCAB = 200


def fake_tokenizer():
    return types.SimpleNamespace(vocab_size=VOCAB, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4,
                                 special_ids=(0, 2, 3, 4), word_start=np.ones(VOCAB, bool))


def objective():
    config = ml_collections.ConfigDict(dict(
        name="bert_pretraining", mask_prob=0.15, replace_with_mask=0.8, replace_with_random=0.1,
        max_predictions_per_seq=5, long_max_predictions_per_seq=20, whole_word_masking=False,
        next_sentence=True, short_seq_prob=0.1))
    return build_objective(config, fake_tokenizer())


def documents(n=40, seed=0):
    rng = np.random.default_rng(seed)
    return [[rng.integers(5, VOCAB, rng.integers(3, 15)).astype(np.int32) for _ in range(rng.integers(2, 8))]
            for _ in range(n)]


def test_prefetch_keeps_order_and_raises_producer_errors():
    assert [s for s, _ in prefetch(lambda s: s * 2, range(3, 9), size=2)] == list(range(3, 9))
    assert [b for _, b in prefetch(lambda s: s * 2, range(3), size=0)] == [0, 2, 4]

    def broken(step):
        if step == 2:
            raise RuntimeError("bad batch")
        return step

    with pytest.raises(RuntimeError, match="bad batch"):
        list(prefetch(broken, range(5), size=2))


def raw_text_config(path, **kw) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(dict(source="raw_text", path=str(path), eval_fraction=0.25, eval_documents=0,
                                          max_documents=0, **kw))


def test_raw_text_keeps_files_verbatim_and_holds_out_the_tail(tmp_path):
    from pretrain.data.tokenizers import CharTokenizer
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("to be,\n\nor not\n")
    b.write_text("  to be\n")
    text = "to be,\n\nor not\n  to be\n"
    tokenizer = CharTokenizer(str(a))  # a's characters cover b's
    (train,), (held_out,) = load_documents(raw_text_config(f"{a},{b}"), tokenizer)
    cut = int(len(text) * 0.75)
    assert tokenizer.decode(train[0]) == text[:cut] and tokenizer.decode(held_out[0]) == text[cut:]
    config = raw_text_config(a)
    config.eval_fraction = 0.0
    (everything,), held_out = load_documents(config, tokenizer)
    assert tokenizer.decode(everything[0]) == "to be,\n\nor not\n" and held_out == []


@pytest.mark.parametrize("change,match", [(dict(eval_fraction=1.0), "eval_fraction"),
                                          (dict(eval_documents=3), "eval_fraction, not")])
def test_raw_text_errors_name_the_fix(tmp_path, change, match):
    from pretrain.data.sources import CorpusError
    from pretrain.data.tokenizers import CharTokenizer
    path = tmp_path / "a.txt"
    path.write_text("abc")
    config = raw_text_config(path)
    config.update(change)
    with pytest.raises(CorpusError, match=match):
        load_documents(config, CharTokenizer(str(path)))
