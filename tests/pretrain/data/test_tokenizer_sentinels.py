"""T5 sentinels and eos: our tokenizers against transformers' T5Tokenizer / BertTokenizer (no network).

transformers 5 builds T5Tokenizer from a directory holding `spiece.model` (from_pretrained, local
files only); it appends `<extra_id_99>` ... `<extra_id_0>` after the SentencePiece vocabulary.
"""
import shutil

import ml_collections
import numpy as np
import pytest

from objectives.interface import ObjectiveError
from pretrain.data.tokenizers import MissingTokenError, TokenizerError, load_tokenizer
from tests.helpers.data import WORDPIECE_VOCAB

transformers = pytest.importorskip("transformers")

TEXTS = [
    "The cat <extra_id_0> sat on<extra_id_1> the mat.",
    "x<extra_id_5>y",
    "<extra_id_0>",
    "<extra_id_0> <extra_id_1>",
    "<extra_id_3>. the end<extra_id_99>",
    "a plain sentence about the interpreter, with no sentinel",
    "past the range: <extra_id_100> and <extra_id_01> stay text",
]
UNKNOWN = "\u4e2d"  # a character the corpus never shows: <unk>


@pytest.fixture(scope="module")
def t5_layout_model(corpus_and_tokenizer, tmp_path_factory):
    """A cased SentencePiece model with T5's ids: pad 0, </s> 1, unk 2, no [CLS] [SEP] [MASK]."""
    import sentencepiece as spm
    prefix = str(tmp_path_factory.mktemp("t5spm") / "spiece")
    spm.SentencePieceTrainer.train(input=corpus_and_tokenizer[0], model_prefix=prefix, vocab_size=400,
                                   pad_id=0, eos_id=1, unk_id=2, bos_id=-1, normalization_rule_name="nmt_nfkc",
                                   num_threads=2, minloglevel=2)
    return prefix + ".model"


def hf_t5_tokenizer(model_path, tmp_path, **kwargs):
    folder = tmp_path / "hf"
    folder.mkdir()
    shutil.copy(model_path, folder / "spiece.model")
    return transformers.T5Tokenizer.from_pretrained(str(folder), extra_ids=100, local_files_only=True, **kwargs)


def assert_agrees_with(ours, theirs, texts):
    assert ours.vocab_size == theirs.vocab_size == ours.num_extra_ids + 400
    assert [ours.sentinel_id(i) for i in range(100)] == theirs.convert_tokens_to_ids(
        [f"<extra_id_{i}>" for i in range(100)])
    assert ours.sentinel_id(0) == ours.vocab_size - 1 and ours.sentinel_id(99) == 400
    for text in texts:
        ids = ours.encode(text)
        assert ids == theirs.encode(text, add_special_tokens=False), text
        assert ours.decode(ids) == theirs.decode(ids), text
    assert ours.encode_batch(texts) == [ours.encode(t) for t in texts]


def test_t5_layout_model_agrees_with_t5tokenizer(t5_layout_model, tmp_path):
    tok = load_tokenizer("sentencepiece", t5_layout_model, lowercase=False, extra_ids=100)
    hf = hf_t5_tokenizer(t5_layout_model, tmp_path)
    assert (tok.pad_id, tok.eos_id, tok.unk_id) == (hf.pad_token_id, hf.eos_token_id, hf.unk_token_id) == (0, 1, 2)
    assert_agrees_with(tok, hf, TEXTS)
    assert tok.decode(tok.encode("x <extra_id_0> y")) == "x<extra_id_0> y"  # T5Tokenizer's spacing, checked above
    # <unk> encodes alike, but decodes as sentencepiece (and seqio) print it, not as the piece's text.
    ids = tok.encode(f"a {UNKNOWN}<extra_id_0>")
    assert ids == hf.encode(f"a {UNKNOWN}<extra_id_0>", add_special_tokens=False) and tok.unk_id in ids
    assert tok.decode(ids) == "a  \u2047 <extra_id_0>" and hf.decode(ids) == "a <unk><extra_id_0>"
    assert tok.id_to_piece(tok.sentinel_id(7)) == "<extra_id_7>" == hf.convert_ids_to_tokens(tok.sentinel_id(7))
    # Specials: pad, </s> and every sentinel are never masked; <unk> is a real token.
    assert set(tok.special_ids) == {0, 1, *range(400, 500)}
    assert tok.word_start.shape == (500,) and tok.word_start[400:].all()
    with pytest.raises(ValueError, match="100 extra ids"):
        tok.sentinel_id(100)


def test_bert_layout_model_agrees_with_t5tokenizer(corpus_and_tokenizer, tmp_path):
    """Our demo models (pad 0, unk 1, [CLS] 2, [SEP] 3, [MASK] 4, no </s>): eos falls back to [SEP]
    (T5Tokenizer told eos_token='[SEP]' agrees); the BERT ids stay where they were."""
    import sentencepiece as spm
    prefix = str(tmp_path / "spm400")
    from pretrain.tools import train_tokenizer
    model = train_tokenizer.train_sentencepiece(corpus_and_tokenizer[0], prefix, vocab_size=400, num_threads=2)
    tok = load_tokenizer("sentencepiece", model, extra_ids=100)
    hf = hf_t5_tokenizer(model, tmp_path, eos_token="[SEP]")
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id, tok.eos_id) == (0, 1, 2, 3, 4, 3)
    assert tok.eos_id == hf.eos_token_id
    assert_agrees_with(tok, hf, [t.lower() for t in TEXTS])  # an uncased model: T5Tokenizer case-folds too
    assert tok.special_ids == (0, 2, 3, 4, *range(400, 500))
    plain = load_tokenizer("sentencepiece", model)
    text = "the interpreter raises an exception."
    assert tok.encode(text) == plain.encode(text) == spm.SentencePieceProcessor(model_file=model).encode(text)
    assert tok.word_start[:400].tolist() == plain.word_start.tolist()


def test_without_extra_ids_nothing_changes(t5_layout_model):
    tok = load_tokenizer("sentencepiece", t5_layout_model, lowercase=False)
    assert tok.vocab_size == 400 and tok.num_extra_ids == 0 and tok.eos_id == 1
    assert max(tok.encode("<extra_id_0>")) < 400  # text, as sentencepiece itself encodes it
    with pytest.raises(ValueError):
        tok.sentinel_id(0)


def test_missing_bert_pieces_raise_one_line_errors(t5_layout_model):
    tok = load_tokenizer("sentencepiece", t5_layout_model, lowercase=False, extra_ids=100)
    for attribute, piece in [("cls_id", "[CLS]"), ("sep_id", "[SEP]"), ("mask_id", "[MASK]")]:
        with pytest.raises(MissingTokenError) as e:
            getattr(tok, attribute)
        message = str(e.value)
        assert piece in message and t5_layout_model in message and "train_tokenizer" in message
        assert "\n" not in message
    from objectives.bert_pretraining import BertPretraining
    objective = BertPretraining(ml_collections.ConfigDict(dict(next_sentence=True, short_seq_prob=0.1,
                                                                max_predictions_per_seq=20)), tok)
    docs = [[np.arange(5, 20, dtype=np.int32)] * 3] * 4
    with pytest.raises(ObjectiveError, match=r"\[CLS\]"):
        objective.create_instances(docs, np.random.default_rng(0), max_seq_length=16)


def test_wordpiece_extra_ids_agree_with_bert_tokenizer(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(WORDPIECE_VOCAB) + "\n")
    tok = load_tokenizer("wordpiece", str(vocab), extra_ids=3)
    hf = transformers.BertTokenizer(vocab=str(vocab), do_lower_case=True)
    hf.add_special_tokens({"additional_special_tokens": [f"<extra_id_{i}>" for i in reversed(range(3))]})
    n = len(WORDPIECE_VOCAB)
    assert tok.vocab_size == len(hf) == n + 3 and tok.num_extra_ids == 3
    assert [tok.sentinel_id(i) for i in range(3)] == [n + 2, n + 1, n] == hf.convert_tokens_to_ids(
        [f"<extra_id_{i}>" for i in range(3)])
    for text in ["hello <extra_id_0> world", "The quick<extra_id_1>fox jumped.", "<extra_id_2>unaffable, hello"]:
        ids = tok.encode(text)
        assert ids == hf.encode(text, add_special_tokens=False), text
        assert tok.decode(ids) == hf.decode(ids), text
    # BERT's ids are unchanged; eos is [SEP]; the sentinels join the never-masked specials.
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id, tok.eos_id) == (0, 2, 3, 4, 5, 4)
    assert tok.special_ids == (0, 1, 3, 4, 5, n, n + 1, n + 2)
    assert tok.word_start.shape == (n + 3,) and tok.word_start[n:].all()
    assert tok.encode("[MASK]") != [tok.mask_id]


def test_negative_extra_ids_is_a_user_error(t5_layout_model):
    with pytest.raises(TokenizerError, match="extra_ids=-1"):
        load_tokenizer("sentencepiece", t5_layout_model, extra_ids=-1)
