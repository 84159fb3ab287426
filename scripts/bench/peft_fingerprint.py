"""A bitwise fingerprint of fine-tuning models with and without PEFT, to hold a refactor to the same numbers.

For each configuration (a model family x a PEFT method x looped or scanned layers, fused query/key/value where a
family has it, and the head kinds BERT fine-tunes), the model is built through the entry the fine-tuning loop uses
(configs/glue.py, tagging.py, qa.py with tiny model overrides -> pretrain.finetuners.registry.for_config ->
build_model), initialised with a fixed key on a fixed batch, applied as the loop applies it (PEFT: through
pretrain/training/peft.py's hold_frozen) in deterministic mode and in training mode with a fixed dropout key, and
differentiated (the sum of the outputs w.r.t. the parameters). Each of the parameter tree (paths, shapes, dtypes,
bytes), the outputs and the gradients is hashed with sha256.

  python -m scripts.bench.peft_fingerprint --output before.json    # write every configuration's hashes
  python -m scripts.bench.peft_fingerprint --compare before.json   # recompute; print how many match
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import types

import flax
import jax
import jax.numpy as jnp
import numpy as np

TINY_MODELS = {
    "bert": dict(vocab_size=101, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                 max_position_embeddings=64),
    "gpt": dict(vocab_size=101, n_positions=64, d_model=32, num_layers=2, num_heads=4, d_ff=64),
    "t5": dict(vocab_size=101, d_model=32, num_heads=4, head_dim=8, d_ff=64, num_encoder_layers=2,
               num_decoder_layers=2, dropout_rate=0.1),
    "modernbert": dict(vocab_size=101, hidden_size=32, num_layers=3, num_heads=4, intermediate_size=48,
                       max_position_embeddings=64, local_attention=8, embedding_dropout=0.1, dropout_rate=0.1,
                       attention_dropout_rate=0.1, classifier_dropout=0.1),
}
ALL_TARGETS = "query,key,value,out,intermediate,output"
METHODS = {  # name -> config.peft changes
    "none": dict(method="none"),
    "lora": dict(method="lora", lora=dict(rank=4, alpha=8.0)),
    "lora_all": dict(method="lora", lora=dict(rank=4, alpha=8.0, dropout=0.1, targets=ALL_TARGETS)),
    "adapters_houlsby": dict(method="adapters", adapters=dict(size=8, placement="houlsby")),
    "adapters_pfeiffer": dict(method="adapters", adapters=dict(size=8, placement="pfeiffer")),
    "prefix_mlp": dict(method="prefix", prefix=dict(length=3, hidden_size=16)),
    "prefix_table": dict(method="prefix", prefix=dict(length=3, hidden_size=0)),
    "prompt": dict(method="prompt", prompt=dict(length=3, init="random")),
}
# (the head's name in a configuration's name, configs module, config string, the task's labels); a head's task is
# configs/<module>.py's, so the head kind comes from the finetuner's task (the registry picks it, not this table)
HEAD_TASKS = (("classification", "glue", "task=mrpc", 2), ("tagging", "tagging", "", 5), ("qa", "qa", "", 2))


def head_task(head: str) -> tuple[str, str, int]:
    """-> (configs module, config string, labels) of the configurations named `head`."""
    return next(task[1:] for task in HEAD_TASKS if task[0] == head)


def configurations() -> list[tuple[str, str, str, bool, bool]]:
    """(family, head, method, scan_layers, fused_qkv) for every configuration fingerprinted (72)."""
    out = [(family, "classification", method, scan, False) for family in TINY_MODELS
           for method in METHODS if method != "lora_all" for scan in (False, True)]
    out += [(family, "classification", method, False, True) for family in TINY_MODELS
            for method in ("lora_all", "prefix_mlp")]
    out += [("bert", head, method, False, False) for head in ("tagging", "qa")
            for method in ("lora_all", "adapters_houlsby", "prefix_mlp", "prompt")]
    return out


def name_of(family: str, head: str, method: str, scan: bool, fused: bool) -> str:
    return f"{family}/{head}/{method}/{'scanned' if scan else 'looped'}" + ("/fused_qkv" if fused else "")


class StubTokenizer:
    """What the finetuners' constructors read of a tokenizer: ids of label words and an end-of-sequence id."""
    eos_id, pad_id = 2, 0

    def encode_batch(self, texts):
        return [[3 + len(t) % 5, 4] for t in texts]

    def encode(self, text):
        return [5]


def build_config(family: str, head: str, method: str, scan: bool, fused: bool):
    import importlib
    module, arg, _ = head_task(head)
    config = importlib.import_module(f"configs.{module}").get_config(
        ",".join(filter(None, [arg, f"model={family}", "size=tiny" if family in ("gpt", "modernbert") else ""])))
    config.model.update(dict(TINY_MODELS[family], scan_layers=scan, fused_qkv=fused))
    changes = METHODS[method]
    config.peft.method = changes["method"]
    for group, values in changes.items():
        if group != "method":
            config.peft[group].update(values)
    return config


def batch(rows: int = 2, length: int = 12) -> dict[str, np.ndarray]:
    """Every input key a finetuner's objective may read; the second row padded."""
    ids = np.asarray(jax.random.randint(jax.random.key(7), (rows, length), 5, 101), np.int32)
    mask = (np.arange(length)[None] < np.array([[length], [length - 4]])).astype(np.int32)
    segments = (np.arange(length)[None] >= length // 2).astype(np.int32) * mask
    return {"input_ids": ids * mask, "segment_ids": segments, "input_mask": mask,
            "encoder_input_ids": ids * mask, "decoder_input_ids": np.concatenate([np.zeros((rows, 1), np.int32),
                                                                                  ids[:, :4]], axis=1)}


def digest(tree) -> str:
    """sha256 of every leaf's path, shape, dtype and bytes, in sorted path order."""
    h = hashlib.sha256()
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    for path, leaf in sorted(leaves, key=lambda kv: jax.tree_util.keystr(kv[0])):
        array = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{jax.tree_util.keystr(path)}|{array.shape}|{array.dtype}|".encode())
        h.update(array.tobytes())
    return h.hexdigest()


def fingerprint(family: str, head: str, method: str, scan: bool, fused: bool) -> dict[str, str]:
    from pretrain.finetuners import registry
    from pretrain.training import peft as parameter_efficient
    config = build_config(family, head, method, scan, fused)
    _, _, num_labels = head_task(head)
    task = types.SimpleNamespace(name=config.task, kind=head, num_labels=num_labels, labels=("no", "yes"),
                                 is_regression=False, is_pair=True, version_2=False)
    finetuner = registry.for_config(config, task, StubTokenizer())
    model = finetuner.build_model()
    inputs = finetuner.objective.model_inputs(batch())
    params = flax.core.meta.unbox(model.init(jax.random.key(0), **inputs, deterministic=True)["params"])
    apply = model.apply
    if parameter_efficient.is_peft(config):  # as the loop applies it (pretrain/loops/finetuning.py)
        apply = parameter_efficient.hold_frozen(apply, parameter_efficient.trainable(params, finetuner.name, config))

    def outputs(p, deterministic: bool):
        rngs = {} if deterministic else {"dropout": jax.random.key(1)}
        return apply({"params": p}, **inputs, deterministic=deterministic, rngs=rngs)

    def total(p):
        return sum(jnp.sum(leaf.astype(jnp.float32)) for leaf in jax.tree.leaves(outputs(p, False)))

    return {"params": digest(params), "deterministic": digest(outputs(params, True)),
            "training": digest(outputs(params, False)), "grads": digest(jax.grad(total)(params))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", help="write the fingerprints to this JSON file")
    parser.add_argument("--compare", help="compare with the fingerprints in this JSON file")
    parser.add_argument("--only", default="", help="a substring: fingerprint only the configurations naming it")
    args = parser.parse_args(argv)
    found = {}
    for case in configurations():
        name = name_of(*case)
        if args.only in name:
            found[name] = fingerprint(*case)
            print(name, found[name]["params"][:12], found[name]["grads"][:12], flush=True)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(found, f, indent=1, sort_keys=True)
    if args.compare:
        with open(args.compare) as f:
            expected = json.load(f)
        differ = [name for name in found if found[name] != expected.get(name)]
        for name in differ:
            parts = [k for k in found[name] if found[name][k] != expected.get(name, {}).get(k)]
            print(f"DIFFERS {name}: {', '.join(parts)}")
        print(f"{len(found) - len(differ)} of {len(found)} configurations match")
        return 1 if differ else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
