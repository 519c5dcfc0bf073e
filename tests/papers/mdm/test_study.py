"""MDM's study (`papers/mdm/study.py`): the reproduction rule of `qualify`, the budget plan, the sample
curve's steps, the judged reproduction path on the tiny config (slow)."""
import os

import pytest


def test_qualify_applies_the_reproduction_rule():
  """Sample-quality verdicts between chance-level samples become 'inconclusive'; a standing 'no' names its
  references; samples that are digits keep their verdicts; applying it twice changes nothing."""
  from iclr24_jax.common import stats
  from iclr24_jax.papers.mdm import study

  def rows(acc_a, acc_b):
    return [
        stats.compare_row(paper="mdm", experiment="e", metric="held-out high-res eps-MSE", a=[0.08, 0.081, 0.079],
                          b=[0.06, 0.061, 0.059], name_a="p", name_b="s", direction="less", notes="n"),
        stats.compare_row(paper="mdm", experiment="e", metric="MNIST-CNN accuracy on samples of the digit",
                          a=acc_a, b=acc_b, name_a="p", name_b="s", direction="greater", notes=""),
        stats.compare_row(paper="mdm", experiment="e", metric="sliced W2 of CNN features", a=[1.3, 1.31, 1.29],
                          b=[1.2, 1.21, 1.19], name_a="p", name_b="s", direction="less", notes="")]

  noise = rows([0.06, 0.07, 0.065], [0.11, 0.12, 0.115])          # both arms below 2 / 10
  assert [r["holds"] for r in noise] == ["no", "no", "no"]
  q = study.qualify(noise, num_classes=10, budget_steps=150)
  assert [r["holds"] for r in q] == ["no", "inconclusive", "inconclusive"]
  assert q[0]["notes"].startswith("# 'no' at this budget only") and "150" in q[0]["notes"] and q[0]["notes"].endswith("n")
  assert "measured 'no'" in q[1]["notes"]
  assert study.qualify(q, num_classes=10, budget_steps=150) == q
  digits = rows([0.6, 0.7, 0.65], [0.81, 0.82, 0.815])             # real digits: the sample verdicts stand
  assert [r["holds"] for r in study.qualify(digits, num_classes=10, budget_steps=150)] == ["no", "no", "no"]
  # A claim measured 'inconclusive' is marked so at this budget; a sample row at chance also says why.
  level = [stats.compare_row(paper="mdm", experiment="e", metric=m, a=[0.06, 0.08, 0.07], b=[0.07, 0.06, 0.08],
                             name_a="p", name_b="s", direction=d, notes="n", kind="claim", basis="b")
           for m, d in (("held-out high-res eps-MSE", "less"), ("MNIST-CNN accuracy on samples of the digit", "greater"))]
  assert [r["holds"] for r in level] == ["inconclusive", "inconclusive"]
  q = study.qualify(level, num_classes=10, budget_steps=150, curve_note="curve. ")
  assert all(r["notes"].startswith("# inconclusive at this budget: ") and "150 high-res steps" in r["notes"]
             and "curve. n" in r["notes"] for r in q)
  assert "digits yet" in q[1]["notes"] and "digits yet" not in q[0]["notes"]
  assert study.qualify(q, num_classes=10, budget_steps=150) == q


def test_budget_plan_equal_high_res_steps():
  """The study's budget rule: every arm the same H high-res steps, the progressive arm's 8x8 pre-training on top
  (a fraction of the nested arm's FLOPs), each arm's equal-FLOPs step count as an extra evaluation point."""
  from iclr24_jax.papers.mdm import study
  flops = {"nested": 2.0, "single": 1.5, "inner": 0.5}
  plan = study.budget_plan(flops, high_res_steps=150, inner_fraction=0.2, checkpoints=3)
  assert plan["checkpoints"] == [50, 100, 150]                     # 150 (i + 1) / 3
  assert plan["inner_steps"] == 120                                # 0.2 * 150 * 2.0 / 0.5
  # equal FLOPs at the nested arm's 150 * 2.0 = 300: single 300 / 1.5 = 200; progressive 150 - 120 * 0.5 / 2.0 = 120
  assert plan["equal_flops"] == {"nested": 150, "single": 200, "progressive": 120}
  assert plan["eval_steps"] == {"single": [50, 100, 150, 200], "nested": [50, 100, 150],
                                "progressive": [50, 100, 120, 150]}
  # train FLOPs per seed at H: nested 150 * 2 = 300, single 150 * 1.5 = 225, progressive 300 + 120 * 0.5 = 360
  assert plan["train_flops"] == {"nested": 300.0, "single": 225.0, "progressive": 360.0}
  with pytest.raises(ValueError, match="inner_fraction"):
    study.budget_plan(flops, 150, 1.0, 3)
  with pytest.raises(ValueError, match="checkpoints"):
    study.budget_plan(flops, 2, 0.2, 3)
  # H = 3, fraction 0.9: 11 pre-training steps (0.9 * 3 * 4) cost 2.75 nested steps, leaving round(0.25) = 0
  with pytest.raises(ValueError, match="lower repro.inner_fraction"):
    study.budget_plan(flops, 3, 0.9, 1)


def test_sample_curve_needs_increasing_steps_past_the_study():
  from iclr24_jax.papers.mdm import study
  with pytest.raises(ValueError, match="increase past the 150 steps"):
    study.sample_curve(None, None, 150, None, {}, [100, 300], None, None, 10)
  with pytest.raises(ValueError, match="increase past"):
    study.sample_curve(None, None, 150, None, {}, [300, 300], None, None, 10)


@pytest.mark.slow   # ~3-4 min CPU: the judged path of study.reproduce_seeds (judge, curve, qualify) on the tiny digits
def test_reproduce_judged_path_on_tiny(tmp_path):
  """The full (non-fast) reproduction path, judge and sample curve included, on the tiny config: every claim row
  has its kind and basis, the curve row its points."""
  from iclr24_jax.configs import mdm as cfg_mod
  from iclr24_jax.papers.mdm import study
  cfg = cfg_mod.get_config("tiny")
  cfg.repro.curve_steps = (12, 14)   # past the single arm's equal-FLOPs point (8)
  rows = study.reproduce_seeds(str(tmp_path), fast=False, get_config=lambda arg: cfg)
  claims = [r for r in rows if r["kind"] == "claim"]
  assert len(claims) == 6 and all(r["basis"] and r["holds"] in ("yes", "no", "inconclusive") for r in claims)
  assert all(r["holds"] is None for r in rows if r["kind"] == "measurement")
  curve = [r for r in rows if "by training step" in r["experiment"]]
  assert len(curve) == 1 and curve[0]["ours"].startswith("12: acc") and "14: acc" in curve[0]["ours"]
  assert any(r["metric"].startswith("held-out high-res eps-MSE at equal train FLOPs") for r in rows)
  assert os.path.exists(os.path.join(tmp_path, "sample_curve.png"))
