"""Feature scores from a prompted LM (SmolLM2 by default), cached on disk; embeddings for the standard PM.

Default mode ('expected'): the score of a feature is its expected value under the LM's distribution over the
answers "1".."10" after the feature prompt, read from log-probabilities (never from generated text):

  p(k)  for k = 2..9   = p(first answer token = "k")
  p(1)                 = p("1") * (1 - sum_d p(digit d | "1"))      # "1" followed by a non-digit
  p(10)                = p("1") * p("0" | "1")                     # "10" is two tokens ("1", "0") in SmolLM2
  score                = sum_k k p(k) / sum_k p(k)

Option mode ('parse'): greedy generation and the official regex parse (`features.parse_score`); an
unparseable answer is missing (NaN) and the pair is dropped.

One call scores all 13 questions of a reply after ONE prefill of the shared prefix (instructions, conversation,
reply): the prefix's KV cache is repeated once per question and the 13 questions (each followed by the digit
"1") run in one more forward pass, the layout of `lm.choice_logprobs_ids`. The same prefill also yields the
frozen hidden states the standard PM is trained on (the last prefix token's and the mean over the prefix).
# Deviation: `lm.score_suffixes` returns the total log-probability of each suffix, not the next-token
# distribution after it, so the 13 x 10 answers would cost 130 suffix passes; this module composes the same
# primitives (`llama.forward` with a `KVCache`) to read both distributions from 13 suffix passes. The answer
# log-probabilities equal `lm.choice_logprobs` on the full prompt for "2".."9" (tested).
"""
from __future__ import annotations

import functools
import hashlib
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import jsonl_cache
from iclr24_jax.papers.cpm import features as feat

MODES = ("expected", "parse")


# ------------------------------------------------------------------------------------------ pure JAX core


def suffix_digit_logprobs(params, config, prefix_ids: jax.Array, prefix_mask: jax.Array, suffix_ids: jax.Array,
                          suffix_mask: jax.Array, digit_ids: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The answer distribution after each of S suffixes of each prefix, plus the prefix's hidden states (pure).

  Args:
    params, config: an `iclr24_jax.lm` Llama.
    prefix_ids: [B, Tp] LEFT-padded prefix ids (each row's last real token at Tp - 1).
    prefix_mask: [B, Tp] bool.
    suffix_ids: [B, S, Ts] RIGHT-padded suffix ids, each followed by the token of "1" (the first token of "10").
    suffix_mask: [B, S, Ts] bool (the appended "1" included).
    digit_ids: [10] token ids of "0".."9" (single tokens).

  Returns:
    (option_logprobs [B, S, 10] for the answers "1".."10", unnormalised over the options;
      hidden_last [B, D] the final normed hidden state at the last prefix token;
      hidden_mean [B, D] its mean over the real prefix tokens).
  """
  from iclr24_jax.lm import llama
  b, tp = prefix_ids.shape
  _, s, ts = suffix_ids.shape
  kv = config.num_kv_heads
  cache = llama.init_cache(config, b, tp + ts, dtype=llama.param_dtype(params))
  hidden, cache = llama.hidden_states(params, config, prefix_ids, prefix_mask, cache=cache)     # [B, Tp, D]
  pm = prefix_mask.astype(hidden.dtype)[..., None]
  hidden_mean = jnp.sum(hidden * pm, axis=1) / jnp.maximum(jnp.sum(pm, axis=1), 1.0)
  hidden_last = hidden[:, -1]

  def rep(x):  # [B*KV, ...] -> [B*S*KV, ...]: one copy of each prefix's cache per suffix
    x = x.reshape(b, kv, *x.shape[1:])
    return jnp.repeat(x, s, axis=0).reshape(b * s * kv, *x.shape[2:])
  tiled = llama.KVCache(k=[rep(x) for x in cache.k], v=[rep(x) for x in cache.v],
                        mask=jnp.repeat(cache.mask, s, axis=0), index=cache.index,
                        length=jnp.repeat(cache.length, s, axis=0))
  ids = suffix_ids.reshape(b * s, ts)
  mask = suffix_mask.reshape(b * s, ts).astype(bool)
  h, _ = llama.hidden_states(params, config, ids, mask, cache=tiled)                         # [B*S, Ts, D]
  n = jnp.sum(mask, axis=1, dtype=jnp.int32)                                                   # incl. the "1"
  at_q = jnp.take_along_axis(h, (n - 2)[:, None, None], axis=1)[:, 0]    # last question token -> first digit
  at_1 = jnp.take_along_axis(h, (n - 1)[:, None, None], axis=1)[:, 0]    # the "1" -> the digit after it
  lp_first = jax.nn.log_softmax(llama.output_logits(params, config, at_q).astype(jnp.float32), axis=-1)
  lp_next = jax.nn.log_softmax(llama.output_logits(params, config, at_1).astype(jnp.float32), axis=-1)
  first = lp_first[:, digit_ids]                                          # [B*S, 10]: "0".."9" first
  after_one = lp_next[:, digit_ids]                                       # [B*S, 10]: digit after "1"
  log_p_digit_after_one = jax.nn.logsumexp(after_one, axis=-1)
  log_p_end_after_one = jnp.log1p(-jnp.minimum(jnp.exp(log_p_digit_after_one), 1.0 - 1e-7))
  opt_1 = first[:, 1] + log_p_end_after_one
  opt_10 = first[:, 1] + after_one[:, 0]
  options = jnp.concatenate([opt_1[:, None], first[:, 2:10], opt_10[:, None]], axis=1)        # "1".."10"
  return options.reshape(b, s, 10), hidden_last, hidden_mean


@functools.lru_cache(maxsize=8)   # one jitted function per static value: jit caches by function identity
def _jitted_core(config):
  return jax.jit(lambda params, pi, pm, si, sm, d: suffix_digit_logprobs(params, config, pi, pm, si, sm, d))


# ----------------------------------------------------------------------------------------------- caching


class ScoreCache(jsonl_cache.JsonlCache):
  """The reply-score cache: a `common.jsonl_cache.JsonlCache` (resumable JSON lines, a torn line skipped) whose
  keys hash the model id and the exact prompt text (`key`).

  Args:
    path: the .jsonl file (created on first write) or None for an in-memory cache.
  """

  @staticmethod
  def key(model_id: str, *parts: Any) -> str:
    """SHA-256 of the model id and the parts (prompt texts, mode)."""
    if not model_id:
      raise ValueError("a cache key needs a non-empty model id.")
    return jsonl_cache.digest([model_id, *parts])


# ------------------------------------------------------------------------------------------------ scorers


def _round(x: np.ndarray, digits: int = 5) -> list:
  return np.round(np.asarray(x, np.float64), digits).tolist()


class SmolLMScorer:
  """Scores the 13 features of (history, reply) pairs with a local Llama (SmolLM2-135M-Instruct by default).

  Args:
    params, config, tokenizer: an `iclr24_jax.lm` Llama (default: `lm.load_smollm2()`).
    model_id: the model's name in cache keys.
    template: 'short' (the reproduction's cheaper wording) or 'official' (see `features.SUFFIX_TEMPLATES`).
    batch_size: replies per compiled call.
    widths: allowed padded prefix lengths (tokens); longer prefixes are cut from the left of the history.
    suffix_width: padded suffix length (tokens).
  """

  def __init__(self, params=None, config=None, tokenizer=None, model_id: str = "SmolLM2-135M-Instruct/Q4_1/f32",
               template: str = "short", batch_size: int = 4, widths: Sequence[int] = (128, 192, 256, 384, 512),
               suffix_width: int | None = None):
    from iclr24_jax import lm
    if params is None:
      params, config, tokenizer = lm.load_smollm2()
    if config is None or tokenizer is None:
      raise ValueError("pass params, config and tokenizer together (or none of them to load SmolLM2).")
    if template not in feat.SUFFIX_TEMPLATES:
      raise ValueError(f"template must be one of {tuple(feat.SUFFIX_TEMPLATES)}, got {template!r}.")
    self.params = lm.llama.fuse_params(params)
    self.config, self.tokenizer = config, tokenizer
    self.model_id, self.template = model_id, template
    self.batch_size = int(batch_size)
    self.widths = tuple(sorted(int(w) for w in widths))
    digits = [tokenizer.encode(str(d), add_bos=False) for d in range(10)]
    if any(len(d) != 1 for d in digits):
      raise ValueError("the tokenizer does not encode the digits 0..9 as single tokens; the expected-score "
                       "reader needs digit-split tokens (SmolLM2 has them).")
    self.digit_ids = np.asarray([d[0] for d in digits], np.int32)
    self.suffix_width = suffix_width
    self.num_tokens = 0            # real tokens processed (prefixes + suffixes)
    self.seconds = 0.0

  def _encode(self, history: str, reply: str) -> tuple[list[int], list[list[int]]]:
    # Tokenize each full prompt as one text (as `lm.choice_logprobs` does) and split at the longest common
    # token prefix of the 13 prompts, so prefix + suffix ids equal the joint tokenization exactly.
    full = []
    for f in feat.FEATURES:
      a, b = feat.chat_parts(f, history, reply, self.tokenizer, template=self.template)
      full.append(self.tokenizer.encode(a + b))
    n = min(len(x) for x in full)
    common = 0
    while common < n and all(x[common] == full[0][common] for x in full):
      common += 1
    one = int(self.digit_ids[1])
    return full[0][:common], [x[common:] + [one] for x in full]

  def _cut_history(self, history: str, reply: str, limit: int) -> str:
    # Deviation: prefixes longer than the largest width lose their oldest turns (then characters).
    while True:
      prefix, _ = self._encode(history, reply)
      if len(prefix) <= limit or not history:
        return history
      cut = history.find("\n\nHuman:", 1)
      history = history[cut:].strip() if cut > 0 else history[max(len(history) // 4, 1):]

  def score(self, histories: Sequence[str], replies: Sequence[str]) -> dict[str, np.ndarray]:
    """Option log-probabilities and embeddings for M replies (no caching; see `score_features`).

    Args:
      histories, replies: M strings each.

    Returns:
      {'option_logprobs': [M, 13, 10], 'hidden_last': [M, D], 'hidden_mean': [M, D]}.
    """
    from iclr24_jax.lm import tokenizer as tok_lib
    if len(histories) != len(replies):
      raise ValueError(f"{len(histories)} histories but {len(replies)} replies.")
    enc = [self._encode(self._cut_history(h, r, self.widths[-1]), r) for h, r in zip(histories, replies)]
    fn = _jitted_core(self.config)
    m = len(enc)
    out_lp = np.zeros((m, len(feat.FEATURES), 10))
    d = self.config.hidden_size
    out_last, out_mean = np.zeros((m, d)), np.zeros((m, d))
    order = np.argsort([len(p) for p, _ in enc], kind="stable")
    ts_all = max(len(s) for _, sfx in enc for s in sfx)
    ts = self.suffix_width or int(4 * np.ceil(ts_all / 4))
    if ts_all > ts:
      raise ValueError(f"a feature question takes {ts_all} tokens > suffix_width={ts}.")
    t0 = time.perf_counter()
    for start in range(0, m, self.batch_size):
      idx = order[start:start + self.batch_size]
      rows = [enc[i] for i in idx]
      width = next(w for w in self.widths if w >= max(len(p) for p, _ in rows))
      pad_rows = self.batch_size - len(rows)
      rows = rows + [rows[0]] * pad_rows
      pids, pmask = tok_lib.pad_sequences([p for p, _ in rows], self.tokenizer.pad_id, max_len=width,
                                          padding="left")
      sids = np.full((len(rows), len(feat.FEATURES), ts), self.tokenizer.pad_id, np.int32)
      smask = np.zeros(sids.shape, bool)
      for r, (_, sfx) in enumerate(rows):
        for j, s in enumerate(sfx):
          sids[r, j, :len(s)] = s
          smask[r, j, :len(s)] = True
      lp, hl, hm = jax.device_get(fn(self.params, pids, pmask, sids, smask, self.digit_ids))
      real = len(idx)
      out_lp[idx], out_last[idx], out_mean[idx] = lp[:real], hl[:real], hm[:real]
      self.num_tokens += int(pmask[:real].sum() + smask[:real].sum())
    self.seconds += time.perf_counter() - t0
    return {"option_logprobs": out_lp, "hidden_last": out_last, "hidden_mean": out_mean}

  def generate_answers(self, histories: Sequence[str], replies: Sequence[str], max_new_tokens: int = 4) -> list:
    """Greedy answers to every feature prompt (the 'parse' mode): `[M][13]` strings.

    Args:
      histories: M conversation histories.
      replies: M replies (paired with the histories).
      max_new_tokens: tokens generated per answer.

    Returns:
      M lists of 13 answer strings (one per feature, in feat.FEATURES order).
    """
    from iclr24_jax import lm
    gen = lm.Generator(self.params, self.config, self.tokenizer, chat=False, batch_size=8)
    prompts = [a + b for h, r in zip(histories, replies) for f in feat.FEATURES
               for a, b in [feat.chat_parts(f, h, r, self.tokenizer, template=self.template)]]
    texts = gen(prompts, max_new_tokens=max_new_tokens)
    k = len(feat.FEATURES)
    return [texts[i * k:(i + 1) * k] for i in range(len(histories))]


class FakeScorer:
  """A deterministic stand-in for tests and the tiny config: no LM, scores from the text itself.

  Each feature score is a fixed linear function of simple reply statistics (log length, question marks,
  refusal words, word overlap with the history) plus hash noise, mapped into 1..10 and expressed as option
  log-probabilities peaked there; the embedding is a hashed bag of words.

  Args:
    dim: embedding width.
    noise: hash-noise scale of the scores.
  """

  model_id = "fake-scorer/v1"
  template = "short"

  def __init__(self, dim: int = 32, noise: float = 0.5):
    self.dim, self.noise = int(dim), float(noise)
    rng = np.random.default_rng(1234)
    self._mix = rng.normal(size=(len(feat.FEATURES), 4))
    self.num_tokens, self.seconds = 0, 0.0

  @staticmethod
  def _h(*parts: str) -> float:
    digest = hashlib.sha256("\x00".join(parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2.0 ** 64

  def _stats(self, history: str, reply: str) -> np.ndarray:
    words = reply.lower().split()
    hist = set(history.lower().split())
    refuse = sum(w.strip(".,!") in ("sorry", "can't", "cannot", "not", "no", "illegal") for w in words)
    overlap = len([w for w in words if w in hist]) / max(len(words), 1)
    return np.array([np.log1p(len(words)), reply.count("?"), refuse, overlap])

  def score(self, histories: Sequence[str], replies: Sequence[str]) -> dict[str, np.ndarray]:
    """Same contract as `SmolLMScorer.score`.

    Args:
      histories: M conversation histories.
      replies: M replies.

    Returns:
      {'option_logprobs': [M, 13, 10] (peaked at a hashed score in 1..10), 'hidden_last' and 'hidden_mean':
      [M, dim] the same hashed bag-of-words embedding}.
    """
    m = len(replies)
    lp = np.zeros((m, len(feat.FEATURES), 10))
    emb = np.zeros((m, self.dim))
    ks = np.arange(1, 11)
    for i, (h, r) in enumerate(zip(histories, replies)):
      s = self._stats(h, r)
      for j, f in enumerate(feat.FEATURES):
        mu = 5.5 + 1.5 * np.tanh(self._mix[j] @ s / 2.0) * 3.0 / 1.5 + self.noise * (self._h(f, h, r) - 0.5) * 4
        lp[i, j] = -0.5 * (ks - np.clip(mu, 1, 10)) ** 2
      for w in r.lower().split():
        emb[i, int(self._h("emb", w) * self.dim)] += 1.0
      emb[i] /= max(np.linalg.norm(emb[i]), 1.0)
    return {"option_logprobs": lp, "hidden_last": emb, "hidden_mean": emb}

  def generate_answers(self, histories, replies, max_new_tokens: int = 4) -> list:
    """Same contract as `SmolLMScorer.generate_answers`: `[M][13]` strings, the argmax option ('1'..'10') or 'n/a'
    for about 5% of the (feature, reply) pairs (hash-chosen).
    """
    lp = self.score(histories, replies)["option_logprobs"]
    out = []
    for i in range(len(replies)):
      row = []
      for j, f in enumerate(feat.FEATURES):
        k = int(np.argmax(lp[i, j])) + 1
        row.append("n/a" if self._h("parse", f, histories[i], replies[i]) < 0.05 else str(k))
      out.append(row)
    return out


# ------------------------------------------------------------------------------------------- cached entry


def score_features(scorer, histories: Sequence[str], replies: Sequence[str], cache: ScoreCache | None = None,
                   mode: str = "expected", chunk: int = 32, progress: Callable[[int, int], None] | None = None
                   ) -> dict[str, np.ndarray]:
  """Feature scores [M, 13] (and PM embeddings) for M replies, read from / written to `cache`.

  Args:
    scorer: a `SmolLMScorer` or `FakeScorer` (anything with `score`, `generate_answers`, `model_id`).
    histories, replies: M strings each.
    cache: a `ScoreCache` (resumable on disk) or None.
    mode: 'expected' (expected score under the answer distribution) or 'parse' (greedy text + regex; NaN when
      unparseable).
    chunk: replies scored between cache writes.
    progress: optional callback(done, total).

  Returns:
    {'scores': [M, 13] float64 (NaN = missing), 'embedding': [M, 2 D] (last-token and mean hidden states,
      'expected' mode only, else None), 'option_logprobs': [M, 13, 10] or None}.
  """
  if mode not in MODES:
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}.")
  if len(histories) != len(replies):
    raise ValueError(f"{len(histories)} histories but {len(replies)} replies.")
  template = getattr(scorer, "template", "short")
  keys = [ScoreCache.key(scorer.model_id, mode, template, h, r) for h, r in zip(histories, replies)]

  def score_chunk(idx: list[int]) -> list[dict]:
    hs, rs = [histories[i] for i in idx], [replies[i] for i in idx]
    if mode == "expected":
      out = scorer.score(hs, rs)
      return [{"lp": _round(out["option_logprobs"][j]),
               "emb": _round(np.concatenate([out["hidden_last"][j], out["hidden_mean"][j]]), 4)}
              for j in range(len(idx))]
    return [{"answers": a} for a in scorer.generate_answers(hs, rs)]

  recs = jsonl_cache.cached_map(score_chunk, range(len(keys)), keys, cache, chunk_size=chunk, progress=progress,
                                what="reply")
  if mode == "expected":
    lp = np.asarray([r["lp"] for r in recs], np.float64)
    emb = np.asarray([r["emb"] for r in recs], np.float64)
    return {"scores": feat.expected_score(lp), "embedding": emb, "option_logprobs": lp}
  scores = np.asarray([[np.nan if (v := feat.parse_score(a)) is None else float(v) for a in r["answers"]]
                       for r in recs], np.float64)
  return {"scores": scores, "embedding": None, "option_logprobs": None}
