"""The fine-tuning loop: GLUE task data, a pretrained model, epochs with dev evaluation.

The model family (pretrain/finetune_families.py: BERT + a task head, or T5 text to text) says how
examples become batches, what trains and how predictions become labels; the loop is shared.
`finetune(config, workdir)` reads top to bottom: the init checkpoint and its tokenizer, the task's
splits, the model and sharded state (pretrained weights + a fresh head), the optimizer with the
freezing strategy, then epochs of `trainer.train_step` (the pretraining step, shared) with a dev
evaluation after each. The best epoch by the task's main metric is the one checkpoint kept; its
dev and test predictions and DIR/results.json are written at the end.
"""
from __future__ import annotations

import copy
import functools
import json
import os
import time

import jax
import ml_collections
import numpy as np
from tqdm import tqdm

from pretrain import checkpoints, finetune_families, freezing, glue_metrics, partitioning, pretrained, trainer
from pretrain import state as state_lib
from pretrain.data import finetune_data, glue, tokenizers
from pretrain.data.pipeline import prefetch
from pretrain.errors import UserError
from pretrain.metric_writers import MetricWriter


# ---------------------------------------------------------------------------------------------
# Set-up: config, data, model, state.
# ---------------------------------------------------------------------------------------------
def resolve_config(config: ml_collections.ConfigDict) -> tuple[ml_collections.ConfigDict, pretrained.Pretrained | None]:
    """The architecture and tokenizer of `config.init` replace the config's defaults."""
    config = copy.deepcopy(config)
    config.unlock()
    init = pretrained.load_pretrained(config.init) if config.init else None
    if init is not None:
        if init.family != config.model.name:
            raise UserError(f"--config.init={config.init} holds a {init.family} model but the config fine-tunes "
                            f"{config.model.name}: use configs/glue.py:task={config.task},model={init.family}")
        config.model.update(init.model)
        if not config.tokenizer.path:
            config.tokenizer.update(init.tokenizer)
    if not config.tokenizer.path:
        raise UserError("no tokenizer: give --config.init (a checkpoint with its tokenizer) or "
                        "--config.tokenizer.path")
    return config, init


def load_tokenizer(config: ml_collections.ConfigDict) -> tokenizers.Tokenizer:
    t = config.tokenizer
    return tokenizers.load_tokenizer(t.kind, t.path, lowercase=t.lowercase, extra_ids=t.get("extra_ids", 0))


def _load_split(config, family, split: str, batch_size: int, subset: int = 0
                ) -> tuple[finetune_data.FineTuningData, np.ndarray, np.ndarray]:
    """-> (batched features, labels [N], example ids [N]) of one split."""
    task = family.task
    data_dir = config.data.glue_dir if config.data.source == "dir" else config.data.tfds_data_dir
    examples = glue.load_split(task, split, source=config.data.source, data_dir=data_dir)
    examples = [examples[i] for i in finetune_data.subset_indices(len(examples), subset)]
    labels = np.array([e.label for e in examples], np.float32 if task.is_regression else np.int32)
    return family.encode(examples, batch_size), labels, np.array([e.idx for e in examples], np.int64)


def create_state(config, family, model, example, mesh, tx, init: pretrained.Pretrained | None):
    """Sharded TrainState: random init, then the pretrained encoder put onto the same shardings."""
    init_fn = functools.partial(state_lib.create_train_state, model, example, jax.random.key(config.seed), tx)
    boxed = jax.eval_shape(init_fn)
    shardings = partitioning.logical_shardings(boxed, mesh)
    with mesh:
        state = jax.jit(lambda: state_lib.unbox(init_fn()), out_shardings=shardings)()
    if init is not None:
        params, fresh = family.merge_pretrained(state.params, init)
        state = state.replace(params=jax.device_put(params, shardings.params))
        print(f"Weights from {init.source}" + (f"; freshly initialised: {', '.join(fresh)}" if fresh else ""))
    return state, shardings


def make_optimizer(config, params, steps_per_epoch: int, num_layers: int):
    total = config.num_epochs * steps_per_epoch
    opt = copy.deepcopy(config.optimizer)
    if opt.warmup_steps < 0:
        opt.warmup_steps = int(round(config.warmup_fraction * total))
    unfreeze_at = freezing.unfreeze_steps(params, config.freezing, num_layers=num_layers,
                                          steps_per_epoch=steps_per_epoch)
    tx = freezing.freeze(state_lib.make_optimizer(opt, total), unfreeze_at)
    return tx, state_lib.learning_rate_schedule(opt, total), unfreeze_at


# ---------------------------------------------------------------------------------------------
# Prediction and scoring (shared with pretrain.evaluate).
# ---------------------------------------------------------------------------------------------
def predict(jit_predict, family, params, data: finetune_data.FineTuningData, mesh) -> np.ndarray:
    """Predicted label ids (or STS-B scores) for every example of `data`, in its order."""
    out = None
    for batch in data.batches():
        prediction = family.to_labels(jax.device_get(jit_predict(params, partitioning.shard_batch(batch, mesh))))
        real = batch["weight"] > 0
        out = np.zeros(len(data), prediction.dtype) if out is None else out
        out[batch["index"][real]] = prediction[real]
    return out


def write_predictions(path: str, task: glue.GlueTask, ids: np.ndarray, predictions: np.ndarray,
                      labels: np.ndarray) -> None:
    """A readable dev file: index, prediction, label (label names for classification)."""
    def name(v):  # a class id < 0: a T5 output that names no class
        return f"{float(v):.4f}" if task.is_regression else (task.labels[int(v)] if v >= 0 else "(invalid)")
    with open(path, "w") as f:
        f.write("index\tprediction\tlabel\n")
        for i, p, y in zip(ids, predictions, labels):
            f.write(f"{i}\t{name(p)}\t{name(y)}\n")


def score_splits(config, family, jit_predict, params, mesh, splits, workdir: str) -> dict:
    """Dev splits: predictions file + official metrics. Test splits: the GLUE submission file."""
    task, results = family.task, {}
    os.makedirs(os.path.join(workdir, "predictions"), exist_ok=True)
    for split in splits:
        try:
            data, labels, ids = _load_split(config, family, split, config.eval_batch_size)
        except glue.GlueDataError as e:
            if split in task.test_splits:
                print(f"Skipped test predictions for {split}: {e}")
                continue
            raise
        predictions = predict(jit_predict, family, params, data, mesh)
        if split in task.test_splits:
            path = glue.write_submission(task, split, family.for_submission(predictions).tolist(), ids.tolist(),
                                         os.path.join(workdir, "predictions"))
            print(f"Test predictions ({split}, GLUE submission format): {path}")
        else:
            write_predictions(os.path.join(workdir, "predictions", f"{split}.tsv"), task, ids, predictions, labels)
            results[split] = dev_metrics(family, predictions, labels)
    return results


def dev_metrics(family, predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    return glue_metrics.compute_metrics(family.task, family.for_metrics(predictions, labels), labels)


def dev_score(task: glue.GlueTask, results: dict) -> float:
    """Model selection: the main metric on the first dev split (MNLI: matched)."""
    return float(results[task.dev_splits[0]][task.main_metric])


# ---------------------------------------------------------------------------------------------
# The loop.
# ---------------------------------------------------------------------------------------------
def finetune(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Fine-tunes and evaluates; returns the contents of DIR/results.json."""
    started = time.perf_counter()
    os.makedirs(workdir, exist_ok=True)
    results_path = os.path.join(workdir, "results.json")
    if os.path.exists(results_path):
        print(f"Nothing to do: {results_path} exists (use a new --workdir to train again)")
        with open(results_path) as f:
            return json.load(f)
    task = glue.get_task(config.task)
    config, init = resolve_config(config)
    tokenizer = load_tokenizer(config)
    if tokenizer.vocab_size > config.model.vocab_size:
        raise trainer.ConfigError(f"the tokenizer has {tokenizer.vocab_size} ids but the model's vocabulary "
                                  f"has {config.model.vocab_size}; use the tokenizer the checkpoint was trained with")
    family = finetune_families.for_config(config, task, tokenizer)
    family.check()
    with open(os.path.join(workdir, "config.json"), "w") as f:
        f.write(config.to_json_best_effort(indent=2))

    # ----- Data -----
    train_data, _, _ = _load_split(config, family, "train", config.batch_size, subset=config.data.max_train_examples)
    steps_per_epoch = train_data.steps_per_epoch
    print(f"Task {task.name}: {len(train_data)} training examples, {steps_per_epoch} steps/epoch x "
          f"{config.num_epochs} epochs")

    # ----- Model, optimizer (with freezing) and sharded state -----
    mesh = partitioning.create_mesh(config.mesh_shape)
    model, objective = family.build_model(), family.objective
    example = {k: v[:1] for k, v in objective.model_inputs(train_data.batch(np.arange(1))).items()}
    abstract_params = state_lib.unbox(jax.eval_shape(
        lambda: model.init(jax.random.key(0), **example, deterministic=True)["params"]))
    tx, schedule, unfreeze_at = make_optimizer(config, abstract_params, steps_per_epoch, family.num_layers)
    state, shardings = create_state(config, family, model, example, mesh, tx, init)
    print(f"Model: {state_lib.count_params(state.params):,} parameters, "
          f"{freezing.trainable_fraction(state.params, unfreeze_at, 0):.1%} trainable at step 0 "
          f"(freezing: {config.freezing.strategy}); mesh {dict(mesh.shape)}; workdir {os.path.abspath(workdir)}")

    replicated = partitioning.replicated(mesh)
    jit_train = jax.jit(functools.partial(trainer.train_step, objective=objective, schedule=schedule),
                        in_shardings=(shardings, partitioning.batch_sharding(mesh, batch_dim=1), replicated),
                        out_shardings=(shardings, replicated), donate_argnums=(0,))
    jit_predict = jax.jit(family.predict_fn(model), in_shardings=(shardings.params, partitioning.batch_sharding(mesh)))
    dev_data = {s: _load_split(config, family, s, config.eval_batch_size) for s in task.dev_splits}

    # ----- Epochs -----
    ckpt = checkpoints.Checkpointer(os.path.join(workdir, "checkpoints"), save_every=0, keep=1)
    writer = MetricWriter(workdir)
    dropout_rng = jax.random.key(config.seed + 1)
    best, epochs, step = None, [], 0
    train_started = time.perf_counter()
    with mesh:
        for epoch in range(config.num_epochs):
            chunks = train_data.epoch_order(config.seed, epoch)
            losses, window = [], []  # window: device metrics since the last log, fetched then (no per-step sync)
            bar = tqdm(prefetch(lambda i: train_data.batch(chunks[i]), range(len(chunks)), config.prefetch),
                       total=len(chunks), desc=f"epoch {epoch + 1}/{config.num_epochs}", unit="step",
                       dynamic_ncols=True, mininterval=1.0)
            for _, host_batch in bar:
                batch = partitioning.shard_batch({k: v[None] for k, v in host_batch.items()}, mesh, batch_dim=1)
                state, metrics = jit_train(state, batch, dropout_rng)
                window.append(metrics)
                step += 1
                if step % config.log_every == 0 or step % steps_per_epoch == 0:
                    fetched = jax.device_get(window)
                    losses += [float(m["loss"]) for m in fetched]
                    record = {k: float(np.mean([m[k] for m in fetched])) for k in fetched[0] if k != "examples"}
                    writer.write(step, record)
                    bar.set_postfix(loss=f"{record['loss']:.3f}")
                    window = []
            dev = {s: dev_metrics(family, predict(jit_predict, family, state.params, d, mesh), labels)
                   for s, (d, labels, _) in dev_data.items()}
            score = dev_score(task, dev)
            for split, values in dev.items():
                writer.write(step, values, prefix=f"eval_{split}")
            epochs.append({"epoch": epoch + 1, "step": step, "train_loss": float(np.mean(losses)) if losses else None,
                           "dev": dev})
            print(f"epoch {epoch + 1}: " + "; ".join(f"{s} " + ", ".join(f"{k}={v:.4f}" for k, v in m.items())
                                                     for s, m in dev.items()))
            if best is None or score > best[1]:
                best = (epoch + 1, score, dev)
                # Parameters only: a fine-tuning run restarts from scratch rather than resuming.
                ckpt.save(step, {"params": state.params}, {"epoch": epoch + 1, task.main_metric: score}, force=True)
    train_time = time.perf_counter() - train_started
    ckpt.close()
    writer.close()

    # ----- Best checkpoint: predictions and results -----
    best_params, _ = checkpoints.restore_params(os.path.join(workdir, "checkpoints"))
    params = jax.device_put(best_params, shardings.params)
    splits = list(task.dev_splits) + (list(task.test_splits) if config.write_test_predictions else [])
    with mesh:
        score_splits(config, family, jit_predict, params, mesh, splits, workdir)
    results = {"task": task.name, "main_metric": task.main_metric, "best_epoch": best[0], "best_score": best[1],
               "metrics": best[2], "epochs": epochs, "wall_time_sec": time.perf_counter() - started,
               "train_time_sec": train_time, "seed": config.seed,
               "learning_rate": config.optimizer.learning_rate, "freezing": config.freezing.strategy,
               "init": init.source if init else "random", "train_examples": len(train_data)}
    tmp = results_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=2)
    os.replace(tmp, results_path)  # results.json marks a finished run: never half-written
    return results

