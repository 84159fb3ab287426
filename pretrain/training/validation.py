"""Every config value checked up front, before anything is loaded, compiled or written.

`validate(config)` runs for pretrain.train and pretrain.finetune right after the flags are parsed. It
checks each key a config has against the range table below (sizes positive, probabilities in their
interval, names among the known ones); the keys of a registered thing (an optimizer, a schedule, a freezing
strategy, a tokenizer, a data source) against the ranges that thing declares (pretrain/training/config_keys.py),
its name against its registry's names; then the relations between keys, each where its owner is (the model
family's: heads dividing the width, the sequence within the positions; the objective's `check_config`; the freezing
strategy's `check`; the loop's generic keys here) and the mesh against the visible devices. Each failure is
one ConfigError naming the key, the value and what is allowed, e.g.

  config.objective.mask_prob=1.5 is invalid: it must be a probability in (0, 1) (--config.objective.mask_prob=...)

A relation that wastes a run without making it meaningless is a warning instead (config_warnings.py), printed once
when no error was found.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_collections

from models.registry import resolve
from pretrain.runtime import profiling
from pretrain.training import config_keys, config_warnings, prng
from pretrain.runtime.errors import ConfigError
from pretrain.training.config_keys import (DROPOUT, NON_NEGATIVE, NON_NEGATIVE_FLOAT, POSITIVE, POSITIVE_FLOAT,
                                           PROBABILITY, SHARE, choice, integer, number)

DTYPES = ("float32", "bfloat16", "float16")
_int, _float, _choice = integer, number, choice  # the range table's short names


# A range given as a "module:attribute" string: the names that attribute holds (a Registry or a tuple), imported on
# demand, since the tables live in their own modules.
FAMILY_NAMES, OBJECTIVE_NAMES, PEFT_NAMES = ("models.families:FAMILIES", "objectives.registry:OBJECTIVES",
                                             "models.peft.methods:PEFT_METHODS")


def _known(names: str) -> tuple[Callable[[Any], bool], str]:
    return _choice(*resolve(names))


# key -> (check, what is allowed); a key the config does not have is not checked.
RANGES: dict[str, tuple[Callable[[Any], bool], str] | str] = {
    # the loop
    "batch_size": POSITIVE, "grad_accum_steps": POSITIVE, "num_train_steps": POSITIVE, "num_epochs": POSITIVE,
    "eval_every_epochs": POSITIVE,
    "log_every": POSITIVE, "keep_checkpoints": POSITIVE, "eval_batches": POSITIVE, "eval_batch_size": POSITIVE,
    "checkpoint_every": NON_NEGATIVE, "eval_every": NON_NEGATIVE, "prefetch": NON_NEGATIVE, "seed": NON_NEGATIVE,
    "warmup_fraction": SHARE, "budget_minutes": NON_NEGATIVE_FLOAT, "budget_steps": NON_NEGATIVE,
    "z_loss": NON_NEGATIVE_FLOAT, "head_learning_rate": NON_NEGATIVE_FLOAT, "mesh_mode": _choice("jit", "shard_map"),
    "prng_impl": _choice(*prng.IMPLEMENTATIONS),
    "init": (lambda v: isinstance(v, str), "a path (a pretrain.train workdir or a Hugging Face directory) or ''"),
    # model (every family's field names)
    "model.name": FAMILY_NAMES, "model.dtype": _choice(*DTYPES), "model.param_dtype": _choice(*DTYPES),
    **{f"model.{k}": POSITIVE for k in (
        "vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size", "max_position_embeddings",
        "d_model", "d_ff", "head_dim", "num_encoder_layers", "num_decoder_layers", "n_positions",
        "relative_attention_num_buckets", "relative_attention_max_distance", "max_span_tokens",
        "global_attn_every_n_layers", "local_attention")},  # ModernBERT (models/modernbert.py)
    "model.type_vocab_size": NON_NEGATIVE,  # 0: no token-type table (DistilBERT)
    **{f"model.{k}": DROPOUT for k in ("dropout_rate", "attention_dropout_rate", "classifier_dropout",
                                       "embedding_dropout")},
    "model.layer_norm_eps": POSITIVE_FLOAT, "model.initializer_range": POSITIVE_FLOAT,
    "model.initializer_factor": POSITIVE_FLOAT, "model.attention": "models.attention:IMPLEMENTATIONS",
    "model.remat": "models.stack:REMAT_POLICIES",
    **{f"model.{k}": POSITIVE_FLOAT for k in ("norm_eps", "global_rope_theta", "local_rope_theta",
                                              "initializer_cutoff_factor")},
    "model.scan_layers": _choice(True, False), "model.fused_qkv": _choice(True, False),
    # distillation (models/distillation/model.py); a teacher width of 0 is the student's
    "model.teacher_layers": POSITIVE,
    **{f"model.teacher_{k}": NON_NEGATIVE for k in ("hidden_size", "num_heads", "intermediate_size")},
    # objective
    "objective.name": OBJECTIVE_NAMES, "objective.mask_prob": PROBABILITY, "objective.eval_mask_prob": SHARE,
    "objective.noise_density": PROBABILITY,
    "objective.replace_with_mask": SHARE, "objective.replace_with_random": SHARE, "objective.short_seq_prob": SHARE,
    "objective.geometric_p": _float(0, 1, low_open=True, what="a probability in (0, 1]"),
    "objective.mean_noise_span_length": _float(1, what="a number >= 1"),
    "objective.max_predictions_per_seq": POSITIVE, "objective.long_max_predictions_per_seq": POSITIVE,
    "objective.max_span_length": POSITIVE, "objective.targets_length": NON_NEGATIVE,
    "objective.masking": "objectives.bert_pretraining:MASKINGS", "objective.ngram_max": POSITIVE,
    "objective.z_loss": NON_NEGATIVE_FLOAT, "objective.packing": _choice(True, False),
    # data and tokenizer
    "data.max_seq_length": POSITIVE, "data.window_documents": POSITIVE, "data.pad_to_multiple_of": POSITIVE,
    "data.length_buckets": NON_NEGATIVE,
    "data.streams": NON_NEGATIVE, "data.workers": NON_NEGATIVE, "data.eval_documents": NON_NEGATIVE,
    "data.max_documents": NON_NEGATIVE, "data.long_seq_length": NON_NEGATIVE,
    "data.long_seq_start_step": NON_NEGATIVE, "data.max_train_examples": NON_NEGATIVE,
    "data.validation_examples": NON_NEGATIVE,
    # fine-tuning
    "init_weights": _choice("pretrained", "random"),
    "discriminative_factor": _float(1, what="a number >= 1 (1: every layer at the same rate; ULMFiT: 2.6)"),
    "peft.method": PEFT_NAMES, "peft.adapters.size": POSITIVE,
    "peft.adapters.placement": _choice("houlsby", "pfeiffer"),
    "peft.adapters.train_norms": _choice(True, False), "peft.lora.rank": POSITIVE, "peft.lora.alpha": POSITIVE_FLOAT,
    "peft.lora.dropout": DROPOUT, "peft.prefix.length": POSITIVE, "peft.prefix.hidden_size": NON_NEGATIVE,
    "peft.prompt.length": POSITIVE, "peft.prompt.init": _choice("vocab", "random"),
}


def _flatten(config: ml_collections.ConfigDict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in config.items():
        if isinstance(value, ml_collections.ConfigDict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


_fail = config_keys.fail


def check_ranges(config: ml_collections.ConfigDict) -> None:
    """Every key of `config` that RANGES knows, against its range; then the registered things the config chooses
    and the keys they declare (this room's optimizers, schedules and freezing strategies, and those of the rooms
    above that announced theirs on import: tokenizers, data sources)."""
    for key, value in _flatten(config).items():
        rule = RANGES.get(key)
        if rule is None:
            continue
        ok, allowed = _known(rule) if isinstance(rule, str) else rule
        if not ok(value):
            raise _fail(key, value, allowed)
    from pretrain.training import freezing, optimizers  # noqa: F401 (announce their registries)
    config_keys.check_chosen(config)


# ----- The relations within one model family (config.model.name), as models/families.py registers them. -----
def _heads_divide(width_key: str, config) -> None:
    width, heads = config.model[width_key], config.model.num_heads
    if width % heads:
        raise ConfigError(f"config.model.{width_key}={width} is not a multiple of config.model.num_heads={heads};"
                          " change one of them")


def _family_relations(config) -> None:
    import models
    family = models.family(config.model.name)
    if family.width_key is not None:
        _heads_divide(family.width_key, config)
    if family.positions_key is not None:
        _fits(family.positions_key, config)
    for key, names in family.choices.items():
        allowed = models.registry.resolve(names)
        if key in config.model and config.model[key] not in allowed:
            raise _fail(f"model.{key}", config.model[key], "one of " + ", ".join(map(repr, allowed)))


def _window_within_rows(config) -> None:
    """Pretraining a sliding-window model (ModernBERT): a window that spans the whole row makes every local layer
    global, a recipe mistake (fine-tuning keeps a checkpoint's window whatever the task's length)."""
    window = config.model.get("local_attention", 0) // 2
    length = config.data.get("max_seq_length", 0)
    if window and "objective" in config and config.model.get("global_attn_every_n_layers", 1) > 1 and window >= length:
        raise ConfigError(f"config.model.local_attention={config.model.local_attention} sees {window} tokens either "
                          f"side, the whole config.data.max_seq_length={length} row: lower local_attention below "
                          f"{2 * length}, or set config.model.global_attn_every_n_layers=1 for global attention")


def _fits(positions_key: str, config) -> None:
    """The longest sequence the data makes fits the model's position table."""
    positions = config.model.get(positions_key)
    longest = max(config.data.get("max_seq_length", 0), config.data.get("long_seq_length", 0))
    if positions is not None and longest > positions:
        key = "data.long_seq_length" if longest == config.data.get("long_seq_length", 0) else "data.max_seq_length"
        raise ConfigError(f"config.{key}={longest} exceeds config.model.{positions_key}={positions}: lower it, "
                          f"or raise --config.model.{positions_key}")


def check_relations(config: ml_collections.ConfigDict) -> list[str]:
    """Keys that must agree with each other: raises the first that do not; -> the warnings of those that agree but
    waste the run (`validate` prints them once)."""
    if "grad_accum_steps" in config and config.batch_size % config.grad_accum_steps:
        raise ConfigError(f"config.batch_size={config.batch_size} is not divisible by config.grad_accum_steps="
                          f"{config.grad_accum_steps}; make it a multiple")
    objective = config.get("objective")
    if objective is not None and objective.get("replace_with_mask", 0) + objective.get("replace_with_random", 0) > 1:
        raise ConfigError(f"config.objective.replace_with_mask={objective.replace_with_mask} + replace_with_random="
                          f"{objective.replace_with_random} exceeds 1 (BERT: 0.8 + 0.1, the rest kept)")
    _family_relations(config)
    _window_within_rows(config)
    _fused_attention_without_dropout(config)
    profiling.parse_steps(config.get("profile_steps", ""))
    _layerwise_freezing_needs_looped_layers(config)
    _peft_fits(config)
    _peft_method_fits(config)
    _discriminative_rates_need_full_fine_tuning(config)
    _validation_within_the_training_subset(config)
    return [*_objective_relations(config), *_freezing_relations(config), *config_warnings.of(config)]


def _objective_relations(config) -> list[str]:
    """The chosen objective's own check (an optional `check_config` of its class, objectives/registry.py): it raises
    ObjectiveError for a meaningless config, and returns the warnings of a wasteful one."""
    objective = config.get("objective")
    if objective is None or "name" not in objective or "data" not in config:
        return []
    from objectives.interface import ObjectiveError
    from objectives.registry import OBJECTIVES
    check = getattr(OBJECTIVES.get(objective.name), "check_config", None)
    try:
        return list(check(objective, config.data)) if check else []
    except ObjectiveError as e:
        raise ConfigError(str(e)) from None


def _freezing_relations(config) -> list[str]:
    """The chosen freezing strategy's own check (its `check` capability, pretrain/training/freezing.py) against the
    depth of the family's pretrained body and the epochs of the run."""
    from pretrain.training.freezing import FREEZING
    import models
    freezing, pretrained = config.get("freezing"), models.family(config.model.name).body
    check = getattr(FREEZING.get(freezing.strategy), "check", None) if freezing is not None else None
    if check is None or pretrained is None or pretrained.layers not in config.model or "num_epochs" not in config:
        return []
    return list(check(freezing, num_layers=config.model[pretrained.layers], num_epochs=config.num_epochs,
                      shared=bool(config.model.get("shared_layers", False))))


def _peft_fits(config) -> None:
    """PEFT adapts a pretrained model, alone (no freezing strategy on top), and its virtual tokens need room."""
    peft = config.get("peft")
    if peft is None or peft.method == "none":
        return
    if config.freezing.strategy != "none":
        raise ConfigError(f"config.peft.method={peft.method!r} already freezes all but its own parameters and the "
                          f"head: drop config.freezing.strategy={config.freezing.strategy!r} (use none)")
    if not config.get("init") or config.get("init_weights") == "random":
        raise ConfigError(f"config.peft.method={peft.method!r} adapts a pretrained model: give --config.init "
                          "(a pretrain.train workdir or a Hugging Face directory) with config.init_weights=pretrained")
    from pretrain.training import peft as parameter_efficient
    virtual = parameter_efficient.peft_config(config).virtual_positions  # and the method's own checks, one line
    import models
    positions_key = models.family(config.model.name).positions_key
    positions = config.model.get(positions_key) if positions_key else None
    if virtual and positions is not None and config.data.max_seq_length + virtual > positions:
        raise ConfigError(f"config.peft.{peft.method}.length={virtual} + config.data.max_seq_length="
                          f"{config.data.max_seq_length} exceed the model's {positions} positions: shorten one")


def _peft_method_fits(config) -> None:
    """The PEFT method's own check against the model's sizes (a LoRA rank above a projection's, an adapter wider
    than the model: models/peft/), here before anything loads rather than when the model is built."""
    peft = config.get("peft")
    if peft is None or peft.method == "none":
        return
    import models
    from models.errors import ModelInputError
    from models.peft.config import check_fits
    from pretrain.training import peft as parameter_efficient
    dims = models.model_config(config.model).dims  # a key no family field has: its own one-line error
    try:
        check_fits(parameter_efficient.peft_config(config), dims)
    except ModelInputError as e:  # it names the method's field: peft.lora_rank is config.peft.lora.rank
        raise ConfigError(f"config.{e}") from None


def _discriminative_rates_need_full_fine_tuning(config) -> None:
    """Per-layer rates scale the updates of the body's layers, which PEFT and a strategy freezing the whole body
    freeze: they would scale nothing but the method's own weights, a recipe no paper tuned, or nothing at all."""
    factor, peft, freezing = config.get("discriminative_factor", 1.0), config.get("peft"), config.get("freezing")
    if factor != 1.0 and peft is not None and peft.method != "none":
        raise ConfigError(f"config.discriminative_factor={factor:g} sets rates for the layers that "
                          f"config.peft.method={peft.method!r} freezes: set --config.discriminative_factor=1 "
                          "or --config.peft.method=none")
    from pretrain.training.freezing import FREEZING
    if factor != 1.0 and freezing is not None and not getattr(FREEZING.get(freezing.strategy), "trains_body", True):
        raise ConfigError(f"config.discriminative_factor={factor:g} sets rates for the layers that "
                          f"config.freezing.strategy={freezing.strategy!r} freezes: set "
                          "--config.discriminative_factor=1, or another strategy")


def _validation_within_the_training_subset(config) -> None:
    """The held-out split comes out of the max_train_examples subset (the loop checks the loaded size too)."""
    data = config.get("data")
    held, subset = (data.get("validation_examples", 0), data.get("max_train_examples", 0)) if data else (0, 0)
    if held and subset and held >= subset:
        raise ConfigError(f"config.data.validation_examples={held} would hold out all config.data.max_train_examples="
                          f"{subset} training examples; set it below {subset} (0: select on dev)")


def _fused_attention_without_dropout(config) -> None:
    """The fused kernels keep no attention matrix to drop out (models/attention.py)."""
    model = config.model
    from models.attention import FUSED
    if model.get("attention") in FUSED and model.get("attention_dropout_rate", 0) > 0:
        raise ConfigError(f"config.model.attention={model.attention!r} cannot drop attention probabilities out but "
                          f"config.model.attention_dropout_rate={model.attention_dropout_rate}: set it to 0, or "
                          "--config.model.attention=auto (the reference einsum while dropout is on)")


def _layerwise_freezing_needs_looped_layers(config) -> None:
    from pretrain.training.freezing import FREEZING
    freezing = config.get("freezing")
    if freezing is not None and config.model.get("scan_layers") and FREEZING.get(freezing.strategy).layer_by_layer:
        raise ConfigError(f"config.freezing.strategy={freezing.strategy!r} freezes layer by layer, which a scanned "
                          "stack (config.model.scan_layers=True) holds as one weight: set --config.model.scan_layers"
                          "=False")


def check_mesh(config: ml_collections.ConfigDict) -> None:
    """config.mesh_shape against the devices this process sees (after jax.distributed is initialized)."""
    from pretrain.runtime import partitioning
    mesh = partitioning.create_mesh(config.mesh_shape)  # ConfigError naming the shape and the device count
    import jax
    if jax.process_count() == 1:  # several processes: the data path's own checks name the processes and devices
        check_batch_split(config, mesh.shape["data"] * mesh.shape["fsdp"])
    if config.get("mesh_mode") == "shard_map" and (mesh.shape["fsdp"], mesh.shape["tensor"]) != (1, 1):
        raise ConfigError(f"config.mesh_mode='shard_map' replicates the state on every device, but config.mesh_shape="
                          f"{tuple(config.mesh_shape)} shards it: use --config.mesh_shape=-1,1,1 or mesh_mode=jit")


def check_batch_split(config, shards: int) -> None:
    """Every micro-batch splits over the devices the batch is sharded over (the steps would refuse the first batch,
    after the corpus is read and the step compiled)."""
    accum = config.get("grad_accum_steps", 1)
    rows = config.batch_size // accum
    if rows % shards:
        raise ConfigError(f"config.batch_size={config.batch_size} / config.grad_accum_steps={accum} = {rows} rows per "
                          f"micro-batch do not split over the {shards} batch shards (data x fsdp) of config.mesh_shape="
                          f"{tuple(config.mesh_shape)}: make the batch size a multiple of {shards * accum}")


def check_devices(config: ml_collections.ConfigDict) -> None:
    """What the config asks of the hardware: cuDNN attention needs a GPU, the Pallas kernels (flash, splash) a TPU."""
    import jax
    model = config.get("model")
    kernel = model.get("attention") if model is not None else None
    wants = {"cudnn": "gpu", "pallas": "tpu", "splash": "tpu"}.get(kernel)
    if wants and jax.default_backend() != wants:
        raise ConfigError(f"config.model.attention={model.attention!r} needs a {wants.upper()}, and this process runs "
                          f"on {jax.default_backend()}: use --config.model.attention=auto (XLA's kernel here)")


def validate(config: ml_collections.ConfigDict) -> None:
    """All of the above, in order; the first problem found is raised, and once none is, the warnings printed."""
    check_ranges(config)
    warnings = check_relations(config)
    check_mesh(config)
    check_devices(config)
    for message in warnings:  # after every error check: a refused command prints its one line only
        config_warnings.warn_once(message)
