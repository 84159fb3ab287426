"""Objectives, built by name from `config.objective` (the table: objectives/registry.py). Each owns its batch
construction and loss and implements objectives.interface.Objective."""
from __future__ import annotations

from objectives.registry import build_objective, names

__all__ = ["build_objective", "names"]
