"""The seconds-long tiny BERT run: its flags for the real command (tests/conftest.py's shared runs and many
end-to-end tests) and the same settings as a config for an in-process run of the loop."""
from __future__ import annotations


def tiny_overrides(corpus: str, spm_model: str, **extra) -> list[str]:
    """Flags for a seconds-long run of a very small BERT through the real command."""
    values = {
        "data.path": corpus, "tokenizer.path": spm_model, "model.vocab_size": 1000,
        "model.hidden_size": 32, "model.num_heads": 2, "model.intermediate_size": 64,
        "model.num_layers": 2, "data.max_seq_length": 32, "objective.max_predictions_per_seq": 5,
        "batch_size": 8, "num_train_steps": 6, "log_every": 1, "checkpoint_every": 3,
        "eval_every": 0, "data.eval_documents": 4, "eval_batches": 1, "optimizer.warmup_steps": 2,
    }
    values.update(extra)
    return [f"--config.{k}={v}" for k, v in values.items()]


def tiny_config(corpus: str, spm: str, spec: str = "configs/bert.py:size=tiny", **extra):
    """`spec` (configs/bert.py:size=tiny, or a config built on it) with tiny_overrides, for an in-process run (no
    held-out evaluation unless asked: one jit compilation less)."""
    from configs import common
    config = common.load(spec)
    for flag in tiny_overrides(corpus, spm, **{"data.eval_documents": 0, **extra}):
        key, value = flag[len("--config."):].split("=", 1)
        *parents, last = key.split(".")
        target = config
        for name in parents:
            target = target[name]
        old = target[last]
        target[last] = value.lower() == "true" if isinstance(old, bool) else type(old)(value)
    return config


def prepare_tiny_corpus(corpus: str, spm_model: str, directory) -> str:
    """The test corpus through pretrain/tools/prepare_corpus.py's library call, for the tiny BERT's tokenizer."""
    from configs import bert
    from pretrain.data import preparation, sources
    options = dict(bert.get_config("size=tiny").tokenizer, path=spm_model)
    preparation.prepare(lambda: sources.iter_text_documents(corpus), options, str(directory), num_shards=3,
                        eval_documents=4, progress=False)
    return str(directory)
