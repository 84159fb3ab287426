"""Adafactor as T5 trained with it, against transformers' Adafactor (PyTorch) and optax's; the rsqrt schedule; LAMB
as ALBERT trained with it, against a NumPy transcription of ALBERT's lamb_optimizer.py."""
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from models.layers import MultiHeadAttention
from pretrain.runtime import partitioning
from pretrain.runtime.errors import UserError
from pretrain.training import optimizers, train_state


def adafactor_config(**overrides) -> ml_collections.ConfigDict:
    """The optimizer keys a T5 config sets (configs/common.py's layout), T5's values by default."""
    c = ml_collections.ConfigDict(dict(
        name="adafactor", learning_rate=1.0, schedule="rsqrt", warmup_steps=10_000, end_learning_rate=0.0,
        decay_rate=0.8, clipping_threshold=1.0, multiply_by_parameter_scale=True, weight_decay=0.0,
        grad_clip_norm=0.0))
    c.update(overrides)
    return c


def random_problem(shapes: dict[str, tuple[int, ...]], steps: int, seed: int = 0):
    """Weights and a fixed sequence of gradients; gradient scales differ per row so factoring matters."""
    rng = np.random.default_rng(seed)
    params = {k: rng.normal(0, 0.05, s).astype(np.float32) for k, s in shapes.items()}
    grads = [{k: (rng.normal(0, 1, s) * rng.uniform(0.1, 3.0, s[:1] + (1,) * (len(s) - 1))).astype(np.float32)
              for k, s in shapes.items()} for _ in range(steps)]
    return params, grads


def run_optax(tx, params, grads):
    """Parameters after each update (any tree of arrays)."""
    params = jax.tree.map(jnp.asarray, params)
    state, history = tx.init(params), []

    @jax.jit
    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    for g in grads:
        params, state = step(params, state, jax.tree.map(jnp.asarray, g))
        history.append(jax.tree.map(np.asarray, params))
    return history


def run_transformers(params, grads, learning_rates):
    """transformers' Adafactor with T5's settings: external lr, parameter scaling, decay 1 - t^-0.8,
    update clipping at RMS 1, no momentum. `learning_rates[t]` is set on the group before step t."""
    torch = pytest.importorskip("torch")
    hf_optimization = pytest.importorskip("transformers.optimization")
    weights = {k: torch.nn.Parameter(torch.tensor(v)) for k, v in params.items()}
    opt = hf_optimization.Adafactor(list(weights.values()), lr=learning_rates[0], eps=(1e-30, 1e-3),
                                    clip_threshold=1.0, decay_rate=-0.8, beta1=None, weight_decay=0.0,
                                    scale_parameter=True, relative_step=False, warmup_init=False)
    history = []
    for g, lr in zip(grads, learning_rates):
        opt.param_groups[0]["lr"] = lr
        for k, w in weights.items():
            w.grad = torch.tensor(g[k])
        opt.step()
        history.append({k: w.detach().numpy().copy() for k, w in weights.items()})
    return history


def assert_histories_close(ours, reference, rtol=2e-5, atol=1e-7):
    for step, (a, b) in enumerate(zip(ours, reference)):
        for k in b:
            np.testing.assert_allclose(a[k], b[k], rtol=rtol, atol=atol, err_msg=f"{k} after update {step + 1}")


def test_matches_transformers_adafactor_on_matrices_and_vectors():
    """transformers factors every matrix (rows = its last-but-one dim); we factor matrices whose
    smaller dim reaches min_dim_size_to_factor (as optax, t5x and Mesh TF), so pick matrices that
    both factor, in both orientations, and vectors, which neither factors."""
    shapes = {"wide": (128, 192), "tall": (160, 128), "bias": (192,), "scale": (7,)}
    params, grads = random_problem(shapes, steps=6)
    ours = run_optax(optimizers.adafactor(0.01), params, grads)
    reference = run_transformers(params, grads, [0.01] * 6)
    assert_histories_close(ours, reference)
    moved = np.abs(ours[-1]["wide"] - params["wide"]).mean()
    assert moved > 1e-4  # the comparison is not between two unmoved copies


def test_small_matrices_factored_like_transformers_when_allowed():
    params, grads = random_problem({"a": (8, 16), "b": (24, 8), "v": (5,)}, steps=5, seed=1)
    ours = run_optax(optimizers.adafactor(0.02, min_dim_size_to_factor=8), params, grads)
    assert_histories_close(ours, run_transformers(params, grads, [0.02] * 5))


def test_equals_optax_adafactor_where_its_heuristic_applies():
    """On vectors and matrices (no names) only the factoring stage is ours; it must equal optax's."""
    params, grads = random_problem({"big": (128, 256), "small": (8, 16), "v": (10,)}, steps=4, seed=2)
    ours = run_optax(optimizers.adafactor(0.01), params, grads)
    theirs = run_optax(optax.adafactor(0.01, decay_rate=0.8, clipping_threshold=1.0, momentum=None,
                                       multiply_by_parameter_scale=True, eps=1e-30), params, grads)
    assert_histories_close(ours, theirs, rtol=1e-6, atol=1e-9)


def boxed_attention_params(d_model=16, heads=2, head_dim=8):
    module = MultiHeadAttention(num_heads=heads, head_dim=head_dim, use_bias=False)
    return module.init(jax.random.key(0), jnp.zeros((1, 3, d_model)))["params"]


def test_factored_state_shapes_and_logical_axes():
    """A [128, 256] kernel keeps a row and a column vector, not a full matrix; the 3-D attention
    kernels are factored as t5x's logical rules say, [D] x [H, K], even when small."""
    tx = optimizers.scale_by_factored_rms()
    v_row, v_col = tx.init({"kernel": jnp.zeros((128, 256))}).moments["kernel"]
    assert (v_row.shape, v_col.shape) == ((128, 1), (1, 256))
    (v,) = tx.init({"kernel": jnp.zeros((64, 256))}).moments["kernel"]  # 64 < 128: a full moment
    assert v.shape == (64, 256)

    moments = tx.init(boxed_attention_params()).moments
    for name, (rows, cols) in {"query": ((16, 1, 1), (1, 2, 8)), "out": ((1, 1, 16), (2, 8, 1))}.items():
        v_row, v_col = moments[name]["kernel"]
        assert (v_row.value.shape, v_col.value.shape) == (rows, cols), name
        assert v_row.value.size + v_col.value.size < 16 * 2 * 8  # not a full [D, H, K] moment
    specs = nn.get_partition_spec(moments)
    assert tuple(specs["query"]["kernel"][0]) == ("embed", None, None)
    assert tuple(specs["query"]["kernel"][1]) == (None, "heads", "kv")
    assert tuple(specs["out"]["kernel"][0]) == (None, None, "embed")
    # The trainer derives the state's shardings from these boxes: every spec fits its array.
    mesh = partitioning.create_mesh((-1, 1, 1))
    shardings = partitioning.logical_shardings(moments, mesh)
    placed = jax.device_put(train_state.unbox(moments), shardings)
    assert jax.tree.structure(placed) == jax.tree.structure(train_state.unbox(moments))


def test_attention_kernel_update_equals_the_2d_kernel_t5_had():
    """T5 (Mesh TF) stored q/k/v as [D, H*K] and o as [H*K, D]; factoring our [D, H, K] / [H, K, D]
    kernels by logical axes gives the very same updates as optax's Adafactor on those matrices."""
    boxed = boxed_attention_params(d_model=12, heads=3, head_dim=4)
    params = train_state.unbox(boxed)
    rng = np.random.default_rng(3)
    grads = [jax.tree.map(lambda p: jnp.asarray(rng.normal(0, 1, p.shape), jnp.float32), params) for _ in range(4)]
    tx = optimizers.adafactor(0.01)
    state = tx.init(boxed)  # init sees the names; updates run on plain arrays, as in the trainer
    assert len(train_state.unbox(state)[0].moments["key"]["kernel"]) == 2
    flat = lambda tree: {k: tree[k]["kernel"].reshape(12, 12) for k in tree}  # noqa: E731 [D, H*K] or [H*K, D]
    ref_tx = optax.adafactor(0.01, min_dim_size_to_factor=1, momentum=None)
    ref_params = flat(params)
    ref_state = ref_tx.init(ref_params)
    state = train_state.unbox(state)

    @jax.jit
    def step(params, state, ref_params, ref_state, g):
        updates, state = tx.update(g, state, params)
        ref_updates, ref_state = ref_tx.update(flat(g), ref_state, ref_params)
        return optax.apply_updates(params, updates), state, optax.apply_updates(ref_params, ref_updates), ref_state

    for g in grads:
        params, state, ref_params, ref_state = step(params, state, ref_params, ref_state, g)
    for k, v in flat(params).items():
        np.testing.assert_allclose(v, ref_params[k], rtol=1e-6, atol=1e-8, err_msg=k)


def test_rsqrt_schedule_is_t5s():
    """T5: 1/sqrt(max(step, 10^4)): 0.01 through the warmup, then inverse square root decay."""
    schedule = optimizers.learning_rate_schedule(adafactor_config(), num_train_steps=524_288)
    for step, lr in [(0, 0.01), (1, 0.01), (9_999, 0.01), (10_000, 0.01), (40_000, 0.005), (250_000, 0.002)]:
        assert float(schedule(step)) == pytest.approx(lr, rel=1e-6), step
    scaled = optimizers.learning_rate_schedule(adafactor_config(learning_rate=0.5, warmup_steps=0), 10)
    assert float(scaled(0)) == pytest.approx(0.5) and float(scaled(4)) == pytest.approx(0.25)
    # The other schedules are unchanged: fine-tuning T5 uses a constant 1e-3.
    constant = optimizers.learning_rate_schedule(adafactor_config(schedule="constant", learning_rate=1e-3,
                                                                 warmup_steps=0), 10)
    assert [float(constant(s)) for s in (0, 5)] == pytest.approx([1e-3, 1e-3])


def test_make_optimizer_adafactor_with_rsqrt_matches_transformers():
    """The trainer's entry point: the schedule drives the step size each update, as if
    transformers' group lr were set to the schedule's value before each step."""
    config = adafactor_config(learning_rate=0.1, warmup_steps=2)
    schedule = optimizers.learning_rate_schedule(config, num_train_steps=10)
    params, grads = random_problem({"w": (128, 136), "b": (136,)}, steps=5, seed=4)
    ours = run_optax(optimizers.make_optimizer(config, num_train_steps=10), params, grads)
    lrs = [float(schedule(t)) for t in range(5)]
    assert lrs[0] == lrs[2] > lrs[3] > lrs[4]
    assert_histories_close(ours, run_transformers(params, grads, lrs))


def test_global_norm_clipping_and_decoupled_weight_decay():
    """grad_clip_norm clips the raw gradient first (Adafactor's own scaling then makes the update
    invariant to it, so check the state); weight decay subtracts lr * weight_decay * w per step on the
    decaying weights, as our AdamW does."""
    config = adafactor_config(grad_clip_norm=1.0, weight_decay=0.1, multiply_by_parameter_scale=False)
    tx = optimizers.make_optimizer(config, num_train_steps=10)
    params = {"dense": {"kernel": jnp.ones((4, 3)), "bias": jnp.ones((3,))}}
    grads = {"dense": {"kernel": jnp.full((4, 3), 10.0), "bias": jnp.zeros((3,))}}
    _, state = tx.update(grads, tx.init(params), params)
    (v,) = state[1][0].moments["dense"]["kernel"]  # chain(clip, adafactor chain(factored rms, ...))
    np.testing.assert_allclose(v, (10.0 / np.sqrt(12 * 100.0)) ** 2 + 1e-30, rtol=1e-6)  # first v = g^2 + eps

    zero = jax.tree.map(jnp.zeros_like, params)
    updates, _ = tx.update(zero, tx.init(params), params)
    np.testing.assert_allclose(updates["dense"]["kernel"], -0.01 * 0.1 * np.ones((4, 3)), rtol=1e-6)  # lr 0.01
    np.testing.assert_allclose(updates["dense"]["bias"], 0.0)


def test_adamw_is_unchanged_and_names_are_checked():
    """config.optimizer.name=adamw is optax.adamw built directly with the config's hyperparameters (after clipping
    by global norm where grad_clip_norm is set; kernels and embeddings decay, biases and LayerNorm scales do not):
    the same parameters after every step, with optax's defaults and with other values of every hyperparameter."""
    shapes = {"kernel": (3, 4), "bias": (4,), "scale": (4,), "embedding": (5, 3)}
    decays = {"kernel": True, "bias": False, "scale": False, "embedding": True}
    params, grads = random_problem(shapes, steps=4, seed=5)
    assert all(float(optax.global_norm(g)) > 1.0 for g in grads)  # clipping at 1.0 acts on every step
    cases = [  # (the config's values, optax built directly)
        (dict(b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.0, grad_clip_norm=0.0),
         optax.adamw(1e-3, eps=1e-6, weight_decay=0.0)),
        (dict(b1=0.8, b2=0.95, eps=1e-7, weight_decay=0.1, grad_clip_norm=1.0),
         optax.chain(optax.clip_by_global_norm(1.0),
                     optax.adamw(1e-3, b1=0.8, b2=0.95, eps=1e-7, weight_decay=0.1, mask=decays))),
    ]
    finals = []
    for values, reference in cases:
        adamw = ml_collections.ConfigDict(dict(name="adamw", learning_rate=1e-3, schedule="constant", warmup_steps=0,
                                               end_learning_rate=0.0, **values))
        ours = run_optax(optimizers.make_optimizer(adamw, 10), params, grads)
        theirs = run_optax(reference, params, grads)
        assert len(ours) == len(theirs) == 4
        for step, (a, b) in enumerate(zip(ours, theirs), 1):
            for name in shapes:
                np.testing.assert_allclose(a[name], b[name], rtol=1e-6, atol=1e-9, err_msg=f"{name}, step {step}")
        finals.append(ours[-1])
    for name in shapes:  # the second case's values change every parameter's path: the comparison can fail
        assert np.abs(finals[0][name] - finals[1][name]).max() > 1e-5, name
    for key, value, needle in [("name", "sgd", "'adamw', 'adafactor', 'lamb'"), ("schedule", "cosine", "rsqrt")]:
        with pytest.raises(UserError) as e:
            optimizers.make_optimizer(adafactor_config(**{key: value}), 10)
        assert needle in str(e.value) and repr(value) in str(e.value) and "\n" not in str(e.value)


def test_head_learning_rate_scales_only_the_heads_updates():
    from pretrain.runtime.errors import ConfigError
    config = ml_collections.ConfigDict(dict(name="adamw", learning_rate=1e-4, end_learning_rate=0.0, schedule="constant",
                                            warmup_steps=0, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0,
                                            grad_clip_norm=0.0))
    params = {"bert": {"kernel": jnp.ones((3, 3))}, "head": {"kernel": jnp.ones((3, 2))}}
    tx = optimizers.with_head_learning_rate(optimizers.make_optimizer(config, 10), params, 3e-3, 1e-4)
    grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5), params)
    updates, _ = tx.update(grads, tx.init(params), params)
    np.testing.assert_allclose(updates["bert"]["kernel"], -1e-4, rtol=1e-4)  # Adam's first step: -lr * sign
    np.testing.assert_allclose(updates["head"]["kernel"], -3e-3, rtol=1e-4)
    with pytest.raises(ConfigError, match="config.head_learning_rate applies to a task head"):
        optimizers.with_head_learning_rate(tx, {"gpt": params["bert"], "score": params["head"]}, 3e-3, 1e-4)


# ----- LAMB as ALBERT trained with it -----
# Our tree's weights by the names ALBERT's TF variables have (exclusion there is a regex search on the name).
ALBERT_NAMES = {("embeddings", "embedding"): "bert/embeddings/word_embeddings",
                ("dense", "kernel"): "bert/encoder/attention/dense/kernel",
                ("dense", "bias"): "bert/encoder/attention/dense/bias",
                ("norm", "scale"): "bert/encoder/attention/LayerNorm/gamma",
                ("norm", "bias"): "bert/encoder/attention/LayerNorm/beta"}
ALBERT_EXCLUDE = ("LayerNorm", "layer_norm", "bias")  # optimization.py's exclude_from_weight_decay for LAMB


def albert_lamb(params: dict[str, np.ndarray], grads: list[dict[str, np.ndarray]], learning_rate: float,
                weight_decay: float = 0.01, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
                clip_norm: float = 1.0) -> list[dict[str, np.ndarray]]:
    """ALBERT's optimization.py + lamb_optimizer.py in float64: tf.clip_by_global_norm, then per variable Adam's
    moments without bias correction, weight decay and the trust ratio unless the name matches ALBERT_EXCLUDE
    (exclude_from_layer_adaptation defaults to exclude_from_weight_decay). Parameters after each step."""
    params = {k: v.astype(np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(w) for k, w in params.items()}
    history = []
    for g in grads:
        global_norm = np.sqrt(sum(np.sum(x.astype(np.float64) ** 2) for x in g.values()))
        for name, w in params.items():
            grad = g[name] * clip_norm / max(global_norm, clip_norm)
            m[name] = b1 * m[name] + (1 - b1) * grad
            v[name] = b2 * v[name] + (1 - b2) * grad ** 2
            update = m[name] / (np.sqrt(v[name]) + eps)
            excluded = any(re.search(r, name) for r in ALBERT_EXCLUDE)
            if weight_decay and not excluded:
                update = update + weight_decay * w
            ratio = 1.0
            if not excluded:
                w_norm, u_norm = np.linalg.norm(w), np.linalg.norm(update)
                ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
            params[name] = w - ratio * learning_rate * update
        history.append(dict(params))
    return history


def as_tree(flat: dict[str, np.ndarray]) -> dict:
    tree = {}
    for (block, leaf), name in ALBERT_NAMES.items():
        tree.setdefault(block, {})[leaf] = flat[name]
    return tree


def lamb_config(**overrides) -> ml_collections.ConfigDict:
    """configs/albert.py's optimizer keys, the schedule held constant."""
    c = ml_collections.ConfigDict(dict(name="lamb", learning_rate=0.05, schedule="constant", warmup_steps=0,
                                       end_learning_rate=0.0, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01,
                                       grad_clip_norm=1.0))
    c.update(overrides)
    return c


def test_lamb_matches_albert_lamb_optimizer_transcribed_in_numpy():
    """Three steps on an embedding, a kernel, a bias and a LayerNorm: decay and trust ratio on the first two only,
    no bias correction, the gradient clipped first. The biases are not zero and the gradients not tiny, so a trust
    ratio on the LayerNorm or the biases, a bias correction, or a decay on the wrong weights all change the result."""
    rng = np.random.default_rng(7)
    shapes = {"bert/embeddings/word_embeddings": (6, 4), "bert/encoder/attention/dense/kernel": (4, 4),
              "bert/encoder/attention/dense/bias": (4,), "bert/encoder/attention/LayerNorm/gamma": (4,),
              "bert/encoder/attention/LayerNorm/beta": (4,)}
    params = {k: rng.normal(0, 0.1, s).astype(np.float32) for k, s in shapes.items()}
    params["bert/encoder/attention/LayerNorm/gamma"] += 1.0  # a LayerNorm scale starts near ones
    grads = [{k: rng.normal(0, 0.5, s).astype(np.float32) for k, s in shapes.items()} for _ in range(3)]
    assert all(np.sqrt(sum(np.sum(x ** 2) for x in g.values())) > 1.0 for g in grads)  # clipping acts

    ours = run_optax(optimizers.make_optimizer(lamb_config(), num_train_steps=10), as_tree(params),
                     [as_tree(g) for g in grads])
    reference = albert_lamb(params, grads, learning_rate=0.05)
    for step, (a, b) in enumerate(zip(ours, reference), 1):
        for (block, leaf), name in ALBERT_NAMES.items():
            np.testing.assert_allclose(a[block][leaf], b[name], rtol=2e-5, atol=1e-7, err_msg=f"{name}, step {step}")
    moved = np.abs(ours[-1]["norm"]["scale"] - params["bert/encoder/attention/LayerNorm/gamma"]).max()
    assert moved > 0.05  # untrusted weights take Adam's full steps: three of about lr each



def test_warmup_stable_decay_holds_the_peak_then_decays_as_one_minus_sqrt():
    """ModernBERT's trapezoid: linear warmup over 10 steps, the peak to step 91 (10% of the 90 steps after the warmup
    decay), then peak * (1 - sqrt(t)) to 0 at step 100."""
    config = ml_collections.ConfigDict(dict(schedule="warmup_stable_decay", learning_rate=1.0, warmup_steps=10,
                                            end_learning_rate=0.0, decay_fraction=0.1))
    schedule = optimizers.learning_rate_schedule(config, num_train_steps=100)
    assert float(schedule(5)) == pytest.approx(0.5)
    assert [float(schedule(s)) for s in (10, 50, 91)] == pytest.approx([1.0, 1.0, 1.0])
    assert float(schedule(91 + 9 * 0.25)) == pytest.approx(1 - 0.5, abs=1e-6)  # t = 1/4: 1 - sqrt(1/4)
    assert float(schedule(100)) == pytest.approx(0.0, abs=1e-7)


def test_ramp_plan_grows_the_groups_linearly_to_final_at_the_fraction_and_covers_every_step():
    plan = optimizers.ramp_plan(1000, final=4, ramp_fraction=0.6)
    starts = np.cumsum(plan) - plan
    assert plan[0] == 1 and plan.max() == 4 and np.all(np.diff(plan) >= 0)
    assert 600 <= starts[plan == 4][0] < 604  # the first group of 4 starts once 60% of the steps are behind
    assert starts[plan == 3][0] == pytest.approx(400, abs=3)  # 1 + 3 * 400 / 600 = 3
    assert plan.sum() >= 1000 > starts[-1]  # the last group ends at or after the last step, and starts before it


def test_batch_ramp_updates_once_a_group_on_its_mean_gradient_at_the_rate_of_its_last_step():
    """SGD under the ramp, 1 then groups of 2 (ramp_fraction 0): one step alone, then a step that changes nothing and a
    step that applies the mean of both gradients at the schedule's rate of that step."""
    schedule = lambda step: 0.1 * (step + 1)
    tx = optimizers.with_batch_ramp(optax.sgd, schedule, num_train_steps=5, final=2, ramp_fraction=0.0)
    w = jnp.zeros(3)
    state = tx.init(w)
    grads = [jnp.array([1.0, 0.0, 0.0]), jnp.array([0.0, 2.0, 0.0]), jnp.array([0.0, 0.0, 4.0])]
    trajectory = []
    for g in grads:
        updates, state = tx.update(g, state, w)
        w = optax.apply_updates(w, updates)
        trajectory.append(np.asarray(w))
    np.testing.assert_allclose(trajectory[0], [-0.1, 0, 0])        # step 0 at its rate 0.1
    np.testing.assert_allclose(trajectory[1], trajectory[0])       # step 1 opens a group: no update
    np.testing.assert_allclose(trajectory[2], [-0.1, -0.3, -0.6])  # mean [0, 1, 2] at step 2's rate 0.3


def test_make_optimizer_under_the_ramp_is_adamw_with_clipping_fed_each_groups_mean_gradient():
    config = ml_collections.ConfigDict(dict(name="adamw", learning_rate=1e-3, schedule="constant", warmup_steps=0,
                                            end_learning_rate=0.0, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.0,
                                            grad_clip_norm=1.0, ramp_accumulation=2, ramp_fraction=0.0))
    ramped = optimizers.make_optimizer(config, 5)
    plain = optimizers.make_optimizer(ml_collections.ConfigDict({**config.to_dict(), "ramp_accumulation": 1}), 5)
    w = {"kernel": jnp.ones(2)}
    g = [{"kernel": jnp.array(v)} for v in ([3.0, 0.0], [0.0, 4.0], [0.0, -8.0])]
    ramped_state, plain_state, w_ramped, w_plain = ramped.init(w), plain.init(w), w, w
    for grad in g:
        updates, ramped_state = ramped.update(grad, ramped_state, w_ramped)
        w_ramped = optax.apply_updates(w_ramped, updates)
    for grad in (g[0], jax.tree.map(lambda a, b: (a + b) / 2, g[1], g[2])):  # the plain optimizer fed the means
        updates, plain_state = plain.update(grad, plain_state, w_plain)
        w_plain = optax.apply_updates(w_plain, updates)
    np.testing.assert_allclose(w_ramped["kernel"], w_plain["kernel"], rtol=1e-6)
    assert not np.allclose(w_plain["kernel"], 1.0)
