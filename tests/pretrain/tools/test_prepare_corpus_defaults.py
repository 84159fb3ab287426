"""The documented prepare_corpus command, with its defaults (no --eval_documents, no --lowercase), feeds every
pretraining config that reads the same tokenizer: BERT's (lowercase) and ModernBERT's (cased), each with its own
held-out documents (data.eval_documents). A refusal that remains names the one flag that fixes it."""
from __future__ import annotations

import pytest

from configs import common
from pretrain.data import sources, tokenizers
from pretrain.data.prepared import PreparedCorpus
from pretrain.data.sources import CorpusError
from pretrain.loops import pretraining
from pretrain.tools import prepare_corpus, train_tokenizer
from tests.helpers.asserts import assert_one_line_error

CONFIGS = ["configs/bert.py:size=tiny", "configs/modernbert.py:size=tiny"]


def _prepared(corpus: str, spm: str, output) -> str:
    """python -m pretrain.tools.prepare_corpus --input CORPUS --tokenizer SPM --output DIR --num_shards 8, in this
    process (one worker: the shards are the same whatever --workers)."""
    assert prepare_corpus.main(["--input", corpus, "--tokenizer", spm, "--output", str(output), "--num_shards", "8",
                                "--workers", "1", "--no_progress"]) == 0
    return str(output)


def _config(spec: str, directory: str, spm: str):
    config = common.load(spec)
    config.data.update(dict(source="prepared", path=directory))
    config.tokenizer.path = spm
    return config


@pytest.mark.parametrize("spec", CONFIGS)
def test_the_documented_command_feeds_the_config_with_its_held_out_documents(tmp_path, corpus_and_tokenizer, spec):
    corpus, spm = corpus_and_tokenizer  # a model of train_tokenizer's defaults: it folds case itself
    config = _config(spec, _prepared(corpus, spm, tmp_path / "prepared"), spm)
    assert config.data.eval_documents > 0
    _, train, held_out = pretraining.data_streams(config)
    assert len(held_out["eval"].documents) == config.data.eval_documents
    assert len(train.documents) + config.data.eval_documents == len(PreparedCorpus.open(config.data.path))


def test_a_cased_model_prepared_lowercase_is_refused_naming_the_one_flag(tmp_path, corpus_and_tokenizer):
    corpus = corpus_and_tokenizer[0]
    cased = train_tokenizer.train_sentencepiece(corpus, str(tmp_path / "cased"), vocab_size=500, lowercase=False)
    config = _config(CONFIGS[1], _prepared(corpus, cased, tmp_path / "prepared"), cased)
    with pytest.raises(CorpusError) as e:
        pretraining.data_streams(config)
    assert_one_line_error(e, "--no-lowercase", "--config.tokenizer.lowercase=True")


def test_lowercasing_changes_no_id_of_a_model_that_folds_case(corpus_and_tokenizer):
    corpus, spm = corpus_and_tokenizer
    documents = sources.read_text_corpus(corpus)[:40]
    cased, lowered = (tokenizers.load_tokenizer("sentencepiece", spm, lowercase=lowercase) for lowercase in (0, 1))
    assert cased.folds_case and lowered.folds_case
    assert ([[s.tolist() for s in d] for d in sources.tokenize_documents(documents, cased)]
            == [[s.tolist() for s in d] for d in sources.tokenize_documents(documents, lowered)])
