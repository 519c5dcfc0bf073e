"""CPM's features (`papers/cpm/features.py`): the score parser, the feature prompts, the expected score
by hand, splitting a dialogue."""
import numpy as np
import pytest

from iclr24_jax.papers import cpm


def test_parse_score():
  assert cpm.parse_score("7") == 7
  assert cpm.parse_score(" 10/10, very helpful") == 10
  assert cpm.parse_score("8.") == 8
  assert cpm.parse_score("The reply is good") is None     # official regex ^\d+ fails -> missing
  assert cpm.parse_score("") is None and cpm.parse_score(None) is None
  assert cpm.parse_score("0") is None and cpm.parse_score("85") is None   # outside 1..10 -> missing


def test_feature_prompts():
  assert len(cpm.FEATURES) == 13 and cpm.ALL_FEATURES[-1] == "length"
  p = cpm.feature_prompt("factuality", "Human: What is 2+2?", "It is 4.")
  assert "is factually correct" in p and "egregiously incorrect" in p and "fully correct" in p
  assert p.index("It is 4.") < p.index("is factually correct")   # the question comes after the reply
  assert p.endswith("Answer:")
  prefixes = {cpm.prompt_parts(f, "Human: hi", "Hello!")[0] for f in cpm.FEATURES}
  assert len(prefixes) == 1                                       # one shared prefix for all 13 questions
  a, b = cpm.chat_parts("intent", "Human: hi", "Hello!", template="short")
  assert a.startswith("<|im_start|>user\n") and b.endswith("<|im_start|>assistant\n")
  with pytest.raises(ValueError, match="unknown feature"):
    cpm.feature_prompt("length", "h", "r")
  np.testing.assert_allclose(cpm.length_feature(["a" * 250, ""]), [2.5, 0.0])


def test_expected_score():
  np.testing.assert_allclose(cpm.expected_score(np.zeros(10)), 5.5)
  peaked = np.full(10, -np.inf)
  peaked[6] = 0.0
  np.testing.assert_allclose(cpm.expected_score(peaked), 7.0)
  # p(3) = p(8) = 1/2 -> 5.5; normalisation does not matter.
  lp = np.full((2, 10), -50.0)
  lp[:, 2] = lp[:, 7] = -3.0
  np.testing.assert_allclose(cpm.expected_score(lp), [5.5, 5.5], atol=1e-9)
  with pytest.raises(ValueError, match="10"):
    cpm.expected_score(np.zeros(9))


def test_split_dialogue_and_messages():
  text = "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: how are you?\n\nAssistant: fine, thanks"
  h, r = cpm.split_dialogue(text)
  assert r == "fine, thanks" and h.endswith("how are you?")
  msgs = cpm.history_messages(h)
  assert [m["role"] for m in msgs] == ["user", "assistant", "user"] and msgs[1]["content"] == "hello"
