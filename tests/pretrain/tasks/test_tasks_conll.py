"""CoNLL column files: reading, the one-line errors (file and line), and entity scoring equal to conlleval's
reading of BIO (through seqeval) and to bio_to_spans."""
from __future__ import annotations

import numpy as np
import pytest
from seqeval import metrics as seqeval_metrics

from pretrain.data.tagging import bio_to_spans
from pretrain.tasks import conll

CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
call NN I-NP O

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER
"""


def write(tmp_path, text: str, name: str = "train.txt") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_read_conll_splits_sentences_and_takes_the_tag_column_by_key(tmp_path):
    path = write(tmp_path, CONLL)
    ner = conll.read_conll(path, "ner")
    assert [s.words for s in ner.sentences] == [("EU", "rejects", "German", "call"), ("Peter", "Blackburn")]
    assert ner.sentences[0].tags == ("B-ORG", "O", "B-MISC", "O") and ner.sentences[1].line == 8
    assert ner.columns == 4 and ner.repaired_starts == 0
    pos = conll.read_conll(path, "pos", bio=False)
    assert pos.sentences[1].tags == ("NNP", "NNP")
    assert conll.read_conll(path, 2, bio=False).sentences[0].tags == ("B-NP", "B-VP", "B-NP", "I-NP")


@pytest.mark.parametrize("text, message", [
    (CONLL.replace("rejects VBZ B-VP O", "rejects VBZ O"), r"train\.txt:4: 3 columns where .* has 4"),
    (CONLL.replace("I-PER", "E-PER"), r"train\.txt:9: tag 'E-PER' is outside the BIO scheme"),
    ("-DOCSTART- -X- -X- O\n\n\n", r"train\.txt has no sentences"),
])
def test_bad_conll_file_is_one_line_naming_file_and_line(tmp_path, text, message):
    with pytest.raises(conll.ConllDataError, match=message) as error:
        conll.read_conll(write(tmp_path, text))
    assert "\n" not in str(error.value)


def test_bad_tag_column_and_missing_file_are_one_line(tmp_path):
    with pytest.raises(conll.ConllDataError, match="'lemma' is not one of pos, chunk, ner or a column number"):
        conll.tag_column("lemma")
    with pytest.raises(conll.ConllDataError, match="column 0 holds the words"):
        conll.tag_column(0)
    with pytest.raises(conll.ConllDataError, match="CoNLL file not found: .*valid.txt"):
        conll.read_conll(str(tmp_path / "valid.txt"))


def test_i_tag_after_o_is_accepted_as_a_chunk_start_and_counted(tmp_path):
    text = "a X X I-PER\nb X X I-PER\nc X X I-LOC\nd X X O\n"  # I-PER after nothing, I-LOC after PER
    read = conll.read_conll(write(tmp_path, text))
    assert read.repaired_starts == 2
    assert bio_to_spans(list(read.sentences[0].tags)) == [(0, 1, "PER"), (2, 2, "LOC")]


def random_tags(rng, length: int) -> list[str]:
    return [str(rng.choice(["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "I-ORG"])) for _ in range(length)]


def test_entity_scores_count_chunks_as_conlleval_does():
    rng = np.random.default_rng(0)
    gold = [random_tags(rng, int(rng.integers(1, 12))) for _ in range(200)]
    predicted = [[t if rng.random() < 0.7 else str(rng.choice(["O", "B-PER", "I-LOC"])) for t in s] for s in gold]
    scores = conll.entity_scores(gold, predicted)
    # The same count by hand from bio_to_spans (conlleval's chunk reading, I- after O included).
    gold_spans = {(i, *span) for i, s in enumerate(gold) for span in bio_to_spans(s)}
    predicted_spans = {(i, *span) for i, s in enumerate(predicted) for span in bio_to_spans(s)}
    correct = len(gold_spans & predicted_spans)
    precision, recall = correct / len(predicted_spans), correct / len(gold_spans)
    assert scores["precision"] == pytest.approx(precision) and scores["recall"] == pytest.approx(recall)
    assert scores["f1"] == pytest.approx(2 * precision * recall / (precision + recall))
    assert scores["f1"] == pytest.approx(seqeval_metrics.f1_score(gold, predicted))
    assert 0.3 < scores["f1"] < 0.95  # neither trivially perfect nor empty: the comparison can fail


def test_entity_scores_refuse_sentences_of_different_lengths():
    with pytest.raises(ValueError, match="differ in number or length"):
        conll.entity_scores([["O", "B-PER"]], [["O"]])
