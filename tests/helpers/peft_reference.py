"""The two sides of tests/models/test_peft_parity.py: tiny Hugging Face models with peft, ours converted from
them, the weight copies between peft's layouts and ours, and the inputs (see that file's docstring for the
mapping)."""
from __future__ import annotations

import math

import flax.core.meta
import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers
from peft import LoraConfig, PrefixTuningConfig, PromptTuningConfig, TaskType, get_peft_model

from models.convert.hf_bert import bert_params_from_hf, hf_config_to_bert
from models.convert.hf_gpt2 import gpt_params_from_hf, hf_config_to_gpt
from models.convert.hf_t5 import hf_config_to_t5, t5_params_from_hf
from models.bert_tasks import BertForFineTuning
from objectives.task_heads import head_kind
from models.gpt_tasks import GPTForFineTuning
from models.peft import NONE, PeftConfig, attach, is_peft_path
from models.t5 import T5

VOCAB, WIDTH, HEADS, HEAD_DIM, LABELS = 99, 32, 4, 8, 3
VIRTUAL = 3          # P: prefix / prompt length
PREFIX_HIDDEN = 16   # the prefix reparameterization's width (peft's encoder_hidden_size)
RANK, ALPHA = 4, 12.0  # the forward tests' LoRA: scale 3, neither default
T5_LAYERS = 3        # encoder = decoder depth (peft's prefix takes num_layers from the encoder), odd: see above
TOLERANCE = 1e-4
METHODS = ("lora", "prefix", "prefix-mlp", "prompt")


# ---------------------------------------------------------------------------------------------
# Tiny Hugging Face models and our counterparts
# ---------------------------------------------------------------------------------------------
def randomize_norms_and_biases(model: torch.nn.Module) -> torch.nn.Module:
    """HF initialises norms to 1 and biases to 0: perturb them so that a mapping mistake shows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.3 * torch.randn_like(p))
            elif "norm" in name.lower() or ".ln_" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model.eval()


def hf_bert() -> transformers.BertForSequenceClassification:
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=WIDTH, num_hidden_layers=2,
                                     num_attention_heads=HEADS, intermediate_size=37, max_position_embeddings=64,
                                     num_labels=LABELS, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                     initializer_range=0.2)  # O(1) activations
    return randomize_norms_and_biases(transformers.BertForSequenceClassification(config))


def hf_gpt2() -> transformers.GPT2ForSequenceClassification:
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=WIDTH, n_layer=2, n_head=HEADS,
                                     num_labels=LABELS, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     initializer_range=0.2, pad_token_id=0, bos_token_id=1, eos_token_id=1)
    return randomize_norms_and_biases(transformers.GPT2ForSequenceClassification(config))


def hf_t5() -> transformers.T5ForConditionalGeneration:
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=VOCAB, d_model=WIDTH, d_kv=HEAD_DIM, num_heads=HEADS, d_ff=37,
                                   num_layers=T5_LAYERS, num_decoder_layers=T5_LAYERS, dropout_rate=0.0,
                                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    return randomize_norms_and_biases(transformers.T5ForConditionalGeneration(config))


def numpy_state(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def ours_bert(hf, peft: PeftConfig | None) -> tuple[BertForFineTuning, dict]:
    """(our model, the HF model's base weights and head in our tree) for a BertForSequenceClassification."""
    config = hf_config_to_bert(hf.config.to_dict())
    state = numpy_state(hf)
    params = bert_params_from_hf(state, config)
    params["head"] = {"classifier": {"kernel": state["classifier.weight"].T, "bias": state["classifier.bias"]}}
    return BertForFineTuning(config, head_kind("classification"), LABELS, peft=peft or NONE), params


def ours_gpt2(hf, peft: PeftConfig | None) -> tuple[GPTForFineTuning, dict]:
    config = hf_config_to_gpt(hf.config.to_dict())
    state = numpy_state(hf)
    score = state.pop("score.weight")
    model = GPTForFineTuning(config, head_kind("classification"), LABELS, peft=peft or NONE)
    return model, {"gpt": gpt_params_from_hf(state, config), "score": {"kernel": score.T}}


def ours_t5(hf, peft: PeftConfig | None) -> tuple[T5, dict]:
    """(T5 with the PEFT method attached from outside, the HF model's weights in our tree)."""
    config = hf_config_to_t5(hf.config.to_dict(), untied_lm_head=False)
    return attach(T5(config), peft or NONE), t5_params_from_hf(numpy_state(hf), config)


def peft_configs(method: str, task: TaskType, *, rank: int = 8, alpha: float = 8.0):
    """(peft's config, ours) for the same settings. rank/alpha: LoRA's (peft's and our defaults: 8, 8)."""
    if method == "lora":
        return (LoraConfig(task_type=task, r=rank, lora_alpha=alpha),
                PeftConfig(method="lora", lora_rank=rank, lora_alpha=alpha))
    if method == "prefix":
        return (PrefixTuningConfig(task_type=task, num_virtual_tokens=VIRTUAL),
                PeftConfig(method="prefix", prefix_length=VIRTUAL, prefix_hidden_size=0))
    if method == "prefix-mlp":
        return (PrefixTuningConfig(task_type=task, num_virtual_tokens=VIRTUAL, prefix_projection=True,
                                   encoder_hidden_size=PREFIX_HIDDEN),
                PeftConfig(method="prefix", prefix_length=VIRTUAL, prefix_hidden_size=PREFIX_HIDDEN))
    assert method == "prompt"
    # T5: peft's default (2 submodules for SEQ_2_SEQ_LM) allocates P more rows for the decoder that its
    # forward never reads; one submodule is the same function with only the rows in use.
    extra = {"num_transformer_submodules": 1} if task == TaskType.SEQ_2_SEQ_LM else {}
    return (PromptTuningConfig(task_type=task, num_virtual_tokens=VIRTUAL, **extra),
            PeftConfig(method="prompt", prompt_length=VIRTUAL))


# ---------------------------------------------------------------------------------------------
# Parameter trees
# ---------------------------------------------------------------------------------------------
def init_shapes(model, *inputs) -> dict:
    """Our model's parameter shapes (no weights computed)."""
    arrays = [jnp.zeros(np.shape(x), jnp.int32) for x in inputs]
    return flax.core.meta.unbox(jax.eval_shape(lambda: model.init(jax.random.key(0), *arrays)))["params"]


def path_names(path) -> tuple[str, ...]:
    return tuple(str(getattr(key, "key", key)) for key in path)


def our_trainable_count(model, inputs, head: str | None) -> int:
    leaves = jax.tree_util.tree_flatten_with_path(init_shapes(model, *inputs))[0]
    return sum(math.prod(leaf.shape) for path, leaf in leaves
               if is_peft_path(path_names(path)) or path_names(path)[0] == head)


def peft_trainable_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def put(tree: dict, path: tuple[str, ...], value) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = np.asarray(value, np.float32)


def assert_complete(model, params: dict, inputs) -> None:
    """The tree we built has exactly the parameters (and shapes) our model initialises: none left at random."""
    def shapes(tree):
        return {path_names(p): tuple(np.shape(x)) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}
    assert shapes(params) == shapes(init_shapes(model, *inputs))


def randomize_peft_weights(model: torch.nn.Module, seed: int = 0) -> None:
    """Every trainable PEFT tensor (not the copied task head) drawn at random: tables N(0, 1), matrices
    N(0, 1/fan_in) (so LoRA's B is nonzero), biases N(0, 0.3^2)."""
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not p.requires_grad or "modules_to_save" in name:
                continue
            if "embedding" in name:
                scale = 1.0
            elif p.ndim == 1:
                scale = 0.3
            else:
                scale = 1 / math.sqrt(p.shape[1])
            p.copy_(torch.from_numpy((scale * rng.standard_normal(tuple(p.shape))).astype(np.float32)))


def t(x) -> np.ndarray:
    return x.detach().numpy()


def copy_lora(params: dict, ours_path: tuple[str, ...], module) -> None:
    """peft's lora_A [r, in], lora_B [H*K, r] of a q/v projection -> our lora_a [in, r], lora_b [r, H, K]."""
    a, b = t(module.lora_A["default"].weight), t(module.lora_B["default"].weight)
    put(params, (*ours_path, "lora_a"), a.T)
    put(params, (*ours_path, "lora_b"), b.T.reshape(b.shape[1], HEADS, HEAD_DIM))


def copy_prefix_or_prompt(params: dict, body: tuple[str, ...], peft_model, columns: np.ndarray | None = None) -> None:
    """peft's prompt encoder -> `body`/prefix_encoder or `body`/prompt. `columns`: our flat key/value
    columns in terms of peft's (T5's layer scrambling); the reparameterization's output rows follow them."""
    encoder = peft_model.prompt_encoder["default"]
    table = t(encoder.embedding.weight)
    if peft_model.peft_config["default"].peft_type == "PROMPT_TUNING":
        put(params, (*body, "prompt", "embedding"), table)
        return
    prefix = (*body, "prefix_encoder")
    keep = slice(None) if columns is None else columns
    if peft_model.peft_config["default"].prefix_projection:
        put(params, (*prefix, "embedding"), table)
        put(params, (*prefix, "transform", "kernel"), t(encoder.transform[0].weight).T)
        put(params, (*prefix, "transform", "bias"), t(encoder.transform[0].bias))
        put(params, (*prefix, "output", "kernel"), t(encoder.transform[2].weight).T[:, keep])
        put(params, (*prefix, "output", "bias"), t(encoder.transform[2].bias)[keep])
    else:
        put(params, (*prefix, "embedding"), table[:, keep])


def assert_close(ours, expected, base) -> None:
    ours = np.asarray(ours)
    assert ours.shape == expected.shape
    assert np.abs(expected - base).max() > 100 * TOLERANCE, "the PEFT weights barely change peft's logits"
    np.testing.assert_allclose(ours, expected, atol=TOLERANCE, rtol=0)


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------
def bert_batch(seed: int = 0):
    """ids, token types, mask [3, 10]: right-padded rows (row 0 full), two segments."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, (3, 10))
    mask = (np.arange(10)[None] < np.array([[10], [6], [8]])).astype(np.int64)
    segments = ((np.arange(10)[None] >= np.array([[5], [3], [4]])) & (mask == 1)).astype(np.int64)
    return ids * mask, segments, mask


def gpt2_batch(padding: bool, seed: int = 0):
    """ids, mask [3, 9], ids >= 1 (0 is the pad id peft's GPT-2 classifier looks for); right-padded or not."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, (3, 9))
    lengths = np.array([[9], [5], [7]]) if padding else np.full((3, 1), 9)
    mask = (np.arange(9)[None] < lengths).astype(np.int64)
    return ids * mask, mask


def t5_batch(seed: int = 0):
    """encoder ids [3, 10] (id 0 = padding, rows of 10, 6, 8 tokens), decoder ids [3, 7] starting with 0."""
    rng = np.random.default_rng(seed)
    encoder = rng.integers(2, VOCAB, (3, 10)) * (np.arange(10)[None] < np.array([[10], [6], [8]]))
    decoder = rng.integers(2, VOCAB, (3, 7))
    decoder[:, 0] = 0
    return encoder, decoder


def run_ours(model, params, *inputs) -> np.ndarray:
    """Our logits. Compiling dominates on models this small: XLA's optimization level 0 halves it (the
    float32 results agree with peft's either way)."""
    args = ({"params": params}, *(jnp.asarray(x, jnp.int32) for x in inputs))
    compiled = jax.jit(model.apply).lower(*args).compile(compiler_options={"xla_backend_optimization_level": 0})
    return np.asarray(compiled(*args)["logits"])


def torch_ints(*arrays):
    return [torch.from_numpy(np.asarray(a, np.int64)) for a in arrays]


def logits(model: torch.nn.Module, inputs: dict) -> np.ndarray:
    with torch.no_grad():
        return model(**inputs).logits.numpy()


def with_random_peft(hf: torch.nn.Module, peft_config, inputs: dict):
    """-> (the base model's logits, the peft model built on it with random PEFT weights, in eval mode)."""
    base = logits(hf, inputs)
    peft_model = get_peft_model(hf, peft_config).eval()
    randomize_peft_weights(peft_model)
    return base, peft_model

