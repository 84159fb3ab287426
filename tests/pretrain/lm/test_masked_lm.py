"""pretrain/lm/masked_lm.py: pseudo-log-likelihoods of our BERT and ModernBERT against minicons' masked-LM scorer on
the exported transformers directories, both variants; which positions a row masks; the one-line refusals."""
from __future__ import annotations

import json

import numpy as np
import pytest

from pretrain.lm import masked_lm
from pretrain.runtime.errors import UserError
from pretrain.tools import export_hf_bert
from tests.helpers.masked_lms import fake_run, masked_run

TOLERANCE = 1e-4
SENTENCES = ["The quick brown fox jumps over the lazy dog.", "Shall I compare thee to a summer's day?",
             "Thou art more lovely and more temperate:", "unbelievably, the keys to the cabinet is on the table."]


SEEDS = {"bert": 1, "modernbert": 2, "electra": 3, "albert": 4}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """family -> (its folder, a tiny pretraining config, random weights), each built once for the module."""
    built = {}

    def run(family: str):
        if family not in built:
            built[family] = masked_run(tmp_path_factory, family, seed=SEEDS[family])
        return built[family]
    return run


def minicons_scorer(directory: str, variant: str):
    """minicons' MaskedLMScorer on a transformers directory. minicons 0.3.39 calls the tokenizer's batch_encode_plus,
    which transformers 5 removed; it was the tokenizer's own __call__ on a batch, and is given back as that."""
    import transformers
    from minicons import scorer

    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    tokenizer.batch_encode_plus = tokenizer.__call__
    model = transformers.AutoModelForMaskedLM.from_pretrained(directory)
    return scorer.MaskedLMScorer(model, device="cpu", tokenizer=tokenizer, PLL_metric=variant)


@pytest.mark.parametrize("variant", masked_lm.VARIANTS)
@pytest.mark.parametrize("family, exported", [("bert", ""), ("modernbert", ""), ("electra", "generator"),
                                              ("albert", "")])
def test_pll_matches_minicons_on_the_exported_directory(family, exported, variant, runs, tmp_path, monkeypatch):
    root, config, params = runs(family)
    workdir = fake_run(tmp_path / "run", config, params, monkeypatch)
    export_hf_bert.export(workdir, str(tmp_path / "hf"))
    theirs = minicons_scorer(str(tmp_path / "hf" / exported), variant).sequence_score(
        SENTENCES, reduction=lambda x: x.sum(0).item(), PLL_metric=variant)
    ours = masked_lm.sentence_scores(masked_lm.load_masked_lm(workdir), SENTENCES, variant)
    assert np.abs(ours - np.array(theirs)).max() < TOLERANCE, (ours, theirs)
    assert np.abs(ours - ours.mean()).max() > 1  # the sentences differ: a constant score would not pass


def test_word_l2r_masks_the_later_pieces_of_the_scored_word_only():
    ids = [2, 10, 11, 12, 13, 3]     # [CLS] a- -b c- -d [SEP]
    words = [-1, 0, 0, 1, 1, -1]
    rows = masked_lm.masked_rows(ids, range(1, 5), words, mask_id=4)
    assert [row for row, _, _ in rows] == [[2, 4, 4, 12, 13, 3], [2, 10, 4, 12, 13, 3], [2, 10, 11, 4, 4, 3],
                                         [2, 10, 11, 12, 4, 3]]
    assert [(t, target) for _, t, target in rows] == [(1, 10), (2, 11), (3, 12), (4, 13)]
    assert [row for row, _, _ in masked_lm.masked_rows(ids, range(3, 5), None, 4)] == [[2, 10, 11, 4, 13, 3],
                                                                                      [2, 10, 11, 12, 4, 3]]


@pytest.mark.slow  # tiny_gpt_workdir: a training run
def test_a_gpt_workdir_or_an_unknown_variant_is_one_line(tiny_gpt_workdir, runs, tmp_path, monkeypatch):
    with pytest.raises(UserError, match=r"holds a gpt model, which has no masked-LM head to score with: give a "
                                        r"pretraining run of bert, modernbert, electra"):
        masked_lm.load_masked_lm(tiny_gpt_workdir)
    _, config, params = runs("bert")
    lm = masked_lm.load_masked_lm(fake_run(tmp_path / "run", config, params, monkeypatch))
    with pytest.raises(UserError, match="PLL variant 'word_l2r' is not one of original, within_word_l2r"):
        masked_lm.sentence_scores(lm, SENTENCES, "word_l2r")


def test_a_sentence_longer_than_the_position_table_is_one_line(runs, tmp_path, monkeypatch):
    _, config, params = runs("bert")
    lm = masked_lm.load_masked_lm(fake_run(tmp_path / "run", config, params, monkeypatch))
    with pytest.raises(UserError, match=r"a request of \d+ tokens \(\[CLS\] and \[SEP\] included\) is longer than "
                                        r"the model's 64 positions"):
        masked_lm.sentence_scores(lm, [" ".join(["thee"] * 80)])
    assert json.loads((tmp_path / "run" / "config.json").read_text())["model"]["name"] == "bert"
