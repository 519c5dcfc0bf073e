"""One-shot clients: local models trained once on their own partition, then frozen (official `fl_pretrain.py`).

Each client trains from its own initialisation (official: a copy of one global init; see `train_clients`)
with SGD(lr 0.01, momentum 0.9), batch 128, gradient norm clipped to 10, for `local_epochs` epochs over its
data. A jitted step is compiled once per client architecture and reused across clients and seeds.
"""
from __future__ import annotations

import functools
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from iclr24_jax.common.optim import make_optimizer
from iclr24_jax.papers.coboosting.model import ClientSet, stack_params
from iclr24_jax.vision import classify


def client_tx(name: str, learning_rate: float, momentum: float, grad_clip: float,
              weight_decay: float) -> optax.GradientTransformation:
  """The local optimizer (`make_optimizer`: equal settings give the same object, so compiled steps are reused)."""
  cfg = ml_collections.ConfigDict(dict(name=name, learning_rate=learning_rate, momentum=momentum,
                                       grad_clip=grad_clip, weight_decay=weight_decay, schedule="constant"))
  return make_optimizer(cfg, 1)


@functools.lru_cache(maxsize=None)   # one jitted closure per (model, optimizer): jit caches by function identity
def _jitted_step(model: nn.Module, tx: optax.GradientTransformation):
  return jax.jit(classify.make_train_step(model), donate_argnums=(0,))


@functools.lru_cache(maxsize=None)   # one jitted closure per (model, optimizer, shape): jit caches by identity
def _jitted_init(model: nn.Module, tx: optax.GradientTransformation, input_shape: tuple[int, ...]):
  return jax.jit(functools.partial(classify.init, model=model, input_shape=input_shape, tx=tx))


def _client_batches(n: int, batch_size: int, epochs: int, rng: np.random.Generator):
  """Fixed-size minibatches of one client's rows: `epochs` shuffled passes (a short client wraps around)."""
  steps = max(1, -(-n // batch_size))
  for _ in range(epochs):
    perm = np.resize(rng.permutation(n), steps * batch_size)
    for i in range(steps):
      yield perm[i * batch_size:(i + 1) * batch_size]


def train_clients(models: Sequence[nn.Module], x: np.ndarray, y: np.ndarray, parts: Sequence[np.ndarray],
                  key: jax.Array, *, local_epochs: int, batch_size: int, optimizer: Any, vmap: bool = True,
                  same_init: bool = True) -> tuple[ClientSet, Any]:
  """Trains one model per client on its rows, once (one-shot FL: they are never trained again).

  Args:
    models: one Linen classifier per client (equal objects = identical architectures -> stacked params).
    x, y: the training set [N, ...], [N].
    parts: per-client index arrays (e.g. from `dirichlet_partition`).
    key: randomness of initialisation and batch order.
    local_epochs: passes over each client's data (official 100).
    batch_size: local batch size (official 128).
    optimizer: ConfigDict/dict with name, learning_rate, momentum, grad_clip, weight_decay.
    vmap: how a stacked ClientSet evaluates its clients (see `ClientSet.vmap`).
    same_init: clients of one architecture start from the same initial params (official: deep copies of one
      global model, which is also what makes one-round FedAvg meaningful); False gives each its own init.

  Returns:
    (ClientSet, client params): stacked params [C, ...] when every model is the same, else a tuple.

  Raises:
    ValueError: when the numbers of models and partitions differ, a partition is empty, or a client model
      carries batch statistics (not supported: clients are evaluated from their params alone).
  """
  if len(models) != len(parts):
    raise ValueError(f"{len(models)} client models for {len(parts)} partitions.")
  if any(len(p) == 0 for p in parts):
    raise ValueError("a client partition is empty; use fewer clients or a larger alpha.")
  tx = client_tx(str(optimizer.get("name", "sgd")), float(optimizer.get("learning_rate", 0.01)),
                 float(optimizer.get("momentum", 0.9)), float(optimizer.get("grad_clip", 10.0)),
                 float(optimizer.get("weight_decay", 0.0)))
  input_shape = tuple(x.shape[1:])
  key_init, key_train = jax.random.split(key)
  seed = int(np.asarray(jax.random.bits(jax.random.fold_in(key_train, 0), (), dtype=np.uint32)))
  params = []
  for c, (model, idx) in enumerate(zip(models, parts)):
    k_init = key_init if same_init else jax.random.fold_in(key_init, c)
    state = _jitted_init(model, tx, input_shape)(k_init)
    if state.extra:
      raise ValueError("client models with batch statistics are not supported; use norm='group'/'none'.")
    step = _jitted_step(model, tx)
    xc, yc = np.asarray(x[idx]), np.asarray(y[idx])
    k_c = jax.random.fold_in(key_train, c)
    rng = np.random.default_rng([seed, c])
    for b in _client_batches(len(idx), batch_size, local_epochs, rng):
      state, _ = step(state, {"x": xc[b], "y": yc[b]}, k_c)
    params.append(state.params)
  if all(m == models[0] for m in models):
    return ClientSet((models[0],), len(models), stacked=True, vmap=vmap), stack_params(params)
  return ClientSet(tuple(models), len(models), stacked=False), tuple(params)


def client_accuracies(clients: ClientSet, params: Any, x: np.ndarray, y: np.ndarray) -> np.ndarray:
  """Test accuracy of every client [C]."""
  logits = np.asarray(jax.jit(clients.logits)(params, jnp.asarray(x)))
  return np.mean(np.argmax(logits, -1) == np.asarray(y)[None], axis=1)
