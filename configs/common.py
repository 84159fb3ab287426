"""Helpers shared by the config files: config-string parsing and the trainer's common fields."""
from __future__ import annotations

import importlib
import os

import ml_collections


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
    """'size=base,nsp=False' -> ConfigDict, typed like `defaults`; unknown names are an error."""
    values = ml_collections.ConfigDict(defaults)
    for item in filter(None, (arg or "").split(",")):
        key, sep, value = item.partition("=")
        if not sep or key not in defaults:
            raise ValueError(f"config argument {item!r} is not one of {sorted(defaults)} "
                             f"(write it as key=value, e.g. {next(iter(defaults))}=...)")
        kind = type(defaults[key])
        if kind is bool:
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"config argument {key}={value!r} must be true or false")
            values[key] = value.lower() in ("true", "1")
        else:
            values[key] = kind(value)
    return values


def load(spec: str) -> ml_collections.ConfigDict:
    """'configs/t5.py:size=base' -> configs.t5.get_config('size=base'), as the entry points' --config reads it."""
    path, _, arg = spec.partition(":")
    if os.path.dirname(os.path.normpath(path)) != "configs" or not path.endswith(".py"):
        raise ValueError(f"config {spec!r}: give a file of configs/ and its arguments (e.g. configs/bert.py:size=tiny)")
    name = os.path.basename(path)[:-len(".py")]
    try:
        module = importlib.import_module(f"configs.{name}")
    except ModuleNotFoundError:
        raise ValueError(f"config {spec!r}: configs/{name}.py does not exist") from None
    return module.get_config(arg or None)


def typed(value: str, like):
    """'0.3' -> 0.3 where the config holds a float: a KEY=VALUE setting takes the type of the key it replaces."""
    if isinstance(like, bool):
        if value.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"--set: {value!r} must be true or false")
        return value.lower() in ("true", "1")
    return type(like)(value) if like is not None else value


def apply_setting(config: ml_collections.ConfigDict, setting: str) -> None:
    """'a.b=value' (the scripts' --set): config.a.b = value, typed as the key's current value. Raises ValueError for
    a setting without '=' or a value of the wrong type, KeyError for a key the config does not have."""
    key, sep, value = setting.partition("=")
    if not sep or not key:
        raise ValueError("expected KEY=VALUE")
    *parents, last = key.split(".")
    node = config
    for part in parents:
        node = node[part]
    node[last] = typed(value, node[last])


def corpus_fields(**overrides) -> dict:
    """config.data fields of every pretraining config that name its corpus (pretrain/data/documents.py), with the
    family's own defaults in `overrides`."""
    return dict(dict(
        source="text",               # text | tfds | hf (a Hugging Face Hub dataset) | prepared
                                     # (python -m pretrain.tools.prepare_corpus)
        path="",                     # text: file(s), globs, comma-separated; prepared: its directory
        tfds_name="", tfds_split="train", tfds_data_dir="", text_key="text",  # tfds: the dataset, its text feature
        hf_path="",                  # hf: a Hub name (wikimedia/wikipedia) or a local folder in the Hub's layout
                                     # (docs/training.md: files named by split, a folder or README.md config per name)
        hf_name="", hf_split="train",  # hf: the dataset's config (20231101.en) and split (train; a slice, train[:10%],
                                       # only without streaming: a stream reads whole splits, cut by max_documents)
        data_files="",               # hf: files of the dataset (globs, comma-separated), as load_dataset's data_files
        text_column="text",          # hf: the column holding a document
        streaming=False,             # hf: read as a stream (no Arrow copy of the split): into memory up to
                                     # max_documents, or with 0 streamed through training (pretrain/data/streamed.py)
        hf_eval_split="",            # hf, streamed: the split whose first eval_documents are held out
        max_documents=0,             # 0 = all
        eval_documents=0),           # documents held out for evaluation (0 = no evaluation); prepared: its eval
                                     # split if it has one, else the last ones of its train split
        **overrides)


def input_pipeline_fields() -> dict:
    """config.data fields of every pretraining config: how the streaming pipeline (pretrain/data/streaming.py)
    cuts the corpus. A batch is a pure function of (seed, step, streams, window_documents)."""
    return dict(
        window_documents=256,  # random documents per window of instances (NSP partners, packing)
        streams=0,             # independent row streams of the global batch. 0 = auto: gcd(batch_size, 2^k),
                               # 2^k in [8, 64] by the corpus's windows per epoch, whatever the number of
                               # processes (any count dividing it resumes a checkpoint with the same data),
                               # or a resumed checkpoint's count. Each stream holds about one window in memory
        workers=0)             # Grain worker processes per host building instances (0 = in the loop's thread)


def compute_fields() -> dict:
    """config.model fields of every family that change how the model is computed, never what: the attention
    kernel (models/attention.py), a scanned layer stack and rematerialization (models/stack.py), fused query/key/value
    projections (models/qkv_layout.py)."""
    return dict(
        attention="auto",    # auto | einsum | xla | cudnn | pallas
        scan_layers=False,   # True: one compiled layer scanned over weights stacked [layers, ...]
        fused_qkv=False,     # True: self-attention's query, key and value as one matmul, kernel [D, 3, H, K]
        remat="none")        # none | minimal | full: activations recomputed in the backward pass


def trainer_config() -> ml_collections.ConfigDict:
    """Fields every pretraining config has: loop, logging, checkpoints, mesh, optimizer."""
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.init = ""                      # a pretrain.train workdir or Hugging Face directory whose weights a fresh run
                                     # starts from, pretraining heads included ('' = random init; a resumed run reads
                                     # its own checkpoint): continued pretraining (python -m pretrain.adapt)
    c.batch_size = 256               # global batch (sequences per step; per update unless optimizer.ramp_accumulation)
    c.grad_accum_steps = 1           # micro-batches per step; batch_size must divide evenly
    c.num_train_steps = 1000
    c.budget_minutes = 0.0           # > 0: num_train_steps (and the warm-up, evaluations and checkpoints with it) fitted
                                     # to this wall-clock budget on this machine (pretrain/loops/budget.py)
    c.budget_steps = 0               # > 0: a budget run's planned steps (its budget.json) replayed without the clock
    c.log_every = 10                 # steps between metrics.jsonl / TensorBoard records
    c.checkpoint_every = 1000        # steps between asynchronous checkpoints (the last is always saved)
    c.keep_checkpoints = 3
    c.eval_every = 0                 # steps between held-out evaluations (0 = only at the end)
    c.eval_batches = 4
    c.mesh_shape = (-1, 1, 1)        # (data, fsdp, tensor); -1 = all remaining devices
    c.mesh_mode = "jit"              # jit: XLA partitions the step (GSPMD) | shard_map: explicit per-device
                                     # data parallelism, psum of the gradients (needs fsdp = tensor = 1)
    c.prefetch = 2                   # batches built ahead on a host thread
    c.prng_impl = "auto"             # dropout's PRNG: auto (the counter hash on a TPU, threefry elsewhere) | threefry |
                                     # rbg | unsafe_rbg | hash (pretrain/training/prng.py)
    c.skip_nonfinite_updates = False  # True: drop an update whose loss or gradient is NaN/inf and count it
                                      # (logged as skipped_updates); False: stop the run there with one line
    c.profile_steps = ""             # 'N,M': a jax.profiler trace of steps N..M in WORKDIR/profile (core/profiling.py)
    c.profile_all_processes = False  # True: every process traces (its own file); False: the first only
    c.wandb = ml_collections.ConfigDict(dict(  # Weights & Biases beside TensorBoard (pretrain/workdir/wandb_run.py)
        project="",                  # set: the metrics and the config go to this project too (pip install -e ".[wandb]")
        entity="",                   # the W&B team or user (empty: the account's default)
        name="",                     # the run's name (empty: the workdir's)
        tags=""))                    # comma-separated

    c.optimizer = ml_collections.ConfigDict()
    c.optimizer.name = "adamw"
    c.optimizer.learning_rate = 1e-4
    c.optimizer.end_learning_rate = 0.0
    c.optimizer.schedule = "warmup_linear_decay"
    c.optimizer.warmup_steps = 100
    c.optimizer.b1 = 0.9
    c.optimizer.b2 = 0.999
    c.optimizer.eps = 1e-6
    c.optimizer.weight_decay = 0.01
    c.optimizer.grad_clip_norm = 1.0
    # Cramming's batch-size ramp (optimizers.with_batch_ramp): > 1, each update averages a group of steps' batches,
    # one at first, growing linearly to this many at ramp_fraction of the steps (1: every step updates)
    c.optimizer.ramp_accumulation = 1
    c.optimizer.ramp_fraction = 0.6
    return c
