"""Fixtures shared by the PMP test modules."""
import pytest

from iclr24_jax.papers import pmp


@pytest.fixture(scope="session")
def tiny_graph():
  return pmp.make_fraud_graph(num_nodes=200, feature_dim=8, avg_degree=(4.0, 6.0, 8.0), fraud_ratio=0.15, seed=3)
