"""Bad input at every entry point: one line, a non-zero exit, and a workdir left byte for byte as it was.

Each case runs the real command (`python -m pretrain.<entry> ...`) on copies of three finished workdirs
(a tiny BERT pretraining run, an MRPC fine-tuning run from it, a tiny GPT run) and asserts the exit
status, that stderr is exactly one line matching the case's pattern, and that no file of the workdirs
changed. The cases run three at a time in one fixture, each a process forked from one that imported JAX
once (tests/helpers/command_server.py); most fail before anything is compiled.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys

import pytest

from tests.helpers.commands import run_module, subprocess_env
from tests.helpers.paths import REPO, SHARED_DATA
from tests.helpers.tiny_bert import tiny_overrides

GLUE = os.path.join(SHARED_DATA, "glue")
SHAKESPEARE = os.path.join(SHARED_DATA, "tinyshakespeare", "input.txt")
BERT = "configs/bert.py:size=tiny"
MRPC = "configs/glue.py:task=mrpc"
pytestmark = pytest.mark.slow  # every case is a real command

FT_SMALL = ["--config.data.max_train_examples=32", "--config.num_epochs=1", "--config.data.max_seq_length=32",
            f"--config.data.glue_dir={GLUE}", "--config.write_test_predictions=false"]


def train(*extra: str, workdir: str = "{bert}") -> list[str]:
    return ["pretrain.train", f"--config={BERT}", f"--workdir={workdir}", "{tiny}", *extra]


def finetune(*extra: str, workdir: str = "{fresh}") -> list[str]:
    return ["pretrain.finetune", f"--config={MRPC}", f"--workdir={workdir}", "--config.init={bert}", *FT_SMALL,
            *extra]


def token_task(config: str, folder: str, *extra: str) -> list[str]:
    """pretrain.finetune of a tagging or QA config on one of the broken folders that `workdirs` writes."""
    return ["pretrain.finetune", f"--config={config}", "--workdir={fresh}", "--config.init={bert}",
            f"--config.data.dir={{tasks}}/{folder}", "--config.num_epochs=1", "--config.data.max_seq_length=64",
            *extra]


CONLL_TRAIN = "Kalmo NNP B-NP B-PER\nvisited NN O O\nTesvar NNP B-NP B-LOC\n\nAcme NNP B-NP B-ORG\nrose NN O O\n"
SQUAD = {"data": [{"paragraphs": [{"context": "Kalmo visited Tesvar.", "qas": [
    {"id": "q1", "question": "Where?", "answers": [{"text": "Tesvar", "answer_start": 14}]}]}]}]}
TOKEN_TASK_FILES = {  # folder -> {file: text}
    "conll_columns": {"train.txt": CONLL_TRAIN + "Acme NNP B-ORG\n"},
    "conll_scheme": {"train.txt": CONLL_TRAIN.replace("B-PER", "X-PER")},
    "conll_empty_dev": {"train.txt": CONLL_TRAIN, "valid.txt": "-DOCSTART- -X- -X- O\n\n"},
    "squad_offset": {"train-v1.1.json": json.dumps(SQUAD, indent=1).replace('"answer_start": 14', '"answer_start": 3')},
    "squad_empty_dev": {"train-v1.1.json": json.dumps(SQUAD), "dev-v1.1.json": json.dumps({"data": []})},
}


# id: (command, exit status, pattern of the one stderr line; None = exit 0 with stdout checked instead)
CASES = {
    # ----- pretrain.train: the config file and flags -----
    "train/config file missing": (["pretrain.train", "--config=configs/nope.py", "--workdir={bert}"], 2,
                                  r"--config: .*No such file.*nope\.py"),
    "train/config argument unknown": (["pretrain.train", "--config=configs/bert.py:size=huge", "--workdir={bert}"],
                                      2, r"size='huge' is not one of"),
    "train/unknown key": (train("--config.foo=1"), 2, r"unknown config key --config\.foo"),
    "train/value of the wrong type": (train("--config.batch_size=x"), 2, r"--config\.batch_size"),
    "train/ELECTRA generator wider than its discriminator": (
        ["pretrain.train", "--config=configs/electra.py:size=tiny", "--workdir={fresh}", "{tiny}",
         "--config.model.generator_hidden_size=256", "--config.model.generator_num_heads=2"], 2,
        r"generator_hidden_size=256 is wider than the discriminator's hidden_size=32"),
    "train/no workdir": (["pretrain.train", f"--config={BERT}"], 2, r"--workdir is required"),
    "train/positional argument": (train("extra"), 2, r"unexpected arguments \['extra'\]"),
    # ----- pretrain.train: values out of range, each naming the key -----
    "train/batch_size 0": (train("--config.batch_size=0"), 2, r"config\.batch_size=0 is invalid: .*positive"),
    "train/batch_size negative": (train("--config.batch_size=-8"), 2, r"config\.batch_size=-8 is invalid"),
    "train/grad_accum_steps 0": (train("--config.grad_accum_steps=0"), 2, r"config\.grad_accum_steps=0 is invalid"),
    "train/batch not divisible": (train("--config.grad_accum_steps=3"), 2, r"not divisible by config\.grad_accum"),
    "train/log_every 0": (train("--config.log_every=0"), 2, r"config\.log_every=0 is invalid"),
    "train/num_train_steps 0": (train("--config.num_train_steps=0"), 2, r"config\.num_train_steps=0 is invalid"),
    "train/unknown model name": (train("--config.model.name=bort"), 2, r"config\.model\.name='bort' .*'bert'"),
    "train/unknown dtype": (train("--config.model.dtype=float8"), 2, r"config\.model\.dtype='float8' .*bfloat16"),
    "train/mesh too large": (train("--config.mesh_shape=(3,1,1)"), 2, r"mesh_shape=\(3, 1, 1\) needs 3 devices"),
    "train/mask_prob above 1": (train("--config.objective.mask_prob=1.5"), 2,
                                r"config\.objective\.mask_prob=1\.5 is invalid: .*probability"),
    "train/replacement shares above 1": (train("--config.objective.replace_with_mask=0.95"), 2,
                                         r"replace_with_mask=0\.95 \+ replace_with_random=0\.1 exceeds 1"),
    "train/heads do not divide width": (train("--config.model.num_heads=3"), 2,
                                        r"hidden_size=32 is not a multiple of config\.model\.num_heads=3"),
    "train/sequence beyond positions": (train("--config.data.max_seq_length=1024"), 2,
                                        r"max_seq_length=1024 exceeds config\.model\.max_position_embeddings"),
    "train/negative learning rate": (train("--config.optimizer.learning_rate=-1.0"), 2,
                                     r"config\.optimizer\.learning_rate=-1\.0 is invalid"),
    "train/unknown optimizer": (train("--config.optimizer.name=sgd"), 2, r"config\.optimizer\.name='sgd'.*adamw"),
    "train/dropout 1": (train("--config.model.dropout_rate=1.0"), 2, r"config\.model\.dropout_rate=1\.0 is invalid"),
    "train/embedding_size above hidden_size": (["pretrain.train", "--config=configs/albert.py:size=tiny",
                                                "--workdir={fresh}", "{tiny}", "--config.model.embedding_size=64"], 2,
                                               r"model\.embedding_size=64 is above model\.hidden_size=32"),
    "train/vocabulary smaller than tokenizer": (train("--config.model.vocab_size=100"), 2,
                                                r"tokenizer has 1000 ids but config\.model\.vocab_size=100"),
    # ----- pretrain.train: files -----
    "train/binary corpus": (train("--config.data.path={binary}"), 2, r"is binary, not text.*--config\.data\.path"),
    "train/corpus missing": (train("--config.data.path=/no/such/corpus.txt"), 2,
                             r"corpus file not found: /no/such/corpus\.txt"),
    "train/corpus is a directory": (train("--config.data.path={tasks}", workdir="{fresh}"), 2,
                                    r"corpus path .* is a directory: give its files or a glob in --config\.data\.path "
                                    r"\(e\.g\. .*/\*\.txt\)"),
    "train/tokenizer missing": (train("--config.tokenizer.path=/no/such/spm.model"), 2, r"/no/such/spm\.model"),
    "train/workdir is a file": (train(workdir="{binary}"), 2, r"--workdir=.* is a file, not a directory"),
    "train/workdir cannot be created": (train(workdir="{binary}/sub"), 2, r"--workdir=.* cannot be created"),
    "train/workdir in use by a running run": (train(workdir="{locked}"), 2,
                                              r"--workdir=.* is in use by pid \d+ on .*: wait for that run or stop it"),
    # ----- pretrain.train: resuming with another model or data order -----
    "train/resume with another width": (train("--config.model.hidden_size=64", "--config.model.intermediate_size=128"),
                                        2, r"holds a run with another model or data \(model\.hidden_size: 32 -> 64;"),
    "train/resume with another seed": (train("--config.seed=5"), 2, r"holds a run with another .*seed: 0 -> 5"),
    "train/resume with another corpus": (train("--config.data.path={corpus},{corpus}"), 2,
                                         r"holds a run with another .*data\.path"),
    # ----- pretrain.finetune -----
    "finetune/batch_size 0": (finetune("--config.batch_size=0"), 2, r"config\.batch_size=0 is invalid"),
    "finetune/num_epochs 0": (finetune("--config.num_epochs=0"), 2, r"config\.num_epochs=0 is invalid"),
    "finetune/unknown freezing": (finetune("--config.freezing.strategy=most"), 2,
                                  r"config\.freezing\.strategy='most' .*'gradual'"),
    "finetune/init missing": (finetune("--config.init=/no/such/run"), 2, r"/no/such/run"),
    "finetune/init of another family": (["pretrain.finetune", "--config=configs/glue.py:task=mrpc,model=t5",
                                         "--workdir={fresh}", "--config.init={bert}", *FT_SMALL], 2,
                                        r"holds a bert model but the config fine-tunes t5"),
    "finetune/GLUE folder missing": (finetune("--config.data.glue_dir=/no/glue"), 2,
                                     r"GLUE file not found: /no/glue/MRPC/train\.tsv.*--config\.data\.glue_dir"),
    "finetune/unknown task": (["pretrain.finetune", "--config=configs/glue.py:task=nope", "--workdir={fresh}",
                               "--config.init={bert}"], 2, r"unknown GLUE task 'nope'"),
    "finetune/no workdir": (["pretrain.finetune", f"--config={MRPC}"], 2, r"--workdir is required"),
    "finetune/GLUE file with invalid UTF-8": (finetune("--config.data.glue_dir={glue_latin1}"), 2,
                                              r"MRPC/train\.tsv:2: byte 0xe9 at column \d+ is not UTF-8"),
    "finetune/WordPiece given a SentencePiece model": (finetune("--config.tokenizer.kind=wordpiece",
                                                                "--config.tokenizer.path={spm}"), 2,
                                                       r"looks like a SentencePiece model, not a WordPiece vocab"),
    # ----- pretrain.finetune: tagging and QA files -----
    "finetune/CoNLL line with the wrong column count": (token_task("configs/tagging.py", "conll_columns"), 2,
                                                        r"conll_columns/train\.txt:7: 3 columns where the file's"),
    "finetune/CoNLL tag outside BIO": (token_task("configs/tagging.py", "conll_scheme"), 2,
                                       r"conll_scheme/train\.txt:1: tag 'X-PER' is outside the BIO scheme"),
    "finetune/CoNLL empty split": (token_task("configs/tagging.py", "conll_empty_dev"), 2,
                                   r"conll_empty_dev/valid\.txt has no sentences"),
    "finetune/SQuAD answer_start off its text": (token_task("configs/qa.py", "squad_offset",
                                                            "--config.data.max_query_length=8",
                                                            "--config.data.doc_stride=16"), 2,
                                                 r"squad_offset/train-v1\.1\.json:9: question q1: answer_start 3"),
    "finetune/SQuAD empty split": (token_task("configs/qa.py", "squad_empty_dev", "--config.data.max_query_length=8",
                                              "--config.data.doc_stride=16"), 2, r"squad_empty_dev/dev-v1\.1\.json has no questions"),
    "finetune/QA window without room for the stride": (
        token_task("configs/qa.py", "squad_offset", "--config.data.max_query_length=32",
                   "--config.data.doc_stride=32"), 2,
        r"leaves 29 context pieces per window after a 32-piece question: no room for the overlap"),
    # ----- pretrain.evaluate -----
    "evaluate/a pretraining workdir": (["pretrain.evaluate", "--workdir={bert}"], 2,
                                       r"is not a fine-tuning workdir.*give it to pretrain\.finetune as its init"),
    "evaluate/test split without its file": (["pretrain.evaluate", "--workdir={ft}", "--splits=test",
                                              "--glue_dir={glue_copy}"], 2,
                                             r"GLUE file not found: .*MRPC/test\.tsv \(set --glue_dir"),
    "evaluate/unknown split": (["pretrain.evaluate", "--workdir={ft}", "--splits=train2"], 2,
                               r"--splits: 'train2' is not a split of mrpc"),
    "evaluate/empty splits": (["pretrain.evaluate", "--workdir={ft}", "--splits="], 2,
                              r"--splits is empty: give the splits of mrpc to score \(dev, test or one of dev, test\)"),
    "evaluate/workdir missing": (["pretrain.evaluate", "--workdir=/no/such/run"], 2, r"config\.json not found"),
    "evaluate/damaged config.json": (["pretrain.evaluate", "--workdir={damaged}"], 2, r"is not valid JSON"),
    # ----- pretrain.generate -----
    "generate/a BERT workdir": (["pretrain.generate", "--init={bert}", "--prompt=a"], 2,
                                r"holds a bert model; this needs a decoder-only GPT"),
    "generate/init missing": (["pretrain.generate", "--init=/no/such/run", "--prompt=a"], 2, r"/no/such/run"),
    "generate/top_p 0": (["pretrain.generate", "--init={gpt}", "--prompt=a", "--top_p=0"], 2, r"top_p"),
    "generate/max_new_tokens negative": (["pretrain.generate", "--init={gpt}", "--prompt=a", "--max_new_tokens=-1"],
                                         2, r"max_new_tokens=-1 must be >= 1"),
    "generate/top_k negative": (["pretrain.generate", "--init={gpt}", "--prompt=a", "--top_k=-3"], 2,
                                r"top_k=-3 must be >= 0"),
    "generate/temperature negative": (["pretrain.generate", "--init={gpt}", "--prompt=a", "--temperature=-1"], 2,
                                      r"temperature=-1\.0 must be >= 0"),
    "generate/max_new_tokens beyond a run": (["pretrain.generate", "--init={gpt}", "--prompt=a",
                                              "--max_new_tokens=10000000000"], 2,
                                             r"max_new_tokens=10000000000 exceeds 1,000,000 tokens per sample"),
    "generate/num_samples 0": (["pretrain.generate", "--init={gpt}", "--prompt=a", "--num_samples=0"], 2,
                               r"num_samples=0 must be >= 1"),
    "generate/tokenizer missing": (["pretrain.generate", "--init={gpt}", "--prompt=a", "--tokenizer_path=/no/t.txt"],
                                   2, r"/no/t\.txt.*--tokenizer_path"),
    # ----- pretrain.perplexity -----
    "perplexity/data missing": (["pretrain.perplexity", "--init={gpt}", "--data=/no/such.txt"], 2,
                                r"corpus file not found: /no/such\.txt \(check --data\)"),
    "perplexity/binary data": (["pretrain.perplexity", "--init={gpt}", "--data={binary}"], 2,
                               r"is binary, not text.*--data"),
    "perplexity/eval_fraction 0": (["pretrain.perplexity", "--init={gpt}", f"--data={SHAKESPEARE}",
                                    "--eval_fraction=0"], 2, r"--eval_fraction=0\.0 must be in"),
    # ----- pretrain.fewshot -----
    "fewshot/GLUE folder missing": (["pretrain.fewshot", "--init={gpt}", "--task=sst2", "--glue_dir=/no/glue"], 2,
                                    r"GLUE file not found: /no/glue/SST-2/train\.tsv \(set --glue_dir"),
    "fewshot/unknown task": (["pretrain.fewshot", "--init={gpt}", "--task=nope", f"--glue_dir={GLUE}"], 2, r"nope"),
    "fewshot/a BERT workdir": (["pretrain.fewshot", "--init={bert}", "--task=sst2", f"--glue_dir={GLUE}"], 2,
                               r"holds a bert model"),
    # ----- the sweep, the launcher and the tools -----
    "sweep/into a fine-tuning run's workdir": (["pretrain.sweep", f"--config={MRPC}", "--sweep=lr_seed:1e-4/0",
                                               "--workdir={ft}", "--config.init={bert}"], 2,
                                              r"--workdir=.* is a run's workdir \(it holds config\.json\)"),
    "launch/zone with a space": (["pretrain.launch", "create", "--name=x", "--zone=us central2",
                                  "--accelerator_type=v4-8", "--dry_run"], 2, r"--zone='us central2' is not a zone"),
    "launch/TPU size that does not exist": (["pretrain.launch", "create", "--name=x", "--zone=us-central2-b",
                                             "--accelerator_type=v4-31", "--dry_run"], 2, r"v4-31"),
    "tools/export_hf_bert of a GPT run onto its own workdir": (
        ["pretrain.tools.export_hf_bert", "--workdir={gpt}", "--output={gpt}"], 2,
        r"exists and is not a previous export \(export to a new directory or remove it\)"),
    "minimal_pairs/data file missing": (["pretrain.minimal_pairs", "--workdir={gpt}", "--data={fresh}/none.jsonl"],
                                        2, r"minimal-pair file not found: .*none\.jsonl"),
    "tools/train_tokenizer vocabulary larger than the text allows": (
        ["pretrain.tools.train_tokenizer", "--input={corpus}", "--model_prefix={fresh}/spm", "--vocab_size=100000"],
        2, r"--vocab_size 100000 is more than the text of .* allows: .*use --vocab_size \d+ or less"),
    # ----- --help and --print_config: exit 0, nothing written -----
    **{f"{entry}/--help": ([f"pretrain.{entry}", "--help"], 0, None)
       for entry in ("train", "finetune", "evaluate", "generate", "perplexity", "fewshot", "minimal_pairs")},
    "train/--print_config": (["pretrain.train", f"--config={BERT}", "--print_config", "--config.batch_size=3"], 0,
                             None),
    "finetune/--print_config": (finetune("--print_config", "--config.model.layer_norm_eps=1e-05"), 0, None),
}
# The commands without a config file must never suggest a --config.* option.
NO_CONFIG_FLAGS = ("evaluate", "generate", "perplexity", "fewshot")


def _snapshot(*directories: str) -> dict[str, str]:
    out = {}
    for directory in directories:
        for root, _, files in os.walk(directory):
            for name in files:
                path = os.path.join(root, name)
                with open(path, "rb") as f:
                    out[path] = hashlib.sha256(f.read()).hexdigest()
    return out


@pytest.fixture(scope="module")
def workdirs(corpus_and_tokenizer, tiny_bert_workdir, tiny_gpt_workdir, tmp_path_factory) -> dict[str, str]:
    """Finished runs whose every file the cases must leave as they found it: the session's tiny BERT and GPT
    runs (tests/conftest.py), and an MRPC fine-tuning run from that BERT."""
    corpus, spm = corpus_and_tokenizer
    root = tmp_path_factory.mktemp("bad_inputs")
    ft = str(root / "ft")
    run_module("pretrain.finetune", [f"--config={MRPC}", f"--workdir={ft}", f"--config.init={tiny_bert_workdir}",
                                     *FT_SMALL])
    glue_copy = root / "glue_without_test" / "MRPC"
    glue_copy.mkdir(parents=True)
    for split in ("train", "dev"):
        shutil.copy(os.path.join(GLUE, "MRPC", f"{split}.tsv"), glue_copy / f"{split}.tsv")
    for folder, files in TOKEN_TASK_FILES.items():
        (root / "tasks" / folder).mkdir(parents=True)
        for name, text in files.items():
            (root / "tasks" / folder / name).write_text(text)
    latin1 = root / "glue_latin1" / "MRPC"  # a row saved in Latin-1: é as the single byte 0xe9
    latin1.mkdir(parents=True)
    with open(os.path.join(GLUE, "MRPC", "train.tsv"), "rb") as f:
        header, first, *_ = f.read().split(b"\n", 3)
    (latin1 / "train.tsv").write_bytes(header + b"\n" + first.replace(b"e", b"\xe9", 1) + b"\n")
    shutil.copy(os.path.join(GLUE, "MRPC", "dev.tsv"), latin1 / "dev.tsv")
    return {"bert": tiny_bert_workdir, "ft": ft, "gpt": tiny_gpt_workdir, "corpus": corpus, "spm": spm,
            "root": str(root), "glue_copy": str(glue_copy.parent), "tasks": str(root / "tasks"),
            "glue_latin1": str(latin1.parent)}


def _prepare_case(name: str, workdirs: dict[str, str]) -> tuple[str, list[str], list[str]]:
    """Fresh copies of the workdirs for the case -> (its directory, its command, the directories it must
    leave unchanged)."""
    case_dir = os.path.join(workdirs["root"], "cases", re.sub(r"\W+", "_", name))
    shutil.rmtree(case_dir, ignore_errors=True)
    values = {"binary": sys.executable, "tiny": None, "corpus": workdirs["corpus"], "glue_copy": workdirs["glue_copy"],
              "tasks": workdirs["tasks"], "spm": workdirs["spm"], "glue_latin1": workdirs["glue_latin1"],
              "locked": os.path.join(case_dir, "locked"),
              "fresh": os.path.join(case_dir, "fresh"), "damaged": os.path.join(case_dir, "damaged")}
    for key in ("bert", "ft", "gpt"):
        values[key] = os.path.join(case_dir, key)
        shutil.copytree(workdirs[key], values[key])
    shutil.copytree(workdirs["bert"], values["locked"])  # held by a live process on this host: this one
    with open(os.path.join(values["locked"], ".lock"), "w") as f:
        json.dump({"host": socket.gethostname(), "pid": os.getpid(), "since": "2026-01-01 00:00:00"}, f)
    os.makedirs(values["damaged"])
    with open(os.path.join(values["damaged"], "config.json"), "w") as f:
        f.write('{"task": "mrpc", ')  # cut short
    command = CASES[name][0]
    args = [command[0]]
    for arg in command[1:]:
        if arg == "{tiny}":
            args += tiny_overrides(workdirs["corpus"], workdirs["spm"])
        else:
            args.append(arg.format(**values))
    return case_dir, args, [values[k] for k in ("bert", "ft", "gpt", "damaged", "locked")]


@pytest.fixture(scope="module")
def outcomes(workdirs) -> dict[str, tuple[subprocess.CompletedProcess, list[str]]]:
    """Every case -> (its process, the files it changed). Each command is its own process, forked three at a
    time from one that imported JAX & co. once (tests/helpers/command_server.py: the same `python -m` entry,
    flags, exit status and output, without ~60 interpreter start-ups)."""
    cases = {name: _prepare_case(name, workdirs) for name in CASES}
    before = {name: _snapshot(*watched) for name, (_, _, watched) in cases.items()}
    requests = [{"module": args[0], "args": args[1:], "stdout": os.path.join(case_dir, "stdout"),
                 "stderr": os.path.join(case_dir, "stderr")} for case_dir, args, _ in cases.values()]
    env = subprocess_env()
    env.pop("LMPRETRAIN_TRACEBACK", None)
    server = subprocess.run([sys.executable, "-m", "tests.helpers.command_server", "3"], cwd=REPO, env=env, text=True,
                            input="".join(json.dumps(r) + "\n" for r in requests), capture_output=True, timeout=900)
    assert server.returncode == 0, server.stderr[-3000:]
    status = {r["index"]: r["returncode"] for r in map(json.loads, server.stdout.splitlines())}
    assert sorted(status) == list(range(len(CASES))), server.stdout
    out = {}
    for i, (name, (case_dir, args, watched)) in enumerate(cases.items()):
        after = _snapshot(*watched)
        changed = sorted(p for p in set(before[name]) | set(after) if before[name].get(p) != after.get(p))
        with open(os.path.join(case_dir, "stdout")) as f_out, open(os.path.join(case_dir, "stderr")) as f_err:
            proc = subprocess.CompletedProcess(["python", "-m", *args], status[i], f_out.read(), f_err.read())
        out[name] = (proc, changed)
    return out


def test_there_are_forty_cases_across_the_seven_entry_points_the_sweep_the_launcher_and_the_tools():
    entries = {name.split("/")[0] for name in CASES}
    assert entries == {"train", "finetune", "evaluate", "generate", "perplexity", "fewshot", "minimal_pairs", "sweep",
                       "launch", "tools"}
    assert len(CASES) >= 40


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input(name, outcomes):
    proc, changed = outcomes[name]
    _, status, pattern = CASES[name]
    assert proc.returncode == status, f"exit {proc.returncode}, expected {status}:\n{proc.stderr[-2000:]}"
    assert changed == [], f"the command changed {changed}"
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    if pattern is None:  # --help / --print_config
        assert lines == [], proc.stderr
        assert proc.stdout.strip(), "nothing printed"
        return
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{proc.stderr[-2000:]}"
    assert lines[0].startswith("error: ") and re.search(pattern, lines[0]), lines[0]
    if name.split("/")[0] in NO_CONFIG_FLAGS:
        assert "--config." not in lines[0], f"suggests an option this command does not have: {lines[0]}"


def test_help_lists_the_flags_and_print_config_prints_every_key(outcomes):
    help_text = outcomes["train/--help"][0].stdout
    assert "--workdir" in help_text and "--print_config" in help_text and "--config.KEY=VALUE" in help_text
    printed = json.loads(outcomes["train/--print_config"][0].stdout)
    assert printed["batch_size"] == 3 and printed["model"]["name"] == "bert" and "mask_prob" in printed["objective"]


def test_finetune_takes_the_architecture_from_its_init_and_a_model_flag_over_both(outcomes):
    """configs/glue.py's BERT is base-sized; --config.init (the tiny run, layer_norm_eps 1e-12) brings hidden size
    32 and its layer_norm_eps, and --config.model.layer_norm_eps=1e-05 on the command line wins over the init's
    value, as a keyword argument of from_pretrained does."""
    printed = json.loads(outcomes["finetune/--print_config"][0].stdout)
    assert printed["model"]["hidden_size"] == 32 and printed["model"]["num_layers"] == 2
    assert printed["model"]["layer_norm_eps"] == 1e-05


def test_a_forked_command_prints_and_exits_as_the_started_one(outcomes, tmp_path):
    """tests/helpers/command_server.py stands in for `python -m`: the same output and exit status, byte for byte, as
    the real command started afresh (cases whose output names no case directory; --help lists every absl flag
    defined in the process, so a preloaded module that defines flags would show here)."""
    for name in ("train/config argument unknown", "finetune/--help", "generate/--help"):
        command = CASES[name][0]
        args = [arg.replace("{bert}", str(tmp_path / "w")) for arg in command[1:]]
        started = run_module(command[0], args, env={"LMPRETRAIN_TRACEBACK": ""}, check=False)
        forked = outcomes[name][0]
        assert (started.returncode, started.stdout, started.stderr) == (forked.returncode, forked.stdout,
                                                                         forked.stderr), name
