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

from iclr24_jax.common import checks
from iclr24_jax.lm import llama
from iclr24_jax.lm import tokenizer as tok_lib


def _check_ids(where: str, config: llama.LlamaConfig, ids: jax.Array, mask: jax.Array | None = None,
               ids_name: str = "ids", mask_name: str = "mask", nonempty_rows: bool = False) -> object:
  """[B, T] integer ids in [0, vocab) and a matching bool mask; values raise eagerly, else the poison condition."""
  checks.shapes(where, **{ids_name: (ids, "B T"), mask_name: (mask, "B T")})
  checks.dtype(where, ids_name, ids, "integer", "token ids.")
  checks.dtype(where, mask_name, mask, "int_or_bool")
  oks = [checks.indices(where, ids_name, ids, config.vocab_size, f"token ids of the model's vocabulary "
                        f"(vocab_size={config.vocab_size}).")]
  if nonempty_rows and mask is not None:
    xp = checks.xp(mask)
    oks.append(checks.require(where, xp.any(xp.asarray(mask).astype(bool), axis=-1), checks.EmptyInputError,
                              f"every row of {mask_name} needs at least one real token."))
  return checks.all_ok(*oks)


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
    [B, T] float32; 0 at padding and at each row's first real token (it has no context). Ids outside the
    vocabulary raise `checks.IndexRangeError` eagerly and give NaN under jit.
  """
  ok = _check_ids("lm.token_logprobs", config, ids, mask)
  return checks.poison(_token_logprobs(params, config, ids, mask)[0], ok)


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
    (sum_logprob [B], num_scored_tokens [B] int32); mean log-likelihood = sum / num. Ids outside the
    vocabulary raise eagerly; under jit the sums are NaN and the counts -1.
  """
  where = "lm.sequence_logprob"
  ok = _check_ids(where, config, ids, mask)
  checks.shapes(where, ids=(ids, "B T"), target_mask=(target_mask, "B T"))
  lp, valid = _token_logprobs(params, config, ids, mask)
  if target_mask is not None:
    valid = valid & target_mask.astype(bool)
  return checks.poison((jnp.sum(jnp.where(valid, lp, 0.0), axis=1), jnp.sum(valid, axis=1, dtype=jnp.int32)), ok,
                       int_fill=-1)


def next_token_logprobs(params: llama.Params, config: llama.LlamaConfig, ids: jax.Array,
                        mask: jax.Array | None = None) -> jax.Array:
  """Log-distribution of the token after each row's last real token.

  Args:
    params, config: the LM.
    ids: [B, T] prompt ids (either padding side).
    mask: [B, T] real tokens.

  Returns:
    [B, V] float32 log-probabilities (NaN under jit for ids outside the vocabulary or a row without a real
    token; eager calls raise).
  """
  ok = _check_ids("lm.next_token_logprobs", config, ids, mask, nonempty_rows=True)
  logits = llama.forward(params, config, ids, mask, last_only=True)
  return checks.poison(jax.nn.log_softmax(logits, axis=-1), ok)


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


@functools.lru_cache(maxsize=16)   # one jitted function per static value: jit caches by function identity
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


# ------------------------------------------------------------------------------- choices after a shared prompt

# Padded prompt widths of `choice_logprobs` (tokens): a run compiles one program per width it meets.
CHOICE_WIDTHS = (64, *range(128, 2049, 128), 2560, 3072, 4096, 6144, 8192)
# A common token prefix of at least this many tokens is prefilled once per call (rounded down to a multiple of
# PREFIX_MULTIPLE so that calls share compiled shapes).
MIN_SHARED_PREFIX = 32
PREFIX_MULTIPLE = 16


def choice_logprobs_ids(params: llama.Params, config: llama.LlamaConfig, prompt_ids: jax.Array,
                        prompt_mask: jax.Array, option_ids: jax.Array, option_mask: jax.Array,
                        prefix_ids: jax.Array | None = None) -> jax.Array:
  """Total log-probability of every option as the continuation of every prompt (pure; jit it).

  The prompts are prefilled once into a KV cache; the cache is then repeated O times (one copy per option)
  and all P * O option sequences are scored in one more forward pass that attends to it. The prompt is never
  recomputed per option. With `prefix_ids`, the tokens every prompt starts with are prefilled once (batch 1)
  and their cache is shared by all P rows before the prompts' own tokens (the padding between the two is
  masked and positions count real tokens only, so the result is the same as prefilling prefix + prompt).

  Args:
    params, config: the LM.
    prompt_ids: [P, Tp] int ids, LEFT-padded (every row's last real token at Tp - 1); each row has at
      least one real token.
    prompt_mask: [P, Tp] bool, real prompt tokens.
    option_ids: [O, To] int ids, right-padded; each row has at least one real token.
    option_mask: [O, To] bool, real option tokens.
    prefix_ids: optional [K] ids shared by every prompt, before `prompt_ids`.

  Returns:
    [P, O] float32: sum_j log p(option_o[j] | prefix, prompt_p, option_o[:j]) over the real option tokens.
    Ids outside the vocabulary or a prompt / option row without a real token raise named errors eagerly and
    give NaN under jit.
  """
  where = "lm.choice_logprobs_ids"
  ok = checks.all_ok(
      _check_ids(where, config, prompt_ids, prompt_mask, "prompt_ids", "prompt_mask", nonempty_rows=True),
      _check_ids(where, config, option_ids, option_mask, "option_ids", "option_mask", nonempty_rows=True))
  if prefix_ids is not None:
    checks.shapes(where, prefix_ids=(prefix_ids, "K"))
    ok = checks.all_ok(ok, checks.indices(where, "prefix_ids", prefix_ids, config.vocab_size))
  return checks.poison(_choice_logprobs_ids(params, config, prompt_ids, prompt_mask, option_ids, option_mask,
                                            prefix_ids), ok)


def _choice_logprobs_ids(params, config, prompt_ids, prompt_mask, option_ids, option_mask, prefix_ids):
  p, tp = prompt_ids.shape
  o, to = option_ids.shape
  kv = config.num_kv_heads
  dtype = llama.param_dtype(params)
  if prefix_ids is None:
    cache = llama.init_cache(config, p, tp + to, dtype=dtype)
  else:
    k_len = prefix_ids.shape[0]
    shared = llama.init_cache(config, 1, k_len + tp + to, dtype=dtype)
    _, shared = llama.hidden_states(params, config, prefix_ids[None], cache=shared)
    cache = llama.KVCache(k=[jnp.tile(x, (p, 1, 1)) for x in shared.k], v=[jnp.tile(x, (p, 1, 1)) for x in shared.v],
                          mask=jnp.tile(shared.mask, (p, 1)), index=shared.index, length=jnp.tile(shared.length, p))
  # 1. Prefill: the prompts' keys/values and the distribution of each option's first token.
  logits0, cache = llama.forward(params, config, prompt_ids, prompt_mask, cache=cache, last_only=True)  # [P, V]
  first = logprobs_from_logits(jnp.repeat(logits0, o, axis=0), jnp.tile(option_ids[:, 0], p))  # [P*O]

  # 2. One copy of each prompt's cache per option (row p * O + o), then every option in one pass.
  def rep(x):  # [P*KV, ...] -> [P*O*KV, ...]
    x = x.reshape(p, kv, *x.shape[1:])
    return jnp.repeat(x, o, axis=0).reshape(p * o * kv, *x.shape[2:])
  tiled = llama.KVCache(k=[rep(x) for x in cache.k], v=[rep(x) for x in cache.v],
                        mask=jnp.repeat(cache.mask, o, axis=0), index=cache.index,
                        length=jnp.repeat(cache.length, o, axis=0))
  ids = jnp.tile(option_ids, (p, 1))  # [P*O, To]
  mask = jnp.tile(option_mask.astype(bool), (p, 1))
  if to > 1:
    logits, _ = llama.forward(params, config, ids[:, :-1], mask[:, :-1], cache=tiled)  # [P*O, To-1, V]
    rest = logprobs_from_logits(logits, ids[:, 1:])  # token j+1 predicted at position j
    rest = jnp.sum(jnp.where(mask[:, 1:], rest, 0.0), axis=1)
  else:
    rest = jnp.zeros((p * o,), jnp.float32)
  return (first + rest).reshape(p, o)


@functools.lru_cache(maxsize=16)   # one jitted function per static value: jit caches by function identity
def _jitted_choice_logprobs(config: llama.LlamaConfig):
  return jax.jit(lambda params, pi, pm, oi, om, pre: choice_logprobs_ids(params, config, pi, pm, oi, om, pre))


def _pick_width(n: int, widths: Sequence[int], limit: int) -> int:
  for w in widths:
    if n <= w <= limit:
      return int(w)
  if n <= limit:
    return int(limit)
  raise ValueError(f"a prompt of {n} tokens plus the options does not fit the model's context ({limit} tokens "
                   "left for the prompt); shorten the prompt.")


def _batch_rows(n: int, batch_size: int) -> int:
  """Rows of a compiled call: batch_size, or the next power of two for a short last batch."""
  rows = 1
  while rows < n:
    rows *= 2
  return min(rows, batch_size)


def _check_texts(texts, name: str) -> list[str]:
  if isinstance(texts, str):
    raise TypeError(f"{name} must be a list of strings, got one str; wrap it in a list.")
  texts = list(texts)
  if not all(isinstance(t, str) for t in texts):
    raise TypeError(f"{name} must hold strings, got {sorted({type(t).__name__ for t in texts})}.")
  return texts


def choice_logprobs(params: llama.Params, config: llama.LlamaConfig, tokenizer: tok_lib.Tokenizer,
                    prompts: Sequence[str], options: Sequence[str], *, batch_size: int = 8,
                    widths: Sequence[int] = CHOICE_WIDTHS, add_bos: bool | None = None,
                    share_prefix: bool = True) -> np.ndarray:
  """log p(option | prompt) for every prompt and every option (multi-token options allowed).

  Each prompt and each option is tokenized on its own (the option ids follow the prompt ids, as
  `encode_pairs` does): the result equals `sequence_logprob` on the concatenated ids with the option tokens
  as targets, i.e. sum of `token_logprobs(prompt + option)` minus the prompt's. Prompts are sorted by length,
  left-padded to a width from `widths` and batched `batch_size` at a time (a short last batch is padded to a
  power of two with dummy rows); options are right-padded to a power of two (>= 4). So a loop over many calls
  compiles one program per (rows, width, option width, number of options, shared-prefix length). Every call
  is one jitted program: one prefill of the prompts, their KV cache reused for all options. When all prompts
  of a call start with the same >= 32 tokens (a judge's template), that prefix is prefilled once and shared
  (`share_prefix`; same numbers, less compute).

  Args:
    params, config, tokenizer: the LM (pass `llama.fuse_params(params)` for speed).
    prompts: P prompt strings (render a chat template first if the model expects one).
    options: O option strings, the same for every prompt (include a leading space where the text needs it).
    batch_size: prompts per compiled call.
    widths: allowed padded prompt lengths (tokens).
    add_bos: prepend BOS to each prompt (default: the tokenizer's setting).
    share_prefix: prefill the prompts' common token prefix once.

  Returns:
    [P, O] float64 numpy array of summed log-probabilities (nats).
  """
  prompts = _check_texts(prompts, "prompts")
  options = _check_texts(options, "options")
  if not options:
    raise ValueError("choice_logprobs needs at least one option.")
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
  opt_enc = [tokenizer.encode(opt, add_bos=False) for opt in options]
  for opt, enc in zip(options, opt_enc):
    if not enc:
      raise ValueError(f"option {opt!r} encodes to no tokens.")
  to = max(4, int(2 ** np.ceil(np.log2(max(len(e) for e in opt_enc)))))
  opt_ids, opt_mask = tok_lib.pad_sequences(opt_enc, tokenizer.pad_id, max_len=to)
  out = np.zeros((len(prompts), len(options)), np.float64)
  if not prompts:
    return out
  enc = [tokenizer.encode(p, add_bos=add_bos) for p in prompts]
  for i, e in enumerate(enc):
    if not e:
      raise ValueError(f"prompt {i} encodes to no tokens: an option's first token needs context (pass a "
                       "non-empty prompt or add_bos=True).")
  fn = _jitted_choice_logprobs(config)
  k = common_prefix_length(enc) if share_prefix and len(enc) > 1 else 0
  k = (k // PREFIX_MULTIPLE) * PREFIX_MULTIPLE if k >= MIN_SHARED_PREFIX else 0
  prefix = np.asarray(enc[0][:k], np.int32) if k else None
  enc = [e[k:] for e in enc]
  order = np.argsort([len(e) for e in enc], kind="stable")
  limit = config.max_seq_len - to - k
  for start in range(0, len(order), batch_size):
    idx = order[start:start + batch_size]
    rows = [enc[i] for i in idx]
    width = _pick_width(max(len(r) for r in rows), tuple(sorted(widths)), limit)
    rows = rows + [rows[0]] * (_batch_rows(len(rows), batch_size) - len(rows))
    ids, mask = tok_lib.pad_sequences(rows, tokenizer.pad_id, max_len=width, padding="left")
    lp = np.asarray(jax.device_get(fn(params, ids, mask, opt_ids, opt_mask, prefix)), np.float64)
    out[idx] = lp[:len(idx)]
  return out


def common_prefix_length(seqs: Sequence[Sequence[int]]) -> int:
  """Length of the longest token prefix shared by every sequence, leaving at least one token in each.

  Args:
    seqs: token-id lists.

  Returns:
    int K with seqs[i][:K] equal for all i and K < min(len(seqs[i])).
  """
  if not seqs:
    return 0
  shortest = min(len(x) for x in seqs)
  first = seqs[0]
  k = 0
  while k < shortest - 1 and all(x[k] == first[k] for x in seqs):
    k += 1
  return k


def score_suffixes(params: llama.Params, config: llama.LlamaConfig, tokenizer: tok_lib.Tokenizer, prefix: str,
                   suffixes: Sequence[str], **kwargs) -> np.ndarray:
  """log p(suffix | prefix) for many continuations of one shared prefix (one prefill, its cache reused).

  Args:
    params, config, tokenizer: the LM.
    prefix: the shared text (e.g. a history and a reply).
    suffixes: S continuation strings (e.g. 13 feature questions with their answers).
    **kwargs: passed to `choice_logprobs` (widths, add_bos).

  Returns:
    [S] float64 summed log-probabilities.
  """
  if not isinstance(prefix, str):
    raise TypeError(f"prefix must be one str, got {type(prefix).__name__}.")
  return choice_logprobs(params, config, tokenizer, [prefix], suffixes, **kwargs)[0]


def debiased_preference(logprobs_ab: jax.Array, logprobs_ba: jax.Array) -> jax.Array:
  """Log-odds that the first item is preferred, averaged over both presentation orders.

  In order ab the first item is shown first (option 0 names it), in order ba it is shown second (option 1
  names it). With l_ab = lp_ab[:, 0] - lp_ab[:, 1] and l_ba = lp_ba[:, 1] - lp_ba[:, 0] (both: log-odds for
  the first item), the preference is (l_ab + l_ba) / 2. A purely positional judge (any constant preference for
  the first- or second-shown option) gets exactly 0; a judge that follows the items gets the same sign in both
  orders.

  Args:
    logprobs_ab: [N, 2] log-probabilities of the answers naming position 1 and position 2 (e.g. "(a)",
      "(b)") when the first item is shown in position 1.
    logprobs_ba: [N, 2] the same answers when the items are shown the other way round.

  Returns:
    [N] float32 (> 0: the first item is preferred).
  """
  ab, ba = jnp.asarray(logprobs_ab, jnp.float32), jnp.asarray(logprobs_ba, jnp.float32)
  if ab.ndim != 2 or ab.shape[-1] != 2 or ab.shape != ba.shape:
    raise ValueError(f"debiased_preference needs two [N, 2] arrays of the same shape, got {ab.shape} and {ba.shape}.")
  return 0.5 * ((ab[:, 0] - ab[:, 1]) + (ba[:, 1] - ba[:, 0]))
