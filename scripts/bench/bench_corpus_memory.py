"""Peak memory of pretraining on a prepared corpus does not grow with the corpus.

Builds text corpora of the given sizes by repeating the demo corpus's documents in a shuffled order, prepares
each with pretrain.tools.prepare_corpus, then runs the real `python -m pretrain.train` (the tiny BERT,
data.source=prepared) on each for the same number of steps and prints the training process's peak RSS
(getrusage of the child) beside the corpus size. The in-memory pipeline (data.source=text) is run on the
smallest corpus for comparison: it tokenizes the whole corpus into memory.

  python -m scripts.bench.bench_corpus_memory [--sizes_gb 0.1,1] [--steps 20] [--assets demo_out] [--tmp /tmp]
"""
from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from pretrain.data import sources
from scripts.bench.bench_pretrain import demo_assets

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write_corpus(demo_corpus: str, path: str, size_bytes: int, seed: int = 0) -> int:
    """Demo documents repeated in a shuffled order (each pass a new order) until `size_bytes`; -> bytes."""
    documents = ["\n".join(d) + "\n\n" for d in sources.read_text_corpus(demo_corpus)]
    rng, written = random.Random(seed), 0
    with open(path, "w") as f:
        while written < size_bytes:
            rng.shuffle(documents)
            for document in documents:
                f.write(document)
                written += len(document.encode())
                if written >= size_bytes:
                    break
    return written


def run_child(command: list[str]) -> None:
    """Runs `command`; prints its wall seconds and peak RSS (GB). Call it in a fresh interpreter (see peak)."""
    start = time.perf_counter()
    subprocess.run(command, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    print(time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2 ** 20)


def peak(command: list[str]) -> tuple[float, float]:
    """-> (wall seconds, peak RSS in GB) of `command`, run under a fresh interpreter: RUSAGE_CHILDREN's maximum
    covers every child a process ever waited for, so each measurement gets a parent of its own."""
    script = f"from scripts.bench.bench_corpus_memory import run_child; run_child({command!r})"  # cwd: the repo
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, check=True, capture_output=True, text=True).stdout
    wall, rss = out.strip().splitlines()[-1].split()
    return float(wall), float(rss)


def train_command(source: str, corpus: str, spm: str, steps: int, workdir: str) -> list[str]:
    return [sys.executable, "-m", "pretrain.train", "--config=configs/bert.py:size=tiny", f"--workdir={workdir}",
            f"--config.data.source={source}", f"--config.data.path={corpus}", f"--config.tokenizer.path={spm}",
            f"--config.num_train_steps={steps}", "--config.checkpoint_every=0", "--config.data.eval_documents=0"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes_gb", default="0.1,1")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--assets", default="demo_out")
    parser.add_argument("--tmp", default=tempfile.gettempdir())
    args = parser.parse_args()
    demo_corpus, spm = demo_assets(args.assets)
    rows = []
    with tempfile.TemporaryDirectory(dir=args.tmp) as work:
        for i, size in enumerate(float(s) for s in args.sizes_gb.split(",")):
            text = os.path.join(work, f"corpus_{size}gb.txt")
            nbytes = write_corpus(demo_corpus, text, int(size * 2 ** 30))
            if i == 0:  # the in-memory pipeline on the smallest corpus, for comparison
                wall, rss = peak(train_command("text", text, spm, args.steps, os.path.join(work, "text")))
                rows.append(("text (in memory)", nbytes, None, None, wall, rss))
                print(rows[-1], flush=True)
            directory = os.path.join(work, f"prepared_{size}gb")
            prepare = peak([sys.executable, "-m", "pretrain.tools.prepare_corpus", "--input", text, "--tokenizer", spm,
                            "--output", directory, "--num_shards", "16", "--no_progress"])
            os.remove(text)
            train = peak(train_command("prepared", directory, spm, args.steps, os.path.join(work, f"run_{size}")))
            rows.append(("prepared", nbytes, *prepare, *train))
            print(rows[-1], flush=True)
            shutil.rmtree(directory)
    print(f"\n{os.cpu_count()} CPU cores; tiny BERT, {args.steps} steps of pretrain.train")
    print("| data.source | corpus (GB of text) | prepare (s) | prepare peak RSS (GB) | train (s) "
          "| train peak RSS (GB) |")
    print("|---|---|---|---|---|---|")
    for source, nbytes, prep_wall, prep_rss, wall, rss in rows:
        prep = f"{prep_wall:.0f} | {prep_rss:.2f}" if prep_wall is not None else "- | -"
        print(f"| {source} | {nbytes / 2 ** 30:.2f} | {prep} | {wall:.0f} | {rss:.2f} |")


if __name__ == "__main__":
    main()
