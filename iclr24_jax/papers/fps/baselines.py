"""Baselines: DPS-style guidance (Chung et al., ICLR 2023) and plain unconditional DDIM.

DPS (Algorithm 1 of "Diffusion Posterior Sampling for General Noisy Inverse Problems"): each DDPM ancestral
step is followed by a gradient step on the measurement residual of the Tweedie estimate x0_hat(x_t),
  x_s = x_s' - zeta * grad_{x_t} || y - A x0_hat(x_t) ||,
where x_s' is the unconditional DDPM step. As in the official DPS code (`PosteriorSampling.conditioning`,
`p_sample_loop`: x_{t-1} = sample(x_t) - scale * grad_{x_t} ||y - A x0_hat(x_t)||), the gradient is of the residual
NORM (not its square), which equals the paper's step size zeta_i = zeta' / ||y - A x0|| on the squared norm up
to a factor 2, and x0_hat is the estimate the DDPM step uses, clipped when `clip_x0` is set (official
`clip_denoised=True`: the gradient flows through the clamp, zero where it saturates). The gradient runs through the
denoiser (a vector-Jacobian product). Each sample's own residual norm is used (the official batch is one image).
Deviation: the DDPM step's variance is beta-tilde (official DPS: ADM's learned-range variance).
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from iclr24_jax.diffusion import samplers
from iclr24_jax.papers.fps.operators import LinearOperator

Denoiser = Callable[[jax.Array, jax.Array], jax.Array]


def dps_step(denoiser: Denoiser, operator: LinearOperator, y: jax.Array, x_t: jax.Array, t: jax.Array,
             alpha_bar_t: jax.Array, alpha_bar_s: jax.Array, key: jax.Array, zeta: float, *,
             prediction: str = "eps", clip_x0: Any = None) -> tuple[jax.Array, jax.Array]:
  """One DPS step: DDPM ancestral step minus zeta times the gradient of ||y - A x0_hat(x_t)||.

  Args:
    denoiser: (x_t [B, ...], t [B]) -> prediction.
    operator: A.
    y: [*y_shape] the measurement (shared by the batch).
    x_t: [B, *x_shape]; t: scalar time; alpha_bar_t, alpha_bar_s: scalars.
    key: noise of the ancestral step.
    zeta: the step size (official DPS configs: 0.5 for inpainting, 0.3 for super-resolution and the blurs).
    prediction, clip_x0: the denoiser's output type; clipping of x0_hat in the ancestral step.

  Returns:
    (x_s [B, *x_shape], residual norms [B]).
  """
  t_b = jnp.broadcast_to(jnp.asarray(t), (x_t.shape[0],))

  def residual_norm(x):
    out = denoiser(x, t_b)
    tr = samplers.ddpm_transition(x, out, alpha_bar_t, alpha_bar_s, prediction=prediction, clip_x0=clip_x0)
    res = (y - operator.forward(tr.x0)).reshape(x.shape[0], -1)   # official: the step's (clipped) pred_xstart
    norms = jnp.sqrt(jnp.sum(res ** 2, -1) + 1e-12)
    return jnp.sum(norms), (tr, norms)

  (_, (tr, norms)), grad = jax.value_and_grad(residual_norm, has_aux=True)(x_t)
  return tr.sample(key) - zeta * grad, norms


def dps_sample(key: jax.Array, denoiser: Denoiser, schedule: Any, operator: LinearOperator, y: jax.Array,
               num_samples: int, num_steps: int | None, zeta: float = 1.0, *, prediction: str = "eps",
               clip_x0: Any = None, spacing: str | None = None) -> jax.Array:
  """DPS samples [num_samples, *x_shape] (independent chains, one `lax.scan` over the grid).

  On CPU a conv-net denoiser's backward pass is slow inside `lax.scan` (see the project brief); there, call
  `dps_step` from a Python loop over `diffusion.samplers.sampling_grid` instead (the experiment does).

  Args:
    key: split as `diffusion.samplers.split_sampler_keys`.
    denoiser, schedule, operator, y: as in `fps.sample`.
    num_samples: B chains.
    num_steps: DDPM steps (official DPS: 1000).
    zeta: step size.
    prediction, clip_x0, spacing: as in `fps.sample`.
  """
  times, a_t, a_s = samplers.sampling_grid(schedule, num_steps, spacing)
  key_init, step_keys = samplers.split_sampler_keys(key, times.shape[0])
  x = jax.random.normal(key_init, (num_samples,) + tuple(operator.x_shape))

  def body(x, xs):
    t, at, as_, k = xs
    x_next, _ = dps_step(denoiser, operator, y, x, t, at, as_, k, zeta, prediction=prediction, clip_x0=clip_x0)
    return x_next, None

  x, _ = jax.lax.scan(body, x, (times, a_t, a_s, step_keys))
  return x


def ddim_sample(key: jax.Array, denoiser: Denoiser, schedule: Any, x_shape: tuple[int, ...], num_samples: int,
                num_steps: int | None, *, eta: float = 0.0, prediction: str = "eps", clip_x0: Any = None
                ) -> jax.Array:
  """Plain unconditional DDIM samples [num_samples, *x_shape] (the measurement is ignored: a floor).

  Args:
    key: PRNG key.
    denoiser: (x_t [B, ...], t [B]) -> prediction of x_t's shape.
    schedule: the diffusion schedule.
    x_shape: one sample's shape, e.g. (S, S, 1) or (D,).
    num_samples: B.
    num_steps: sampler steps (None: every step of a discrete schedule, 100 for a continuous one).
    eta: DDIM's eta.
    prediction: the denoiser's output type ('eps' | 'x0' | 'v').
    clip_x0: None, a float c or a (lo, hi) pair.

  Returns:
    [num_samples, *x_shape] float32 samples.
  """
  return samplers.sample(key, denoiser, schedule, (num_samples,) + tuple(x_shape), method="ddim",
                         num_steps=num_steps, eta=eta, prediction=prediction, clip_x0=clip_x0)
