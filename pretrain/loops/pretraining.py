"""The training loop, the same for every model family and objective.

`train_and_evaluate(config, workdir)` reads top to bottom: data, model, sharded state (fresh or
restored), the jitted step, then the loop that logs, evaluates and checkpoints. The model and the
objective come from the config by name; nothing here knows whether it trains BERT, T5 or GPT.
"""
from __future__ import annotations

import functools
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from tqdm import tqdm

import models
import objectives
from pretrain.core import (checkpoints, distributed, guards, optimizers, partitioning, preemption, storage,
                           train_state, validation)
from pretrain.core import workdir as workdirs
from pretrain.core.errors import ConfigError
from pretrain.core.metric_writers import MetricWriter
from pretrain.data import pipeline, statistics, streaming, tokenizers
from pretrain.loops.steps import eval_step, micro_batches, shard_map_train_step, train_step


def _check_tokenizer(config: ml_collections.ConfigDict, tokenizer: tokenizers.Tokenizer) -> None:
    if tokenizer.vocab_size > config.model.vocab_size:
        raise ConfigError(f"the tokenizer has {tokenizer.vocab_size} ids but config.model.vocab_size="
                          f"{config.model.vocab_size}; set --config.model.vocab_size={tokenizer.vocab_size}")


def training_data(config: ml_collections.ConfigDict
                  ) -> tuple[objectives.Objective, streaming.StreamingData, streaming.StreamingData | None]:
    """(objective, training batches, held-out batches or None) of `config`: the stream the loop trains on, also
    for a caller that must feed another implementation the same batches (scripts/bench_cram.py)."""
    tokenizer = tokenizers.from_config(config.tokenizer)
    _check_tokenizer(config, tokenizer)
    objective = objectives.build_objective(config.objective, tokenizer)
    train_docs, eval_docs = pipeline.load_documents(config.data, tokenizer)
    statistics.report(statistics.of_corpus(train_docs, tokenizer), config)
    data_kw = dict(objective=objective, max_seq_length=config.data.max_seq_length,
                   long_seq_length=config.data.get("long_seq_length", 0),
                   long_seq_start_step=config.data.get("long_seq_start_step", 0))
    data_kw.update(batch_size=config.batch_size, window_documents=config.data.window_documents,
                   streams=config.data.streams, process_index=jax.process_index(), process_count=jax.process_count())
    train_data = streaming.StreamingData(train_docs, seed=config.seed, workers=config.data.workers, **data_kw)
    eval_data = streaming.StreamingData(eval_docs, seed=config.seed + 1, **data_kw) if len(eval_docs) else None
    return objective, train_data, eval_data


# ---------------------------------------------------------------------------------------------
# The loop.
# ---------------------------------------------------------------------------------------------
def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, deadline: float | None = None
                       ) -> dict[str, float]:
    """Trains (or resumes) until config.num_train_steps; returns the last logged metrics. At `deadline` (seconds
    since the epoch) it saves and stops as on preemption (preemption.Preempted, its reason the time budget).

    Nothing in `workdir` is written before the config, the data and (on resume) the checkpoint passed their
    checks: a rejected command leaves the workdir as it was.
    """
    validation.validate(config)
    workdir = workdirs.prepare(workdir)

    # ----- Data -----
    objective, train_data, eval_data = training_data(config)

    # ----- Model and sharded state -----
    mesh = partitioning.create_mesh(config.mesh_shape)
    model = models.build_model(config.model)
    example = {k: jnp.asarray(v) for k, v in objective.model_inputs(train_data.example()).items()}
    init_rng, dropout_rng = jax.random.split(jax.random.key(config.seed))
    tx = optimizers.make_optimizer(config.optimizer, config.num_train_steps)
    ckpt = checkpoints.Checkpointer(os.path.join(workdir, "checkpoints"), save_every=config.checkpoint_every,
                                    keep=config.keep_checkpoints)
    resume = ckpt.latest_step() is not None
    if resume:
        try:
            workdirs.check_resume(workdir, config)  # before reading the checkpoint: name what differs
        except ConfigError:
            ckpt.close()
            raise
    state, state_shardings, abstract_state = train_state.init_sharded(model, example, init_rng, tx, mesh,
                                                                      materialize=not resume)
    start_step, data_position = 0, None
    if resume:
        abstract_state = checkpoints.abstract_with_shardings(abstract_state, state_shardings)
        try:
            state, data_position, start_step = ckpt.restore(abstract_state)
        except checkpoints.CheckpointError:
            ckpt.close()  # Orbax's background threads must stop before the process exits
            raise
        try:
            train_data.check_position(data_position)
        except ConfigError:
            ckpt.close()
            raise
        print(f"Resumed from {ckpt.directory}/{start_step}")
    print(f"Model {config.model.name}: {train_state.count_params(state.params):,} parameters; "
          f"mesh {dict(mesh.shape)}; workdir {storage.absolute(workdir)}")

    # ----- Jitted steps -----
    schedule = optimizers.learning_rate_schedule(config.optimizer, config.num_train_steps)
    replicated = partitioning.replicated(mesh)
    step_fn = (functools.partial(shard_map_train_step, mesh=mesh) if config.get("mesh_mode") == "shard_map"
               else train_step)
    jit_train = train_state.jit_train_step(functools.partial(step_fn, objective=objective, schedule=schedule,
                                                             skip_nonfinite=config.skip_nonfinite_updates),
                                           state_shardings, mesh)
    jit_eval = jax.jit(functools.partial(eval_step, objective=objective),
                       in_shardings=(state_shardings, partitioning.batch_sharding(mesh)),
                       out_shardings=replicated)

    eval_batches: list[dict] = []  # this process's rows of the held-out batches, built at the first evaluation

    def evaluate(step: int) -> dict[str, float]:
        if not eval_batches:
            eval_batches.extend(batch for _, (_, batch, _) in zip(range(config.eval_batches), eval_data.iterate(0)))
            eval_data.close()
        totals: dict[str, float] = {}
        for host_batch in eval_batches:
            batch = partitioning.shard_batch(host_batch, mesh)
            for k, v in jax.device_get(jit_eval(state, batch)).items():
                totals[k] = totals.get(k, 0.0) + float(v) / config.eval_batches
        totals.pop("tokens", None)
        writer.write(step, totals, prefix="eval")
        return totals

    # ----- Loop -----
    last_step = config.num_train_steps
    if start_step >= last_step:
        print(f"Nothing to do: the checkpoint at step {start_step} already reaches "
              f"config.num_train_steps={last_step} (raise it to train further)")
        ckpt.close()
        return {}
    if distributed.is_primary():
        workdirs.save_config(workdir, config)  # validated, and fits the checkpoint it resumes
    writer = MetricWriter(workdir, resume_step=start_step)
    accum = config.grad_accum_steps
    batches = ((s, micro_batches(rows, accum), windows)  # windows: this process's stream positions after s
               for s, (_, rows, windows) in zip(range(start_step, last_step),
                                                train_data.iterate(start_step, data_position)))
    progress = tqdm(total=last_step, initial=start_step, desc="train", unit="step",
                    dynamic_ncols=True, mininterval=1.0, disable=not distributed.is_primary())
    skip = config.skip_nonfinite_updates
    pending: tuple[int, Any] | None = None        # metrics are fetched one step late
    window: dict[str, float] = {}
    window_steps, window_start = 0, time.perf_counter()
    skipped_total = (data_position or {}).get("skipped_updates_total", 0)  # over the whole run, resumes included
    last_logged: dict[str, float] = {}

    def consume(step: int, device_metrics) -> None:
        """Fetches a step's metrics: a non-finite update stops the run here (guards), unless skipped."""
        nonlocal window_steps, window_start, last_logged, window, skipped_total
        metrics = jax.device_get(device_metrics)
        skipped = guards.check_finite(step, metrics, skip)
        skipped_total += skipped
        for k, v in metrics.items():  # a skipped update's loss (NaN) stays out of the averages
            if k != "nonfinite" and (k == "tokens" or not skipped):
                window[k] = window.get(k, 0.0) + float(v)
        window["skipped_updates"] = window.get("skipped_updates", 0.0) + skipped
        window_steps += 1
        progress.update(1)
        if step % config.log_every == 0 or step == last_step:
            elapsed = time.perf_counter() - window_start
            skipped_here = window.pop("skipped_updates")
            applied = max(window_steps - skipped_here, 1)
            record = {k: v / applied for k, v in window.items() if k != "tokens"}
            record["tokens_per_sec"] = window["tokens"] / elapsed
            record["step_time_sec"] = elapsed / window_steps
            if skip:
                record["skipped_updates"], record["skipped_updates_total"] = int(skipped_here), skipped_total
            writer.write(step, record)
            progress.set_postfix(loss=f"{record.get('loss', float('nan')):.3f}",
                                 tok_s=f"{record['tokens_per_sec']:.0f}")
            last_logged = record
            window, window_steps, window_start = {}, 0, time.perf_counter()

    def flush() -> None:
        """Consumes the pending metrics now (before a save: a non-finite state is never saved)."""
        nonlocal pending
        if pending is not None:
            consume(*pending)
            pending = None

    preempted = None
    try:
        with mesh, preemption.Watcher(deadline=deadline) as watcher:
            for step, host_batch, windows in pipeline.prefetch_iterator(batches, config.prefetch):
                batch = partitioning.shard_batch(host_batch, mesh, batch_dim=1)
                state, device_metrics = jit_train(state, batch, dropout_rng)
                if pending is not None:
                    consume(*pending)
                pending = (step + 1, device_metrics)  # metrics of the update that makes step + 1
                done = step + 1
                stop = done < last_step and watcher.should_stop(done)  # SIGTERM, SIGINT, JAX's notice
                if stop or ckpt.should_save(done, last_step):
                    flush()
                    guards.check_params_finite(done, state.params)
                    position = train_data.position(done, _gather_windows(windows))
                    ckpt.save(done, state, {**position, "skipped_updates_total": skipped_total}, force=stop)
                if stop:
                    if eval_data is not None and watcher.past_deadline() and not watcher.requested:
                        evaluate(done)  # a run ended by its time budget is a finished run: its held-out numbers
                    ckpt.wait()  # complete on disk before the exit status says so
                    preempted = (done, watcher.reason)
                    break
                if eval_data is not None and ((config.eval_every and done % config.eval_every == 0)
                                              or done == last_step):
                    flush()
                    evaluate(done)
                    window_start = time.perf_counter()  # keep evaluation out of the step times
            flush()
    except KeyboardInterrupt:  # a second Ctrl-C: stop now, without waiting for a save in flight
        progress.close()
        writer.close()
        raise
    except BaseException:
        progress.close()
        ckpt.close()  # saves in flight hold good states: let them complete
        writer.close()
        raise
    finally:
        train_data.close()  # Grain's worker processes
    progress.close()
    ckpt.close()
    writer.close()
    if preempted is not None:
        raise preemption.Preempted(preempted[0], ckpt.directory, preempted[1])
    return last_logged


def _gather_windows(local: list[list[int]]) -> list[list[int]]:
    """Every stream's [window, row], in stream order: this process's streams and, in a multi-process run, the
    others' (process p holds streams [p S / P, (p + 1) S / P), so process order is stream order)."""
    if jax.process_count() == 1:
        return local
    from jax.experimental import multihost_utils
    gathered = multihost_utils.process_allgather(np.asarray(local, np.int64))  # [P, S / P, 2]
    return gathered.reshape(-1, 2).tolist()
