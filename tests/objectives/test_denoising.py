"""Tests for objectives/denoising.py: the encoder-decoder objectives' batches and loss."""
import time
import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from scipy import stats

from objectives import packing
from objectives.denoising import BATCH_KEYS, MODEL_INPUT_KEYS, EncoderDecoderDenoising, denoising_loss
from objectives.interface import ObjectiveError

V, EOS = 32_100, 1


def tokenizer(num_extra_ids=100):
    return types.SimpleNamespace(vocab_size=V, pad_id=0, eos_id=EOS, unk_id=2, num_extra_ids=num_extra_ids,
                                 sentinel_id=lambda i: V - 1 - i)


def objective(mode="span_corruption", tok=None, **kw):
    cfg = ml_collections.ConfigDict(dict(name="span_corruption", mode=mode, noise_density=0.15,
                                         mean_noise_span_length=3.0, z_loss=1e-4, targets_length=0,
                                         corruption="replace_spans"))
    cfg.update(kw)
    return EncoderDecoderDenoising(cfg, tok or tokenizer())


def documents(rng, n=400):
    """Documents of sentences of plain ids (never EOS, pad or a sentinel)."""
    return [[rng.integers(3, 32_000, rng.integers(1, 40)) for _ in range(rng.integers(1, 12))] for _ in range(n)]


def is_sentinel(t):
    return t >= V - 100


def segments(batch, row, prefix):
    """{segment id: tokens} of one packed row."""
    ids, seg = batch[f"{prefix}_input_ids" if prefix == "encoder" else "decoder_target_ids"], \
        batch[f"{prefix}_segment_ids"]
    return {s: ids[row][seg[row] == s].tolist() for s in range(1, seg[row].max() + 1)}


def rebuild(inputs, targets):
    """The text from T5-format inputs/targets (no EOS): inputs hold the kept tokens and one sentinel
    per noise run; targets the noise tokens and one sentinel per kept run. Runs alternate."""
    def run_list(seq):
        out = []
        for t in seq:
            if is_sentinel(t):
                out.append(None)
            elif out and out[-1] is not None:
                out[-1].append(t)
            else:
                out.append([t])
        return out
    kept, noise = run_list(inputs), [r for r in run_list(targets) if r is not None]
    text = []
    for r in kept:
        text += noise.pop(0) if r is None else r
    assert not noise
    return text


# ---------------------------------------------------------------------------------------------
# Batches
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode,corruption", [("span_corruption", "replace_spans"), ("prefix_lm", "replace_spans"),
                                             ("iid_denoising", "replace_spans"), ("iid_denoising", "drop_tokens"),
                                             ("bert_style", "replace_spans")])
def test_batch_has_the_contract_keys_shapes_and_determinism(mode, corruption):
    obj = objective(mode, corruption=corruption)
    rng = np.random.default_rng(0)
    instances = obj.create_instances(documents(rng), rng, 64)
    sub = {k: v[:16] for k, v in instances.items()}
    batch = obj.make_batch(sub, np.random.default_rng(5))
    _, dec_len = obj.lengths(64)
    assert tuple(batch) == BATCH_KEYS
    for k, v in batch.items():
        assert v.shape == ((16, 64) if k.startswith("encoder") else (16, dec_len)), k
        assert v.dtype == (np.float32 if k == "decoder_loss_weights" else np.int32), k
    np.testing.assert_array_equal(batch["decoder_input_ids"],
                                  packing.shift_right_by_segment(batch["decoder_target_ids"],
                                                                 batch["decoder_segment_ids"]))
    np.testing.assert_array_equal(batch["decoder_loss_weights"], batch["decoder_segment_ids"] > 0)
    again = obj.make_batch(sub, np.random.default_rng(5))
    other = obj.make_batch(sub, np.random.default_rng(6))
    for k in batch:
        np.testing.assert_array_equal(batch[k], again[k])
    assert not np.array_equal(batch["encoder_input_ids"], other["encoder_input_ids"])  # dynamic noise
    assert set(obj.model_inputs(batch)) == set(MODEL_INPUT_KEYS)


def test_create_instances_concatenates_documents_with_eos():
    obj = objective()
    rng = np.random.default_rng(1)
    docs = documents(rng, 200)
    inst = obj.create_instances(docs, rng, 64)
    raw, _ = obj.lengths(64)
    assert inst["input_ids"].shape[1] == raw and inst["input_ids"].dtype == np.int32
    assert (inst["length"] == raw).sum() == len(inst["length"]) - 1  # one shorter tail chunk
    tokens = np.concatenate([row[:n] for row, n in zip(inst["input_ids"], inst["length"])])
    want = np.concatenate([s for d in docs for s in d])
    assert (tokens == EOS).sum() == len(docs) - 1
    np.testing.assert_array_equal(np.sort(tokens[tokens != EOS]), np.sort(want))
    # Another epoch seed gives another order of documents.
    other = obj.create_instances(docs, np.random.default_rng(2), 64)
    assert not np.array_equal(np.sort(other["input_ids"], 0), np.sort(inst["input_ids"], 0))


def test_span_corruption_batch_reconstructs_and_has_t5_lengths():
    obj = objective()
    rng = np.random.default_rng(3)
    assert obj.lengths(512) == (568, 114)
    inst = obj.create_instances(documents(rng, 1000), rng, 512)
    full = inst["length"] == 568
    sub = {k: v[full][:32] for k, v in inst.items()}
    batch = obj.make_batch(sub, rng)
    assert batch["encoder_input_ids"].shape == (32, 512) and batch["decoder_target_ids"].shape == (32, 114)
    # Full chunks fill their rows exactly: one segment, no padding, EOS last.
    assert (batch["encoder_segment_ids"] == 1).all() and (batch["decoder_segment_ids"] == 1).all()
    assert (batch["encoder_input_ids"][:, -1] == EOS).all() and (batch["decoder_target_ids"][:, -1] == EOS).all()
    np.testing.assert_array_equal(batch["encoder_positions"][0], np.arange(512))
    for row in range(32):
        inputs, targets = batch["encoder_input_ids"][row, :-1].tolist(), batch["decoder_target_ids"][row, :-1].tolist()
        sentinels = [t for t in inputs if is_sentinel(t)]
        assert sentinels == [V - 1 - k for k in range(len(sentinels))] == [t for t in targets if is_sentinel(t)]
        assert len(sentinels) == 28 and sum(not is_sentinel(t) for t in targets) == 85
        assert rebuild(inputs, targets) == sub["input_ids"][row].tolist()


def test_short_chunks_are_packed_together():
    obj = objective()
    rng = np.random.default_rng(4)
    lengths = np.array([100, 568, 150, 60, 40, 568, 568, 568])
    ids = rng.integers(3, 32_000, (8, 568)).astype(np.int32)
    ids[np.arange(568) >= lengths[:, None]] = 0
    batch = obj.make_batch({"input_ids": ids, "length": lengths}, rng)
    seg = batch["encoder_segment_ids"]
    # Greedy and in order (next-fit): rows {100}, {568}, {150, 60, 40}, {568}, {568}, {568}, empty, empty.
    assert [seg[r].max() for r in range(8)] == [1, 1, 3, 1, 1, 1, 0, 0]
    assert batch["decoder_loss_weights"][6:].sum() == 0 and batch["encoder_input_ids"][6:].sum() == 0
    originals = iter(ids[i, :n].tolist() for i, n in enumerate(lengths))
    for row in range(6):
        enc, dec = segments(batch, row, "encoder"), segments(batch, row, "decoder")
        for s in enc:
            assert enc[s][-1] == EOS and dec[s][-1] == EOS and dec[s][0] == V - 1
            assert rebuild(enc[s][:-1], dec[s][:-1]) == next(originals)
            positions = batch["encoder_positions"][row][seg[row] == s]
            np.testing.assert_array_equal(positions, np.arange(len(positions)))


def test_prefix_lm_splits_uniformly_and_reconstructs():
    obj = objective("prefix_lm")
    assert obj.lengths(64) == (63, 64)
    rng = np.random.default_rng(5)
    ids = rng.integers(3, 32_000, (4000, 63)).astype(np.int32)
    batch = obj.make_batch({"input_ids": ids, "length": np.full(4000, 63)}, rng)
    n_in = (batch["encoder_segment_ids"] > 0).sum(1) - 1  # without EOS
    for row in range(200):
        enc = batch["encoder_input_ids"][row, :n_in[row]].tolist()
        dec = batch["decoder_target_ids"][row][batch["decoder_segment_ids"][row] > 0].tolist()
        assert dec[-1] == EOS and batch["encoder_input_ids"][row, n_in[row]] == EOS
        assert enc + dec[:-1] == ids[row].tolist()
    assert n_in.min() == 1 and n_in.max() == 62  # T5: the prefix has 1 .. n - 1 tokens
    assert stats.chisquare(np.bincount(n_in)[1:]).pvalue > 1e-4


def test_iid_denoising_rate_and_variants():
    rng = np.random.default_rng(6)
    ids = rng.integers(3, 32_000, (2000, 127)).astype(np.int32)
    instances = {"input_ids": ids, "length": np.full(2000, 127)}
    drop = objective("iid_denoising", corruption="drop_tokens")
    batch = drop.make_batch(instances, rng)
    n_noise = (batch["decoder_segment_ids"] > 0).sum(1) - 1
    assert abs(n_noise.mean() / 127 - 0.15) < 0.005
    assert abs(n_noise.var() - 127 * 0.15 * 0.85) < 2.0  # Binomial(127, 0.15) per row: i.i.d. tokens
    replace = objective("iid_denoising")
    batch = replace.make_batch(instances, rng)
    for row in range(300):
        enc = batch["encoder_input_ids"][row][batch["encoder_segment_ids"][row] > 0].tolist()
        dec = batch["decoder_target_ids"][row][batch["decoder_segment_ids"][row] > 0].tolist()
        assert rebuild(enc[:-1], dec[:-1]) == ids[row].tolist()
    noise = sum((~np.vectorize(is_sentinel)(batch["decoder_target_ids"][r])
                 & (batch["decoder_segment_ids"][r] > 0)).sum() - 1 for r in range(2000))
    assert abs(noise / (2000 * 127) - 0.15) < 0.005
    # The derived decoder length almost never trims: mean ~0.2775 * 127 + 2.
    assert (batch["decoder_segment_ids"][:, -1] > 0).mean() < 0.01


def test_bert_style_masks_or_randomizes_and_targets_the_whole_text():
    """Raffel et al. Section 3.3.1: 15% of the tokens corrupted, 90% of those -> mask, 10% -> random;
    the target is the original chunk."""
    obj = objective("bert_style")
    assert obj.lengths(128) == (127, 128)
    rng = np.random.default_rng(7)
    ids = rng.integers(3, 32_000, (2000, 127)).astype(np.int32)
    batch = obj.make_batch({"input_ids": ids, "length": np.full(2000, 127)}, rng)
    enc, dec = batch["encoder_input_ids"][:, :127], batch["decoder_target_ids"][:, :127]
    np.testing.assert_array_equal(dec, ids)  # the whole text, then EOS
    assert (batch["decoder_target_ids"][:, 127] == EOS).all() and (batch["encoder_input_ids"][:, 127] == EOS).all()
    masked, changed = enc == V - 1, enc != ids
    randomized = changed & ~masked
    corrupted = masked.sum() + randomized.sum() / 0.9  # a random draw may equal the token: rare (1 / 32k)
    assert abs(corrupted / ids.size - 0.15) < 0.003
    assert abs(randomized.sum() / (masked.sum() + randomized.sum()) - 0.1) < 0.01
    assert not np.vectorize(is_sentinel)(enc[randomized]).any()  # random tokens are never sentinels
    assert stats.chisquare(np.bincount(enc[randomized] // 4000, minlength=8)[:8]).pvalue > 1e-4  # uniform


def test_config_and_tokenizer_errors():
    with pytest.raises(ObjectiveError, match="mode"):
        objective("bert")
    with pytest.raises(ObjectiveError, match="sentinel"):
        objective(tok=tokenizer(num_extra_ids=0))
    objective("prefix_lm", tok=tokenizer(num_extra_ids=0))  # prefix LM needs no sentinel
    with pytest.raises(ObjectiveError, match="targets_length"):
        objective(targets_length=100).lengths(512)
    assert objective(targets_length=128).lengths(512) == (568, 128)
    exact = objective(targets_length=114)  # the derived length, configured: batches use it
    ids = np.random.default_rng(1).integers(3, 32_000, (2, 568))
    assert exact.make_batch({"input_ids": ids, "length": np.array([568, 300])}, np.random.default_rng(0)
                            )["decoder_target_ids"].shape == (2, 114)
    with pytest.raises(ObjectiveError, match="sentinels"):
        objective(tok=tokenizer(num_extra_ids=10)).create_instances(documents(np.random.default_rng(0)),
                                                                     np.random.default_rng(0), 512)


def test_speed_make_batch_128_by_512():
    obj = objective()
    rng = np.random.default_rng(7)
    ids = rng.integers(3, 32_000, (128, 568)).astype(np.int32)
    instances = {"input_ids": ids, "length": np.full(128, 568)}
    obj.make_batch(instances, rng)
    start = time.perf_counter()
    for i in range(10):
        obj.make_batch(instances, np.random.default_rng(i))
    ms = (time.perf_counter() - start) * 100
    print(f"span corruption make_batch 128 x 512: {ms:.1f} ms")
    assert ms < 300  # generous: a shared 2-core host; typical is ~10 ms


# ---------------------------------------------------------------------------------------------
# Loss
# ---------------------------------------------------------------------------------------------
def test_loss_matches_numpy_reference():
    rng = np.random.default_rng(8)
    B, L, Vs = 3, 7, 11
    logits = rng.normal(0, 3, (B, L, Vs)).astype(np.float32)
    targets = rng.integers(0, Vs, (B, L)).astype(np.int32)
    dec_seg = (np.arange(L) < np.array([7, 4, 0])[:, None]).astype(np.int32)
    batch = {"decoder_target_ids": targets, "decoder_loss_weights": dec_seg.astype(np.float32),
             "decoder_segment_ids": dec_seg, "encoder_segment_ids": np.ones((B, 5), np.int32)}
    w = dec_seg.astype(np.float64)
    x = logits.astype(np.float64)
    log_z = np.log(np.exp(x).sum(-1))
    ce = log_z - np.take_along_axis(x, targets[..., None], -1)[..., 0]
    want_ce = (ce * w).sum() / w.sum()
    want_z = 1e-3 * (log_z ** 2 * w).sum() / w.sum()
    want_acc = ((x.argmax(-1) == targets) * w).sum() / w.sum()
    obj = objective(z_loss=1e-3)
    loss, metrics = jax.jit(obj.loss)({"logits": jnp.asarray(logits)}, batch)
    np.testing.assert_allclose(loss, want_ce + want_z, rtol=1e-5)
    np.testing.assert_allclose(metrics["cross_entropy"], want_ce, rtol=1e-5)
    np.testing.assert_allclose(metrics["z_loss"], want_z, rtol=1e-5)
    assert want_z > 1e-3  # the z-loss term is not negligible in this check
    np.testing.assert_allclose(metrics["accuracy"], want_acc, rtol=1e-6)
    assert metrics["tokens"] == 15 + 11
    # Gradient of the z-loss term alone: d/dlogits z * log_z^2 = 2 z log_z softmax, per weighted token.
    grad = jax.grad(lambda lg: denoising_loss(lg, batch, 1e-3)[1]["z_loss"])(jnp.asarray(logits))
    softmax = np.exp(x - log_z[..., None])
    np.testing.assert_allclose(grad, 2e-3 * (log_z * w)[..., None] * softmax / w.sum(), rtol=1e-4, atol=1e-7)
    # All padding: 0, not NaN.
    empty = dict(batch, decoder_loss_weights=np.zeros((B, L), np.float32))
    assert float(denoising_loss(jnp.asarray(logits), empty, 1e-3)[0]) == 0.0


@pytest.mark.slow  # ~20 s of CPU (jit of a tiny T5 + 60 steps)
def test_trains_the_t5_model_through_the_contract():
    """The batch feeds models/t5.py as the trainer does (model_inputs -> apply -> loss) and a tiny T5
    learns a periodic corpus: the loss falls well below its start."""
    import optax
    t5 = pytest.importorskip("models.t5")
    tok = types.SimpleNamespace(vocab_size=256, pad_id=0, eos_id=EOS, unk_id=2, num_extra_ids=20,
                                sentinel_id=lambda i: 255 - i)
    obj = objective(tok=tok)
    rng = np.random.default_rng(9)
    period = rng.integers(3, 60, 8)
    docs = [[np.tile(period, 3)[:rng.integers(5, 24)]] for _ in range(200)]
    instances = obj.create_instances(docs, rng, 32)
    model = t5.T5(t5.T5Config(vocab_size=256, d_model=32, num_heads=2, head_dim=16, d_ff=64,
                              num_encoder_layers=1, num_decoder_layers=1, dropout_rate=0.0))

    def batch_at(step):
        index = np.random.default_rng(step).integers(0, len(instances["length"]), 16)
        batch = obj.make_batch({k: v[index] for k, v in instances.items()}, np.random.default_rng([0, step]))
        return {k: jnp.asarray(v) for k, v in batch.items()}

    params = model.init(jax.random.key(0), **obj.model_inputs(batch_at(0)))["params"]
    tx = optax.adam(3e-3)

    @jax.jit
    def step(params, opt_state, batch):
        def loss_fn(p):
            return obj.loss(model.apply({"params": p}, **obj.model_inputs(batch), deterministic=True), batch)
        (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, metrics

    opt_state = tx.init(params)
    losses = []
    for s in range(60):
        params, opt_state, metrics = step(params, opt_state, batch_at(s))
        losses.append(float(metrics["cross_entropy"]))
    assert np.isfinite(losses).all()
    assert np.mean(losses[-10:]) < 0.6 * np.mean(losses[:5]), losses
