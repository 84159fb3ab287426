"""GLUE files in the official layout for the tests: the shared download's place, and crafted rows of the tasks
it lacks (STS-B, QQP, MNLI, QNLI, RTE), written as download_glue_data.py lays them out."""
from __future__ import annotations

import os

from tests.helpers.paths import SHARED_DATA

GLUE = os.path.join(SHARED_DATA, "glue")


def write_lines(root, relpath: str, lines: list[str]) -> str:
    path = os.path.join(root, relpath)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
    return path


def tsv(*fields) -> str:
    return "\t".join(str(f) for f in fields)



MNLI_TRAIN_HEADER = tsv("index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
                         "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label")
MNLI_DEV_HEADER = MNLI_TRAIN_HEADER.replace("label1\tgold_label", "label1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label")
MNLI_TEST_HEADER = MNLI_TRAIN_HEADER.replace("\tlabel1\tgold_label", "")
STSB_HEADER = tsv("index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2",
                   "score")


def _mnli_row(i, s1, s2, *labels):
    return tsv(i, 31193, f"{31193 + i}n", "government", "( x )", "( y )", "(ROOT x)", "(ROOT y)", s1, s2, *labels)


def write_crafted(root: str) -> str:
    """2-3 rows per split, in the official layout, for the tasks whose files are not in the shared download (and
    the first lines of CoLA's where it is there). -> root."""
    files = {
        "STS-B/train.tsv": [
            STSB_HEADER,
            tsv(0, "main-captions", "MSRvid", "2012test", 1, "none", "none", 'A "plane" is taking off.',
                "An air plane is taking off.", "5.000"),
            tsv(1, "main-news", "MSRvid", "2012test", 4, "none", "none", "A man is playing a large flute.",
                "A man is playing a flute.", "3.800")],
        "STS-B/dev.tsv": [STSB_HEADER, tsv(0, "a", "b", "c", 9, "n", "n", "One.", "Two.", "0.25")],
        "STS-B/test.tsv": [STSB_HEADER.rsplit("\t", 1)[0],
                           tsv(0, "a", "b", "c", 9, "n", "n", "Test one.", "Test two."),
                           tsv(1, "a", "b", "c", 9, "n", "n", "Test three.", "Test four.")],
        "QQP/train.tsv": [tsv("id", "qid1", "qid2", "question1", "question2", "is_duplicate"),
                          tsv(133273, 213221, 213222, "How is life as a math student?", "Which level?", 0),
                          tsv(402555, 536040, 536041, "How do I relax?", "How can one relax?", 1)],
        "QQP/test.tsv": [tsv("id", "question1", "question2"), tsv(0, "Why?", "Why not?"), tsv(1, "Who?", "Whom?")],
        "MNLI/train.tsv": [MNLI_TRAIN_HEADER, _mnli_row(0, "P0.", "H0.", "neutral", "neutral"),
                           _mnli_row(1, "P1.", "H1.", "entailment", "entailment")],
        "MNLI/dev_matched.tsv": [MNLI_DEV_HEADER, _mnli_row(0, "Pm.", "Hm.", *["contradiction"] * 6)],
        "MNLI/dev_mismatched.tsv": [MNLI_DEV_HEADER, _mnli_row(0, "Pmm0.", "Hmm0.", *["entailment"] * 6),
                                    _mnli_row(1, "Pmm1.", "Hmm1.", *["neutral"] * 6)],
        "MNLI/test_matched.tsv": [MNLI_TEST_HEADER, _mnli_row(0, "Tm.", "Tm2.")],
        "MNLI/test_mismatched.tsv": [MNLI_TEST_HEADER, _mnli_row(0, "Tmm.", "Tmm2."), _mnli_row(1, "Tmm3.", "Tmm4.")],
        "QNLI/dev.tsv": [tsv("index", "question", "sentence", "label"),
                         tsv(0, "What came into force?", "The law came into force.", "entailment"),
                         tsv(1, "What is 'Dutch'?", "The Netherlands are flat.", "not_entailment")],
        "RTE/train.tsv": [tsv("index", "sentence1", "sentence2", "label"),
                          tsv(0, "No weapons were found.", "Weapons were found.", "not_entailment"),
                          tsv(1, "A place of sorrow.", "Pope is sorrowful.", "entailment")],
        "RTE/dev.tsv": [tsv("index", "sentence1", "sentence2", "label"), tsv(0, "A.", "B.", "entailment")],
        "RTE/test.tsv": [tsv("index", "sentence1", "sentence2"), tsv(0, "C.", "D."), tsv(1, "E.", "F.")],
    }
    if os.path.isdir(GLUE):  # a real excerpt for TFDS: first lines of each official CoLA file
        for split in ("train", "dev", "test"):
            with open(os.path.join(GLUE, "CoLA", f"{split}.tsv"), encoding="utf-8") as f:
                files[f"CoLA/{split}.tsv"] = [next(f).rstrip("\n") for _ in range(5)]
    for relpath, lines in files.items():
        write_lines(root, relpath, lines)
    return root
