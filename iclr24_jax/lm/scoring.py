"""Scoring with a causal LM: per-token log-probabilities, sequence log-likelihoods, next-token distributions.

The pure functions take padded `ids [B, T]` and `mask [B, T]` (either padding side); callers jit them.
`score_continuations` is the host-side convenience: it tokenizes (prompt, continuation) pairs, batches
them with bucketed shapes, and returns summed log-probabilities of the continuations.
"""
from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.lm import llama
from iclr24_jax.lm import tokenizer as tok_lib


def logprobs_from_logits(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """log softmax(logits)[targets] without materialising the full log-softmax.

  Args:
    logits: [..., V].
    targets: [...] int ids.

  Returns:
    [...] float32.
  """
  logits = logits.astype(jnp.float32)
  picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  return picked - jax.nn.logsumexp(logits, axis=-1)


def _token_logprobs(params, config, ids, mask):
  b, t = ids.shape
  mask = jnp.ones((b, t), bool) if mask is None else mask.astype(bool)
  hidden = llama.hidden_states(params, config, ids, mask)  # [B, T, D]
  # Token t is predicted from the last real token before it: t - 1 unless padding sits in between.
  pos = jnp.arange(t, dtype=jnp.int32)[None]
  prev_real = jax.lax.cummax(jnp.where(mask, pos, -1), axis=1)  # last real index <= t
  src = jnp.concatenate([jnp.full((b, 1), -1, jnp.int32), prev_real[:, :-1]], axis=1)  # last real index < t
  valid = mask & (src >= 0)
  src_hidden = jnp.take_along_axis(hidden, jnp.maximum(src, 0)[..., None], axis=1)
  lp = logprobs_from_logits(llama.output_logits(params, config, src_hidden), ids)
  return jnp.where(valid, lp, 0.0), valid


def token_logprobs(params: llama.Params, config: llama.LlamaConfig, ids: jax.Array,
                   mask: jax.Array | None = None) -> jax.Array:
  """log p(ids[b, t] | the real tokens before t) for every position.

  Args:
    params: LM parameters.
    config: LlamaConfig.
    ids: [B, T] int token ids.
    mask: [B, T] bool, real tokens (default all).

  Returns:
    [B, T] float32; 0 at padding and at each row's first real token (it has no context).
  """
  return _token_logprobs(params, config, ids, mask)[0]


def sequence_logprob(params: llama.Params, config: llama.LlamaConfig, ids: jax.Array, mask: jax.Array | None = None,
                     target_mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """Summed log-probability of the target tokens of each row.

  Args:
    params, config: the LM.
    ids: [B, T] ids (prompt followed by continuation).
    mask: [B, T] real tokens.
    target_mask: [B, T] which tokens are scored (e.g. the continuation); default every real token
      (the first real token of a row is never scored: it has no context).

  Returns:
    (sum_logprob [B], num_scored_tokens [B] int32); mean log-likelihood = sum / num.
  """
  lp, valid = _token_logprobs(params, config, ids, mask)
  if target_mask is not None:
    valid = valid & target_mask.astype(bool)
  return jnp.sum(jnp.where(valid, lp, 0.0), axis=1), jnp.sum(valid, axis=1, dtype=jnp.int32)


def next_token_logprobs(params: llama.Params, config: llama.LlamaConfig, ids: jax.Array,
                        mask: jax.Array | None = None) -> jax.Array:
  """Log-distribution of the token after each row's last real token.

  Args:
    params, config: the LM.
    ids: [B, T] prompt ids (either padding side).
    mask: [B, T] real tokens.

  Returns:
    [B, V] float32 log-probabilities.
  """
  logits = llama.forward(params, config, ids, mask, last_only=True)
  return jax.nn.log_softmax(logits, axis=-1)


def encode_pairs(tokenizer: tok_lib.Tokenizer, prompts: Sequence[str], continuations: Sequence[str],
                 max_len: int | None = None, pad_to_multiple: int = 16,
                 add_bos: bool | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Tokenizes prompt and continuation separately and concatenates them (right padding).

  Args:
    tokenizer: the LM's tokenizer.
    prompts: B prompt strings (may be '').
    continuations: B continuation strings (include a leading space where the text needs one).
    max_len: pad/truncate to this many tokens (truncation drops the start of the prompt).
    pad_to_multiple: round the length up (fewer recompilations).
    add_bos: prepend BOS (default: the tokenizer's setting).

  Returns:
    ids [B, T] int32, mask [B, T] bool, target_mask [B, T] bool (the continuation tokens).
  """
  if len(prompts) != len(continuations):
    raise ValueError(f"{len(prompts)} prompts but {len(continuations)} continuations.")
  seqs, targets = [], []
  for p, c in zip(prompts, continuations):
    pi = tokenizer.encode(p, add_bos=add_bos) if p else (tokenizer.encode("", add_bos=add_bos))
    ci = tokenizer.encode(c, add_bos=False)
    if not ci:
      raise ValueError(f"continuation {c!r} encodes to no tokens.")
    seqs.append(pi + ci)
    targets.append([0] * len(pi) + [1] * len(ci))
  ids, mask = tok_lib.pad_sequences(seqs, tokenizer.pad_id, max_len=max_len, pad_to_multiple=pad_to_multiple)
  tmask, _ = tok_lib.pad_sequences(targets, 0, max_len=ids.shape[1])
  return ids, mask, tmask.astype(bool) & mask


@functools.lru_cache(maxsize=16)
def _jitted_sequence_logprob(config: llama.LlamaConfig):
  return jax.jit(lambda params, ids, mask, tmask: sequence_logprob(params, config, ids, mask, tmask))


def score_continuations(params: llama.Params, config: llama.LlamaConfig, tokenizer: tok_lib.Tokenizer,
                        prompts: Sequence[str], continuations: Sequence[str], batch_size: int = 8,
                        max_len: int | None = None, mesh: Any = None) -> dict[str, np.ndarray]:
  """log p(continuation | prompt) for many pairs, batched on the host.

  Args:
    params, config, tokenizer: the LM.
    prompts, continuations: N strings each.
    batch_size: rows per compiled call (the last batch is padded with copies).
    max_len: maximum tokens per row (default: each batch's longest, bucketed to a power of two).
    mesh: optional `jax.sharding.Mesh`; batches are sharded over its 'data' axis (batch_size must divide).

  Returns:
    {'sum_logprob': [N] float, 'num_tokens': [N] int, 'mean_logprob': [N] float}.
  """
  from iclr24_jax.lm.generation import bucket
  fn = _jitted_sequence_logprob(config)
  sums, counts = [], []
  n = len(prompts)
  for start in range(0, n, batch_size):
    p = list(prompts[start:start + batch_size])
    c = list(continuations[start:start + batch_size])
    real = len(p)
    p += [p[0]] * (batch_size - real)
    c += [c[0]] * (batch_size - real)
    ids, mask, tmask = encode_pairs(tokenizer, p, c, max_len=max_len)
    if max_len is None:
      width = bucket(ids.shape[1])
      ids, mask, tmask = (np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=v)
                          for a, v in ((ids, tokenizer.pad_id), (mask, False), (tmask, False)))
    batch = (ids, mask, tmask)
    if mesh is not None:
      from iclr24_jax.common import sharding
      batch = sharding.shard_batch(batch, mesh)
    s, k = jax.device_get(fn(params, *batch))
    sums.append(np.asarray(s[:real], np.float64))
    counts.append(np.asarray(k[:real]))
  sums_a, counts_a = np.concatenate(sums), np.concatenate(counts)
  return {"sum_logprob": sums_a, "num_tokens": counts_a, "mean_logprob": sums_a / np.maximum(counts_a, 1)}
