r"""Builds the offline English pretraining corpus: every source that installs here without network.

  python -m pretrain.tools.build_corpus --output DIR/corpus.txt \
      [--sources cpython wordnet fortunes shakespeare glue] [--glue_dir ../shared/data/glue] [--max_mb 0] \
      [--repeat glue=8]

The sources (pretrain/tools/corpus_sources.py) in the order given: CPython's documentation, WordNet's glosses and
examples, the BSD fortune files, tinyshakespeare and the GLUE tasks' training sentences (no labels). Every
sentence is compared lowercased with single spaces: one seen before is dropped (deduplication), and so is one
equal to any dev or test sentence of the GLUE tasks in --glue_dir, whatever its source. Output is BERT's
pretraining text format: one sentence per line, a blank line between documents; the same inputs give the same
file. `--repeat SOURCE=N` writes a source's documents N times, before the other sources (so that the
held-out documents, the file's last, have no copy in training). The last line printed is the statistics line,
per source and in all (DIR/corpus.json has them too).
"""
from __future__ import annotations

from pretrain.runtime import stops

if __name__ == "__main__":  # first, before the imports below: from here on a signal is one line and an exit status
    stops.answer_from_start()

import argparse
import json
import os
import sys

from pretrain.tools import corpus_sources

# The checkout's root: the defaults read the shared data beside it (../shared/data), as the Makefile does.
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SOURCES = ("cpython", "wordnet", "fortunes", "shakespeare", "glue")
SHAKESPEARE = os.path.join(REPO, "..", "shared", "data", "tinyshakespeare", "input.txt")
GLUE_DIR = os.path.join(REPO, "..", "shared", "data", "glue")


def source_documents(name: str, glue_dir: str, shakespeare: str, cache: str):
    if name == "cpython":
        return corpus_sources.cpython_documents()
    if name == "wordnet":
        return corpus_sources.wordnet_documents(cache)
    if name == "fortunes":
        return corpus_sources.fortunes_documents()
    if name == "shakespeare":
        return corpus_sources.shakespeare_documents(shakespeare)
    if name == "glue":
        return corpus_sources.glue_documents(glue_dir)
    raise ValueError(f"unknown corpus source {name!r} (the sources are {', '.join(SOURCES)})")


def _documents(name: str, glue_dir: str, shakespeare: str, cache: str, held_out: set[str], seen: set[str],
               stats: dict):
    """A source's documents without held-out and already seen sentences (counted in `stats`); empty ones go."""
    for document in source_documents(name, glue_dir, shakespeare, cache):
        kept = []
        for sentence in document:
            key = corpus_sources.normalized(sentence)
            if key in held_out:
                stats["held_out_dropped"] += 1
            elif key in seen:
                stats["duplicates_dropped"] += 1
            else:
                seen.add(key)
                kept.append(sentence)
        if kept:
            yield kept


def writing_order(sources: tuple[str, ...], repeats: dict[str, int]) -> list[str]:
    """Repeated sources first: the held-out documents are the corpus's last (pretrain.train's
    data.eval_documents), and none of them may have a copy in training."""
    unknown = sorted(set(repeats) - set(sources))
    if unknown:
        raise ValueError(f"--repeat names {', '.join(unknown)}, which is not among --sources {' '.join(sources)}")
    if sources and all(name in repeats for name in sources):
        raise ValueError("--repeat: leave at least one source unrepeated (the held-out documents come from the "
                         "last one)")
    return [name for name in sources if name in repeats] + [name for name in sources if name not in repeats]


def build_corpus(output_path: str, sources: tuple[str, ...] = ("cpython",), max_mb: float = 0.0,
                 glue_dir: str = GLUE_DIR, shakespeare: str = SHAKESPEARE, cache: str = "",
                 repeats: dict[str, int] | None = None) -> dict:
    """Writes the corpus; stops before it would pass `max_mb` MB (0: no limit). `repeats` {source: N} writes
    that source's documents N times (task-adaptive pretraining's extra epochs on the task text, Gururangan et
    al. 2020). Returns the statistics, copies included."""
    repeats = repeats or {}
    budget = int(max_mb * 1e6) or None
    held_out = corpus_sources.glue_held_out(glue_dir) if os.path.isdir(glue_dir) else set()
    seen: set[str] = set()
    stats = {"documents": 0, "sentences": 0, "bytes": 0, "duplicates_dropped": 0, "held_out_dropped": 0,
             "sources": {}}
    os.makedirs(os.path.dirname(os.path.abspath(output_path)), exist_ok=True)
    cache = cache or os.path.join(os.path.dirname(os.path.abspath(output_path)), "sources")
    with open(output_path, "w", encoding="utf-8") as f:
        for name in writing_order(tuple(sources), repeats):
            part = stats["sources"][name] = {"documents": 0, "sentences": 0, "bytes": 0,
                                             "copies": repeats.get(name, 1)}
            documents = _documents(name, glue_dir, shakespeare, cache, held_out, seen, stats)
            if name in repeats:
                documents = list(documents) * repeats[name]
            for kept in documents:
                chunk = ("\n" if stats["documents"] else "") + "\n".join(kept) + "\n"
                size = len(chunk.encode("utf-8"))
                if budget is not None and stats["bytes"] + size > budget:
                    stats["full"] = True
                    break
                f.write(chunk)
                for counts in (stats, part):
                    counts["documents"] += 1
                    counts["sentences"] += len(kept)
                    counts["bytes"] += size
            if stats.pop("full", False):
                break
    stats["mb"] = stats["bytes"] / 1e6
    stats["path"] = output_path
    return stats


def _copies(source_stats: dict) -> str:
    copies = source_stats.get("copies", 1)
    return f" (x{copies})" if copies > 1 else ""


def parse_repeats(items: list[str]) -> dict[str, int]:
    """['glue=8'] -> {'glue': 8}."""
    repeats = {}
    for item in items:
        name, _, count = item.partition("=")
        if name not in SOURCES or not count.isdigit() or int(count) < 1:
            raise ValueError(f"--repeat {item}: write it as SOURCE=N, a source of {', '.join(SOURCES)} and N >= 1")
        repeats[name] = int(count)
    return repeats


def statistics_line(stats: dict) -> str:
    parts = [f"{name}{_copies(s)} {s['documents']:,} docs / {s['sentences']:,} sentences / "
             f"{s['bytes'] / 1e6:.2f} MB" for name, s in stats["sources"].items()]
    return (f"corpus {stats['path']}: {stats['documents']:,} documents, {stats['sentences']:,} sentences, "
            f"{stats['mb']:.2f} MB ({'; '.join(parts)}); dropped {stats['duplicates_dropped']:,} duplicate and "
            f"{stats['held_out_dropped']:,} GLUE dev/test sentences")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", required=True, help="text file to write")
    parser.add_argument("--sources", nargs="+", choices=SOURCES, default=list(SOURCES))
    parser.add_argument("--glue_dir", default=GLUE_DIR, help="GLUE in the official layout: its training sentences "
                        "are a source, its dev and test sentences are kept out")
    parser.add_argument("--shakespeare", default=SHAKESPEARE, help="tinyshakespeare's input.txt")
    parser.add_argument("--max_mb", type=float, default=0.0, help="stop before this size (0: every source whole)")
    parser.add_argument("--cache", default="", help="where a fetched Debian package is unpacked "
                        "(default: beside --output, in sources/)")
    parser.add_argument("--repeat", action="append", default=[], metavar="SOURCE=N",
                        help="write that source N times (written first, so no held-out document has a copy)")
    args = parser.parse_args(argv)
    try:
        stats = build_corpus(args.output, tuple(args.sources), args.max_mb, args.glue_dir, args.shakespeare,
                             args.cache, parse_repeats(args.repeat))
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with open(os.path.splitext(args.output)[0] + ".json", "w") as f:
        json.dump(stats, f, indent=1)
    print(statistics_line(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
