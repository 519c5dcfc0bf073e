"""Partitioning Message Passing (PMP) layers and the GraphSAGE / GCN baselines, as pure functions + Linen modules.

The PMP layer (official `model/LASAGE_S.py`, `LASAGESConv` with `agg_func`), for one relation graph:

  h_v' = act( W_self h_v + b_self
              + sum_c  W_c^(v) ( A_c(v) )                         # neighbours whose training label is c
              + sum_c  alpha_{v,c} W_c^(v) ( A_unk(v) ) )          # neighbours with no training label
  W_c^(v) x = W_c ( x * (T_c h_v + t_c) ) + b_c                    # node-specific (adaptive) filter
  alpha_v   = sigmoid(MLP(h_v)) for fraud, 1 - alpha_v for benign  # (softmax over C classes when C > 2)

with A_c(v) = sum_{u in N(v), label_state[u] = c} h_u (the official code sums, although its configs say
`agg: 'mean'`) or that sum divided by |N(v)| (`aggregation='mean'`). The bias b_c enters once per
partition whatever its size, exactly as the official code applies `LILinear` to an aggregated tensor.

Multi-relation models (official `LASAGE_S`): one layer's weights are SHARED by all relations; the per-
relation outputs are concatenated, mixed by a linear layer (`relation_mlp`), and after the last layer
dropout and a linear 2-class head (`proj`, a kernel-1 Conv1d in the official code) give the logits.

Generalisation (documented, used for the multi-class geom_gcn graphs): `num_classes` C > 2 partitions the
neighbours into C known classes plus unknown (label_state in [0, C], C = unknown) with one W_c, T_c per class
and alpha_v = softmax(MLP(h_v)) over the C classes. For C = 2 this is exactly the binary layer above.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import checks
from iclr24_jax.common.graph import GraphsTuple, segment_sum

AGGREGATIONS = ("sum", "mean")
RELATION_AGGS = ("cat", "mean", "add")
CONVS = ("pmp", "sage", "gcn")

# ----------------------------------------------------------------------------------------------------------
# Initialisers that match the official PyTorch modules.


def torch_linear_kernel_init(in_axis: int = -2, out_axis: int = -1, batch_axis=()):
  """torch.nn.Linear's default weight init, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (kaiming_uniform, a=sqrt(5))."""
  return nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform", in_axis=in_axis, out_axis=out_axis,
                                          batch_axis=batch_axis)


def xavier_relu_init(in_axis: int = -2, out_axis: int = -1, batch_axis=()):
  """nn.init.xavier_uniform_ with gain calculate_gain('relu') = sqrt(2) (DGL SAGEConv / LASAGESConv fc_self)."""
  return nn.initializers.variance_scaling(2.0, "fan_avg", "uniform", in_axis=in_axis, out_axis=out_axis,
                                          batch_axis=batch_axis)


def torch_bias_init(fan_in: int):
  """torch.nn.Linear's default bias init, U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
  bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)

  return init


class TorchDense(nn.Module):
  """A Dense layer initialised like torch.nn.Linear (relation_mlp, proj, the alpha MLP, input projection)."""
  features: int
  use_bias: bool = True

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    fan_in = x.shape[-1]
    return nn.Dense(self.features, use_bias=self.use_bias, kernel_init=torch_linear_kernel_init(),
                    bias_init=torch_bias_init(fan_in))(x)


# ----------------------------------------------------------------------------------------------------------
# Pure layer functions.


def _check_inputs(graph: GraphsTuple, h: jax.Array, label_state: jax.Array | None, num_classes: int | None,
                  aggregation: str, where: str = "pmp") -> Any:
  """Structure raises at trace time; values (node ids out of range, label states outside [0, C], non-finite
  features) raise eagerly and are returned as a condition for `checks.poison` under jit / vmap."""
  checks.choice(where, "aggregation", aggregation, AGGREGATIONS, "aggregation (the official code sums)")
  if graph.senders is None or graph.receivers is None:
    raise checks.ContractError(f"{where}: the relation graph has no senders/receivers; build it with "
                               "common.graph.graph_from_edges.")
  checks.shapes(where, h=(h, "N F"), senders=(graph.senders, "E"), receivers=(graph.receivers, "E"),
                label_state=(label_state, "N"))
  checks.dtype(where, "h", h, "real")
  checks.dtype(where, "senders", graph.senders, "integer")
  checks.dtype(where, "receivers", graph.receivers, "integer")
  n = np.shape(h)[0]
  hint = "node ids index the rows of h (padding included)."
  oks = [checks.indices(where, "senders", graph.senders, n, hint),
         checks.indices(where, "receivers", graph.receivers, n, hint),
         checks.finite(where, "h", h, "clean or normalise the node features first.")]
  if label_state is not None:
    num_classes = checks.static_int(where, "num_classes", num_classes, low=2)
    checks.dtype(where, "label_state", label_state,
                 "integer", f"(0..{num_classes - 1} known class, {num_classes} unknown).")
    oks.append(checks.require(
        where, (checks.xp(label_state).asarray(label_state) >= 0) & (label_state <= num_classes),
        checks.LabelError, f"label_state values must lie in [0, {num_classes}] ({num_classes} = unknown); build "
        "it with pmp.label_state_from_split."))
  return checks.all_ok(*oks)


def in_degree(receivers: jax.Array, num_nodes: int) -> jax.Array:
  """Number of incoming edges per node, [N] float32 (padding edges land on padding nodes)."""
  return segment_sum(jnp.ones(receivers.shape, jnp.float32), receivers, num_nodes)


def partition_aggregate(graph: GraphsTuple, h: jax.Array, label_state: jax.Array, num_classes: int = 2,
                        aggregation: str = "sum") -> jax.Array:
  """Sums (or means) neighbour features per label partition: one segment_sum over receiver*(C+1)+state.

  Args:
    graph: a (padded) relation graph; messages flow sender -> receiver.
    h: [N, F] node features.
    label_state: [N] int, 0..C-1 a known (training) label, C unknown.
    num_classes: C.
    aggregation: 'sum' (official code) or 'mean' (divide by the full in-degree |N(v)|).

  Returns:
    [N, C + 1, F]: partitions 0..C-1 (known classes) and C (unknown).
  """
  n, f = h.shape
  k = num_classes + 1
  state = jnp.clip(label_state, 0, num_classes)[graph.senders]          # [E]
  seg = graph.receivers * k + state                                     # [E] in [0, N*k)
  # official: Xtra-Computing/PMP@3f7629f model/LASAGE_S.py:158-175 (mp_func, agg_func)
  agg = segment_sum(h[graph.senders], seg, n * k).reshape(n, k, f)      # [N, C+1, F]
  if aggregation == "mean":
    deg = in_degree(graph.receivers, n)
    agg = agg / jnp.maximum(deg, 1.0)[:, None, None]
  return agg


def balance_weights(h: jax.Array, params: Mapping[str, jax.Array], num_classes: int = 2) -> jax.Array:
  """alpha_v: how unknown-label neighbours are split over the class filters, [N, C] (rows sum to 1).

  Official `fc_balance`: Linear(F, H) -> ReLU -> Linear(H, 1) -> sigmoid = alpha for fraud, 1 - alpha for benign.
  For C > 2 the last layer has C outputs and a softmax (our generalisation).
  """
  # official: Xtra-Computing/PMP@3f7629f model/LASAGE_S.py:232-236, 320 (fc_balance, balance_w)
  z = jax.nn.relu(h @ params["alpha_kernel_1"] + params["alpha_bias_1"])
  z = z @ params["alpha_kernel_2"] + params["alpha_bias_2"]
  if num_classes == 2:
    a = jax.nn.sigmoid(z[:, 0])
    return jnp.stack([1.0 - a, a], axis=-1)  # [benign, fraud]
  return jax.nn.softmax(z, axis=-1)


def partition_messages(graph: GraphsTuple, h: jax.Array, label_state: jax.Array, params: Mapping[str, jax.Array],
                       num_classes: int = 2, aggregation: str = "sum",
                       activation: Callable[[jax.Array], jax.Array] | None = jax.nn.relu) -> jax.Array:
  """One PMP layer on one relation graph (pure; compile it yourself).

  The PMP layer (official `LASAGESConv.forward`, Xtra-Computing/PMP@3f7629f model/LASAGE_S.py:304-322, 370):
    out_v = act( h_v W_self + b_self + sum_c [ ((A_c(v) + alpha_vc A_unk(v)) * (h_v T_c + t_c)) W_c + (1 + alpha_vc) b_c ] )
  which is W_self h_v + W_fr^(v) A_fr + W_be^(v) A_be + [alpha W_fr^(v) + (1 - alpha) W_be^(v)] A_unk
  with W_c^(v) x = W_c (x * T_c h_v) + b_c (the two are equal by linearity).

  Args:
    graph: a relation graph (GraphsTuple, padded or not); only senders/receivers are used.
    h: [N, F] node features (N includes padding nodes).
    label_state: [N] int: 0 benign, 1 fraud (0..C-1 in general) for TRAINING nodes only; C (= 2) unknown.
    params: mapping with self_kernel [F, H], self_bias [H], class_kernel [C, F, H], class_bias [C, H],
      trans_kernel [C, F, F], trans_bias [C, F], alpha_kernel_1 [F, A], alpha_bias_1 [A],
      alpha_kernel_2 [A, 1 if C == 2 else C], alpha_bias_2 [1 or C] (PMPLayer's params).
    num_classes: C (2 for fraud detection).
    aggregation: 'sum' (the official code, our default) or 'mean'.
    activation: applied to the output (official: ReLU); None for none.

  Returns:
    [N, H] new node features. Node ids outside [0, N), label states outside [0, C] or non-finite features raise
    named errors eagerly and give NaN under jit / vmap (`iclr24_jax.checked` raises inside jit).
  """
  ok = _check_inputs(graph, h, label_state, num_classes, aggregation, "pmp.partition_messages")
  agg = partition_aggregate(graph, h, label_state, num_classes, aggregation)   # [N, C+1, F]
  alpha = balance_weights(h, params, num_classes)                              # [N, C]
  known, unknown = agg[:, :num_classes], agg[:, num_classes]                   # [N, C, F], [N, F]
  # official: Xtra-Computing/PMP@3f7629f model/LASAGE_S.py:138-148 (LILinear.forward)
  t = jnp.einsum("nf,cfg->ncg", h, params["trans_kernel"]) + params["trans_bias"]   # T_c h_v + t_c, [N, C, F]
  # Eq. (4): unknown-label neighbours go through alpha_v W_fr + (1 - alpha_v) W_be (alpha[:, 1] = alpha_v)
  # official: Xtra-Computing/PMP@3f7629f model/LASAGE_S.py:318-322
  x = (known + alpha[..., None] * unknown[:, None, :]) * t                     # [N, C, F]
  neigh = jnp.einsum("ncf,cfh->nh", x, params["class_kernel"])
  neigh = neigh + (1.0 + alpha) @ params["class_bias"]                         # b_c once per known + alpha_c b_c
  # official: Xtra-Computing/PMP@3f7629f model/LASAGE_S.py:370
  out = h @ params["self_kernel"] + params["self_bias"] + neigh
  return checks.poison(activation(out) if activation is not None else out, ok)


def sage_messages(graph: GraphsTuple, h: jax.Array, params: Mapping[str, jax.Array], aggregation: str = "sum",
                  activation: Callable[[jax.Array], jax.Array] | None = jax.nn.relu) -> jax.Array:
  """A GraphSAGE layer (DGL SAGEConv form): act(h_v W_self + b_self + AGG_{u in N(v)} h_u W_neigh).

  Args:
    graph: relation graph; h: [N, F]; params: self_kernel [F, H], self_bias [H], neigh_kernel [F, H];
    aggregation: 'sum' (the PMP default, so PMP reduces to it) or 'mean'; activation: output activation.

  Returns:
    [N, H] (NaN under jit for node ids out of range or non-finite features; eager calls raise).
  """
  ok = _check_inputs(graph, h, None, None, aggregation, "pmp.sage_messages")
  n = h.shape[0]
  agg = segment_sum(h[graph.senders], graph.receivers, n)
  if aggregation == "mean":
    agg = agg / jnp.maximum(in_degree(graph.receivers, n), 1.0)[:, None]
  out = h @ params["self_kernel"] + params["self_bias"] + agg @ params["neigh_kernel"]
  return checks.poison(activation(out) if activation is not None else out, ok)


def gcn_messages(graph: GraphsTuple, h: jax.Array, params: Mapping[str, jax.Array],
                 activation: Callable[[jax.Array], jax.Array] | None = jax.nn.relu) -> jax.Array:
  """A GCN layer (Kipf & Welling): act(D^-1/2 (A + I) D^-1/2 h W + b), self-loops added here.

  Padding edges join padding nodes only, so real nodes' degrees are unaffected.

  Args:
    graph: relation graph; h: [N, F]; params: kernel [F, H], bias [H]; activation: output activation.

  Returns:
    [N, H] (NaN under jit for node ids out of range or non-finite features; eager calls raise).
  """
  ok = _check_inputs(graph, h, None, None, "sum", "pmp.gcn_messages")
  n = h.shape[0]
  deg = in_degree(graph.receivers, n) + 1.0                                    # + self-loop
  norm = jax.lax.rsqrt(deg)
  hw = h @ params["kernel"]
  msg = hw[graph.senders] * (norm[graph.senders] * norm[graph.receivers])[:, None]
  out = segment_sum(msg, graph.receivers, n) + hw * (norm * norm)[:, None] + params["bias"]
  return checks.poison(activation(out) if activation is not None else out, ok)


# ----------------------------------------------------------------------------------------------------------
# Linen modules (their params are exactly the dicts the pure functions take).


class PMPLayer(nn.Module):
  """The PMP layer as a Linen module; `variables['params']` is what `partition_messages` takes.

  Attributes:
    features: H, output width.
    num_classes: C (2: benign / fraud).
    aggregation: 'sum' (default, the official code) or 'mean'.
    alpha_hidden: width of alpha's MLP (official: the layer's output width H; None -> H).
    activation: output activation (official ReLU).
  """
  features: int
  num_classes: int = 2
  aggregation: str = "sum"
  alpha_hidden: int | None = None
  activation: Callable[[jax.Array], jax.Array] | None = jax.nn.relu

  @nn.compact
  def __call__(self, graph: GraphsTuple, h: jax.Array, label_state: jax.Array) -> jax.Array:
    """Args: graph (relation), h [N, F], label_state [N] int. Returns [N, features]."""
    f, c, hh = h.shape[-1], self.num_classes, self.features
    a = self.alpha_hidden or hh
    p = {
        "self_kernel": self.param("self_kernel", xavier_relu_init(), (f, hh)),
        "self_bias": self.param("self_bias", torch_bias_init(f), (hh,)),
        # LILinear: weight kaiming_uniform(a=sqrt 5) == torch default, bias U(+-1/sqrt(in)); one per class.
        "class_kernel": self.param("class_kernel", torch_linear_kernel_init(batch_axis=(0,)), (c, f, hh)),
        "class_bias": self.param("class_bias", torch_bias_init(f), (c, hh)),
        # trans_src: nn.Linear(F, F) per class (T_c h_v + t_c).
        "trans_kernel": self.param("trans_kernel", torch_linear_kernel_init(batch_axis=(0,)), (c, f, f)),
        "trans_bias": self.param("trans_bias", torch_bias_init(f), (c, f)),
        "alpha_kernel_1": self.param("alpha_kernel_1", torch_linear_kernel_init(), (f, a)),
        "alpha_bias_1": self.param("alpha_bias_1", torch_bias_init(f), (a,)),
        "alpha_kernel_2": self.param("alpha_kernel_2", torch_linear_kernel_init(), (a, 1 if c == 2 else c)),
        "alpha_bias_2": self.param("alpha_bias_2", torch_bias_init(a), (1 if c == 2 else c,)),
    }
    return partition_messages(graph, h, label_state, p, num_classes=c, aggregation=self.aggregation,
                              activation=self.activation)


class SAGELayer(nn.Module):
  """GraphSAGE layer (DGL SAGEConv init: xavier(relu gain) weights, no bias on the neighbour weight)."""
  features: int
  aggregation: str = "sum"
  activation: Callable[[jax.Array], jax.Array] | None = jax.nn.relu

  @nn.compact
  def __call__(self, graph: GraphsTuple, h: jax.Array, label_state: jax.Array | None = None) -> jax.Array:
    del label_state  # a baseline: it never sees labels
    f = h.shape[-1]
    p = {"self_kernel": self.param("self_kernel", xavier_relu_init(), (f, self.features)),
         "self_bias": self.param("self_bias", torch_bias_init(f), (self.features,)),
         "neigh_kernel": self.param("neigh_kernel", xavier_relu_init(), (f, self.features))}
    return sage_messages(graph, h, p, aggregation=self.aggregation, activation=self.activation)


class GCNLayer(nn.Module):
  """GCN layer (DGL GraphConv init: xavier-uniform weight, zero bias)."""
  features: int
  activation: Callable[[jax.Array], jax.Array] | None = jax.nn.relu

  @nn.compact
  def __call__(self, graph: GraphsTuple, h: jax.Array, label_state: jax.Array | None = None) -> jax.Array:
    del label_state
    p = {"kernel": self.param("kernel", nn.initializers.xavier_uniform(), (h.shape[-1], self.features)),
         "bias": self.param("bias", nn.initializers.zeros, (self.features,))}
    return gcn_messages(graph, h, p, activation=self.activation)


class RelationalGNN(nn.Module):
  """The official multi-relation wrapper (LASAGE_S / GraphSAGE_DGL) around a conv ('pmp', 'sage' or 'gcn').

  Per layer: one conv shared by all relations -> per-relation outputs combined ('cat' official, 'mean',
  'add') -> Linear(hidden) (ReLU between layers). Then dropout and Linear(num_classes) (official `proj`).

  Attributes:
    hidden: width H (official hid_dim).
    num_classes: output classes (2 for fraud).
    num_layers: message-passing layers (official n_layer = 1 on all data sets).
    dropout: before the head (official `dropout`).
    aggregation: 'sum' (default) or 'mean' for the PMP / SAGE convs.
    relation_agg: 'cat' (official), 'mean' or 'add'.
    input_proj: > 0 adds a linear input projection to this width first (not in the paper; used for the
      1,700/932-dimensional geom_gcn features so T_c stays small).
    conv: 'pmp', 'sage' or 'gcn'.
  """
  hidden: int = 48
  num_classes: int = 2
  num_layers: int = 1
  dropout: float = 0.0
  aggregation: str = "sum"
  relation_agg: str = "cat"
  input_proj: int = 0
  conv: str = "pmp"

  def _conv(self, layer: int) -> nn.Module:
    name = f"conv_{layer}"
    if self.conv == "pmp":
      return PMPLayer(self.hidden, num_classes=self.num_classes, aggregation=self.aggregation, name=name)
    if self.conv == "sage":
      return SAGELayer(self.hidden, aggregation=self.aggregation, name=name)
    if self.conv == "gcn":
      return GCNLayer(self.hidden, name=name)
    raise ValueError(f"unknown conv '{self.conv}'; choose one of {CONVS}.")

  @nn.compact
  def __call__(self, graphs: Sequence[GraphsTuple], x: jax.Array, label_state: jax.Array,
               train: bool = False) -> jax.Array:
    """Logits of every node.

    Args:
      graphs: R relation graphs over the same (padded) node set.
      x: [N, F] node features.
      label_state: [N] int, training labels (0..C-1) or C for unknown (val/test/unlabelled/padding).
      train: enables dropout (needs a 'dropout' rng).

    Returns:
      [N, num_classes] logits.
    """
    if not graphs:
      raise ValueError("RelationalGNN needs at least one relation graph.")
    if self.relation_agg not in RELATION_AGGS:
      raise ValueError(f"unknown relation_agg '{self.relation_agg}'; choose one of {RELATION_AGGS}.")
    h = x
    if self.input_proj:
      h = TorchDense(self.input_proj, name="input_proj")(h)  # Deviation: not in the paper (see docstring).
    for layer in range(self.num_layers):
      conv = self._conv(layer)  # Shared by all relations, as in the official code.
      outs = [conv(g, h, label_state) for g in graphs]
      if self.relation_agg == "cat":
        h = jnp.concatenate(outs, axis=-1)
      elif self.relation_agg == "mean":
        h = jnp.mean(jnp.stack(outs), axis=0)
      else:
        h = jnp.sum(jnp.stack(outs), axis=0)
      h = TorchDense(self.hidden, name=f"relation_mlp_{layer}")(h)
      if layer != self.num_layers - 1:
        h = jax.nn.relu(h)
    h = nn.Dropout(self.dropout, deterministic=not train)(h)
    return TorchDense(self.num_classes, name="proj")(h)


class PMP(RelationalGNN):
  """PMP (official LASAGE_S): RelationalGNN with the partitioning conv."""
  conv: str = "pmp"


class GraphSAGE(RelationalGNN):
  """GraphSAGE baseline in the same wrapper (official GraphSAGE_DGL structure)."""
  conv: str = "sage"


class GCN(RelationalGNN):
  """GCN baseline in the same wrapper."""
  conv: str = "gcn"


MODELS = {"pmp": PMP, "sage": GraphSAGE, "gcn": GCN}


def create_model(model_config: Any, num_classes: int = 2) -> RelationalGNN:
  """Builds PMP / GraphSAGE / GCN from `config.model` (name, hidden, num_layers, dropout, aggregation,
  relation_agg, input_proj)."""
  name = model_config.get("name", "pmp")
  if name not in MODELS:
    raise ValueError(f"unknown model.name '{name}'; choose one of {sorted(MODELS)}.")
  return MODELS[name](hidden=int(model_config.get("hidden", 48)), num_classes=num_classes,
                      num_layers=int(model_config.get("num_layers", 1)),
                      dropout=float(model_config.get("dropout", 0.0)),
                      aggregation=model_config.get("aggregation", "sum"),
                      relation_agg=model_config.get("relation_agg", "cat"),
                      input_proj=int(model_config.get("input_proj", 0) or 0))
