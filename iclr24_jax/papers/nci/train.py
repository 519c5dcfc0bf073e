"""Train steps: one shared step structure, three model losses (NCI, ERM, DANN); evaluation."""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from iclr24_jax.papers.nci import losses
from iclr24_jax.papers.nci.model import AdversarialState, Networks

MODEL_LOSSES = {"nci": losses.loss_fn, "erm": losses.erm_model_loss, "dann": losses.dann_model_loss}


def _check(source_x: jax.Array, source_y: jax.Array, target_x: jax.Array) -> None:
  if source_x.ndim != 5 or source_y.shape != source_x.shape[:2]:
    raise ValueError(f"source_x must be [K, B, H, W, C] and source_y [K, B]; got {source_x.shape} and "
                     f"{source_y.shape}.")
  if target_x.ndim != 4 or target_x.shape[1:] != source_x.shape[2:]:
    raise ValueError(f"target_x must be [B_t, H, W, C] matching the source images {source_x.shape[2:]}; got "
                     f"{target_x.shape}.")


def _as_arrays(source_batches: Any) -> tuple[jax.Array, jax.Array]:
  """Accepts {'x': [K, B, ...], 'y': [K, B]} or a list of (x, y) per source domain."""
  if isinstance(source_batches, dict):
    return source_batches["x"], source_batches["y"]
  xs, ys = zip(*source_batches)
  return jnp.stack(xs), jnp.stack(ys)


def dann_lambda(step: jax.Array, num_steps: int) -> jax.Array:
  """Ganin et al. (2016)'s DANN ramp 2 / (1 + exp(-10 p)) - 1, p = step / num_steps (0 -> 1)."""
  p = jnp.clip(step / max(num_steps, 1), 0.0, 1.0)
  return 2.0 / (1.0 + jnp.exp(-10.0 * p)) - 1.0


def _step(state: AdversarialState, source_batches: Any, target_batch: Any, key: jax.Array, *, nets: Networks,
          method: str, adv_weight: float, ramp_steps: int | None = None) -> tuple[AdversarialState, dict]:
  del key  # no stochastic layers; kept for the library's step signature
  if ramp_steps:  # Ganin et al.'s ramp on lambda (DANN's schedule; with schedule='ramp' NCI's too)
    adv_weight = adv_weight * dann_lambda(state.step, ramp_steps)
  source_x, source_y = _as_arrays(source_batches)
  target_x = target_batch["x"] if isinstance(target_batch, dict) else target_batch
  _check(source_x, source_y, target_x)
  params = state.params
  # 1) Discriminator step on frozen features of the current featurizer (official update order).
  feats_s, _ = nets.features_and_logits(params["model"], source_x)
  feats_t, _ = nets.features_and_logits(params["model"], target_x)
  (_, d_metrics), d_grads = jax.value_and_grad(losses.discriminator_loss, has_aux=True)(
      params["disc"], nets, feats_s, feats_t)
  d_updates, d_opt = state.tx_disc.update(d_grads, state.opt_state["disc"], params["disc"])
  disc = optax.apply_updates(params["disc"], d_updates)
  # 2) Featurizer + classifier step against the updated, fixed discriminator.
  loss_fn = MODEL_LOSSES[method]
  (_, m_metrics), m_grads = jax.value_and_grad(loss_fn, has_aux=True)(
      params["model"], disc, nets, source_x, source_y, target_x, adv_weight)
  m_updates, m_opt = state.tx_model.update(m_grads, state.opt_state["model"], params["model"])
  model = optax.apply_updates(params["model"], m_updates)
  new_state = state.replace(step=state.step + 1, params={"model": model, "disc": disc},
                            opt_state={"model": m_opt, "disc": d_opt})
  return new_state, {**m_metrics, **d_metrics}


def make_train_step(nets: Networks, method: str = "nci", adv_weight: float = 1.0,
                    dann_ramp_steps: int | None = None, ramp_steps: int | None = None) -> Callable:
  """Returns the pure `step(state, source_batches, target_batch, key) -> (state, metrics)` of a method.

  All three methods run exactly the same step (discriminator update, then featurizer/classifier
  update with the new discriminator); only the model loss differs. ERM's discriminator is trained too,
  as a probe of how separable the domains are, but never influences the model.

  Args:
    nets: the networks.
    method: 'nci', 'dann' or 'erm'.
    adv_weight: lambda of the adversarial term.
    dann_ramp_steps: for DANN only, scale lambda by Ganin et al.'s ramp over this many steps (the original
      DANN schedule; without it the K+1-way gradient reversal collapses the features early here).
    ramp_steps: scale lambda by the same ramp for every method (NCI and DANN on one schedule, issue 30);
      overrides dann_ramp_steps.
  """
  if method not in MODEL_LOSSES:
    raise ValueError(f"unknown method '{method}'; choose one of {sorted(MODEL_LOSSES)}.")
  ramp = ramp_steps if ramp_steps is not None else (dann_ramp_steps if method == "dann" else None)

  def step(state: AdversarialState, source_batches: Any, target_batch: Any, key: jax.Array):
    return _step(state, source_batches, target_batch, key, nets=nets, method=method, adv_weight=adv_weight,
                 ramp_steps=ramp)

  step.__name__ = f"{method}_step"
  return step


make_step = make_train_step  # Deprecated alias, kept one release.


def train_step(state: AdversarialState, source_batches: Any, target_batch: Any, key: jax.Array, *, nets: Networks,
               adv_weight: float = 1.0) -> tuple[AdversarialState, dict]:
  """One NCI step. source_batches: {'x': [K, B, H, W, C], 'y': [K, B]} or [(x, y)] * K; target [B_t, ...]."""
  return _step(state, source_batches, target_batch, key, nets=nets, method="nci", adv_weight=adv_weight)


def erm_step(state, source_batches, target_batch, key, *, nets: Networks, adv_weight: float = 1.0):
  """One ERM step (same structure, no adversarial term)."""
  return _step(state, source_batches, target_batch, key, nets=nets, method="erm", adv_weight=adv_weight)


def dann_step(state, source_batches, target_batch, key, *, nets: Networks, adv_weight: float = 1.0,
              ramp_steps: int | None = None):
  """One DANN step (same structure, gradient-reversal loss on sources and target)."""
  return _step(state, source_batches, target_batch, key, nets=nets, method="dann", adv_weight=adv_weight,
               ramp_steps=ramp_steps)


def evaluate(nets: Networks, params: Any, x: np.ndarray, y: np.ndarray, batch_size: int = 1024) -> float:
  """Accuracy of the classifier on images x [N, H, W, C] with labels y [N]."""
  fwd = jax.jit(lambda p, xb: jnp.argmax(nets.features_and_logits(p, xb)[1], -1))
  correct = 0
  for s in range(0, len(x), batch_size):
    correct += int(jnp.sum(fwd(params["model"], x[s:s + batch_size]) == y[s:s + batch_size]))
  return correct / max(len(x), 1)
