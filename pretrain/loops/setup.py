"""The one trainer set-up: a model and its objective -> the sharded state and the jitted steps.

Every program that trains or measures a step builds it here: the pretraining loop, the fine-tuning loop,
ahead-of-time compilation (pretrain/loops/aot.py) and the benchmark and profile scripts, so a benchmark
times the step a run takes. The example the state is initialised from comes from the objective at the
config's shapes (`example_rows`), never from the data pipeline: a set-up needs no corpus.

    trainer = pretraining_trainer(config, objective)          # or build_trainer(...) for fine-tuning
    state = trainer.init_state()                              # or restore into trainer.abstract_state
    state, metrics = trainer.train_step(state, batch, trainer.dropout_rng)   # batch [accum, B / accum, ...]
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import Mesh

import models
import objectives
from objectives.interface import StepObjective
from pretrain.loops import budget
from pretrain.loops.steps import eval_step, shard_map_train_step, train_step
from pretrain.runtime import partitioning
from pretrain.runtime.errors import ConfigError
from pretrain.training import freezing, optimizers, prng, train_state


@dataclasses.dataclass(frozen=True)
class Trainer:
    """What a loop or a measurement needs to take steps; the state itself is made (or restored) by the caller."""

    mesh: Mesh
    model: nn.Module
    objective: StepObjective
    tx: optax.GradientTransformation
    schedule: optax.Schedule
    example_rows: dict[str, np.ndarray]      # [n, ...] rows of the objective's batches
    initialize: Callable[[], train_state.TrainState]  # jitted: the fresh state, placed on `shardings`
    shardings: train_state.TrainState
    abstract_state: train_state.TrainState   # unboxed shapes and dtypes, for a restore or a compile
    train_step: Callable                     # jitted (state, batch [accum, B / accum, ...], rng) -> (state, metrics)
    eval_step: Callable                      # jitted (state, batch [B, ...]) -> metrics
    dropout_rng: jax.Array

    def init_state(self) -> train_state.TrainState:
        """The fresh state on the mesh (with the apply_fn of `shardings`: PEFT's wrapper where there is one)."""
        with self.mesh:
            state = self.initialize()
        return state.replace(apply_fn=self.shardings.apply_fn)


def build_trainer(config: ml_collections.ConfigDict, *, model: nn.Module, objective: StepObjective,
                  example_rows: dict[str, np.ndarray], tx: optax.GradientTransformation, schedule: optax.Schedule,
                  init_rng: jax.Array, dropout_rng: jax.Array, mesh: Mesh,
                  wrap_apply: Callable[[Callable], Callable] | None = None) -> Trainer:
    """The sharded initializer of `model` (initialised from the first of `example_rows`) and the jitted steps of
    `objective`; config.mesh_mode picks the jit step (XLA partitions it) or the per-device shard_map step.
    `wrap_apply` replaces the state's apply_fn (PEFT holds the frozen parameters out of the gradient)."""
    example = {k: jnp.asarray(v[:1]) if hasattr(v, "shape") else v  # [1, ...]; a static option as it is
               for k, v in objective.model_inputs(example_rows).items()}
    initialize, shardings, abstract_state = train_state.init_sharded(model, example, init_rng, tx, mesh)
    if wrap_apply is not None:  # the shardings' tree carries the same static apply_fn
        apply_fn = wrap_apply(abstract_state.apply_fn)
        shardings, abstract_state = shardings.replace(apply_fn=apply_fn), abstract_state.replace(apply_fn=apply_fn)
    step_fn = (functools.partial(shard_map_train_step, mesh=mesh) if config.get("mesh_mode") == "shard_map"
               else train_step)
    jit_train = train_state.jit_train_step(functools.partial(step_fn, objective=objective, schedule=schedule,
                                                             skip_nonfinite=config.skip_nonfinite_updates),
                                           shardings, mesh)
    jit_eval = jax.jit(functools.partial(eval_step, objective=objective),
                       in_shardings=(shardings, partitioning.batch_sharding(mesh)),
                       out_shardings=partitioning.replicated(mesh))
    return Trainer(mesh, model, objective, tx, schedule, example_rows, initialize, shardings, abstract_state,
                   jit_train, jit_eval, dropout_rng)


def pretraining_trainer(config: ml_collections.ConfigDict, objective: objectives.Objective | None = None,
                        devices: Sequence | None = None, plan: budget.StepPlan | None = None) -> Trainer:
    """The trainer of a pretraining config (model and optimizer by name) on a mesh of `devices` (default: this
    host's), shaped config.mesh_shape. `objective`: the one the data is made with; by default the config's,
    over a StandInTokenizer (ahead-of-time compilation, benchmarks: no tokenizer file is read). `plan`: the steps
    the schedule spans (a budget's, pretrain/loops/budget.py); by default the config's."""
    objective = objective or objectives.build_objective(config.objective, StandInTokenizer.of(config))
    plan = plan or budget.StepPlan.of(config)
    # config.optimizer.learning_rate's path to optax: this call, then pretrain/training/optimizers.py.
    schedule = optimizers.learning_rate_schedule(config.optimizer, plan.num_train_steps, plan.warmup_steps)
    init_rng, dropout_rng = jax.random.split(jax.random.key(config.seed))
    mesh = partitioning.create_mesh(config.mesh_shape, devices)
    dropout_rng = prng.dropout_key(dropout_rng, config.get("prng_impl", "auto"), mesh.devices.flat[0].platform)
    return build_trainer(config, model=models.build_model(config.model), objective=objective,
                         example_rows=example_rows(config, objective),
                         tx=freezing.without_subtrees(  # a distillation teacher (models/families.py: frozen)
                             optimizers.make_optimizer(config.optimizer, plan.num_train_steps, schedule=schedule),
                             models.family(config.model.name).frozen),
                         schedule=schedule, init_rng=init_rng, dropout_rng=dropout_rng,
                         mesh=mesh)


class StandInTokenizer:
    """What the objectives read of a tokenizer (ids of the specials, sentinels, the masking tables), for a
    vocabulary of `vocab_size` ids with `extra_ids` sentinels at the end: enough to build real batches."""

    pad_id, unk_id, cls_id, sep_id, mask_id, eos_id = 0, 1, 2, 3, 4, 3

    def __init__(self, vocab_size: int, extra_ids: int = 0):
        self.vocab_size, self.num_extra_ids = vocab_size, extra_ids
        self.special_ids = tuple(range(5)) + tuple(range(vocab_size - extra_ids, vocab_size))
        self.word_start = np.ones(vocab_size, bool)

    def sentinel_id(self, i: int) -> int:
        return self.vocab_size - 1 - i

    @classmethod
    def of(cls, config: ml_collections.ConfigDict) -> "StandInTokenizer":
        """The stand-in for config's vocabulary (config.model.vocab_size, config.tokenizer.extra_ids)."""
        return cls(config.model.vocab_size, config.tokenizer.get("extra_ids", 0))


def example_rows(config: ml_collections.ConfigDict, objective) -> dict[str, np.ndarray]:
    """A few rows of the batch the objective makes at config.data.max_seq_length, [n, ...] each, from
    random-token documents (16 sentences of L/4 tokens: NSP pairs, T5's 568-token chunks, GPT windows)."""
    rng = np.random.default_rng(0)
    length = config.data.max_seq_length
    high = max(6, min(1000, config.model.vocab_size - config.tokenizer.get("extra_ids", 0)))
    documents = [[rng.integers(5, high, max(8, length // 4)).astype(np.int32) for _ in range(16)] for _ in range(4)]
    rows = objective.make_batch(objective.create_instances(documents, rng, length), rng)
    if not len(next(iter(rows.values()))):
        raise ConfigError(f"the objective made no rows of length {length} from the synthetic documents")
    return rows
