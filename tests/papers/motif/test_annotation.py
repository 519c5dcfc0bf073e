"""Motif annotation (`papers/motif/annotation.py`): parsing the official formats, the prompt, the resumable
cache, the log-probability and generating judges."""
import json

import numpy as np
import pytest

from iclr24_jax.papers import motif
from iclr24_jax.papers.motif import annotation


@pytest.mark.parametrize("text, expected", [
    ('Analysis ... Finally, ("best_description": 1)', 0),
    ('("best_description": 2)', 1),
    ('("best_description": None)', 2),
    ('{"best_description": none}', 2),
    ('BEST_DESCRIPTION: 2', 1),
    ('the best description is 1.', 0),          # one free word between the key and the answer (official regex)
    ('Best_Description":1 and later ("best_description": 2)', 0),  # the first answer counts
])
def test_parse_preference_official_formats(text, expected):
  assert motif.parse_preference(text) == expected


@pytest.mark.parametrize("text", ["", "I prefer the first one.", "1", '("best_description": 3)',
                                  '("best_message": 1)', "best_description", None, 12])
def test_parse_preference_malformed_is_none(text):
  assert motif.parse_preference(text) is None


def test_annotation_prompt_fields_and_errors():
  p = motif.annotation_prompt("You kill the newt!", "It's a wall.", "defaultgoal")
  assert '"description_1":\n"You kill the newt!"' in p and '"description_2":\n"It\'s a wall."' in p
  assert annotation.GOALS["defaultgoal"] in p and '("best_description": None)' in p
  assert "reach the treasure" in motif.annotation_prompt("a", "b", "reach the treasure")  # free-text task
  with pytest.raises(TypeError, match="str"):
    motif.annotation_prompt(b"bytes", "x")
  assert motif.label_from_margin(0.3, 0.1) == 0 and motif.label_from_margin(-0.3, 0.1) == 1
  assert motif.label_from_margin(0.05, 0.1) == 2
  with pytest.raises(ValueError, match="finite"):
    motif.label_from_margin(float("nan"), 0.1)


def test_annotation_cache_survives_interrupted_run(tmp_path):
  path = str(tmp_path / "ann.jsonl")
  values = {"a": 0.0, "b": 1.0, "c": 2.0, "d": 3.0, "e": 4.0}
  pairs = [("a", "b"), ("c", "a"), ("d", "e"), ("a", "a"), ("b", "e"), ("c", "d"), ("a", "b")]

  class Crashing(motif.OracleJudge):
    def __call__(self, ps, task):
      if self.calls >= 1:
        raise RuntimeError("killed")
      return super().__call__(ps, task)

  with pytest.raises(RuntimeError, match="killed"):
    motif.annotate_pairs(pairs, "task", Crashing(values.get), "fake", motif.AnnotationCache(path), chunk_size=2)
  with open(path, "a") as f:
    f.write('{"key": "cut mid-wri')                          # a line cut by the interruption
  first = motif.AnnotationCache(path)
  assert len(first) == 3                                      # the identical pair and the first chunk of two
  judge = motif.OracleJudge(values.get)
  seen = []
  orig = judge.__call__

  def counting(ps, task):
    seen.extend(ps)
    return orig(ps, task)

  resumed = motif.annotate_pairs(pairs, "task", counting, "fake", motif.AnnotationCache(path), chunk_size=2)
  assert sorted(seen) == sorted([("d", "e"), ("b", "e"), ("c", "d")])   # only the pairs not stored yet
  fresh = motif.annotate_pairs(pairs, "task", motif.OracleJudge(values.get), "fake", None)
  assert [r["label"] for r in resumed] == [r["label"] for r in fresh] == [1, 0, 1, 2, 1, 1, 1]
  assert [r["cached"] for r in resumed] == [True, True, False, True, False, False, True]


class _StubTok:
  def apply_chat_template(self, message, add_generation_prompt=True, system=None):
    return "<user>" + (message if isinstance(message, str) else json.dumps(message)) + "<assistant>"


def test_logprob_judge_debiases_presentation_order(monkeypatch):
  # A purely positional LM (always more likely to answer "1") gets margin 0 -> no preference with tau > 0;
  # an LM that follows the content gets the same sign in both orders.
  def positional(params, config, tok, prompts, options, batch_size, widths):
    return np.tile(np.log([[0.9, 0.1]]), (len(prompts), 1))

  monkeypatch.setattr(annotation, "_choice_logprobs", positional)
  judge = motif.LogprobJudge(None, None, _StubTok(), tau=0.05)
  res = judge([("You kill the newt!", "It's a wall."), ("x", "y")], "defaultgoal")
  np.testing.assert_allclose([r["margin"] for r in res], [0.0, 0.0], atol=1e-6)
  assert [r["label"] for r in res] == [2, 2]

  def content(params, config, tok, prompts, options, batch_size, widths):
    # log p("1") - log p("2") = +1 when description 1 is the kill message, else -1
    first_is_kill = ['"description_1":\n"You kill' in p for p in prompts]
    return np.array([[0.0, -1.0] if k else [-1.0, 0.0] for k in first_is_kill])

  monkeypatch.setattr(annotation, "_choice_logprobs", content)
  res = judge([("You kill the newt!", "It's a wall."), ("It's a wall.", "You kill the newt!")], "defaultgoal")
  np.testing.assert_allclose([r["margin"] for r in res], [1.0, -1.0], atol=1e-6)
  assert [r["label"] for r in res] == [0, 1]
  prompt = annotation.chat_prompts(_StubTok(), ["hello"])[0]
  assert prompt.endswith(motif.ANSWER_PREFIX)


def test_generate_judge_retries_once():
  answers = iter(["I am not sure.", "(\"best_description\": 2)", "no", "still nothing"])
  judge = motif.GenerateJudge(lambda prompts: [next(answers) for _ in prompts], _StubTok())
  res = judge([("a", "b"), ("c", "d")], "defaultgoal")
  assert [r["label"] for r in res] == [None, 1] or [r["label"] for r in res] == [1, None]
  assert any("[retry]" in r["text"] for r in res)
