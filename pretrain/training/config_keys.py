"""Config keys owned by registered things: the ranges they declare, and the check validation runs on them.

An extension point (an optimizer, a schedule, a freezing strategy, a tokenizer, a data source) is a Registry of
things, each registered by one decorator that also declares the config keys it reads and their ranges:

    @config_keys.declare(OPTIMIZERS, "adamw", b1=UNIT_INTERVAL_OPEN, b2=UNIT_INTERVAL_OPEN, eps=POSITIVE_FLOAT)
    def adamw(config, schedule): ...

and the room that owns the registry names the key that chooses among them (`chosen_by("optimizer.name",
OPTIMIZERS)`), so validation (pretrain/training/validation.py) checks the choice against `registry.names()` and
the keys against the chosen thing's ranges without a table of its own. A room above training (pretrain/data)
announces its registries when it is imported, which every entry point does before it validates.

A rule is (check, what is allowed), the allowed text completing "it must be ..." in the one-line error.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import ml_collections

from models.registry import Registry
from pretrain.runtime.errors import ConfigError

Rule = tuple[Callable[[Any], bool], str]


def integer(low: int) -> Rule:
    return (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low,
            "a positive integer" if low == 1 else f"an integer >= {low}")


def number(low: float, high: float = math.inf, low_open: bool = False, high_open: bool = False,
           what: str = "") -> Rule:
    def ok(v) -> bool:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return False
        return (v > low if low_open else v >= low) and (v < high if high_open else v <= high)
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    return ok, what or (f"a finite number {'>' if low_open else '>='} {low:g}" if high == math.inf
                        else f"a number in {interval}")


def choice(*names: Any) -> Rule:
    return (lambda v: v in names), "one of " + ", ".join(map(repr, names))


POSITIVE, NON_NEGATIVE = integer(1), integer(0)
POSITIVE_FLOAT, NON_NEGATIVE_FLOAT = number(0, low_open=True), number(0)
PROBABILITY = number(0, 1, low_open=True, high_open=True, what="a probability in (0, 1)")
SHARE = number(0, 1, what="a number in [0, 1]")
DROPOUT = number(0, 1, high_open=True, what="a dropout rate in [0, 1)")
UNIT_INTERVAL_OPEN = number(0, 1, high_open=True)  # [0, 1): Adam's betas
FRACTION = number(0, 1, low_open=True, high_open=True, what="a fraction in (0, 1)")
BOOLEAN = choice(True, False)


def fail(key: str, value: Any, allowed: str) -> ConfigError:
    """The one-line error of a bad value: the key, the value, what is allowed and the flag that changes it."""
    return ConfigError(f"config.{key}={value!r} is invalid: it must be {allowed} (--config.{key}=...)")


# ----- Registration with declared keys. -----
def declare(registry: Registry, name: str, capabilities: Mapping[str, Any] | None = None,
            **keys: Rule) -> Callable[[Any], Any]:
    """A decorator: the decorated thing registered in `registry` as `name`, its `config_keys` the rules of the keys
    it reads (relative to the config section that chooses it: `b1` for config.optimizer.b1), and each of
    `capabilities` an attribute of it (readers ask those, never the name)."""
    def register(thing):
        thing.config_keys = dict(keys)
        for attribute, value in (capabilities or {}).items():
            setattr(thing, attribute, value)
        return registry.register(name, thing)
    return register


# "section.key" that chooses a thing -> (its registry, the rules of keys every thing of it reads, the top-level key a
# config must have for the choice to be this registry's, or None).
_CHOOSERS: dict[str, tuple[Registry, dict[str, Rule], str | None]] = {}


def chosen_by(key: str, registry: Registry, within: str | None = None, **shared: Rule) -> Registry:
    """Announces that config.`key` names one thing of `registry`; `shared`: the section's keys every thing reads
    (the optimizers' grad_clip_norm); `within`: only in configs with that top-level key (a pretraining config's
    `objective`, where another kind of config gives the same key another meaning). Idempotent, so a module may be
    re-imported."""
    _CHOOSERS[key] = (registry, dict(shared), within)
    return registry


def check_chosen(config: ml_collections.ConfigDict) -> None:
    """Every choosing key the config has names a registered thing, and the keys of its section are in the ranges
    their owners declare: the chosen thing's own rule first, then the registry's shared keys, then any other
    thing's (a config may carry a key for another choice, e.g. decay_fraction beside warmup_linear_decay)."""
    for key, (registry, shared, within) in _CHOOSERS.items():
        if within is not None and within not in config:
            continue
        section_name, _, leaf = key.rpartition(".")
        section = config.get(section_name) if section_name else config
        if not isinstance(section, ml_collections.ConfigDict) or leaf not in section:
            continue
        name = section[leaf]
        if name not in registry:
            raise fail(key, name, choice(*registry.names())[1])
        _check_section(section_name, section, _owned_rules(registry, name, shared))


def _owned_rules(registry: Registry, chosen: str, shared: dict[str, Rule]) -> dict[str, Rule]:
    """key -> rule, a key's first owner winning: the chosen thing, the registry's shared keys, the others."""
    merged: dict[str, Rule] = {}
    others = [registry.get(name) for name in registry.names() if name != chosen]
    for thing_keys in [getattr(registry.get(chosen), "config_keys", {}), shared,
                       *(getattr(other, "config_keys", {}) for other in others)]:
        for leaf, rule in thing_keys.items():
            merged.setdefault(leaf, rule)
    return merged


def _check_section(section_name: str, section: ml_collections.ConfigDict, rules: dict[str, Rule]) -> None:
    for leaf, (ok, allowed) in rules.items():
        if leaf in section and not isinstance(section[leaf], ml_collections.ConfigDict) and not ok(section[leaf]):
            raise fail(f"{section_name}.{leaf}" if section_name else leaf, section[leaf], allowed)
