"""Tests for objectives/packing.py: greedy in-order packing, segment ids, positions, shift right."""
import time

import jax.numpy as jnp
import numpy as np
import pytest

from objectives import packing


def random_examples(rng, n, max_inputs=40, max_targets=15):
    return [{"inputs": rng.integers(1, 1000, rng.integers(0, max_inputs + 1)),
             "targets": rng.integers(1, 1000, rng.integers(1, max_targets + 1))} for _ in range(n)]


def unpack(packed, name):
    """[(row, segment, tokens)] of every packed example of one feature, in row-major order."""
    out = []
    ids, seg = packed[name], packed[f"{name}_segment_ids"]
    for r in range(ids.shape[0]):
        for s in range(1, seg[r].max(initial=0) + 1):
            out.append((r, s, ids[r][seg[r] == s].tolist()))
    return out


def test_packing_keeps_every_token_in_order():
    rng = np.random.default_rng(0)
    examples = random_examples(rng, 300)
    L = {"inputs": 64, "targets": 24}
    packed = packing.pack_examples(examples, L)
    for name, width in L.items():
        ids, seg, pos = packed[name], packed[f"{name}_segment_ids"], packed[f"{name}_positions"]
        assert ids.shape == seg.shape == pos.shape and ids.shape[1] == width
        assert ids.dtype == seg.dtype == pos.dtype == np.int32
        # Padding only after the last example of a row; positions restart at 0 per example.
        for r in range(len(ids)):
            n = (seg[r] > 0).sum()
            assert (seg[r, :n] > 0).all() and not seg[r, n:].any() and not ids[r, n:].any()
            assert np.all(np.diff(seg[r, :n]) >= 0)
            for s in np.unique(seg[r, :n]):
                np.testing.assert_array_equal(pos[r][seg[r] == s], np.arange((seg[r] == s).sum()))
    # The targets (never empty) identify the examples: in order, with the inputs in the same segments.
    got_targets = unpack(packed, "targets")
    assert [t for _, _, t in got_targets] == [ex["targets"].tolist() for ex in examples]
    inputs = {(r, s): t for r, s, t in unpack(packed, "inputs")}
    for (r, s, _), ex in zip(got_targets, examples):
        assert inputs.get((r, s), []) == ex["inputs"].tolist()
    # Greedy: the first example of every row did not fit into the previous row.
    rows = [r for r, _, _ in got_targets]
    for i in range(1, len(examples)):
        if rows[i] != rows[i - 1]:
            used = {k: (packed[f"{k}_segment_ids"][rows[i - 1]] > 0).sum() for k in L}
            assert any(used[k] + len(examples[i][k]) > L[k] for k in L)
    assert len(packed["targets"]) < 200  # it does pack: 300 examples, ~50% rows filled


def test_truncate_and_split():
    rng = np.random.default_rng(1)
    long = {"targets": rng.integers(1, 100, 25)}
    short = {"targets": np.array([7, 8])}
    truncated = packing.pack_examples([long, short], {"targets": 10})
    assert truncated["targets"][0].tolist() == long["targets"][:10].tolist()
    assert truncated["targets"][1].tolist() == [7, 8] + [0] * 8
    split = packing.pack_examples([long, short], {"targets": 10}, overflow="split")
    # Pieces 10 + 10 + 5 tokens, each its own example; the short one joins the last piece's row.
    assert split["targets"].reshape(-1)[:27].tolist() == long["targets"].tolist() + [7, 8]
    assert split["targets_segment_ids"][2].tolist() == [1] * 5 + [2] * 2 + [0] * 3
    assert split["targets_positions"][2].tolist() == list(range(5)) + [0, 1] + [0] * 3
    with pytest.raises(ValueError, match="overflow"):
        packing.pack_examples([long], {"targets": 10}, overflow="drop")


def test_num_rows_and_empty_examples():
    ex = [{"targets": np.array([1, 2, 3])}, {"targets": np.zeros(0, int)}, {"targets": np.array([4])}]
    packed = packing.pack_examples(ex, {"targets": 4}, num_rows=3)
    assert packed["targets"].tolist() == [[1, 2, 3, 4], [0] * 4, [0] * 4]
    assert packed["targets_segment_ids"][0].tolist() == [1, 1, 1, 2]  # the empty example is dropped
    with pytest.raises(ValueError, match="num_rows"):
        packing.pack_examples(ex, {"targets": 2}, num_rows=1)


def test_pack_padded_equals_pack_examples():
    rng = np.random.default_rng(2)
    examples = random_examples(rng, 50)
    lengths = {k: np.array([len(e[k]) for e in examples]) for k in ("inputs", "targets")}
    padded = {k: np.zeros((50, lengths[k].max() + 3), np.int64) for k in lengths}
    for i, e in enumerate(examples):
        for k in lengths:
            padded[k][i, :len(e[k])] = e[k]
    L = {"inputs": 50, "targets": 20}
    a = packing.pack_padded(padded, lengths, L, num_rows=50)
    b = packing.pack_examples(examples, L, num_rows=50)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def test_shift_right_by_segment():
    targets = np.array([[5, 6, 7, 8, 9, 0], [3, 4, 0, 0, 0, 0]], np.int32)
    segments = np.array([[1, 1, 1, 2, 2, 0], [1, 1, 0, 0, 0, 0]], np.int32)
    want = [[0, 5, 6, 0, 8, 0], [0, 3, 0, 0, 0, 0]]
    assert packing.shift_right_by_segment(targets, segments).tolist() == want
    assert np.asarray(packing.shift_right_by_segment(jnp.asarray(targets), jnp.asarray(segments))).tolist() == want
    # On a random packing: every token is its segment's previous token, 0 at each segment start.
    packed = packing.pack_examples(random_examples(np.random.default_rng(3), 100), {"inputs": 64, "targets": 24})
    t, s, p = packed["targets"], packed["targets_segment_ids"], packed["targets_positions"]
    shifted = packing.shift_right_by_segment(t, s)
    prev = np.pad(t[:, :-1], ((0, 0), (1, 0)))
    np.testing.assert_array_equal(shifted, np.where((s > 0) & (p > 0), prev, 0))


def test_speed_batch_128_by_512():
    """Host time of packing a T5 batch (128 rows of 512 + 114) and a GPT-style one (many short docs)."""
    rng = np.random.default_rng(4)
    n_in = rng.integers(400, 513, 128)
    n_tg = rng.integers(80, 115, 128)
    feats = {"inputs": rng.integers(1, 32000, (128, 512)), "targets": rng.integers(1, 32000, (128, 114))}
    lens = {"inputs": n_in, "targets": n_tg}
    start = time.perf_counter()
    for _ in range(10):
        packing.pack_padded(feats, lens, {"inputs": 512, "targets": 114}, num_rows=128)
    t5_ms = (time.perf_counter() - start) * 100
    docs = [{"targets": rng.integers(1, 50000, n)} for n in rng.integers(20, 300, 600)]
    start = time.perf_counter()
    for _ in range(10):
        packing.pack_examples(docs, {"targets": 512})
    gpt_ms = (time.perf_counter() - start) * 100
    print(f"pack 128x512: {t5_ms:.1f} ms (T5 batch), {gpt_ms:.1f} ms (600 documents)")
    assert t5_ms < 200 and gpt_ms < 400  # generous: a shared 2-core host; typical is a few ms
