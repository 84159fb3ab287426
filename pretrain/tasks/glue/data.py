"""The nine GLUE tasks: task metadata, readers for the official TSV files, TFDS and the Hugging Face Hub,
submission files.

Three sources give the same `Example`s: the official download (`download_glue_data.py` layout,
`<glue_dir>/<CoLA|SST-2|...>/<split>.tsv`), TFDS `glue/<task>` and the Hub's `nyu-mll/glue`. Label ids follow
TFDS (the Hub's are the same), so a model fine-tuned on one source scores the same on the others. Split names are
ours ('train', 'dev', 'test', MNLI's 'dev_matched' ...): they are the official file names; `_TFDS_SPLITS` maps them
to TFDS's (and the Hub's).
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
from collections.abc import Sequence

import numpy as np

from pretrain.data import hub
from pretrain.data.sources import as_text
from pretrain.runtime.errors import UserError
from pretrain.tasks.classification import Example, Labels
from pretrain.workdir import storage


@dataclasses.dataclass(frozen=True)
class DataOptions:
    """How the entry point that reads GLUE names its data options (error messages suggest these)."""
    glue_dir: str = "--config.data.glue_dir"
    tfds: str | None = "--config.data.source=tfds"
    skip_malformed: str | None = "--config.data.skip_malformed=true"
    hf_path: str | None = None  # the Hub dataset's option (None: glue_dir names it too)

    def how_to_get(self) -> str:
        return (f"set {self.glue_dir} to a folder in the official GLUE layout (download_glue_data.py)"
                + (f" or use {self.tfds}" if self.tfds else ""))

    def read_as_files(self, folder: str) -> str:
        """How to read a folder of the official TSV files instead: the source option that picks TFDS, set to dir."""
        source = self.tfds.split("=", 1)[0] if self.tfds else ""
        return f"{source + '=dir ' if source else ''}{self.glue_dir}={folder}"


CONFIG_OPTIONS = DataOptions(hf_path="--config.data.hf_path")  # pretrain.finetune
_TFDS_BATCH = 1024  # examples per random-access read


class GlueDataError(UserError):
    """A GLUE file or dataset a person must fix; one line naming the file (and line) and the fix."""


@dataclasses.dataclass(frozen=True)
class GlueTask(Labels):
    name: str  # TFDS config name: 'cola', 'sst2', ...
    directory: str  # folder of the official download: 'CoLA', 'SST-2', ...
    labels: tuple[str, ...]  # label names in TFDS id order; () for regression (STS-B)
    metrics: tuple[str, ...]  # official metrics, as named by glue_metrics.compute_metrics
    main_metric: str  # model selection, and the task's column in the BERT paper's table
    dev_splits: tuple[str, ...] = ("dev",)
    test_splits: tuple[str, ...] = ("test",)

    @property
    def is_pair(self) -> bool:
        return _COLUMNS[self.name].text_b is not None

    @property
    def splits(self) -> tuple[str, ...]:
        return ("train", *self.dev_splits, *self.test_splits)


@dataclasses.dataclass(frozen=True)
class _Columns:
    """Where a task's fields live in its official TSVs (header names; CoLA train/dev have no header)."""

    text_a: str
    text_b: str | None
    label: str  # class id, class name or (STS-B) score
    index: str = "index"  # test rows carry this id; the leaderboard matches predictions on it
    label_words: bool = False  # labels written as names (MNLI/QNLI/RTE) rather than ids


_NLI = ("entailment", "not_entailment")
TASKS: dict[str, GlueTask] = {t.name: t for t in [
    GlueTask("cola", "CoLA", ("unacceptable", "acceptable"), ("matthews_corr",), "matthews_corr"),
    GlueTask("sst2", "SST-2", ("negative", "positive"), ("accuracy",), "accuracy"),
    GlueTask("mrpc", "MRPC", ("not_equivalent", "equivalent"), ("f1", "accuracy"), "f1"),
    GlueTask("stsb", "STS-B", (), ("pearson", "spearman"), "spearman"),
    GlueTask("qqp", "QQP", ("not_duplicate", "duplicate"), ("f1", "accuracy"), "f1"),
    GlueTask("mnli", "MNLI", ("entailment", "neutral", "contradiction"), ("accuracy",), "accuracy",
             dev_splits=("dev_matched", "dev_mismatched"), test_splits=("test_matched", "test_mismatched")),
    GlueTask("qnli", "QNLI", _NLI, ("accuracy",), "accuracy"),
    GlueTask("rte", "RTE", _NLI, ("accuracy",), "accuracy"),
    GlueTask("wnli", "WNLI", ("not_entailment", "entailment"), ("accuracy",), "accuracy"),
]}

_COLUMNS = {
    "cola": _Columns("sentence", None, "label"),  # train/dev have no header: see read_glue_dir
    "sst2": _Columns("sentence", None, "label"),
    "mrpc": _Columns("#1 String", "#2 String", "Quality"),
    "stsb": _Columns("sentence1", "sentence2", "score"),
    "qqp": _Columns("question1", "question2", "is_duplicate", index="id"),
    "mnli": _Columns("sentence1", "sentence2", "gold_label", label_words=True),
    "qnli": _Columns("question", "sentence", "label", label_words=True),
    "rte": _Columns("sentence1", "sentence2", "label", label_words=True),
    "wnli": _Columns("sentence1", "sentence2", "label"),
}

# TFDS feature names for (text_a, text_b).
_TFDS_FEATURES = {
    "cola": ("sentence", None), "sst2": ("sentence", None), "mrpc": ("sentence1", "sentence2"),
    "stsb": ("sentence1", "sentence2"), "qqp": ("question1", "question2"), "mnli": ("premise", "hypothesis"),
    "qnli": ("question", "sentence"), "rte": ("sentence1", "sentence2"), "wnli": ("sentence1", "sentence2"),
}
_TFDS_SPLITS = {"train": "train", "dev": "validation", "test": "test",
                "dev_matched": "validation_matched", "dev_mismatched": "validation_mismatched",
                "test_matched": "test_matched", "test_mismatched": "test_mismatched"}

# Leaderboard file names (gluebenchmark.com submission zip).
_SUBMISSION_NAMES = {"test_matched": "MNLI-m", "test_mismatched": "MNLI-mm"}


def get_task(name: str) -> GlueTask:
    """'cola', 'CoLA', 'SST-2', 'sts-b', 'sst_2' ... -> the task."""
    key = name.strip().lower().replace("-", "").replace("_", "")
    if key not in TASKS:
        raise GlueDataError(f"unknown GLUE task {name!r} (the tasks are {', '.join(TASKS)})")
    return TASKS[key]


def _check_split(task: GlueTask, split: str) -> None:
    if split not in task.splits:
        raise GlueDataError(f"GLUE task {task.name!r} has no split {split!r} (its splits are {', '.join(task.splits)})")


# ----------------------------------------------------------------------------------------------
# Official TSV files.


def _task_file(task: GlueTask, split: str, data_dir: str, options: DataOptions = CONFIG_OPTIONS) -> str:
    """<data_dir>/<CoLA>/<split>.tsv, or <data_dir>/<split>.tsv when data_dir is the task folder itself."""
    data_dir = os.path.expanduser(data_dir)
    official = os.path.join(data_dir, task.directory, f"{split}.tsv")
    if os.path.isfile(official):
        return official
    flat = os.path.join(data_dir, f"{split}.tsv")
    if not os.path.isdir(os.path.join(data_dir, task.directory)) and os.path.isfile(flat):
        return flat
    raise GlueDataError(f"GLUE file not found: {official} ({options.how_to_get()})")


def _parse_label(task: GlueTask, value: str, where: str) -> int | float:
    if task.is_regression:
        try:
            score = float(value)
        except ValueError:
            score = math.nan
        if not math.isfinite(score):
            raise GlueDataError(f"{where}: score {value!r} is not a number (fix or delete the row)")
        return score
    valid = task.labels if _COLUMNS[task.name].label_words else tuple(str(i) for i in range(task.num_labels))
    if value in valid:
        return valid.index(value)
    raise GlueDataError(f"{where}: label {value!r} is not one of {', '.join(valid)} (fix or delete the row)")


def _rows(path: str, skip_malformed: bool, width: int | None = None, options: DataOptions = CONFIG_OPTIONS):
    """Yields (line number, {column: field}), or (line number, [fields]) for a file without a header
    whose rows have `width` fields.

    Quoting is off, as in the official readers: GLUE sentences contain unbalanced double quotes. A byte that is
    not UTF-8 raises GlueDataError with the file and line.
    """
    try:
        yield from _decoded_rows(path, skip_malformed, width, options)
    except UnicodeDecodeError as e:
        raise GlueDataError(_bad_utf8(path, e)) from None


def _bad_utf8(path: str, error: UnicodeDecodeError) -> str:
    """`path:LINE: ...` for the first line of `path` that is not UTF-8 (the text reader decodes in chunks, so
    its own line count is no guide)."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                return (f"{path}:{number}: byte 0x{line[e.start]:02x} at column {e.start + 1} is not UTF-8 (re-save"
                        " the file as UTF-8, or re-download it)")
    return f"{path}: not UTF-8 ({error.reason}; re-save the file as UTF-8, or re-download it)"


def _decoded_rows(path: str, skip_malformed: bool, width: int | None, options: DataOptions):
    with open(path, encoding="utf-8-sig", newline="") as f:  # -sig: MRPC starts with a byte-order mark
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        columns = None if width else next(reader, None)
        if not width and not columns:
            raise GlueDataError(f"{path} is empty: expected a header line ({options.how_to_get()})")
        width = width or len(columns)
        for fields in reader:
            if not fields:  # a blank line, e.g. at the end of a file
                continue
            if len(fields) != width:
                if skip_malformed:
                    continue
                raise GlueDataError(
                    f"{path}:{reader.line_num}: expected {width} tab-separated fields, found {len(fields)}"
                    " (fix or delete the line" + (f", or drop such lines with {options.skip_malformed})"
                                                   if options.skip_malformed else ")"))
            yield reader.line_num, (dict(zip(columns, fields)) if columns else fields)


def _require(path: str, row: dict[str, str], names: Sequence[str | None]) -> None:
    missing = [n for n in names if n is not None and n not in row]
    if missing:
        raise GlueDataError(f"{path}: no column {missing[0]!r} in the header (its columns are"
                            f" {', '.join(row)}; is this the official GLUE file for this task?)")


def read_glue_dir(task: GlueTask, split: str, data_dir: str, *, skip_malformed: bool = False,
                  options: DataOptions = CONFIG_OPTIONS) -> list[Example]:
    """Reads one split of the official GLUE download; test rows get label -1.

    Columns are found by header name, except in CoLA train/dev, which have no header
    (source, label, original annotation, sentence). A malformed row raises GlueDataError with its
    file and line; `skip_malformed=True` drops rows with the wrong number of fields instead (the
    original QQP download has a few).
    """
    _check_split(task, split)
    path = _task_file(task, split, data_dir, options)
    cols = _COLUMNS[task.name]
    is_test = split in task.test_splits
    examples = []
    if task.name == "cola" and not is_test:
        for n, (line, fields) in enumerate(_rows(path, skip_malformed, width=4, options=options)):
            examples.append(Example(fields[3], None, _parse_label(task, fields[1], f"{path}:{line}"), n))
        return examples

    label_column = None if is_test else cols.label
    for n, (line, row) in enumerate(_rows(path, skip_malformed, options=options)):
        if n == 0:
            _require(path, row, [cols.text_a, cols.text_b, label_column, cols.index if is_test else None])
        if is_test:
            index = row[cols.index]
            if not index.isdigit():
                raise GlueDataError(f"{path}:{line}: index {index!r} is not a non-negative integer (fix the row)")
            label, idx = -1, int(index)
        else:
            label, idx = _parse_label(task, row[label_column], f"{path}:{line}"), n
        text_b = row[cols.text_b] if cols.text_b else None
        examples.append(Example(row[cols.text_a], text_b, label, idx))
    return examples


# ----------------------------------------------------------------------------------------------
# TFDS.


def read_glue_tfds(task: GlueTask, split: str, data_dir: str | None = None) -> list[Example]:
    """Reads TFDS `glue/<task>` with `tfds.data_source` (array_record, no TensorFlow needed), in idx order.

    Prepares the dataset first if `data_dir` does not hold it (which downloads GLUE: needs the network).
    """
    _check_split(task, split)
    import tensorflow_datasets as tfds  # optional dependency: import only when used
    import tensorflow_datasets.text.glue  # registers glue/*; tfds does not import it on its own

    name = f"glue/{task.name}"
    where = data_dir or "~/tensorflow_datasets"
    try:
        source = tfds.data_source(name, split=_TFDS_SPLITS[split], data_dir=data_dir,
                                  builder_kwargs={"file_format": "array_record"})
    except OSError as e:  # the download failed: offline, or a mirror is down
        raise GlueDataError(f"TFDS dataset {name} is not prepared under {where} and downloading it failed"
                            f" ({type(e).__name__}); prepare it where there is network, or set"
                            " --config.data.source=dir and --config.data.glue_dir to the official GLUE files"
                            " (download_glue_data.py)") from None
    except NotImplementedError:  # prepared as tfrecord: no random access without TensorFlow
        raise GlueDataError(f"TFDS dataset {name} under {where} is stored as tfrecord; re-prepare it with"
                            " file_format='array_record' (`tfds build glue --file_format=array_record`)") from None
    records = (ex for start in range(0, len(source), _TFDS_BATCH)
               for ex in source.__getitems__(list(range(start, min(start + _TFDS_BATCH, len(source))))))
    return _feature_examples(task, split, records)


def read_glue_hub(task: GlueTask, split: str, path: str = "nyu-mll/glue",
                  options: DataOptions = CONFIG_OPTIONS) -> list[Example]:
    """The Hugging Face Hub's GLUE (`nyu-mll/glue`: a config per task, TFDS's feature names and label ids, test
    labels -1), or a local copy: that repository's layout (README.md's configs naming the tasks, or without them a
    folder per task, <task>/<split>-00000-of-00001.parquet), or one task's folder of files named by split."""
    _check_split(task, split)
    if _holds_official_files(path):
        raise GlueDataError(f"{path} holds the official GLUE TSV files, not a copy of the Hub's dataset: read them "
                            f"with {options.read_as_files(path)}")
    flat = os.path.isdir(path) and not hub.card_names_configs(path) and not os.path.isdir(os.path.join(path, task.name))
    try:
        dataset = hub.load(path, name="" if flat else task.name, split=_TFDS_SPLITS[split],
                           flags=hub.Flags.of_task(options.hf_path or options.glue_dir))
    except hub.CorpusError as e:
        raise GlueDataError(str(e)) from None
    return _feature_examples(task, split, dataset)


def _holds_official_files(folder: str) -> bool:
    """A folder of the official download (<CoLA|SST-2|...>/<split>.tsv), or one task's folder of it."""
    return any(os.path.isfile(os.path.join(folder, directory, f"{split}.tsv"))
               for task in TASKS.values() for directory in (task.directory, "") for split in task.splits)


def _feature_examples(task: GlueTask, split: str, records) -> list[Example]:
    """Examples from records with TFDS's GLUE features (the Hub's are the same), in the official files' order."""
    key_a, key_b = _TFDS_FEATURES[task.name]
    examples = []
    for ex in records:
        # STS-B scores are float32; the shortest float32 decimal is the file's "3.800".
        label = float(str(np.float32(ex["label"]))) if task.is_regression else int(ex["label"])
        if split in task.test_splits:
            label = -1  # stored as -1 (or -1.0 for STS-B): keep one convention
        text_b = as_text(ex[key_b]) if key_b else None
        examples.append(Example(as_text(ex[key_a]), text_b, label, int(ex["idx"])))
    examples.sort(key=lambda e: e.idx)  # array_record stores examples in hashed order; idx is file order
    return examples


def load_split(task: GlueTask, split: str, *, source: str, data_dir: str = "",
               skip_malformed: bool = False, options: DataOptions = CONFIG_OPTIONS) -> list[Example]:
    """One entry point for the trainer: source 'dir' (official TSVs under data_dir), 'tfds' or 'hf' (data_dir: the
    Hub name or a local copy). `options`: how the calling command names its GLUE options, for the errors."""
    if source == "dir":
        if not data_dir:
            raise GlueDataError(f"no GLUE folder given for task {task.name!r} ({options.how_to_get()})")
        examples = read_glue_dir(task, split, data_dir, skip_malformed=skip_malformed, options=options)
    elif source == "tfds":
        examples = read_glue_tfds(task, split, data_dir or None)
    elif source == "hf":
        examples = read_glue_hub(task, split, data_dir or "nyu-mll/glue", options)
    else:
        raise GlueDataError(f"unknown GLUE source {source!r} (use 'dir', 'tfds' or 'hf')")
    if not examples:
        raise GlueDataError(f"GLUE task {task.name!r} split {split!r} ({source} source) has no examples;"
                            f" check the files ({options.how_to_get()})")
    return examples


# ----------------------------------------------------------------------------------------------
# Leaderboard submission.


def write_submission(task: GlueTask, split: str, predictions: Sequence[int | float], indices: Sequence[int],
                     output_dir: str) -> str:
    """Writes the gluebenchmark.com file for a test split; returns its path.

    `index<TAB>prediction` rows: label names for MNLI/QNLI/RTE (the leaderboard wants words there),
    class ids for the other classification tasks, STS-B scores clipped to [0, 5] with 3 decimals.
    """
    if split not in task.test_splits:
        raise GlueDataError(f"submission files are for test splits; task {task.name!r} has"
                            f" {', '.join(task.test_splits)}, not {split!r}")
    if len(predictions) != len(indices):
        raise ValueError(f"{len(predictions)} predictions but {len(indices)} indices")
    cols = _COLUMNS[task.name]
    lines = ["index\tprediction"]
    for index, prediction in zip(indices, predictions):
        if task.is_regression:
            value = f"{min(max(float(prediction), 0.0), 5.0):.3f}"
        else:
            label = int(prediction)
            if not 0 <= label < task.num_labels:
                raise ValueError(f"prediction {prediction} for task {task.name} is not a class id < {task.num_labels}")
            value = task.labels[label] if cols.label_words else str(label)
        lines.append(f"{int(index)}\t{value}")
    storage.makedirs(output_dir)  # a workdir's predictions/: local or in a bucket
    path = os.path.join(output_dir, f"{_SUBMISSION_NAMES.get(split, task.directory)}.tsv")
    with storage.open_file(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return path
