"""Packing variable-length examples into fixed-length rows, shared by every model family.

An example is a dict of 1-D int arrays, one per feature (T5: "inputs" and "targets"; GPT: one
"targets" feature). Rows have a fixed length per feature. Packing is greedy and keeps the order of
the examples (seqio's `trim_and_pack_dataset`): an example goes into the current row if every one
of its features still fits there, otherwise it opens a new row. For each feature it returns

    {name}              [R, L] int32  the tokens, 0 (padding) after the last example of the row;
    {name}_segment_ids  [R, L] int32  1..n = which example of the row a token belongs to, 0 = padding;
    {name}_positions    [R, L] int32  the position of a token inside its own example (restarts at 0).

Attention masks built from segment ids keep packed examples apart (models/layers.py), and
`shift_right_by_segment` makes decoder inputs that never see the previous example's last token.
Only the row assignment is a Python loop, over examples (not tokens); every token moves in one
vectorised scatter.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

OVERFLOW_MODES = ("truncate", "split")


def pack_examples(examples: Sequence[Mapping[str, np.ndarray]], row_lengths: Mapping[str, int], *,
                  num_rows: int | None = None, overflow: str = "truncate") -> dict[str, np.ndarray]:
    """Packs a list of examples ({feature: 1-D int array}) into rows of `row_lengths` tokens.

    Every example must hold every feature of `row_lengths` (possibly empty). See `pack_flat`.
    """
    names = list(row_lengths)
    flat, lengths = {}, {}
    for name in names:
        parts = [np.asarray(ex[name]).reshape(-1) for ex in examples]
        lengths[name] = np.array([len(p) for p in parts], np.int64)
        flat[name] = np.concatenate(parts) if parts else np.zeros(0, np.int32)
    return pack_flat(flat, lengths, row_lengths, num_rows=num_rows, overflow=overflow)


def pack_padded(features: Mapping[str, np.ndarray], lengths: Mapping[str, np.ndarray],
                row_lengths: Mapping[str, int], *, num_rows: int | None = None,
                overflow: str = "truncate") -> dict[str, np.ndarray]:
    """Like `pack_examples`, for examples given as padded arrays: features[name] [N, W] with the
    real lengths lengths[name] [N] (the first lengths[name][i] tokens of row i are the example)."""
    flat = {}
    for name in row_lengths:
        ids, n = np.asarray(features[name]), np.asarray(lengths[name])
        flat[name] = ids[np.arange(ids.shape[1]) < n[:, None]]  # row-major: the examples, concatenated
    return pack_flat(flat, {k: np.asarray(lengths[k]) for k in row_lengths}, row_lengths,
                     num_rows=num_rows, overflow=overflow)


def pack_flat(flat: Mapping[str, np.ndarray], lengths: Mapping[str, np.ndarray],
              row_lengths: Mapping[str, int], *, num_rows: int | None = None,
              overflow: str = "truncate") -> dict[str, np.ndarray]:
    """The packing itself, on concatenated examples.

    Args:
        flat: {name: [sum(lengths[name])] int} every example's tokens of that feature, concatenated.
        lengths: {name: [N] int} tokens per example.
        row_lengths: {name: L} row length per feature (the output width).
        num_rows: R, the number of rows to return (empty rows pad the end); an error if the
            examples need more. None: as many rows as needed.
        overflow: what to do with an example longer than the row in some feature: "truncate"
            keeps its first L tokens; "split" cuts it into pieces [0, L), [L, 2L), ... per feature,
            each piece its own example (a feature with fewer pieces gets empty ones).

    Examples with no token in any feature are dropped. Returns the arrays of the module docstring.
    """
    if overflow not in OVERFLOW_MODES:
        raise ValueError(f"pack: overflow={overflow!r} must be one of {OVERFLOW_MODES}")
    names = list(row_lengths)
    if not names:
        raise ValueError("pack: row_lengths is empty; give at least one feature")
    lens = {k: np.asarray(lengths[k], np.int64) for k in names}
    n_examples = len(lens[names[0]])
    starts = {k: np.concatenate([[0], np.cumsum(lens[k])[:-1]]).astype(np.int64) for k in names}

    # Pieces: one per example when truncating; ceil(length / L) (max over features) when splitting.
    if overflow == "split":
        n_pieces = np.max([-(-lens[k] // row_lengths[k]) for k in names], axis=0)
    else:
        n_pieces = np.ones(n_examples, np.int64)
    n_pieces = np.maximum(n_pieces, 1)
    piece_example = np.repeat(np.arange(n_examples), n_pieces)  # [P]
    piece_index = np.arange(len(piece_example)) - np.repeat(np.cumsum(n_pieces) - n_pieces, n_pieces)
    piece_len = {k: np.clip(lens[k][piece_example] - piece_index * row_lengths[k], 0, row_lengths[k])
                 for k in names}  # [P] per feature
    nonempty = np.any([piece_len[k] > 0 for k in names], axis=0)
    piece_example, piece_index = piece_example[nonempty], piece_index[nonempty]
    piece_len = {k: v[nonempty] for k, v in piece_len.items()}

    row, offset, segment = _assign_rows(piece_len, row_lengths)
    used_rows = int(row.max()) + 1 if len(row) else 0
    if num_rows is None:
        num_rows = used_rows
    elif used_rows > num_rows:
        raise ValueError(f"pack: the examples need {used_rows} rows, more than num_rows={num_rows}")

    out = {}
    for k in names:
        L = row_lengths[k]
        n = piece_len[k]
        tok_piece = np.repeat(np.arange(len(n)), n)  # [T] the piece of every token
        j = np.arange(len(tok_piece)) - np.repeat(np.cumsum(n) - n, n)  # [T] index inside the piece
        source = starts[k][piece_example[tok_piece]] + piece_index[tok_piece] * L + j
        r, c = row[tok_piece], offset[k][tok_piece] + j
        ids = np.zeros((num_rows, L), np.int32)
        seg = np.zeros((num_rows, L), np.int32)
        pos = np.zeros((num_rows, L), np.int32)
        ids[r, c] = np.asarray(flat[k])[source]
        seg[r, c] = segment[tok_piece]
        pos[r, c] = j
        out[k], out[f"{k}_segment_ids"], out[f"{k}_positions"] = ids, seg, pos
    return out


def _assign_rows(piece_len: Mapping[str, np.ndarray], row_lengths: Mapping[str, int]
                 ) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
    """Greedy in-order assignment: (row [P], {name: offset in the row [P]}, segment id 1.. [P])."""
    names = list(row_lengths)
    sizes = [piece_len[k].tolist() for k in names]  # plain ints: the loop is over Python scalars
    caps = [row_lengths[k] for k in names]
    n = len(sizes[0])
    row, segment = np.zeros(n, np.int64), np.zeros(n, np.int64)
    offsets = [np.zeros(n, np.int64) for _ in names]
    used = [0] * len(names)
    current, count = 0, 0
    for p in range(n):
        if count and any(used[f] + sizes[f][p] > caps[f] for f in range(len(names))):
            current, count, used = current + 1, 0, [0] * len(names)
        count += 1
        row[p], segment[p] = current, count
        for f in range(len(names)):
            offsets[f][p] = used[f]
            used[f] += sizes[f][p]
    return row, dict(zip(names, offsets)), segment


def shift_right_by_segment(targets: np.ndarray, segment_ids: np.ndarray, start_id: int = 0) -> np.ndarray:
    """Decoder inputs for teacher forcing over packed rows (t5x / seqio semantics).

    targets, segment_ids: [B, L] -> [B, L]: targets shifted right by one, with `start_id` (0, the
    pad id, as T5's decoder start token) at the first token of every packed segment, so that no
    example sees the previous example's last token. Padding stays 0. Works on numpy and jax arrays.
    """
    xp = np if isinstance(targets, np.ndarray) else _jnp()
    shifted = xp.pad(targets[:, :-1], ((0, 0), (1, 0)), constant_values=start_id)
    shifted_segments = xp.pad(segment_ids[:, :-1], ((0, 0), (1, 0)))
    same_segment = segment_ids == shifted_segments
    out = xp.where(same_segment, shifted, xp.where(segment_ids > 0, start_id, 0))
    return out.astype(targets.dtype)


def _jnp():
    import jax.numpy as jnp
    return jnp
