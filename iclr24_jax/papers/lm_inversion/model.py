"""The logit inverter of Morris et al. (2024): a next-token distribution -> pseudo-embeddings -> T5 -> the prompt.

Pipeline (Sec. 4 of the paper; vec2text's `InversionFromLogitsModel`):

  v = log_softmax(target LM logits after the hidden prompt)              [B, V]
  v <- v - unigram                      (unigram: EMA of v over training batches, 0.99 / 0.01)
  zero-pad v to a multiple of the width d and unroll it: [B, S = ceil(V/d), d]
  per-position projection  h_s = v_s @ W_s  (W: [S, d, d], "sequence_weights")
  MLP  d -> bottleneck -> d_model (Linear, dropout, GELU, Linear)        [B, S, d_model]
  a T5 encoder reads them as input embeddings; its decoder is trained with cross-entropy on the prompt tokens.

Everything is a pure function of a parameter dict {'projection': Flax params, 't5': T5 params}:

  inverter = Inverter(t5_config, width=256, num_chunks=num_chunks(V, 256))
  params = init(key, inverter)
  loss, metrics = loss_fn(params, batch, key, inverter=inverter)        # batch: unrolled inputs + labels
  out = invert(params, logprobs, unigram, inverter=inverter, max_len=64)  # greedy prompt tokens
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from iclr24_jax.lm import t5

# The official top-k rule's fill value (`default_val=-30.0` in vec2text's embed_and_project).
TOPK_FILL = -30.0
UNIGRAM_DECAY = 0.99


def num_chunks(vocab_size: int, width: int, official_padding: bool = False) -> int:
  """Number S of width-d pseudo-embeddings a V-dim distribution unrolls into.

  Args:
    vocab_size: V.
    width: d.
    official_padding: vec2text pads by `d - ((V + d) % d)`, which adds a whole chunk of zeros when d divides V.

  Returns:
    ceil(V / d) (or V / d + 1 with the official padding when d divides V).
  """
  if width < 1 or vocab_size < 1:
    raise ValueError(f"vocab_size and width must be positive, got {vocab_size}, {width}.")
  if official_padding:
    pad = width - ((vocab_size + width) % width)
    return (vocab_size + pad) // width
  return math.ceil(vocab_size / width)


def unroll(logprobs: jax.Array, unigram: jax.Array, width: int, official_padding: bool = False,
           topk: Any = None, topk_max: int | None = None) -> jax.Array:
  """Subtracts the unigram estimate, (optionally) applies the top-k rule, pads and unrolls into pseudo-embeddings.

  Args:
    logprobs: [B, V] next-token log-probabilities of the target LM.
    unigram: [V] the unigram estimate (`update_unigram`); zeros disables the subtraction.
    width: d, the pseudo-embedding size.
    official_padding: pad as vec2text does (a whole extra zero chunk when d divides V).
    topk: None (the full distribution), or the top-k access level: an int k >= 1, or an int array [B] per row
      (0 = that row keeps the full distribution) with `topk_max` set. The rule is vec2text's (`topk_access`,
      applied after the unigram is subtracted); the padded tail then holds the fill value, as in vec2text.
    topk_max: static upper bound of a traced `topk` (None: topk must be a Python int).

  Returns:
    [B, S, d] with S = num_chunks(V, d, official_padding); the padded tail is 0 (or the fill value under top-k).
  """
  logprobs = jnp.asarray(logprobs)
  if logprobs.ndim != 2:
    raise ValueError(f"logprobs must be [B, V], got shape {logprobs.shape}.")
  b, v = logprobs.shape
  if unigram.shape != (v,):
    raise ValueError(f"unigram must be [V={v}], got shape {unigram.shape}.")
  s = num_chunks(v, width, official_padding)
  x = logprobs.astype(jnp.float32) - unigram.astype(jnp.float32)[None]
  pad = ((0, 0), (0, s * width - v))
  if topk is None:
    return jnp.pad(x, pad).reshape(b, s, width)
  kept = jnp.pad(topk_access(x, topk, k_max=topk_max), pad, constant_values=TOPK_FILL)
  if isinstance(topk, int):
    return kept.reshape(b, s, width)
  full = jnp.pad(x, pad)
  return jnp.where(jnp.asarray(topk)[:, None] > 0, kept, full).reshape(b, s, width)


def update_unigram(unigram: jax.Array, logprobs: jax.Array, decay: float = UNIGRAM_DECAY) -> jax.Array:
  """One EMA update of the unigram estimate with a training batch: u <- decay u + (1 - decay) mean_b v_b.

  Args:
    unigram: [V] current estimate (start from zeros, as the official model's buffer does).
    logprobs: [B, V] the batch's log-distributions.
    decay: 0.99 in the official code.

  Returns:
    [V] the new estimate.
  """
  return decay * unigram + (1.0 - decay) * jnp.mean(logprobs.astype(jnp.float32), axis=0)


def topk_access(inputs: jax.Array, k: Any, fill: float = TOPK_FILL, k_max: int | None = None) -> jax.Array:
  """vec2text's top-k rule (`zero_embedding_except_topk`, models/inversion_from_logits.py:16-22, applied in
  `embed_and_project` to the distribution AFTER the unigram is subtracted, with default_val -30): every entry
  becomes `fill`, and the k largest entries become fill + their value (the official scatter_add onto the fill).
  The inverter then sees only which tokens rank highest above the unigram and by how much.

  Args:
    inputs: [..., V] unigram-subtracted log-distributions (`unroll` subtracts, then calls this).
    k: entries kept, an int in [1, V], or an int array broadcastable to inputs.shape[:-1] (traced; needs k_max).
    fill: the value of every other entry (official -30).
    k_max: static upper bound of a traced k (None: k must be a Python int).

  Returns:
    [..., V].

  Raises:
    ValueError: k (or k_max) outside [1, V].
  """
  v = inputs.shape[-1]
  if k_max is None:
    if not isinstance(k, int):
      raise ValueError("a traced k needs a static k_max (the largest k it can take).")
    k_max = k
  if not 1 <= k_max <= v or (isinstance(k, int) and not 1 <= k <= v):
    raise ValueError(f"k must be in [1, V={v}], got {k if isinstance(k, int) else k_max}.")
  flat = inputs.reshape(-1, v)
  vals, idx = jax.lax.top_k(flat, k_max)                                    # sorted, largest first
  keep = jnp.arange(k_max) < jnp.broadcast_to(jnp.asarray(k), inputs.shape[:-1]).reshape(-1, 1)
  out = jnp.full_like(flat, fill)
  out = jax.vmap(lambda o, i, a: o.at[i].add(a))(out, idx, jnp.where(keep, vals, 0.0))
  return out.reshape(inputs.shape)


class Projection(nn.Module):
  """The per-position projection and the MLP that turn pseudo-embeddings into T5 input embeddings.

  Attributes:
    num_chunks: S.
    width: d (pseudo-embedding size).
    bottleneck: the MLP's hidden size.
    d_model: the T5 width.
    dropout_rate: dropout after the first Linear (the official order: Linear, Dropout, GELU, Linear).
  """

  num_chunks: int
  width: int
  bottleneck: int
  d_model: int
  dropout_rate: float = 0.0

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
    """[B, S, d] -> [B, S, d_model]."""
    if x.shape[1:] != (self.num_chunks, self.width):
      raise ValueError(f"expected unrolled inputs [B, {self.num_chunks}, {self.width}], got {x.shape}.")
    # Deviation: the official `sequence_weights` start from randn (unit variance); scaled by 1/sqrt(d) here so the
    # projected vectors keep the inputs' scale (with unit variance a d=256 projection multiplies it by 16).
    w = self.param("sequence_weights", nn.initializers.normal(1.0 / math.sqrt(self.width)),
                   (self.num_chunks, self.width, self.width))
    h = jnp.einsum("bsd,sdw->bsw", x, w)
    h = nn.Dense(self.bottleneck, name="fc1")(h)
    h = nn.Dropout(self.dropout_rate)(h, deterministic=deterministic)
    h = nn.gelu(h, approximate=False)
    return nn.Dense(self.d_model, name="fc2")(h)


@dataclasses.dataclass(frozen=True)
class Inverter:
  """The inverter's static description (hashable, so it can be closed over by jitted functions).

  Attributes:
    t5_config: the T5 encoder-decoder (its vocabulary is the decoder's output tokenizer).
    width: d.
    num_chunks: S = num_chunks(V, d).
    bottleneck: MLP hidden size (the official bottleneck is the embedder width, 768 for Llama-2).
    dropout_rate: dropout in the MLP.
  """

  t5_config: t5.T5Config
  width: int
  num_chunks: int
  bottleneck: int = 256
  dropout_rate: float = 0.0

  @property
  def projection(self) -> Projection:
    return Projection(self.num_chunks, self.width, self.bottleneck, self.t5_config.d_model, self.dropout_rate)


def init(key: jax.Array, inverter: Inverter) -> dict:
  """Initial parameters of the inverter.

  Args:
    key: PRNG key.
    inverter: the static description.

  Returns:
    {'projection': {'sequence_weights' [S, d, d], 'fc1', 'fc2'}, 't5': T5 params}.
  """
  k_proj, k_t5 = jax.random.split(key)
  dummy = jnp.zeros((1, inverter.num_chunks, inverter.width), jnp.float32)
  return {"projection": inverter.projection.init(k_proj, dummy)["params"],
          "t5": t5.init_params(k_t5, inverter.t5_config)}


def embed(params: Mapping[str, Any], unrolled: jax.Array, inverter: Inverter, key: jax.Array | None = None
          ) -> jax.Array:
  """Encoder input embeddings from unrolled distributions (the projection and MLP).

  Args:
    params: {'projection', ...}.
    unrolled: [B, S, d] (`unroll`).
    inverter: the static description.
    key: dropout key (None: deterministic).

  Returns:
    [B, S, d_model].
  """
  rngs = None if key is None else {"dropout": key}
  return inverter.projection.apply({"params": params["projection"]}, unrolled, deterministic=key is None, rngs=rngs)


def loss_fn(params: Mapping[str, Any], batch: Mapping[str, jax.Array], key: jax.Array, *, inverter: Inverter
            ) -> tuple[jax.Array, dict]:
  """Cross-entropy of the prompt tokens given the distribution.

  Args:
    params: {'projection', 't5'}.
    batch: inputs [B, S, d] (unrolled, unigram already subtracted), labels [B, T] (prompt tokens ending with EOS),
      label_mask [B, T].
    key: dropout key (only used when inverter.dropout_rate > 0).
    inverter: the static description.

  Returns:
    (loss, {'loss', 'accuracy', 'tokens'}).
  """
  embeds = embed(params, batch["inputs"], inverter, key if inverter.dropout_rate > 0 else None)
  t5_batch = {"labels": batch["labels"], "label_mask": batch["label_mask"],
              "input_mask": jnp.ones(embeds.shape[:2], bool)}
  return t5.seq2seq_loss(params["t5"], inverter.t5_config, t5_batch, input_embeds=embeds)


def init_state(key: jax.Array, inverter: Inverter, tx: Any, vocab_size: int):
  """The inverter's initial train state.

  Args:
    key: PRNG key; inverter: the static description; tx: the optax optimizer; vocab_size: V.

  Returns:
    TrainState with params {'projection', 't5'} and extra {'unigram': zeros [V]} (the official buffer starts at 0).
  """
  from iclr24_jax.common.train_state import TrainState
  return TrainState.create(init(key, inverter), tx, extra={"unigram": jnp.zeros((vocab_size,), jnp.float32)})


def make_train_step(inverter: Inverter, official_padding: bool = False, unigram_decay: float = UNIGRAM_DECAY,
                    topk_max: int = 0):
  """`train_step(state, batch, key) -> (state, metrics)` for `common.loop`.

  The batch holds raw distributions: logprobs [B, V], labels [B, T], label_mask [B, T], and with topk_max > 0 also
  topk [B] (each row's top-k access level, 0 = full). Each step first moves the unigram estimate
  (state.extra['unigram']) towards the batch mean of the FULL distributions, then subtracts it, applies the top-k
  rule and unrolls, as the official model updates its buffer in the training forward pass before using it.

  Args:
    inverter: the static description.
    official_padding: unroll with the official padding.
    unigram_decay: the EMA decay (0.99).
    topk_max: 0 (full distributions) or the largest top-k level the batch's 'topk' can hold.

  Returns:
    The pure step; metrics {'loss', 'accuracy', 'tokens', 'grad_norm'} (scalars).
  """
  def train_step(state, batch, key):
    key = jax.random.fold_in(key, state.step)
    logprobs = batch["logprobs"].astype(jnp.float32)
    unigram = update_unigram(state.extra["unigram"], logprobs, unigram_decay)
    topk = batch["topk"] if topk_max else None
    inputs = unroll(logprobs, unigram, inverter.width, official_padding, topk=topk, topk_max=topk_max or None)
    sub = {"inputs": inputs, "labels": batch["labels"], "label_mask": batch["label_mask"]}
    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, sub, key, inverter=inverter)
    metrics = dict(metrics, grad_norm=optax.global_norm(grads))
    state = state.apply_gradients(grads=grads)
    return state.replace(extra={"unigram": unigram}), metrics
  return train_step


def invert(params: Mapping[str, Any], logprobs: jax.Array, unigram: jax.Array, *, inverter: Inverter,
           max_len: int, official_padding: bool = False, topk: Any = None,
           topk_max: int | None = None) -> t5.GenerationOutput:
  """Greedy prompt reconstruction from next-token distributions.

  Args:
    params: the trained inverter.
    logprobs: [B, V] target-LM log-distributions.
    unigram: [V] the unigram estimate stored at the end of training.
    inverter: the static description.
    max_len: tokens to decode at most (static).
    official_padding: must match training.
    topk, topk_max: the top-k access level (`unroll`): None = the full distribution.

  Returns:
    t5.GenerationOutput (tokens [B, max_len] in the decoder's vocabulary, mask, lengths ...).
  """
  unrolled = unroll(logprobs, unigram, inverter.width, official_padding, topk=topk, topk_max=topk_max)
  embeds = embed(params, unrolled, inverter)
  return t5.generate(params["t5"], inverter.t5_config, None, None, jax.random.key(0), max_len, enc_embeds=embeds)


def check_distributions(logprobs: np.ndarray, name: str = "logprobs") -> None:
  """Raises a ValueError naming the problem unless `logprobs` is a finite [B, V] array of log-distributions.

  Args:
    logprobs: [B, V] array to check.
    name: its name in the message.

  Returns:
    None (raises on bad input).
  """
  if logprobs.ndim != 2:
    raise ValueError(f"{name} must be [B, V] log-probabilities, got shape {logprobs.shape}.")
  finite = np.isfinite(logprobs)
  if not finite.all():
    raise ValueError(f"{name} has {int((~finite).sum())} non-finite entries; pass log_softmax outputs (use a large "
                     "negative number, not -inf, for hidden entries).")
  mass = np.exp(logprobs.astype(np.float64)).sum(-1)
  if np.any(np.abs(mass - 1.0) > 1e-2):
    raise ValueError(f"{name} rows are not normalised (sum of exp from {mass.min():.3f} to {mass.max():.3f}); "
                     "pass log_softmax(logits), not logits.")


def make_multi_train_step(train_step: Any, num_models: int):
  """Trains M independent models in one compiled step (`jax.vmap` over seeds / access levels).

  Args:
    train_step: `(state, batch, key) -> (state, metrics)` of one model (`make_train_step`,
      `make_sample_train_step`).
    num_models: M.

  Returns:
    `multi_step(states, batch, key) -> (states, metrics)`: states stacked on a leading [M] axis (`jax.vmap` of
    the init), every batch leaf [B, M, ...] (the batch axis first, so `common.loop` shards it over 'data'), model m
    gets key fold_in(key, m). Metrics: the mean over models, and each model's loss as 'loss_m{m}'.
  """
  def multi_step(states, batch, key):
    keys = jax.vmap(lambda m: jax.random.fold_in(key, m))(jnp.arange(num_models))
    states, metrics = jax.vmap(train_step, in_axes=(0, 1, 0))(states, batch, keys)
    out = {k: jnp.mean(v) for k, v in metrics.items()}
    out.update({f"loss_m{m}": metrics["loss"][m] for m in range(num_models)})
    return states, out
  return multi_step


def sample_loss_fn(params: Mapping[str, Any], batch: Mapping[str, jax.Array], key: jax.Array, *,
                   t5_config: t5.T5Config) -> tuple[jax.Array, dict]:
  """The sample-inversion baseline's loss: a T5 reads text the target LM generated and writes the prompt.

  Args:
    params: {'t5': T5 params}.
    batch: inputs [B, L] int32 (the generated continuation in the decoder's tokens), input_mask [B, L],
      labels [B, T] (prompt tokens ending with EOS), label_mask [B, T].
    key: unused (no dropout); kept for the common signature.
    t5_config: the T5 (same size and vocabulary as the inverter's).

  Returns:
    (loss, {'loss', 'accuracy', 'tokens'}).
  """
  del key
  return t5.seq2seq_loss(params["t5"], t5_config, batch)


def make_sample_train_step(t5_config: t5.T5Config):
  """`train_step(state, batch, key) -> (state, metrics)` of the sample-inversion T5.

  Args:
    t5_config: the T5.

  Returns:
    The pure step; batch as `sample_loss_fn` (inputs [B, L], input_mask, labels [B, T], label_mask); metrics
    {'loss', 'accuracy', 'tokens', 'grad_norm'}.
  """
  def train_step(state, batch, key):
    key = jax.random.fold_in(key, state.step)
    (_, metrics), grads = jax.value_and_grad(sample_loss_fn, has_aux=True)(state.params, batch, key,
                                                                          t5_config=t5_config)
    metrics = dict(metrics, grad_norm=optax.global_norm(grads))
    return state.apply_gradients(grads=grads), metrics
  return train_step


def init_sample_state(key: jax.Array, t5_config: t5.T5Config, tx: Any):
  """The sample-inversion T5's initial train state.

  Args:
    key: PRNG key; t5_config: the T5; tx: the optax optimizer.

  Returns:
    TrainState with params {'t5': ...} and extra {} (no unigram: its input is text).
  """
  from iclr24_jax.common.train_state import TrainState
  return TrainState.create({"t5": t5.init_params(key, t5_config)}, tx, extra={})


def invert_samples(params: Mapping[str, Any], ids: jax.Array, mask: jax.Array, *, t5_config: t5.T5Config,
                   max_len: int) -> t5.GenerationOutput:
  """Greedy prompt reconstruction from generated text (the sample-inversion baseline).

  Args:
    params: {'t5': ...} trained with `make_sample_train_step`.
    ids: [B, L] the continuation in the decoder's tokens; mask: [B, L] real tokens (>= 1 per row).
    t5_config: the T5.
    max_len: tokens to decode at most (static).

  Returns:
    t5.GenerationOutput (tokens [B, max_len] ...).
  """
  return t5.generate(params["t5"], t5_config, ids, mask, jax.random.key(0), max_len)
