"""A T5-style encoder-decoder as pure JAX functions (Raffel et al., 2020), usable from scratch at small sizes.

Matches Hugging Face's T5 (v1.0 'relu' and v1.1 'gated-gelu'): RMS layer norm without bias, bucketed
relative position biases (computed by the first layer of each stack and shared by all its layers),
unscaled dot-product attention, tied embeddings with the d_model**-0.5 output scaling (or an untied
head), decoder start token = pad (0). Checkpoints in Hugging Face naming load with `load_hf_t5`.

  params = init_params(key, config)
  logits = forward(params, config, enc_ids, enc_mask, dec_ids)          # [B, T, V] teacher forcing
  loss, metrics = seq2seq_loss(params, config, batch)                  # batch: inputs, input_mask, labels, label_mask
  out = generate(params, config, enc_ids, enc_mask, key, max_new_tokens=16)   # KV cache, lax.while_loop

The encoder also takes input embeddings instead of ids (`encode(..., embeds=[B, S, D])`,
`seq2seq_loss(..., input_embeds=...)`, `generate(..., enc_embeds=...)`: an inverter feeds projected
probability vectors), and `generate(..., decoder_prefix=[B, K])` decodes after given tokens placed right
after the decoder start token (control codes). `T5Config.from_tokenizer(tok)` takes the vocabulary size
and the pad/EOS ids from a tokenizer (`train_bpe` gives pad 0, BOS 1, EOS 2; T5's own vocabulary has EOS 1).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
from typing import Any, Mapping, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common.sharding import constrain_batch
from iclr24_jax.lm import layers
from iclr24_jax.lm.generation import GenerationOutput, decode_loop, sample_token

_NEG = -1e30


@dataclasses.dataclass(frozen=True)
class T5Config:
  """T5 hyper-parameters (defaults: a small model trainable on CPU; t5-small is d_model=512, d_ff=2048,
  d_kv=64, 8 heads, 6+6 layers, vocab 32128)."""

  vocab_size: int = 512
  d_model: int = 128
  d_kv: int = 32
  d_ff: int = 256
  num_layers: int = 2
  num_decoder_layers: int | None = None
  num_heads: int = 4
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128
  feed_forward_proj: str = "relu"  # 'relu' (T5 v1.0) or 'gated-gelu' (T5 v1.1, flan-t5)
  tie_word_embeddings: bool = True
  norm_eps: float = 1e-6
  pad_id: int = 0
  eos_id: int = 1
  decoder_start_id: int = 0
  max_seq_len: int = 512
  scan_layers: bool = False  # init_params stacks each stack's layers ([L, ...] leaves, one lax.scan per stack)
  remat: str = "none"  # 'none' | 'full' | 'dots': rematerialise each layer without a cache (see lm.llama)

  def __post_init__(self):
    if self.feed_forward_proj not in ("relu", "gated-gelu"):
      raise ValueError(f"feed_forward_proj={self.feed_forward_proj!r}; choose 'relu' or 'gated-gelu'.")
    if self.remat not in ("none", "full", "dots"):
      raise ValueError(f"T5Config.remat={self.remat!r}; choose 'none', 'full' or 'dots'.")
    for name in ("pad_id", "eos_id", "decoder_start_id"):
      value = getattr(self, name)
      if not 0 <= value < self.vocab_size:
        raise ValueError(f"T5Config.{name}={value} is outside the vocabulary [0, {self.vocab_size}); build the "
                         "config with T5Config.from_tokenizer(tok) so the special ids match the tokenizer.")

  @classmethod
  def from_tokenizer(cls, tok: Any, *, decoder_start: str = "pad", **changes) -> "T5Config":
    """A config whose vocabulary size and pad / EOS / decoder-start ids come from a tokenizer.

    Args:
      tok: an `lm.Tokenizer` (e.g. from `train_bpe`: pad 0, BOS 1, EOS 2) or anything with `vocab_size`,
        `pad_id`, `eos_id` (and `bos_id` for decoder_start='bos').
      decoder_start: 'pad' (T5's convention: the decoder starts from the pad id) or 'bos'.
      **changes: other T5Config fields (d_model, num_layers, ...); `vocab_size` may round the tokenizer's
        size up (e.g. to a multiple of 128) but not below it.

    Returns:
      T5Config with pad_id, eos_id, decoder_start_id set from the tokenizer.

    Raises:
      ValueError: the tokenizer has no EOS id, decoder_start is unknown, or vocab_size is too small.
    """
    if getattr(tok, "eos_id", None) is None:
      raise ValueError("the tokenizer has no eos_id; T5 needs one to end its outputs (give the tokenizer an EOS "
                       "special token, e.g. train_bpe's default '<eos>').")
    if decoder_start not in ("pad", "bos"):
      raise ValueError(f"decoder_start={decoder_start!r}; choose 'pad' (T5) or 'bos'.")
    start = tok.pad_id if decoder_start == "pad" else getattr(tok, "bos_id", None)
    if start is None:
      raise ValueError("decoder_start='bos' but the tokenizer has no bos_id.")
    vocab = int(changes.pop("vocab_size", tok.vocab_size))
    if vocab < tok.vocab_size:
      raise ValueError(f"vocab_size={vocab} is smaller than the tokenizer's {tok.vocab_size} ids.")
    for key in ("pad_id", "eos_id", "decoder_start_id"):
      if key in changes:
        raise ValueError(f"from_tokenizer sets {key} from the tokenizer; use T5Config(...) to set it by hand.")
    return cls(vocab_size=vocab, pad_id=int(tok.pad_id), eos_id=int(tok.eos_id), decoder_start_id=int(start),
               **changes)

  @property
  def n_dec(self) -> int:
    return self.num_decoder_layers if self.num_decoder_layers is not None else self.num_layers


# Released sizes (the config.json files of t5-base / t5-large (v1.0, ReLU, tied head) and google/flan-t5-large /
# flan-t5-xl (v1.1, gated GELU, untied head)); vocabulary 32128, pad 0, EOS 1.
T5_SHAPES = {
    "t5-base": dict(d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_heads=12, feed_forward_proj="relu",
                    tie_word_embeddings=True),
    "t5-large": dict(d_model=1024, d_kv=64, d_ff=4096, num_layers=24, num_heads=16, feed_forward_proj="relu",
                     tie_word_embeddings=True),
    "flan-t5-large": dict(d_model=1024, d_kv=64, d_ff=2816, num_layers=24, num_heads=16,
                          feed_forward_proj="gated-gelu", tie_word_embeddings=False),
    "flan-t5-xl": dict(d_model=2048, d_kv=64, d_ff=5120, num_layers=24, num_heads=32,
                       feed_forward_proj="gated-gelu", tie_word_embeddings=False),
}


def named_config(name: str, **changes) -> T5Config:
  """A released T5 architecture by name ('t5-base', 't5-large', 'flan-t5-large', 'flan-t5-xl').

  Args:
    name: a key of T5_SHAPES.
    **changes: other T5Config fields (e.g. vocab_size for an inverter's decoder vocabulary).

  Returns:
    T5Config with the released vocabulary (32128), pad 0 / EOS 1 / decoder start 0.

  Raises:
    ValueError: unknown name.
  """
  if name not in T5_SHAPES:
    raise ValueError(f"unknown T5 size {name!r}; choose one of {sorted(T5_SHAPES)}.")
  base = dict(vocab_size=32128, pad_id=0, eos_id=1, decoder_start_id=0, **T5_SHAPES[name])
  base.update(changes)
  return T5Config(**base)


# ----------------------------------------------------------------------------------------------- params


def _attn_init(key, config, dtype):
  inner = config.num_heads * config.d_kv
  k = jax.random.split(key, 4)
  std_q = (config.d_model * config.d_kv) ** -0.5  # HF's T5 init (it absorbs the missing 1/sqrt(d) scaling)
  return {"q": layers.dense_init(k[0], config.d_model, inner, dtype, std=std_q),
          "k": layers.dense_init(k[1], config.d_model, inner, dtype, std=config.d_model ** -0.5),
          "v": layers.dense_init(k[2], config.d_model, inner, dtype, std=config.d_model ** -0.5),
          "o": layers.dense_init(k[3], inner, config.d_model, dtype, std=inner ** -0.5)}


def _mlp_init(key, config, dtype):
  k = jax.random.split(key, 3)
  p = {"wo": layers.dense_init(k[2], config.d_ff, config.d_model, dtype, std=config.d_ff ** -0.5)}
  if config.feed_forward_proj == "gated-gelu":
    p["wi_0"] = layers.dense_init(k[0], config.d_model, config.d_ff, dtype, std=config.d_model ** -0.5)
    p["wi_1"] = layers.dense_init(k[1], config.d_model, config.d_ff, dtype, std=config.d_model ** -0.5)
  else:
    p["wi"] = layers.dense_init(k[0], config.d_model, config.d_ff, dtype, std=config.d_model ** -0.5)
  return p


def init_params(key: jax.Array, config: T5Config, dtype=jnp.float32) -> dict:
  """Random T5 parameters (Hugging Face's initialisation scheme).

  Args:
    key: PRNG key.
    config: T5Config (vocab_size V, d_model D, num_heads H, num_layers / n_dec, feed_forward_proj).
    dtype: parameter dtype.

  Returns:
    {'shared': [V, D], 'encoder': {'rel_bias': [buckets, H], 'layers': [...], 'final_norm'},
     'decoder': {... each layer also has 'cross_attn'}, 'lm_head' (untied only)}.
  """
  d = config.d_model
  ones = lambda: {"scale": jnp.ones((d,), dtype)}  # noqa: E731
  keys = jax.random.split(key, 5)
  params = {"shared": jax.random.normal(keys[0], (config.vocab_size, d), jnp.float32).astype(dtype)}
  for name, n, k in (("encoder", config.num_layers, keys[1]), ("decoder", config.n_dec, keys[2])):
    ks = jax.random.split(k, n + 1)
    stack = {"rel_bias": (d ** -0.5 * jax.random.normal(ks[0], (config.relative_attention_num_buckets,
                                                                 config.num_heads))).astype(dtype),
             "layers": [], "final_norm": ones()}
    for i in range(n):
      kk = jax.random.split(ks[i + 1], 3)
      layer = {"attn_norm": ones(), "self_attn": _attn_init(kk[0], config, dtype), "mlp_norm": ones(),
               "mlp": _mlp_init(kk[1], config, dtype)}
      if name == "decoder":
        layer["cross_norm"] = ones()
        layer["cross_attn"] = _attn_init(kk[2], config, dtype)
      stack["layers"].append(layer)
    params[name] = stack
  if not config.tie_word_embeddings:
    params["lm_head"] = layers.dense_init(keys[3], d, config.vocab_size, dtype, std=d ** -0.5)
  return stack_layers(params) if config.scan_layers else params


def is_stacked(params: dict) -> bool:
  """Whether the encoder's and decoder's `layers` are stacked dicts of [L, ...] leaves (not lists)."""
  return isinstance(params["encoder"]["layers"], dict)


def stack_layers(params: dict) -> dict:
  """Each stack's list of layer dicts -> one dict of [L, ...] leaves (the scanned form; teacher forcing only).

  Args:
    params: T5 parameters with list layers (already stacked ones are returned as they are).

  Returns:
    A new pytree; `encode` / `decode` without a cache give the same outputs with it.
  """
  if is_stacked(params):
    return params
  out = dict(params)
  for name in ("encoder", "decoder"):
    out[name] = {**params[name], "layers": jax.tree.map(lambda *xs: jnp.stack(xs), *params[name]["layers"])}
  return out


def unstack_layers(params: dict) -> dict:
  """The stacked form -> lists of per-layer dicts (what cached decoding and `generate` need).

  Args:
    params: T5 parameters, stacked or not.

  Returns:
    A new pytree with list layers.
  """
  if not is_stacked(params):
    return params
  out = dict(params)
  for name in ("encoder", "decoder"):
    stacked = params[name]["layers"]
    n = jax.tree.leaves(stacked)[0].shape[0]
    out[name] = {**params[name], "layers": [jax.tree.map(lambda x, i=i: x[i], stacked) for i in range(n)]}
  return out


def _run_layers(stack_layers_: Any, x: jax.Array, block, config: T5Config) -> jax.Array:
  """x <- block(x, layer) over a stack's layers: a Python loop (list) or one lax.scan (stacked), each layer
  rematerialised when config.remat says so, the activations kept batch-sharded under a mesh."""
  def step(x, layer):
    return constrain_batch(block(x, layer))

  if config.remat != "none":
    policy = {"full": jax.checkpoint_policies.nothing_saveable,
              "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}[config.remat]
    step = jax.checkpoint(step, policy=policy, prevent_cse=not isinstance(stack_layers_, dict))
  x = constrain_batch(x)
  if isinstance(stack_layers_, dict):
    return jax.lax.scan(lambda c, layer: (step(c, layer), None), x, stack_layers_)[0]
  for layer in stack_layers_:
    x = step(x, layer)
  return x


# ------------------------------------------------------------------------------------------------ blocks


def relative_position_bucket(relative_position: jax.Array, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> jax.Array:
  """T5's bucketing of (key position - query position): exact for small offsets, log-spaced up to
  max_distance; separate buckets for positive offsets when bidirectional (the encoder).

  Args:
    relative_position: int array (any shape, e.g. [Q, K]) of key position - query position.
    bidirectional: True for the encoder (half the buckets for positive offsets); False for the causal
      decoder (positive offsets all land in bucket 0).
    num_buckets: total number of buckets (32 in T5).
    max_distance: offsets at or beyond this share the last bucket (128 in T5).

  Returns:
    int bucket ids in [0, num_buckets), relative_position's shape and dtype.
  """
  buckets = jnp.zeros_like(relative_position)
  if bidirectional:
    num_buckets //= 2
    buckets = buckets + (relative_position > 0).astype(relative_position.dtype) * num_buckets
    relative_position = jnp.abs(relative_position)
  else:
    relative_position = -jnp.minimum(relative_position, 0)
  max_exact = num_buckets // 2
  is_small = relative_position < max_exact
  rp = jnp.maximum(relative_position, 1).astype(jnp.float32)
  large = max_exact + (jnp.log(rp / max_exact) / math.log(max_distance / max_exact)
                       * (num_buckets - max_exact)).astype(relative_position.dtype)
  large = jnp.minimum(large, num_buckets - 1)
  return buckets + jnp.where(is_small, relative_position, large)


def position_bias(rel_bias: jax.Array, query_pos: jax.Array, key_pos: jax.Array, bidirectional: bool,
                  config: T5Config) -> jax.Array:
  """[H, Q, K] additive attention bias from the bucket table [buckets, H].

  Args:
    rel_bias: [buckets, H] learned bias table of the stack.
    query_pos: [Q] int query positions.
    key_pos: [K] int key positions.
    bidirectional: True for the encoder, False for the decoder's self-attention.
    config: T5Config (relative_attention_num_buckets, relative_attention_max_distance).

  Returns:
    [H, Q, K] bias in rel_bias's dtype.
  """
  rel = key_pos[None, :] - query_pos[:, None]
  b = relative_position_bucket(rel, bidirectional, config.relative_attention_num_buckets,
                               config.relative_attention_max_distance)
  return jnp.take(rel_bias, b, axis=0).transpose(2, 0, 1)


def _heads(x, config):
  b, t, _ = x.shape
  return x.reshape(b, t, config.num_heads, config.d_kv).transpose(0, 2, 1, 3)  # [B, H, T, dk]


def _attend(p, q_in, k, v, bias, config):
  """q_in [B, T, D]; k, v [B, H, S, dk]; bias [B or 1, H, T, S] -> [B, T, D]."""
  q = _heads(layers.dense(p["q"], q_in), config)
  scores = jnp.einsum("bhtd,bhsd->bhts", q, k).astype(jnp.float32) + bias  # T5: no 1/sqrt(d) scaling
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("bhts,bhsd->bhtd", probs, v)
  b, _, t, _ = out.shape
  return layers.dense(p["o"], out.transpose(0, 2, 1, 3).reshape(b, t, -1))


def _mlp(p, x, config):
  if config.feed_forward_proj == "gated-gelu":
    h = jax.nn.gelu(layers.dense(p["wi_0"], x), approximate=True) * layers.dense(p["wi_1"], x)
  else:
    h = jax.nn.relu(layers.dense(p["wi"], x))
  return layers.dense(p["wo"], h)


def encode(params: dict, config: T5Config, ids: jax.Array | None = None, mask: jax.Array | None = None, *,
           embeds: jax.Array | None = None) -> jax.Array:
  """Encoder hidden states, from token ids or from input embeddings.

  Args:
    params: T5 parameters.
    config: T5Config.
    ids: [B, S] input ids (give either ids or embeds).
    mask: [B, S] bool (default all).
    embeds: [B, S, D] input embeddings used instead of `embedding(ids)` (an inverter feeds projected
      probability vectors); `encode(embeds=params['shared'][ids])` equals `encode(ids)`.

  Returns:
    [B, S, D] (after the final layer norm).
  """
  x = _encoder_inputs(params, config, ids, embeds)
  b, s = x.shape[:2]
  if mask is not None and tuple(mask.shape) != (b, s):
    raise ValueError(f"mask must be [B, S] = {(b, s)}, got {tuple(mask.shape)}.")
  mask = jnp.ones((b, s), bool) if mask is None else mask.astype(bool)
  enc = params["encoder"]
  pos = jnp.arange(s)
  bias = position_bias(enc["rel_bias"], pos, pos, True, config)[None] + jnp.where(mask, 0.0, _NEG)[:, None, None, :]
  def block(x, layer):
    h = layers.rms_norm(layer["attn_norm"], x, config.norm_eps)
    k = _heads(layers.dense(layer["self_attn"]["k"], h), config)
    v = _heads(layers.dense(layer["self_attn"]["v"], h), config)
    x = x + _attend(layer["self_attn"], h, k, v, bias, config)
    return x + _mlp(layer["mlp"], layers.rms_norm(layer["mlp_norm"], x, config.norm_eps), config)

  x = _run_layers(enc["layers"], x, block, config)
  return layers.rms_norm(enc["final_norm"], x, config.norm_eps)


def _encoder_inputs(params, config, ids, embeds):
  """[B, S, D] encoder inputs from exactly one of ids [B, S] / embeds [B, S, D]."""
  if (ids is None) == (embeds is None):
    raise ValueError("give the encoder either ids [B, S] or embeds [B, S, D] (exactly one of them).")
  if embeds is not None:
    if embeds.ndim != 3 or embeds.shape[-1] != config.d_model:
      raise ValueError(f"embeds must be [batch, time, d_model={config.d_model}], got shape {embeds.shape}.")
    return embeds.astype(params["shared"].dtype)
  if ids.ndim != 2:
    raise ValueError(f"ids must be [batch, time], got shape {ids.shape}.")
  return jnp.take(params["shared"], ids, axis=0)


def _encoder_shape(ids, embeds):
  return tuple((ids if ids is not None else embeds).shape[:2])


@flax.struct.dataclass
class T5Cache:
  """Decoder state for incremental decoding: self-attention K/V per layer [B, H, S, dk], the encoder's
  cross-attention K/V per layer [B, H, S_enc, dk], the encoder mask [B, S_enc] and the next slot."""

  k: list
  v: list
  cross_k: list
  cross_v: list
  enc_mask: jax.Array
  index: jax.Array


def init_cache(params: dict, config: T5Config, enc_out: jax.Array, enc_mask: jax.Array, max_len: int) -> T5Cache:
  """An empty decoder cache with the cross-attention keys/values of `enc_out` precomputed.

  Args:
    params: T5 params.
    config: T5Config (num_heads H, d_kv).
    enc_out: [B, S, D] encoder output.
    enc_mask: [B, S] bool/int encoder mask.
    max_len: decoder slots L to allocate.

  Returns:
    T5Cache with self-attention k, v: per decoder layer [B, H, L, d_kv] zeros (enc_out's dtype); cross_k,
    cross_v: per layer [B, H, S, d_kv]; enc_mask [B, S] bool; index 0.
  """
  b = enc_out.shape[0]
  shape = (b, config.num_heads, max_len, config.d_kv)
  dec = params["decoder"]["layers"]
  if isinstance(dec, dict):
    raise ValueError("cached decoding needs list layers: pass t5.unstack_layers(params).")
  return T5Cache(k=[jnp.zeros(shape, enc_out.dtype) for _ in dec], v=[jnp.zeros(shape, enc_out.dtype) for _ in dec],
                 cross_k=[_heads(layers.dense(l["cross_attn"]["k"], enc_out), config) for l in dec],
                 cross_v=[_heads(layers.dense(l["cross_attn"]["v"], enc_out), config) for l in dec],
                 enc_mask=enc_mask.astype(bool), index=jnp.zeros((), jnp.int32))


def decode(params: dict, config: T5Config, enc_out: jax.Array | None, enc_mask: jax.Array | None,
           dec_ids: jax.Array, dec_mask: jax.Array | None = None, cache: T5Cache | None = None):
  """Decoder logits (teacher forcing, or incremental with a cache).

  Args:
    params, config: the model.
    enc_out: [B, S, D] encoder output (unused when a cache is given: it holds the cross K/V).
    enc_mask: [B, S] encoder mask.
    dec_ids: [B, T] decoder input ids (start token first when teacher forcing).
    dec_mask: [B, T] decoder padding mask (right padding; default all).
    cache: optional T5Cache; the T tokens are written at slots [index, index + T).

  Returns:
    logits [B, T, V] float32, and the new cache when one was given.
  """
  b, t = dec_ids.shape
  dec = params["decoder"]
  if cache is not None and isinstance(dec["layers"], dict):
    raise ValueError("cached decoding needs list layers: pass t5.unstack_layers(params).")
  x = jnp.take(params["shared"], dec_ids, axis=0)
  if cache is None:
    q_pos = k_pos = jnp.arange(t)
    self_allowed = jnp.tril(jnp.ones((t, t), bool))[None]
    if dec_mask is not None:
      self_allowed = self_allowed & dec_mask.astype(bool)[:, None, :]
    cross_mask = enc_mask.astype(bool) if enc_mask is not None else jnp.ones(enc_out.shape[:2], bool)
  else:
    s = cache.k[0].shape[2]
    q_pos = cache.index + jnp.arange(t)
    k_pos = jnp.arange(s)
    self_allowed = (k_pos[None, :] <= q_pos[:, None])[None]
    cross_mask = cache.enc_mask
  self_bias = (position_bias(dec["rel_bias"], q_pos, k_pos, False, config)[None]
               + jnp.where(self_allowed, 0.0, _NEG)[:, None])
  cross_bias = jnp.where(cross_mask, 0.0, _NEG)[:, None, None, :]
  new_k, new_v = [], []

  def block(x, layer, i=None):
    h = layers.rms_norm(layer["attn_norm"], x, config.norm_eps)
    k = _heads(layers.dense(layer["self_attn"]["k"], h), config)
    v = _heads(layers.dense(layer["self_attn"]["v"], h), config)
    if cache is not None:
      k = jax.lax.dynamic_update_slice(cache.k[i], k, (0, 0, cache.index, 0))
      v = jax.lax.dynamic_update_slice(cache.v[i], v, (0, 0, cache.index, 0))
      new_k.append(k)
      new_v.append(v)
    x = x + _attend(layer["self_attn"], h, k, v, self_bias, config)
    h = layers.rms_norm(layer["cross_norm"], x, config.norm_eps)
    if cache is not None:
      ck, cv = cache.cross_k[i], cache.cross_v[i]
    else:
      ck = _heads(layers.dense(layer["cross_attn"]["k"], enc_out), config)
      cv = _heads(layers.dense(layer["cross_attn"]["v"], enc_out), config)
    x = x + _attend(layer["cross_attn"], h, ck, cv, cross_bias, config)
    return x + _mlp(layer["mlp"], layers.rms_norm(layer["mlp_norm"], x, config.norm_eps), config)

  if cache is None:
    x = _run_layers(dec["layers"], x, block, config)
  else:
    for i, layer in enumerate(dec["layers"]):
      x = block(x, layer, i)
  x = layers.rms_norm(dec["final_norm"], x, config.norm_eps)
  if config.tie_word_embeddings:
    logits = (x * config.d_model ** -0.5) @ params["shared"].T
  else:
    logits = layers.dense(params["lm_head"], x)
  logits = logits.astype(jnp.float32)
  if cache is None:
    return logits
  return logits, cache.replace(k=new_k, v=new_v, index=cache.index + t)


def shift_right(labels: jax.Array, start_id: int) -> jax.Array:
  """Decoder inputs for teacher forcing: [start, labels[:-1]].

  Args:
    labels: [B, T] int target ids.
    start_id: decoder start id (config.decoder_start_id; T5 uses its pad id).

  Returns:
    [B, T] ids in labels' dtype: start_id then labels[:, :-1].
  """
  return jnp.concatenate([jnp.full((labels.shape[0], 1), start_id, labels.dtype), labels[:, :-1]], axis=1)


def forward(params: dict, config: T5Config, enc_ids: jax.Array | None, enc_mask: jax.Array | None,
            dec_ids: jax.Array, dec_mask: jax.Array | None = None, *, enc_embeds: jax.Array | None = None
            ) -> jax.Array:
  """Teacher-forced logits for decoder inputs `dec_ids` given the encoder inputs.

  Args:
    params, config: the model.
    enc_ids: [B, S] encoder ids, or None when `enc_embeds` is given.
    enc_mask: [B, S] encoder mask (default all).
    dec_ids: [B, T] decoder inputs (start token first).
    dec_mask: [B, T] decoder padding mask (default all).
    enc_embeds: [B, S, D] encoder input embeddings instead of ids.

  Returns:
    logits [B, T, V] float32.
  """
  enc_mask = jnp.ones(_encoder_shape(enc_ids, enc_embeds), bool) if enc_mask is None else enc_mask
  enc_out = encode(params, config, enc_ids, enc_mask, embeds=enc_embeds)
  return decode(params, config, enc_out, enc_mask, dec_ids, dec_mask)


def label_logits(params: dict, config: T5Config, batch: Mapping[str, jax.Array], *,
                 input_embeds: jax.Array | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Teacher-forced logits aligned with the labels, and the per-token loss weights.

  Args:
    params, config: the model.
    batch: labels [B, T] (ending with EOS), optional label_mask [B, T] (real label tokens, right padding),
      optional loss_mask [B, T] (tokens that count, e.g. not the control-code prefix; default all real),
      and the encoder inputs: inputs [B, S] and/or input_embeds [B, S, D], optional input_mask [B, S].
    input_embeds: [B, S, D] encoder embeddings (overrides batch['input_embeds'] and batch['inputs']).

  Returns:
    (logits [B, T, V] float32: logits[:, t] predicts labels[:, t]; labels [B, T]; weight [B, T] float32).
  """
  labels = batch["labels"]
  if labels.ndim != 2:
    raise ValueError(f"labels must be [batch, time], got shape {labels.shape}.")
  label_mask = batch.get("label_mask")
  label_mask = jnp.ones(labels.shape, bool) if label_mask is None else label_mask.astype(bool)
  if input_embeds is None:
    input_embeds = batch.get("input_embeds")
  enc_ids = None if input_embeds is not None else batch.get("inputs")
  if enc_ids is None and input_embeds is None:
    raise ValueError("the batch has neither 'inputs' [B, S] nor 'input_embeds' [B, S, D] for the encoder.")
  dec_in = shift_right(labels, config.decoder_start_id)
  logits = forward(params, config, enc_ids, batch.get("input_mask"), dec_in, label_mask, enc_embeds=input_embeds)
  weight = label_mask
  if batch.get("loss_mask") is not None:
    weight = weight & batch["loss_mask"].astype(bool)
  return logits, labels, weight.astype(jnp.float32)


def seq2seq_loss(params: dict, config: T5Config, batch: Mapping[str, jax.Array], *,
                 input_embeds: jax.Array | None = None) -> tuple[jax.Array, dict]:
  """Mean token cross-entropy of `labels` given the encoder inputs (ids or embeddings).

  Args:
    params, config: the model.
    batch: inputs [B, S] (or input_embeds [B, S, D]), input_mask [B, S], labels [B, T] (ending with EOS),
      label_mask [B, T] (real tokens), optional loss_mask [B, T] (tokens to learn; a control-code prefix
      is real but not learned).
    input_embeds: [B, S, D] encoder input embeddings instead of batch['inputs'].

  Returns:
    (loss, {'loss', 'accuracy', 'tokens'}).
  """
  logits, labels, w = label_logits(params, config, batch, input_embeds=input_embeds)
  lp = jnp.take_along_axis(logits, labels[..., None], -1)[..., 0] - jax.nn.logsumexp(logits, -1)
  n = jnp.maximum(jnp.sum(w), 1.0)
  loss = -jnp.sum(lp * w) / n
  acc = jnp.sum((jnp.argmax(logits, -1) == labels) * w) / n
  return loss, {"loss": loss, "accuracy": acc, "tokens": jnp.sum(w)}


def generate(params: dict, config: T5Config, enc_ids: jax.Array | None, enc_mask: jax.Array | None, key: jax.Array,
             max_new_tokens: int, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
             stop_ids: Sequence[int] | None = None, logit_bias: jax.Array | None = None,
             use_cache: bool = True, *, enc_embeds: jax.Array | None = None,
             decoder_prefix: jax.Array | None = None) -> GenerationOutput:
  """Decodes up to `max_new_tokens` tokens per input (greedy or sampling, KV cache, `lax.while_loop`).

  Args:
    params, config: the model.
    enc_ids: [B, S] inputs (or None with `enc_embeds`); enc_mask: [B, S] (default all).
    key: PRNG key (step t uses fold_in(key, t)).
    max_new_tokens: N new tokens at most (static), not counting the prefix.
    temperature, top_k, top_p: sampling (static; temperature 0 = greedy).
    stop_ids: stop tokens (default (config.eos_id,)).
    logit_bias: optional [V] or [B, V] additive bias.
    use_cache: False recomputes the decoder over the whole prefix each step (reference).
    enc_embeds: [B, S, D] encoder input embeddings instead of ids.
    decoder_prefix: [B, K] int tokens placed right after the decoder start token (e.g. control codes);
      decoding starts after them. Every row has K real prefix tokens.

  Returns:
    GenerationOutput. Without a prefix, tokens [B, N] exclude the start token; with one, tokens [B, K + N]
    start with the prefix (mask true there, logprobs 0 there, lengths count it), then the generated
    tokens (pad after the stop token).
  """
  enc_shape = _encoder_shape(enc_ids, enc_embeds)
  b = enc_shape[0]
  n = int(max_new_tokens)
  if n < 1:
    raise ValueError(f"max_new_tokens must be >= 1, got {n}.")
  enc_mask = jnp.ones(enc_shape, bool) if enc_mask is None else enc_mask.astype(bool)
  stop = jnp.asarray(tuple(stop_ids) if stop_ids is not None else (config.eos_id,), jnp.int32)
  enc_out = encode(params, config, enc_ids, enc_mask, embeds=enc_embeds)
  bias = None if logit_bias is None else jnp.asarray(logit_bias, jnp.float32)
  pad = config.pad_id
  start = jnp.full((b, 1), config.decoder_start_id, jnp.int32)
  if decoder_prefix is None:
    k = 0
    head = start
  else:
    decoder_prefix = jnp.asarray(decoder_prefix)
    if decoder_prefix.ndim != 2 or decoder_prefix.shape[0] != b:
      raise ValueError(f"decoder_prefix must be [B={b}, K] token ids, got shape {decoder_prefix.shape}.")
    k = decoder_prefix.shape[1]
    head = jnp.concatenate([start, decoder_prefix.astype(jnp.int32)], axis=1)  # [B, 1 + K]

  def pick(logits, step):
    if bias is not None:
      logits = logits + bias
    return sample_token(jax.random.fold_in(key, step), logits, temperature, top_k, top_p)

  if use_cache:
    # slots: start + K prefix tokens + the N - 1 generated tokens fed back (the last one never is)
    cache = init_cache(params, config, enc_out, enc_mask, k + n)
    logits, carry0 = decode(params, config, None, None, head, cache=cache)
  else:
    seq = jnp.full((b, k + n), pad, jnp.int32).at[:, :k + 1].set(head)
    logits = decode(params, config, enc_out, enc_mask, seq[:, :k + 1])
    carry0 = seq

  def next_logits(carry, step, last, live):
    del live  # stopped rows keep decoding their last token; decode_loop pads their outputs
    if use_cache:
      logits, carry = decode(params, config, None, None, last[:, None], cache=carry)
      return logits[:, 0], carry
    carry = jax.lax.dynamic_update_slice(carry, last[:, None], (0, k + step))
    all_logits = decode(params, config, enc_out, enc_mask, carry)  # causal: later slots do not matter
    return jax.lax.dynamic_index_in_dim(all_logits, k + step, axis=1, keepdims=False), carry

  out = decode_loop(logits[:, -1], next_logits, carry0, n, pick, pad, stop)
  if decoder_prefix is None:
    return out
  return GenerationOutput(tokens=jnp.concatenate([head[:, 1:], out.tokens], axis=1),
                          mask=jnp.concatenate([jnp.ones((b, k), bool), out.mask], axis=1),
                          lengths=out.lengths + k,
                          logprobs=jnp.concatenate([jnp.zeros((b, k), jnp.float32), out.logprobs], axis=1),
                          stopped=out.stopped)


# ------------------------------------------------------------------------------------------ HF weights


def config_from_hf(cfg: Mapping[str, Any]) -> T5Config:
  """T5Config from a Hugging Face T5 `config.json` dict."""
  ff = cfg.get("feed_forward_proj", "relu")
  ff = "gated-gelu" if ff.startswith("gated") else "relu"
  return T5Config(vocab_size=cfg["vocab_size"], d_model=cfg["d_model"], d_kv=cfg["d_kv"], d_ff=cfg["d_ff"],
                  num_layers=cfg["num_layers"], num_decoder_layers=cfg.get("num_decoder_layers"),
                  num_heads=cfg["num_heads"], relative_attention_num_buckets=cfg.get("relative_attention_num_buckets", 32),
                  relative_attention_max_distance=cfg.get("relative_attention_max_distance", 128),
                  feed_forward_proj=ff, tie_word_embeddings=cfg.get("tie_word_embeddings", True),
                  norm_eps=cfg.get("layer_norm_epsilon", 1e-6), pad_id=_get(cfg, "pad_token_id", 0),
                  eos_id=_get(cfg, "eos_token_id", 1), decoder_start_id=_get(cfg, "decoder_start_token_id", 0))


def _get(cfg, key, default):
  value = cfg.get(key)
  return default if value is None else value


def convert_hf_state_dict(sd: Mapping[str, np.ndarray], config: T5Config, dtype=jnp.float32) -> dict:
  """Hugging Face T5 weights ({'encoder.block.0.layer.0.SelfAttention.q.weight': [out, in], ...}) -> params.

  Args:
    sd: name -> numpy array, Hugging Face layout (linear weights [out, in]).
    config: T5Config matching the weights (layer counts, feed_forward_proj, tie_word_embeddings).
    dtype: parameter dtype.

  Returns:
    params in the `init_params` layout (kernels transposed to [in, out]).

  Raises:
    KeyError: a weight the config expects is missing.
  """
  sd = dict(sd)
  lin = lambda k: {"kernel": jnp.asarray(np.ascontiguousarray(sd[k].T), dtype)}  # noqa: E731
  norm = lambda k: {"scale": jnp.asarray(sd[k], dtype)}  # noqa: E731

  def attn(pre):
    return {n: lin(f"{pre}.{n}.weight") for n in ("q", "k", "v", "o")}

  def mlp(pre):
    names = ("wi_0", "wi_1", "wo") if config.feed_forward_proj == "gated-gelu" else ("wi", "wo")
    return {n: lin(f"{pre}.DenseReluDense.{n}.weight") for n in names}

  shared = sd.get("shared.weight", sd.get("encoder.embed_tokens.weight"))
  params = {"shared": jnp.asarray(shared, dtype)}
  for stack, n in (("encoder", config.num_layers), ("decoder", config.n_dec)):
    out = {"rel_bias": jnp.asarray(sd[f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"], dtype),
           "final_norm": norm(f"{stack}.final_layer_norm.weight"), "layers": []}
    for i in range(n):
      pre = f"{stack}.block.{i}.layer"
      layer = {"attn_norm": norm(f"{pre}.0.layer_norm.weight"), "self_attn": attn(f"{pre}.0.SelfAttention")}
      if stack == "decoder":
        layer["cross_norm"] = norm(f"{pre}.1.layer_norm.weight")
        layer["cross_attn"] = attn(f"{pre}.1.EncDecAttention")
        ff = f"{pre}.2"
      else:
        ff = f"{pre}.1"
      layer["mlp_norm"] = norm(f"{ff}.layer_norm.weight")
      layer["mlp"] = mlp(ff)
      out["layers"].append(layer)
    params[stack] = out
  if not config.tie_word_embeddings:
    params["lm_head"] = lin("lm_head.weight")
  return params


def load_hf_t5(path: str | os.PathLike, dtype=jnp.float32) -> tuple[dict, T5Config]:
  """A local Hugging Face T5 folder (config.json + *.safetensors) as (params, config).

  Args:
    path: the model folder.
    dtype: parameter dtype.

  Returns:
    (params, T5Config).

  Raises:
    FileNotFoundError: the folder has no config.json.
  """
  from iclr24_jax.lm.weights import read_safetensors
  p = pathlib.Path(path)
  if not (p / "config.json").exists():
    raise FileNotFoundError(f"{p} has no config.json (expected a Hugging Face T5 folder).")
  with open(p / "config.json") as f:
    config = config_from_hf(json.load(f))
  return convert_hf_state_dict(read_safetensors(p), config, dtype), config
