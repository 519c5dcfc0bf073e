"""Fixtures shared by the C-DGM test modules."""
import pytest

from iclr24_jax.papers import cdgm
from iclr24_jax.papers.cdgm import data as data_lib
from iclr24_jax.papers.cdgm import transform as tfm


@pytest.fixture(scope="session")
def generated_setup():
  table = data_lib.load_generated(n_train=600, n_val=50, n_test=200)
  tf = tfm.fit_transform(table.train, table.discrete, max_fit_rows=300, max_iter=20)
  enc = tfm.encode(tf, table.train)
  layer = cdgm.ConstraintLayer(table.constraints, table.num_features)
  return table, tf, enc, layer
