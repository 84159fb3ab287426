"""scripts/bench/bench_bucket_io.py: its two measurements on the session's GCS-protocol server."""
from __future__ import annotations

import pytest

from scripts.bench import bench_bucket_io

pytestmark = pytest.mark.slow  # the gcs_server fixture starts the server, a process of its own


def test_a_rewrite_grows_with_the_log_and_an_append_does_not(through_proxy):
    sent = bench_bucket_io.metrics_bytes(through_proxy, "gs://bucket/bench_metrics", at_steps=(20, 400))
    line = len(bench_bucket_io.line(400))
    assert sent[("rewrite", 400)] > 19 * line > sent[("rewrite", 20)]  # the whole object, again and again
    assert sent[("append", 20)] == pytest.approx(sent[("append", 400)], rel=0.05)  # the new lines only
    assert sent[("append", 400)] < 3 * line


def test_a_timed_checkpoint_round_trip_restores_the_state_bitwise(gcs_server, tmp_path):
    import jax
    import numpy as np
    state = bench_bucket_io.random_state([(8, 4), (4,)])
    for where in (str(tmp_path / "local"), "gs://bucket/bench_checkpoints"):
        save, restore, restored = bench_bucket_io.save_restore_seconds(where, state)
        assert save > 0 and restore > 0
        for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored), strict=True):
            np.testing.assert_array_equal(a, np.asarray(b))
