"""The fine-tuning loop: a task's data (GLUE, CoNLL), a pretrained model, epochs with dev evaluation.

The finetuner (pretrain/finetuners/) says how examples become batches, what trains and how predictions
become labels; the loop is shared. `finetune(config, workdir)` reads top to bottom: the init and tokenizer, the task's
splits, the model and sharded state (pretrained weights + a fresh head), the optimizer with the
freezing strategy, then epochs of `steps.train_step` (the pretraining step, shared) with a dev
evaluation after each. The best epoch by the task's main metric is the one checkpoint kept; its
dev and test predictions and DIR/results.json are written at the end. With config.data.validation_examples the
best epoch is chosen on that many training examples held out (scoring.load_training), and dev is only reported.

A run resumes like pretraining: on SIGTERM / SIGINT (pretrain/workdir/preemption.py), and every
`config.checkpoint_every` steps if set, DIR/resume/ receives the whole train state and the loop's position (epoch,
batches done in it, best so far, every finished epoch's record, the losses and metrics not logged yet), and the
same command continues from there to the results.json of an uninterrupted run. DIR/resume/ goes once results.json
is written.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Collection, Mapping
from typing import Any

import jax
import ml_collections
import numpy as np
import optax
from tqdm import tqdm

from pretrain.data import tokenizers
from pretrain.data.prefetch import prefetch
from pretrain.distillation import task_teacher
from pretrain.finetuners import registry
from pretrain.loops import setup
from pretrain.loops.finetune_position import BestEpoch, Position, restore_position
from pretrain.loops.scoring import VALIDATION, load_split, load_training, predict, score_splits, selection_score
from pretrain.loops.steps import micro_batches
from pretrain.runtime import distributed, partitioning, profiling
from pretrain.runtime.errors import ConfigError
from pretrain.tasks import registry as task_registry
from pretrain.training import discriminative, freezing, guards, optimizers, pretrained, train_state, validation
from pretrain.training import peft as parameter_efficient
from pretrain.workdir import checkpoints, preemption, storage, lock as workdir_lock, run_files as workdirs
from pretrain.workdir.metric_writers import MetricWriter


# ---------------------------------------------------------------------------------------------
# Set-up: config, data, model, state.
# ---------------------------------------------------------------------------------------------
def make_optimizer(config, params, steps_per_epoch: int, finetuner, fresh: Collection[str] = ()):
    """-> (tx, schedule, each parameter's first training step, the PEFT trainable mask or None). fresh: the body's
    weights the pretrained checkpoint lacks, which train from the start (freezing.train_fresh)."""
    total, opt = config.num_epochs * steps_per_epoch, config.optimizer
    # Built once, and given to the optimizer and the step (which logs it). config.optimizer.learning_rate's path to
    # optax: this call, then pretrain/training/optimizers.py.
    schedule = optimizers.learning_rate_schedule(opt, total, warmup_steps(config, total))
    tx = optimizers.make_optimizer(opt, total, schedule=schedule)
    if config.get("head_learning_rate", 0.0) > 0:
        tx = optimizers.with_head_learning_rate(tx, params, config.head_learning_rate, opt.learning_rate)
    if config.get("discriminative_factor", 1.0) != 1.0:  # ULMFiT's rate per layer (PEFT: refused by validation)
        scales = discriminative.rate_scales(params, config.discriminative_factor, finetuner.num_layers, fresh)
        print(f"Discriminative rates (x{config.optimizer.learning_rate:g}): {discriminative.describe(scales)}")
        tx = optax.chain(tx, discriminative.scale_updates(scales))
    if parameter_efficient.is_peft(config):
        mask = parameter_efficient.trainable(params, finetuner.name, config)
        return parameter_efficient.optimizer(tx, mask), schedule, parameter_efficient.unfreeze_steps(mask), mask
    unfreeze_at = freezing.unfreeze_steps(params, config.freezing, num_layers=finetuner.num_layers,
                                          steps_per_epoch=steps_per_epoch)
    unfreeze_at = freezing.train_fresh(unfreeze_at, fresh)
    return freezing.freeze(tx, unfreeze_at), schedule, unfreeze_at, None


def warmup_steps(config, total: int) -> int:
    """config.optimizer.warmup_steps, or where it is -1 the config.warmup_fraction of the run's `total` steps (a
    value of this run, never written back into the config)."""
    if config.optimizer.warmup_steps >= 0:
        return config.optimizer.warmup_steps
    return int(round(config.warmup_fraction * total))


@dataclasses.dataclass
class Model:
    """The trainer of one run and what it starts from: the sharded state (pretrained weights + a fresh head),
    each parameter's first training step, the PEFT mask and the reference to the weights PEFT adapts."""

    trainer: setup.Trainer
    state: train_state.TrainState
    unfreeze_at: Any
    peft_mask: Any = None
    peft_base: dict | None = None  # stored in a PEFT checkpoint: the weights its trained parameters adapt


def build(config, finetuner, train_data, init: pretrained.Pretrained | None) -> Model:
    """The optimizer (freezing or PEFT), the trainer and the state: random init, then the pretrained weights put
    onto the same shardings. With PEFT the frozen parameters are held out of the gradient."""
    model, objective = finetuner.build_model(), finetuner.objective
    rows = train_data.batch(np.arange(1))
    example = {k: v[:1] for k, v in objective.model_inputs(rows).items()}
    abstract_params = train_state.unbox(jax.eval_shape(
        lambda: model.init(jax.random.key(0), **example, deterministic=True)["params"]))
    fresh = finetuner.merge_pretrained(abstract_params, init)[1] if init is not None else []  # names only: shapes
    tx, schedule, unfreeze_at, peft_mask = make_optimizer(config, abstract_params, train_data.steps_per_epoch,
                                                          finetuner, fresh)
    trainer = setup.build_trainer(
        config, model=model, objective=objective, example_rows=rows, tx=tx, schedule=schedule,
        init_rng=jax.random.key(config.seed), dropout_rng=jax.random.key(config.seed + 1),
        mesh=partitioning.create_mesh(config.mesh_shape),
        wrap_apply=None if peft_mask is None else lambda apply: parameter_efficient.hold_frozen(apply, peft_mask))
    state = trainer.init_state()
    if init is not None:
        params, fresh = parameter_efficient.settle_pretrained(config, *finetuner.merge_pretrained(state.params, init))
        state = state.replace(params=jax.device_put(params, trainer.shardings.params))
        print(f"Weights from {init.source}" + (f"; freshly initialised: {', '.join(fresh)}" if fresh else ""))
    base = parameter_efficient.base_reference(config, init.params, init.source) if peft_mask is not None else None
    return Model(trainer, state, unfreeze_at, peft_mask, base)


# ---------------------------------------------------------------------------------------------
# The loop.
# ---------------------------------------------------------------------------------------------
def finetune(config: ml_collections.ConfigDict, workdir: str, model_flags: Mapping[str, Any] | None = None) -> dict:
    """Fine-tunes and evaluates; returns the contents of DIR/results.json. model_flags: pretrained.resolve_config's."""
    started = time.perf_counter()
    validation.check_ranges(config)  # before reading the init checkpoint; all of it once the init is merged
    with workdirs.prepared(workdir) as workdir:  # a start refused below leaves no workdir it created
        results_path = os.path.join(workdir, "results.json")
        if storage.exists(results_path):
            print(f"Nothing to do: {results_path} exists (use a new --workdir to train again)")
            return json.loads(storage.read_text(results_path))
        # From here a SIGTERM stops the set-up at once (nothing to save yet); from the first step on it saves first.
        with preemption.Watcher(setting_up=os.path.join(workdir, "resume")) as watcher:
            return _finetune(*pretrained.resolve_config(config, model_flags), workdir, watcher, started)


def _finetune(config: ml_collections.ConfigDict, init: pretrained.Pretrained | None, workdir: str,
              watcher: preemption.Watcher, started: float) -> dict:
    """finetune's set-up, epochs and results, inside its preemption watcher."""
    results_path = os.path.join(workdir, "results.json")
    task, finetuner = task_and_finetuner(config)
    (train_data, examples), held_out = load_training(config, finetuner)
    if task_teacher.enabled(config):  # the teacher's logits as a field of the training batches
        task_teacher.attach(config, finetuner, train_data, examples)
    windows = f" in {len(train_data)} windows" if len(train_data) != len(examples) else ""  # QA's long contexts
    held = f" ({len(held_out[1])} more held out to select the best epoch on)" if held_out else ""
    print(f"Task {task.name}: {len(examples)} training examples{windows}{held}, {train_data.steps_per_epoch} steps/"
          f"epoch x {config.num_epochs} epochs")
    built = build(config, finetuner, train_data, init)
    mesh = built.trainer.mesh
    trainable = freezing.trainable_fraction(built.state.params, built.unfreeze_at, 0)
    print(f"Model: {train_state.count_params(built.state.params):,} parameters, {trainable:.2%} trainable at step 0 "
          f"(freezing: {config.freezing.strategy}, peft: {config.peft.method}); mesh {dict(mesh.shape)}; "
          f"workdir {storage.absolute(workdir)}")
    jit_predict = jax.jit(finetuner.predict_fn(built.trainer.model),
                          in_shardings=(built.trainer.shardings.params, partitioning.batch_sharding(mesh)))
    with workdir_lock.hold(workdir):  # one writer per workdir, until results.json is written
        run = _Epochs(config, workdir, task, finetuner, train_data, built, jit_predict, held_out)  # resumable
        state, train_time = run.train(run.resume_or_start(built.state), watcher)
        best = run.position.best
        results = {"task": task.name, "main_metric": task.main_metric, "best_epoch": best.epoch,
                   "best_score": best.score, "selected_on": VALIDATION if held_out else "dev",
                   "metrics": {**best.dev, **({VALIDATION: best.validation} if held_out else {}),
                               **_score_best(config, task, finetuner, run, state, jit_predict)},
                   "epochs": run.position.epochs, "wall_time_sec": time.perf_counter() - started,
                   "train_time_sec": train_time, "seed": config.seed, "learning_rate": config.optimizer.learning_rate,
                   "freezing": config.freezing.strategy, "peft": config.peft.method,
                   "parameters": train_state.count_params(state.params),
                   "trainable_parameters": freezing.trainable_count(state.params, built.unfreeze_at, 0),
                   "init": init.source if init else "random", "train_examples": len(train_data)}
        if distributed.is_primary():  # one writer: processes racing on a shared disk would lose the rename
            workdirs.write_json_atomic(results_path, results)  # results.json marks a finished run: never half-written
            storage.rmtree(run.resume.directory, ignore_errors=True)  # a finished run is never resumed
    return results


def task_and_finetuner(config) -> tuple:
    """The task of config.task and the finetuner that fine-tunes a model on it (config.data gains what the task read
    from its data, a tag set, so config.json keeps it); the whole config is validated here."""
    task = task_registry.task_for_config(config)
    config.data.update(task.settings)
    validation.validate(config)
    tokenizer = tokenizers.from_config(config.tokenizer)
    if tokenizer.vocab_size > config.model.vocab_size:
        raise ConfigError(f"the tokenizer has {tokenizer.vocab_size} ids but the model's vocabulary "
                          f"has {config.model.vocab_size}; use the tokenizer the checkpoint was trained with")
    finetuner = registry.for_config(config, task, tokenizer)
    finetuner.check()
    return task, finetuner


def _score_best(config, task, finetuner, run: "_Epochs", state, jit_predict) -> dict:
    """The best epoch's checkpoint scored again on dev, and on the labelled test splits (CoNLL); its dev and
    test predictions written."""
    best_params, _ = checkpoints.restore_params(os.path.join(run.workdir, "checkpoints"))
    if run.model.peft_base is not None:  # the trained part over the base, which the run never changed
        best_params = parameter_efficient.overlay(state.params, best_params)
    params = jax.device_put(best_params, run.model.trainer.shardings.params)
    splits = list(task.dev_splits) + (list(task.test_splits) if config.write_test_predictions else [])
    with run.mesh:
        return score_splits(config, finetuner, jit_predict, params, run.mesh, splits, run.workdir)


class _Epochs:
    """The epochs of one run: steps, one-sync-per-log metrics, resume saves, dev after each epoch, the best epoch's
    checkpoint; `position` is what DIR/resume keeps."""

    def __init__(self, config, workdir: str, task, finetuner, train_data, model: Model, jit_predict,
                 validation_data: tuple | None = None):
        self.config, self.workdir, self.task, self.family = config, workdir, task, finetuner
        self.train_data, self.model, self.jit_predict = train_data, model, jit_predict
        self.mesh, self.jit_train = model.trainer.mesh, model.trainer.train_step
        self.dev_data = {s: load_split(config, finetuner, s, config.eval_batch_size) for s in task.dev_splits}
        self.validation_data = validation_data  # (batches, examples) held out of train to select on, or None
        self.ckpt = checkpoints.Checkpointer(os.path.join(workdir, "checkpoints"), save_every=0, keep=1)
        self.resume = checkpoints.Checkpointer(os.path.join(workdir, "resume"), save_every=config.checkpoint_every,
                                               keep=1)
        held = {"validation_examples": len(validation_data[1])} if validation_data else {}  # older runs: absent
        self.position = Position(order={"seed": config.seed, "batch_size": config.batch_size,
                                        "train_examples": len(train_data), "num_epochs": config.num_epochs, **held})
        self.profiler = profiling.StepProfiler(config.get("profile_steps", ""), workdir,
                                               config.get("profile_all_processes", False))

    def resume_or_start(self, state):
        """The state to train from: DIR/resume's where there is one. Then config.json and the metric writer."""
        if self.resume.latest_step() is not None:
            state, self.position = restore_position(self.resume, self.ckpt, state, self.model.trainer.shardings,
                                                    self.position.order, self.workdir, self.config)
        if distributed.is_primary():
            workdirs.save_config(self.workdir, self.config)  # validated, and fits the state it resumes
        # A state saved at an epoch's end before the epoch's evaluation (the save is asynchronous) evaluates again:
        # the killed run's best-epoch save and evaluation records at that step go too, not only those past it.
        evaluated = not self.position.step or any(e["step"] == self.position.step for e in self.position.epochs)
        self.ckpt.discard_after(self.position.step - (0 if evaluated else 1))  # a killed run's best-epoch saves
        self.writer = MetricWriter(self.workdir, resume_step=self.position.step, config=self.config,
                                   evaluated=evaluated)
        return state

    def train(self, state, watcher: preemption.Watcher):
        """Every epoch not done; -> (state, train seconds). Preemption: DIR/resume saved, preemption.Preempted."""
        train_started, preempted = time.perf_counter(), None
        with contextlib.ExitStack() as stack:  # unwinds in reverse: Orbax's saves complete, then the writer
            stack.callback(self.writer.close)
            self.ckpt.close_when_unwound(stack)
            self.resume.close_when_unwound(stack)
            stack.callback(self.profiler.stop)  # a run stopped inside the range keeps the trace of the steps it ran
            with self.mesh, watcher.steps():
                for epoch in range(self.position.epoch, self.config.num_epochs):
                    state, preempted = self.train_epoch(state, epoch, watcher)
                    if preempted is not None:
                        break
                    self.evaluate_epoch(state, epoch)
            train_time = time.perf_counter() - train_started
        if preempted is not None:
            raise preemption.Preempted(preempted, self.resume.directory)
        return state, train_time

    def train_epoch(self, state, epoch: int, watcher):
        """One epoch's steps from where the position says; -> (state, the step of a preemption stop or None).
        Device metrics are fetched once per log and before every save (`window`: those not fetched yet)."""
        config, position, steps_per_epoch = self.config, self.position, self.train_data.steps_per_epoch
        position.start_epoch(epoch)
        chunks, window = self.train_data.epoch_order(config.seed, epoch), []
        bar = tqdm(prefetch(lambda i: self.train_data.batch(chunks[i]), range(position.index, len(chunks)),
                            config.prefetch),
                   total=len(chunks), initial=position.index, desc=f"epoch {epoch + 1}/{config.num_epochs}",
                   unit="step", dynamic_ncols=True, mininterval=1.0, disable=not distributed.is_primary())
        for index, host_batch in bar:
            batch = partitioning.shard_batch(micro_batches(host_batch, config.grad_accum_steps), self.mesh,
                                             batch_dim=1, global_batch=True)
            position.step += 1
            with self.profiler.step(position.step) as outputs:
                state, metrics = self.jit_train(state, batch, self.model.trainer.dropout_rng)
                outputs.append(metrics)
            window.append(metrics)
            stop = watcher.should_stop(position.step)  # SIGTERM, SIGINT, JAX's preemption notice
            save = stop or (config.checkpoint_every > 0 and position.step % config.checkpoint_every == 0)
            logs = position.step % config.log_every == 0 or position.step % steps_per_epoch == 0
            if logs or save:
                self.fetch(window)
                window = []
            if logs:
                record = self.log()
                bar.set_postfix(loss=f"{record.get('loss', float('nan')):.3f}")
            if save:
                guards.check_params_finite(position.step, state.params)
                position.index = index + 1
                self.writer.flush()  # the steps this state holds are logged before it can be complete
                self.resume.save(position.step, state, position.to_json(), force=True)
            if stop:
                self.resume.wait()  # complete on disk before the exit status says so
                return state, position.step
        return state, None

    def fetch(self, window: list) -> None:
        """The device metrics of the steps in `window` (which end at position.step), checked: a non-finite update
        stops the run here (guards) or, when skipped, is counted and kept out of the means."""
        position = self.position
        for offset, m in enumerate(jax.device_get(window)):
            m = {k: float(v) for k, v in m.items()}
            if guards.check_finite(position.step - len(window) + 1 + offset, m, self.config.skip_nonfinite_updates):
                position.skipped += 1
                m = {"skipped": 1.0}
            else:
                position.losses.append(m["loss"])
            position.fetched.append(m)

    def log(self) -> dict:
        """One metrics.jsonl record: the means over the window's applied updates, and the skipped ones."""
        fetched, self.position.fetched = self.position.fetched, []
        applied = [m for m in fetched if "skipped" not in m]
        record = {k: float(np.mean([m[k] for m in applied])) for k in (applied[0] if applied else {})
                  if k not in ("examples", "nonfinite")}
        if self.config.skip_nonfinite_updates:
            record.update(skipped_updates=len(fetched) - len(applied), skipped_updates_total=self.position.skipped)
        self.writer.write(self.position.step, record)
        return record

    def evaluate_epoch(self, state, epoch: int) -> None:
        """Dev (and the held-out validation split's) metrics after an epoch; the best epoch so far by
        scoring.selection_score is saved (parameters only; with PEFT, the trained ones: the whole state for resuming
        lives in DIR/resume)."""
        if (epoch + 1) % self.config.get("eval_every_epochs", 1) and epoch + 1 < self.config.num_epochs:
            return  # dev is scored after every eval_every_epochs-th epoch (from 1) and after the last
        position = self.position
        dev = {s: self.score(state, *loaded) for s, loaded in self.dev_data.items()}
        validation = self.score(state, *self.validation_data) if self.validation_data else None
        shown = {**dev, **({VALIDATION: validation} if validation else {})}
        for split, values in shown.items():
            self.writer.write(position.step, values, prefix=f"eval_{split}")
        position.epochs.append({"epoch": epoch + 1, "step": position.step,
                                "train_loss": float(np.mean(position.losses)) if position.losses else None, "dev": dev,
                                **({VALIDATION: validation} if validation else {})})
        print(f"epoch {epoch + 1}: " + "; ".join(f"{s} " + ", ".join(f"{k}={v:.4f}" for k, v in m.items())
                                                 for s, m in shown.items()))
        score = selection_score(self.task, dev, validation)
        if position.best is None or score > position.best.score:
            self.keep(state, BestEpoch(epoch + 1, score, dev, validation))

    def score(self, state, data, examples) -> dict[str, float]:
        """The task's metrics of `state` on one labelled split's batches."""
        predictions = predict(self.jit_predict, self.family, state.params, data, self.mesh, examples)
        return self.task.score(self.family, predictions, examples)

    def keep(self, state, best: BestEpoch) -> None:
        """The new best epoch's parameters, as the one checkpoint the run keeps."""
        position = self.position
        guards.check_params_finite(position.step, state.params)
        position.best = best
        base = self.model.peft_base
        params = state.params if base is None else parameter_efficient.stored_part(state.params, self.model.peft_mask)
        self.ckpt.save(position.step, {"params": params}, {"epoch": best.epoch, self.task.main_metric: best.score,
                                                           **({"peft_base": base} if base else {})}, force=True)
