"""What a pretrained encoder's frozen features carry, before any fine-tuning can spend or spoil them: a linear probe
(logistic regression, its L2 strength chosen by 5-fold cross-validation on the training examples alone) on each kind
of pooled feature, from the checkpoint and from random weights of its architecture, scored on the task's dev set.

  python -m scripts.bench.probe_features --init demo_out/pretrained --task sst2 --labels 100 1000 8000

Features, each a vector per example:
  embeddings  the mean of the input word embeddings (what a bag of pretrained word vectors knows)
  cls         the encoder's last hidden state at [CLS] (MLM never trains that position's output)
  mean        the mean of the last hidden states over the tokens
  head_mean   the pretrained prediction head (dense, activation, LayerNorm) on that mean: what the sequence head
              of configs/glue.py:model=modernbert with classifier_pooling=mean puts in front of its classifier

A probe that separates pretrained from random weights says the features carry something; one that does not says
fine-tuning has nothing to keep. Prints one table and writes it as JSON to --output.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from sklearn.linear_model import LogisticRegressionCV
from sklearn.preprocessing import StandardScaler

from configs import glue as glue_config
from pretrain.data import finetune_data
from pretrain.loops.finetuning import task_and_finetuner
from pretrain.training import pretrained

FEATURES = ("embeddings", "cls", "mean", "head_mean")


def probe_model(init: str, task: str, glue_dir: str, weights: str):
    """(config, finetuner, model, params) of a ModernBERT sequence classifier from `init`'s architecture: its
    weights or fresh ones."""
    config = glue_config.get_config(f"task={task},model=modernbert")
    config.unlock()
    config.update(init=init, init_weights=weights)
    config.data.glue_dir = glue_dir
    config, loaded = pretrained.resolve_config(config)
    _, finetuner = task_and_finetuner(config)
    model = finetuner.build_model()
    example = finetune_data.FineTuningData([([1, 2], [0, 0])], {}, 1, 0).batch(np.arange(1))
    params = model.init(jax.random.key(0), example["input_ids"], example["segment_ids"], example["input_mask"],
                        deterministic=True)["params"]
    params = nn.meta.unbox(params)  # plain arrays, as merge_pretrained walks them
    if loaded is not None:
        params = finetuner.merge_pretrained(params, loaded)[0]
    return config, finetuner, model, params


def features(finetuner, model, params, examples: list, batch_size: int = 256) -> dict[str, np.ndarray]:
    """Each FEATURES kind for every example: [N, D]."""
    data = finetuner.encode(examples, batch_size)

    def pooled(m, input_ids, input_mask):
        sequence = m.modernbert(input_ids, input_mask, True)
        weights = (input_mask > 0).astype(jnp.float32)[..., None]
        count = jnp.maximum(weights.sum(1), 1.0)
        embedded = m.modernbert.embeddings.word_embeddings(input_ids)
        mean = (sequence * weights).sum(1) / count
        return {"embeddings": (embedded * weights).sum(1) / count, "cls": sequence[:, 0], "mean": mean,
                "head_mean": m.prediction_head(mean)}

    run = jax.jit(lambda p, ids, mask: model.apply({"params": p}, ids, mask, method=pooled))
    out = {k: np.zeros((len(data), model.config.hidden_size), np.float32) for k in FEATURES}
    for batch in data.batches():
        values = jax.device_get(run(params, batch["input_ids"], batch["input_mask"]))
        real = batch["weight"] > 0
        for k in FEATURES:
            out[k][batch["index"][real]] = values[k][real]
    return out


def probe(train: np.ndarray, train_labels: np.ndarray, dev: np.ndarray, dev_labels: np.ndarray) -> float:
    """Dev accuracy (%) of a logistic regression on standardized features, C chosen by 5-fold CV on train."""
    scaler = StandardScaler().fit(train)
    classifier = LogisticRegressionCV(Cs=np.logspace(-4, 2, 13), cv=5, max_iter=2000)
    classifier.fit(scaler.transform(train), train_labels)
    return 100.0 * float(np.mean(classifier.predict(scaler.transform(dev)) == dev_labels))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--init", nargs="+", required=True, help="pretrain.train workdirs (ModernBERT) to probe")
    parser.add_argument("--task", default="sst2")
    parser.add_argument("--glue_dir", default="../shared/data/glue")
    parser.add_argument("--labels", nargs="+", type=int, default=[100, 1000, 8000],
                        help="training examples (fine-tuning's max_train_examples subset)")
    parser.add_argument("--output", default="runs/probe_features.json")
    args = parser.parse_args()
    rows = []
    arms = [(os.path.basename(os.path.normpath(i)), i, "pretrained") for i in args.init]
    arms.append(("random", args.init[0], "random"))
    for name, init, weights in arms:
        config, finetuner, model, params = probe_model(init, args.task, args.glue_dir, weights)
        train_all = finetuner.task.load(config, "train")
        dev = finetuner.task.load(config, finetuner.task.dev_splits[0])
        dev_features, dev_labels = features(finetuner, model, params, dev), np.array([e.label for e in dev])
        for labels in args.labels:
            subset = [train_all[i] for i in finetune_data.subset_indices(len(train_all), labels)]
            train_features, train_labels = features(finetuner, model, params, subset), np.array([e.label for e in subset])
            row = {"arm": name, "labels": labels, **{k: probe(train_features[k], train_labels, dev_features[k],
                                                                dev_labels) for k in FEATURES}}
            rows.append(row)
            print(f"{name:>14} {labels:>6} labels  " + "  ".join(f"{k} {row[k]:5.1f}" for k in FEATURES), flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
