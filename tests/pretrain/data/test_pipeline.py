"""pretrain/data/pipeline.py: load_documents (raw text) and prefetch."""
import ml_collections
import pytest

from pretrain.data.documents import load_documents
from pretrain.data.prefetch import prefetch


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
