"""LLMBar evaluator (`papers/llmbar/evaluator.py`): prompts per strategy, swap and synthesis, oracle judges,
ratings, the generation cache and resume, the log-probability mode."""
import re

import numpy as np
import pytest

from iclr24_jax.papers import llmbar
from iclr24_jax.papers.llmbar import evaluator
from iclr24_jax.papers.llmbar import scoring as scoring_lib
from .helpers import INST, _gen_eval, _inst


def _shown(prompt: str) -> tuple[str, str]:
  """The texts shown as Output (a) and Output (b) in a comparison prompt."""
  a = re.search(r"# Output \(a\):\n(.*?)\n\n# Output \(b\)", prompt, re.S).group(1)
  b = re.search(r"# Output \(b\):\n(.*?)\n\n#", prompt, re.S).group(1)
  return a, b


class OracleJudge:
  """Picks the output containing 'GOOD' in whatever order it is shown; rates it 9 (else 2)."""

  accepts_kind = True
  model_id = "oracle"

  def __init__(self):
    self.calls = []

  def __call__(self, prompts_, max_new_tokens, kind="direct"):
    self.calls.append((kind, len(prompts_)))
    out = []
    for p in prompts_:
      if kind == "rating":
        shown = re.search(r"# Output:\n(.*?)\n\n#", p, re.S).group(1)
        out.append("9" if "GOOD" in shown else "2")
      elif kind in ("metrics", "reference"):
        out.append(f"  {kind} text  ")
      else:
        a, _ = _shown(p)
        ab = "a" if "GOOD" in a else "b"
        out.append(f"Output ({ab})" if kind == "direct" else f"Reasons. Therefore, Output ({ab}) is better.")
    return out


AUX = {"metrics": "METRIC_QS", "reference": "REF_OUT"}
RULE = "Here are some rules of the evaluation:"


@pytest.mark.parametrize("name", sorted(llmbar.STRATEGIES))
@pytest.mark.parametrize("order", [0, 1])
def test_every_strategy_prompt_has_its_pieces_in_order(name, order):
  s = llmbar.STRATEGIES[name]
  p = llmbar.build_prompt(name, INST, order, AUX)
  assert p.startswith("<|im_start|>system\n") and p.endswith("<|im_end|>")
  assert p.count("<|im_start|>") == 2  # one system and one user turn
  assert "INSTR_X {output_2}" in p  # instance text is inserted literally (never re-formatted)
  assert (RULE in p) == (name not in ("vanilla", "rating_norules"))
  pieces = [RULE] if RULE in p else []
  pieces.append("# Instruction:\nINSTR_X")
  if s.kind == "rating":
    shown = "OUT_ONE" if order == 0 else "OUT_TWO"
    other = "OUT_TWO" if order == 0 else "OUT_ONE"
    assert other not in p
    pieces.append("# Output:\n" + shown)
  else:
    first, second = ("OUT_ONE", "OUT_TWO") if order == 0 else ("OUT_TWO", "OUT_ONE")
    pieces += ["# Output (a):\n" + first, "# Output (b):\n" + second]
  for aux_kind in s.aux:
    pieces.append({"metrics": "METRIC_QS", "reference": "REF_OUT"}[aux_kind])
  assert ("METRIC_QS" in p) == ("metrics" in s.aux) and ("REF_OUT" in p) == ("reference" in s.aux)
  pieces.append({"direct": "# Which is better, Output (a) or Output (b)?", "cot": "# Decision (",
                 "rating": "# Score of the Output"}[s.answer])
  positions = [p.index(x) for x in pieces]
  assert positions == sorted(positions), (name, pieces, positions)
  if s.answer == "cot":
    assert "After giving a brief explanation" in p


def test_build_prompt_errors_and_aux_prompts():
  with pytest.raises(ValueError, match="unknown strategy"):
    llmbar.build_prompt("gpt5", INST, 0)
  with pytest.raises(ValueError, match="missing \\['reference'\\]"):
    llmbar.build_prompt("rules_metrics_reference", INST, 0, {"metrics": "q"})
  with pytest.raises(ValueError, match="order"):
    llmbar.build_prompt("vanilla", INST, 2)
  with pytest.raises(ValueError, match="no synthesis stage"):
    llmbar.build_prompt("vanilla", INST, 0, stage="synthesize")
  assert llmbar.build_prompt("vanilla", INST, "swapped") == llmbar.build_prompt("vanilla", INST, 1)
  m = llmbar.build_aux_prompt("metrics", INST)
  assert "propose at most three concise questions" in m and "INSTR_X {output_2}" in m and "OUT_ONE" not in m
  r = llmbar.build_aux_prompt("reference", INST)
  assert r.endswith("<|im_start|>user\nINSTR_X {output_2}\n<|im_end|>")


def test_synthesis_explanations_relabel_to_the_shown_order():
  # Stage 1: original order said (a) = output_1 -> winner 1; swapped order said (a) = output_2 -> mapped back 2.
  comps = ("ORIG: Output (a) is better.", "SWAP: Output (a) is better.")
  # Synthesis in the original order: Assistant (a) argues for output_1 (shown as (a)) with the original-order
  # explanation as written; Assistant (b) argues for output_2 (now shown as (b)) with the swapped-order text,
  # relabelled (a) -> (b).
  assert llmbar.synthesis_explanations(comps, (1, 2), 0) == ("ORIG: Output (a) is better.",
                                                            "SWAP: Output (b) is better.")
  # Synthesis in the swapped order: output_2 is shown as (a), so Assistant (a) is the swapped-order text as written.
  assert llmbar.synthesis_explanations(comps, (1, 2), 1) == ("SWAP: Output (a) is better.",
                                                            "ORIG: Output (b) is better.")
  with pytest.raises(ValueError, match="conflicting"):
    llmbar.synthesis_explanations(comps, (1, 1), 0)
  p = llmbar.build_prompt("swap", INST, 1, {"completions": comps, "winners": (1, 2)}, stage="synthesize")
  assert _shown(p) == ("OUT_TWO", "OUT_ONE")
  i_a = p.index("who thinks Output (a) is better:\nSWAP: Output (a) is better.")
  i_b = p.index("who thinks Output (b) is better:\nORIG: Output (b) is better.")
  assert i_a < i_b < p.index("# Which is better")


class PositionalThenOracle(OracleJudge):
  """Always '(a)' in the CoT stage (so every instance conflicts), oracle in the synthesis stage."""

  def __call__(self, prompts_, max_new_tokens, kind="direct"):
    if kind == "cot" and "Debate between" not in prompts_[0]:
      self.calls.append(("stage1", len(prompts_)))
      return ["Looks fine. Therefore, Output (a) is better."] * len(prompts_)
    return super().__call__(prompts_, max_new_tokens, kind)


@pytest.mark.parametrize("name", ["swap", "swap_cot"])
def test_swap_and_synthesize_resolves_conflicts(name):
  insts = [_inst(1, 0), _inst(2, 1), _inst(1, 2)]
  judge = PositionalThenOracle()
  res = llmbar.evaluate(judge, insts, name)
  # Stage 1 alone would be the always-(a) judge (50% / 0%); the oracle synthesis fixes every conflict.
  assert all(r["stage1_winners"] == [1, 2] for r in res["records"])
  assert res["accuracy"] == 1.0 and res["agreement"] == 1.0
  assert judge.calls[0] == ("stage1", 6) and judge.calls[1] == ("direct" if name == "swap" else "cot", 6)


@pytest.mark.parametrize("name", sorted(llmbar.STRATEGIES))
def test_oracle_judge_is_perfect_for_every_strategy(name):
  insts = [_inst(1 + (i % 2), i) for i in range(6)]
  judge = OracleJudge()
  res = llmbar.evaluate(judge, insts, name)
  assert res["accuracy"] == 1.0 and res["agreement"] == 1.0 and res["failure_rate"] == 0.0
  # Labels alternate 1, 2 and the oracle picks the right one in both orders: (a) in 6 of the 12 judgements.
  assert res["position_a_rate"] == 0.5
  s = llmbar.STRATEGIES[name]
  assert [k for k, _ in judge.calls] == list(s.aux) + [s.answer]
  for rec in res["records"]:
    assert rec["aux"] == {k: f"{k} text" for k in s.aux}  # stripped


def test_evaluate_passes_aux_into_judging_prompts_and_budgets():
  seen = {}

  class Spy(OracleJudge):
    def __call__(self, prompts_, max_new_tokens, kind="direct"):
      seen.setdefault(kind, (list(prompts_), max_new_tokens))
      return super().__call__(prompts_, max_new_tokens, kind)

  llmbar.evaluate(Spy(), [_inst(1)], "rules_metrics_reference", max_new_tokens={"direct": 5})
  assert seen["metrics"][1] == 150 and seen["reference"][1] == 384 and seen["direct"][1] == 5  # official + override
  judged = seen["direct"][0]
  assert len(judged) == 2 and all("metrics text" in p and "reference text" in p for p in judged)


def test_rating_ties_and_failures():
  insts = [_inst(1, 0), _inst(2, 1)]
  tie = llmbar.ConstantJudge("5")
  # 'zero': a tie is 0 in both orders -> no order right, no agreement.
  r = _gen_eval(tie, insts, "rating")
  assert r["accuracy"] == 0.0 and r["agreement"] == 0.0
  # 'official': a tie counts as (2, 1): exactly one order right for either label -> 0.5, agreement 0.
  r = _gen_eval(tie, insts, "rating", rating_ties="official")
  assert r["accuracy"] == 0.5 and r["agreement"] == 0.0
  bad = llmbar.ConstantJudge("great!")
  assert _gen_eval(bad, insts, "rating")["failure_rate"] == 1.0
  assert _gen_eval(bad, insts, "rating", rating_ties="official")["accuracy"] == 0.5
  with pytest.raises(ValueError, match="rating_ties"):
    _gen_eval(tie, insts, "rating", rating_ties="coin")


def test_cache_key_and_file_roundtrip(tmp_path):
  k = llmbar.cache_key("m", "prompt", {"max_new_tokens": 5})
  assert k == llmbar.cache_key("m", "prompt", {"max_new_tokens": 5})
  assert len({k, llmbar.cache_key("m2", "prompt", {"max_new_tokens": 5}),
              llmbar.cache_key("m", "prompt!", {"max_new_tokens": 5}),
              llmbar.cache_key("m", "prompt", {"max_new_tokens": 6})}) == 4
  with pytest.raises(ValueError, match="model_id"):
    llmbar.cache_key("", "p")
  path = tmp_path / "c" / "gen.jsonl"
  c = llmbar.GenerationCache(path)
  c.put_many({"k1": "one", "k2": "two"})
  with open(path, "a") as f:
    f.write('{"key": "k3", "te')  # a torn line from an interrupted write
  c2 = llmbar.GenerationCache(path)
  assert len(c2) == 2 and c2.get("k1") == "one" and c2.get("k3") is None and c2.skipped_lines == 1


def test_evaluate_cache_reuse_and_resume(tmp_path):
  insts = [_inst(1 + (i % 2), i) for i in range(12)]
  cache = llmbar.GenerationCache(tmp_path / "gen.jsonl")
  j1 = llmbar.FakeJudge(seed=1)
  first = _gen_eval(j1, insts, "rules_metrics", cache=cache, chunk_size=5)
  assert sum(n for _, n, _ in j1.calls) == 12 + 24
  # A second run (fresh cache object from the file) makes no judge calls and gives the same winners.
  j2 = llmbar.FakeJudge(seed=1)
  again = _gen_eval(j2, insts, "rules_metrics", cache=llmbar.GenerationCache(tmp_path / "gen.jsonl"))
  assert j2.calls == []
  np.testing.assert_array_equal(first["winners_original"], again["winners_original"])

  # Resume: a judge that dies after its first chunk; the rerun only generates what is missing.
  class Dies(llmbar.FakeJudge):
    def __call__(self, prompts_, max_new_tokens, kind="direct"):
      if self.calls:
        raise KeyboardInterrupt
      return super().__call__(prompts_, max_new_tokens, kind)

  path = tmp_path / "resume.jsonl"
  with pytest.raises(KeyboardInterrupt):
    _gen_eval(Dies(seed=1), insts, "vanilla", cache=llmbar.GenerationCache(path), chunk_size=8)
  j3 = llmbar.FakeJudge(seed=1)
  resumed = _gen_eval(j3, insts, "vanilla", cache=llmbar.GenerationCache(path), chunk_size=8)
  assert sum(n for _, n, _ in j3.calls) == 24 - 8
  direct = _gen_eval(llmbar.FakeJudge(seed=1), insts, "vanilla")
  np.testing.assert_array_equal(resumed["winners_swapped"], direct["winners_swapped"])
  with pytest.raises(ValueError, match="model id"):
    llmbar.evaluate(lambda p, n: ["Output (a)"] * len(p), insts[:1], "vanilla", cache=cache)


class OracleScorer(OracleJudge):
  """Text like OracleJudge; option scores: +signal nats for the option naming the GOOD output, +bias nats for
  any option naming position (a) (a positional bias larger than the signal); ratings: signal * digit / 9 for a
  GOOD output, -signal * digit / 9 otherwise. Rows are log-normalised over the options."""

  def __init__(self, signal=2.0, bias=5.0):
    super().__init__()
    self.signal, self.bias = signal, bias
    self.scored = []

  def choice_logprobs(self, prompts_, options, batch_size=None, answer_prefixes=None):
    self.scored.append((len(prompts_), tuple(options), answer_prefixes is not None))
    rows = []
    for p in prompts_:
      if options[0] == "0":
        shown = re.search(r"# Output:\n(.*?)\n\n#", p, re.S).group(1)
        sign = 1.0 if "GOOD" in shown else -1.0
        rows.append([sign * self.signal * int(o) / 9 for o in options])
      else:
        a, b = _shown(p)
        rows.append([self.signal * ("GOOD" in (a if "(a)" in o else b)) + self.bias * ("(a)" in o) for o in options])
    rows = np.array(rows)
    return rows - np.logaddexp.reduce(rows, axis=1, keepdims=True)


@pytest.mark.parametrize("name", sorted(llmbar.STRATEGIES))
def test_logprob_mode_recovers_a_known_preference_under_positional_bias(name):
  """Every strategy in 'logprob' mode: a 5-nat bias toward (a) dominates every raw per-order pick (raw accuracy
  exactly 50%, (a) picked 100%), and the order-averaged log-odds recover the 2-nat preference exactly."""
  insts = [_inst(1 + (i % 2), i) for i in range(6)]
  judge = OracleScorer()
  res = llmbar.evaluate(judge, insts, name, judge_mode="logprob")
  assert res["judge_mode"] == "logprob" and res["accuracy"] == 1.0 and res["failure_rate"] == 0.0
  s = llmbar.STRATEGIES[name]
  gold_sign = np.where(res["labels"] == 1, 1.0, -1.0)
  if s.kind == "rating":  # E[score] = sum_d d p(d) with p proportional to exp(+-2 d / 9): symmetric, +-Delta
    probs = np.exp(2 * np.arange(10) / 9)
    e_good = float(probs @ np.arange(10) / probs.sum())
    np.testing.assert_allclose(res["preference"], gold_sign * (e_good - (9 - e_good)), atol=1e-9)
  else:
    np.testing.assert_allclose(res["preference"], gold_sign * 2.0, atol=1e-6)  # (m0 - m1) / 2 = (7 - 3) / 2
    np.testing.assert_allclose(res["margins"][:, 0], np.where(res["labels"] == 1, 7.0, 3.0), atol=1e-6)
    assert res["raw_accuracy"] == 0.5 and res["raw_agreement"] == 0.0 and res["position_a_rate"] == 1.0
    assert res["mean_position_bias"] == pytest.approx(5.0)
  kinds = [k for k, _ in judge.calls]
  assert kinds[:len(s.aux)] == list(s.aux)  # the auxiliary texts are still generated
  if s.answer == "cot":  # the explanation is generated, then the verdict scored after it
    assert "cot" in kinds and all(prefixed for _, _, prefixed in judge.scored[:1])


def test_logprob_mode_always_a_judge_is_a_tie_everywhere():
  """The always-"(a)" judge: debiased log-odds exactly 0 on every pair, so every judgement is a tie. A tie falls
  back to the raw per-order picks, "(a)" in both orders, which the official protocol scores as it scores the
  generated answers of the always-"(a)" judge (test_always_a_judge_is_exactly_half_and_never_agrees): each pair
  right in exactly one order, accuracy (N * 1) / (2N) = 0.5, agreement 0, first-position rate 100%.
  debiased_ties='zero' keeps the former rule: a tie is a failure in both orders (accuracy 0)."""
  insts = [_inst(1 + (i % 2), i) for i in range(8)]
  labels = np.array([inst.label for inst in insts])
  for judge in (llmbar.ConstantJudge("Output (a)"),
                llmbar.FakeJudge(preference=lambda p, o: 3.0 * o.endswith("(a)"), noise=0.0)):
    res = llmbar.evaluate(judge, insts, "vanilla", judge_mode="logprob")
    np.testing.assert_array_equal(res["preference"], 0.0)
    assert res["debiased_ties"] == 8 and res["failure_rate"] == 0.0
    np.testing.assert_array_equal(res["winners_original"], 1)
    np.testing.assert_array_equal(res["winners_swapped"], 2)
    assert res["accuracy"] == 0.5 and res["agreement"] == 0.0
    # the official per-pair credit: (correct original + correct swapped) / 2 = 1/2 for either label
    np.testing.assert_array_equal(
        scoring_lib.item_correctness(labels, res["winners_original"], res["winners_swapped"]), 0.5)
    assert res["raw_accuracy"] == 0.5 and res["raw_agreement"] == 0.0 and res["position_a_rate"] == 1.0
    zero = llmbar.evaluate(judge, insts, "vanilla", judge_mode="logprob", debiased_ties="zero")
    assert zero["failure_rate"] == 1.0 and zero["accuracy"] == 0.0 and zero["agreement"] == 0.0
    official = llmbar.evaluate(judge, insts, "vanilla", judge_mode="logprob", debiased_ties="zero",
                               count_failures_as_agreement=True)
    assert official["agreement"] == 1.0 and official["accuracy"] == 0.0
  # a tie threshold: preferences below tau are ties (here with no positional bias, so the raw picks are ties
  # too: failures), above it are picks
  near = OracleScorer(signal=1e-3, bias=0.0)
  assert llmbar.evaluate(near, insts, "vanilla", judge_mode="logprob", tie_tau=1e-2)["failure_rate"] == 1.0
  assert llmbar.evaluate(near, insts, "vanilla", judge_mode="logprob", tie_tau=1e-4)["accuracy"] == 1.0
  with pytest.raises(ValueError, match="debiased_ties"):
    llmbar.evaluate(near, insts, "vanilla", judge_mode="logprob", debiased_ties="coin")


def test_logprob_mode_mixed_tie_takes_the_raw_picks():
  # One tied pair among decided ones: margins m0 = +3 (original order picks (a) = output 1), m1 = +3 (swapped
  # order picks (a) = output 2): preference (3 - 3) / 2 = 0, a tie -> the raw picks (1, 2). With label 1 that pair
  # earns 0.5; the decided pairs (preference +-2 under a 5-nat bias) earn 1: accuracy (3 * 1 + 0.5) / 4 = 0.875.
  insts = [_inst(1, 0), _inst(2, 1), _inst(1, 2), _inst(1, 3)]
  scorer = OracleScorer()
  orig = scorer.choice_logprobs

  def choice_logprobs(prompts_, options, batch_size=None, answer_prefixes=None):
    out = orig(prompts_, options, batch_size, answer_prefixes)
    for j, p in enumerate(prompts_):
      if "Do task number 3." in p:                            # the tied pair: 3 nats toward (a) in both orders
        out[j] = np.array([3.0, 0.0]) - np.logaddexp(3.0, 0.0)
    return out

  scorer.choice_logprobs = choice_logprobs
  res = llmbar.evaluate(scorer, insts, "vanilla", judge_mode="logprob")
  assert res["debiased_ties"] == 1
  assert (res["winners_original"][3], res["winners_swapped"][3]) == (1, 2)
  assert res["accuracy"] == pytest.approx(0.875) and res["agreement"] == pytest.approx(0.75)


def test_logprob_mode_errors_and_auto():
  with pytest.raises(ValueError, match="choice_logprobs"):
    llmbar.evaluate(OracleJudge(), [_inst(1)], "vanilla", judge_mode="logprob")
  with pytest.raises(ValueError, match="judge_mode"):
    llmbar.evaluate(OracleJudge(), [_inst(1)], "vanilla", judge_mode="parse")
  assert llmbar.evaluate(OracleJudge(), [_inst(1)], "vanilla")["judge_mode"] == "generate"  # auto: cannot score
  assert llmbar.evaluate(OracleScorer(), [_inst(1)], "vanilla")["judge_mode"] == "logprob"  # auto: can


def test_cot_explanation_and_choice_cache(tmp_path):
  assert evaluator.cot_explanation("It is concise. Therefore, Output (b) is better.") == "It is concise."
  assert evaluator.cot_explanation("Output (a) is better.") == ""
  assert evaluator.cot_explanation("No verdict at all ") == "No verdict at all"
  insts = [_inst(1 + (i % 2), i) for i in range(5)]
  cache = llmbar.GenerationCache(tmp_path / "c.jsonl")
  first = llmbar.evaluate(OracleScorer(), insts, "cot", judge_mode="logprob", cache=cache)
  judge = OracleScorer()
  again = llmbar.evaluate(judge, insts, "cot", judge_mode="logprob",
                          cache=llmbar.GenerationCache(tmp_path / "c.jsonl"))
  assert judge.calls == [] and judge.scored == []  # explanations and scores both come from the cache
  np.testing.assert_array_equal(first["preference"], again["preference"])
