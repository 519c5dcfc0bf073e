"""Fixtures shared by the D2 Pruning test modules."""
import pytest


@pytest.fixture(scope="session")
def digits_small():
  from iclr24_jax.common import data as data_lib
  ds = data_lib.load_digits()
  return ds
