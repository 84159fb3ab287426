"""JAX's persistent compilation cache: on by default for the entry points, movable and off by one variable."""
from __future__ import annotations

import os

import jax
import pytest

from pretrain.runtime import compilation_cache
from tests.helpers.commands import run_train
from tests.helpers.tiny_bert import tiny_overrides


@pytest.fixture
def restore_jax_cache_config():
    before = (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs)
    yield
    jax.config.update("jax_compilation_cache_dir", before[0])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", before[1])


def test_the_variable_moves_or_disables_the_cache(tmp_path, monkeypatch, restore_jax_cache_config):
    monkeypatch.setenv(compilation_cache.ENV, str(tmp_path / "cache"))
    assert compilation_cache.enable() == str(tmp_path / "cache") == jax.config.jax_compilation_cache_dir
    assert os.path.isdir(tmp_path / "cache")
    monkeypatch.setenv(compilation_cache.ENV, "off")
    jax.config.update("jax_compilation_cache_dir", None)
    assert compilation_cache.enable() is None and jax.config.jax_compilation_cache_dir is None
    monkeypatch.delenv(compilation_cache.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compilation_cache.enable() == str(tmp_path / "xdg" / "lmpretrain" / "jax")


def test_an_unusable_directory_warns_and_compiles_without(tmp_path, monkeypatch, capsys, restore_jax_cache_config):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(compilation_cache.ENV, str(tmp_path / "file" / "cache"))
    assert compilation_cache.enable() is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unusable" in err and f"{compilation_cache.ENV}=off" in err


@pytest.mark.slow
def test_pretrain_train_fills_the_cache_and_a_rerun_gives_the_same_result(tmp_path, corpus_and_tokenizer):
    cache = tmp_path / "cache"
    overrides = tiny_overrides(*corpus_and_tokenizer, num_train_steps=2, checkpoint_every=2)
    first = run_train(tmp_path / "a", overrides, env={compilation_cache.ENV: str(cache)})
    assert any(name.startswith("jit_train_step-") for name in os.listdir(cache)), os.listdir(cache)
    second = run_train(tmp_path / "b", overrides, env={compilation_cache.ENV: str(cache)})
    entries = set(os.listdir(cache))  # (a function that compiled faster than the threshold before may join)
    assert first.stdout.splitlines()[-1].split(", tokens_per_sec")[0] == \
        second.stdout.splitlines()[-1].split(", tokens_per_sec")[0]  # the cached executable computes the same
    run_train(tmp_path / "c", overrides, env={compilation_cache.ENV: "off"})
    assert set(os.listdir(cache)) == entries
