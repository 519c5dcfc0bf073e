"""The shared claim-judging helper: known differences in standard errors give yes / inconclusive / no."""
import numpy as np
import pytest

from iclr24_jax.common import stats


def _paired_with_diff_in_se(k: float, n: int = 5):
  """b = a - d with per-seed differences of mean k * SE exactly (SE = std(diff)/sqrt(n))."""
  rng = np.random.default_rng(0)
  a = rng.normal(0.7, 0.05, size=n)
  noise = rng.normal(size=n)
  noise = (noise - noise.mean()) / noise.std(ddof=1)  # mean 0, std 1 => SE of the mean 1/sqrt(n)
  d = k / np.sqrt(n) + noise  # mean k/sqrt(n) = k SE
  return a, a - d


@pytest.mark.parametrize("k, expected", [(3.0, "yes"), (1.0, "inconclusive"), (-3.0, "no"), (2.5, "yes"),
                                         (-1.5, "inconclusive")])
def test_judge_paired_known_se(k, expected):
  a, b = _paired_with_diff_in_se(k)
  res = stats.judge(a, b, paired=True, direction="greater")
  np.testing.assert_allclose(res["diff"] / res["se_diff"], k, rtol=1e-9)
  assert res["holds"] == expected


def test_judge_direction_less_flips():
  a, b = _paired_with_diff_in_se(3.0)
  assert stats.judge(a, b, direction="less")["holds"] == "no"
  assert stats.judge(b, a, direction="less")["holds"] == "yes"


def test_mean_se_hand_computed():
  # values 1, 2, 3: mean 2, std (ddof 1) = 1, SE = 1/sqrt(3) = 0.57735
  m, se = stats.mean_se([1.0, 2.0, 3.0])
  assert m == 2.0
  np.testing.assert_allclose(se, 1 / np.sqrt(3), rtol=1e-12)


def test_unpaired_se_combines_arms():
  # a: mean 2 SE 1/sqrt(3); b: mean 0 SE 1/sqrt(3); combined SE sqrt(2/3) = 0.8165, diff 2 = 2.449 SE -> yes
  res = stats.judge([1.0, 2.0, 3.0], [-1.0, 0.0, 1.0], paired=False)
  np.testing.assert_allclose(res["se_diff"], np.sqrt(2 / 3), rtol=1e-12)
  assert res["holds"] == "yes"


def test_single_seed_is_never_a_verdict():
  assert stats.judge([0.9], [0.1])["holds"] == "inconclusive"


def test_bad_input_named():
  with pytest.raises(ValueError, match="NaN"):
    stats.judge([1.0, np.nan, 2.0], [0.0, 0.0, 0.0])
  with pytest.raises(ValueError, match="one value per seed"):
    stats.judge([1.0, 2.0, 3.0], [1.0, 2.0])
  with pytest.raises(ValueError, match="direction"):
    stats.judge([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], direction="up")


def test_bootstrap_ci_covers_mean_and_diff_verdicts():
  rng = np.random.default_rng(0)
  x = rng.binomial(1, 0.6, size=400).astype(float)
  lo, hi = stats.bootstrap_ci(x)
  # the normal-approximation 95% interval half-width is 1.96 sqrt(p(1-p)/n) ~ 0.048
  assert lo < x.mean() < hi
  np.testing.assert_allclose(hi - lo, 2 * 1.96 * np.sqrt(x.mean() * (1 - x.mean()) / x.size), rtol=0.15)
  better = np.clip(x + rng.binomial(1, 0.3, size=400), 0, 1)
  assert stats.bootstrap_diff(better, x)["holds"] == "yes"
  assert stats.bootstrap_diff(x, better)["holds"] == "no"
  assert stats.bootstrap_diff(x, x[rng.permutation(400)], paired=False)["holds"] == "inconclusive"


def test_compare_row_and_normalise():
  row = stats.compare_row(paper="p", experiment="e", metric="acc", a=[0.8, 0.82, 0.81], b=[0.7, 0.71, 0.69],
                          name_a="ours", name_b="base", paper_value="ours > base")
  assert row["holds"] == "yes" and "ours 0.81" in row["ours"] and "3 seeds, paired" in row["ours"]
  fixed = stats.compare_row(paper="p", experiment="e", metric="acc", a=[1.0, 0.98, 1.0], b=0.13, name_a="ours",
                            name_b="frozen", paired=False)
  assert fixed["holds"] == "yes" and "3 seeds, vs a fixed value" in fixed["ours"]
  assert stats.normalise_holds(True) == "yes" and stats.normalise_holds("No") == "no"
  assert stats.normalise_holds("-") is None and stats.normalise_holds("inconclusive") == "inconclusive"


def test_miniature_rows_count_no_verdict_twice():
  rows = [dict(kind="claim", holds="inconclusive", basis="'x' (abstract)", notes="n1"),
          dict(kind="check", holds="yes", notes=""),
          dict(kind="measurement", holds=None, notes="m"),
          stats.not_run_row(paper="p", basis="'y' (abstract)", reason="data", variant="paper")]
  out = stats.miniature_rows(rows, "1 seed", "results/rows/p_seeds.json")
  assert [(r["kind"], r["holds"]) for r in out] == [("measurement", None), ("measurement", None),
                                                    ("measurement", None), ("claim", stats.NOT_RUN)]
  assert out[0]["notes"] == ("Miniature of the main job (1 seed): results/rows/p_seeds.json. As a claim at this "
                             "budget: inconclusive (not counted; the seeded study's row is). n1")
  assert all(stats.row_kind(r) for r in out) and rows[0]["kind"] == "claim"   # the input is not changed
