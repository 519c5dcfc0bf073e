"""The annotator kit (`lm/annotate.py`): fake judges (positional, known preference), ChatML to
messages, the SmolLM2 judge's plumbing on a tiny model."""
import jax
import numpy as np
import pytest

from iclr24_jax import lm


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
