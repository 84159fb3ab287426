"""Fine-tuning batches pad to few lengths (pretrain/data/finetune_data.py): at most `length_buckets` shapes
compile, every row fits, and no batch pads past the next bucket."""
from __future__ import annotations

import ml_collections
import numpy as np
import pytest

from pretrain.data import finetune_data


def data(lengths, **padding) -> finetune_data.FineTuningData:
    features = [([5] * n, [0] * n) for n in lengths]
    return finetune_data.FineTuningData(features, {"label": np.zeros(len(lengths), np.int32)}, 4, 0, **padding)


@pytest.mark.parametrize("buckets, expected", [(4, (16, 32, 64, 128)), (0, ()), (2, (64, 128))])
def test_buckets_are_halvings_of_the_longest_sequence(buckets, expected):
    config = ml_collections.ConfigDict(dict(max_seq_length=128, pad_to_multiple_of=8, length_buckets=buckets))
    assert finetune_data.padding(config)["length_buckets"] == expected


def test_a_varied_task_compiles_at_most_four_shapes():
    lengths = np.random.default_rng(0).integers(3, 129, 400)
    config = ml_collections.ConfigDict(dict(max_seq_length=128, pad_to_multiple_of=8, length_buckets=4))
    bucketed, multiples = data(lengths, **finetune_data.padding(config)), data(lengths, pad_to_multiple_of=8)
    shapes = {bucketed.batch(chunk)["input_ids"].shape[1] for chunk in bucketed.epoch_order(0, 0)}
    assert shapes <= {16, 32, 64, 128} and len(multiples_shapes := {
        multiples.batch(chunk)["input_ids"].shape[1] for chunk in multiples.epoch_order(0, 0)}) > 4, multiples_shapes
    for chunk in bucketed.epoch_order(0, 0):
        longest, padded = max(lengths[chunk]), bucketed.padded_length(chunk)
        assert longest <= padded and (padded == 16 or padded < 2 * -(-longest // 8) * 8)
