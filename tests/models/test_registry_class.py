"""models/registry.py: the one generic registry every extension point is (registration, lookup, lazy entries)."""
from __future__ import annotations

import ast
import os

import pytest

from models.registry import Registry, resolve

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class LookupError_(ValueError):
    """A layer's own error class, as each registry raises for an unknown name."""


def shout(text: str) -> str:
    return text.upper()


def test_register_by_call_and_by_decorator_in_order():
    things = Registry("thing")
    assert things.register("a", 1) == 1

    @things.register("b")
    def b():
        return "b"

    assert things.get("a") == 1 and things.get("b") is b and b() == "b"  # the decorator returns what it decorates
    assert things.names() == ("a", "b") and list(things) == ["a", "b"] and len(things) == 2
    assert "a" in things and "c" not in things
    assert repr(things) == "Registry('thing': a, b)"


def test_an_unknown_name_is_one_line_naming_the_choices():
    keyed = Registry("optimizer", key="config.optimizer.name", error=LookupError_)
    keyed.register("adamw", 1)
    keyed.register("sgd", 2)
    with pytest.raises(LookupError_) as error:
        keyed.get("adam")
    assert str(error.value) == "config.optimizer.name='adam' is unknown; available: 'adamw', 'sgd'"
    with pytest.raises(ValueError, match=r"^thing 'x' is unknown; available: $"):
        Registry("thing").get("x")


def test_a_name_registers_once():
    things = Registry("thing")
    things.register("a", 1)
    with pytest.raises(ValueError, match="thing 'a' is registered twice"):
        things.register("a", 2)
    assert things.get("a") == 1


def test_a_module_attr_string_is_imported_on_first_lookup():
    things = Registry("thing")
    things.register("shout", f"{__name__}:shout")
    things.register("plain", "a plain value")  # a string without the "module:attr" form stays a string
    things.register("recipe", "configs/bert.py:size=base,nsp=False")  # a colon alone does not make one
    assert things.get("shout") is shout and things.get("shout")("a") == "A"
    assert things.get("plain") == "a plain value" and things.get("recipe") == "configs/bert.py:size=base,nsp=False"
    assert resolve("models.registry:Registry.register") is Registry.register  # a class attribute, dotted


def test_items_and_find_look_up_by_capability():
    things = Registry("thing")
    things.register("one", 1)
    things.register("two", 2)
    things.register("shout", f"{__name__}:shout")
    assert list(things.items()) == [("one", 1), ("two", 2), ("shout", shout)]
    assert things.find(lambda thing: isinstance(thing, int) and thing > 1) == [("two", 2)]


def test_a_fallback_answers_every_unregistered_name():
    tasks = Registry("task", fallback=f"{__name__}:shout")
    tasks.register("squad", str.lower)
    assert tasks.get("CoLA") is shout
    assert tasks.get("squad") is str.lower and tasks.names() == ("squad",)  # the fallback is no name


def test_registered_is_undone_after_the_block_even_on_error():
    things = Registry("thing")
    with things.registered("toy", 3) as toy:
        assert toy == 3 and things.get("toy") == 3
    assert "toy" not in things
    with pytest.raises(RuntimeError), things.registered("toy", 3):
        raise RuntimeError
    assert "toy" not in things


def test_the_registry_is_a_leaf_module():
    """Every layer uses it, so it imports nothing of the project."""
    with open(os.path.join(ROOT, "models", "registry.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {name.split(".")[0] for name in imported} & {"models", "objectives", "pretrain", "configs", "scripts"}
