"""Every extension point registers one way: an objective, a fine-tuning task and a head kind are each their own
module plus one registration (as tests/models/test_registry.py shows for model families), and every reader
picks the registration up. Each synthetic extension below is a module written to a temporary folder and one
`register` call, nothing else; and no string switch on head kinds remains outside their registry."""
from __future__ import annotations

import ast
import os
import sys
import textwrap

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import objectives
from models.bert import BertConfig
from models.bert_tasks import BertForFineTuning
from objectives import registry as objective_registry
from objectives import task_heads
from objectives.interface import Objective
from objectives.task_heads.objective import FineTuningObjective
from pretrain.finetuners import registry as finetuners
from pretrain.runtime.errors import ConfigError
from pretrain.tasks import registry as task_registry
from pretrain.tasks.glue import text_to_text
from pretrain.tools import export_hf_bert
from pretrain.training import validation
from tests.helpers.paths import REPO


def write_module(folder, name: str, source: str, monkeypatch) -> str:
    """`source` as the module `name` in `folder`, importable for this test only."""
    (folder / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


# ----- An objective -----
TOY_OBJECTIVE = """
    import numpy as np

    class ToyObjective:
        '''Predicts nothing: every batch is its instances, the loss their mean id.'''
        def __init__(self, config, tokenizer):
            self.config, self.tokenizer = config, tokenizer

        def create_instances(self, documents, rng, max_seq_length):
            return {"input_ids": np.zeros((2, max_seq_length), np.int32)}

        def make_batch(self, instances, rng):
            return instances

        def model_inputs(self, batch):
            return {"input_ids": batch["input_ids"]}

        def loss(self, outputs, batch):
            loss = batch["input_ids"].mean()
            return loss, {"loss": loss, "tokens": batch["input_ids"].size}
"""


def test_a_registered_objective_is_built_and_validated(tmp_path, monkeypatch):
    config = ml_collections.ConfigDict({"objective": {"name": "toy"}})
    with pytest.raises(ConfigError, match="config.objective.name='toy' is invalid"):
        validation.check_ranges(config)
    module = write_module(tmp_path, "toy_objective_module", TOY_OBJECTIVE, monkeypatch)
    monkeypatch.setitem(objective_registry.OBJECTIVES, "toy",
                        objective_registry.ObjectiveEntry("toy", f"{module}:ToyObjective"))  # the one registration
    objective = objectives.build_objective(config.objective, tokenizer=None)
    assert isinstance(objective, Objective) and type(objective).__name__ == "ToyObjective"
    assert "toy" in objectives.names()
    validation.check_ranges(config)  # the validator reads the table: no error now
    with pytest.raises(ValueError, match="registered twice"):
        objective_registry.register(objective_registry.ObjectiveEntry("toy", f"{module}:ToyObjective"))


# ----- A head kind -----
TOY_HEAD = """
    import dataclasses
    import flax.linen as nn
    import jax.numpy as jnp
    from objectives.task_heads.base import HeadKind, weighted_mean

    class MeanHead(nn.Module):
        '''A score per row from the mean of its states.'''
        @nn.compact
        def __call__(self, sequence, scale):
            return nn.Dense(1, name="score")(sequence.mean(axis=1))[:, 0] * scale

    @dataclasses.dataclass(frozen=True)
    class Scoring(HeadKind):
        def head(self, num_labels, dropout_rate, options, **kwargs):
            return MeanHead()

        def outputs(self, head, sequence, pooled, inputs, deterministic):
            return {"score": head(sequence, inputs["scale"])}

        def loss(self, outputs, batch, weight, objective):
            return weighted_mean(jnp.abs(outputs["score"] - batch["target"]), weight), {}

        def predictions(self, outputs, batch, objective):
            return {"score": outputs["score"]}

    SCORING = Scoring("scoring", hf_class=None, input_keys=("scale",))
"""

TINY_BERT = BertConfig(vocab_size=32, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                       max_position_embeddings=16)


@pytest.fixture
def scoring_kind(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="unknown fine-tuning task kind 'scoring'"):
        task_heads.head_kind("scoring")
    module = write_module(tmp_path, "toy_head_module", TOY_HEAD, monkeypatch)
    monkeypatch.setitem(task_heads.HEAD_KINDS, "scoring", f"{module}:SCORING")  # the one registration
    return task_heads.head_kind("scoring")


def test_a_registered_head_kind_trains_predicts_and_builds(scoring_kind):
    objective = FineTuningObjective("scoring", 1)
    ids = jnp.array([[2, 5, 6, 3], [2, 7, 3, 0]], jnp.int32)
    batch = {"input_ids": ids, "segment_ids": ids * 0, "input_mask": (ids != 0).astype(jnp.int32),
             "scale": jnp.array([1.0, 2.0]), "target": jnp.array([0.5, -0.5]), "weight": jnp.array([1.0, 0.0])}
    inputs = objective.model_inputs(batch)
    assert set(inputs) == {"input_ids", "segment_ids", "input_mask", "scale"}  # the kind's input_keys
    model = BertForFineTuning(TINY_BERT, objective.head, 1)
    params = model.init(jax.random.key(0), **inputs)["params"]
    assert set(params) == {"bert", "head"} and set(params["head"]) == {"score"}  # the kind's module, under 'head'
    outputs = model.apply({"params": params}, **inputs)
    loss, metrics = objective.loss(outputs, batch)
    np.testing.assert_allclose(float(loss), abs(float(outputs["score"][0]) - 0.5), rtol=1e-6)  # row 1 weighs 0
    assert set(metrics) == {"loss", "examples"} and float(metrics["examples"]) == 1.0
    np.testing.assert_array_equal(objective.predictions(outputs, batch)["score"], outputs["score"])
    with pytest.raises(ValueError, match="task distillation .* this task is scoring"):
        objective.distilled(0.5, 2.0)
    # the exporter reads the kind: no transformers class, and the message lists the kinds that have one
    assert export_hf_bert._export_form("scoring", peft=False) is None
    assert export_hf_bert._export_form("tagging", peft=False) == "BertForTokenClassification"


# ----- A fine-tuning task -----
TOY_TASK = """
    import dataclasses
    from pretrain.tasks.classification import Example, Labels

    @dataclasses.dataclass(frozen=True)
    class ToySentiment(Labels):
        '''A classification task that is not GLUE: two labelled sentences per split.'''
        name: str
        labels: tuple = ("bad", "good")
        main_metric = "accuracy"
        dev_splits = ("dev",)
        test_splits = ()
        is_pair = False

        @classmethod
        def from_config(cls, config):
            return cls(config.task)

        def labelled(self, split):
            return True

        def load(self, config, split, options=None):
            return [Example("awful", None, 0, 0), Example("great", None, 1, 1)]

        def score(self, finetuner, predictions, examples):
            return {"accuracy": float((predictions == self.label_array(examples)).mean())}

        def write_predictions(self, directory, split, finetuner, predictions, examples):
            return ""
"""


def test_a_registered_task_is_found_and_fine_tuned_by_its_kind(tmp_path, monkeypatch):
    config = ml_collections.ConfigDict({"task": "toy_sentiment", "model": {"name": "bert"}})
    with pytest.raises(Exception, match="unknown GLUE task 'toy_sentiment'"):  # GLUE answers unclaimed names
        task_registry.task_for_config(config)
    module = write_module(tmp_path, "toy_task_module", TOY_TASK, monkeypatch)
    monkeypatch.setattr(task_registry, "TASKS", list(task_registry.TASKS))
    task_registry.register(task_registry.TaskEntry(("toy_sentiment",), f"{module}:ToySentiment.from_config"))
    task = task_registry.task_for_config(config)
    assert type(task).__name__ == "ToySentiment" and task.kind == "classification" and task.num_labels == 2
    assert "toy_sentiment" in task_registry.names()
    # a classification task of any dataset fine-tunes through the finetuners that GLUE's tasks use
    finetuner = finetuners.for_config(config, task, tokenizer=None)
    assert type(finetuner).__name__ == "BertFinetuner" and finetuner.objective.kind == "classification"
    np.testing.assert_array_equal(task.label_array(task.load(config, "dev")), [0, 1])
    # and as text to text, T5's way, with GLUE's generic field name
    assert text_to_text.input_text(task, task.load(config, "dev")[0]) == "toy_sentiment sentence: awful"
    assert text_to_text.label_text(task, 1) == "good"
    with pytest.raises(ValueError, match="registered twice"):
        task_registry.register(task_registry.TaskEntry(("toy_sentiment",), f"{module}:ToySentiment.from_config"))


# ----- No string switch on head kinds outside their registry -----
CODE = ("configs", "models", "objectives", "pretrain", "scripts")


def head_kind_switches(path: str, source: str, kinds: set[str]) -> list[str]:
    """Comparisons of a `kind` (a name or attribute ending in 'kind') with head-kind strings, and dict literals
    keyed by two or more head kinds: the switches a head kind's own module replaces."""
    def strings(node) -> set[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return set().union(*(strings(e) for e in node.elts))
        return set()

    def is_kind(node) -> bool:
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
        return name.endswith("kind")

    found = []
    for node in ast.walk(ast.parse(source, path)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(map(is_kind, operands)) and set().union(*map(strings, operands)) & kinds:
                found.append(f"{path}:{node.lineno}: compares a kind with a head kind's name")
        elif isinstance(node, ast.Dict) and len(set().union(*map(strings, filter(None, node.keys))) & kinds) >= 2:
            found.append(f"{path}:{node.lineno}: a table keyed by head kinds")
    return found


def code_files(root: str):
    for package in CODE:
        for directory, dirs, files in os.walk(os.path.join(root, package)):
            dirs[:] = [d for d in dirs if not d.startswith((".", "__"))]
            for name in files:
                if name.endswith(".py"):
                    yield os.path.join(directory, name)


def test_no_string_switch_on_head_kinds_outside_their_registry():
    kinds = set(task_heads.HEAD_KINDS)
    registries = (os.path.join(REPO, "objectives", "task_heads"), os.path.join(REPO, "models", "families.py"))
    found = []
    for path in code_files(REPO):
        if not path.startswith(registries):
            with open(path, encoding="utf-8") as f:
                found += head_kind_switches(os.path.relpath(path, REPO), f.read(), kinds)
    assert found == []


@pytest.mark.parametrize("source", [
    'if self.kind == "span":\n    pass\n',
    'if task.kind in ("classification", "regression"):\n    pass\n',
    'ARCHITECTURES = {"classification": "A", "tagging": "B"}\n',
])
def test_the_switch_check_fails_on_a_synthetic_switch(source):
    assert head_kind_switches("x.py", source, set(task_heads.HEAD_KINDS)) != []


def test_the_switch_check_passes_a_kind_named_as_a_value():
    source = 'kind = "regression" if regression else "classification"\nhead = head_kind(kind)\n'
    assert head_kind_switches("x.py", source, set(task_heads.HEAD_KINDS)) == []


def test_every_registered_name_resolves():
    assert [task_heads.head_kind(name).name for name in task_heads.HEAD_KINDS] == list(task_heads.HEAD_KINDS)
    for entry in objective_registry.OBJECTIVES.values():
        assert isinstance(objective_registry.resolve(entry.target), type), entry
    for entry in task_registry.TASKS:
        assert callable(task_registry.resolve(entry.builder)), entry
