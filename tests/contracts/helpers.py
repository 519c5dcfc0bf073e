"""Shared small inputs and the harness of the contract tests (one test module per family of inputs).

A case calls one public function on one bad (or accepted-variant) input and states what the contract promises:

  Structural(error)  the named error in every mode (eager, jit, vmap, checked): shapes, dtypes, static args,
                     Python-number hyperparameters, empty batches.
  Value(error)       eagerly and under `iclr24_jax.checked` the named error; under jax.jit and jax.vmap the
                     output is poisoned (`poisoned(out)`: NaN, or the documented -1 / bool sentinel).
  Accepted(check)    a valid variant (leading batch dims, -inf log-probs, budget 0 ...): every mode returns an
                     output that passes `check` and agrees across modes.

Functions are built once per module (`functools.lru_cache`) and every mode compiles once per function and shape,
so the whole contract suite costs a few compiles per public function.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import iclr24_jax
from iclr24_jax.common import checks

F32 = np.float32


# ----------------------------------------------------------------------------------------------------- outcomes


def all_nan(out: Any) -> bool:
  """Every floating leaf is entirely NaN (the poison of a value check)."""
  leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(out)]
  floats = [x for x in leaves if np.issubdtype(x.dtype, np.floating)]
  return bool(floats) and all(np.isnan(x).all() for x in floats)


def has_nan(out: Any) -> bool:
  """Some floating leaf has a NaN (a NaN input propagated, as documented)."""
  return any(np.isnan(np.asarray(x)).any() for x in jax.tree_util.tree_leaves(out)
             if np.issubdtype(np.asarray(x).dtype, np.floating))


def all_equal(value) -> Callable[[Any], bool]:
  """The documented sentinel of an integer / bool output (every entry equal to `value`)."""
  return lambda out: all(bool(np.all(np.asarray(x) == value)) for x in jax.tree_util.tree_leaves(out))


@dataclasses.dataclass(frozen=True)
class Structural:
  error: type


@dataclasses.dataclass(frozen=True)
class Value:
  error: type
  poisoned: Callable[[Any], bool] = all_nan


@dataclasses.dataclass(frozen=True)
class Accepted:
  check: Callable[[Any], bool] = lambda out: True


@dataclasses.dataclass(frozen=True)
class Case:
  id: str
  fn: Any                         # (builder, name): builder()[name] takes only array arguments (statics closed
                                  # over); shared by the cases of one function, so each mode compiles once
  args: Callable[[], tuple]       # built lazily, so collecting the tests costs nothing
  expect: Any


MODES = ("eager", "jit", "vmap", "checked")
_COMPILED: dict = {}


def _compiled(ref, mode):
  key = (ref, mode)
  if key not in _COMPILED:
    builder, name = ref
    fn = builder()[name]
    if mode == "jit":
      _COMPILED[key] = jax.jit(fn)
    elif mode == "vmap":
      _COMPILED[key] = jax.jit(jax.vmap(fn))
    elif mode == "checked":
      _COMPILED[key] = iclr24_jax.checked(fn)
    else:
      _COMPILED[key] = fn
  return _COMPILED[key]


def _stack2(tree):
  return jax.tree_util.tree_map(lambda a: np.stack([np.asarray(a)] * 2), tree)


def call(case: Case, mode: str):
  args = case.args()
  if mode == "vmap":
    args = tuple(_stack2(a) for a in args)
  out = _compiled(case.fn, mode)(*args)
  return jax.block_until_ready(out)


def check_case(case: Case, mode: str) -> None:
  """Asserts the case's contract in one mode."""
  exp = case.expect
  if isinstance(exp, Structural) or (isinstance(exp, Value) and mode in ("eager", "checked")):
    with pytest.raises(exp.error) as info:
      call(case, mode)
    assert isinstance(info.value, checks.ContractError), type(info.value)
    msg = str(info.value)
    assert len(msg) > 20 and ":" in msg, msg      # names the function and says what was expected
    return
  out = call(case, mode)
  if isinstance(exp, Value):
    assert exp.poisoned(out), f"{case.id} [{mode}]: a bad value gave an unpoisoned output {out}"
    return
  assert not has_nan(out), f"{case.id} [{mode}]: NaN on a valid input"
  assert exp.check(out if mode != "vmap" else jax.tree_util.tree_map(lambda x: x[0], out)), (case.id, mode, out)


def params(cases: list[Case]) -> list:
  """pytest parameters: one per (case, mode)."""
  return [pytest.param(c, m, id=f"{c.id}-{m}") for c in cases for m in MODES]


# ----------------------------------------------------------------------------------------------------- inputs


@functools.lru_cache(None)
def safeguards():
  from iclr24_jax.papers import safeguards as sg
  front = {"w": jnp.array([1.0, -2.0, 0.5]), "b": jnp.array(0.1)}
  p = np.array([[0.2, 0.5, 0.9], [0.1, 0.3, 0.6]], F32)
  return dict(
      sg=sg, p=p,
      propagate=lambda p: sg.propagate(p, front),
      propagate_mc=lambda p: sg.propagate(p, front, method="mc", key=jax.random.key(0), num_samples=8),
      coverage=lambda y_bar, y, tau: sg.coverage_accuracy(y_bar, y, tau),
      coverage_08=lambda y_bar, y: sg.coverage_accuracy(y_bar, y, 0.8),
      coverage_03=lambda y_bar, y: sg.coverage_accuracy(y_bar, y, 0.3),
      confirm=lambda p: sg.confirm(p, front, jnp.array([True, True]), 1),
      choose=lambda y_bar, y, target: sg.choose_threshold(y_bar, y, target))


def with_entry(a, index, value):
  a = np.array(a, copy=True)
  a[index] = value
  return a


@functools.lru_cache(None)
def cpm_data():
  rng = np.random.default_rng(0)
  fa = rng.normal(size=(24, 3)).astype(F32)
  fb = rng.normal(size=(24, 3)).astype(F32)
  y = (fa[:, 0] - fb[:, 0] + 0.3 * rng.normal(size=24) > 0).astype(np.int32)
  return fa, fb, y


@functools.lru_cache(None)
def cpm():
  from iclr24_jax.papers import cpm as cpm_lib
  return dict(cpm=cpm_lib,
              fit=lambda a, b, y: cpm_lib.fit(a, b, y).weights,
              fit_c=lambda a, b, y, c: cpm_lib.fit(a, b, y, C=c).weights)


MESSAGE_LEN = 128       # >= 100 characters (the CNN's valid convolutions), short for speed


@functools.lru_cache(None)
def motif():
  from iclr24_jax.papers import motif as motif_lib
  model = motif_lib.RewardModel(embed_dim=4, hidden=4, trunk=8)
  p = jax.jit(lambda k: model.init(k, jnp.zeros((1, MESSAGE_LEN), jnp.uint8))["params"])(jax.random.key(0))
  rng = np.random.default_rng(0)
  m1 = rng.integers(0, 256, (3, MESSAGE_LEN)).astype(np.uint8)
  m2 = rng.integers(0, 256, (3, MESSAGE_LEN)).astype(np.uint8)

  def loss(x1, x2, y):
    return motif_lib.preference_loss(p, {"message_1": x1, "message_2": x2, "label": y}, model)[0]

  def loss_inferred(x1, x2, y):   # no model=: the network is built from the params' shapes
    return motif_lib.preference_loss(p, {"message_1": x1, "message_2": x2, "label": y})[0]

  def loss_pairs(m, pairs, y):
    return motif_lib.preference_loss(p, {"messages": m, "pairs": pairs, "label": y}, model)[0]

  return dict(motif=motif_lib, model=model, params=p, m1=m1, m2=m2, loss=loss, loss_inferred=loss_inferred,
              loss_pairs=loss_pairs)


def log_distributions(b=2, v=10, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(b, v))
  return (x - np.log(np.exp(x).sum(-1, keepdims=True))).astype(F32)


@functools.lru_cache(None)
def lm_inversion():
  from iclr24_jax.papers import lm_inversion as li
  return dict(li=li, unroll=lambda x: li.unroll(x, jnp.zeros(10), 4),
              unroll_width=lambda x, w: li.unroll(x, jnp.zeros(10), w),
              update=lambda u, x: li.update_unigram(u, x))


@functools.lru_cache(None)
def pmp():
  from iclr24_jax.common import graph as graph_lib
  from iclr24_jax.papers import pmp as pmp_lib
  layer = pmp_lib.PMPLayer(4)
  g0 = graph_lib.graph_from_edges([0], [1], 2)
  p = jax.jit(lambda k: layer.init(k, g0, jnp.ones((2, 3)), jnp.zeros((2,), jnp.int32))["params"])(
      jax.random.key(0))
  rng = np.random.default_rng(0)
  senders = rng.integers(0, 12, 30).astype(np.int32)
  receivers = rng.integers(0, 12, 30).astype(np.int32)
  h = rng.normal(size=(12, 3)).astype(F32)
  state = rng.integers(0, 3, 12).astype(np.int32)

  def graph(s, r):
    return graph_lib.GraphsTuple(nodes=None, edges=None, senders=s, receivers=r, n_node=jnp.array([12]),
                                 n_edge=jnp.array([s.shape[0]]), globals=None)

  def partition(s, r, h, state):
    return pmp_lib.partition_messages(graph(s, r), h, state, p)

  def sage(s, r, h):
    return pmp_lib.sage_messages(graph(s, r), h, {"self_kernel": jnp.ones((3, 4)), "self_bias": jnp.zeros(4),
                                                  "neigh_kernel": jnp.ones((3, 4))})

  return dict(pmp=pmp_lib, senders=senders, receivers=receivers, h=h, state=state, partition=partition, sage=sage,
              auc=lambda scores, labels: pmp_lib.auc_roc(scores, labels))


@functools.lru_cache(None)
def ldcq():
  from iclr24_jax.papers import ldcq as ldcq_lib
  q_net = ldcq_lib.QNetwork(8, (8, 8))
  tp = jax.jit(lambda k: ldcq_lib.twin_q_init(k, q_net, 3, 2))(jax.random.key(0))
  rng = np.random.default_rng(0)
  data = dict(r=rng.uniform(size=(4,)).astype(F32), s=rng.normal(size=(4, 3)).astype(F32),
              z=rng.normal(size=(4, 5, 2)).astype(F32), d=np.array([0, 1, 0, 0], F32))

  def target(r, s, z, d):
    return ldcq_lib.q_target(q_net, tp, r, s, z, d, discount=0.9)["targets"]

  def target_discount(r, s, z, d, g):
    return ldcq_lib.q_target(q_net, tp, r, s, z, d, discount=g)["targets"]

  def target_15(r, s, z, d):
    return ldcq_lib.q_target(q_net, tp, r, s, z, d, discount=1.5)["targets"]

  return dict(ldcq=ldcq_lib, data=data, target=target, target_discount=target_discount, target_15=target_15)


def ldcq_args(**over):
  d = dict(ldcq()["data"], **over)
  return d["r"], d["s"], d["z"], d["d"]


@functools.lru_cache(None)
def d2pruning():
  from iclr24_jax.papers import d2pruning as d2
  rng = np.random.default_rng(0)
  emb = rng.normal(size=(20, 4)).astype(F32)
  g = d2.knn_graph(emb, 3)
  scores = rng.uniform(size=(20,)).astype(F32)
  return dict(d2=d2, emb=emb, scores=scores,
              forward=lambda s: d2.forward_message_passing(g, s),
              forward_neg=lambda s: d2.forward_message_passing(g, s, gamma=-1.0),
              select=lambda s: d2.reverse_message_passing_select(g, s, 3),
              select0=lambda s: d2.reverse_message_passing_select(g, s, 0),
              kcenter0=lambda e: d2.kcenter_greedy(e, 0, jax.random.key(0)))


@functools.lru_cache(None)
def mdm():
  from iclr24_jax.diffusion import schedules
  from iclr24_jax.papers import mdm as mdm_lib
  block = dict(num_res_blocks=1, attention_levels=(), num_groups=2, scale_shift=True, mid_attention=False)
  level = dict(base_channels=2, channel_mults=(1,), **block)
  model = mdm_lib.make_model([level, level], num_classes=3)
  scheds = mdm_lib.level_schedules(schedules.squaredcos_cap_v2(20), 2, 2)
  p = jax.jit(lambda k: mdm_lib.init_params(k, model, (8, 8, 1)))(jax.random.key(0))
  x = np.random.default_rng(0).uniform(-1, 1, (2, 8, 8, 1)).astype(F32)

  def loss(x, y, **kw):
    return mdm_lib.loss_fn(p, {"x": x, "y": y}, jax.random.key(0), model=model, schedules=scheds, **kw)[0]

  return dict(mdm=mdm_lib, x=x, loss=loss, loss_drop2=lambda x, y: loss(x, y, cond_drop_prob=2.0),
              loss_plain=lambda x, y: loss(x, y))


@functools.lru_cache(None)
def fps():
  from iclr24_jax.diffusion import schedules
  from iclr24_jax.papers import fps as fps_lib
  op = fps_lib.Dense(np.array([[1.0, 0.5]]))
  sched = schedules.linear_beta_schedule(20)

  def den(x, t):
    return 0.1 * x

  return dict(fps=fps_lib,
              sample=lambda y, s: fps_lib.sample(jax.random.key(0), den, sched, op, y, s, 4, 4),
              resample=lambda lw: fps_lib.resample(jax.random.key(0), lw, "systematic"))


@functools.lru_cache(None)
def cdgm():
  from iclr24_jax.papers import cdgm as cdgm_lib
  cons = cdgm_lib.parse_constraints("y_0 - y_1 >= 0\ny_2 >= 1")
  layer = cdgm_lib.ConstraintLayer(cons, 3)
  x = np.array([[0.0, 1.0, 0.0], [2.0, 1.0, 3.0]], F32)
  through_jit = jax.jit(lambda l, v: l(v))
  return dict(cdgm=cdgm_lib, cons=cons, layer=layer, x=x, call=lambda v: layer(v),
              as_argument=lambda v: through_jit(layer, v))


@functools.lru_cache(None)
def lm():
  from iclr24_jax import lm as lm_lib
  from iclr24_jax.lm import scoring
  cfg = lm_lib.tiny_config(vocab_size=64)
  p = jax.jit(lambda k: lm_lib.init_params(k, cfg))(jax.random.key(0))
  return dict(cfg=cfg, choice=lambda pi, pm, oi, om: scoring.choice_logprobs_ids(p, cfg, pi, pm, oi, om),
              token=lambda ids: lm_lib.token_logprobs(p, cfg, ids))


@functools.lru_cache(None)
def families():
  """Small losses of the other papers and families (one compile each)."""
  from iclr24_jax.papers import coboosting, daclip, graphcare, unio4
  from iclr24_jax import rl
  sde = daclip.irsde_schedule(T=10)
  return dict(
      kd=lambda s, t, temp: coboosting.kd_loss(s, t, temp),
      hard=lambda logits, labels: coboosting.hard_sample_loss(logits, labels),
      expectile=lambda d: unio4.expectile_loss(d, 1.5),
      gae=lambda r, v, g: rl.gae(r, v, v, jnp.zeros_like(r), jnp.zeros_like(r), g, 0.95)[0],
      task_loss=lambda logits, labels: graphcare.task_loss(logits, labels, jnp.ones(labels.shape, bool), "binary"),
      irsde_std=lambda t: daclip.irsde_std(t, sde))
