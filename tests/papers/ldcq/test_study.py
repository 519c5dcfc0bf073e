"""LDCQ study (`papers/ldcq/study.py`): the score rows by hand, with the random floor beside each claim."""
import math

import numpy as np


def test_score_rows_judge_each_step_with_the_random_floor_beside():
  """The maze rows: LDCQ vs BC, LDCQ vs VAE prior + Q (prior under Q), diffusion prior vs latent BC (prior alone),
  LDCQ vs diffusion prior (what Q adds) as claims with a quoted basis, LDCQ vs random as a check; no row mixes the
  prior's step with Q's (LDCQ vs latent BC), and every other row shows the random policy's mean +- se.
  Per-seed scores (3 seeds): random [1, 2, 3] -> mean 2, se = std([1, 2, 3], ddof=1) / sqrt(3) = 1 / 1.732 = 0.577;
  LDCQ - diffusion prior = [10, 10, 10] - [4, 5, 6] = [6, 5, 4]: mean 5, se 0.577, z = 8.7 -> 'yes'."""
  from iclr24_jax.common import stats
  from iclr24_jax.papers.ldcq import study
  per = {"ldcq": np.array([10.0, 10.0, 10.0]), "vae_q": np.array([9.0, 11.0, 10.0]),
         "latent_bc": np.array([3.0, 5.0, 4.0]), "diffusion_prior": np.array([4.0, 5.0, 6.0]),
         "bc": np.array([0.0, 1.0, 2.0]), "random": np.array([1.0, 2.0, 3.0])}
  rows = study.score_rows(per, "maze/x", "maze", "headline", "settings", "plot.png")
  by_name = {r["experiment"]: r for r in rows}
  assert list(by_name) == ["maze/x: LDCQ vs BC", "maze/x: LDCQ vs VAE prior + Q",
                           "maze/x: diffusion prior, no Q vs latent BC", "maze/x: LDCQ vs diffusion prior, no Q",
                           "maze/x: LDCQ vs random policy"]
  for r in rows:
    kind = stats.row_kind(r)
    assert kind == ("check" if "random" in r["experiment"] else "claim")
    assert r["basis"]
    if kind == "claim":
      assert r["ours"].endswith("; random policy 2+-0.58")
  q_row = by_name["maze/x: LDCQ vs diffusion prior, no Q"]
  np.testing.assert_allclose(q_row["judgement"]["diff"], 5.0, rtol=1e-6)
  np.testing.assert_allclose(q_row["judgement"]["se_diff"], 1 / math.sqrt(3), rtol=1e-6)
  assert q_row["holds"] == "yes" and q_row["basis"] == study.BASIS_Q
  # VAE + Q - LDCQ = [-1, 1, 0]: mean 0, se 0.577 -> inconclusive
  assert by_name["maze/x: LDCQ vs VAE prior + Q"]["holds"] == "inconclusive"
  # without a random arm the floor is left out, and a missing arm drops its rows
  rows = study.score_rows({k: per[k] for k in ("ldcq", "bc")}, "maze/x", "maze", "h", "s", "p")
  assert [r["experiment"] for r in rows] == ["maze/x: LDCQ vs BC"] and "random" not in rows[0]["ours"]
