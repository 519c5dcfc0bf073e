"""Models of a conceptual safeguard: concept detectors, their calibration, and the front-end model.

- Concept detectors p_k(x) (official `models/concept_model.py`, `MLPConceptModel`): one small MLP per concept
  (one hidden layer of 100 ReLU units, BCE loss, Adam). `ConceptMLP` holds the K independent MLPs as one module
  (`nn.vmap` over concepts), so training them together is the same as training them one by one. For images
  the detector is `iclr24_jax.vision` CNN with K sigmoid outputs (Deviation: the official image detectors are
  per-concept MLPs on a frozen pretrained embedding; here a shared CNN trunk is trained on the concepts).
- Calibration (official: `CalibratedClassifierCV(method='sigmoid', cv='prefit')` fit on the validation split):
  Platt scaling per concept, p_k = sigmoid(a_k * logit_k + b_k), fitted by Newton's method on the validation
  logits; 'temperature' fits a_k only (b_k = 0). Deviation: scikit-learn's Platt uses Platt's smoothed targets
  (N+ + 1)/(N+ + 2); we fit the plain 0/1 targets.
- Front end f(c) (official `ConceptBottleneckModel.fit_y_model`): logistic regression on the TRUE training
  concepts with scikit-learn's default L2 objective 0.5 |w|^2 + C sum log-loss (C = 1, intercept unpenalised),
  minimised by Newton's method (matches scikit-learn's coefficients; tested).
"""
from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax

from iclr24_jax.common.train_state import TrainState
from iclr24_jax.vision import classify
from iclr24_jax.vision.models import CNN


class _OneHiddenMLP(nn.Module):
  hidden: int

  @nn.compact
  def __call__(self, x):
    h = nn.relu(nn.Dense(self.hidden)(x))
    return nn.Dense(1)(h)[..., 0]


class ConceptMLP(nn.Module):
  """K independent one-hidden-layer MLP detectors: [B, D] (or [B, ...] flattened) -> logits [B, K].

  Attributes:
    num_concepts: K.
    hidden: hidden width of each detector (official default 100).
  """

  num_concepts: int
  hidden: int = 100

  @nn.compact
  def __call__(self, x, train: bool = False, return_features: bool = False):
    del train
    h = x.reshape(x.shape[0], -1)
    per_concept = nn.vmap(_OneHiddenMLP, variable_axes={"params": 0}, split_rngs={"params": True},
                          in_axes=None, out_axes=-1, axis_size=self.num_concepts)
    logits = per_concept(self.hidden, name="detectors")(h)
    return (logits, h) if return_features else logits


def create_detector(model_config: Any, num_concepts: int) -> nn.Module:
  """Concept detector from `config.model` (name: 'concept_mlp' | 'cnn')."""
  name = model_config.get("name", "concept_mlp")
  if name == "concept_mlp":
    return ConceptMLP(num_concepts, hidden=int(model_config.get("hidden", 100)))
  if name == "cnn":
    return CNN(num_concepts, features=tuple(model_config.get("features", (32, 64))),
               dense=int(model_config.get("dense", 128)), dropout=float(model_config.get("dropout", 0.0)))
  raise ValueError(f"unknown detector model.name '{name}'; choose 'concept_mlp' or 'cnn'.")


def detector_loss(params: Any, extra: Any, model: nn.Module, batch: dict, key: jax.Array):
  """Mean binary cross-entropy over instances and concepts.

  Args:
    params, extra: detector variables.
    model: the detector.
    batch: {'x': [B, ...], 'c': [B, K] binary concepts}.
    key: dropout key.

  Returns:
    (loss, (metrics, new_extra)).
  """
  logits, new_extra = classify.apply_model(model, params, extra, batch["x"], train=True, key=key)
  loss = jnp.mean(optax.sigmoid_binary_cross_entropy(logits, batch["c"]))
  acc = jnp.mean((logits > 0) == (batch["c"] > 0.5))
  return loss, ({"loss": loss, "concept_accuracy": acc}, new_extra)


def make_detector_train_step(model: nn.Module) -> Callable:
  """Returns the pure `train_step(state, batch, key) -> (state, metrics)` of the concept detectors."""

  def train_step(state: TrainState, batch: dict, key: jax.Array):
    key = jax.random.fold_in(key, state.step)
    (_, (metrics, new_extra)), grads = jax.value_and_grad(detector_loss, has_aux=True)(
        state.params, state.extra, model, batch, key)
    return state.apply_gradients(grads, extra=new_extra), metrics

  return train_step


def newton_minimize(loss_fn: Callable[[Any], jax.Array], init_params: Any, num_iters: int = 25,
                    ridge: float = 1e-6) -> Any:
  """Minimises a smooth convex loss of a few parameters by damped Newton steps (`lax.scan`).

  Each iteration solves (H + ridge I) d = g on the flattened parameters and takes the best of the step sizes
  1, 1/2, 1/4, 1/8 (never increasing the loss), so it is safe on nearly separable data. Logistic regression on
  K concepts (K + 1 parameters) and Platt scaling (2 parameters) converge to machine precision in ~10 steps,
  and compile in a fraction of the time L-BFGS with a line search takes.

  Args:
    loss_fn: params -> scalar.
    init_params: starting point (any pytree of float arrays).
    num_iters: Newton iterations.
    ridge: diagonal added to the Hessian.

  Returns:
    The final params.
  """
  flat0, unravel = jax.flatten_util.ravel_pytree(init_params)

  def flat_loss(v):
    return loss_fn(unravel(v))

  grad_fn, hess_fn = jax.grad(flat_loss), jax.hessian(flat_loss)
  steps = jnp.asarray([1.0, 0.5, 0.25, 0.125], flat0.dtype)

  def body(v, _):
    g, h = grad_fn(v), hess_fn(v)
    d = jnp.linalg.solve(h + ridge * jnp.eye(v.shape[0], dtype=v.dtype), g)
    cands = v[None] - steps[:, None] * d[None]                       # [4, P]
    losses = jax.vmap(flat_loss)(jnp.concatenate([cands, v[None]]))   # the last candidate: stay
    best = jnp.argmin(jnp.where(jnp.isfinite(losses), losses, jnp.inf))
    return jnp.concatenate([cands, v[None]])[best], None

  flat, _ = jax.lax.scan(body, flat0, None, length=num_iters)
  return unravel(flat)


def front_end_loss(params: Any, concepts: jax.Array, y: jax.Array, inverse_c: float = 1.0) -> jax.Array:
  """scikit-learn's L2 logistic objective divided by N: mean log-loss + |w|^2 / (2 C N).

  Args:
    params: {'w': [K], 'b': []}.
    concepts: [N, K] binary concepts.
    y: [N] binary labels.
    inverse_c: 1 / C (scikit-learn's regularisation strength C; 0 = unregularised).

  Returns:
    Scalar loss.
  """
  logits = concepts @ params["w"] + params["b"]
  nll = jnp.mean(optax.sigmoid_binary_cross_entropy(logits, y.astype(logits.dtype)))
  return nll + 0.5 * inverse_c * jnp.sum(params["w"] ** 2) / concepts.shape[0]


def fit_front_end(concepts: jax.Array, y: jax.Array, inverse_c: float = 1.0, num_iters: int = 25) -> dict:
  """Fits the logistic-regression front end f(c) = sigmoid(w . c + b) on binary concepts.

  Args:
    concepts: [N, K] true training concepts.
    y: [N] binary targets.
    inverse_c: 1 / C of scikit-learn's LogisticRegression (default C = 1).
    num_iters: Newton iterations.

  Returns:
    {'w': [K], 'b': []}.
  """
  concepts = jnp.asarray(concepts, jnp.float32)
  if concepts.ndim != 2 or np.shape(y) != concepts.shape[:1]:
    raise ValueError(f"fit_front_end needs concepts [N, K] and y [N]; got {concepts.shape} and {np.shape(y)}.")
  y = jnp.asarray(y, jnp.float32)
  init = {"w": jnp.zeros((concepts.shape[1],), jnp.float32), "b": jnp.zeros((), jnp.float32)}
  return newton_minimize(lambda p: front_end_loss(p, concepts, y, inverse_c), init, num_iters)


def fit_calibration(logits: jax.Array, targets: jax.Array, method: str = "platt", num_iters: int = 25) -> dict:
  """Fits per-column Platt (a * logit + b) or temperature (a * logit) scaling by Newton's method.

  Args:
    logits: [N, K] uncalibrated logits on the calibration split.
    targets: [N, K] binary labels.
    method: 'platt', 'temperature' or 'none'.
    num_iters: Newton iterations.

  Returns:
    {'a': [K], 'b': [K]} (identity for 'none').
  """
  logits = jnp.asarray(logits, jnp.float32)
  targets = jnp.asarray(targets, jnp.float32)
  if logits.ndim != 2 or logits.shape != targets.shape:
    raise ValueError(f"fit_calibration needs matching [N, K] logits and targets; got {logits.shape}, "
                     f"{targets.shape}.")
  k = logits.shape[1]
  ident = {"a": jnp.ones((k,), jnp.float32), "b": jnp.zeros((k,), jnp.float32)}
  if method == "none":
    return ident
  if method not in ("platt", "temperature"):
    raise ValueError(f"unknown calibration method '{method}'; choose 'platt', 'temperature' or 'none'.")

  def fit_one(z, t):   # one concept: 2 (or 1) parameters, columns are independent problems
    def loss(params):
      b = params["b"] if method == "platt" else 0.0
      return jnp.mean(optax.sigmoid_binary_cross_entropy(params["a"] * z + b, t))
    init = {"a": jnp.ones((), jnp.float32), "b": jnp.zeros((), jnp.float32)}
    if method == "temperature":
      out = newton_minimize(lambda q: loss({"a": q, "b": 0.0}), init["a"], num_iters)
      return {"a": out, "b": jnp.zeros((), jnp.float32)}
    return newton_minimize(loss, init, num_iters)

  return jax.vmap(fit_one, in_axes=(1, 1))(logits, targets)


def calibrated_probs(logits: jax.Array, calibration: dict) -> jax.Array:
  """[N, K] logits -> [N, K] calibrated probabilities sigmoid(a * logit + b)."""
  return jax.nn.sigmoid(calibration["a"] * logits + calibration["b"])
