"""The fine-tuning loop: GLUE task data, a BERT with a task head, epochs with dev evaluation.

`finetune(config, workdir)` reads top to bottom: the init checkpoint and its tokenizer, the task's
splits, the model and sharded state (pretrained encoder + fresh head), the optimizer with the
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

from models.finetuning import BertForFineTuning, bert_config_from_dict
from objectives.finetuning import FineTuningObjective
from pretrain import checkpoints, freezing, glue_metrics, partitioning, pretrained, trainer
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
        config.model.update(init.model)
        if not config.tokenizer.path:
            config.tokenizer.update(init.tokenizer)
    if not config.tokenizer.path:
        raise UserError("no tokenizer: give --config.init (a checkpoint with its tokenizer) or "
                        "--config.tokenizer.path")
    return config, init


def _load_split(config, task: glue.GlueTask, split: str, tokenizer, batch_size: int,
                subset: int = 0) -> tuple[finetune_data.FineTuningData, np.ndarray, np.ndarray]:
    """-> (batched features, labels [N], example ids [N]) of one split."""
    data_dir = config.data.glue_dir if config.data.source == "dir" else config.data.tfds_data_dir
    examples = glue.load_split(task, split, source=config.data.source, data_dir=data_dir)
    examples = [examples[i] for i in finetune_data.subset_indices(len(examples), subset)]
    features = finetune_data.encode_texts(tokenizer, [e.text_a for e in examples],
                                          [e.text_b for e in examples] if task.is_pair else None,
                                          config.data.max_seq_length)
    labels = np.array([e.label for e in examples], np.float32 if task.is_regression else np.int32)
    data = finetune_data.FineTuningData(features, {"label": labels}, batch_size, tokenizer.pad_id,
                                        config.data.pad_to_multiple_of)
    return data, labels, np.array([e.idx for e in examples], np.int64)


def build_model(config: ml_collections.ConfigDict, task: glue.GlueTask) -> BertForFineTuning:
    kind = "regression" if task.is_regression else "classification"
    return BertForFineTuning(bert_config_from_dict(config.model.to_dict()), kind, task.num_labels,
                             config.model.classifier_dropout)


def _merge_encoder(params: dict, bert_params: dict, source: str) -> tuple[dict, list[str]]:
    """Pretrained encoder weights into the fresh tree (shapes must agree); -> (params, fresh names)."""
    fresh = []

    def take(path, current):
        node = bert_params
        for key in path:
            node = node.get(key.key) if isinstance(node, dict) else None
        name = "/".join(str(k.key) for k in path)
        if node is None:
            fresh.append(name)
            return current
        if tuple(np.shape(node)) != tuple(current.shape):
            raise UserError(f"{source}: bert/{name} has shape {tuple(np.shape(node))}, the model wants "
                            f"{tuple(current.shape)}")
        return np.asarray(node, current.dtype)

    merged = dict(params)
    merged["bert"] = jax.tree_util.tree_map_with_path(take, jax.device_get(params["bert"]))
    return merged, fresh


def create_state(config, model, example, mesh, tx, init: pretrained.Pretrained | None):
    """Sharded TrainState: random init, then the pretrained encoder put onto the same shardings."""
    init_fn = functools.partial(state_lib.create_train_state, model, example, jax.random.key(config.seed), tx)
    boxed = jax.eval_shape(init_fn)
    shardings = partitioning.logical_shardings(boxed, mesh)
    with mesh:
        state = jax.jit(lambda: state_lib.unbox(init_fn()), out_shardings=shardings)()
    if init is not None:
        params, fresh = _merge_encoder(state.params, init.bert_params, init.source)
        state = state.replace(params=jax.device_put(params, shardings.params))
        print(f"Encoder from {init.source}" + (f"; freshly initialised: {', '.join(fresh)}" if fresh else ""))
    return state, shardings


def make_optimizer(config, params, steps_per_epoch: int):
    total = config.num_epochs * steps_per_epoch
    opt = copy.deepcopy(config.optimizer)
    if opt.warmup_steps < 0:
        opt.warmup_steps = int(round(config.warmup_fraction * total))
    unfreeze_at = freezing.unfreeze_steps(params, config.freezing, num_layers=config.model.num_layers,
                                          steps_per_epoch=steps_per_epoch)
    tx = freezing.freeze(state_lib.make_optimizer(opt, total), unfreeze_at)
    return tx, state_lib.learning_rate_schedule(opt, total), unfreeze_at


# ---------------------------------------------------------------------------------------------
# Prediction and scoring (shared with pretrain.evaluate).
# ---------------------------------------------------------------------------------------------
def predict_step(params, batch, *, apply_fn, objective):
    outputs = apply_fn({"params": params}, **objective.model_inputs(batch), deterministic=True)
    return objective.predictions(outputs, batch)


def predict(jit_predict, params, data: finetune_data.FineTuningData, mesh) -> np.ndarray:
    """Predicted label ids (or STS-B scores) for every example of `data`, in its order."""
    out = None
    for batch in data.batches():
        prediction = next(iter(jax.device_get(jit_predict(params, partitioning.shard_batch(batch, mesh))).values()))
        real = batch["weight"] > 0
        out = np.zeros(len(data), prediction.dtype) if out is None else out
        out[batch["index"][real]] = prediction[real]
    return out


def write_predictions(path: str, task: glue.GlueTask, ids: np.ndarray, predictions: np.ndarray,
                      labels: np.ndarray) -> None:
    """A readable dev file: index, prediction, label (label names for classification)."""
    def name(v):
        return f"{float(v):.4f}" if task.is_regression else task.labels[int(v)]
    with open(path, "w") as f:
        f.write("index\tprediction\tlabel\n")
        for i, p, y in zip(ids, predictions, labels):
            f.write(f"{i}\t{name(p)}\t{name(y)}\n")


def score_splits(config, task, jit_predict, params, mesh, tokenizer, splits, workdir: str) -> dict:
    """Dev splits: predictions file + official metrics. Test splits: the GLUE submission file."""
    results = {}
    os.makedirs(os.path.join(workdir, "predictions"), exist_ok=True)
    for split in splits:
        try:
            data, labels, ids = _load_split(config, task, split, tokenizer, config.eval_batch_size)
        except glue.GlueDataError as e:
            if split in task.test_splits:
                print(f"Skipped test predictions for {split}: {e}")
                continue
            raise
        predictions = predict(jit_predict, params, data, mesh)
        if split in task.test_splits:
            path = glue.write_submission(task, split, predictions.tolist(), ids.tolist(),
                                         os.path.join(workdir, "predictions"))
            print(f"Test predictions ({split}, GLUE submission format): {path}")
        else:
            write_predictions(os.path.join(workdir, "predictions", f"{split}.tsv"), task, ids, predictions, labels)
            results[split] = glue_metrics.compute_metrics(task, predictions, labels)
    return results


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
    tokenizer = tokenizers.load_tokenizer(config.tokenizer.kind, config.tokenizer.path,
                                          lowercase=config.tokenizer.lowercase)
    if tokenizer.vocab_size > config.model.vocab_size:
        raise trainer.ConfigError(f"the tokenizer has {tokenizer.vocab_size} ids but the model's vocabulary "
                                  f"has {config.model.vocab_size}; use the tokenizer the checkpoint was trained with")
    if config.data.max_seq_length > config.model.max_position_embeddings:
        raise trainer.ConfigError(f"config.data.max_seq_length={config.data.max_seq_length} exceeds the model's "
                                  f"{config.model.max_position_embeddings} positions")
    with open(os.path.join(workdir, "config.json"), "w") as f:
        f.write(config.to_json_best_effort(indent=2))

    # ----- Data -----
    train_data, _, _ = _load_split(config, task, "train", tokenizer, config.batch_size,
                                   subset=config.data.max_train_examples)
    steps_per_epoch = train_data.steps_per_epoch
    print(f"Task {task.name}: {len(train_data)} training examples, {steps_per_epoch} steps/epoch x "
          f"{config.num_epochs} epochs")

    # ----- Model, optimizer (with freezing) and sharded state -----
    mesh = partitioning.create_mesh(config.mesh_shape)
    model = build_model(config, task)
    objective = FineTuningObjective(model.kind, task.num_labels)
    example = {k: v[:1] for k, v in objective.model_inputs(train_data.batch(np.arange(1))).items()}
    abstract_params = state_lib.unbox(jax.eval_shape(
        lambda: model.init(jax.random.key(0), **example, deterministic=True)["params"]))
    tx, schedule, unfreeze_at = make_optimizer(config, abstract_params, steps_per_epoch)
    state, shardings = create_state(config, model, example, mesh, tx, init)
    print(f"Model: {state_lib.count_params(state.params):,} parameters, "
          f"{freezing.trainable_fraction(state.params, unfreeze_at, 0):.1%} trainable at step 0 "
          f"(freezing: {config.freezing.strategy}); mesh {dict(mesh.shape)}; workdir {os.path.abspath(workdir)}")

    replicated = partitioning.replicated(mesh)
    jit_train = jax.jit(functools.partial(trainer.train_step, objective=objective, schedule=schedule),
                        in_shardings=(shardings, partitioning.batch_sharding(mesh, batch_dim=1), replicated),
                        out_shardings=(shardings, replicated), donate_argnums=(0,))
    jit_predict = jax.jit(functools.partial(predict_step, apply_fn=model.apply, objective=objective),
                          in_shardings=(shardings.params, partitioning.batch_sharding(mesh)))
    dev_data = {s: _load_split(config, task, s, tokenizer, config.eval_batch_size) for s in task.dev_splits}

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
            dev = {s: glue_metrics.compute_metrics(task, predict(jit_predict, state.params, d, mesh), labels)
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
        score_splits(config, task, jit_predict, params, mesh, tokenizer, splits, workdir)
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

