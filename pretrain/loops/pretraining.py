"""The training loop, the same for every model family and objective.

`train_and_evaluate(config, workdir)` reads top to bottom: data, model, sharded state (fresh or
restored), the jitted step, then the loop that logs, evaluates and checkpoints. The model and the
objective come from the config by name; nothing here knows whether it trains BERT, T5 or GPT.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import jax
import ml_collections
import numpy as np
from tqdm import tqdm

import models
import objectives
from pretrain.data import documents, hub, prefetch, statistics, streaming, tokenizers
from pretrain.data import streamed as streamed_data
from pretrain.distillation import teacher as distillation
from pretrain.loops import budget, setup
from pretrain.loops.steps import micro_batches
from pretrain.runtime import distributed, partitioning, profiling
from pretrain.runtime.errors import ConfigError, UserError
from pretrain.training import config_warnings, guards, pretrained, train_state, validation
from pretrain.workdir import checkpoints, preemption, storage
from pretrain.workdir import lock as workdir_lock
from pretrain.workdir import run_files as workdirs
from pretrain.workdir.metric_writers import MetricWriter


def _check_tokenizer(config: ml_collections.ConfigDict, tokenizer: tokenizers.Tokenizer) -> None:
    if tokenizer.vocab_size > config.model.vocab_size:
        raise ConfigError(f"the tokenizer has {tokenizer.vocab_size} ids but config.model.vocab_size="
                          f"{config.model.vocab_size}; set --config.model.vocab_size={tokenizer.vocab_size}")


def training_data(config: ml_collections.ConfigDict
                  ) -> tuple[objectives.Objective, streaming.StreamingData, streaming.StreamingData | None]:
    """(objective, training batches, held-out batches or None) of `config`: the stream the loop trains on, also
    for a caller that must feed another implementation the same batches (scripts/bench/bench_cram.py)."""
    objective, train_data, held_out = data_streams(config)
    return objective, train_data, held_out.get("eval")


def data_streams(config: ml_collections.ConfigDict, extra_held_out: Mapping[str, Sequence] | None = None,
                 plan: budget.StepPlan | None = None
                 ) -> tuple[objectives.Objective, streaming.StreamingData, dict[str, streaming.StreamingData]]:
    """(objective, training batches, {metric prefix: held-out batches}): the corpus's own held-out documents as
    'eval' where it has some, then `extra_held_out`'s ({prefix: tokenized documents} of another text: pretrain.adapt
    measures on the init's own corpus how much continued pretraining forgets), each batched as 'eval' is. `plan`: the
    run's steps (when the long sequences start); by default the config's."""
    plan = plan or budget.StepPlan.of(config)
    tokenizer = tokenizers.from_config(config.tokenizer)
    _check_tokenizer(config, tokenizer)
    objective = objectives.build_objective(config.objective, tokenizer)
    train_docs, eval_docs = documents.load_documents(config.data, tokenizer)
    streamed = isinstance(train_docs, hub.StreamedCorpus)  # read as it streams: nothing to count beforehand
    if not streamed:
        statistics.report(statistics.of_corpus(train_docs, tokenizer), config, plan.num_train_steps,
                          plan.long_seq_start_step)
    data_kw = dict(objective=objective, max_seq_length=config.data.max_seq_length,
                   long_seq_length=config.data.get("long_seq_length", 0),
                   long_seq_start_step=plan.long_seq_start_step)
    data_kw.update(batch_size=config.batch_size, window_documents=config.data.window_documents,
                   streams=config.data.streams, process_index=jax.process_index(), process_count=jax.process_count())
    reader = streamed_data.StreamedData if streamed else streaming.StreamingData
    train_data = reader(train_docs, seed=config.seed, workers=config.data.workers, **data_kw)
    # The held-out batches use the training data's stream count (auto counts by corpus size), also after a resume
    # adopts a checkpoint's (_restore_or_init): the eval curve goes on with the batches it started with.
    data_kw["streams"] = train_data.streams
    data_kw["objective"] = held_out_objective(config.objective, tokenizer) or objective
    held_out = {}
    for prefix, docs in {"eval": eval_docs, **(extra_held_out or {})}.items():
        if len(docs):
            held_out[prefix] = streaming.StreamingData(docs, seed=config.seed + 1, **data_kw)
            held_out[prefix].auto = train_data.auto
    return objective, train_data, held_out


def held_out_objective(config: ml_collections.ConfigDict, tokenizer) -> objectives.Objective | None:
    """The held-out batches' objective where `eval_mask_prob` sets a masking rate of its own (None: the training
    objective's). Arms that train at 15%, 30% or 40% masking are then scored on the same task: the held-out MLM loss
    at one rate (docs/cram.md compares recipes at 15%). The masked positions per row stay the training's."""
    rate = config.get("eval_mask_prob", 0.0)
    if not rate or rate == config.mask_prob:
        return None
    held_out = ml_collections.ConfigDict(config.to_dict())
    held_out.mask_prob = rate
    return objectives.build_objective(held_out, tokenizer)


# ---------------------------------------------------------------------------------------------
# Set-up: the state, fresh or restored.
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Start:
    """Where the steps start: the state, the step it is at, the data position to resume from (None: the start)."""

    state: train_state.TrainState
    step: int = 0
    data_position: dict | None = None


def load_teacher(config: ml_collections.ConfigDict) -> pretrained.Pretrained | None:
    """The teacher registered for the model family (pretrain/distillation/teacher.py TEACHERS: DistilBERT's), or
    None."""
    family = config.model.name
    return distillation.TEACHERS.get(family)(config) if family in distillation.TEACHERS else None


def _restore_or_init(config, workdir: str, trainer: setup.Trainer, ckpt: checkpoints.Checkpointer,
                     train_data: streaming.StreamingData, held_out: Mapping[str, streaming.StreamingData],
                     teacher: pretrained.Pretrained | None = None, recorded: ml_collections.ConfigDict | None = None
                     ) -> Start:
    """The fresh state (a distillation run's from its teacher; with config.init, the init's weights), or the latest
    checkpoint's, whatever config.init says. A checkpoint of another run is refused before it is read: its
    config.json against `recorded` (the config with the run's plan, by default `config`)."""
    if ckpt.latest_step() is None:
        state = trainer.init_state()
        if teacher is not None:
            state = distillation.initialise(state, teacher, config.model.num_layers, trainer.shardings,
                                            copy_student=trainer.model.config.copies_teacher)
        if config.get("init"):
            state = _from_init(config, state, trainer.shardings)
        return Start(state)
    workdirs.check_resume(workdir, recorded or config)  # before reading the checkpoint: name what differs
    abstract_state = checkpoints.abstract_with_shardings(trainer.abstract_state, trainer.shardings)
    state, data_position, step = ckpt.restore(abstract_state)
    # data.streams=0 takes the checkpoint's stream count (any process count that divides it resumes); the
    # held-out data follows (data_streams).
    train_data.resume_from(data_position)
    for data in held_out.values():
        data.adopt_streams(train_data.streams)
    print(f"Resumed from {ckpt.directory}/{step}")
    return Start(state, step, data_position)


def _from_init(config, state: train_state.TrainState, shardings: train_state.TrainState) -> train_state.TrainState:
    """The fresh state with config.init's weights (a pretrain.train workdir or a Hugging Face directory), pretraining
    heads included; the optimizer state stays fresh. A weight of the model the init lacks is a one-line error naming
    them, except the family's optional ones (models/families.py ModelFamily.optional_params), which start fresh."""
    family = models.family(config.model.name)
    init = pretrained.load_pretrained(config.init, "--config.init", heads=True)
    if init.family != (family.finetunes_as or family.name):
        raise UserError(f"--config.init={config.init} holds a {init.family} model but the config pretrains "
                        f"{config.model.name}: give a checkpoint of this model family")
    # load_pretrained(heads=True) gives the tree above the family's fine-tuned subtree: the whole model, but for a
    # distillation student ('student'; its teacher comes from its own checkpoint, above)
    parent = family.params_subtree.split("/")[:-1] if family.params_subtree else []
    weights = init.params
    for key in reversed(parent):
        weights = {key: weights}
    params, fresh = pretrained.merge_params(state.params, weights, init.source)
    inside = "/".join(parent)
    fresh = [name for name in fresh if not inside or name.startswith(inside + "/")]
    optional = [name for name in fresh if any(name == p or name.startswith(p + "/") for p in family.optional_params)]
    missing = sorted({"/".join(name.split("/")[:2]) for name in fresh if name not in optional})
    if missing:
        listed = ", ".join(missing[:8]) + (f" (+{len(missing) - 8} more)" if len(missing) > 8 else "")
        raise UserError(f"--config.init={config.init} ({init.source}) lacks weights of the {config.model.name} "
                        f"pretraining model: {listed}; give a checkpoint of this architecture with its pretraining "
                        "heads (a pretrain.train workdir of the same config, or a Hugging Face *ForMaskedLM / "
                        "*LMHeadModel / *ForConditionalGeneration directory)")
    shown = sorted({"/".join(name.split("/")[:2]) for name in optional})
    print(f"Weights from {init.source}" + (f"; freshly initialised: {', '.join(shown)}" if shown else ""))
    return state.replace(params=jax.device_put(params, shardings.params))


class _Evaluator:
    """Held-out metrics: the first `config.eval_batches` held-out batches (this process's rows), built once, logged
    under `prefix` (eval: the run's own held-out text)."""

    def __init__(self, config, eval_data: streaming.StreamingData, trainer: setup.Trainer, writer: MetricWriter,
                 prefix: str = "eval"):
        self.config, self.data, self.writer, self.prefix = config, eval_data, writer, prefix
        self.jit_eval, self.mesh = trainer.eval_step, trainer.mesh
        self.batches: list[dict] = []

    def __call__(self, state, step: int) -> dict[str, float]:
        if not self.batches:
            self.batches.extend(b for _, (_, b, _) in zip(range(self.config.eval_batches), self.data.iterate(0)))
            self.data.close()
        totals: dict[str, float] = {}
        for host_batch in self.batches:
            for k, v in jax.device_get(self.jit_eval(state, partitioning.shard_batch(host_batch, self.mesh))).items():
                totals[k] = totals.get(k, 0.0) + float(v) / self.config.eval_batches
        totals.pop("tokens", None)
        self.writer.write(step, totals, prefix=self.prefix)
        return totals


def _evaluators(config, held_out: Mapping[str, streaming.StreamingData], trainer: setup.Trainer,
                writer: MetricWriter):
    """(state, step) -> evaluates every held-out text, each logged under its prefix; None without any."""
    evaluators = [_Evaluator(config, data, trainer, writer, prefix) for prefix, data in held_out.items()]
    if not evaluators:
        if config.eval_every > 0:  # known only once the corpus is read: whether its source held anything out
            config_warnings.warn_once(
                f"config.eval_every={config.eval_every} evaluates nothing: the corpus holds no text out; hold some "
                "out with --config.data.eval_documents=K (a Hub corpus: --config.data.hf_eval_split), or set "
                "--config.eval_every=0")
        return None
    return lambda state, step: {e.prefix: e(state, step) for e in evaluators}


class _MetricWindow:
    """Training metrics, fetched one step late and averaged over `log_every` steps: metrics.jsonl, TensorBoard and
    the progress bar. A non-finite update stops the run where it is fetched (guards), unless it is skipped."""

    def __init__(self, config, last_step: int, writer: MetricWriter, progress, skipped_total: int):
        self.config, self.last_step, self.writer, self.progress = config, last_step, writer, progress
        self.skipped_total = skipped_total  # over the whole run, resumes included
        self.pending: tuple[int, Any] | None = None
        self.last_logged: dict[str, float] = {}
        self.restart()

    def restart(self) -> None:
        """A new window."""
        self.sums: dict[str, float] = {}
        self.steps, self.skipped = 0, 0
        self.reset_clock()

    def reset_clock(self) -> None:
        """The window's time counts from now (after an evaluation: it stays out of the step times)."""
        self.started = time.perf_counter()

    def add(self, step: int, device_metrics) -> None:
        """The metrics of the update that makes `step`: the previous step's are fetched now."""
        self.flush()
        self.pending = (step, device_metrics)

    def flush(self) -> None:
        """Fetches the pending metrics now (before a save: a non-finite state is never saved)."""
        if self.pending is not None:
            step, device_metrics = self.pending
            self.pending = None
            self._consume(step, jax.device_get(device_metrics))

    def _consume(self, step: int, metrics: dict) -> None:
        skipped = int(guards.check_finite(step, metrics, self.config.skip_nonfinite_updates))
        self.skipped_total += skipped
        self.skipped += skipped
        for k, v in metrics.items():  # a skipped update's loss (NaN) stays out of the averages
            if k != "nonfinite" and (k == "tokens" or not skipped):
                self.sums[k] = self.sums.get(k, 0.0) + float(v)
        self.steps += 1
        self.progress.update(1)
        if step % self.config.log_every == 0 or step == self.last_step:
            self._log(step)

    def _log(self, step: int) -> None:
        elapsed = time.perf_counter() - self.started
        record = {k: v / max(self.steps - self.skipped, 1) for k, v in self.sums.items() if k != "tokens"}
        record["tokens_per_sec"] = self.sums["tokens"] / elapsed
        record["step_time_sec"] = elapsed / self.steps
        if self.config.skip_nonfinite_updates:
            record["skipped_updates"], record["skipped_updates_total"] = self.skipped, self.skipped_total
        self.writer.write(step, record)
        self.progress.set_postfix(loss=f"{record.get('loss', float('nan')):.3f}",
                                  tok_s=f"{record['tokens_per_sec']:.0f}")
        self.last_logged = record
        self.restart()


# ---------------------------------------------------------------------------------------------
# The loop.
# ---------------------------------------------------------------------------------------------
def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, deadline: float | None = None,
                       extra_held_out: Mapping[str, Sequence] | None = None) -> dict[str, float]:
    """Trains (or resumes) until config.num_train_steps (with config.budget_minutes, the steps that fit the budget:
    pretrain/loops/budget.py); returns the last logged metrics. At `deadline` (seconds since the epoch) or the
    budget's it saves and stops as on preemption (preemption.Preempted, its reason the time budget). A fresh run
    with config.init starts from the init's weights and evaluates them at step 0. `extra_held_out`: {metric prefix:
    tokenized documents} evaluated beside the corpus's own held-out text (data_streams).

    Nothing in `workdir` is written before the config, the data and (on resume) the checkpoint passed their
    checks: a rejected command leaves the workdir as it was.
    """
    validation.validate(config)
    with workdirs.prepared(workdir) as workdir:  # a start refused below leaves no workdir it created
        plan, budget_deadline = budget.fit(config, workdir, train_and_evaluate)  # the steps: pretrain/loops/budget.py
        deadline = min(filter(None, (deadline, budget_deadline)), default=None)
        # From here a SIGTERM stops the set-up at once (nothing to save yet); from the first step on it saves first.
        with preemption.Watcher(deadline=deadline, setting_up=os.path.join(workdir, "checkpoints")) as watcher:
            return _train(config, plan, workdir, watcher, extra_held_out)


def _train(config: ml_collections.ConfigDict, plan: budget.StepPlan, workdir: str, watcher: preemption.Watcher,
           extra_held_out: Mapping[str, Sequence] | None = None) -> dict[str, float]:
    """train_and_evaluate's set-up and steps over `plan`'s steps, inside its preemption watcher. WORKDIR/config.json
    records the config with the plan's counts (plan.record): what a resumed run is compared with."""
    teacher = load_teacher(config)  # before the tokenizer: it may be the teacher's
    objective, train_data, held_out = data_streams(config, extra_held_out, plan)
    trainer = setup.pretraining_trainer(config, objective, plan=plan)
    recorded = plan.record(config)
    with contextlib.ExitStack() as stack:  # unwinds in reverse: the profiler, the writers, Orbax, Grain, the lock
        stack.enter_context(workdir_lock.hold(workdir))  # one writer per workdir
        stack.callback(train_data.close)  # Grain's worker processes
        ckpt = checkpoints.Checkpointer(os.path.join(workdir, "checkpoints"), save_every=plan.checkpoint_every,
                                        keep=config.keep_checkpoints)
        ckpt.close_when_unwound(stack)
        start = _restore_or_init(config, workdir, trainer, ckpt, train_data, held_out, teacher, recorded)
        print(f"Model {config.model.name}: {train_state.count_params(start.state.params):,} parameters; "
              f"mesh {dict(trainer.mesh.shape)}; workdir {storage.absolute(workdir)}")
        if start.step >= plan.num_train_steps:
            ckpt.finish_rotation()
            print(f"Nothing to do: the checkpoint at step {start.step} already reaches "
                  f"config.num_train_steps={plan.num_train_steps} (raise it to train further)")
            return {}
        if distributed.is_primary():
            workdirs.save_config(workdir, recorded)  # validated, and fits the checkpoint it resumes
        writer = stack.enter_context(contextlib.closing(MetricWriter(workdir, resume_step=start.step, config=recorded)))
        progress = stack.enter_context(tqdm(total=plan.num_train_steps, initial=start.step, desc="train",
                                            unit="step", dynamic_ncols=True, mininterval=1.0,
                                            disable=not distributed.is_primary()))
        metrics = _MetricWindow(config, plan.num_train_steps, writer, progress,
                                (start.data_position or {}).get("skipped_updates_total", 0))
        evaluate = _evaluators(config, held_out, trainer, writer)
        profiler = profiling.StepProfiler(config.get("profile_steps", ""), workdir,
                                          config.get("profile_all_processes", False))
        stack.callback(profiler.stop)  # a run stopped inside the range keeps the trace of the steps it ran
        with trainer.mesh, watcher.steps():
            stopped = _run_steps(config, plan, trainer, start, train_data, ckpt, metrics, evaluate, watcher, profiler)
    if stopped is not None:
        raise preemption.Preempted(stopped[0], ckpt.directory, stopped[1])
    return metrics.last_logged


def _run_steps(config, plan: budget.StepPlan, trainer: setup.Trainer, start: Start, train_data: streaming.StreamingData,
               ckpt: checkpoints.Checkpointer, metrics: _MetricWindow, evaluate: Callable | None,
               watcher: preemption.Watcher, profiler: profiling.StepProfiler) -> tuple[int, str] | None:
    """The steps from `start` on: train, log one step late, save, evaluate; -> (step, reason) of a stop
    (preemption, time budget), or None at the plan's last step."""
    last_step, state, mesh = plan.num_train_steps, start.state, trainer.mesh
    if evaluate is not None and start.step == 0 and config.get("init"):
        evaluate(state, 0)  # the init's own held-out numbers: where a continued pretraining's curves start
        metrics.reset_clock()
    batches = ((s, micro_batches(rows, config.grad_accum_steps), windows)  # windows: stream positions after s
               for s, (_, rows, windows) in zip(range(start.step, last_step),
                                                train_data.iterate(start.step, start.data_position)))
    for step, host_batch, windows in prefetch.prefetch_iterator(batches, config.prefetch):
        done = step + 1
        with profiler.step(done) as outputs:
            state, device_metrics = trainer.train_step(state, partitioning.shard_batch(host_batch, mesh, batch_dim=1),
                                                       trainer.dropout_rng)
            outputs.append(device_metrics)
        metrics.add(done, device_metrics)
        stop = done < last_step and watcher.should_stop(done)  # SIGTERM, SIGINT, JAX's notice, the deadline
        if not stop and evaluate is not None and ((plan.eval_every and done % plan.eval_every == 0)
                                                  or done == last_step):
            # before the save: a run killed once its checkpoint is complete has logged this step's evaluation
            # (its rerun, resumed from there, does not evaluate again)
            metrics.flush()
            evaluated = time.time()
            evaluate(state, done)
            watcher.extend_deadline(time.time() - evaluated)  # evaluation spends none of a time budget
            metrics.reset_clock()  # keep evaluation out of the step times
        if stop or ckpt.should_save(done, last_step):
            metrics.flush()
            metrics.writer.flush()  # the steps this checkpoint holds are logged before it can be complete
            guards.check_params_finite(done, state.params)
            position = train_data.position(done, _gather_windows(windows))
            ckpt.save(done, state, {**position, "skipped_updates_total": metrics.skipped_total}, force=stop)
        if stop:
            if evaluate is not None and watcher.past_deadline() and not watcher.requested:
                evaluate(state, done)  # a run ended by its time budget is a finished run: its held-out numbers
            ckpt.wait()  # complete on disk before the exit status says so
            return done, watcher.reason
    metrics.flush()
    return None


def _gather_windows(local: list[list[int]]) -> list[list[int]]:
    """Every stream's [window, row], in stream order: this process's streams and, in a multi-process run, the
    others' (process p holds streams [p S / P, (p + 1) S / P), so process order is stream order)."""
    if jax.process_count() == 1:
        return local
    from jax.experimental import multihost_utils
    gathered = multihost_utils.process_allgather(np.asarray(local, np.int64))  # [P, S / P, 2]
    return gathered.reshape(-1, 2).tolist()
