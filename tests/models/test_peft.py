"""The PEFT modules (models/peft/) on their own: LoRA starts as the identity and merges exactly, the
parameter counts follow the papers' formulas, scanned and looped stacks agree, prefixes decode like they
teacher-force, bad settings are one-line errors, and the model families name no PEFT method (they attach from
outside). Parity with the `peft` library: test_peft_parity.py."""
from __future__ import annotations

import dataclasses
import pathlib
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ast

from models import peft, stack, t5
from models.bert import BertConfig, BertModel
from models.bert_tasks import BertForFineTuning
from models.errors import ModelInputError
from models.gpt import GPT, GPTConfig, init_cache, make_tokens_to_logits
from models.gpt_tasks import GPTForFineTuning
from objectives.task_heads import head_kind
from tests.helpers.states import with_base

D, LAYERS, HEADS, FF = 32, 2, 4, 37
IDS = jnp.array([[5, 6, 7, 8, 9, 1, 0, 0], [3, 4, 5, 6, 7, 8, 9, 1]], jnp.int32)
MASK = (IDS != 0).astype(jnp.int32)


BERT = BertConfig(vocab_size=99, hidden_size=D, num_layers=LAYERS, num_heads=HEADS, intermediate_size=FF,
                  max_position_embeddings=40)
GPT_CONFIG = GPTConfig(vocab_size=99, d_model=D, num_layers=LAYERS, num_heads=HEADS, d_ff=FF, n_positions=40)
T5_CONFIG = t5.T5Config(vocab_size=99, d_model=D, num_heads=HEADS, head_dim=8, d_ff=FF, num_encoder_layers=LAYERS,
                        num_decoder_layers=3)


def bert(method="none", kind="classification", num_labels=3, **kw):
    """BERT with a task head and a PEFT method, as the fine-tuning loop builds it: the PEFT config apart."""
    return BertForFineTuning(BERT, head_kind(kind), num_labels, peft=peft.PeftConfig(method=method, **kw))


def gpt(method="none", fused_qkv=False, **kw):
    """GPT with a PEFT method attached from outside (models/peft/model.py)."""
    return peft.attach(GPT(dataclasses.replace(GPT_CONFIG, fused_qkv=fused_qkv)), peft.PeftConfig(method=method, **kw))


def gpt_classifier(method="none", **kw):
    return GPTForFineTuning(GPT_CONFIG, head_kind("classification"), 3, peft=peft.PeftConfig(method=method, **kw))


def t5_model(method="none", fused_qkv=False, **kw):
    """T5 with a PEFT method attached from outside, its parameters at the tree's root as T5's own."""
    return peft.attach(t5.T5(dataclasses.replace(T5_CONFIG, fused_qkv=fused_qkv)),
                       peft.PeftConfig(method=method, **kw))


def apply_bert(model, params):
    return model.apply({"params": params}, IDS, IDS * 0, MASK)["logits"]


def peft_count(params) -> int:
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    return sum(np.size(leaf) for path, leaf in leaves if peft.is_peft_path([str(k.key) for k in path]))


def init(model, *args):
    return nn.unbox(model.init(jax.random.key(0), *args)["params"])


# ------------------------------------------------------------------ LoRA: identity at step 0, exact merge
@pytest.mark.parametrize("family", ["bert", "gpt", "t5"])
def test_lora_with_b_zero_leaves_the_model_unchanged(family):
    """Hu et al.: B = 0 at initialization, so the adapted model is the pretrained one, bitwise."""
    if family == "bert":
        base_model, lora_model, args = bert(), bert("lora", lora_targets=LORA_ALL), (IDS, IDS * 0, MASK)
    elif family == "gpt":
        base_model, lora_model = gpt_classifier(), gpt_classifier("lora", lora_targets=LORA_ALL)
        args = (IDS, MASK)
    else:
        base_model, lora_model, args = t5_model(), t5_model("lora", lora_targets=LORA_ALL), (IDS, IDS)
    base = init(base_model, *args)
    params = with_base(init(lora_model, *args), base)
    assert peft_count(params) > 0
    assert all(not np.any(b) for b in _leaves_named(params, "lora_b"))
    np.testing.assert_array_equal(lora_model.apply({"params": params}, *args)["logits"],
                                  base_model.apply({"params": base}, *args)["logits"])


LORA_ALL = ("query", "key", "value", "out", "intermediate", "output")


def _leaves_named(params, name):
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    return [leaf for path, leaf in leaves if str(path[-1].key) == name]


def test_merged_lora_equals_the_adapted_model():
    """merge_lora folds (alpha / r) A B into each kernel: the plain model then computes the same logits."""
    model = bert("lora", lora_targets=LORA_ALL, lora_rank=4, lora_alpha=16.0)
    params = init(model, IDS, IDS * 0, MASK)
    rng = np.random.default_rng(0)
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: rng.normal(0, 0.2, x.shape).astype(x.dtype) if str(path[-1].key) == "lora_b" else x, params)
    merged = peft.merge_lora(params, 16.0 / 4)
    assert not _leaves_named(merged, "lora_a")
    adapted, plain = apply_bert(model, params), apply_bert(bert(), merged)
    unadapted = apply_bert(bert(), peft.merge_lora(params, 0.0))
    assert np.abs(np.asarray(adapted) - np.asarray(unadapted)).max() > 1e-3  # the update matters here
    np.testing.assert_allclose(plain, adapted, atol=2e-5)


# ------------------------------------------------------------------ parameter counts: the papers' formulas
def test_parameter_counts_follow_the_formulas():
    m, r, p, h = 8, 4, 5, 16
    counts = {method: peft_count(init(bert(method, adapter_size=m, lora_rank=r, prefix_length=p, prompt_length=p,
                                           prefix_hidden_size=h, **kw), IDS, IDS * 0, MASK))
              for method, kw in [("adapters", {}), ("lora", {}), ("prefix", {}), ("prompt", {})]}
    assert counts["adapters"] == LAYERS * 2 * (2 * D * m + D + m)     # Houlsby: two adapters per layer
    assert counts["lora"] == LAYERS * 2 * (D * r + r * D)             # query and value
    out = LAYERS * 2 * D                                               # every layer's keys and values
    assert counts["prefix"] == p * D + (D * h + h) + (h * out + out)  # P' [P, D] through the MLP
    assert counts["prompt"] == p * D
    pfeiffer = peft_count(init(bert("adapters", adapter_size=m, adapter_placement="pfeiffer"), IDS, IDS * 0, MASK))
    assert pfeiffer == LAYERS * (2 * D * m + D + m)
    no_mlp = peft_count(init(bert("prefix", prefix_length=p, prefix_hidden_size=0), IDS, IDS * 0, MASK))
    assert no_mlp == p * out
    # T5: adapters after self-attention and the FFN in the encoder, and after cross-attention too in the decoder
    t5_adapters = peft_count(init(t5_model("adapters", adapter_size=m), IDS, IDS))
    assert t5_adapters == (LAYERS * 2 + 3 * 3) * (2 * D * m + D + m)


# ------------------------------------------------------------------ layouts and decoding
@pytest.mark.parametrize("method", ["lora", "adapters", "prefix", "prompt"])
def test_scanned_and_looped_stacks_agree(method):
    """Prefix-tuning gives each layer its own keys and values: the scanned stack must slice them per layer."""
    kw = dict(prefix_length=3, prompt_length=3, adapter_size=8, prefix_hidden_size=0)
    looped = bert(method, **kw)
    scanned = looped.clone(config=dataclasses.replace(looped.config, scan_layers=True))
    params = init(looped, IDS, IDS * 0, MASK)
    params = jax.tree.map(lambda x: x + np.random.default_rng(1).normal(0, 0.05, x.shape).astype(x.dtype), params)
    np.testing.assert_allclose(apply_bert(scanned, stack.stack_layers(params)), apply_bert(looped, params), atol=1e-5)


@pytest.mark.parametrize("fused_qkv", [False, True])
def test_gpt_prefix_decodes_like_teacher_forcing(fused_qkv):
    """The prefix joins the key/value cache's keys at every step; positions start at P as in training."""
    model = gpt("prefix", fused_qkv, prefix_length=4, prefix_hidden_size=8)
    ids = IDS[:, :6]
    params = init(model, ids)
    full = model.apply({"params": params}, ids)["logits"]
    cache, step = init_cache(model, params, 2, 6), make_tokens_to_logits(model, params)
    stepped = []
    for t in range(6):
        logits, cache = step(ids[:, t:t + 1], cache, t)
        stepped.append(logits)
    np.testing.assert_allclose(jnp.stack(stepped, 1), full, atol=1e-5)


@pytest.mark.parametrize("fused_qkv", [False, True])
def test_t5_prefix_and_prompt_decode_like_teacher_forcing(fused_qkv):
    for method in ("prefix", "prompt"):
        model = t5_model(method, fused_qkv, prefix_length=4, prompt_length=3, prefix_hidden_size=8)
        decoder_ids = jnp.array([[0, 8, 9, 10], [0, 11, 12, 13]], jnp.int32)
        params = init(model, IDS, decoder_ids)
        full = model.apply({"params": params}, IDS, decoder_ids)["logits"]
        encoded = model.apply({"params": params}, IDS, method="encode")
        assert encoded.shape[1] == IDS.shape[1] + (3 if method == "prompt" else 0)
        mask = t5.encoder_segments_of(IDS, None, encoded.shape[1] - IDS.shape[1]) != 0
        step = t5.make_tokens_to_logits(model, params, encoded, mask)
        cache, stepped = t5.init_cache(model, params, 2, 4), []
        for t in range(4):
            logits, cache = step(decoder_ids[:, t:t + 1], cache, t)
            stepped.append(logits)
        np.testing.assert_allclose(jnp.stack(stepped, 1), full, atol=1e-5)


def test_a_method_attaches_once_however_entry_methods_nest():
    """T5.__call__ runs encode and decode, each an entry method the PEFT wrapper runs under its interceptor
    (models/peft/model.py): LoRA must adapt each projection once, as when encode and decode run on their own."""
    model = t5_model("lora", lora_targets=LORA_ALL)
    params = init(model, IDS, IDS)
    rng = np.random.default_rng(0)
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: rng.normal(0, 0.2, x.shape).astype(x.dtype) if str(path[-1].key) == "lora_b" else x, params)
    encoded = model.apply({"params": params}, IDS, method="encode")
    decoded = model.apply({"params": params}, encoded, (IDS != 0).astype(jnp.int32), IDS, method="decode")
    np.testing.assert_array_equal(model.apply({"params": params}, IDS, IDS)["logits"], decoded)
    base = t5_model()
    unadapted = base.apply({"params": peft.merge_lora(params, 0.0)}, IDS, IDS)["logits"]
    assert np.abs(np.asarray(unadapted) - np.asarray(decoded)).max() > 1e-3  # the update matters here
    merged = base.apply({"params": peft.merge_lora(params, 8.0 / 8)}, IDS, IDS)["logits"]  # alpha / r, applied once
    np.testing.assert_allclose(merged, decoded, atol=2e-5)


# ------------------------------------------------------------------ bad settings: one line each
@pytest.mark.parametrize("build, message", [
    (lambda: peft.PeftConfig(method="bitfit"), "peft.method='bitfit' is not one of"),
    (lambda: peft.PeftConfig(method="lora", lora_targets=("query", "gate")), "peft.lora_targets"),
    (lambda: peft.attach(BertModel(BERT), peft.PeftConfig(method="lora", lora_rank=33)),
     "peft.lora_rank=33 exceeds the query projection's rank 32"),
    (lambda: peft.attach(BertModel(BertConfig(hidden_size=32, num_heads=4, intermediate_size=16)), peft.PeftConfig(
        method="lora", lora_rank=20, lora_targets=("output",))), "exceeds the output projection's rank 16"),
    (lambda: peft.attach(BertModel(BERT), peft.PeftConfig(method="adapters", adapter_size=64)),
     "peft.adapter_size=64 is wider than the model (32)"),
    (lambda: gpt("prefix", prefix_length=40), "peft.prefix_length=40 leaves no room"),
    (lambda: gpt("prompt", prompt_length=50), "peft.prompt_length=50 leaves no room"),
    (lambda: peft.PeftConfig(method="lora", lora_rank=0), "peft.lora_rank=0 must be a positive integer"),
])
def test_bad_settings_are_one_line_errors(build, message):
    with pytest.raises(ModelInputError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        build()
    assert "\n" not in str(info.value)


def test_inputs_that_outgrow_the_positions_are_errors():
    model = bert("prompt", prompt_length=35)  # 35 + 8 tokens > 40 positions
    with pytest.raises(ModelInputError, match="8 tokens \\+ 35 virtual ones exceed the model's 40 positions"):
        model.init(jax.random.key(0), IDS, IDS * 0, MASK)
    prompted = gpt("prompt", prompt_length=3)
    params = init(prompted, IDS)
    with pytest.raises(ModelInputError, match="decode=True with prompt tuning is not supported"):
        prompted.apply({"params": params}, IDS[:, :1], decode=True, mutable=["cache"])


@pytest.mark.parametrize("method", ["prompt", "prefix"])
def test_token_level_heads_see_the_inputs_positions_only(method):
    """Tagging, span and QA heads read one state per input token: prompt tuning's virtual positions are cut
    off the sequence output (and prefix-tuning adds none), so the heads' shapes and gathers are unchanged."""
    settings = dict(prompt_length=3, prefix_length=3, prefix_hidden_size=0)
    spans = jnp.array([[[1, 2], [3, 5]], [[0, 0], [2, 7]]], jnp.int32)
    for kind, inputs, shape in [("tagging", {}, (2, 8, 5)), ("span", {"spans": spans}, (2, 2, 5)), ("qa", {}, (2, 8))]:
        model = bert(method, kind, 5, **settings)
        params = nn.unbox(model.init(jax.random.key(0), IDS, IDS * 0, MASK, **inputs)["params"])
        out = model.apply({"params": params}, IDS, IDS * 0, MASK, **inputs)
        assert next(iter(out.values())).shape == shape, (kind, out)


# ------------------------------------------------------------------ the base models name no PEFT method
# Every PEFT method's vocabulary; not GPT's prefix LM (prefix_lengths, bidirectional_mask) nor a generation prompt.
PEFT_WORDS = re.compile(r"(?i:peft|lora|adapter|prefix_encoder|prefix[-_ ]tuning|prompt[-_ ]tuning|virtual_positions"
                        r"|prompt_length|prefix_length\b|self\.prompt\b)|PrefixEncoder|\bPrompt\b")
PEFT_FREE = ("bert.py", "modernbert.py", "gpt.py", "t5.py", "layers.py", "attention.py", "stack.py")


@pytest.mark.parametrize("text, named", [
    ("peft.Adapter(", True), ("c.peft.prompt_length", True), ("lora=lora_for(self.peft, name)", True),
    ("self.prefix_encoder()", True), ("PrefixEncoder(", True), ("self.prompt(batch)", True), ("Prompt(", True),
    ("# prefix-tuning's keys", True), ("prompt tuning", True), ("c.peft.prefix_length,", True),
    ("LoRA on the projections", True), ("houlsby adapters", True), ("config.peft.virtual_positions", True),
    ("prefix_lengths: jax.Array | None = None", False), ("bidirectional_mask", False), ("prefix LM", False),
    ("For a prompt, see decoding.split_prompts", False), ("(generate fewer tokens or shorten the prompt)", False),
])
def test_the_peft_vocabulary_is_recognised(text, named):
    assert bool(PEFT_WORDS.search(text)) == named


@pytest.mark.parametrize("name", PEFT_FREE)
def test_base_models_name_no_peft_method(name):
    """BERT, ModernBERT, GPT, T5 and their building blocks name no PEFT method: models/peft/ attaches them from outside
    (models/peft/model.py), through the base models' explicit inputs and a generic hook (models/layers.py Sublayers)."""
    path = pathlib.Path(__file__).parents[2] / "models" / name
    named = [f"{name}:{i}: {line.strip()}" for i, line in enumerate(path.read_text().splitlines(), 1)
             if PEFT_WORDS.search(line)]
    assert not named, "\n".join(named)


BASE_MODELS = ("bert.py", "gpt.py", "t5.py", "modernbert.py")


def _imported_modules(path: pathlib.Path) -> set[str]:
    """Every module `path` imports, with each `from X import name` also as X.name (a submodule may be imported so)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


@pytest.mark.parametrize("name", BASE_MODELS)
def test_base_models_import_no_peft(name):
    """The base model files import neither models/peft nor a PEFT extension module: what PEFT needs enters as explicit
    optional inputs (leading embeddings, keys and values), and LoRA and adapters attach from outside."""
    modules = _imported_modules(pathlib.Path(__file__).parents[2] / "models" / name)
    forbidden = [m for m in modules if m.startswith(("models.peft", "models.extension"))]
    assert not forbidden, f"models/{name} imports {forbidden}"
