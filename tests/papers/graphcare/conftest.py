"""Fixtures shared by the GraphCare test modules."""
import pytest

from iclr24_jax.papers import graphcare


@pytest.fixture(scope="session")
def small_world():
  """A small synthetic world: clustered KG, patient graphs, an 8-shard batcher."""
  syn = graphcare.make_synthetic_ehr(seed=0, num_patients=96, num_concepts=40, num_entities=20, num_risk=3,
                                     concept_degree=2, entity_degree=2, codes_per_visit=(1, 3), max_visits=4)
  ckg = graphcare.cluster_kg(syn.raw_kg, syn.entity_embedding, syn.relation_embedding, threshold=0.15)
  pgs = [graphcare.patient_graph(v, ckg) for v in syn.dataset.visits]
  batcher = graphcare.Batcher(pgs, syn.dataset.labels, batch_size=16, num_shards=8)
  return syn, ckg, pgs, batcher
