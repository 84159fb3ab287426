"""The TPU fit table (docs/training.md): one `python -m pretrain.tools.aot_compile` run per row, JSON lines
collected in a file, the table printed as Markdown.

  python -m scripts.bench.aot_table --output runs/aot_table.jsonl                 # every row not in the file yet
  python -m scripts.bench.aot_table --output runs/aot_table.jsonl --rows bert     # rows whose name contains "bert"
  python -m scripts.bench.aot_table --output runs/aot_table.jsonl --print_only    # the table from what is there

Run it in a venv with the `tpu` extra (`make test-tpu` builds one at .venv-tpu): each row is a libtpu
compile of the whole train step for a TPU slice, minutes each on a small host. The file is the record: rows
already in it (by name) are not compiled again, so an interrupted table resumes where it stopped; delete a
line to redo its row. A row that does not fit or whose compile fails is recorded too, with what XLA said.
All rows: bf16, scanned layers, `model.remat` as the row says; the mesh is DATA,FSDP,TENSOR.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time

from pretrain.runtime import chips  # (imports no JAX)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclasses.dataclass(frozen=True)
class Row:
    name: str          # the table's first column, and the row's key in the JSON-lines file
    config: str        # --config
    topology: str      # the smallest slice the row is tried on
    mesh: str          # DATA,FSDP,TENSOR
    remat: str
    overrides: tuple[str, ...] = ()

    def command(self) -> list[str]:
        return [sys.executable, "-m", "pretrain.tools.aot_compile", f"--config={self.config}",
                f"--topology={self.topology}", f"--mesh={self.mesh}", "--config.model.dtype=bfloat16",
                "--config.model.scan_layers=True", f"--config.model.remat={self.remat}", *self.overrides]


def _bert(length: int, batch: int = 256) -> tuple[str, ...]:
    # BERT's paper batch, one length for every row (long_seq_length=0: no switch to 512 for the last 10%)
    predictions = () if length == 128 else ("--config.objective.max_predictions_per_seq=80",)
    return (f"--config.batch_size={batch}", f"--config.data.max_seq_length={length}",
            "--config.data.long_seq_length=0", *predictions)


T5_BATCH = ("--config.batch_size=128",)  # T5's pretraining experiments: 128 x 512
GPT2_BATCH = ("--config.batch_size=480",)  # GPT-2's 512 x 1024 rounded to a multiple of the slices' 16 chips
# ModernBERT at BERT's batch (256) and its own first-phase length (1,024, configs/modernbert.py's paper recipe: 30%
# masking, 308 predictions a row); attention "auto": splash, block-sparse over the local layers' window
MODERNBERT_BATCH = ("--config.batch_size=256",)
# and at its context, 8,192 tokens: the same 262,144 tokens a step, 30% of each row masked
MODERNBERT_8K = ("--config.batch_size=32", "--config.data.max_seq_length=8192",
                 f"--config.objective.max_predictions_per_seq={int(0.3 * 8192) + 1}")


def _maxtext(layers: int, d_model: int, d_ff: int, batch: int) -> tuple[str, ...]:
    """MaxText's v5e shapes of October 2023 (its configs/largest_job/*.sh at that commit; docs/training.md): head dim
    256, vocabulary 32,768, 2,048 tokens, no biases, FSDP over a v5e-256. Our GPT ties head dim to d_model / heads,
    so the heads are d_model / 256 (MaxText's attention width is 8,192 or 16,384 whatever d_model)."""
    return (f"--config.model.num_layers={layers}", f"--config.model.d_model={d_model}",
            f"--config.model.num_heads={d_model // 256}", f"--config.model.d_ff={d_ff}",
            "--config.model.vocab_size=32768", "--config.model.n_positions=2048", "--config.model.use_bias=False",
            "--config.data.max_seq_length=2048", f"--config.batch_size={batch}")


ROWS = (
    # FSDP: each chip updates a quarter of the optimizer state (data parallel, 4,1,1: 1 ms a step more by libtpu)
    Row("BERT-Base 256 x 128", "configs/bert.py:size=base", "v5e:2x2", "1,4,1", "minimal", _bert(128)),
    # the papers' attention dropout (0.1 in every config) runs the reference einsum; without it, Pallas
    Row("BERT-Base 256 x 128, Pallas attention, no attention dropout", "configs/bert.py:size=base", "v5e:2x2",
        "1,4,1", "minimal", _bert(128) + ("--config.model.attention=pallas",
                                          "--config.model.attention_dropout_rate=0")),
    # the remat policies between minimal and none (models/stack.py), each where libtpu's estimate says
    Row("BERT-Base 256 x 128, remat minimal_activation", "configs/bert.py:size=base", "v5e:2x2", "1,4,1",
        "minimal_activation", _bert(128)),
    Row("BERT-Base 256 x 128, remat dots", "configs/bert.py:size=base", "v5e:2x2", "1,4,1", "dots", _bert(128)),
    Row("BERT-Base 256 x 128, splash attention, no attention dropout, remat minimal_activation",
        "configs/bert.py:size=base", "v5e:2x2", "1,4,1", "minimal_activation",
        _bert(128) + ("--config.model.attention=splash", "--config.model.attention_dropout_rate=0")),
    Row("BERT-Base 256 x 512", "configs/bert.py:size=base", "v5e:2x2", "1,4,1", "full", _bert(512)),
    Row("BERT-Large 256 x 128", "configs/bert.py:size=large", "v5e:2x2", "1,4,1", "full", _bert(128)),
    Row("BERT-Large 256 x 128, remat minimal_activation", "configs/bert.py:size=large", "v5e:2x2", "1,4,1",
        "minimal_activation", _bert(128)),
    Row("BERT-Large 256 x 512", "configs/bert.py:size=large", "v5e:2x2", "1,4,1", "full", _bert(512)),
    Row("ModernBERT-base 256 x 1024", "configs/modernbert.py:size=base", "v5e:2x2", "1,4,1", "full",
        MODERNBERT_BATCH),
    # the other kernels beside splash: Pallas' flash (the window as its additive input), XLA's (a dense band)
    Row("ModernBERT-base 256 x 1024, Pallas flash attention", "configs/modernbert.py:size=base", "v5e:2x2", "1,4,1",
        "full", MODERNBERT_BATCH + ("--config.model.attention=pallas",)),
    Row("ModernBERT-base 256 x 1024, XLA attention", "configs/modernbert.py:size=base", "v5e:2x2", "1,4,1", "full",
        MODERNBERT_BATCH + ("--config.model.attention=xla",)),
    Row("ModernBERT-base 256 x 1024, remat minimal_activation", "configs/modernbert.py:size=base", "v5e:2x2", "1,4,1",
        "minimal_activation", MODERNBERT_BATCH + ("--config.grad_accum_steps=4",)),
    Row("ModernBERT-base 32 x 8192", "configs/modernbert.py:size=base", "v5e:2x2", "1,4,1", "full", MODERNBERT_8K),
    Row("ModernBERT-base 32 x 8192, Pallas flash attention", "configs/modernbert.py:size=base", "v5e:2x2", "1,4,1",
        "full", MODERNBERT_8K + ("--config.model.attention=pallas",)),
    # without accumulation: 18.53 GiB per chip, does not fit (2026-11-28)
    Row("ModernBERT-large 256 x 1024", "configs/modernbert.py:size=large", "v5e:2x2", "1,4,1", "full",
        MODERNBERT_BATCH + ("--config.grad_accum_steps=2",)),
    Row("T5-Small (1.0) 128 x 512", "configs/t5.py:size=small", "v5e:2x2", "1,4,1", "minimal", T5_BATCH),
    Row("T5-Base (1.0) 128 x 512", "configs/t5.py:size=base", "v5e:2x2", "1,4,1", "full", T5_BATCH),
    Row("T5-Base (1.0) 2048 x 512, the released models' batch", "configs/t5.py:size=base", "v5e:2x2", "1,4,1",
        "full", ("--config.batch_size=2048", "--config.grad_accum_steps=16")),
    Row("T5-Large (1.0) 128 x 512", "configs/t5.py:size=large", "v5e:2x2", "1,4,1", "full", T5_BATCH),
    Row("T5-3B (1.0) 128 x 512", "configs/t5.py:size=3b", "v5e:4x4", "1,16,1", "full", T5_BATCH),
    Row("T5-11B (1.0) 128 x 512", "configs/t5.py:size=11b", "v5p:2x2x2", "1,8,1", "full", T5_BATCH),
    Row("T5 1.1-XL 128 x 512", "configs/t5.py:size=xl,version=1.1", "v5e:2x4", "1,8,1", "full", T5_BATCH),
    Row("T5 1.1-XXL 128 x 512", "configs/t5.py:size=xxl,version=1.1", "v5p:2x2x1", "1,4,1", "full", T5_BATCH),
    Row("GPT-2 small 480 x 1024", "configs/gpt2.py:size=small", "v5e:2x2", "1,4,1", "full",
        GPT2_BATCH + ("--config.grad_accum_steps=4",)),
    Row("GPT-2 small 480 x 1024, remat minimal_activation", "configs/gpt2.py:size=small", "v5e:2x2", "1,4,1",
        "minimal_activation", GPT2_BATCH + ("--config.grad_accum_steps=8",)),
    Row("GPT-2 medium 480 x 1024", "configs/gpt2.py:size=medium", "v5e:2x4", "1,8,1", "full",
        GPT2_BATCH + ("--config.grad_accum_steps=2",)),
    Row("GPT-2 large 480 x 1024", "configs/gpt2.py:size=large", "v5e:4x4", "1,16,1", "full",
        GPT2_BATCH + ("--config.grad_accum_steps=2",)),
    Row("GPT-2 XL 480 x 1024", "configs/gpt2.py:size=xl", "v5p:2x2x1", "1,4,1", "full",
        GPT2_BATCH + ("--config.grad_accum_steps=2",)),
    # the estimator's calibration against MaxText's measured MFU on v5e-256 (docs/training.md)
    Row("GPT at MaxText 16B's shape, 1536 x 2048", "configs/gpt2.py:size=small", "v5e:16x16", "1,256,1", "full",
        _maxtext(32, 5120, 32768, 1536)),
    Row("GPT at MaxText 32B's shape, 1024 x 2048", "configs/gpt2.py:size=small", "v5e:16x16", "1,256,1", "full",
        _maxtext(32, 10240, 32768, 1024)),
    Row("GPT at MaxText 64B's shape, 512 x 2048", "configs/gpt2.py:size=small", "v5e:16x16", "1,256,1", "full",
        _maxtext(64, 10240, 32768, 512)),
)


def run_row(row: Row, timeout_s: float) -> dict:
    """One compile: its JSON line (or the failure) with the command that made it."""
    start = time.perf_counter()
    try:
        proc = subprocess.run(row.command(), cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        result = json.loads(lines[-1]) if lines else None
        failure = None if result else _failure(proc.stderr, proc.returncode)
    except subprocess.TimeoutExpired:
        result, failure = None, f"compile did not finish within {timeout_s:.0f} s"
    return {"name": row.name, "command": " ".join(["python"] + row.command()[1:]).replace(REPO + "/", ""),
            "wall_seconds": round(time.perf_counter() - start, 1), "result": result, "failure": failure}


def _failure(stderr: str, returncode: int) -> str:
    """The line that says why a compile gave no JSON: a crash's, the script's own error line, or the last."""
    lines = stderr.strip().splitlines()
    for line in lines:
        if line.startswith(("Fatal Python error", "error:")):
            return f"{line} (exit {returncode})"
    return f"{lines[-1] if lines else 'no output'} (exit {returncode})"


def rows_to_compile(pattern: str, done: dict[str, dict]) -> list[Row]:
    """ROWS whose name contains pattern (case-insensitive) and that have no record yet."""
    return [row for row in ROWS if pattern.lower() in row.name.lower() and row.name not in done]


def read_records(path: str) -> dict[str, dict]:
    """{row name: its newest record} from the JSON-lines file (none if it does not exist)."""
    records = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.strip():
                    record = json.loads(line)
                    records[record["name"]] = record
    return records


def _gib(n: float | None) -> str:
    return "?" if n is None else f"{n / 2 ** 30:.2f}"


def _roofline(r: dict) -> str:
    """The roofline estimate and its MFU (the table's estimate before libtpu's per-kernel cycles were read)."""
    seconds = r.get("roofline_seconds")
    utilization = chips.mfu(r["model_flops"], seconds, r["devices"], r.get("peak_flops_per_device"))
    return "–" if utilization is None else f"{seconds:.3f}, {100 * utilization:.0f}%"


def markdown(records: dict[str, dict]) -> str:
    """The table, rows in ROWS' order, then any other recorded row."""
    names = [row.name for row in ROWS if row.name in records] + [n for n in records if n not in
                                                                 {row.name for row in ROWS}]
    lines = ["| model, batch | slice (chips), mesh, remat | GiB per chip (step / HBM) | fits | model TFLOP / step "
             "(attention over every pair) | est. step s, MFU (every pair) | HBM GiB moved / step | roofline s, MFU | "
             "compile s (init / step) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in names:
        record, r = records[name], records[name]["result"]
        if r is None:
            lines.append(f"| {name} | | | failed | | | | | {record['failure']} |")
            continue
        accum = f", accumulation {r['grad_accum_steps']}" if r["grad_accum_steps"] > 1 else ""
        mesh = ",".join(str(r["mesh"][axis]) for axis in ("data", "fsdp", "tensor"))
        step = "–" if r["step_seconds"] is None else f"{r['step_seconds']:.3f} ({r['step_seconds_source']})"
        mfu = "" if r["mfu"] is None else f", {100 * r['mfu']:.1f}%"
        every = r.get("model_flops_every_pair") or r["model_flops"]
        flops = f"{r['model_flops'] / 1e12:.1f}"
        if every > 1.0005 * r["model_flops"]:  # the masks drop attention: the count over every pair beside it
            flops += f" ({every / 1e12:.1f})"
            mfu += "" if r["mfu"] is None else f" ({100 * r['mfu'] * every / r['model_flops']:.1f}%)"
        fits = "yes" if r["fits"] else f"**no**{': ' + r['error'] if r.get('error') else ''}"
        compile_s = f"{r['init_compile_seconds']:.0f} / {r['step_compile_seconds']:.0f}" \
            if r.get("step_compile_seconds") is not None else "–"
        lines.append(f"| {name}{accum} ({r['params'] / 1e6:,.0f}M) | {r['topology']} ({r['devices']}), {mesh}, "
                     f"{r['remat']} | {_gib(r['total_bytes'])} / {r['hbm_gib']:.0f} | {fits} | "
                     f"{flops} | {step}{mfu} | {_gib(r.get('moved_bytes'))} | "
                     f"{_roofline(r)} | {compile_s} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default="runs/aot_table.jsonl", help="the JSON-lines record (appended to)")
    parser.add_argument("--rows", default="", help="only rows whose name contains this (case-insensitive)")
    parser.add_argument("--timeout_s", type=float, default=3600.0, help="per row")
    parser.add_argument("--print_only", action="store_true", help="compile nothing; print the table")
    args = parser.parse_args()
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    done = read_records(args.output)
    todo = rows_to_compile(args.rows, done)
    for i, row in enumerate([] if args.print_only else todo, 1):
        print(f"[{i}/{len(todo)}] {row.name}: {' '.join(row.command()[1:])}", file=sys.stderr, flush=True)
        record = run_row(row, args.timeout_s)
        with open(args.output, "a") as f:
            f.write(json.dumps(record) + "\n")
        done[row.name] = record
    print(markdown(done))


if __name__ == "__main__":
    main()
