"""Co-Boosting's losses: the weighted ensemble, hard-sample CE, the adversarial KL and the KD loss.

Names follow the paper (arXiv 2402.15070: L_H, L_A, the weighted ensemble); every formula was checked against
the official code (`datafree/synthesis/coboost.py`, `datafree_kd.py`, `utils_fl.WEnsemble`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import checks


def _check_logits_pair(where: str, student_logits, teacher_logits, temperature) -> object:
  checks.shapes(where, student_logits=(student_logits, "... K"), teacher_logits=(teacher_logits, "... K"))
  if np.shape(student_logits) != np.shape(teacher_logits):
    raise checks.ShapeError(f"{where}: student_logits {np.shape(student_logits)} and teacher_logits "
                            f"{np.shape(teacher_logits)} must have one shape.")
  return checks.in_range(where, "temperature", temperature, 0.0, None, low_open=True,
                         hint="the distillation temperature T.")


def ensemble_logits(client_logits: jax.Array, weights: jax.Array) -> jax.Array:
  """The weighted ensemble f_ens(x) = sum_k w_k f_k(x) / sum_k w_k (official `WEnsemble`).

  Logits (not probabilities) are averaged, and the weights are normalised by their sum inside the
  ensemble, so only their ratios matter (the official update keeps them in [0, 1] without renormalising).

  Args:
    client_logits: [C, B, K].
    weights: [C], non-negative with a positive sum.

  Returns:
    Ensemble logits [B, K] (NaN under jit for negative weights; eager calls raise).
  """
  where = "coboosting.ensemble_logits"
  checks.shapes(where, client_logits=(client_logits, "C B K"), weights=(weights, "C"))
  ok = checks.require(where, checks.xp(weights).asarray(weights) >= 0, checks.HyperparameterError,
                      "weights must be >= 0 (only their ratios matter).")
  total = jnp.sum(weights)
  # Guard: all-zero weights give 0 logits (a uniform prediction) instead of the official 0/0 = NaN.
  total = jnp.where(total > 0, total, 1.0)
  # official: rong-dai/Co-Boosting@b95d715 utils_fl.py:80-81 (WEnsemble.forward)
  return checks.poison(jnp.tensordot(weights.astype(client_logits.dtype), client_logits, axes=1) / total, ok)


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Per-example softmax cross-entropy [B] of logits [B, K] against integer labels [B]."""
  logp = jax.nn.log_softmax(logits, axis=-1)
  return -jnp.take_along_axis(logp, labels[:, None].astype(jnp.int32), axis=-1)[:, 0]


def hard_sample_loss(logits: jax.Array, labels: jax.Array, hardness: float = 1.0) -> jax.Array:
  """Hardness-weighted CE of the ensemble, L_H = mean_i (1 - p_ens(y_i|x_i))^h * CE_i (paper's L_H).

  The weight (1 - p)^h is a constant (detached, as in the official `p.detach()`): it re-weights examples
  by how hard they are for the ensemble but is not itself minimised. h = 0 is plain CE (DENSE).

  Args:
    logits: ensemble logits [B, K].
    labels: target classes [B].
    hardness: h >= 0 (official `--hs`, default 1); a float or a traced scalar.

  Returns:
    Scalar loss (NaN under jit for labels outside [0, K) or a traced hardness < 0; eager calls raise).
  """
  where = "coboosting.hard_sample_loss"
  checks.shapes(where, logits=(logits, "B K"), labels=(labels, "B"))
  checks.dtype(where, "labels", labels, "integer")
  ok = checks.all_ok(checks.indices(where, "labels", labels, logits.shape[1], "class ids of the logits."),
                     checks.in_range(where, "hardness", hardness, 0.0, None, hint="h >= 0 (official --hs 1)."))
  # official: rong-dai/Co-Boosting@b95d715 datafree/synthesis/coboost.py:103-108 (L_H)
  p_y = jnp.exp(-cross_entropy(jax.lax.stop_gradient(logits), labels))
  weight = jnp.power(1.0 - p_y, hardness)  # 0^0 = 1: h = 0 gives plain CE even where p_y = 1
  return checks.poison(jnp.mean(weight * cross_entropy(logits, labels)), ok)


def kl_divergence(student_logits: jax.Array, teacher_logits: jax.Array, temperature: float) -> jax.Array:
  """Per-example KL(softmax(t/T) || softmax(s/T)) * T^2 [B] (the official `dense_kldiv` / `KLDiv` summand).

  Args:
    student_logits, teacher_logits: [..., K] of one shape.
    temperature: T > 0 (a Python number is checked at once; a traced one gives NaN when <= 0).

  Returns:
    [...] KL values.
  """
  ok = _check_logits_pair("coboosting.kl_divergence", student_logits, teacher_logits, temperature)
  return checks.poison(_kl(student_logits, teacher_logits, temperature), ok)


def _kl(student_logits, teacher_logits, temperature):
  log_q = jax.nn.log_softmax(student_logits / temperature, axis=-1)
  log_p = jax.nn.log_softmax(teacher_logits / temperature, axis=-1)
  p = jnp.exp(log_p)
  # official: rong-dai/Co-Boosting@b95d715 datafree/utils/_utils.py:395-398 (dense_kldiv)
  return jnp.sum(p * (log_p - log_q), axis=-1) * temperature ** 2


def adversarial_loss(student_logits: jax.Array, teacher_logits: jax.Array, temperature: float = 3.0,
                     mask: jax.Array | None = None) -> jax.Array:
  """The generator's adversarial term L_A = -mean_i KL(p_ens || p_server)_i at temperature T (paper's L_A).

  Minimising it pushes synthetic samples to where the server disagrees with the ensemble. The official
  code computes `dense_kldiv(s_out, t_out, T=3)`, i.e. KL(ensemble || server) * T^2, summed over classes
  and averaged over the batch, with gradients through both networks' logits (w.r.t. the inputs).

  Args:
    student_logits: server logits [B, K].
    teacher_logits: ensemble logits [B, K].
    temperature: T (official 3).
    mask: optional [B] weights; DENSE multiplies by 1[argmax server != argmax ensemble] (still dividing
      by B, as the official `.mean()` does).

  Returns:
    Scalar loss (<= 0).
  """
  checks.shapes("coboosting.adversarial_loss", student_logits=(student_logits, "B K"), mask=(mask, "B"))
  kl = kl_divergence(student_logits, teacher_logits, temperature)
  if mask is not None:
    kl = kl * mask
  # official: rong-dai/Co-Boosting@b95d715 datafree/synthesis/coboost.py:112 (L_A)
  return -jnp.mean(kl)


def disagreement_mask(student_logits: jax.Array, teacher_logits: jax.Array) -> jax.Array:
  """DENSE's mask [B]: 1 where the server's and the ensemble's top classes differ."""
  return (jnp.argmax(student_logits, -1) != jnp.argmax(teacher_logits, -1)).astype(student_logits.dtype)


def kd_loss(student_logits: jax.Array, teacher_logits: jax.Array, temperature: float = 4.0) -> jax.Array:
  """Distillation loss: batch-mean KL(softmax(t/T) || softmax(s/T)) * T^2 (official `KLDiv(T=kd_T)`)."""
  # official: rong-dai/Co-Boosting@b95d715 datafree_kd.py:331 (KLDiv(T=kd_T))
  return jnp.mean(kl_divergence(student_logits, jax.lax.stop_gradient(teacher_logits), temperature))
