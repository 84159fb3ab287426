"""The kill -9 table of docs/training.md: scripts/bench/kill9_harness.py's campaigns for the tiny BERT's
pretraining, its fine-tuning on WNLI, and the same pretraining into a gs:// workdir on a loopback GCS server
(scripts/bench/gcs_server.py), with a workdir per moment under --output:

    python -m scripts.bench.kill9 --moments 50 --gs_moments 10 --output runs/kill9
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

from scripts.bench.kill9_harness import Command, Outcome, campaign, run_reference

TABLE_HEADER = ("| command | moments tried | reruns ended bitwise equal | steps lost at most | temporary files left | "
                "leak warnings |\n|---|---|---|---|---|---|")


def table_row(name: str, outcomes: list[Outcome]) -> str:
    killed = [o for o in outcomes if o.killed]
    inside = sum(o.moment.phase != "anywhere" for o in killed)
    return (f"| {name} | {len(outcomes)} ({len(killed)} killed, {inside} inside a targeted phase) | "
            f"{sum(o.bitwise for o in outcomes)} | {max((o.steps_lost for o in outcomes), default=0)} | "
            f"{sum(len(o.temporary_left) for o in outcomes)} | {sum(len(o.leak_warnings) for o in outcomes)} |")




# ---------------------------------------------------------------------------------------------
# The commands the table tries: the tiny BERT's pretraining, its fine-tuning on WNLI, and the pretraining in a bucket.
# ---------------------------------------------------------------------------------------------
def pretraining(corpus: str, spm_model: str) -> Command:
    """40 steps of a tiny BERT (seconds of training after seconds of compilation), a checkpoint every 10 and a
    held-out evaluation every 20: kills land in each."""
    values = {"data.path": corpus, "tokenizer.path": spm_model, "model.vocab_size": 1000, "model.hidden_size": 32,
              "model.num_heads": 2, "model.intermediate_size": 64, "data.max_seq_length": 32, "batch_size": 8,
              "num_train_steps": 40, "checkpoint_every": 10, "eval_every": 20, "log_every": 5,
              "data.eval_documents": 4, "eval_batches": 1}
    return Command("pretraining", "pretrain.train",
                   ("--config=configs/bert.py:size=tiny", *(f"--config.{k}={v}" for k, v in values.items())))


def fine_tuning(init: str, glue_dir: str) -> Command:
    """WNLI from `init`, 2 epochs of 16 steps, the resume state saved every 8 steps, the dev set evaluated after
    each epoch and the best epoch's checkpoint kept."""
    values = {"init": init, "data.glue_dir": glue_dir, "batch_size": 4, "data.max_train_examples": 64,
              "num_epochs": 2, "data.max_seq_length": 64, "write_test_predictions": False, "log_every": 1,
              "checkpoint_every": 8}
    return Command("fine-tuning", "pretrain.finetune",
                   ("--config=configs/glue.py:task=wnli", *(f"--config.{k}={v}" for k, v in values.items())),
                   resume="resume")


def _assets(output: str) -> tuple[str, str]:
    """The demo's corpus (0.5 MB of it) and a 1,000-piece SentencePiece model, built once under `output`."""
    from pretrain.tools import train_tokenizer
    from pretrain.tools.build_corpus import build_corpus
    corpus, prefix = f"{output}/corpus.txt", f"{output}/spm"
    if not os.path.exists(f"{prefix}.model"):
        build_corpus(corpus, max_mb=0.5)
        train_tokenizer.train_sentencepiece(corpus, prefix, vocab_size=1000)
    return corpus, f"{prefix}.model"


def in_a_bucket(command: Command) -> Command:
    return dataclasses.replace(command, name="gs:// pretraining")


def _campaigns(args) -> list[tuple[str, list[Outcome]]]:
    from scripts.bench.gcs_server import GcsServer
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    corpus, spm_model = _assets(args.output)
    train = pretraining(corpus, spm_model)
    local = run_reference(train, f"{args.output}/pretraining/reference")
    rows = [(train.name, campaign(train, f"{args.output}/pretraining", args.moments, local, args.seed, log))]
    tune = fine_tuning(local.workdir, os.path.abspath(args.glue_dir))
    tuned = run_reference(tune, f"{args.output}/fine-tuning/reference")
    rows.append((tune.name, campaign(tune, f"{args.output}/fine-tuning", args.moments, tuned, args.seed, log)))
    server = GcsServer().start()
    try:
        server.create_bucket("bucket")
        os.environ.update(server.environment)
        bucket = in_a_bucket(train)
        remote = run_reference(bucket, "gs://bucket/kill9/reference")
        if remote.fingerprint != local.fingerprint:
            raise RuntimeError("the gs:// run did not end bitwise where the local run ends")
        rows.append((bucket.name, campaign(bucket, "gs://bucket/kill9", args.gs_moments, remote, args.seed, log)))
    finally:
        server.stop()
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--moments", type=int, default=50, help="kills per command")
    parser.add_argument("--gs_moments", type=int, default=10, help="kills of the pretraining in a gs:// workdir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default="runs/kill9", help="the workdirs (one per moment) and the assets")
    parser.add_argument("--glue_dir", default="../shared/data/glue", help="GLUE in the official layout (WNLI)")
    args = parser.parse_args(argv)
    os.makedirs(args.output, exist_ok=True)
    args.output = os.path.abspath(args.output)
    started = time.monotonic()
    rows = _campaigns(args)
    print(TABLE_HEADER)
    for name, outcomes in rows:
        print(table_row(name, outcomes))
    tried = sum(len(outcomes) for _, outcomes in rows)
    print(f"\n{tried} moments in {(time.monotonic() - started) / 60:.0f} min "
          f"({(time.monotonic() - started) / max(tried, 1):.0f} s each, the references included)")


if __name__ == "__main__":
    main()
