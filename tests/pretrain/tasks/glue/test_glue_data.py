"""GLUE readers: the real official files (CoLA, SST-2, MRPC, WNLI), crafted files in the official layout
for the other tasks, error messages, leaderboard files, and TFDS glue/* prepared offline from such files."""

from __future__ import annotations

import os
from unittest import mock

import pytest

from pretrain.tasks.glue.data import (TASKS, DataOptions, Example, GlueDataError, get_task, load_split, read_glue_dir,
                                       read_glue_tfds, write_submission)
from tests.helpers.asserts import assert_one_line_error
from tests.helpers.glue_files import GLUE, STSB_HEADER, write_crafted
from tests.helpers.glue_files import tsv as _tsv
from tests.helpers.glue_files import write_lines as _write

real_data = pytest.mark.skipif(not os.path.isdir(GLUE), reason=f"no GLUE download at {GLUE}")


# ------------------------------------------------------------------------------------- task table


def test_tasks_match_tfds_label_ids():
    glue = pytest.importorskip("tensorflow_datasets.text.glue")
    configs = {c.name: c for c in glue.Glue.BUILDER_CONFIGS}
    assert set(TASKS) == {"cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"}
    for name, task in TASKS.items():
        assert task.name == name
        assert task.labels == tuple(configs[name].label_classes or ()), name
        assert configs[name].data_dir in ("", task.directory), name  # same folder names as the download


def test_task_properties_and_lookup():
    assert get_task("SST-2") is get_task("sst-2") is get_task("sst2") is TASKS["sst2"]
    assert get_task("sts-b") is get_task("STS-B") is TASKS["stsb"]
    stsb, mnli, cola = TASKS["stsb"], TASKS["mnli"], TASKS["cola"]
    assert (stsb.is_regression, stsb.num_labels, stsb.is_pair, stsb.main_metric) == (True, 1, True, "spearman")
    assert (mnli.num_labels, mnli.dev_splits, mnli.test_splits) == (
        3, ("dev_matched", "dev_mismatched"), ("test_matched", "test_mismatched"))
    assert (cola.is_pair, cola.metrics, cola.main_metric) == (False, ("matthews_corr",), "matthews_corr")
    main = [TASKS[t].main_metric for t in ("mrpc", "qqp", "sst2", "qnli", "rte", "wnli")]
    assert main == ["f1"] * 2 + ["accuracy"] * 4
    with pytest.raises(GlueDataError) as e:
        get_task("squad")
    assert_one_line_error(e, "squad", "cola", "wnli")


# ------------------------------------------------------------------------------------- real files


@real_data
@pytest.mark.parametrize("task,split,count", [
    ("cola", "train", 8551), ("cola", "dev", 1043), ("sst2", "train", 67349), ("sst2", "dev", 872),
    ("mrpc", "train", 3668), ("mrpc", "dev", 408), ("wnli", "dev", 71),
])
def test_real_row_counts_and_labels(task, split, count):
    examples = read_glue_dir(get_task(task), split, GLUE)
    assert len(examples) == count
    assert {e.label for e in examples} == {0, 1}  # both classes, nothing else
    assert [e.idx for e in examples] == list(range(count))
    assert all(isinstance(e.text_a, str) and e.text_a for e in examples)
    assert all((e.text_b is not None) == get_task(task).is_pair for e in examples)


@real_data
def test_real_spot_checks_quoting_and_bom():
    cola = read_glue_dir(get_task("cola"), "train", GLUE)
    assert cola[0] == Example("Our friends won't buy this analysis, let alone the next one we propose.", None, 1, 0)
    assert cola[17] == Example("They drank the pub.", None, 0, 17)  # no header: file line 18 is row 17
    assert read_glue_dir(get_task("CoLA"), "dev", GLUE)[0].text_a == "The sailors rode the breeze clear of the rocks."
    sst = read_glue_dir(get_task("SST-2"), "train", os.path.join(GLUE, "SST-2"))  # the task folder itself
    assert sst[0] == Example("hide new secretions from the parental units ", None, 0, 0)  # trailing space kept
    mrpc = read_glue_dir(get_task("mrpc"), "train", GLUE)
    assert mrpc[0].text_a == 'Amrozi accused his brother, whom he called "the witness", of deliberately distorting' \
                             ' his evidence.'
    assert mrpc[0].label == 1
    dev = read_glue_dir(get_task("mrpc"), "dev", GLUE)
    assert dev[0].text_b == '"The foodservice pie business does not fit our long-term growth strategy.'  # lone quote

    # Independently: split every line on tabs; a quote-aware or BOM-keeping reader would disagree somewhere.
    with open(os.path.join(GLUE, "MRPC", "dev.tsv"), "rb") as f:
        raw = f.read()
    assert raw.startswith(b"\xef\xbb\xbf")
    lines = raw.decode("utf-8").lstrip("\ufeff").splitlines()
    assert lines[0].split("\t")[0] == "Quality"
    expected = [Example(f[3], f[4], int(f[0]), n) for n, f in enumerate(line.split("\t") for line in lines[1:])]
    assert dev == expected
    assert not any("\ufeff" in (e.text_a + e.text_b) for e in dev)


@real_data
def test_real_wnli_and_test_splits():
    wnli = get_task("wnli")
    with open(os.path.join(GLUE, "WNLI", "train.tsv"), encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f][1:]
    train = read_glue_dir(wnli, "train", GLUE)
    assert len(train) == len(rows) and len(rows) in (634, 635)  # the official file has 635; this copy lacks row 0
    assert [(e.text_a, e.text_b, e.label) for e in train] == [(r[1], r[2], int(r[3])) for r in rows]

    for task, count, last_idx in [("wnli", 146, 145), ("cola", 1063, 1062), ("mrpc", 1725, 1724)]:
        test = read_glue_dir(get_task(task), "test", GLUE)
        assert len(test) == count
        assert {e.label for e in test} == {-1}
        assert test[-1].idx == last_idx and test[0].idx == 0
    assert read_glue_dir(get_task("cola"), "test", GLUE)[-1].text_a == "A picture of himself frightened John."


@real_data
def test_real_missing_split_file():
    with pytest.raises(GlueDataError) as e:
        read_glue_dir(get_task("sst2"), "test", GLUE)  # this copy has no SST-2 test.tsv
    assert_one_line_error(e, os.path.join(GLUE, "SST-2", "test.tsv"), "--config.data.glue_dir", "source=tfds")


# ------------------------------------------------------------------------------------- crafted official layout

@pytest.fixture(scope="module")
def crafted(tmp_path_factory) -> str:
    return write_crafted(str(tmp_path_factory.mktemp("glue_crafted")))


def test_crafted_official_layouts(crafted):
    def read(task, split):
        return load_split(get_task(task), split, source="dir", data_dir=crafted)

    assert read("stsb", "train") == [Example('A "plane" is taking off.', "An air plane is taking off.", 5.0, 0),
                                     Example("A man is playing a large flute.", "A man is playing a flute.", 3.8, 1)]
    assert read("sts-b", "dev") == [Example("One.", "Two.", 0.25, 0)]
    assert read("stsb", "test") == [Example("Test one.", "Test two.", -1, 0),
                                    Example("Test three.", "Test four.", -1, 1)]
    assert [(e.text_a, e.label, e.idx) for e in read("qqp", "train")] == [
        ("How is life as a math student?", 0, 0), ("How do I relax?", 1, 1)]
    assert read("qqp", "test") == [Example("Why?", "Why not?", -1, 0), Example("Who?", "Whom?", -1, 1)]
    assert read("mnli", "train") == [Example("P0.", "H0.", 1, 0), Example("P1.", "H1.", 0, 1)]
    assert read("mnli", "dev_matched") == [Example("Pm.", "Hm.", 2, 0)]
    assert read("mnli", "dev_mismatched") == [Example("Pmm0.", "Hmm0.", 0, 0), Example("Pmm1.", "Hmm1.", 1, 1)]
    assert read("mnli", "test_matched") == [Example("Tm.", "Tm2.", -1, 0)]
    assert [e.text_a for e in read("mnli", "test_mismatched")] == ["Tmm.", "Tmm3."]
    assert [e.label for e in read("qnli", "dev")] == [0, 1]
    assert read("rte", "train")[0] == Example("No weapons were found.", "Weapons were found.", 1, 0)
    assert read("rte", "test") == [Example("C.", "D.", -1, 0), Example("E.", "F.", -1, 1)]
    # data_dir may be the task folder itself
    assert read_glue_dir(get_task("rte"), "dev", os.path.join(crafted, "RTE")) == read("rte", "dev")
    with pytest.raises(GlueDataError) as e:
        read("mnli", "dev")  # MNLI has two dev sets
    assert_one_line_error(e, "dev_matched", "dev_mismatched")


def test_test_split_uses_index_column(tmp_path):
    _write(tmp_path, "QNLI/test.tsv", [_tsv("index", "question", "sentence"), _tsv(7, "Q?", "S."), _tsv(3, "R?", "T.")])
    assert [e.idx for e in read_glue_dir(get_task("qnli"), "test", str(tmp_path))] == [7, 3]


@pytest.mark.parametrize("relpath,lines,needles", [
    ("RTE/dev.tsv", [_tsv("index", "sentence1", "sentence2", "label"), _tsv(0, "A.", "B.", "entailment"),
                     _tsv(1, "A.", "not_entailment")], (":3:", "expected 4", "found 3")),
    ("RTE/dev.tsv", [_tsv("index", "sentence1", "sentence2", "label"), _tsv(0, "A.", "B.", "maybe")],
     (":2:", "'maybe'", "not_entailment")),
    ("WNLI/dev.tsv", [_tsv("index", "sentence1", "sentence2", "label"), _tsv(0, "A.", "B.", 1),
                      _tsv(1, "A.", "B.", 2)], (":3:", "'2'")),
    ("STS-B/dev.tsv", [STSB_HEADER, _tsv(0, "a", "b", "c", 9, "n", "n", "One.", "Two.", "high")], (":2:", "'high'")),
    ("CoLA/train.tsv", [_tsv("gj04", 1, "", "Fine."), _tsv("gj04", 1, "", "Fine."), _tsv("gj04", 1, "Bad.")],
     (":3:", "expected 4", "found 3")),
    ("MNLI/dev_matched.tsv", [_tsv("index", "sentence1", "sentence2", "label"), _tsv(0, "A.", "B.", "neutral")],
     ("gold_label",)),
])
def test_malformed_rows_name_file_and_line(tmp_path, relpath, lines, needles):
    path = _write(tmp_path, relpath, lines)
    task, split = get_task(relpath.split("/")[0]), relpath.split("/")[1][:-4]
    with pytest.raises(GlueDataError) as e:
        read_glue_dir(task, split, str(tmp_path))
    assert_one_line_error(e, path, *needles)


@pytest.mark.parametrize("relpath, header", [
    ("RTE/dev.tsv", _tsv("index", "sentence1", "sentence2", "label")),
    ("CoLA/train.tsv", None),  # no header; read with a fixed width
])
def test_a_byte_that_is_not_utf8_names_file_and_line(tmp_path, relpath, header):
    """Before: a UnicodeDecodeError traceback naming neither the file nor the line."""
    good = _tsv(0, "A.", "B.", "entailment") if header else _tsv("gj04", 1, "", "Fine.")
    bad = _tsv(1, "Caf\xe9.", "B.", "entailment") if header else _tsv("gj04", 1, "", "Caf\xe9.")
    lines = ([header] if header else []) + [good] * 3000 + [bad, good]  # past the text reader's first chunk
    path = os.path.join(tmp_path, relpath)
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as f:
        f.write("".join(line + "\n" for line in lines).encode("latin-1"))
    task, split = get_task(relpath.split("/")[0]), relpath.split("/")[1][:-4]
    with pytest.raises(GlueDataError) as e:
        read_glue_dir(task, split, str(tmp_path))
    assert_one_line_error(e, f"{path}:{len(lines) - 1}:", "0xe9", "UTF-8")


def test_qqp_malformed_rows_raise_unless_skipped(tmp_path):
    header = _tsv("id", "qid1", "qid2", "question1", "question2", "is_duplicate")
    path = _write(tmp_path, "QQP/train.tsv", [header, _tsv(1, 2, 3, "Q1?", "Q2?", 0),
                                              _tsv(4, 5, 6, "How can I be a good geologist?"),  # known QQP defect
                                              _tsv(7, 8, 9, "Q3?", "Q4?", 1)])
    with pytest.raises(GlueDataError) as e:
        read_glue_dir(get_task("qqp"), "train", str(tmp_path))
    assert_one_line_error(e, f"{path}:3:", "expected 6", "found 4", "--config.data.skip_malformed=true")
    with pytest.raises(GlueDataError) as e:  # a command without that option does not suggest it
        read_glue_dir(get_task("qqp"), "train", str(tmp_path), options=DataOptions("--glue_dir", None, None))
    assert "skip_malformed" not in str(e.value) and "fix or delete the line" in str(e.value)
    examples = load_split(get_task("qqp"), "train", source="dir", data_dir=str(tmp_path), skip_malformed=True)
    assert [(e.text_a, e.label) for e in examples] == [("Q1?", 0), ("Q3?", 1)]


def test_missing_files_and_bad_arguments(tmp_path):
    with pytest.raises(GlueDataError) as e:
        load_split(get_task("qnli"), "dev", source="dir", data_dir=str(tmp_path))
    assert_one_line_error(e, os.path.join(str(tmp_path), "QNLI", "dev.tsv"), "--config.data.glue_dir", "source=tfds")
    for kwargs, needles in [({"source": "dir"}, ("glue_dir",)), ({"source": "csv"}, ("'csv'", "tfds"))]:
        with pytest.raises(GlueDataError) as e:
            load_split(get_task("qnli"), "dev", **kwargs)
        assert_one_line_error(e, *needles)


# ------------------------------------------------------------------------------------- submission files


def _read_lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def test_write_submission(tmp_path):
    out = str(tmp_path / "submit")
    path = write_submission(get_task("mnli"), "test_mismatched", [0, 2, 1], [0, 1, 2], out)
    assert path == os.path.join(out, "MNLI-mm.tsv")
    assert _read_lines(path) == ["index\tprediction", "0\tentailment", "1\tcontradiction", "2\tneutral"]
    assert os.path.basename(write_submission(get_task("mnli"), "test_matched", [1], [0], out)) == "MNLI-m.tsv"
    path = write_submission(get_task("qnli"), "test", [1, 0], [5, 6], out)
    assert _read_lines(path) == ["index\tprediction", "5\tnot_entailment", "6\tentailment"]
    path = write_submission(get_task("stsb"), "test", [-0.5, 2.34567, 7.0], [0, 1, 2], out)
    assert (os.path.basename(path), _read_lines(path)[1:]) == ("STS-B.tsv", ["0\t0.000", "1\t2.346", "2\t5.000"])
    path = write_submission(get_task("wnli"), "test", [1, 0], [0, 1], out)
    assert _read_lines(path) == ["index\tprediction", "0\t1", "1\t0"]
    for name in ("cola", "sst2", "mrpc", "qqp", "rte"):
        write_submission(get_task(name), "test", [1], [0], out)
    assert sorted(os.listdir(out)) == sorted(["CoLA.tsv", "SST-2.tsv", "MRPC.tsv", "STS-B.tsv", "QQP.tsv", "MNLI-m.tsv",
                                              "MNLI-mm.tsv", "QNLI.tsv", "RTE.tsv", "WNLI.tsv"])
    assert _read_lines(os.path.join(out, "RTE.tsv"))[1] == "0\tnot_entailment"
    assert _read_lines(os.path.join(out, "QQP.tsv"))[1] == "0\t1"
    with pytest.raises(GlueDataError) as e:
        write_submission(get_task("cola"), "dev", [1], [0], out)
    assert_one_line_error(e, "'dev'", "test")
    with pytest.raises(ValueError):
        write_submission(get_task("rte"), "test", [2], [0], out)


# ------------------------------------------------------------------------------------- TFDS


@pytest.fixture(scope="module")
def tfds_dir(crafted, tmp_path_factory):
    """The real TFDS glue builder, prepared as array_record from the crafted official files: its download
    step is pointed at the crafted folder (GLUE's zips hold the same <Task>/<split>.tsv layout)."""
    tfds = pytest.importorskip("tensorflow_datasets")
    import tensorflow_datasets.text.glue  # noqa: F401  registers glue/*

    data_dir = str(tmp_path_factory.mktemp("tfds"))
    names = ["stsb", "mnli", "rte"] + (["cola"] if os.path.isdir(GLUE) else [])
    with mock.patch.object(tfds.download.DownloadManager, "download_and_extract", return_value=crafted):
        for name in names:
            tfds.builder(f"glue/{name}", data_dir=data_dir, file_format="array_record").download_and_prepare()
    return data_dir, names


def test_read_glue_tfds_matches_official_files(tfds_dir, crafted):
    data_dir, names = tfds_dir
    checked = 0
    for name in names:
        task = get_task(name)
        for split in task.splits:
            if not os.path.isfile(os.path.join(crafted, task.directory, f"{split}.tsv")):
                continue
            from_tfds = read_glue_tfds(task, split, data_dir)
            assert from_tfds == read_glue_dir(task, split, crafted), (name, split)
            assert all(isinstance(e.text_a, str) for e in from_tfds)
            checked += 1
    assert checked >= 9
    examples = load_split(get_task("mnli"), "dev_mismatched", source="tfds", data_dir=data_dir)
    assert examples == [Example("Pmm0.", "Hmm0.", 0, 0), Example("Pmm1.", "Hmm1.", 1, 1)]
    assert read_glue_tfds(get_task("stsb"), "train", data_dir)[0].text_a == 'A "plane" is taking off.'


def test_read_glue_tfds_download_failure(tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")
    with mock.patch.object(tfds.download.DownloadManager, "download_and_extract",
                           side_effect=ConnectionError("offline")), pytest.raises(GlueDataError) as e:
        read_glue_tfds(get_task("rte"), "dev", str(tmp_path))
    assert_one_line_error(e, "glue/rte", str(tmp_path), "source=dir")
