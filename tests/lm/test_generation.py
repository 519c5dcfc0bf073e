"""Generation (`lm/generation.py`): the cache equals no cache against repeated full forwards, stop
ids and logit bias, the sampling filters, nucleus fast paths against the full sort."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.lm import generation as gen_lib
from .helpers import CFG, _ids


STOP = CFG.vocab_size - 1  # banned (bias -1e9) unless a test forces it (bias +1e4)


@pytest.fixture(scope="module")
def greedy():
  def run(p, ids, mask, bias, use_cache):
    return gen_lib.generate(p, CFG, ids, mask, jax.random.key(0), max_new_tokens=6, stop_ids=(STOP,), pad_id=0,
                            use_cache=use_cache, logit_bias=bias)
  return jax.jit(run, static_argnames="use_cache")


def _bias(**changes):
  vec = np.zeros((CFG.vocab_size,), np.float32)
  vec[STOP] = -1e9
  for tok, b in changes.items():
    vec[int(tok[1:])] = b
  return vec


def _greedy_ref(params, fwd, prompt, n=6):
  """Greedy continuation by repeated full forwards (row 0 of a right-padded [2, 8] buffer)."""
  seq = list(prompt)
  for _ in range(n):
    buf = np.zeros((2, 8), np.int32)
    m = np.zeros((2, 8), bool)
    buf[0, :len(seq)], m[0, :len(seq)] = seq, True
    logits = np.array(fwd(params, buf, m))[0, len(seq) - 1]
    logits[STOP] = -np.inf
    seq.append(int(np.argmax(logits)))
  return seq[len(prompt):]


def test_generation_cache_equals_no_cache(params, greedy, fwd):
  ids = _ids(2, 8)
  mask = np.ones((2, 8), bool)
  mask[1, :3] = False  # left padding
  a = greedy(params, ids, mask, _bias(), True)
  b = greedy(params, ids, mask, _bias(), False)
  np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
  np.testing.assert_allclose(np.asarray(a.logprobs), np.asarray(b.logprobs), rtol=1e-4, atol=1e-4)
  chex.assert_shape(a.tokens, (2, 6))
  np.testing.assert_array_equal(np.asarray(a.lengths), [6, 6])
  # Prompts of 2 tokens, left- or right-padded: the same continuation, equal to the argmax of plain forwards.
  left = np.zeros((2, 8), bool)
  left[:, -2:] = True
  right = left[:, ::-1].copy()
  ids_right = np.concatenate([ids[:, 6:], ids[:, :6]], axis=1)
  c = greedy(params, ids, left, _bias(), True)
  d = greedy(params, ids_right, right, _bias(), True)
  np.testing.assert_array_equal(np.asarray(c.tokens), np.asarray(d.tokens))
  assert [int(x) for x in np.asarray(c.tokens)[0]] == _greedy_ref(params, fwd, list(ids[0, 6:]))


def test_generation_stop_and_logit_bias(params, greedy):
  """A +1e4 bias on the stop token makes every row emit it first and stop; -1e9 forbids a token."""
  ids = _ids(2, 8)
  mask = np.ones((2, 8), bool)
  out = greedy(params, ids, mask, _bias(**{f"t{STOP}": 1e4}), True)
  np.testing.assert_array_equal(np.asarray(out.tokens), [[STOP, 0, 0, 0, 0, 0]] * 2)
  np.testing.assert_array_equal(np.asarray(out.lengths), [1, 1])
  np.testing.assert_array_equal(np.asarray(out.mask), [[True] + [False] * 5] * 2)
  assert bool(np.all(np.asarray(out.stopped)))
  free = greedy(params, ids, mask, _bias(), True)
  assert not bool(np.any(np.asarray(free.stopped)))
  banned_tok = int(np.asarray(free.tokens)[0, 0])
  banned = greedy(params, ids, mask, _bias(**{f"t{banned_tok}": -1e9}), True)
  assert int(np.asarray(banned.tokens)[0, 0]) != banned_tok
  np.testing.assert_array_equal(gen_lib.bias_vector({3: 2.0, 4: -1.0}, 6), [0, 0, 0, 2.0, -1.0, 0])


def test_sampling_filters():
  logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]]))
  filt = jax.jit(gen_lib.process_logits, static_argnames=("temperature", "top_k", "top_p"))
  lp = filt(logits, 1.0, top_k=2)
  np.testing.assert_allclose(np.exp(np.asarray(lp))[0], [0.625, 0.375, 0, 0], rtol=1e-6, atol=1e-7)  # 0.5/0.8, 0.3/0.8
  lp = filt(logits, 1.0, top_p=0.7)  # mass before each: 0, .5, .8 -> keep first two
  np.testing.assert_allclose(np.exp(np.asarray(lp))[0], [0.625, 0.375, 0, 0], rtol=1e-6, atol=1e-7)
  lp = filt(logits, 0.5)  # temperature 0.5 squares the probabilities: p^2 / sum p^2
  p2 = np.asarray([0.25, 0.09, 0.0225, 0.0025])
  np.testing.assert_allclose(np.exp(np.asarray(lp))[0], p2 / p2.sum(), rtol=1e-5)
  keys = jax.random.split(jax.random.key(0), 2000)
  draws = jax.jit(jax.vmap(lambda k: gen_lib.sample_token(k, logits, 1.0)[0][0]))(keys)
  freq = np.bincount(np.asarray(draws), minlength=4) / 2000
  np.testing.assert_allclose(freq, [0.5, 0.3, 0.15, 0.05], atol=0.04)  # 4 sigma of a binomial at n=2000
  tok, _ = jax.jit(lambda k: gen_lib.sample_token(k, logits, temperature=1.0, top_k=1))(jax.random.key(1))
  assert int(tok[0]) == 0


def test_nucleus_fast_paths_equal_full_sort():
  """The top-k fast path and the threshold bisection give the full sort's set: sharp rows (nucleus within
  the 16 candidates), a flat row (it is not: the threshold search or the sort runs for the whole batch) and
  rows where no candidate path is taken (candidates >= V)."""
  rng = np.random.default_rng(0)
  sharp = rng.standard_normal((3, 1000)).astype(np.float32) * 6.0
  flat = rng.standard_normal((1, 1000)).astype(np.float32) * 0.1
  ref = jax.jit(lambda l, p: gen_lib.nucleus_mask(l, p, candidates=l.shape[-1], method="sort"),
                static_argnums=1)
  fast = jax.jit(gen_lib.nucleus_mask, static_argnums=(1, 2, 3))
  for logits in (sharp, np.concatenate([sharp, flat]), rng.standard_normal((8, 1000)).astype(np.float32) * 2.0):
    for top_p in (0.3, 0.9, 0.99):
      want = np.asarray(ref(jnp.asarray(logits), top_p))
      for cand, method in ((16, "threshold"), (16, "sort"), (1000, "threshold")):
        got = np.asarray(fast(jnp.asarray(logits), top_p, cand, method))
        np.testing.assert_array_equal(got, want, err_msg=f"{cand} {method} {top_p}")
      assert want.any(1).all()
  assert np.asarray(ref(jnp.asarray(sharp), 0.9)).sum(1).max() <= 16
  # by hand: probabilities .5 .3 .15 .05, top_p .7: mass before = 0, .5, .8 -> the first two; 2 candidates hold .8
  logits = jnp.log(jnp.asarray([[0.15, 0.5, 0.05, 0.3]]))
  for cand in (2, 4):
    np.testing.assert_array_equal(np.asarray(gen_lib.nucleus_mask(logits, 0.7, candidates=cand)), [[0, 1, 0, 1]])
    np.testing.assert_array_equal(np.asarray(gen_lib.nucleus_mask(logits, 0.9, candidates=cand)), [[1, 1, 0, 1]])
  # ties at the boundary: .4 .2 .2 .2, top_p .5 -> the sort keeps .4 and one .2; the threshold keeps every .2
  tied = jnp.log(jnp.asarray([[0.2, 0.4, 0.2, 0.2]]))
  assert int(np.asarray(gen_lib.nucleus_mask(tied, 0.5, candidates=4, method="sort")).sum()) == 2
  np.testing.assert_array_equal(np.asarray(gen_lib.nucleus_mask(tied, 0.5, candidates=4)), [[1, 1, 1, 1]])
  with pytest.raises(ValueError, match="method"):
    gen_lib.nucleus_mask(tied, 0.5, method="heap")


def test_greedy_token_is_argmax_with_its_logprob():
  """Ties go to the first index (as `jnp.argmax`), the log-probability is the log-softmax's at that token, and a
  row with a NaN reports NaN instead of a silent token."""
  logits = jnp.asarray([[1.0, 3.0, 3.0, -2.0], [0.5, 0.25, -1.0, 0.5], [0.0, jnp.nan, 1.0, 2.0]], jnp.float32)
  tokens, logp = jax.jit(gen_lib.greedy_token)(logits)
  np.testing.assert_array_equal(np.asarray(tokens[:2]), [1, 0])
  ref = jax.nn.log_softmax(logits[:2], axis=-1)
  np.testing.assert_allclose(np.asarray(logp[:2]), np.asarray(ref[jnp.arange(2), tokens[:2]]), rtol=1e-6)
  assert int(tokens[2]) == 0 and np.isnan(float(logp[2]))
  big = jax.random.normal(jax.random.key(0), (5, 49152))
  np.testing.assert_array_equal(np.asarray(gen_lib.greedy_token(big)[0]), np.asarray(jnp.argmax(big, -1)))
