"""DDPM ancestral and DDIM(eta) samplers as pure functions over `lax.scan`, each with its single step exposed.

A denoiser is any closure `denoiser(x_t, t) -> prediction` with x_t [B, ...] and t [B] in the schedule's own time
units (int32 index for a DiscreteSchedule, float in [0, 1] for a ContinuousSchedule); its output is an 'eps',
'x0' or 'v' prediction of x_t's shape. Nothing here depends on the data's shape beyond the batch axis, so the
same samplers serve images [B, H, W, C] and latent vectors [B, D].

Layers, from the maths up (SMC and other wrappers pick the layer they need):
  ddpm_transition / ddim_transition: (x_t, network output, abar_t, abar_s) -> Transition(mean, var, x0, eps),
    the Gaussian reverse kernel p(x_s | x_t) = N(mean, var I) between any two noise levels abar_t < abar_s.
  sampler_step: calls the denoiser and draws x_s ~ p(x_s | x_t) -> (x_s, Transition).
  sample: x_T ~ N(0, I), then `sampler_step` over the grid of `sampling_grid` inside `lax.scan`.
The last step always goes to clean data (abar_s = 1), where both kernels return their x_0 estimate with var 0
(DDPM Algorithm 2 adds no noise at t = 1; DDIM's deterministic last step).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.diffusion import process
from iclr24_jax.diffusion.schedules import Schedule

Denoiser = Callable[[jax.Array, jax.Array], jax.Array]
METHODS = ("ddpm", "ddim")


@flax.struct.dataclass
class Transition:
  """The Gaussian reverse kernel of one sampler step, p(x_s | x_t) = N(mean, var I).

  Attributes:
    mean: [B, ...] the kernel's mean.
    var: its variance, broadcastable to mean (a scalar, or [B, 1, ..., 1] with per-example times).
    x0: [B, ...] the x_0 estimate the step used (after clipping, if any).
    eps: [B, ...] the eps estimate the step used (consistent with x0 at x_t).
  """

  mean: jax.Array
  var: jax.Array
  x0: jax.Array
  eps: jax.Array

  def sample(self, key: jax.Array) -> jax.Array:
    """x_s = mean + sqrt(var) z, z ~ N(0, I)."""
    return self.mean + jnp.sqrt(self.var) * jax.random.normal(key, self.mean.shape, self.mean.dtype)

  def log_prob(self, x_s: jax.Array) -> jax.Array:
    """log N(x_s; mean, var I) [B], summed over non-batch axes (only where var > 0)."""
    return process.Gaussian(self.mean, self.var).log_prob(x_s)


def _estimates(x_t, model_out, alpha_bar_t, prediction, clip_x0):
  """(x0, eps) estimates from a network output; clipping x0 re-derives eps so that the two stay consistent."""
  x0 = process.predict_x0(x_t, model_out, alpha_bar_t, prediction)
  if clip_x0 is None:
    return x0, process.predict_eps(x_t, model_out, alpha_bar_t, prediction)
  lo, hi = (-clip_x0, clip_x0) if np.isscalar(clip_x0) else clip_x0
  x0 = jnp.clip(x0, lo, hi)
  return x0, process.x0_to_eps(x_t, x0, alpha_bar_t)


def ddpm_transition(x_t: jax.Array, model_out: jax.Array, alpha_bar_t: jax.Array, alpha_bar_s: jax.Array, *,
                    prediction: str = "eps", variance: str = "posterior", clip_x0: Any = None) -> Transition:
  """DDPM's ancestral kernel p(x_s | x_t) = q(x_s | x_t, x0_hat).   # DDPM Eqs. (7), (11)

  The mean is the posterior mean with x_0 replaced by the network's estimate, which for an eps network equals
  DDPM Eq. (11): mu = (x_t - beta_t / sqrt(1 - abar_t) eps) / sqrt(alpha_t). For s < t - 1 (a strided chain)
  alpha_t, beta_t become alpha_{t|s} = abar_t / abar_s and 1 - alpha_{t|s} (Nichol & Dhariwal 2021, Sec. 4).

  Args:
    x_t: [B, ...] current state.
    model_out: [B, ...] network output of type `prediction`.
    alpha_bar_t, alpha_bar_s: noise levels (scalar or [B]) of the current and next time, abar_t < abar_s.
    prediction: 'eps' | 'x0' | 'v'.
    variance: 'posterior' (sigma_t^2 = beta-tilde_t, DDPM Eq. 7) or 'beta' (sigma_t^2 = beta_t; DDPM Sec. 3.2
      names both choices). Either is 0 on the last step (abar_s = 1).
    clip_x0: None, a float c (clip x0_hat to [-c, c]) or a (lo, hi) pair.

  Returns:
    Transition(mean, var, x0, eps).
  """
  x0, eps = _estimates(x_t, model_out, alpha_bar_t, prediction, clip_x0)
  mean, var = process.posterior_mean_var(x_t, x0, alpha_bar_t, alpha_bar_s)
  if variance == "beta":
    a_t, a_s = process.expand(alpha_bar_t, x_t), process.expand(alpha_bar_s, x_t)
    var = jnp.where(a_s >= 1.0, 0.0, 1.0 - a_t / a_s)
  elif variance != "posterior":
    raise ValueError(f"unknown DDPM variance '{variance}'; choose 'posterior' or 'beta'.")
  return Transition(mean=mean, var=var, x0=x0, eps=eps)


def ddim_sigma2(alpha_bar_t: jax.Array, alpha_bar_s: jax.Array, eta: float) -> jax.Array:
  """sigma_t(eta)^2 = eta^2 (1 - abar_s) / (1 - abar_t) (1 - abar_t / abar_s).   # DDIM Eq. (16)

  eta = 1 is DDPM's posterior variance beta-tilde; eta = 0 is the deterministic DDIM.

  Args:
    alpha_bar_t: abar at the current (noisier) time; scalar or any shape broadcasting with alpha_bar_s,
      in [0, 1).
    alpha_bar_s: abar at the next (cleaner) time, abar_s > abar_t; 1 gives variance 0.
    eta: float >= 0, DDIM's stochasticity.

  Returns:
    the variance sigma^2, of the broadcast shape of the two noise levels.
  """
  return eta ** 2 * (1.0 - alpha_bar_s) / (1.0 - alpha_bar_t) * (1.0 - alpha_bar_t / alpha_bar_s)


def ddim_transition(x_t: jax.Array, model_out: jax.Array, alpha_bar_t: jax.Array, alpha_bar_s: jax.Array, *,
                    eta: float = 0.0, prediction: str = "eps", clip_x0: Any = None) -> Transition:
  """DDIM's kernel (Song et al. 2021, Eq. 12):

    x_s = sqrt(abar_s) x0_hat + sqrt(1 - abar_s - sigma^2) eps_hat + sigma z,   sigma = sigma_t(eta) (Eq. 16).

  Args:
    x_t: [B, ...] current state.
    model_out: [B, ...] network output of type `prediction`.
    alpha_bar_t, alpha_bar_s: noise levels (scalar or [B]), abar_t < abar_s.
    eta: 0 (deterministic DDIM) .. 1 (DDPM-like variance).
    prediction: 'eps' | 'x0' | 'v'.
    clip_x0: None, a float c or a (lo, hi) pair.

  Returns:
    Transition(mean, var, x0, eps).
  """
  x0, eps = _estimates(x_t, model_out, alpha_bar_t, prediction, clip_x0)
  a_t, a_s = process.expand(alpha_bar_t, x_t), process.expand(alpha_bar_s, x_t)
  sigma2 = ddim_sigma2(a_t, a_s, eta)                                         # Eq. (16)
  mean = jnp.sqrt(a_s) * x0 + jnp.sqrt(jnp.maximum(1.0 - a_s - sigma2, 0.0)) * eps   # Eq. (12)
  return Transition(mean=mean, var=sigma2, x0=x0, eps=eps)


def transition(method: str, x_t, model_out, alpha_bar_t, alpha_bar_s, *, eta: float = 0.0,
               prediction: str = "eps", variance: str = "posterior", clip_x0: Any = None) -> Transition:
  """Dispatches to `ddpm_transition` or `ddim_transition` by name.

  Args:
    method: 'ddpm' or 'ddim'.
    x_t: [B, ...] current state.
    model_out: [B, ...] network output of type `prediction`.
    alpha_bar_t: scalar or [B] current noise level.
    alpha_bar_s: scalar or [B] next noise level, abar_t < abar_s.
    eta: DDIM's eta (ignored by 'ddpm').
    prediction: 'eps' | 'x0' | 'v'.
    variance: DDPM's 'posterior' or 'beta' (ignored by 'ddim').
    clip_x0: None, a float c or a (lo, hi) pair.

  Returns:
    Transition(mean, var, x0, eps).

  Raises:
    ValueError: unknown method (or, from the kernels, unknown variance / prediction).
  """
  if method == "ddpm":
    return ddpm_transition(x_t, model_out, alpha_bar_t, alpha_bar_s, prediction=prediction, variance=variance,
                           clip_x0=clip_x0)
  if method == "ddim":
    return ddim_transition(x_t, model_out, alpha_bar_t, alpha_bar_s, eta=eta, prediction=prediction,
                           clip_x0=clip_x0)
  raise ValueError(f"unknown sampler '{method}'; choose one of {METHODS}.")


def sampler_step(denoiser: Denoiser, x_t: jax.Array, t: jax.Array, alpha_bar_t: jax.Array,
                 alpha_bar_s: jax.Array, key: jax.Array, *, method: str = "ddpm", eta: float = 0.0,
                 prediction: str = "eps", variance: str = "posterior", clip_x0: Any = None
                 ) -> tuple[jax.Array, Transition]:
  """One reverse step: evaluates the denoiser at (x_t, t) and draws x_s from the method's kernel.

  Args:
    denoiser: (x_t [B, ...], t [B]) -> prediction [B, ...].
    x_t: [B, ...] current state.
    t: the current time (scalar, broadcast to [B], or [B]) in the schedule's units.
    alpha_bar_t, alpha_bar_s: the current and next noise levels (scalars or [B]).
    key: randomness of this step (unused when the kernel's variance is 0).
    method, eta, prediction, variance, clip_x0: see `ddpm_transition` / `ddim_transition`.

  Returns:
    (x_s [B, ...], Transition).
  """
  t_b = jnp.broadcast_to(jnp.asarray(t), (x_t.shape[0],))
  out = denoiser(x_t, t_b)
  if out.shape != x_t.shape:
    raise ValueError(f"the denoiser returned shape {out.shape} for an input of shape {x_t.shape}; "
                     "it must predict eps / x0 / v of the input's shape.")
  tr = transition(method, x_t, out, alpha_bar_t, alpha_bar_s, eta=eta, prediction=prediction,
                  variance=variance, clip_x0=clip_x0)
  return tr.sample(key), tr


def sampling_grid(schedule: Schedule, num_steps: int | None = None, spacing: str | None = None
                  ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The times a sampler visits and the noise levels between which each step moves.

  Args:
    schedule: a DiscreteSchedule or ContinuousSchedule.
    num_steps: N (None: every step of a discrete schedule; 100 for a continuous one).
    spacing: see `DiscreteSchedule.sampling_times` (default 'leading' / 'linspace').

  Returns:
    times [N] (decreasing, schedule units), alpha_bar_t [N] at those times, alpha_bar_s [N] the next level
    (alpha_bar_t shifted by one, ending in 1.0 = clean data).
  """
  if schedule.is_discrete:
    times = schedule.sampling_times(num_steps, spacing or "leading")
  else:
    times = schedule.sampling_times(100 if num_steps is None else num_steps, spacing or "linspace")
  times = jnp.asarray(times)
  a_t = schedule.alpha_bar(times).astype(jnp.float32)
  a_s = jnp.concatenate([a_t[1:], jnp.ones((1,), jnp.float32)])
  return times, a_t, a_s


def split_sampler_keys(key: jax.Array, num_steps: int) -> tuple[jax.Array, jax.Array]:
  """(key_init for x_T, step_keys [N]) exactly as `sample` splits its key (so steps can be replayed).

  Args:
    key: the PRNG key passed to `sample`.
    num_steps: N, the number of sampler steps.

  Returns:
    (key_init, step_keys) with step_keys of shape [N] (typed keys) or [N, 2] uint32 (raw keys).
  """
  key_init, key_steps = jax.random.split(key)
  return key_init, jax.random.split(key_steps, num_steps)


def classifier_free_guidance(denoiser: Callable[[Any, jax.Array, Any], Any], cond: Any,
                             null_cond: Any, guidance_scale: float) -> Callable[[Any, jax.Array], Any]:
  """Classifier-free guidance (Ho & Salimans 2022, Eq. 6): out = out(x, null) + w (out(x, c) - out(x, null)).

  w = guidance_scale; w = 1 is the plain conditional model, w = 0 the unconditional one (the paper's
  (1 + w) is our w). The conversions between eps, x0 and v are affine in the output at fixed (x_t, t), so
  guiding in any of the three parameterisations gives the same sampler. Both branches run as one batched call.
  x_t and the output may be pytrees (e.g. a tuple of resolution levels, Matryoshka diffusion): every leaf is
  doubled along its batch axis and every output leaf is guided (the official MDM sampler guides each level).

  Args:
    denoiser: (x_t, t [B], c) -> prediction; x_t a [B, ...] array or a pytree of them, c a pytree with
      leading axis B.
    cond: the condition (pytree, leading axis B).
    null_cond: the "no condition" value (same structure; leading axis B or 1, broadcast).
    guidance_scale: w.

  Returns:
    denoiser(x_t, t) -> guided prediction (x_t's structure for the output's leaves).
  """
  def guided(x_t, t):
    both = jax.tree.map(lambda c, n: jnp.concatenate([c, jnp.broadcast_to(n, c.shape).astype(c.dtype)]),
                        cond, null_cond)
    x2 = jax.tree.map(lambda x: jnp.concatenate([x, x]), x_t)
    out = denoiser(x2, jnp.concatenate([t, t]), both)

    def mix(o):
      half = o.shape[0] // 2
      out_c, out_u = o[:half], o[half:]
      return out_u + guidance_scale * (out_c - out_u)

    return jax.tree.map(mix, out)

  return guided


def bind_condition(denoiser: Callable, cond: Any = None, null_cond: Any = None,
                   guidance_scale: float | None = None) -> Callable:
  """`(x, t) -> prediction` from a denoiser: guided (CFG) when guidance_scale is given, conditioned when cond
  is, the denoiser itself otherwise. Shared by `sample` and `sample_levels`.

  Args:
    denoiser: (x_t [B, ...], t [B]) -> prediction, or (x_t, t, c) -> prediction when cond is given.
    cond: None or the condition (pytree, leading axis B).
    null_cond: the "no condition" value for guidance (same structure; leading axis B or 1).
    guidance_scale: None (no guidance) or CFG's w (see `classifier_free_guidance`).

  Returns:
    denoiser(x_t, t) -> prediction of x_t's shape.

  Raises:
    ValueError: guidance_scale without both cond and null_cond.
  """
  if guidance_scale is not None:
    if cond is None or null_cond is None:
      raise ValueError("guidance_scale needs both cond and null_cond (the unconditional value).")
    return classifier_free_guidance(denoiser, cond, null_cond, guidance_scale)
  if cond is not None:
    return lambda x, t: denoiser(x, t, cond)
  return denoiser


def level_transitions(method: str, xs_t: Sequence[jax.Array], outs: Sequence[jax.Array],
                      alpha_bars_t: Sequence[jax.Array], alpha_bars_s: Sequence[jax.Array], *, eta: float = 0.0,
                      prediction: str = "eps", variance: str = "posterior", clip_x0: Any = None
                      ) -> tuple[Transition, ...]:
  """One reverse kernel per resolution level, each with its own noise levels (one schedule per level).

  Matryoshka diffusion denoises L resolutions jointly at one shared time t, but level r has its own
  (shifted) schedule, so abar differs per level: level r moves from alpha_bars_t[r] to alpha_bars_s[r] with
  `ddpm_transition` / `ddim_transition` (the official NestedSampler applies its single-level step per level).

  Args:
    method: 'ddpm' | 'ddim'.
    xs_t: L arrays [B, H_r, W_r, C] (any [B, ...]).
    outs: L network outputs, shapes as xs_t.
    alpha_bars_t, alpha_bars_s: L noise levels (scalar or [B]) each, abar_t < abar_s.
    eta, prediction, variance, clip_x0: see `ddpm_transition` / `ddim_transition`.

  Returns:
    a tuple of L Transitions.
  """
  n = len(xs_t)
  if not len(outs) == len(alpha_bars_t) == len(alpha_bars_s) == n:
    raise ValueError(f"level_transitions needs one output and one (abar_t, abar_s) pair per level; got {n} levels, "
                     f"{len(outs)} outputs, {len(alpha_bars_t)} / {len(alpha_bars_s)} noise levels.")
  return tuple(transition(method, x, o, a_t, a_s, eta=eta, prediction=prediction, variance=variance,
                          clip_x0=clip_x0) for x, o, a_t, a_s in zip(xs_t, outs, alpha_bars_t, alpha_bars_s))


def sample_levels(key: jax.Array, denoiser: Callable, schedules: Sequence[Schedule],
                  shapes: Sequence[tuple[int, ...]], *, method: str = "ddim", num_steps: int | None = None,
                  spacing: str | None = None, eta: float = 0.0, prediction: str = "eps", variance: str = "posterior",
                  clip_x0: Any = None,
                  x_T: Sequence[jax.Array] | None = None, cond: Any = None, null_cond: Any = None,
                  guidance_scale: float | None = None, return_trajectory: bool = False):
  """Joint reverse chain over L resolution levels sharing one time grid, in one `lax.scan`.

  At every step the denoiser sees all levels at the same time t and returns one prediction per level; level r
  then takes its own `ddpm` / `ddim` step with the noise levels of `schedules[r]` (Matryoshka diffusion:
  one t, per-resolution shifted schedules). Guidance (`guidance_scale`) guides every level.

  Keys: `key_init, step_keys = split_sampler_keys(key, N)`; level r starts from
  `normal(fold_in(key_init, r))` and its step i uses `fold_in(step_keys[i], r)`.

  Args:
    key: randomness.
    denoiser: (xs_t tuple of L [B, ...], t [B]) -> tuple of L predictions; or (xs_t, t, c) with `cond`.
    schedules: L schedules of the same kind and time units (discrete with equal T, or continuous); the time grid
      is that of schedules[0].
    shapes: L shapes [B, ...] (same B).
    method, num_steps, spacing, eta, prediction, variance, clip_x0: as in `sample`.
    x_T: optional L starting noises.
    cond, null_cond, guidance_scale: as in `sample`.
    return_trajectory: also return every level's states after every step.

  Returns:
    a tuple of L samples [B, ...]; with return_trajectory, (samples, trajectories tuple of [N, B, ...]).
  """
  if method not in METHODS:
    raise ValueError(f"unknown sampler '{method}'; choose one of {METHODS}.")
  levels = len(schedules)
  if levels == 0 or len(shapes) != levels:
    raise ValueError(f"sample_levels needs one shape per schedule; got {len(schedules)} schedules and "
                     f"{len(shapes)} shapes.")
  kinds = {(s.is_discrete, s.num_timesteps if s.is_discrete else None) for s in schedules}
  if len(kinds) != 1:
    raise ValueError("all levels' schedules must share their time units (all discrete with the same T, or all "
                     f"continuous); got {[s.name for s in schedules]}.")
  if len({int(s[0]) for s in shapes}) != 1:
    raise ValueError(f"all levels need the same batch size; got shapes {list(shapes)}.")
  fn = bind_condition(denoiser, cond, null_cond, guidance_scale)
  times = sampling_grid(schedules[0], num_steps, spacing)[0]
  a_t = tuple(s.alpha_bar(times).astype(jnp.float32) for s in schedules)
  a_s = tuple(jnp.concatenate([a[1:], jnp.ones((1,), jnp.float32)]) for a in a_t)
  key_init, step_keys = split_sampler_keys(key, times.shape[0])
  if x_T is None:
    x_T = tuple(jax.random.normal(jax.random.fold_in(key_init, r), tuple(sh), jnp.float32)
                for r, sh in enumerate(shapes))
  else:
    x_T = tuple(x_T)
    if [tuple(x.shape) for x in x_T] != [tuple(sh) for sh in shapes]:
      raise ValueError(f"x_T has shapes {[x.shape for x in x_T]}, expected {list(shapes)}.")
  batch = int(shapes[0][0])

  def body(xs, step):
    t, at, as_, k = step
    outs = tuple(fn(xs, jnp.broadcast_to(t, (batch,))))
    if [o.shape for o in outs] != [x.shape for x in xs]:
      raise ValueError(f"the denoiser returned shapes {[o.shape for o in outs]} for levels "
                       f"{[x.shape for x in xs]}; it must return one prediction per level of its level's shape.")
    trs = level_transitions(method, xs, outs, at, as_, eta=eta, prediction=prediction, variance=variance,
                            clip_x0=clip_x0)
    nxt = tuple(tr.sample(jax.random.fold_in(k, r)) for r, tr in enumerate(trs))
    return nxt, (nxt if return_trajectory else None)

  xs0, traj = jax.lax.scan(body, x_T, (times, a_t, a_s, step_keys))
  return (xs0, traj) if return_trajectory else xs0


def sample(key: jax.Array, denoiser: Callable, schedule: Schedule, shape: tuple[int, ...], *,
           method: str = "ddpm", num_steps: int | None = None, spacing: str | None = None, eta: float = 0.0,
           prediction: str = "eps", variance: str = "posterior", clip_x0: Any = None, x_T: jax.Array | None = None,
           cond: Any = None, null_cond: Any = None, guidance_scale: float | None = None,
           grid: tuple[jax.Array, jax.Array, jax.Array] | None = None, return_trajectory: bool = False):
  """Draws samples by running the reverse chain in one `lax.scan`.

  Args:
    key: split as `split_sampler_keys(key, N)`: x_T from key_init, step i from step_keys[i].
    denoiser: (x_t, t) -> prediction; or (x_t, t, c) -> prediction when `cond` is given.
    schedule: the schedule the denoiser was trained with.
    shape: [B, ...] of the samples.
    method: 'ddpm' (ancestral, DDPM Algorithm 2) or 'ddim' (DDIM Eq. 12 with `eta`).
    num_steps, spacing: the time grid (see `sampling_grid`); fewer steps than T stride the chain.
    eta: DDIM's eta (0 = deterministic).
    prediction: what the denoiser predicts: 'eps' | 'x0' | 'v'.
    variance: DDPM's reverse variance, 'posterior' or 'beta'.
    clip_x0: None, c or (lo, hi): clip the x_0 estimate at every step.
    x_T: optional starting noise [B, ...] (default drawn from key_init).
    cond: condition passed as the denoiser's third argument (pytree, leading axis B).
    null_cond: the unconditional value for classifier-free guidance.
    guidance_scale: w of `classifier_free_guidance` (None: no guidance).
    grid: optional (times [N], alpha_bar_t [N], alpha_bar_s [N]) replacing `sampling_grid(schedule, ...)`, for a
      custom time grid (the schedule is then unused).
    return_trajectory: also return the states after every step.

  Returns:
    x_0 samples [B, ...]; with return_trajectory, (x_0, trajectory [N, B, ...]).
  """
  if method not in METHODS:
    raise ValueError(f"unknown sampler '{method}'; choose one of {METHODS}.")
  fn = bind_condition(denoiser, cond, null_cond, guidance_scale)
  times, a_t, a_s = sampling_grid(schedule, num_steps, spacing) if grid is None else grid
  key_init, step_keys = split_sampler_keys(key, times.shape[0])
  if x_T is None:
    x_T = jax.random.normal(key_init, tuple(shape), jnp.float32)
  elif tuple(x_T.shape) != tuple(shape):
    raise ValueError(f"x_T has shape {x_T.shape}, expected {tuple(shape)}.")

  def body(x, xs):
    t, abar_t, abar_s, k = xs
    x_next, _ = sampler_step(fn, x, t, abar_t, abar_s, k, method=method, eta=eta, prediction=prediction,
                             variance=variance, clip_x0=clip_x0)
    return x_next, (x_next if return_trajectory else None)

  x0, traj = jax.lax.scan(body, x_T, (times, a_t, a_s, step_keys))
  return (x0, traj) if return_trajectory else x0
