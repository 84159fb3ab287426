"""Configs changed as a user's --config.a.b=value flags change them, for the tests of validation."""
from __future__ import annotations

import ml_collections


def changed(config: ml_collections.ConfigDict, **flat) -> ml_collections.ConfigDict:
    """A copy of `config` with each 'a.b' key of `flat` set to its value; `config` itself is left as it was."""
    config = config.copy_and_resolve_references()
    config.unlock()
    config.update_from_flattened_dict(flat)
    return config
