r"""What a wall-clock budget of pretraining buys on GLUE: our budgeted BERT (scripts/reproduce/cram.py), the same
recipe in Hugging Face transformers on PyTorch for the same minutes, and random weights of the same architecture.

  python -m scripts.reproduce.cram --minutes=60 --output=runs/cram                  # ours, first
  python -m scripts.bench.bench_cram --ours=runs/cram --output=runs/bench_cram  # the peer, then GLUE (resumable)
  python -m scripts.bench.bench_cram --ours=runs/cram --output=runs/bench_cram --no_peer   # pretrained vs random only

1. The peer (skipped with --no_peer): `BertForPreTraining` with the architecture, dropout, optimizer and
   warm-up share of DIR/bert/config.json, trained on the same corpus, tokenizer, masking and batches (the
   stream pretrain.train reads, pretrain/loops/pretraining.training_data) for the same minutes, its steps fitted
   to the budget by its own measured step time as cram.py does for ours. Saved with `save_pretrained` in
   OUTPUT/peer/ beside the SentencePiece model; OUTPUT/peer/cram.json has its steps and held-out MLM metrics.
2. GLUE dev: every init (ours, the peer, `--config.init_weights=random` of ours) fine-tuned by
   pretrain.finetune over the tasks and seeds with one recipe (scripts/reproduce/glue_study.py): only the pretraining
   differs between the rows.
3. The tables: per task mean ± std over seeds, the average over the counted tasks (WNLI is reported, not
   counted, as in the BERT paper), pretrained - random per task, and steps and held-out MLM of each side.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import time

from scripts.reproduce import glue_study
from scripts.reproduce import reproduction as rp

TIMING_STEPS = 20  # the peer's step time, after 3 untimed steps


def torch_batches(data, steps: int, config):
    """The first `steps` batches of a pretraining stream (pretraining.training_data), as the peer of `config`'s
    family takes them."""
    from scripts.bench import torch_bert
    nsp, token_types = config.objective.next_sentence, config.model.name != "modernbert"
    return (torch_bert.inputs(b, nsp, token_types) for _, (_, b, _) in zip(range(steps), data.iterate(0)))


def ours_workdir(ours: str) -> str:
    """The pretrain.train workdir of a cram.py output directory (DIR/bert, DIR/modernbert, ...)."""
    with open(os.path.join(ours, "cram.json")) as f:
        return json.load(f).get("workdir") or os.path.join(ours, "bert")


def time_peer_steps(config, train_data) -> float:
    """Seconds per step of the peer on this machine, the median after 3 untimed steps (a throwaway model; its time
    counts in the budget, as our timing run's does)."""
    from scripts.bench import torch_bert
    model = torch_bert.build_model(config.model)
    optimizer, scheduler = torch_bert.build_optimizer(model, config.optimizer, TIMING_STEPS + 3)
    times = []
    for batch in torch_batches(train_data, TIMING_STEPS + 3, config):
        start = time.perf_counter()
        torch_bert.train_step(model, optimizer, scheduler, batch, config.optimizer.grad_clip_norm)
        times.append(time.perf_counter() - start)
    return sorted(times[3:])[len(times[3:]) // 2]


def pretrain_peer(ours: str, output: str, threads: int) -> dict:
    """Trains the peer for the minutes our run had; -> its record (also OUTPUT/peer/cram.json)."""
    import ml_collections
    import torch
    import transformers

    from pretrain.data import tokenizers
    from pretrain.loops import budget, pretraining
    from scripts.bench import torch_bert
    torch.set_num_threads(threads)
    with open(os.path.join(ours, "cram.json")) as f:
        ours_record = json.load(f)
    with open(os.path.join(ours_workdir(ours), "config.json")) as f:
        config = ml_collections.ConfigDict(json.load(f))
    started = time.time()
    _, train_data, eval_data = pretraining.training_data(config)
    if ours_record["minutes"]:  # equal minutes: the steps that the peer's own step time fits
        deadline = started + 60 * ours_record["minutes"]
        timed = time_peer_steps(config, train_data)
        steps = budget.plan_steps(deadline - time.time(), timed, setup=0.0)
    else:  # ours ran --steps=N: equal steps
        deadline, timed, steps = None, None, ours_record["planned_steps"]
    config = budget.stretch(config, steps)  # our schedule's shape (warm-up share, decay) over the peer's steps
    model = torch_bert.build_model(config.model, tokenizers.from_config(config.tokenizer).pad_id, config.seed)
    optimizer, scheduler = torch_bert.build_optimizer(model, config.optimizer, steps)
    reached, losses, training_started = 0, [], time.time()
    for batch in torch_batches(train_data, steps, config):
        losses.append(torch_bert.train_step(model, optimizer, scheduler, batch, config.optimizer.grad_clip_norm))
        reached += 1
        if deadline is not None and time.time() >= deadline:
            break
    step_time = (time.time() - training_started) / reached
    train_data.close()
    held_out = list(torch_batches(eval_data, config.eval_batches, config))  # at config.objective.eval_mask_prob
    eval_data.close()
    directory = os.path.join(output, "peer")
    model.save_pretrained(directory, safe_serialization=True)
    shutil.copy(config.tokenizer.path, os.path.join(directory, "spm.model"))
    record = dict(minutes=ours_record["minutes"], timed_step_sec=timed, step_time_sec=step_time, planned_steps=steps,
                  reached_steps=reached,
                  pretraining_sec=time.time() - started, train_loss_last_20=sum(losses[-20:]) / len(losses[-20:]),
                  eval=torch_bert.evaluate(model, held_out), threads=threads,
                  versions=dict(torch=torch.__version__, transformers=transformers.__version__))
    with open(os.path.join(directory, "cram.json"), "w") as f:
        json.dump(record, f, indent=1)
    print(f"Peer: {reached:,} of {steps:,} steps ({step_time:.3f} s/step) in {record['pretraining_sec'] / 60:.1f} min; "
          f"held-out MLM loss {record['eval']['mlm_loss']:.3f}, accuracy {record['eval']['mlm_accuracy']:.3f}",
          flush=True)
    return record


def pretraining_rows(ours: str, peer: str | None) -> list[list[str]]:
    """Steps and held-out MLM of each side."""
    with open(os.path.join(ours, "cram.json")) as f:
        record = json.load(f)
    held_out = record.get("eval", {})  # none where the run held no documents out
    loss, accuracy = (held_out.get(k, float("nan")) for k in ("eval_mlm_loss", "eval_mlm_accuracy"))
    rows = [["ours (JAX/Flax)", f"{record['reached_steps']:,}", f"{record['step_time_sec']:.3f}",
             f"{loss:.3f}", f"{accuracy:.3f}"]]
    if peer:
        with open(os.path.join(peer, "cram.json")) as f:
            record = json.load(f)
        rows.append(["peer (PyTorch/transformers)", f"{record['reached_steps']:,}", f"{record['step_time_sec']:.3f}",
                     f"{record['eval']['mlm_loss']:.3f}", f"{record['eval']['mlm_accuracy']:.3f}"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ours", required=True, help="a scripts/reproduce/cram.py output directory")
    parser.add_argument("--no_peer", action="store_true", help="ours and random init only")
    glue_study.add_flags(parser, "runs/bench_cram")
    args = parser.parse_args()
    ours = os.path.abspath(args.ours)
    output = os.path.abspath(args.output)
    os.makedirs(output, exist_ok=True)
    peer = None if args.no_peer else os.path.join(output, "peer")
    if peer and not os.path.exists(os.path.join(peer, "cram.json")):
        pretrain_peer(ours, output, threads=os.cpu_count() or 1)

    inits = {"pretrained": [f"--config.init={ours}/bert"],
             "random": [f"--config.init={ours}/bert", "--config.init_weights=random"]}
    if peer:
        inits["peer"] = [f"--config.init={peer}", "--config.tokenizer.kind=sentencepiece",
                         f"--config.tokenizer.path={peer}/spm.model"]
    study = glue_study.GlueStudy(args, inits, settings=[ours])
    scores = study.run()
    print("\nPretraining (same corpus, tokenizer, masking, batches and minutes):\n")
    print(rp.markdown(["side", "steps", "s / step", "held-out MLM loss", "held-out MLM accuracy"],
                      pretraining_rows(ours, peer)))
    print("\n" + study.table(scores))
    print("\n" + study.footer())


if __name__ == "__main__":
    main()
