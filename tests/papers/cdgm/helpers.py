"""Constraint systems and helpers shared by the C-DGM test modules."""
import numpy as np

from iclr24_jax.papers.cdgm import transform as tfm


CHAIN = """ordering y_0 y_1 y_2
y_1 - y_0 >= 0
y_2 - y_1 >= 0
- y_2 >= -10
"""


FOUR = """ordering y_0 y_1 y_2 y_3
y_3 - 2y_1 >= 0
- y_3 + y_2 >= -4
y_1 + y_0 > 1
- y_2 >= -3
"""


def _manual_transform():
  # One continuous column with components (mean 3, std 0.5) and (mean -2, std 1); one discrete column {0, 1}.
  return tfm.TableTransform(num_features=2, cont_idx=np.array([0], np.int32), disc_idx=np.array([1], np.int32),
                            means=np.array([[3.0, -2.0]]), stds=np.array([[0.5, 1.0]]),
                            comp_valid=np.array([[True, True]]), weights=np.array([[0.5, 0.5]]),
                            mins=np.array([-10.0]), maxs=np.array([10.0]), cat_values=np.array([[0.0, 1.0]]),
                            cat_valid=np.array([[True, True]]), cat_freq=np.array([[0.5, 0.5]]))


def _adam(lr):
  import optax
  return optax.adam(lr)
