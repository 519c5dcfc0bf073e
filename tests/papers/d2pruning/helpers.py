"""Helpers shared by the D2 Pruning test modules."""
import numpy as np

from iclr24_jax.common import graph as graph_lib


LN2 = float(np.log(2.0))


def _five_node_graph():
  """Path graph 0-1-2-3-4 with distances d01 = 0, d12 = ln 2, d23 = 0, d34 = ln 2 (both directions)."""
  und = [(0, 1, 0.0), (1, 2, LN2), (2, 3, 0.0), (3, 4, LN2)]
  snd, rcv, dist = [], [], []
  for a, b, d in und:
    snd += [a, b]
    rcv += [b, a]
    dist += [d, d]
  return graph_lib.graph_from_edges(snd, rcv, 5, nodes=np.zeros((5, 1), np.float32),
                                    edges=np.asarray(dist, np.float32)[:, None])


SCORES5 = np.asarray([1.0, 2.0, 3.0, 0.0, 4.0], np.float32)


def _official_dense_select(x, s, budget, k, gamma_r):
  """The official GraphDensitySampler (graph_mode='sum', 'weighted'), re-derived in numpy as a reference."""
  n = x.shape[0]
  dist = np.sqrt(((x[:, None, :] - x[None, :, :]) ** 2).sum(-1))
  d_ = dist.copy()
  np.fill_diagonal(d_, np.inf)
  knn = np.argsort(d_, axis=1, kind="stable")[:, :k]
  adj = np.zeros((n, n), bool)
  for i in range(n):
    adj[i, knn[i]] = True
  adj = adj | adj.T
  w = np.where(adj, np.exp(-dist) * s[None, :], 0.0)
  dens = w.sum(1) + s
  chosen = []
  for _ in range(budget):
    u = int(np.argmax(dens))
    nb = np.flatnonzero(adj[u])
    dens[nb] -= np.exp(-gamma_r * dist[u, nb]) * dens[u]
    chosen.append(u)
    dens[chosen] = dens.min() - 1.0
  return np.asarray(chosen)


def _tiny_cfg():
  from iclr24_jax.configs import d2pruning as cfg_mod
  return cfg_mod.get_config("tiny")
