"""Uni-O4 study (`papers/unio4/study.py`): the OPE rank correlation and the accepted margins by hand."""
import numpy as np
import pytest


def test_study_rank_correlation_and_accepted_margins():
  from iclr24_jax.papers.unio4 import study
  # OPE and returns in the same order at both checkpoints -> rho = 1; reversed -> -1. Step 0 counted once.
  run = {"history": [{"step": 0, "ope": [1.0, 2.0], "ope_best": [1.0, 2.0], "accepted": []},
                     {"step": 10, "ope": [3.0, 0.5], "ope_best": [3.0, 2.0], "accepted": [1, 0]}],
         "env_returns": [(0, np.array([10.0, 20.0])), (10, np.array([30.0, 5.0]))]}
  assert study.ope_rank_correlation([run, run]) == pytest.approx(1.0)
  rev = {**run, "env_returns": [(0, np.array([20.0, 10.0])), (10, np.array([5.0, 30.0]))]}
  assert study.ope_rank_correlation([rev]) == pytest.approx(-1.0)
  # member 0 accepted at step 10 with 3.0 over its previous best 1.0 -> margin 2.0
  assert study.accepted_margins(run) == [2.0]
