"""Scoring (`lm/scoring.py`): token log-probabilities against log-softmax, 1 vs 8 devices, the text
helpers; choice_logprobs / score_suffixes (one prefill, reused cache) against token log-probability
differences, one compile per bucket, debiased_preference by hand, SmolLM2 (embedded model)."""
import jax
import numpy as np
import pytest

from iclr24_jax import lm
from iclr24_jax.lm import corpus, llama, scoring
from iclr24_jax.lm import generation as gen_lib
from iclr24_jax.lm import tokenizer as tok_lib
from .helpers import CFG, _ids


def test_scoring_matches_log_softmax(params, fwd):
  ids = _ids(2, 8)
  mask = np.ones((2, 8), bool)
  mask[1, 5:] = False

  @jax.jit
  def score(p, i, m):
    return (scoring.token_logprobs(p, CFG, i, m), scoring.sequence_logprob(p, CFG, i, m),
            scoring.next_token_logprobs(p, CFG, i, m))

  lp, (s, n), nxt = jax.device_get(score(params, ids, mask))
  logits = np.asarray(fwd(params, ids, mask), np.float64)
  ref = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  for b in range(2):
    for t in range(1, 8):
      want = ref[b, t - 1, ids[b, t]] if mask[b, t] else 0.0
      np.testing.assert_allclose(lp[b, t], want, rtol=1e-5, atol=1e-5)
  assert np.all(lp[:, 0] == 0)
  np.testing.assert_allclose(s, lp.sum(1), rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(n, [7, 4])
  np.testing.assert_allclose(nxt[1], ref[1, 4], rtol=1e-5, atol=1e-5)  # row 1's last real token is t=4
  np.testing.assert_allclose(nxt[0], ref[0, 7], rtol=1e-5, atol=1e-5)


def test_scoring_one_vs_eight_devices(params):
  """The same batch sharded over 1 and 8 devices gives the same scores."""
  from iclr24_jax.common import sharding
  ids = _ids(8, 6)
  mask = np.ones((8, 6), bool)
  fn = jax.jit(lambda p, i, m: scoring.token_logprobs(p, CFG, i, m))
  outs = []
  for mesh in sharding.device_meshes((1, 8)):
    batch = sharding.shard_batch((ids, mask), mesh)
    outs.append(np.asarray(fn(sharding.replicate(params, mesh), *batch)))
  np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-6)


def test_text_helpers_with_trained_tokenizer():
  """score_continuations and Generator (batching, padding rows, bucketing) on a tiny model + trained BPE."""
  from iclr24_jax.lm import corpus, tokenizer as tok_lib
  tok = tok_lib.train_bpe(corpus.TRAIN_TEXTS, vocab_size=300)
  cfg = llama.tiny_config(vocab_size=tok.vocab_size)
  p = llama.init_params(jax.random.key(3), cfg)
  prompts, conts = ["Bees visit", "The moon", "A river"], [" flowers", " orbits the earth", " begins"]
  res = scoring.score_continuations(p, cfg, tok, prompts, conts, batch_size=2)
  np.testing.assert_array_equal(res["num_tokens"], [len(tok.encode(c)) for c in conts])
  np.testing.assert_allclose(res["mean_logprob"], res["sum_logprob"] / res["num_tokens"], rtol=1e-6)
  assert np.all(res["sum_logprob"] < 0)
  alone = scoring.score_continuations(p, cfg, tok, prompts[2:], conts[2:], batch_size=2)
  np.testing.assert_allclose(alone["sum_logprob"], res["sum_logprob"][2:], rtol=1e-5, atol=1e-5)
  ids, mask, tmask = scoring.encode_pairs(tok, prompts[:1], conts[:1])
  assert tmask.sum() == len(tok.encode(conts[0])) and not tmask[0, :len(tok.encode(prompts[0]))].any()
  gen = gen_lib.Generator(p, cfg, tok, chat=False, batch_size=2, stop_ids=())
  texts = gen(prompts, max_new_tokens=5)
  ids_out = gen.generate_ids(prompts, max_new_tokens=5)
  assert len(texts) == 3 and all(len(x) == 5 for x in ids_out)
  assert texts == [tok.decode(x) for x in ids_out]
  assert gen(prompts[:1], max_new_tokens=5)[0] == texts[0]  # batch composition does not change a row
  assert len(gen._compiled) == 1  # one program for all of these calls
  with pytest.raises(TypeError, match="list of prompts"):
    gen("one prompt")


@pytest.fixture(scope="module")
def tiny():
  tok = tok_lib.train_bpe(corpus.TRAIN_TEXTS, vocab_size=300)
  cfg = lm.tiny_config(vocab_size=tok.vocab_size)
  params = lm.init_params(jax.random.key(0), cfg)
  return params, cfg, tok


PROMPTS = ["The cat sat on", "Once upon a time there was a", "a", "Hello world, this is a longer prompt " * 3]
OPTIONS = [" the mat", " dog", " x y z w v u t"]  # 1 to many tokens each


def _reference(params, cfg, tok, prompts, options):
  """sum token_logprobs(prompt + option) - sum token_logprobs(prompt): every pair scored without a cache, in one
  jitted call on right-padded rows (padding never changes the scores at real tokens)."""
  rows = []
  for p in prompts:
    pi = tok.encode(p)
    rows.append(pi)
    rows += [pi + tok.encode(o, add_bos=False) for o in options]
  ids, mask = tok_lib.pad_sequences(rows, tok.pad_id, max_len=max(64, max(len(r) for r in rows)))
  lp = np.asarray(jax.jit(lm.token_logprobs, static_argnums=1)(params, cfg, ids, mask), np.float64).sum(1)
  lp = lp.reshape(len(prompts), len(options) + 1)
  return lp[:, 1:] - lp[:, :1]


def test_choice_logprobs_equals_token_logprobs_difference_tiny(tiny):
  params, cfg, tok = tiny
  assert max(len(tok.encode(o, add_bos=False)) for o in OPTIONS) > 4  # a multi-token option past one bucket
  lp = lm.choice_logprobs(params, cfg, tok, PROMPTS, OPTIONS, batch_size=3)
  assert lp.shape == (4, 3)
  np.testing.assert_allclose(lp, _reference(params, cfg, tok, PROMPTS, OPTIONS), atol=1e-4, rtol=0)
  # batching, sorting, dummy rows and padding never change a score or its position
  one = np.stack([lm.choice_logprobs(params, cfg, tok, [p], OPTIONS, batch_size=1)[0] for p in PROMPTS])
  np.testing.assert_allclose(lp, one, atol=1e-5, rtol=0)
  # fused parameters give the same numbers
  np.testing.assert_allclose(lm.choice_logprobs(lm.fuse_params(params), cfg, tok, PROMPTS, OPTIONS), lp, atol=1e-4)


def test_shared_prefix_is_prefilled_once_with_the_same_numbers(tiny):
  params, cfg, tok = tiny
  template = "System: you judge two outputs carefully and fairly. Read the instruction, then both outputs. "
  prompts = [template + "Instruction: say hi. Output: hi", template + "Instruction: count. Output: 1 2 3 4 5",
             template + "x"]
  enc = [tok.encode(p) for p in prompts]
  k = scoring.common_prefix_length(enc)
  assert k >= scoring.MIN_SHARED_PREFIX + scoring.PREFIX_MULTIPLE  # the shared path is taken (K rounded to 16)
  assert scoring.common_prefix_length([[1, 2, 3], [1, 2, 3]]) == 2  # always leaves one token per prompt
  shared = lm.choice_logprobs(params, cfg, tok, prompts, OPTIONS, batch_size=2)
  plain = lm.choice_logprobs(params, cfg, tok, prompts, OPTIONS, batch_size=2, share_prefix=False)
  np.testing.assert_allclose(shared, plain, atol=1e-4, rtol=0)
  np.testing.assert_allclose(shared, _reference(params, cfg, tok, prompts, OPTIONS), atol=1e-4, rtol=0)


def test_choice_logprobs_compiles_once_per_bucket(tiny):
  params, cfg, tok = tiny
  fn = scoring._jitted_choice_logprobs(cfg)
  lm.choice_logprobs(params, cfg, tok, ["one two three", "four five"], [" a", " b"], batch_size=2)
  n = fn._cache_size()
  # other prompts of other lengths in the same width bucket, other options in the same option bucket
  lm.choice_logprobs(params, cfg, tok, ["six seven eight nine", "ten"], [" c d", " e"], batch_size=2)
  assert fn._cache_size() == n


def test_score_suffixes_is_one_prompt_many_options(tiny):
  params, cfg, tok = tiny
  prefix = "User: how are you? Assistant: fine."
  suffixes = [" Is it polite? Yes", " Is it long? No", " Is it short? Yes"]
  s = lm.score_suffixes(params, cfg, tok, prefix, suffixes)
  assert s.shape == (3,)
  np.testing.assert_allclose(s, _reference(params, cfg, tok, [prefix], suffixes)[0], atol=1e-4, rtol=0)
  with pytest.raises(TypeError, match="one str"):
    lm.score_suffixes(params, cfg, tok, [prefix], suffixes)


def test_choice_logprobs_errors(tiny):
  params, cfg, tok = tiny
  with pytest.raises(TypeError, match="wrap it in a list"):
    lm.choice_logprobs(params, cfg, tok, "a prompt", [" a"])
  with pytest.raises(ValueError, match="at least one option"):
    lm.choice_logprobs(params, cfg, tok, ["a prompt"], [])
  with pytest.raises(ValueError, match="encodes to no tokens"):
    lm.choice_logprobs(params, cfg, tok, ["a prompt"], [""])
  with pytest.raises(ValueError, match="needs context"):
    lm.choice_logprobs(params, cfg, tok, [""], [" a"])
  with pytest.raises(ValueError, match="does not fit"):
    lm.choice_logprobs(params, cfg, tok, ["word " * 400], [" a"])  # max_seq_len 256
  assert lm.choice_logprobs(params, cfg, tok, [], [" a", " b"]).shape == (0, 2)


def test_debiased_preference_hand_values_and_positional_judge():
  # l_ab = -1 - (-3) = 2 ; l_ba = -0.5 - (-2) = 1.5 ; mean 1.75.  Second row: a judge that always says "(a)"
  # (the same log-probs whatever is shown) gets exactly 0.
  ab = np.array([[-1.0, -3.0], [-0.2, -4.0]])
  ba = np.array([[-2.0, -0.5], [-0.2, -4.0]])
  np.testing.assert_allclose(lm.debiased_preference(ab, ba), [1.75, 0.0], atol=1e-6)
  # invariance: a constant positional bonus c on option (a) in both orders cancels
  c = np.array([[3.0, 0.0]])
  np.testing.assert_allclose(lm.debiased_preference(ab + c, ba + c), lm.debiased_preference(ab, ba), atol=1e-6)
  with pytest.raises(ValueError, match=r"\[N, 2\]"):
    lm.debiased_preference(np.zeros((3, 3)), np.zeros((3, 3)))
  with pytest.raises(ValueError, match=r"\[N, 2\]"):
    lm.debiased_preference(np.zeros((3, 2)), np.zeros((2, 2)))


@pytest.fixture(scope="module")
def smollm2():
  try:
    lm.find_smollm2_gguf()
  except Exception as e:  # noqa: BLE001
    pytest.skip(f"SmolLM2 GGUF not installed: {e}")
  return lm.load_smollm2()


def test_choice_logprobs_equals_token_logprobs_difference_smollm2(smollm2):
  params, cfg, tok = smollm2
  prompts = [lm.chat_prompt(tok, "What is the capital of France?"), "The quick brown fox jumps over the lazy"]
  options = [" The capital of France is Paris.", " dog", "Output (a)"]
  lp = lm.choice_logprobs(lm.fuse_params(params), cfg, tok, prompts, options)
  np.testing.assert_allclose(lp, _reference(params, cfg, tok, prompts, options), atol=1e-4, rtol=0)
  assert lp[1, 1] > lp[1, 2]  # "lazy dog" is the likely continuation
