"""CPM's LM scoring (`papers/cpm/scoring.py`): the suffix digit log-probabilities against the plain
forward pass, the resumable score cache, the SmolLM2 scorer against choice log-probabilities (slow)."""
import chex
import jax
import numpy as np
import pytest

from iclr24_jax.papers import cpm
from iclr24_jax.papers.cpm import scoring


def test_suffix_digit_logprobs_equal_the_plain_forward_pass():
  from iclr24_jax import lm
  config = lm.tiny_config(vocab_size=64, num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2,
                          intermediate_size=64)
  params = lm.init_params(jax.random.key(0), config)
  rng = np.random.default_rng(0)
  digits = np.arange(10, 20, dtype=np.int32)            # token ids of "0".."9" in this toy vocabulary
  prefixes = [list(rng.integers(20, 64, 9)), list(rng.integers(20, 64, 6))]
  suffixes = [[list(rng.integers(20, 64, k)) for k in (3, 5, 2)] for _ in prefixes]
  tp, ts = 12, 8
  pids = np.zeros((2, tp), np.int32)
  pmask = np.zeros((2, tp), bool)
  sids = np.zeros((2, 3, ts), np.int32)
  smask = np.zeros((2, 3, ts), bool)
  for b, p in enumerate(prefixes):
    pids[b, tp - len(p):], pmask[b, tp - len(p):] = p, True      # left padding
    for s, q in enumerate(suffixes[b]):
      row = q + [int(digits[1])]                                 # the question, then "1"
      sids[b, s, :len(row)], smask[b, s, :len(row)] = row, True
  lp, h_last, h_mean = jax.jit(lambda *a: scoring.suffix_digit_logprobs(params, config, *a))(
      pids, pmask, sids, smask, digits)
  chex.assert_shape(lp, (2, 3, 10))
  # The reference: a plain forward pass over prefix + question + "1", right-padded to one length (causal, so
  # the padding does not reach the positions read), one compiled program.
  ref_fn = jax.jit(lambda ids: jax.nn.log_softmax(lm.forward(params, config, ids), axis=-1))
  for b, p in enumerate(prefixes):
    for s, q in enumerate(suffixes[b]):
      seq = p + q + [int(digits[1])]
      ids = np.zeros((1, 20), np.int32)
      ids[0, :len(seq)] = seq
      logp = ref_fn(ids)[0]
      first, after1 = logp[len(p) + len(q) - 1], logp[len(p) + len(q)]
      for k in range(2, 10):                                     # "2".."9": one token
        np.testing.assert_allclose(lp[b, s, k - 1], first[digits[k]], atol=1e-4)
      np.testing.assert_allclose(lp[b, s, 9], first[digits[1]] + after1[digits[0]], atol=1e-4)   # "10"
      p_digit = float(np.exp(jax.nn.logsumexp(after1[digits])))
      np.testing.assert_allclose(lp[b, s, 0], first[digits[1]] + np.log1p(-p_digit), atol=1e-4)   # "1" alone
  hid = jax.jit(lambda i, m: lm.hidden_states(params, config, i, m))(pids, pmask)   # left padding is ignored
  for b, p in enumerate(prefixes):
    np.testing.assert_allclose(h_last[b], hid[b, -1], atol=1e-4)
    np.testing.assert_allclose(h_mean[b], hid[b, tp - len(p):].mean(0), atol=1e-4)


def test_score_cache_is_resumable(tmp_path):
  path = tmp_path / "scores.jsonl"
  cache = scoring.ScoreCache(path)
  scorer = scoring.FakeScorer()
  out1 = scoring.score_features(scorer, ["Human: hi"] * 2, ["Hello!", "Go away."], cache=cache)
  with open(path, "a") as f:
    f.write('{"key": "torn')                 # an interrupted write
  cache2 = scoring.ScoreCache(path)
  assert len(cache2) == 2 and cache2.skipped_lines == 1

  class Boom(scoring.FakeScorer):
    def score(self, *a, **k):
      raise AssertionError("a cached reply was scored again")
  out2 = scoring.score_features(Boom(), ["Human: hi"] * 2, ["Hello!", "Go away."], cache=cache2)
  np.testing.assert_allclose(out1["scores"], out2["scores"], atol=1e-4)
  chex.assert_shape(out2["scores"], (2, 13))
  assert scoring.ScoreCache.key("m", "p") != scoring.ScoreCache.key("m2", "p")   # keyed by model and prompt
  parsed = scoring.score_features(scorer, ["Human: hi"] * 3, ["a", "b", "c"], mode="parse")
  assert parsed["scores"].shape == (3, 13) and parsed["embedding"] is None


@pytest.mark.slow
def test_smollm2_scorer_matches_choice_logprobs():
  from iclr24_jax import lm
  scorer = scoring.SmolLMScorer(batch_size=2)
  h, r = "Human: How do I make tea?", "Boil water, add a tea bag, wait three minutes."
  out = scorer.score([h], [r])
  for j in (0, 6):
    a, b = cpm.chat_parts(cpm.FEATURES[j], h, r, scorer.tokenizer, template=scorer.template)
    ref = lm.scoring.choice_logprobs(scorer.params, scorer.config, scorer.tokenizer, [a + b],
                                     [str(k) for k in range(1, 11)])[0]
    np.testing.assert_allclose(out["option_logprobs"][0, j, 1:], ref[1:], atol=2e-3)   # "2".."10"
    assert out["option_logprobs"][0, j, 0] <= ref[0] + 1e-4        # "1" alone <= "1" as a first token
  s = cpm.expected_score(out["option_logprobs"])
  assert np.all((s >= 1) & (s <= 10))
