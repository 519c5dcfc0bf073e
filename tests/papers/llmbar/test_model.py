"""LLMBar judges (`papers/llmbar/model.py`): ChatML messages, the fake judge, the official logit bias, the SmolLM2
judge's batching and log-probability margins."""
import numpy as np
import pytest

from iclr24_jax.papers import llmbar
from iclr24_jax.papers.llmbar import model
from .helpers import INST, _gen_eval, _inst


def test_chatml_to_messages():
  msgs = llmbar.chatml_to_messages(llmbar.build_prompt("vanilla", INST, 0))
  assert [m["role"] for m in msgs] == ["system", "user"]
  assert msgs[0]["content"].endswith("select the best output for the given instruction.")
  assert msgs[1]["content"].startswith("Select the Output (a)") and msgs[1]["content"].endswith('"Output (b)":')
  assert llmbar.chatml_to_messages("  plain text ") == [{"role": "user", "content": "plain text"}]


def test_fake_judge_is_deterministic_and_bad_judges_fail_clearly():
  insts = [_inst(1 + (i % 2), i) for i in range(10)]
  a = _gen_eval(llmbar.FakeJudge(seed=3), insts, "cot")
  b = _gen_eval(llmbar.FakeJudge(seed=3), insts, "cot")
  np.testing.assert_array_equal(a["winners_original"], b["winners_original"])
  np.testing.assert_array_equal(a["winners_swapped"], b["winners_swapped"])
  assert a["failure_rate"] == 0.0
  with pytest.raises(ValueError, match="list of 2 strings"):
    llmbar.evaluate(lambda p, n: ["Output (a)"], insts[:1], "vanilla")
  with pytest.raises(ValueError, match="at least one instance"):
    llmbar.evaluate(llmbar.FakeJudge(), [], "vanilla")


def test_logprob_margin_is_the_difference_of_lm_choice_logprobs(tiny_judge):
  from iclr24_jax import lm
  insts = [_inst(1, 0), _inst(2, 1), _inst(1, 2)]
  res = llmbar.evaluate(tiny_judge, insts, "vanilla", judge_mode="logprob")
  prompts = [tiny_judge.render(llmbar.build_prompt("vanilla", inst, o)) for o in (0, 1) for inst in insts]
  lp = lm.choice_logprobs(tiny_judge.params, tiny_judge.config, tiny_judge.tokenizer, prompts,
                          ["Output (a)", "Output (b)"], share_prefix=False)
  m = lp[:, 0] - lp[:, 1]
  np.testing.assert_allclose(res["margins"], np.stack([m[:3], m[3:]], 1), atol=1e-4)
  np.testing.assert_allclose(res["preference"], (m[:3] - m[3:]) / 2, atol=1e-4)


@pytest.fixture(scope="module")
def tiny_judge():
  """A random tiny Llama with SmolLM2's tokenizer: exercises SmolLMJudge's plumbing without the 135M model."""
  import jax
  from iclr24_jax import lm
  tok = lm.load_smollm2_tokenizer()
  cfg = lm.tiny_config(vocab_size=tok.vocab_size, max_seq_len=1024)
  params = lm.init_params(jax.random.key(0), cfg)
  return model.SmolLMJudge(params, cfg, tok, batch_size=4, widths=(256, 512, 1024), model_id="tiny-random")


def test_logit_bias_maps_official_words_onto_the_tokenizer(tiny_judge):
  tok = tiny_judge.tokenizer
  bias = llmbar.logit_bias_for(tok, "direct")
  favored = set(tok.encode("Output (a)")) | set(tok.encode("Output (b)"))
  assert {i for i, b in bias.items() if b == 7.0} == favored
  assert bias[tok.encode("Both")[0]] == -100.0 and bias[tok.encode(" Neither")[0]] == -100.0
  assert all(bias.get(i) != -100.0 for i in tok.encode("depends"))  # two tokens: skipped, as officially
  cot = llmbar.logit_bias_for(tok, "cot")
  assert set(cot.values()) == {-100.0}
  assert llmbar.logit_bias_for(tok, "metrics") is None


def test_smollm_judge_batches_in_order_and_applies_the_bias(tiny_judge):
  insts = [_inst(1 + (i % 2), i) for i in range(5)]
  insts[2] = llmbar.Instance("Write a long essay. " * 30, "x", "y", 1)  # a longer prompt: a second width
  ps = [llmbar.build_prompt("vanilla", inst, 0) for inst in insts]
  batched = tiny_judge(ps, 4, kind="direct")
  single = [tiny_judge([p], 4, kind="direct")[0] for p in ps]
  assert batched == single  # sorting, padding and dummy rows never change an answer or its position
  favored = set(tiny_judge.tokenizer.encode("Output (a)")) | set(tiny_judge.tokenizer.encode("Output (b)"))
  enc = [tiny_judge.tokenizer.encode(tiny_judge.render(p)) for p in ps]
  ids = tiny_judge.generate_ids(enc, 4, llmbar.logit_bias_for(tiny_judge.tokenizer, "direct"))
  assert all(set(x) <= favored for x in ids)  # +7 dominates a random model's small logits
  rendered = tiny_judge.render(ps[0])
  assert rendered.startswith("<|im_start|>system\nYou are a helpful assistant in evaluating")
  assert rendered.endswith('"Output (b)":<|im_end|>\n<|im_start|>assistant\n')
  m = tiny_judge.answer_margins(ps[:2])
  assert m.shape == (2,) and np.all(np.isfinite(m))


@pytest.mark.slow
def test_smollm2_judge_answers_in_format(shared_data):
  """SmolLM2-135M with the official bias answers 'Output (a)'/'Output (b)' (parseable) on real prompts."""
  judge = llmbar.SmolLMJudge()
  data = llmbar.load(shared_data / "llmbar", ["Natural"])["Natural"][:4]
  res = llmbar.evaluate(judge, data, "vanilla", max_new_tokens={"direct": 5})
  assert res["failure_rate"] == 0.0
