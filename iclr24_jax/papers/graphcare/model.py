"""The BAT (Bi-attention AugmenTed) graph network of GraphCare, the GIN / GAT swaps, and an EHR-only GRU.

Paper Sec. 3.3 (official: graphcare_/model.py, `BiAttentionGNNConv` and `GraphCare`). Per layer l:

  node-level attention   alpha_{i,j} = Softmax(W_alpha g_{i,j} + b_alpha)                  (softmax over nodes)
  visit-level attention  beta_{i,j}  = lambda_j * tanh(w_beta^T g_{i,j} + b_beta),
                         lambda_j    = exp(-gamma (J_i - j))   (the most recent visit j = J_i has weight 1)
  node weight            a_k = sum_j alpha_{i,j,k} beta_{i,j}
  message                m_{k'k} = ReLU(x_{k'} a_{k'} + w_R(e_{k'k}) e_{k'k}),  w_R = W_R e + b_R (a scalar)
  update                 x_k' = ReLU(W (sum_{k'} m_{k'k} + (1 + eps) x_k)), then dropout

where g_{i,j} is the multi-hot vector of the nodes of visit j of patient i (over all M KG nodes) and
e_{k'k} the relation embedding of the edge. Readout: mean-pooled patient graph (dropout) joined with
the mean of the direct EHR nodes' embeddings (dropout), dropout, then one linear head.

Paper vs official code (`match_official_code=True` selects the code's version):
  * softmax axis of alpha. Paper: over nodes (alpha_{i,j} is a distribution over the nodes of visit j;
    we restrict it to the nodes present in visit j, the only ones g_{i,j} marks; padded visits get 0).
    Code: `torch.softmax(..., dim=1)` over the VISIT axis of a [B, V_max, M] tensor, padded visits
    included, so each node's weights sum to 1 across visits.
  * decay lambda_j. Paper: exp(-gamma (J_i - j)) over the patient's J_i real visits, 1 for the latest.
    Code: `exp(+decay_rate * (max_visit - j))` with j the position in a visit list that `pad_and_convert`
    REVERSED (j = 0 is the latest visit) and padded to the data set's max_visit; padded visits keep
    their (non-zero) beta. Both favour recent visits; the code's weights are the paper's times
    exp(gamma * max_visit) on real visits, and padded visits add tanh(b_beta) terms.
  * ablations: paper mode replaces a removed alpha by the uniform distribution over the visit's nodes
    and a removed beta by 1 on real visits; code mode multiplies by ones over all V_max rows.
Both modes compute alpha/beta only at the patient's own nodes, which is exact: the official code
gathers `attn[batch, node_id]` at the patient's nodes only, and every node of a visit is a node of the
patient's graph, so W_alpha g_{i,j} at node k is a sum over the patient's node pairs (l, k).

Message passing is `jax.ops.segment_sum` over receivers. collate() keeps edges sorted by receiver and node
pairs by k (padding points at the last, padding node), so models built by `create_model` (which only see
Batcher batches) set `sorted_indices=True`; a BAT applied to other GraphsTuples keeps the default False.

Shapes: one shard = a padded GraphsTuple with N nodes, E edges, G graphs (last = padding), the
node x visit matrix [N, V] and the within-patient node pairs [P, 2] (see graphs.py).
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from iclr24_jax.common import checks
from iclr24_jax.common import graph as graph_lib

GNNS = ("bat", "gat", "gin")
PATIENT_MODES = ("joint", "graph", "node")


def node_graph_index(n_node: jax.Array, num_nodes: int) -> jax.Array:
  """[N] index of the graph of every node (jraph layout: graphs' nodes are contiguous)."""
  g = n_node.shape[0]
  return jnp.repeat(jnp.arange(g), n_node, total_repeat_length=num_nodes)


def all_pairs(node_graph: jax.Array, node_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Every ordered pair (l, k) of nodes of the same real graph, as [N * N, 2] indices and a [N * N] mask.

  The O(N^2) fallback used when a batch carries no precomputed pair list (`graphs.collate` provides the
  compact one: sum_g n_g^2 pairs).
  """
  n = node_graph.shape[0]
  l = jnp.tile(jnp.arange(n), n)
  k = jnp.repeat(jnp.arange(n), n)                       # sorted by k
  mask = (node_graph[l] == node_graph[k]) & node_mask[l] & node_mask[k]
  return jnp.stack([l, k], 1), mask


def decay_weights(num_visits: jax.Array, max_visits: int, decay_rate: float, match_official_code: bool = False
                  ) -> jax.Array:
  """lambda_j per visit slot [G, V] (chronological slots, real visits first).

  Args:
    num_visits: [G] J_i.
    max_visits: V.
    decay_rate: gamma.
    match_official_code: code version (see module docstring).

  Returns:
    [G, V] float32. Paper: exp(-gamma (J_i - 1 - j)) on real visits j < J_i, 0 on padded slots.
    Code: exp(gamma (V - p)) where p = J_i - 1 - j is the reversed position of a real visit and p = j for a
    padded slot (non-zero).
  """
  max_visits = checks.static_int("graphcare.decay_weights", "max_visits", max_visits, low=1)
  checks.shapes("graphcare.decay_weights", num_visits=(num_visits, "G"))
  j = jnp.arange(max_visits)[None, :]
  jv = num_visits[:, None]
  real = j < jv
  if match_official_code:
    p = jnp.where(real, jv - 1 - j, j)  # Eq. as in the code: pad_and_convert reverses, lambda = exp(+r (V - p))
    return jnp.exp(decay_rate * (max_visits - p).astype(jnp.float32))
  return jnp.where(real, jnp.exp(-decay_rate * (jv - 1 - j).astype(jnp.float32)), 0.0)  # Eq. (3)


def bi_attention(visit_node: jax.Array, node_ids: jax.Array, node_graph: jax.Array, node_mask: jax.Array,
                 num_visits: jax.Array, pairs: jax.Array, pair_mask: jax.Array, w_alpha: jax.Array | None,
                 b_alpha: jax.Array | None, w_beta: jax.Array | None, b_beta: jax.Array | None, decay_rate: float,
                 match_official_code: bool = False, pairs_sorted: bool = False
                 ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Node weights a_k = sum_j alpha_{j,k} beta_j at every node (Eqs. (2)-(3) of the paper).

  Args:
    visit_node: [N, V] node k in visit j of its patient.
    node_ids: [N] global node ids.
    node_graph: [N] patient of every node.
    node_mask: [N] bool, real nodes.
    num_visits: [G] real visits per patient.
    pairs: [P, 2] (l, k) node pairs of the same patient (all of them, self-pairs included).
    pair_mask: [P] bool, real pairs.
    w_alpha: [M, M] W_alpha as a Dense kernel (input node -> output node), or None to drop alpha.
    b_alpha: [M].
    w_beta: [M] w_beta, or None to drop beta.
    b_beta: [] scalar.
    decay_rate: gamma.
    match_official_code: the official code's softmax axis / decay / padding (module docstring).
    pairs_sorted: pairs are sorted by k (graphs.collate's order) -> sorted segment sums.

  Returns:
    (attn [N], alpha [N, V], beta [G, V]).
  """
  n, v = visit_node.shape
  g = num_visits.shape[0]
  present = (visit_node > 0) & node_mask[:, None]
  real_visit = jnp.arange(v)[None, :] < num_visits[:, None]                     # [G, V]
  if w_alpha is not None:
    # (W_alpha g_{i,j})_k = sum over the visit's nodes l of W[id_l, id_k]: the official [B, V, M] logits at the
    # patient's own nodes (the only entries the code reads), summed over the within-patient pairs (l, k).
    l, k = pairs[:, 0], pairs[:, 1]
    w_pair = w_alpha[node_ids[l], node_ids[k]] * pair_mask                      # [P]
    logits = jax.ops.segment_sum(visit_node[l] * w_pair[:, None], k, n, indices_are_sorted=pairs_sorted)
    logits = logits + b_alpha[node_ids][:, None]                               # [N, V]
    if match_official_code:
      alpha = jax.nn.softmax(logits, axis=1)                                    # code: over visits (dim=1)
    else:                                                                       # paper: over the visit's nodes
      masked = jnp.where(present, logits, -1e30)
      top = jax.ops.segment_max(masked, node_graph, g)                          # [G, V]
      ex = jnp.where(present, jnp.exp(masked - top[node_graph]), 0.0)
      den = graph_lib.segment_sum(ex, node_graph, g)
      alpha = ex / jnp.maximum(den[node_graph], 1e-30)
  else:
    if match_official_code:
      alpha = jnp.ones((n, v), jnp.float32)
    else:                                                                       # uniform over the visit's nodes
      count = graph_lib.segment_sum(present.astype(jnp.float32), node_graph, g)
      alpha = present / jnp.maximum(count[node_graph], 1.0)
  lam = decay_weights(num_visits, v, decay_rate, match_official_code)           # [G, V]
  if w_beta is not None:
    score = graph_lib.segment_sum(visit_node * (w_beta[node_ids] * node_mask)[:, None], node_graph, g)
    beta = jnp.tanh(score + b_beta) * lam                                       # [G, V]
  else:
    beta = jnp.ones((g, v), jnp.float32) if match_official_code else real_visit.astype(jnp.float32)
  attn = jnp.sum(alpha * beta[node_graph], axis=1) * node_mask
  return attn, alpha, beta


def bat_aggregate(x: jax.Array, a_node: jax.Array, senders: jax.Array, receivers: jax.Array, relation: jax.Array,
                  rel_table: jax.Array, w_rel: jax.Array | None, eps: float | jax.Array,
                  edge_mask: jax.Array | None = None, receivers_sorted: bool = False) -> jax.Array:
  """The BAT layer before its linear map: sum_{k'} m_{k'k} + (1 + eps) x_k (official BiAttentionGNNConv).

  Args:
    x: [N, H] node states.
    a_node: [N] attention weight a_k of every node (as a sender).
    senders, receivers: [E] edges.
    relation: [E] relation ids.
    rel_table: [R, H] projected relation embeddings e_r.
    w_rel: [R, 1] edge-attention weights W_R e_r + b_R, or None (ablation: no edge attention).
    eps: the self weight.
    edge_mask: [E] bool, False on padding edges (their messages are dropped).
    receivers_sorted: receivers are non-decreasing (graphs.collate) -> sorted segment sum.

  Returns:
    [N, H] = sum_{k'} m_{k'k} + (1 + eps) x_k with m_{k'k} = ReLU(x_{k'} a_{k'} + w_R(e) e)
    (ReLU(x_{k'} a_{k'}) without edge attention).
  """
  xa = (x * a_node[:, None])[senders]                                          # x_{k'} a_{k'}
  msg = jax.nn.relu(xa + (w_rel * rel_table)[relation]) if w_rel is not None else jax.nn.relu(xa)
  if edge_mask is not None:
    msg = msg * edge_mask[:, None]
  agg = jax.ops.segment_sum(msg, receivers, x.shape[0], indices_are_sorted=receivers_sorted)
  return agg + (1.0 + eps) * x


class BAT(nn.Module):
  """GraphCare's network: BAT layers (or GAT / GIN) over personalised KGs, joint readout, linear head.

  Attributes:
    num_nodes: M, global KG nodes.
    num_relations: R.
    out_dim: 1 (binary), classes (multi-class) or labels (multi-label).
    embedding_dim: width of the node / relation embeddings (the name embeddings' width).
    hidden_dim: width after the shared projection `lin` (official default 512).
    num_layers: BAT layers (official 3).
    gnn: 'bat' | 'gat' | 'gin' (the official baselines swap the convolution, keep everything else).
    dropout: readout dropout (official 0.5).
    gnn_dropout: dropout after every layer (0.5, hard-coded in the official forward).
    decay_rate: gamma of lambda_j (official argparse default 0.01).
    use_alpha, use_beta, use_edge_attn: the paper's ablations.
    eps: the (1 + eps) self weight (official self_attn = 0).
    train_eps: learn eps.
    patient_mode: 'joint' (graph + EHR nodes), 'graph' or 'node'.
    ehr_readout: 'input' - the direct EHR nodes' INPUT embeddings through `lin` (official code);
      'final' - their last-layer states.
    match_official_code: see module docstring.
    edge_types: GIN / GAT only - let the baseline see the relation types: GIN sums ReLU(x_j + lin(e_ji)) (GINE),
      GAT adds lin_edge(lin(e_ji)) to the attention logit and to the message. Off by default (the official
      GIN / GAT baselines ignore `rel_ids`); the synthetic label depends on relation types, so a fair
      comparison gives the baselines them too. BAT always uses them (its w_R term).
    sorted_indices: the inputs come from graphs.collate (edges sorted by receiver, pairs by k), so segment
      sums may assume sorted indices. Leave False for other GraphsTuples.
  """

  num_nodes: int
  num_relations: int
  out_dim: int
  embedding_dim: int = 64
  hidden_dim: int = 128
  num_layers: int = 3
  gnn: str = "bat"
  dropout: float = 0.5
  gnn_dropout: float = 0.5
  decay_rate: float = 0.01
  use_alpha: bool = True
  use_beta: bool = True
  use_edge_attn: bool = True
  eps: float = 0.0
  train_eps: bool = False
  patient_mode: str = "joint"
  ehr_readout: str = "input"
  match_official_code: bool = False
  edge_types: bool = False
  sorted_indices: bool = False

  def _check(self):
    if self.gnn not in GNNS:
      raise ValueError(f"BAT: unknown gnn '{self.gnn}'; choose one of {GNNS}.")
    if self.patient_mode not in PATIENT_MODES:
      raise ValueError(f"BAT: unknown patient_mode '{self.patient_mode}'; choose one of {PATIENT_MODES}.")
    if self.ehr_readout not in ("input", "final"):
      raise ValueError(f"BAT: ehr_readout must be 'input' or 'final', got '{self.ehr_readout}'.")

  @nn.compact
  def __call__(self, graph, visit_node: jax.Array, codes: jax.Array | None = None, pairs: jax.Array | None = None,
               train: bool = False, return_attention: bool = False):
    """Logits of one shard.

    Args:
      graph: padded GraphsTuple (nodes {'id', 'ehr'}, edges {'relation'}, globals {'num_visits'}).
      visit_node: [N, V] float32 node x visit matrix.
      codes: unused (the EHR-only baseline's input); kept for a uniform signature.
      pairs: [P, 2] within-patient node pairs (graphs.collate); None -> all N^2 pairs, masked (small graphs).
      train: dropout on.
      return_attention: also return {'attn': [L, N], 'alpha': [L, N, V], 'beta': [L, G, V], 'w_rel': [L, E, 1]}.

    Returns:
      logits [G, out_dim] (and the attention dict).
    """
    del codes
    self._check()
    ids, relation = graph.nodes["id"], graph.edges["relation"]
    n, g = ids.shape[0], graph.n_node.shape[0]
    if visit_node.ndim != 2 or visit_node.shape[0] != n:
      raise ValueError(f"BAT: visit_node must be [N={n}, V] (graphs.collate), got {visit_node.shape}.")
    nmask = graph_lib.node_mask(graph)
    emask = graph_lib.edge_mask(graph)
    senders, receivers = graph.senders, graph.receivers
    node_graph = node_graph_index(graph.n_node, n)
    num_visits = graph.globals["num_visits"]
    fallback_pairs = pairs is None  # all_pairs() is sorted by construction
    if pairs is None:
      pairs, pair_mask = all_pairs(node_graph, nmask)
    else:
      pair_mask = nmask[pairs[:, 0]] & nmask[pairs[:, 1]]

    node_emb = nn.Embed(self.num_nodes, self.embedding_dim, name="node_emb")
    rel_emb = nn.Embed(self.num_relations, self.embedding_dim, name="rel_emb")
    lin = nn.Dense(self.hidden_dim, name="lin")       # shared by nodes and relations, as in the code
    x0 = node_emb(ids)
    x = lin(x0)
    rel_table = lin(rel_emb.embedding)          # [R, H]: lin(e) depends only on the relation type
    m = self.num_nodes
    eps = self.param("eps", lambda k: jnp.full((), self.eps, jnp.float32)) if self.train_eps else self.eps
    records = {"attn": [], "alpha": [], "beta": [], "w_rel": []}

    for layer in range(self.num_layers):
      if self.gnn == "bat":
        w_a = b_a = w_b = b_b = None
        if self.use_alpha:
          w_a = self.param(f"alpha_{layer}_kernel", nn.initializers.xavier_normal(), (m, m))
          b_a = self.param(f"alpha_{layer}_bias", nn.initializers.zeros, (m,))
        if self.use_beta:
          w_b = self.param(f"beta_{layer}_kernel", nn.initializers.xavier_normal(), (m, 1))[:, 0]
          b_b = self.param(f"beta_{layer}_bias", nn.initializers.zeros, ())
        a_node, alpha, beta = bi_attention(visit_node, ids, node_graph, nmask, num_visits, pairs, pair_mask, w_a, b_a,
                                           w_b, b_b, self.decay_rate, self.match_official_code,
                                           pairs_sorted=self.sorted_indices or fallback_pairs)
        w_rel = nn.Dense(1, name=f"W_R_{layer}")(rel_table) if self.use_edge_attn else None  # [R, 1]
        pre = bat_aggregate(x, a_node, senders, receivers, relation, rel_table, w_rel, eps, emask,
                            receivers_sorted=self.sorted_indices)
        out = nn.Dense(self.hidden_dim, name=f"conv_{layer}")(pre)              # x' = W(sum m + (1 + eps) x)
        w_rel = w_rel[relation] if w_rel is not None else jnp.zeros((senders.shape[0], 1), x.dtype)
        if return_attention:
          records["attn"].append(a_node), records["alpha"].append(alpha), records["beta"].append(beta)
          records["w_rel"].append(w_rel)
      elif self.gnn == "gin":
        msg = jax.nn.relu(x[senders] + rel_table[relation]) if self.edge_types else x[senders]   # GINE with types
        agg = jax.ops.segment_sum(msg * emask[:, None], receivers, n, indices_are_sorted=self.sorted_indices)
        out = nn.Dense(self.hidden_dim, name=f"conv_{layer}")(agg + (1.0 + eps) * x)  # GINConv(Linear), eps = 0
      else:
        edge_feat = rel_table[relation] if self.edge_types else None
        out = GATConv(self.hidden_dim, name=f"conv_{layer}")(x, senders, receivers, emask, edge_feat)
      x = jax.nn.relu(out)
      x = nn.Dropout(self.gnn_dropout)(x, deterministic=not train)

    x = x * nmask[:, None]
    feats = []
    if self.patient_mode in ("joint", "graph"):
      count = graph_lib.segment_sum(nmask.astype(x.dtype), node_graph, g)
      x_graph = graph_lib.segment_sum(x, node_graph, g) / jnp.maximum(count, 1.0)[:, None]
      feats.append(nn.Dropout(self.dropout)(x_graph, deterministic=not train))
    if self.patient_mode in ("joint", "node"):
      ehr = (graph.nodes["ehr"] & nmask).astype(x.dtype)
      count = jnp.maximum(graph_lib.segment_sum(ehr, node_graph, g), 1.0)[:, None]
      if self.ehr_readout == "input":
        # Official: ehr_nodes @ node_emb.weight / sum(ehr_nodes), then self.lin.
        x_node = lin(graph_lib.segment_sum(x0 * ehr[:, None], node_graph, g) / count)
      else:
        x_node = graph_lib.segment_sum(x * ehr[:, None], node_graph, g) / count
      feats.append(nn.Dropout(self.dropout)(x_node, deterministic=not train))
    z = jnp.concatenate(feats, axis=-1)
    z = nn.Dropout(self.dropout)(z, deterministic=not train)  # the official forward drops the concat again
    logits = nn.Dense(self.out_dim, name="MLP")(z)
    if return_attention:
      return logits, {k: (jnp.stack(v) if v else None) for k, v in records.items()}
    return logits


class GATConv(nn.Module):
  """One-head graph attention (torch_geometric GATConv defaults: self-loops, LeakyReLU 0.2, bias).

  With `edge_feat` [E, D] (the relation embedding of every edge), the edge's projection lin_edge(e) enters the
  attention logit (a_edge^T lin_edge(e), as GATConv(edge_dim=...)) and is added to the message h_j (so the
  relation type can reach the next layer; self-loops carry a zero edge feature).
  """

  features: int

  @nn.compact
  def __call__(self, x: jax.Array, senders: jax.Array, receivers: jax.Array, emask: jax.Array,
               edge_feat: jax.Array | None = None) -> jax.Array:
    """[N, F] node states -> [N, features]; senders/receivers/emask [E]; edge_feat [E, D] or None."""
    n = x.shape[0]
    h = nn.Dense(self.features, use_bias=False, name="lin")(x)
    a_src = self.param("att_src", nn.initializers.glorot_uniform(), (self.features, 1))
    a_dst = self.param("att_dst", nn.initializers.glorot_uniform(), (self.features, 1))
    loops = jnp.arange(n, dtype=jnp.int32)
    senders, receivers = senders.astype(jnp.int32), receivers.astype(jnp.int32)
    s = jnp.concatenate([senders, loops])
    r = jnp.concatenate([receivers, loops])
    valid = jnp.concatenate([emask, jnp.ones((n,), bool)])
    logit = (h @ a_src)[s, 0] + (h @ a_dst)[r, 0]
    msg = h[s]
    if edge_feat is not None:
      he = nn.Dense(self.features, use_bias=False, name="lin_edge")(edge_feat)                  # [E, H]
      he = jnp.concatenate([he, jnp.zeros((n, self.features), he.dtype)])                       # self-loops: 0
      a_edge = self.param("att_edge", nn.initializers.glorot_uniform(), (self.features, 1))
      logit = logit + (he @ a_edge)[:, 0]
      msg = msg + he
    logit = jax.nn.leaky_relu(logit, 0.2)
    logit = jnp.where(valid, logit, -1e9)
    w = graph_lib.segment_softmax(logit, r, n) * valid
    out = graph_lib.segment_sum(msg * w[:, None], r, n)
    return out + self.param("bias", nn.initializers.zeros, (self.features,))


class EHRGRU(nn.Module):
  """The no-KG baseline: a GRU over visits of mean EHR-code embeddings (the paper's GRU baseline).

  It sees only the patient's codes per visit (`codes` [G, V, K], -1 padded) - no KG nodes or edges.

  Attributes:
    num_nodes: embedding table size (codes are concept node ids).
    out_dim: outputs.
    embedding_dim: code embedding width.
    hidden_dim: GRU width.
    dropout: dropout before the head.
  """

  num_nodes: int
  out_dim: int
  embedding_dim: int = 64
  hidden_dim: int = 128
  dropout: float = 0.5

  @nn.compact
  def __call__(self, graph, visit_node: jax.Array | None, codes: jax.Array, pairs: jax.Array | None = None,
               train: bool = False, return_attention: bool = False):
    """Logits [G, out_dim] from codes [G, V, K] (graph / visit_node / pairs unused except num_visits)."""
    del visit_node, pairs
    emb = nn.Embed(self.num_nodes, self.embedding_dim, name="node_emb")
    valid = codes >= 0
    e = emb(jnp.maximum(codes, 0)) * valid[..., None]
    bag = e.sum(2) / jnp.maximum(valid.sum(2, keepdims=True), 1)           # [G, V, D]
    bag = nn.Dense(self.hidden_dim, name="lin")(bag)
    num_visits = graph.globals["num_visits"]
    rnn = nn.RNN(nn.GRUCell(self.hidden_dim), name="gru")
    h = rnn(bag, seq_lengths=jnp.maximum(num_visits, 1))                     # [G, V, H]
    last = h[jnp.arange(h.shape[0]), jnp.maximum(num_visits - 1, 0)]
    last = nn.Dropout(self.dropout)(last, deterministic=not train)
    logits = nn.Dense(self.out_dim, name="head")(last)
    if return_attention:
      return logits, {}
    return logits


def create_model(model_config: Any, num_nodes: int, num_relations: int, out_dim: int, embedding_dim: int
                 ) -> nn.Module:
  """Builds BAT / GAT / GIN (`name` 'bat' | 'gat' | 'gin') or the EHR-only GRU ('gru') from config.model."""
  name = model_config.get("name", "bat")
  if name == "gru":
    return EHRGRU(num_nodes=num_nodes, out_dim=out_dim, embedding_dim=embedding_dim,
                  hidden_dim=int(model_config.hidden_dim), dropout=float(model_config.dropout))
  if name not in GNNS:
    raise ValueError(f"unknown config.model.name '{name}'; choose 'bat', 'gat', 'gin' or 'gru'.")
  return BAT(num_nodes=num_nodes, num_relations=num_relations, out_dim=out_dim, embedding_dim=embedding_dim,
             hidden_dim=int(model_config.hidden_dim), num_layers=int(model_config.num_layers), gnn=name,
             dropout=float(model_config.dropout), gnn_dropout=float(model_config.gnn_dropout),
             decay_rate=float(model_config.decay_rate), use_alpha=bool(model_config.use_alpha),
             use_beta=bool(model_config.use_beta), use_edge_attn=bool(model_config.use_edge_attn),
             eps=float(model_config.eps), train_eps=bool(model_config.train_eps),
             patient_mode=str(model_config.patient_mode), ehr_readout=str(model_config.ehr_readout),
             match_official_code=bool(model_config.match_official_code),
             edge_types=bool(model_config.get("edge_types", False)), sorted_indices=True)  # Batcher inputs
