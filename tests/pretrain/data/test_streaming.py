"""The Grain streaming pipeline: batches are a pure function of (seed, step, streams), resumable from a
stored position, independent of the number of processes (by default, and on resume) and workers; phases;
order checks."""
import numpy as np
import pytest
from absl import flags

from pretrain.data.streaming import StreamingData
from pretrain.runtime.errors import ConfigError
from tests.helpers.data import bert_objective, random_documents

flags.FLAGS.mark_as_parsed()  # Grain reads absl flags; pytest does not parse them


def make(docs=None, **kw) -> StreamingData:
    args = dict(batch_size=8, seed=3, max_seq_length=32, window_documents=10)
    args.update(kw)
    return StreamingData(random_documents() if docs is None else docs, bert_objective(), **args)


def take(data: StreamingData, steps: int, start: int = 0, position=None) -> list:
    iterator = data.iterate(start, position)
    out = [next(iterator) for _ in range(steps)]
    data.close()
    return out


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_batches_are_a_function_of_seed_and_step():
    a, b = take(make(), 6), take(make(), 6)
    for (step_a, x, _), (step_b, y, _) in zip(a, b):
        assert step_a == step_b
        assert_same(x, y)
    assert not np.array_equal(a[1][1]["input_ids"], a[2][1]["input_ids"])
    assert not np.array_equal(take(make(seed=4), 1)[0][1]["input_ids"], a[0][1]["input_ids"])
    assert a[0][1]["input_ids"].shape == (8, 32) and a[0][1]["masked_lm_positions"].shape == (8, 5)


def test_resume_from_a_stored_position_gives_the_same_batches():
    data = make()
    run = take(data, 8)
    for stop in (1, 3, 5):  # resume after step stop - 1 (mid-window and across window ends)
        position = data.position(stop, run[stop - 1][2])
        resumed = take(make(), 8 - stop, start=stop, position=position)
        for (step, x, windows), (_, y, expected_windows) in zip(resumed, run[stop:]):
            assert_same(x, y)
            assert windows == expected_windows


@pytest.mark.parametrize("processes", [2, 4])
def test_the_global_batch_does_not_depend_on_the_process_layout(processes):
    """Process p's rows are rows [p B / P, (p + 1) B / P) of the one-process batch with the same streams."""
    reference = take(make(streams=4), 4)
    parts = [take(make(streams=4, process_count=processes, process_index=p), 4) for p in range(processes)]
    for step in range(4):
        rows = [part[step][1] for part in parts]
        assert_same({k: np.concatenate([r[k] for r in rows]) for k in rows[0]}, reference[step][1])
        # gathered positions, in stream order, are the one-process positions
        assert sum((part[step][2] for part in parts), []) == reference[step][2]


def global_batches(processes: int, steps: int, start: int = 0, position=None, **kw) -> list:
    """[(the global batch of each step: the processes' rows concatenated, the gathered [window, row]s)]."""
    parts = [take(make(process_count=processes, process_index=p, **kw), steps, start, position)
             for p in range(processes)]
    return [({k: np.concatenate([part[s][1][k] for part in parts]) for k in parts[0][s][1]},
             sum((part[s][2] for part in parts), [])) for s in range(steps)]


def test_by_default_the_data_order_does_not_depend_on_the_number_of_processes():
    """data.streams=0: gcd(batch, 2^k) streams whatever the process count, so 1, 2 and 4 processes (the rows of
    each concatenated) train on the same global batches; with one stream per process they would not."""
    assert make().streams == 8 and make(batch_size=12).streams == 4 and make(batch_size=6).streams == 2
    # a larger corpus, more windows per epoch: up to 64 streams; a one-window corpus: up to 8 (memory)
    assert [make(random_documents(n), batch_size=256).streams for n in (10, 160, 5000)] == [8, 16, 64]
    reference = global_batches(1, 6)
    for processes in (2, 4):
        for (x, windows), (y, expected) in zip(global_batches(processes, 6), reference):
            assert_same(x, y)
            assert windows == expected
    one_per_process = global_batches(2, 1, streams=2)[0][0]["input_ids"]
    assert not np.array_equal(one_per_process, reference[0][0]["input_ids"])


@pytest.mark.parametrize("before,after", [(1, 2), (2, 1), (1, 4)])
def test_a_position_resumes_on_another_number_of_processes(before, after):
    """Saved by `before` processes (gathered), resumed by `after`: the batches of an uninterrupted run."""
    reference = global_batches(before, 7)
    for stop in (2, 5):
        position = make(process_count=before).position(stop, reference[stop - 1][1])
        resumed = global_batches(after, 7 - stop, start=stop, position=position)
        for (x, windows), (y, expected) in zip(resumed, reference[stop:]):
            assert_same(x, y)
            assert windows == expected


def test_auto_streams_adopt_the_stream_count_of_a_checkpoint():
    """A checkpoint written with one stream (the old default on one process) keeps its data order."""
    old = make(streams=1)
    run = take(old, 5)
    position = old.position(3, run[2][2])
    data = make()
    resumed = take(data, 2, start=3, position=position)
    assert data.streams == 1
    for (_, x, _), (_, y, _) in zip(resumed, run[3:]):
        assert_same(x, y)
    with pytest.raises(ConfigError, match=r"config.data.streams=0 means 1 streams \(auto: those of the checkpoint "
                                          r"it resumes\), which 2 processes cannot share: resume on a number of "
                                          r"processes that divides 1, or use a new --workdir"):
        make(process_count=2).resume_from(position)


def test_an_explicit_stream_count_must_match_the_checkpoint():
    data = make(streams=2)
    position = data.position(2, take(data, 2)[1][2])
    with pytest.raises(ConfigError, match=r"streams: 2 in the checkpoint, 4 now"):
        take(make(streams=4), 1, start=2, position=position)
    take(make(streams=2, process_count=2, process_index=1), 1, start=2, position=position)  # the same S: fine


def test_every_epoch_uses_every_document_once_in_a_new_order():
    """Corpus smaller than a window: each window is one epoch, a fresh permutation of all documents."""
    docs = [[np.full(3, i + 5, np.int32)] for i in range(12)]
    data = make(docs, window_documents=100)
    assert data.window_documents == 12
    order = data.document_order(0)
    orders = [[docs[order[e * 12 + i]][0][0] - 5 for i in range(12)] for e in range(3)]
    for order in orders:
        assert sorted(order) == list(range(12))
    assert orders[0] != orders[1] != orders[2]


def test_long_phase_switches_length_and_objective():
    out = take(make(long_seq_length=64, long_seq_start_step=3), 5)
    assert out[2][1]["input_ids"].shape == (8, 32) and out[2][1]["masked_lm_positions"].shape == (8, 5)
    assert out[3][1]["input_ids"].shape == (8, 64) and out[3][1]["masked_lm_positions"].shape == (8, 20)
    data = make(long_seq_length=64, long_seq_start_step=3)
    assert data.position(3, out[2][2])["phase"] == 0       # the batches before step 3 were phase 0
    resumed = take(data, 2, start=3, position=data.position(3, out[2][2]))
    assert_same(resumed[0][1], out[3][1])


def test_a_position_from_another_data_order_is_a_one_line_error():
    data = make()
    position = data.position(2, take(data, 2)[1][2])
    with pytest.raises(ConfigError, match=r"window_documents: 10 in the checkpoint, 5 now"):
        take(make(window_documents=5), 1, start=2, position=position)
    with pytest.raises(ConfigError, match=r"seed: 3 in the checkpoint, 9 now"):
        take(make(seed=9), 1, start=2, position=position)


@pytest.mark.parametrize("kw,match", [
    (dict(batch_size=6, streams=4), "batch_size=6 is not divisible by config.data.streams=4"),
    (dict(streams=3, process_count=2), "streams=3 must be a multiple of the number of processes"),
    (dict(window_documents=0), "window_documents=0 must be at least 1"),
    (dict(batch_size=6, process_count=4), "config.batch_size=6 is not divisible by the number of processes"),
    (dict(batch_size=24, process_count=3),  # auto: gcd(24, 8) = 8 streams (4 windows per epoch: at least 8)
     r"config.data.streams=0 means 8 streams \(auto: the largest power-of-two divisor of config.batch_size=24 up "
     r"to 8\), "
     "which 3 processes cannot share: set --config.data.streams to a multiple of 3 that divides"),
])
def test_bad_layouts_are_one_line_errors(kw, match):
    with pytest.raises(ConfigError, match=match):
        make(**kw)


@pytest.mark.slow
def test_worker_processes_do_not_change_the_batches():
    """Grain's mp_prefetch spawns worker processes and keeps the window order whatever their number."""
    reference = take(make(), 5)
    for workers in (1, 2):
        for (_, x, windows), (_, y, expected) in zip(take(make(workers=workers), 5), reference):
            assert_same(x, y)
            assert windows == expected


def test_a_one_document_corpus_streams():
    """raw_text (nanoGPT's corpora) is one document: windows of one document, endless all the same."""
    mlm_only = bert_objective()
    mlm_only.next_sentence = False
    data = StreamingData(random_documents(1), mlm_only, batch_size=8, seed=3, max_seq_length=32, streams=2)
    assert data.window_documents == 1
    out = take(data, 3)
    assert out[2][1]["input_ids"].shape == (8, 32)
