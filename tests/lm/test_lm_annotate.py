"""The annotator kit: choice_logprobs / score_suffixes (one prefill, reused cache), debiased_preference, judges,
the resumable cache."""

import jax
import numpy as np
import pytest

from iclr24_jax import lm
from iclr24_jax.lm import corpus, scoring
from iclr24_jax.lm import tokenizer as tok_lib


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


def _pair_prompts(pairs, order):
  return [f"Which is better? (a) {x if order == 0 else y} (b) {y if order == 0 else x}" for x, y in pairs]


def test_fake_judges_positional_and_known_preference():
  pairs = [(f"good{i}", f"bad{i}") for i in range(20)]
  options = ["Output (a)", "Output (b)"]
  # The always-"(a)" judges: debiased log-odds exactly 0.
  for judge in (lm.ConstantJudge("Output (a)"),
                lm.FakeJudge(preference=lambda p, o: 3.0 * o.endswith("(a)"), noise=0.0)):
    lp_ab, lp_ba = (judge.choice_logprobs(_pair_prompts(pairs, o), options) for o in (0, 1))
    assert np.all(lp_ab[:, 0] > lp_ab[:, 1]) and np.all(lp_ba[:, 0] > lp_ba[:, 1])
    np.testing.assert_array_equal(np.asarray(lm.debiased_preference(lp_ab, lp_ba)), 0.0)

  # A judge that prefers the 'good' output by 1 nat and option (a) by 3 nats: the bias cancels, 1.0 remains.
  def prefers_good(prompt, option):
    shown = prompt.split("(a) ")[1].split(" (b) ")
    named = shown[0] if option.endswith("(a)") else shown[1]
    return 1.0 * named.startswith("good") + 3.0 * option.endswith("(a)")
  judge = lm.FakeJudge(preference=prefers_good, noise=0.0)
  lp_ab, lp_ba = (judge.choice_logprobs(_pair_prompts(pairs, o), options) for o in (0, 1))
  np.testing.assert_allclose(lm.debiased_preference(lp_ab, lp_ba), 1.0, atol=1e-6)
  # With noise the preference is still recovered on average and the judge is deterministic.
  noisy = lm.FakeJudge(seed=3, preference=prefers_good, noise=0.5)
  a = noisy.choice_logprobs(_pair_prompts(pairs, 0), options)
  np.testing.assert_array_equal(a, lm.FakeJudge(seed=3, preference=prefers_good, noise=0.5).choice_logprobs(
      _pair_prompts(pairs, 0), options))
  np.testing.assert_allclose(np.logaddexp(a[:, 0], a[:, 1]), 0.0, atol=1e-12)  # rows normalised over options
  d = np.asarray(lm.debiased_preference(a, noisy.choice_logprobs(_pair_prompts(pairs, 1), options)))
  assert np.all(d > 0)  # noise 0.5 per score: the 1-nat preference wins on every one of these 20 pairs
  assert lm.FakeJudge(seed=1, choices=["x", "y"])(["p1", "p2"], 5) == lm.FakeJudge(seed=1, choices=["x", "y"])(
      ["p1", "p2"], 5)
  with pytest.raises(TypeError, match="wrap it in a list"):
    lm.FakeJudge()("one prompt", 5)


def test_cache_roundtrip_values_torn_line_and_key(tmp_path):
  path = tmp_path / "sub" / "c.jsonl"
  c = lm.GenerationCache(path)
  k1 = lm.cache_key("m", "p", {"max_new_tokens": 5})
  assert k1 != lm.cache_key("m", "p", {"max_new_tokens": 6}) != lm.cache_key("m2", "p", {"max_new_tokens": 5})
  assert k1 == lm.cache_key("m", "p", {"max_new_tokens": 5})
  c.put(k1, "hello")
  c.put_many({"k2": [-1.5, -0.25]}, meta={"kind": "choice"})
  with open(path, "a") as f:
    f.write('{"key": "torn", "te')  # an interrupted write
  again = lm.GenerationCache(path)
  assert again.get(k1) == "hello" and again.get("k2") == [-1.5, -0.25] and again.skipped_lines == 1
  assert again.get("torn") is None and (again.hits, again.misses) == (2, 1)
  with pytest.raises(TypeError, match="str or a list of floats"):
    c.put("k3", {"a": 1})
  with pytest.raises(ValueError, match="finite"):
    c.put("k4", [float("nan")])
  with pytest.raises(ValueError, match="model_id"):
    lm.cache_key("", "p")


def test_cached_map_dedupes_resumes_and_keeps_order(tmp_path):
  calls = []
  def fn(prompts):
    calls.append(list(prompts))
    return [[float(len(p)), -1.0] for p in prompts]
  prompts = ["ccc", "a", "bb", "a", "dddd"]
  cache = lm.GenerationCache(tmp_path / "c.jsonl")
  out = lm.cached_map(fn, prompts, cache, model_id="m", settings={"o": 2}, chunk_size=2)
  assert out == [[3.0, -1.0], [1.0, -1.0], [2.0, -1.0], [1.0, -1.0], [4.0, -1.0]]
  assert calls == [["a", "bb"], ["ccc", "dddd"]]  # unique prompts, shortest first, in chunks
  calls.clear()
  resumed = lm.GenerationCache(tmp_path / "c.jsonl")
  assert lm.cached_map(fn, prompts + ["eeeee"], resumed, model_id="m", settings={"o": 2}) == out + [[5.0, -1.0]]
  assert calls == [["eeeee"]] and resumed.hits == 4
  with pytest.raises(ValueError, match="model id"):
    lm.cached_map(fn, prompts, cache)
  with pytest.raises(ValueError, match="one value per prompt"):
    lm.cached_map(lambda ps: ["x"], ["p", "q"])


def test_chatml_to_messages():
  p = "<|im_start|>system\nBe fair.\n<|im_end|>\n<|im_start|>user\n Which? \n<|im_end|>"
  assert lm.chatml_to_messages(p) == [{"role": "system", "content": "Be fair."},
                                       {"role": "user", "content": "Which?"}]
  assert lm.chatml_to_messages(" plain ") == [{"role": "user", "content": "plain"}]


def test_smollm_judge_plumbing_on_a_tiny_model():
  tok = lm.load_smollm2_tokenizer()
  cfg = lm.tiny_config(vocab_size=tok.vocab_size, max_seq_len=512)
  params = lm.init_params(jax.random.key(1), cfg)
  judge = lm.SmolLMJudge(params, cfg, tok, batch_size=2, widths=(64, 128, 256), model_id="tiny",
                         logit_bias={"direct": {tok.encode("a")[0]: 50.0}})
  prompts = ["<|im_start|>system\nJudge.<|im_end|>\n<|im_start|>user\nPick (a) or (b).<|im_end|>",
             "<|im_start|>user\nAnother, longer question about two outputs?<|im_end|>", "Plain text prompt."]
  lp = judge.choice_logprobs(prompts, ["Output (a)", "Output (b)"])
  ref = lm.choice_logprobs(lm.fuse_params(params), cfg, tok, [judge.render(p) for p in prompts],
                           ["Output (a)", "Output (b)"])
  np.testing.assert_allclose(lp, ref, atol=1e-6)
  np.testing.assert_allclose(judge.answer_margins(prompts), lp[:, 0] - lp[:, 1], atol=1e-6)
  assert judge.render(prompts[0]).endswith("<|im_start|>assistant\n")
  # generation: the biased kind answers the biased token; order of answers = order of prompts
  out = judge(prompts, 3, kind="direct")
  assert out == ["aaa"] * 3
  assert judge.decoding_settings("direct")["logit_bias"] is not None and judge.decoding_settings("x")["logit_bias"] is None


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
