"""Variable orderings for the reduction: given (from the file), random, and the paper's correlation heuristic.

The ordering decides which variables absorb the corrections: the first variable is clipped only by constraints
over itself, the last one by everything that remains. The official code ranks features by a score computed on
the samples of the *unconstrained* model and sorts them in ascending order (`feature_ordering.py`,
`--order=ascending`), so the features the model gets most wrong come last and are the ones corrected.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from iclr24_jax.papers.cdgm.constraints import Constraints


def random_ordering(constraints: Constraints, seed: int = 0) -> Constraints:
  """The constraints with their ordering shuffled (official `set_random_ordering`, seeded).

  Args:
    constraints: the constraints.
    seed: numpy seed.

  Returns:
    A new `Constraints`.
  """
  order = list(constraints.ordering)
  np.random.default_rng(seed).shuffle(order)
  return constraints.with_ordering(order)


def correlation_scores(real: np.ndarray, synthetic: np.ndarray) -> np.ndarray:
  """Per-feature score: mean over j of |corr_real[i, j] - corr_synthetic[i, j]| (official `get_corr_ordering`).

  Entries where the real correlation is undefined (constant real columns) count as 0; where only the synthetic
  one is undefined the score uses |corr_real|.

  Args:
    real: [N, D] real rows.
    synthetic: [M, D] rows from an (unconstrained) generator.

  Returns:
    [D] scores (NaN for a feature whose whole row is undefined).
  """
  real = np.asarray(real, np.float64)
  synthetic = np.asarray(synthetic, np.float64)
  if real.ndim != 2 or synthetic.ndim != 2 or real.shape[1] != synthetic.shape[1]:
    raise ValueError(f"real {real.shape} and synthetic {synthetic.shape} must be [N, D] with the same D.")
  with np.errstate(invalid="ignore", divide="ignore"):
    cr = np.corrcoef(real, rowvar=False)
    cg = np.corrcoef(synthetic, rowvar=False)
  cr = np.atleast_2d(cr)
  cg = np.atleast_2d(cg)
  real_nan = np.isnan(cr)
  cr = np.where(real_nan, 0.0, cr)
  cg = np.where(real_nan, 0.0, cg)
  diff = np.abs(cr - cg)
  scores = np.empty(diff.shape[0])
  for i in range(diff.shape[0]):
    row = diff[i].copy()
    nan = np.isnan(row)
    if nan.all():
      scores[i] = np.nan
      continue
    row[nan] = np.abs(cr[i][nan])
    scores[i] = row.mean()
  return scores


def ordering_from_scores(scores: Sequence[float], ascending: bool = True) -> tuple[int, ...]:
  """Feature indices sorted by score (NaN last, like `np.argsort`)."""
  ranked = np.argsort(np.asarray(scores, np.float64), kind="stable")
  if not ascending:
    ranked = ranked[::-1]
  return tuple(int(i) for i in ranked)


def correlation_ordering(constraints: Constraints, real: np.ndarray, synthetic: np.ndarray | Sequence[np.ndarray],
                         ascending: bool = True) -> Constraints:
  """The constraints re-ordered by the correlation heuristic.

  Args:
    constraints: the constraints (their own ordering is replaced).
    real: [N, D] real rows (D covers every constrained variable).
    synthetic: [M, D] samples of the unconstrained model, or a list of such sample sets (scores are averaged
      over them, as the official code averages over sampling rounds).
    ascending: the official default (features whose correlations are reproduced best are corrected first).

  Returns:
    A new `Constraints` whose ordering lists all D features (unconstrained ones are ignored by the layer).
  """
  sets = [synthetic] if isinstance(synthetic, np.ndarray) else list(synthetic)
  scores = np.mean([correlation_scores(real, s) for s in sets], axis=0)
  order = ordering_from_scores(scores, ascending)
  missing = [v for v in constraints.ordering if v not in order]
  return constraints.with_ordering(tuple(order) + tuple(missing))
