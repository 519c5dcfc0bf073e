"""CPM's study (`papers/cpm/study.py`): the paired bootstrap row by hand."""
import numpy as np


def test_paired_bootstrap_row_by_hand():
  from iclr24_jax.common import stats
  from iclr24_jax.papers.cpm import study
  kw = dict(experiment="e", metric="m", name_a="A", name_b="B", unit="pairs", paper_value="-", basis="'x' (abstract)")
  # A right on all 20 items, B wrong on all: every resample's difference is exactly 1.
  row = study.paired_bootstrap_row(a=np.ones(20), b=np.zeros(20), kind="claim", **kw)
  assert row["holds"] == "yes" and row["judgement"]["lo"] == row["judgement"]["hi"] == 1.0
  assert stats.row_kind(row) == "claim"
  # Equal arms: every difference is 0 -> the interval [0, 0] contains 0 -> inconclusive.
  x = np.random.default_rng(0).integers(0, 2, 30).astype(float)
  assert study.paired_bootstrap_row(a=x, b=x, kind="claim", **kw)["holds"] == "inconclusive"
  # The verdict is stats.bootstrap_diff's; the per-seed numbers only go to the notes: diffs 0.1, 0, 0.05 ->
  # mean 0.05, sd 0.05, SE 0.05 / sqrt(3) = 0.0289 < 0.05 / 2 -> 'inconclusive' by 2 SE.
  y = np.random.default_rng(1).integers(0, 2, 30).astype(float)
  row = study.paired_bootstrap_row(a=x, b=y, kind="claim", a_by_seed=[0.6, 0.5, 0.55], b_by_seed=[0.5, 0.5, 0.5],
                                   **kw)
  ref = stats.bootstrap_diff(x, y, paired=True, direction="greater")
  assert row["holds"] == ref["holds"] and row["judgement"]["lo"] == ref["lo"] and row["judgement"]["hi"] == ref["hi"]
  np.testing.assert_allclose(row["judgement_seeds"]["se_diff"], 0.05 / np.sqrt(3), rtol=1e-12)
  assert row["judgement_seeds"]["holds"] == "inconclusive" and "inconclusive by 2 SE" in row["notes"]
  m = study.paired_bootstrap_row(a=np.ones(20), b=np.zeros(20), kind="measurement", **kw)
  assert m["holds"] is None and stats.row_kind(m) == "measurement"
