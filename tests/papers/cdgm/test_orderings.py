"""C-DGM orderings (`papers/cdgm/orderings.py`): the correlation ordering."""
import numpy as np

from iclr24_jax.papers import cdgm


def test_correlation_ordering_ranks_the_worst_feature_last():
  rng = np.random.default_rng(0)
  z = rng.normal(size=(2000, 1))
  real = np.concatenate([z, z + 0.1 * rng.normal(size=(2000, 1)), rng.normal(size=(2000, 1))], 1)
  fake = real.copy()
  fake[:, 1] = rng.normal(size=2000)   # breaks corr(0, 1) and corr(1, 2): feature 1 has the largest score
  scores = cdgm.correlation_scores(real, fake)
  assert int(np.argmax(scores)) == 1
  c = cdgm.correlation_ordering(cdgm.parse_constraints("y_1 - y_0 >= 0"), real, fake)
  assert c.ordering[-1] == 1 and sorted(c.ordering) == [0, 1, 2]
  r = cdgm.random_ordering(cdgm.parse_constraints("ordering y_0 y_1 y_2\ny_1 - y_0 >= 0"), seed=3)
  assert sorted(r.ordering) == [0, 1, 2]
