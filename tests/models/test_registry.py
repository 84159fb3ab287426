"""models/families.py: one registration is all a model family needs (plus one per kind of Hugging Face directory it
loads, and its finetuners registered in pretrain/finetuners/). A synthetic family registered in the tables (and
nowhere else) is built, loaded from a Hugging Face directory and an Orbax workdir, validated, frozen and fine-tuned
by the code that reads the tables; the lists those tables replaced are gone."""
from __future__ import annotations

import ast
import dataclasses
import json
import os
import types

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import pytest

import models
from models import families as registry
from models.errors import ModelInputError
from models.families import Body, HfCheckpoint, ModelFamily
from pretrain.distillation import teacher
from pretrain.finetuners import registry as finetuners
from pretrain.runtime.errors import ConfigError, UserError
from pretrain.training import freezing, pretrained, validation

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ----- A synthetic family, defined in this module and named by it -----
@dataclasses.dataclass(frozen=True)
class ToyConfig:
    vocab_size: int = 16
    width: int = 8
    num_heads: int = 2
    num_layers: int = 2
    positions: int = 16
    act: str = "relu"
    dropout_rate: float = 0.1


ACTS = ("relu", "gelu")


class Toy(nn.Module):
    config: ToyConfig

    @nn.compact
    def __call__(self, ids):
        return nn.Embed(self.config.vocab_size, self.config.width)(ids)


def toy_params() -> dict:
    block = {"kernel": np.ones((2, 2), np.float32)}
    return {"toy": {"embed": block, "layer_0": block, "layer_1": block, "top_norm": block}, "lm_head": block}


def load_toy(directory: str):
    return ToyConfig(width=12), toy_params()


class ToyFinetuner:
    kinds = ("classification", "tagging")
    families = ("toy",)

    def __init__(self, config, task, tokenizer):
        self.config, self.task, self.tokenizer = config, task, tokenizer


TOY = ModelFamily(
    "toy", __name__, "ToyConfig", "Toy",
    params_subtree="toy", width_key="width", positions_key="positions", choices={"act": f"{__name__}:ACTS"},
    body=Body("toy", embeddings=("embed",), top=("top_norm",)))
TOY_CHECKPOINT = HfCheckpoint("toy_lm", "Toy", "toy", f"{__name__}:load_toy", lambda d: dict(kind="wordpiece", path=d))


@pytest.fixture
def toy():
    with registry.FAMILIES.registered("toy", TOY), registry.HF_CHECKPOINTS.registered("toy_lm", TOY_CHECKPOINT):
        yield TOY  # the family's registration, and its Hugging Face directories'


# ----- Each reader of the table -----
def test_build_model_and_model_config(toy):
    assert models.model_config({"name": "toy", "width": 12}) == ToyConfig(width=12)
    assert isinstance(models.build_model({"name": "toy"}), Toy)
    with pytest.raises(ModelInputError, match="config.model.depth is not a ToyConfig field"):
        models.model_config({"name": "toy", "depth": 3})


def test_an_unregistered_family_is_unknown():
    with pytest.raises(ModelInputError, match="config.model.name='toy' is unknown; available: 'bert', 't5', 'gpt'"):
        models.model_config({"name": "toy"})
    with pytest.raises(ConfigError, match="config.model.name='toy' is invalid"):
        validation.check_ranges(ml_collections.ConfigDict({"model": {"name": "toy"}}))


def test_hugging_face_loading_dispatches_on_model_type(toy, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "toy_lm"}))
    init = pretrained.load_pretrained(str(tmp_path))
    assert init.family == "toy" and init.source == f"huggingface:{tmp_path}"
    # every field but the training-time ones; the registered subtree; the registered tokenizer
    assert init.model == {"vocab_size": 16, "width": 12, "num_heads": 2, "num_layers": 2, "positions": 16,
                          "act": "relu"}
    assert set(init.params) == {"embed", "layer_0", "layer_1", "top_norm"}
    assert init.tokenizer == dict(kind="wordpiece", path=str(tmp_path))
    with pytest.raises(UserError, match="a Hugging Face BERT, ALBERT, ELECTRA, DistilBERT, T5, GPT-2, ModernBERT or Toy directory"):
        pretrained.load_pretrained(str(tmp_path / "missing"))


def test_an_unknown_model_type_names_the_registered_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "roberta"}))
    with pytest.raises(UserError) as error:
        pretrained.load_pretrained(str(tmp_path))
    assert str(error.value) == (f"{tmp_path}/config.json: model_type='roberta' is not one this project loads "
                                "('bert', 'albert', 'electra', 'distilbert', 't5', 'gpt2', 'modernbert'); give a Hugging "
                                "Face BERT, ALBERT, ELECTRA, DistilBERT, T5, GPT-2 or ModernBERT directory")


def test_orbax_loading_takes_the_registered_subtree(toy, tmp_path, monkeypatch):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "config.json").write_text(json.dumps({
        "model": {"name": "toy", "width": 12, "act": "gelu", "dropout_rate": 0.1, "dtype": "float32"},
        "tokenizer": {"kind": "sentencepiece", "path": "spm.model"}}))
    monkeypatch.setattr(pretrained.checkpoints, "restore_params", lambda ckpt: (toy_params(), 5))
    init = pretrained.load_pretrained(str(tmp_path))
    assert (init.family, init.model, set(init.params)) == ("toy", {"width": 12, "act": "gelu"},
                                                           {"embed", "layer_0", "layer_1", "top_norm"})
    assert init.source == f"orbax:{tmp_path}/checkpoints/5"


@pytest.mark.parametrize("model, max_seq_length, message", [
    (dict(width=10, num_heads=4), 8, "config.model.width=10 is not a multiple of config.model.num_heads=4"),
    (dict(), 32, "config.data.max_seq_length=32 exceeds config.model.positions=16"),
    (dict(act="tanh"), 8, "config.model.act='tanh' is invalid: it must be one of 'relu', 'gelu'"),
])
def test_validation_checks_the_registered_relations(toy, model, max_seq_length, message):
    fields = {**dict(name="toy", width=8, num_heads=2, positions=16, act="relu"), **model}
    config = ml_collections.ConfigDict(dict(batch_size=8, model=fields, data=dict(max_seq_length=max_seq_length)))
    validation.check_ranges(config)  # the name is known
    with pytest.raises(ConfigError, match=message):
        validation.check_relations(config)


def test_freezing_knows_the_registered_body(monkeypatch):
    params = toy_params()
    kw = dict(num_layers=2, steps_per_epoch=3)

    def starts(strategy, **config):
        config = ml_collections.ConfigDict(dict(strategy=strategy, num_frozen_layers=1, freeze_embeddings=True,
                                                unfreeze_every_epochs=1, **config))
        tree = freezing.unfreeze_steps(params, config, **kw)
        return {name: tree["toy"][name]["kernel"] for name in tree["toy"]} | {"head": tree["lm_head"]["kernel"]}

    assert set(starts("head_only").values()) == {0}  # unregistered, 'toy' is a task head
    with registry.FAMILIES.registered("toy", TOY):
        assert starts("head_only") == dict(embed=freezing.NEVER, layer_0=freezing.NEVER, layer_1=freezing.NEVER,
                                           top_norm=freezing.NEVER, head=0)
        assert starts("lowest") == dict(embed=freezing.NEVER, layer_0=freezing.NEVER, layer_1=0, top_norm=0, head=0)
        assert starts("gradual") == dict(embed=6, layer_0=3, layer_1=0, top_norm=0, head=0)


@pytest.fixture
def toy_finetuner(toy):
    with finetuners.FINETUNERS.registered("toy", ToyFinetuner):  # beside the class, in a real finetuner's module
        yield ToyFinetuner


def test_fine_tuning_families_by_task_kind(toy_finetuner):
    config = ml_collections.ConfigDict({"model": {"name": "toy"}})
    for kind in ("classification", "tagging"):
        family = finetuners.for_config(config, types.SimpleNamespace(kind=kind, name="task"), "tokenizer")
        assert isinstance(family, ToyFinetuner) and family.tokenizer == "tokenizer"
    with pytest.raises(ConfigError, match="config.model.name='toy' cannot be fine-tuned on squad here; "
                                          "use one of 'bert', 't5', 'modernbert'$"):
        finetuners.for_config(config, types.SimpleNamespace(kind="qa", name="squad"), None)
    with pytest.raises(ConfigError, match="use one of 'bert', 'modernbert', 'toy'$"):
        finetuners.for_config(ml_collections.ConfigDict({"model": {"name": "t5"}}),
                            types.SimpleNamespace(kind="tagging", name="conll2003"), None)


# ----- The real table -----
def test_every_registered_name_resolves():
    assert list(registry.FAMILIES) == ["bert", "t5", "gpt", "electra", "distil", "modernbert"]
    for _, family in registry.FAMILIES.items():
        assert dataclasses.is_dataclass(family.config_cls()) and issubclass(family.model_cls(), nn.Module)
        for names in family.choices.values():
            assert all(isinstance(value, str) for value in registry.resolve(names))  # a tuple or dict of names
        assert family.task_model is None or issubclass(registry.resolve(family.task_model), nn.Module)
    for _, checkpoint in registry.HF_CHECKPOINTS.items():
        assert callable(registry.resolve(checkpoint.loader)) and checkpoint.family in registry.FAMILIES
    # what the layers above register against a family names a registered one
    for _, finetuner in finetuners.FINETUNERS.items():
        assert isinstance(finetuner, type) and set(finetuner.families) <= set(registry.FAMILIES), finetuner
    for family, load in teacher.TEACHERS.items():
        assert family in registry.FAMILIES and callable(load)
    with pytest.raises(ValueError, match="'bert' is registered twice"):
        registry.register(registry.FAMILIES.get("bert"))


def test_a_family_is_fine_tuned_on_every_head_kind_its_finetuners_name():
    """The finetuners registered in pretrain/finetuners/ beside their classes, read by family and head kind."""
    assert finetuners.families_for("classification") == ["bert", "t5", "gpt", "modernbert"]
    assert finetuners.families_for("qa") == ["bert", "t5", "modernbert"]
    assert finetuners.families_for("span") == ["bert", "modernbert"]  # the encoders: a task_model, no name listed


def test_the_readers_keep_no_list_of_their_own():
    """No family name, Hugging Face model_type or body block is spelled in the modules that read the table."""
    spelled = {"FAMILIES", "BODIES", "EMBEDDINGS", "TOP", "FAMILY_CHECKS", "TOKEN_FAMILIES", "ARCHITECTURE_KEYS"}
    table = {name for _, family in registry.FAMILIES.items() for name in (
        family.name, family.params_subtree,
        *((family.body.key, *family.body.embeddings, *family.body.top) if family.body else ()))} - {None}
    table |= set(registry.HF_CHECKPOINTS)  # the model_types
    for path in ("models/__init__.py", "pretrain/training/pretrained.py", "pretrain/training/validation.py",
                 "pretrain/training/freezing.py", "pretrain/finetuners/registry.py", "pretrain/loops/pretraining.py",
                 "pretrain/lm/language_model.py"):
        with open(os.path.join(ROOT, path)) as f:
            tree = ast.parse(f.read())
        strings = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)}
        assigned = {target.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                    for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                    if isinstance(target, ast.Name)}
        assert not strings & table, (path, strings & table)
        assert not assigned & spelled, (path, assigned & spelled)


def test_a_jax_tree_of_the_toy_builds(toy):
    """The synthetic family is a real one: its module initialises like any other."""
    model = models.build_model({"name": "toy", "width": 4})
    params = model.init(jax.random.key(0), np.zeros((1, 3), np.int32))["params"]
    assert params["Embed_0"]["embedding"].shape == (16, 4)
