"""The configs (SIZES, build_config) and the two sides of scripts/bench/bench_accelerator.py, each side run in a
worker process of its own.

  ours  the trainer pretrain/loops/pretraining.py builds (pretrain/loops/setup.py: the sharded state and the
        jitted train step of pretrain/loops/steps.py), over a stand-in tokenizer.
  HF    transformers' model of the same architecture: forward + loss (under bf16 autocast on a GPU),
        backward, clip_grad_norm_(1.0), AdamW (fused on a GPU); eager or torch.compile'd.

A step is timed from its dispatch to the loss on the host (each side's training loop reads it), with the
batches already on the device. Nothing here is run directly: see bench_accelerator.py.
"""
from __future__ import annotations

import json
import os
import time

import numpy as np

from configs import common

SIZES = {  # size -> model -> (config argument, batch, sequence length)
    "tiny": {"bert": ("size=tiny", 8, 128), "gpt2": ("size=tiny", 8, 128), "t5": ("size=tiny", 8, 128)},
    "small": {"bert": ("size=small", 32, 128), "gpt2": ("size=small", 4, 256), "t5": ("size=small", 16, 128)},
    "base": {"bert": ("size=base", 256, 128), "gpt2": ("size=small", 32, 1024), "t5": ("size=small", 128, 512),
             "t5-base": ("size=base", 128, 512)},
}


def family(model: str) -> str:
    """A benchmarked model -> its config file and family ('t5-base' -> 't5')."""
    return model.split("-")[0]


def build_config(model: str, size: str, batch: int, seq: int, accelerator: bool, settings: tuple[str, ...] = ()):
    """This project's config for `model` at `size`, with the benchmark's overrides, then `settings` ([MODEL:]KEY=VALUE,
    --set; a MODEL: prefix keeps it to that model): both sides are built from this config, so a setting such as
    model.attention_dropout_rate=0 reaches transformers' model too."""
    arg, model = SIZES[size][model][0], family(model)
    config = common.load(f"configs/{model}.py:{arg}")
    o = config.optimizer  # BERT's and GPT-2's AdamW as configured; T5 (Adafactor) takes BERT's AdamW values
    adamw = {"learning_rate": 1e-4, "b1": 0.9, "b2": 0.999, "eps": 1e-6, "weight_decay": 0.01} \
        if o.name != "adamw" else {k: o[k] for k in ("learning_rate", "b1", "b2", "eps", "weight_decay")}
    overrides = {"batch_size": batch, "grad_accum_steps": 1, "mesh_shape": (-1, 1, 1), "data.max_seq_length": seq,
                 "optimizer.name": "adamw", "optimizer.schedule": "constant", "optimizer.warmup_steps": 0,
                 "optimizer.grad_clip_norm": 1.0, **{f"optimizer.{k}": v for k, v in adamw.items()},
                 "model.dtype": "bfloat16" if accelerator else "float32", "model.param_dtype": "float32"}
    if model == "bert":  # BERT's 20 masked positions per 128 tokens (80 per 512)
        overrides["objective.max_predictions_per_seq"] = max(1, config.objective.max_predictions_per_seq * seq // 128)
    if model == "t5":
        overrides.update({"objective.z_loss": 0.0, "objective.targets_length": 0})
    if model == "gpt2":
        overrides["objective.z_loss"] = 0.0
    with config.unlocked():
        config.update_from_flattened_dict(overrides)
    for setting in settings_for(model, settings):  # typed as the key they replace, as cram.py's --set
        try:
            common.apply_setting(config, setting)
        except ValueError as e:
            raise SystemExit(f"--set {setting!r}: {e}, e.g. --set model.attention_dropout_rate=0.0") from None
        except KeyError:
            key = setting.partition("=")[0]
            raise SystemExit(f"--set {setting!r}: the {model} config has no key {key!r} (python -m pretrain.train "
                             f"--config=configs/{model}.py --print_config lists them)") from None
    return config


def settings_for(model: str, settings: tuple[str, ...]) -> list[str]:
    """The settings that apply to `model`: unprefixed ones and those prefixed with 'MODEL:' ('t5:model.x=1')."""
    chosen = []
    for setting in settings:
        prefix, sep, rest = setting.partition(":")
        if not sep or "=" in prefix:
            chosen.append(setting)
        elif prefix not in SIZES["tiny"]:
            raise SystemExit(f"--set {setting!r}: {prefix!r} is no model; prefix with one of "
                             f"{', '.join(SIZES['tiny'])}")
        elif prefix == family(model):
            chosen.append(rest)
    return chosen


def worker(args) -> None:
    model, side = args.worker.split(":")
    if model == "probe":
        result = probe()
    else:
        config = build_config(model, args.size, args.batch, args.seq, args.accelerator, tuple(args.set))
        with np.load(args.batches) as f:
            stacked = {k: f[k] for k in f.files}
        batches = [{k: v[i] for k, v in stacked.items()} for i in range(len(next(iter(stacked.values()))))]
        try:
            result = run_jax(config, batches) if side == "jax" else run_torch(
                model, config, batches, compiled=side == "torch_compile", threads=args.torch_threads)
        except Exception as e:  # noqa: BLE001 -- an out-of-memory ends this try only (--find_max_batch)
            if not _out_of_memory(e):
                raise
            result = {"error": f"out of memory at batch {args.batch}"}
    with open(args.result_file, "w") as f:
        json.dump(result, f)


def probe() -> dict:
    """JAX's backend and device kind; on a CPU also the float32 matmul roofline (MFU's denominator)."""
    import jax
    device = jax.devices()[0]
    result = {"backend": jax.default_backend(), "kind": device.device_kind}
    if result["backend"] == "cpu":
        from scripts.bench.bench_pretrain import matmul_roofline
        result["roofline"] = matmul_roofline()
    return result


def _out_of_memory(e: Exception) -> bool:
    text = str(e)
    return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()


# ---------------------------------------------------------------------------------------------
# Ours.
# ---------------------------------------------------------------------------------------------
def run_jax(config, batches: list[dict[str, np.ndarray]]) -> dict:
    # XLA preallocates 75% of GPU memory by default; this process is alone on the device (one per side).
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")
    import jax

    from pretrain.loops import setup
    from pretrain.training import train_state
    from scripts.bench.bench_pretrain import timed_steps

    state, times, losses = timed_steps(setup.pretraining_trainer(config), batches)
    stats = jax.devices()[0].memory_stats() or {}  # None on a CPU
    return {"times": times, "losses": losses, "params": train_state.count_params(state.params),
            "peak_bytes": stats.get("peak_bytes_in_use"), "device": jax.devices()[0].device_kind}


# ---------------------------------------------------------------------------------------------
# Hugging Face transformers.
# ---------------------------------------------------------------------------------------------
def hf_model(name: str, config):
    """The transformers model of config.model's architecture (dropout rates included)."""
    import transformers
    m = config.model
    if name == "bert":
        return transformers.BertForPreTraining(transformers.BertConfig(
            vocab_size=m.vocab_size, hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
            num_attention_heads=m.num_heads, intermediate_size=m.intermediate_size,
            max_position_embeddings=m.max_position_embeddings, type_vocab_size=m.type_vocab_size,
            hidden_dropout_prob=m.dropout_rate, attention_probs_dropout_prob=m.attention_dropout_rate,
            layer_norm_eps=m.layer_norm_eps, initializer_range=m.initializer_range, attn_implementation="sdpa"))
    if name == "gpt2":
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=m.vocab_size, n_positions=m.n_positions, n_embd=m.d_model, n_layer=m.num_layers,
            n_head=m.num_heads, n_inner=m.d_ff, resid_pdrop=m.dropout_rate, embd_pdrop=m.dropout_rate,
            attn_pdrop=m.attention_dropout_rate, layer_norm_epsilon=m.layer_norm_eps,
            initializer_range=m.initializer_range, bos_token_id=None, eos_token_id=None,
            attn_implementation="sdpa"))
    return transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=m.vocab_size, d_model=m.d_model, d_kv=m.head_dim, d_ff=m.d_ff, num_layers=m.num_encoder_layers,
        num_decoder_layers=m.num_decoder_layers, num_heads=m.num_heads,
        relative_attention_num_buckets=m.relative_attention_num_buckets,
        relative_attention_max_distance=m.relative_attention_max_distance, dropout_rate=m.dropout_rate,
        layer_norm_epsilon=m.layer_norm_eps, feed_forward_proj=m.feed_forward,
        tie_word_embeddings=m.tie_word_embeddings, initializer_factor=m.initializer_factor,
        decoder_start_token_id=0, pad_token_id=0))


def hf_inputs(name: str, batch: dict[str, np.ndarray], device) -> dict:
    """Our batch -> the HF model's keyword arguments (labels: -100 = not predicted), on `device`."""
    import torch
    t = lambda x: torch.from_numpy(np.ascontiguousarray(x).astype(np.int64)).to(device)  # noqa: E731
    if name == "bert":
        labels = np.full(batch["input_ids"].shape, -100, np.int64)
        rows, cols = np.nonzero(batch["masked_lm_weights"])
        labels[rows, batch["masked_lm_positions"][rows, cols]] = batch["masked_lm_ids"][rows, cols]
        return dict(input_ids=t(batch["input_ids"]), token_type_ids=t(batch["segment_ids"]),
                    attention_mask=t(batch["input_mask"]), labels=t(labels),
                    next_sentence_label=t(batch["next_sentence_labels"]))
    if name == "gpt2":  # targets are already shifted: the loss is taken outside the model (nanoGPT's)
        return dict(input_ids=t(batch["input_ids"]),
                    targets=t(np.where(batch["loss_weights"] > 0, batch["target_ids"], -100)))
    return dict(input_ids=t(batch["encoder_input_ids"]), attention_mask=t(batch["encoder_segment_ids"] > 0),
                decoder_input_ids=t(batch["decoder_input_ids"]),
                decoder_attention_mask=t(batch["decoder_segment_ids"] > 0),
                labels=t(np.where(batch["decoder_loss_weights"] > 0, batch["decoder_target_ids"], -100)))


def run_torch(name: str, config, batches: list[dict[str, np.ndarray]], compiled: bool, threads: int = 0) -> dict:
    import torch
    import torch.nn.functional as F
    device = "cuda" if torch.cuda.is_available() else "cpu"
    accelerator = device == "cuda"
    torch.manual_seed(0)
    if not accelerator:
        torch.set_num_threads(threads or os.cpu_count() or 1)  # default: as many threads as XLA uses
    model = hf_model(name, config).to(device)
    model.train()
    o = config.optimizer
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": o.weight_decay},  # as ours:
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]  # no decay on biases, norms
    optimizer = torch.optim.AdamW(groups, lr=o.learning_rate, betas=(o.b1, o.b2), eps=o.eps,
                                  **({"fused": True} if accelerator else {}))

    def loss_fn(inputs: dict):
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=accelerator):
            if name == "gpt2":
                logits = model(input_ids=inputs["input_ids"]).logits
                return F.cross_entropy(logits.float().flatten(0, 1), inputs["targets"].flatten())
            return model(**inputs).loss

    step_loss = torch.compile(loss_fn) if compiled else loss_fn  # the model's forward and backward compile
    device_batches = [hf_inputs(name, b, device) for b in batches]
    times, losses = [], []
    for inputs in device_batches:
        start = time.perf_counter()
        loss = step_loss(inputs)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, o.grad_clip_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())  # synchronizes with the device
        times.append(time.perf_counter() - start)
    return {"times": times, "losses": losses, "params": sum(p.numel() for p in params),
            "peak_bytes": torch.cuda.max_memory_allocated() if accelerator else None,
            "device": torch.cuda.get_device_name() if accelerator else "cpu"}
