"""LLMBar parsing (`papers/llmbar/parsing.py`): answers and ratings, well formed or not, mapping a swapped pick
back."""
import pytest

from iclr24_jax.papers import llmbar


@pytest.mark.parametrize("text,expected", [
    ("Output (a)", 1), ("Output (b)", 2), ("  Output (b)\n", 2), (" Output (a) is better", 1),
    ("Sure.\nOutput (b)", 2), ("Sure.\n Output (a)", 1),
    ("Output (a)\nOutput (b)", 1),  # both present: label 1's pattern is tried first (official order)
])
def test_parse_answer_well_formed(text, expected):
  assert llmbar.parse_answer(text) == expected


@pytest.mark.parametrize("text", [
    "", "output (a)", "Output(a)", "Output (c)", "The better one is Output (a)", "Both are good.", "(a)",
    "  - Output (b)", "Output  (a)",
])
def test_parse_answer_malformed(text):
  assert llmbar.parse_answer(text) is None


def test_parse_answer_cot():
  assert llmbar.parse_answer("Output (a) misses a point. Therefore, Output (b) is better.", "cot") == 2
  assert llmbar.parse_answer("Therefore, Output (a) is better.", "cot") == 1
  assert llmbar.parse_answer("Output (a)", "cot") is None  # a bare direct answer is not a CoT conclusion
  assert llmbar.parse_answer("Therefore, Output (a) is better", "cot") is None  # the regex needs a character after
  with pytest.raises(ValueError, match="mode"):
    llmbar.parse_answer("Output (a)", "json")
  with pytest.raises(TypeError):
    llmbar.parse_answer(None)


@pytest.mark.parametrize("text,strict,expected", [
    ("7", True, 7), (" 8\n", True, 8), ("10", True, 10), ("0", True, 0), ("Score: 7", True, None),
    ("Score: 7", False, 7), ("7/9", False, 7), ("seven", False, None), ("", True, None), ("7.5", True, None),
])
def test_parse_rating(text, strict, expected):
  assert llmbar.parse_rating(text, strict) == expected


def test_map_back_and_relabel():
  assert [llmbar.map_back(w, 0) for w in (1, 2, None, 0)] == [1, 2, 0, 0]
  assert [llmbar.map_back(w, 1) for w in (1, 2, None, 0)] == [2, 1, 0, 0]
  text = "Output (a) is better than output (b); Output (a) wins. (a) alone stays."
  swapped = llmbar.swap_output_labels(text)
  assert swapped == "Output (b) is better than output (a); Output (b) wins. (a) alone stays."
  assert llmbar.swap_output_labels(swapped) == text
