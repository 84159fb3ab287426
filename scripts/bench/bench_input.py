"""Input pipeline throughput: instances per second per host, streaming (Grain) vs the in-memory pipeline.

Both sides build the same objectives' batches from the same tokenized demo corpus: the in-memory pipeline
of revision e9c2436 (`pipeline.PretrainingData`: every epoch's instances made up front, then sliced), read
here from git, and `pretrain.data.streaming` over the prepared ArrayRecord corpus (or the in-memory list
with --source=memory) with 0 (in-process), 1, 2 and all Grain worker processes. Each side delivers batches
of `--batch_size` for `--seconds` after its first batch; the table gives instances/s and the ratio to the
2,500 BERT sequences/s an H100 consumes at 256 x 128 in bf16 (one step in well under 0.1 s).

  python -m scripts.bench.bench_input [--assets demo_out] [--seconds 10] [--cases bert128,bert512,t5,gpt1024]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import tempfile
import time

from absl import flags

from configs import bert as bert_configs
from configs import gpt2 as gpt_configs
from configs import t5 as t5_configs
from objectives import build_objective
from pretrain.data import preparation, prepared, sources, streaming, tokenizers
from scripts.bench.bench_pretrain import demo_assets

REFERENCE_REVISION = "e9c2436"   # the last revision with the in-memory PretrainingData
ACCELERATOR_NEEDS = 2500          # BERT-Base sequences/s one H100 consumes (256 x 128 bf16, < 0.1 s/step)

# case -> (config module, config arg, sequence length, tokenizer extra ids)
CASES = {
    "bert128": (bert_configs, "size=base", 128, 0),
    "bert512": (bert_configs, "size=base", 512, 0),
    "t5": (t5_configs, "size=base", 512, 100),
    "gpt1024": (gpt_configs, "size=small", 1024, 0),
}


def in_memory_pipeline():
    """pretrain/data/pipeline.py as of REFERENCE_REVISION, imported from git (the peer)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    source = subprocess.run(["git", "-C", root, "show", f"{REFERENCE_REVISION}:pretrain/data/pipeline.py"],
                            check=True, capture_output=True, text=True).stdout
    spec = importlib.util.spec_from_loader("reference_pipeline", loader=None)
    module = importlib.util.module_from_spec(spec)
    exec(compile(source, f"{REFERENCE_REVISION}:pretrain/data/pipeline.py", "exec"), module.__dict__)
    return module


def case_objective(name: str, spm: str):
    module, arg, seq_length, extra_ids = CASES[name]
    config = module.get_config(arg)
    tokenizer = tokenizers.load_tokenizer("sentencepiece", spm, lowercase=True, extra_ids=extra_ids)
    objective = build_objective(config.objective, tokenizer)
    if name == "bert512":
        objective = objective.for_long_phase()  # BERT's 512 phase masks up to 80 positions
    return objective, tokenizer, seq_length


def timed_batches(next_batch, batch_size: int, seconds: float) -> tuple[float, float]:
    """-> (seconds to the first batch, instances/s over the following `seconds`)."""
    start = time.perf_counter()
    next_batch()
    first = time.perf_counter() - start
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        next_batch()
        n += 1
    return first, n * batch_size / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--assets", default="demo_out", help="where the demo corpus/tokenizer are (built if absent)")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--source", default="prepared", choices=["prepared", "memory"])
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--workers", default=f"0,1,2,{os.cpu_count()}")
    args = parser.parse_args()
    flags.FLAGS.mark_as_parsed()  # Grain reads absl flags

    corpus, spm = demo_assets(args.assets)
    reference = in_memory_pipeline()
    workers = sorted({int(w) for w in args.workers.split(",")})
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.cases.split(","):
            objective, tokenizer, seq_length = case_objective(name, spm)
            documents = sources.tokenize_documents(sources.read_text_corpus(corpus), tokenizer)
            if args.source == "prepared":
                directory = os.path.join(tmp, name)
                options = {"kind": "sentencepiece", "path": spm, "lowercase": True, "extra_ids": CASES[name][3]}
                preparation.prepare(lambda: sources.iter_text_documents(corpus), options, directory,
                                    num_shards=4, workers=os.cpu_count() or 1, progress=False)
                streamed = prepared.PreparedCorpus.open(directory, "train", tokenizer=tokenizer)
            else:
                streamed = documents
            peer = reference.PretrainingData(documents, objective, batch_size=args.batch_size, seed=0,
                                             max_seq_length=seq_length)
            step = iter(range(10 ** 9))
            first, rate = timed_batches(lambda: peer.batch(next(step)), args.batch_size, args.seconds)
            rows.append((name, "in-memory (e9c2436)", "-", first, rate))
            print(rows[-1], flush=True)
            for w in workers:
                data = streaming.StreamingData(streamed, objective, batch_size=args.batch_size, seed=0,
                                               max_seq_length=seq_length, workers=w)
                iterator = data.iterate(0)
                first, rate = timed_batches(lambda: next(iterator), args.batch_size, args.seconds)
                data.close()
                rows.append((name, f"streaming ({args.source})", w, first, rate))
                print(rows[-1], flush=True)

    print(f"\n{os.cpu_count()} CPU cores; batch {args.batch_size}; {args.seconds:.0f} s per cell after the first batch")
    print("| case | pipeline | workers | first batch (s) | instances/s | x in-memory | x 2,500/s |")
    print("|---|---|---|---|---|---|---|")
    base = {}
    for name, pipe, w, first, rate in rows:
        base.setdefault(name, rate)
        print(f"| {name} | {pipe} | {w} | {first:.2f} | {rate:,.0f} | {rate / base[name]:.2f} | "
              f"{rate / ACCELERATOR_NEEDS:.2f} |")


if __name__ == "__main__":
    main()
