"""CoNLL-style column files (CoNLL-2003 NER, POS, chunking), entity-level scoring as conlleval counts it, and the
tagging task the fine-tuning loop runs on them (`ConllTask`).

The layout of CoNLL-2003's `train.txt` / `valid.txt` / `test.txt`: one token per line, space-separated
columns `word POS chunk NER`, a blank line between sentences and `-DOCSTART- -X- -X- O` lines between
documents. Which column holds the tags is a key (`TAG_COLUMNS`) or a column number, so the same reader serves
NER, POS and chunking. BIO tags are checked as conlleval reads them: an I-X that does not continue an X chunk
(after O or another type) starts a chunk, as B-X would; such tags are accepted and counted, so the caller can
warn. Entity-level precision, recall and F1 come from seqeval, the maintained port of conlleval.
"""
from __future__ import annotations

import dataclasses
import os

from pretrain.data.sources import as_text
from pretrain.runtime.errors import UserError
from pretrain.tasks.base import data_location
from pretrain.workdir import storage

TAG_COLUMNS = {"pos": 1, "chunk": 2, "ner": 3}  # CoNLL-2003's columns after the word
DOCSTART = "-DOCSTART-"


class ConllDataError(UserError):
    """A CoNLL file that cannot be read (one line naming the file, the line and the fix)."""


@dataclasses.dataclass(frozen=True)
class Sentence:
    words: tuple[str, ...]
    tags: tuple[str, ...]
    line: int  # the file's line of the sentence's first token (1-based), for messages
    rows: tuple[tuple[str, ...], ...] = ()  # every column of every token line, to write predictions beside them


@dataclasses.dataclass
class ConllFile:
    sentences: list[Sentence]
    columns: int                 # columns per token line
    repaired_starts: int = 0     # I-X tags that start a chunk (after O or another type): read as B-X
    source: str = ""             # the file's path, "TFDS conll2003 <split>" or "Hub <path> <split>"

    def where(self, sentence: Sentence, offset: int) -> str:
        """The place of a sentence's word for a message: file:line, or TFDS's sentence and word number."""
        if self.source.startswith(("TFDS", "Hub")):
            return f"{self.source} sentence {sentence.line} word {offset + 1}"
        return f"{self.source}:{sentence.line + offset}"


def tag_column(key: str | int) -> int:
    """'ner' | 'chunk' | 'pos' | a column number (0 = the word) -> the column index of the tags."""
    if isinstance(key, int) or str(key).isdigit():
        column = int(key)
        if column < 1:
            raise ConllDataError(f"tag column {key!r}: column 0 holds the words; use 1 or above, or one of "
                                 f"{', '.join(TAG_COLUMNS)}")
        return column
    if key not in TAG_COLUMNS:
        raise ConllDataError(f"tag column {key!r} is not one of {', '.join(TAG_COLUMNS)} or a column number")
    return TAG_COLUMNS[key]


def read_conll(path: str, tag_key: str | int = "ner", *, bio: bool = True) -> ConllFile:
    """Sentences of (word, tag) from a CoNLL column file. bio=True checks the tags as BIO (O, B-X, I-X); POS
    and other tag sets pass bio=False. Every token line must have the first one's number of columns."""
    column = tag_column(tag_key)
    if not os.path.exists(path):
        raise ConllDataError(f"CoNLL file not found: {path} (give --config.data.dir the folder with train.txt, "
                             "valid.txt and test.txt)")
    out = ConllFile([], 0, source=path)
    words, tags, rows, first_line = [], [], [], 0
    with open(path, encoding="utf-8") as f:
        for number, raw in enumerate(f, start=1):
            fields = raw.split()
            if not fields or fields[0] == DOCSTART:
                _close_sentence(out, words, tags, rows, first_line)
                words, tags, rows = [], [], []
                continue
            out.columns = out.columns or len(fields)
            if len(fields) != out.columns or column >= len(fields):
                raise ConllDataError(f"{path}:{number}: {len(fields)} columns where the file's first token line "
                                     f"has {out.columns} and the tags are column {column} (fix the line)")
            if bio:
                out.repaired_starts += _check_bio(fields[column], tags[-1] if tags else "O", f"{path}:{number}")
            words.append(fields[0])
            tags.append(fields[column])
            rows.append(tuple(fields))
            first_line = first_line if len(words) > 1 else number
    _close_sentence(out, words, tags, rows, first_line)
    if not out.sentences:
        raise ConllDataError(f"{path} has no sentences: expected lines of 'word ... tag' with a blank line "
                             "between sentences")
    return out


def _close_sentence(out: ConllFile, words: list[str], tags: list[str], rows: list[tuple[str, ...]],
                    line: int) -> None:
    if words:
        out.sentences.append(Sentence(tuple(words), tuple(tags), line, tuple(rows)))


def _check_bio(tag: str, previous: str, where: str) -> int:
    """Raises on a tag that is not O, B-X or I-X; -> 1 for an I-X that starts a chunk (conlleval: as B-X)."""
    prefix, _, kind = tag.partition("-")
    if tag != "O" and not (prefix in ("B", "I") and kind):
        raise ConllDataError(f"{where}: tag {tag!r} is outside the BIO scheme (O, B-TYPE, I-TYPE); for POS or "
                             "chunk tags read the file with bio=False")
    return int(prefix == "I" and previous.partition("-")[2] != kind)


def read_conll_tfds(split: str, tag_key: str | int = "ner", data_dir: str = "", *, bio: bool = True) -> ConllFile:
    """TFDS `conll2003` (array_record, no TensorFlow needed) as the same sentences, each with the rows
    (word, POS, chunk, NER) a CoNLL file would hold; Sentence.line counts sentences. Prepares the dataset first
    where `data_dir` lacks it (which downloads: needs the network)."""
    import tensorflow_datasets as tfds  # optional dependency: import only when used
    import tensorflow_datasets.text.conll2003  # noqa: F401  registers the builder

    where = data_dir or "~/tensorflow_datasets"
    try:
        source = tfds.data_source("conll2003", split=split, data_dir=data_dir or None,
                                  builder_kwargs={"file_format": "array_record"})
    except OSError as e:
        raise ConllDataError(f"TFDS dataset conll2003 is not prepared under {where} and downloading it failed "
                             f"({type(e).__name__}); prepare it where there is network, or set "
                             "--config.data.source=dir and --config.data.dir to the CoNLL files") from None
    keys = ("tokens", "pos", "chunks", "ner")
    names = [source.dataset_info.features[key].feature.names for key in keys[1:]]
    return _from_features(source.__getitems__(list(range(len(source)))), keys, names, tag_key, bio,
                          f"TFDS conll2003 {split}")


HUB_SPLITS = {"train": "train", "dev": "validation", "test": "test"}


def read_conll_hub(split: str, tag_key: str | int = "ner", path: str = "eriktks/conll2003", *,
                   bio: bool = True) -> ConllFile:
    """The Hugging Face Hub's CoNLL-2003 (`eriktks/conll2003`, or a local copy of a repository in its layout:
    tokens, pos_tags, chunk_tags, ner_tags), its tag ids mapped to names through the dataset's features."""
    from pretrain.data import hub
    try:
        dataset = hub.load(path, split=HUB_SPLITS[split], flags=hub.Flags.of_task())
    except hub.CorpusError as e:
        raise ConllDataError(str(e)) from None
    keys = ("tokens", "pos_tags", "chunk_tags", "ner_tags")
    missing = [key for key in keys if key not in dataset.features]
    if missing:
        raise ConllDataError(f"the dataset {path!r} has no column {missing[0]!r} (its columns are "
                             f"{list(dataset.features)}; CoNLL-2003's layout is {', '.join(keys)})")
    names = [_tag_names(dataset.features[key], key, path) for key in keys[1:]]
    return _from_features(dataset, keys, names, tag_key, bio, f"Hub {path} {HUB_SPLITS[split]}")


def _tag_names(feature, key: str, path: str) -> list[str]:
    """A Sequence(ClassLabel)'s names: how a tag id reads."""
    names = getattr(getattr(feature, "feature", None), "names", None)
    if not names:
        raise ConllDataError(f"the dataset {path!r} column {key!r} holds ids without names (not a sequence of "
                             "ClassLabel): save it with its features, or give the CoNLL files with source=dir")
    return list(names)


def _from_features(records, keys: tuple[str, ...], names: list[list[str]], tag_key: str | int, bio: bool,
                   source: str) -> ConllFile:
    """Sentences from records of tokens and tag ids (keys: tokens, POS, chunk, NER), each with the rows (word, POS,
    chunk, NER) a CoNLL file would hold; Sentence.line counts sentences."""
    column = tag_column(tag_key)
    out = ConllFile([], 4, source=source)
    for number, ex in enumerate(records, start=1):
        rows = tuple((as_text(word), *(tag_names[i] for tag_names, i in zip(names, ids)))
                     for word, *ids in zip(*(ex[key] for key in keys)))
        tags = [row[column] for row in rows]
        if bio:
            out.repaired_starts += sum(_check_bio(tag, tags[i - 1] if i else "O", f"{out.source} sentence {number}")
                                       for i, tag in enumerate(tags))
        _close_sentence(out, [row[0] for row in rows], tags, list(rows), number)
    if not out.sentences:
        raise ConllDataError(f"{out.source} has no sentences")
    return out


def entity_scores(gold: list[list[str]], predicted: list[list[str]]) -> dict[str, float]:
    """Entity-level precision, recall and F1 (fractions) over sentences of BIO tags, counted as conlleval does
    (seqeval's default mode: an I-X after O starts a chunk), and token accuracy."""
    from seqeval import metrics
    if [len(s) for s in gold] != [len(s) for s in predicted]:
        raise ValueError("entity_scores: gold and predicted sentences differ in number or length")
    return {"precision": float(metrics.precision_score(gold, predicted)),
            "recall": float(metrics.recall_score(gold, predicted)),
            "f1": float(metrics.f1_score(gold, predicted)),
            "accuracy": float(metrics.accuracy_score(gold, predicted))}


# ----------------------------------------------------------------------------------------------
# The task, as the fine-tuning loop sees it (pretrain/tasks/base.py).

NAMES = ("conll2003", "conll")  # config.task: CoNLL-2003 itself, or any file set in its layout
SPLIT_FILES = {"train": "train.txt", "dev": "valid.txt", "test": "test.txt"}


@dataclasses.dataclass(frozen=True)
class ConllTask:
    """Sequence labelling on CoNLL column files under `data_dir`: BIO entities scored by entity-level F1 as
    conlleval counts it, or any other tag set (POS) by token accuracy. `labels` is the tag set in id order:
    config.data.labels, or the train file's tags (O first, then sorted) recorded in `settings`."""
    name: str
    data_dir: str          # the CoNLL files (source dir), TFDS's data_dir ('' = its default), or the Hub dataset
    tag_column: str | int
    bio: bool
    labels: tuple[str, ...]
    kind: str = "tagging"  # tagging: a BIO tag per word | span: every span classified (config.head=span)
    source: str = "dir"    # dir: train.txt, valid.txt, test.txt | tfds: TFDS conll2003 | hf: eriktks/conll2003
    dev_splits = ("dev",)
    test_splits = ("test",)

    @classmethod
    def from_config(cls, config) -> ConllTask:
        d = config.data
        location = data_location(d, config.task, ", ".join(SPLIT_FILES.values()), "conll2003", ConllDataError,
                                 hub_name="eriktks/conll2003")
        head = config.get("head", "bio")  # bio: a tag per word | span: entity spans
        kind = "span" if head == "span" else "tagging"
        if head == "span" and not d.bio:
            raise ConllDataError(f"head=span classifies entity spans: it needs BIO tags (tags=ner or chunk), not "
                                 f"tags={d.tag_column}")
        task = cls(config.task, location, d.tag_column, d.bio, (), kind, d.source)
        labels = tuple(filter(None, d.labels.split(","))) if d.labels else ()
        if not labels:  # the train split's tags, O first
            seen = {t for s in task.read("train").sentences for t in s.tags}
            labels = tuple(sorted(seen, key=lambda t: (t != "O", t.partition("-")[2], t)))
        return dataclasses.replace(task, labels=labels)

    def read(self, split: str) -> ConllFile:
        if split not in SPLIT_FILES:
            raise ConllDataError(f"task {self.name} has no split {split!r}; use one of {', '.join(SPLIT_FILES)}")
        if self.source == "tfds":
            return read_conll_tfds(split, self.tag_column, self.data_dir, bio=self.bio)
        if self.source == "hf":
            return read_conll_hub(split, self.tag_column, self.data_dir, bio=self.bio)
        return read_conll(os.path.join(self.data_dir, SPLIT_FILES[split]), self.tag_column, bio=self.bio)

    @property
    def main_metric(self) -> str:
        return "f1" if self.bio else "accuracy"

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    @property
    def settings(self) -> dict:
        """config.data fields this task fixed: the tag set, so that evaluation reads ids the same way."""
        return {"labels": ",".join(self.labels)}

    def labelled(self, split: str) -> bool:
        return True  # CoNLL's test file has its tags

    def load(self, config, split: str, options=None) -> list[Sentence]:
        read, known = self.read(split), set(self.labels)
        for sentence in read.sentences:
            for offset, tag in enumerate(sentence.tags):
                if tag not in known:
                    raise ConllDataError(f"{read.where(sentence, offset)}: tag {tag!r} is not in the tag set "
                                         f"{','.join(self.labels)} (the train split's, or --config.data.labels)")
        if read.repaired_starts:
            print(f"Warning: {read.source}: {read.repaired_starts} I- tags start an entity (after O or another "
                  "type); read as B-, as conlleval does")
        return read.sentences

    def score(self, finetuner, predictions: list[list[str]], examples: list[Sentence]) -> dict[str, float]:
        gold = [list(s.tags) for s in examples]
        if self.bio:
            return entity_scores(gold, [list(p) for p in predictions])
        hits = [g == p for gs, ps in zip(gold, predictions) for g, p in zip(gs, ps)]
        return {"accuracy": sum(hits) / max(len(hits), 1)}

    def write_predictions(self, directory: str, split: str, finetuner, predictions: list[list[str]],
                          examples: list[Sentence]) -> str:
        """The input's columns with the predicted tag appended (conlleval's input: gold then predicted last)."""
        path = os.path.join(directory, f"{split}.txt")
        with storage.open_file(path, "w") as f:
            for sentence, tags in zip(examples, predictions):
                f.writelines(" ".join((*row, tag)) + "\n" for row, tag in zip(sentence.rows, tags))
                f.write("\n")
        return path
