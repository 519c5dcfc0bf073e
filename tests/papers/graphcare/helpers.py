"""Helpers shared by the GraphCare test modules."""
from iclr24_jax.papers import graphcare


def _bat(ckg, **kw):
  base = dict(num_nodes=ckg.num_nodes, num_relations=ckg.num_relations, out_dim=1, embedding_dim=ckg.embedding_dim,
              hidden_dim=8, num_layers=1, dropout=0.0, gnn_dropout=0.0, decay_rate=0.5)
  base.update(kw)
  return graphcare.BAT(**base)
