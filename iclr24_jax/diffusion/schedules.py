"""Noise schedules: discrete (beta_t, alpha_t, alpha_bar_t over t = 0..T-1) and continuous (log-SNR over t in [0, 1]).

Notation (Ho et al. 2020, "DDPM"; Kingma et al. 2021, "VDM"):
  q(x_t | x_0) = N(sqrt(alpha_bar_t) x_0, (1 - alpha_bar_t) I)                       # DDPM Eq. (4)
  alpha_t = 1 - beta_t,  alpha_bar_t = prod_{s <= t} alpha_s
  SNR(t) = alpha_bar_t / (1 - alpha_bar_t),  log-SNR lambda_t = log SNR(t)          # VDM Eq. (2)
  alpha_bar_t = sigmoid(lambda_t),  1 - alpha_bar_t = sigmoid(-lambda_t)

Index convention (the diffusers one): discrete time is 0-indexed, t in {0, ..., T-1}; DDPM's step t (1-indexed)
is our index t - 1. `alpha_bars[t]` is the signal level AFTER t + 1 noising steps, so `alpha_bars[0] = 1 - beta_0`.
"Clean data" (DDPM's x_0, alpha_bar = 1) has no index; samplers treat it as the step after the last one.

Two schedule types share one interface (`alpha_bar(t)`, `log_snr(t)`, `snr(t)`, `sampling_times(n)`,
`sample_time(key, shape)`, `is_discrete`), so the forward process, the loss and the samplers take either.
Networks and denoisers receive t in the schedule's own units (int index or float in [0, 1]; a network casts it
to float and may scale it, e.g. UNet(time_scale=1000) for continuous time).
Types:
  DiscreteSchedule: arrays of length T (pytree; jit-friendly); integer time.
  ContinuousSchedule: a log-SNR function of float time t in [0, 1] (cosine of "simple diffusion"/MDM, linear VP-SDE).
"""
from __future__ import annotations

import math
from typing import Union

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

# ------------------------------------------------------------------------------------------------ discrete


@flax.struct.dataclass
class DiscreteSchedule:
  """A discrete-time variance-preserving schedule over t = 0..T-1.

  Attributes:
    betas: [T] float32, beta_t = 1 - alpha_t.
    alphas: [T] float32, alpha_t = 1 - beta_t.
    alpha_bars: [T] float32, alpha_bar_t = prod_{s<=t} alpha_s (DDPM Eq. 4's alpha-bar).
    log_snrs: [T] float32 log(alpha_bar_t / (1 - alpha_bar_t)), computed in float64 (1 - alpha_bar in float32
      loses digits near t = 0, so `snr` / `log_snr` read this array instead).
    name: a label (static).
  """

  betas: jax.Array
  alphas: jax.Array
  alpha_bars: jax.Array
  log_snrs: jax.Array
  name: str = flax.struct.field(pytree_node=False, default="custom")

  is_discrete = True

  @property
  def num_timesteps(self) -> int:
    """T, the number of noising steps."""
    return int(self.betas.shape[0])

  @property
  def alpha_bars_prev(self) -> jax.Array:
    """[T] alpha_bar_{t-1}, with alpha_bar_{-1} = 1 (clean data)."""
    return jnp.concatenate([jnp.ones((1,), self.alpha_bars.dtype), self.alpha_bars[:-1]])

  def alpha_bar(self, t: jax.Array) -> jax.Array:
    """alpha_bar at integer times t (any shape); t = -1 means clean data (alpha_bar = 1)."""
    t = jnp.asarray(t)
    return jnp.where(t < 0, 1.0, self.alpha_bars[jnp.clip(t, 0, self.num_timesteps - 1)])

  def snr(self, t: jax.Array) -> jax.Array:
    """SNR(t) = alpha_bar_t / (1 - alpha_bar_t) (inf at t = -1)."""
    return jnp.exp(self.log_snr(t))

  def log_snr(self, t: jax.Array) -> jax.Array:
    """lambda_t = log alpha_bar_t - log(1 - alpha_bar_t) (inf at t = -1)."""
    t = jnp.asarray(t)
    return jnp.where(t < 0, jnp.inf, self.log_snrs[jnp.clip(t, 0, self.num_timesteps - 1)])

  def sample_time(self, key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Training times t ~ Uniform{0, ..., T-1} (DDPM Algorithm 1), int32 of `shape`.

    Args:
      key: PRNG key.
      shape: output shape, e.g. (B,).

    Returns:
      int32 array of `shape` in [0, T).
    """
    return jax.random.randint(key, shape, 0, self.num_timesteps)

  def sampling_times(self, num_steps: int | None = None, spacing: str = "leading") -> np.ndarray:
    """Decreasing integer times [N] visited by a sampler with N = num_steps steps.

    Args:
      num_steps: N <= T (None: all T steps).
      spacing: 'leading' (DDIM's "uniform" skip: t = 0, c, 2c, ... with c = T // N, reversed),
        'trailing' (t = T-1, T-1-c', ... with c' = T / N; starts at the noisiest step, Lin et al. 2024),
        'linspace' (round(linspace(T-1, 0, N))).

    Returns:
      numpy int32 [N], strictly decreasing; the sampler's last step goes from times[-1] to clean data.
    """
    t_max = self.num_timesteps
    n = t_max if num_steps is None else int(num_steps)
    if not 1 <= n <= t_max:
      raise ValueError(f"num_steps={n} must be in [1, {t_max}] for a {t_max}-step discrete schedule.")
    if spacing == "leading":
      times = np.arange(0, n) * (t_max // n)
    elif spacing == "trailing":
      times = np.round(np.arange(t_max, 0, -t_max / n)).astype(np.int64)[::-1] - 1
    elif spacing == "linspace":
      times = np.round(np.linspace(0, t_max - 1, n)).astype(np.int64)
    else:
      raise ValueError(f"unknown spacing '{spacing}'; choose 'leading', 'trailing' or 'linspace'.")
    times = np.unique(times)
    if len(times) != n:
      raise ValueError(f"spacing '{spacing}' gave repeated times for num_steps={n}; choose another spacing.")
    return times[::-1].astype(np.int32)


def from_betas(betas, name: str = "custom") -> DiscreteSchedule:
  """Builds a DiscreteSchedule from betas [T] (checked to lie in (0, 1)).

  Args:
    betas: [T] array-like of beta_t, strictly inside (0, 1); alpha_bar and log-SNR are computed in float64.
    name: label stored on the schedule.

  Returns:
    DiscreteSchedule with float32 [T] betas, alphas, alpha_bars, log_snrs.

  Raises:
    ValueError: betas empty, not 1-D, non-finite or outside (0, 1).
  """
  betas = np.asarray(betas, np.float64)
  if betas.ndim != 1 or betas.size == 0:
    raise ValueError(f"betas must be a non-empty 1-D array, got shape {betas.shape}.")
  if not np.all(np.isfinite(betas)) or np.any(betas <= 0) or np.any(betas >= 1):
    raise ValueError("betas must be finite and strictly inside (0, 1); check the schedule's parameters.")
  alphas = 1.0 - betas
  alpha_bars = np.cumprod(alphas)  # DDPM Eq. (4): alpha_bar_t = prod_s alpha_s (computed in float64)
  log_snrs = np.log(alpha_bars) - np.log(-np.expm1(np.cumsum(np.log1p(-betas))))
  return DiscreteSchedule(betas=jnp.asarray(betas, jnp.float32), alphas=jnp.asarray(alphas, jnp.float32),
                          alpha_bars=jnp.asarray(alpha_bars, jnp.float32), log_snrs=jnp.asarray(log_snrs, jnp.float32),
                          name=name)


def from_alpha_bars(alpha_bars, name: str = "custom") -> DiscreteSchedule:
  """Builds a DiscreteSchedule from a decreasing alpha_bar [T] in (0, 1]: beta_t = 1 - abar_t / abar_{t-1}.

  Args:
    alpha_bars: [T] array-like, strictly decreasing, inside (0, 1].
    name: label stored on the schedule.

  Returns:
    DiscreteSchedule of length T.

  Raises:
    ValueError: alpha_bars not 1-D, not strictly decreasing or outside (0, 1].
  """
  ab = np.asarray(alpha_bars, np.float64)
  if ab.ndim != 1 or np.any(ab <= 0) or np.any(ab > 1) or np.any(np.diff(ab) >= 0):
    raise ValueError("alpha_bars must be 1-D, strictly decreasing and inside (0, 1].")
  betas = 1.0 - ab / np.concatenate([[1.0], ab[:-1]])
  return from_betas(betas, name)


def linear_beta_schedule(num_timesteps: int = 1000, beta_start: float = 1e-4, beta_end: float = 0.02
                         ) -> DiscreteSchedule:
  """DDPM's linear schedule (Ho et al. 2020, Sec. 4): beta_t = linspace(beta_start, beta_end, T).

  The DDPM defaults (1e-4, 0.02, T = 1000) are diffusers' 'linear'.

  Args:
    num_timesteps: T.
    beta_start: beta_0.
    beta_end: beta_{T-1}.

  Returns:
    DiscreteSchedule named 'linear'.
  """
  return from_betas(np.linspace(beta_start, beta_end, num_timesteps, dtype=np.float64), "linear")


def scaled_linear_beta_schedule(num_timesteps: int = 1000, beta_start: float = 0.00085, beta_end: float = 0.012
                                ) -> DiscreteSchedule:
  """Latent-diffusion's 'scaled_linear': beta_t = linspace(sqrt(beta_start), sqrt(beta_end), T) ** 2.

  Args:
    num_timesteps: T.
    beta_start: beta_0.
    beta_end: beta_{T-1}.

  Returns:
    DiscreteSchedule named 'scaled_linear'.
  """
  return from_betas(np.linspace(beta_start ** 0.5, beta_end ** 0.5, num_timesteps, dtype=np.float64) ** 2,
                    "scaled_linear")


def cosine_alpha_bar(u, s: float = 0.008):
  """Nichol & Dhariwal (2021) Eq. (17) before normalisation: f(u) = cos(((u + s) / (1 + s)) * pi / 2) ** 2.

  Args:
    u: float or array (any shape) of fractional times t / T in [0, 1].
    s: the small offset that keeps beta away from 0 near u = 0.

  Returns:
    float64 numpy array of u's shape, f(u) in [0, 1].
  """
  return np.cos((np.asarray(u, np.float64) + s) / (1.0 + s) * np.pi / 2) ** 2


def cosine_beta_schedule(num_timesteps: int = 1000, s: float = 0.008, max_beta: float = 0.999
                         ) -> DiscreteSchedule:
  """Improved-DDPM cosine schedule (Nichol & Dhariwal 2021, Eq. 17), identical to diffusers' 'squaredcos_cap_v2'.

  alpha_bar_t = f(t / T) / f(0) for DDPM step t = 1..T, so with our 0-indexed t:
  beta_t = min(1 - f((t + 1) / T) / f(t / T), max_beta)  (the f(0) normalisation cancels in the ratio; the cap
  0.999 avoids the singularity at the end, as both the paper and diffusers do).

  Args:
    num_timesteps: T.
    s: offset of `cosine_alpha_bar`.
    max_beta: cap on every beta_t.

  Returns:
    DiscreteSchedule named 'cosine'.
  """
  i = np.arange(num_timesteps, dtype=np.float64)
  betas = np.minimum(1.0 - cosine_alpha_bar((i + 1) / num_timesteps, s) / cosine_alpha_bar(i / num_timesteps, s),
                     max_beta)
  return from_betas(betas, "cosine")


def squaredcos_cap_v2(num_timesteps: int = 1000) -> DiscreteSchedule:
  """diffusers' name for the capped improved-DDPM cosine schedule (same numbers as `cosine_beta_schedule`)."""
  sched = cosine_beta_schedule(num_timesteps)
  return sched.replace(name="squaredcos_cap_v2")


def shift_schedule(schedule: DiscreteSchedule, shift: float) -> DiscreteSchedule:
  """Shifts every log-SNR by `shift` (SNR multiplied by exp(shift)): alpha_bar' = sigmoid(lambda + shift).

  With `shift = resolution_shift(base, res)` this is the SNR shift of simple diffusion / MDM for a discrete
  schedule (negative shift = more noise at every step).

  Args:
    schedule: the DiscreteSchedule to shift (length T).
    shift: float added to every log-SNR.

  Returns:
    DiscreteSchedule of length T named '<name>+shift<shift>'.
  """
  lam = np.asarray(schedule.log_snrs, np.float64) + float(shift)
  return from_alpha_bars(1.0 / (1.0 + np.exp(-lam)), f"{schedule.name}+shift{shift:+.3g}")


def make_schedule(name: str, num_timesteps: int = 1000, **kwargs) -> DiscreteSchedule:
  """A discrete schedule by name: 'linear', 'scaled_linear', 'cosine', 'squaredcos_cap_v2'.

  Args:
    name: schedule name (above).
    num_timesteps: T.
    **kwargs: passed to the named builder (beta_start / beta_end, or s / max_beta; other names raise
      TypeError; 'squaredcos_cap_v2' takes none and raises TypeError on any).

  Returns:
    DiscreteSchedule of length T.

  Raises:
    ValueError: unknown name.
  """
  if name == "linear":
    return linear_beta_schedule(num_timesteps, **kwargs)
  if name == "scaled_linear":
    return scaled_linear_beta_schedule(num_timesteps, **kwargs)
  if name == "cosine":
    return cosine_beta_schedule(num_timesteps, **kwargs)
  if name == "squaredcos_cap_v2":
    if kwargs:
      raise TypeError(f"schedule 'squaredcos_cap_v2' takes no options, got {sorted(kwargs)}.")
    return squaredcos_cap_v2(num_timesteps)
  raise ValueError(f"unknown schedule '{name}'; choose 'linear', 'scaled_linear', 'cosine' or 'squaredcos_cap_v2' "
                   "(or a ContinuousSchedule for continuous time).")


# ---------------------------------------------------------------------------------------------- continuous


def resolution_shift(base_resolution: float, resolution: float) -> float:
  """The log-SNR shift that keeps a schedule's per-pixel noise comparable across resolutions: 2 log(base / res).

  Hoogeboom et al. 2023 ("simple diffusion", Eq. 4 and Sec. 3.1) and Matryoshka Diffusion (Gu et al. 2024):
  lambda_res(t) = lambda_base(t) + 2 log(base / res). E.g. base 64, res 256: shift = 2 log(1/4) = -2.7726.

  Args:
    base_resolution: side length the schedule was designed for (> 0).
    resolution: side length it is used at (> 0).

  Returns:
    the shift as a Python float (negative when resolution > base_resolution).

  Raises:
    ValueError: a non-positive resolution.
  """
  if base_resolution <= 0 or resolution <= 0:
    raise ValueError(f"resolutions must be positive, got base={base_resolution}, res={resolution}.")
  return 2.0 * math.log(base_resolution / resolution)


@flax.struct.dataclass
class ContinuousSchedule:
  """A continuous-time variance-preserving schedule, defined by its log-SNR lambda(t) over t in [0, 1].

  Kinds:
    'cosine': alpha_t = cos(pi t / 2), sigma_t = sin(pi t / 2), so lambda(t) = -2 log tan(pi t / 2)
      (simple diffusion Sec. 2; MDM), with t rescaled so that lambda runs from logsnr_max (t = 0) to
      logsnr_min (t = 1): lambda(t) = -2 log tan(a t + b), b = atan(exp(-logsnr_max / 2)),
      a = atan(exp(-logsnr_min / 2)) - b.
    'linear': the VP-SDE with beta(t) = beta_min + t (beta_max - beta_min) (Song et al. 2021, score SDE):
      alpha_bar(t) = exp(-(beta_min t + (beta_max - beta_min) t^2 / 2)).
  Every kind then adds `shift` to lambda (SNR shifting; see `resolution_shift`).

  Attributes (all static):
    kind: 'cosine' | 'linear'.
    logsnr_min, logsnr_max: the cosine kind's range of lambda.
    beta_min, beta_max: the linear kind's beta range (continuous-time units, 0.1 and 20 in the score SDE).
    shift: added to lambda(t).
  """

  kind: str = flax.struct.field(pytree_node=False, default="cosine")
  logsnr_min: float = flax.struct.field(pytree_node=False, default=-15.0)
  logsnr_max: float = flax.struct.field(pytree_node=False, default=15.0)
  beta_min: float = flax.struct.field(pytree_node=False, default=0.1)
  beta_max: float = flax.struct.field(pytree_node=False, default=20.0)
  shift: float = flax.struct.field(pytree_node=False, default=0.0)

  is_discrete = False

  def __post_init__(self):
    if self.kind not in ("cosine", "linear"):
      raise ValueError(f"unknown continuous schedule kind '{self.kind}'; choose 'cosine' or 'linear'.")
    if self.kind == "cosine" and not self.logsnr_min < self.logsnr_max:
      raise ValueError(f"logsnr_min ({self.logsnr_min}) must be below logsnr_max ({self.logsnr_max}).")

  @property
  def name(self) -> str:
    return f"continuous_{self.kind}" + (f"+shift{self.shift:+.3g}" if self.shift else "")

  def log_snr(self, t: jax.Array, xp=jnp) -> jax.Array:
    """lambda(t) for float t in [0, 1] (any shape); `xp=np` evaluates in float64 numpy.

    Args:
      t: float times in [0, 1], any shape.
      xp: jnp (float32, traceable) or np (float64).

    Returns:
      lambda(t) + shift, t's shape.
    """
    t = xp.asarray(t, xp.float32 if xp is jnp else xp.float64)
    if self.kind == "cosine":
      b = math.atan(math.exp(-0.5 * self.logsnr_max))
      a = math.atan(math.exp(-0.5 * self.logsnr_min)) - b
      lam = -2.0 * xp.log(xp.tan(a * t + b))
    else:
      # log SNR = log(abar / (1 - abar)) = -log(expm1(integral of beta)).
      integral = self.beta_min * t + 0.5 * (self.beta_max - self.beta_min) * t ** 2
      lam = -xp.log(xp.expm1(integral))
    return lam + self.shift

  def alpha_bar(self, t: jax.Array) -> jax.Array:
    """alpha_bar(t) = sigmoid(lambda(t))."""
    return jax.nn.sigmoid(self.log_snr(t))

  def snr(self, t: jax.Array) -> jax.Array:
    """SNR(t) = exp(lambda(t))."""
    return jnp.exp(self.log_snr(t))

  def sample_time(self, key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Training times t ~ Uniform(0, 1), float32 of `shape`.

    Args:
      key: PRNG key.
      shape: output shape, e.g. (B,).

    Returns:
      float32 array of `shape` in [0, 1).
    """
    return jax.random.uniform(key, shape, jnp.float32)

  def sampling_times(self, num_steps: int = 100, spacing: str = "linspace") -> np.ndarray:
    """Decreasing float times [N]: t_i = 1 - i / N for i = 0..N-1 (the last step goes from 1/N to clean data).

    Args:
      num_steps: N >= 1.
      spacing: only 'linspace'.

    Returns:
      numpy float32 [N].

    Raises:
      ValueError: another spacing, or N < 1.
    """
    if spacing != "linspace":
      raise ValueError(f"continuous schedules support spacing='linspace' only, got '{spacing}'.")
    n = int(num_steps)
    if n < 1:
      raise ValueError(f"num_steps must be >= 1, got {n}.")
    return (1.0 - np.arange(n) / n).astype(np.float32)


Schedule = Union[DiscreteSchedule, ContinuousSchedule]


def discretize(schedule: ContinuousSchedule, num_timesteps: int = 1000) -> DiscreteSchedule:
  """Samples a continuous schedule at t = (i + 1) / T, i = 0..T-1, as a DiscreteSchedule.

  Args:
    schedule: a ContinuousSchedule.
    num_timesteps: T.

  Returns:
    DiscreteSchedule of length T named '<name>@<T>'.

  Raises:
    ValueError: the sampled alpha_bars are not strictly decreasing in (0, 1] (from `from_alpha_bars`).
  """
  t = (np.arange(num_timesteps, dtype=np.float64) + 1) / num_timesteps
  ab = 1.0 / (1.0 + np.exp(-schedule.log_snr(t, xp=np)))
  return from_alpha_bars(ab, f"{schedule.name}@{num_timesteps}")


def from_config(cfg) -> Schedule:
  """A schedule from a config block: name, num_timesteps, continuous (bool), shift (log-SNR shift).

  continuous=False: `make_schedule(name, num_timesteps)`, then `shift_schedule` if shift != 0.
  continuous=True: `ContinuousSchedule(kind=name, shift=shift)` with name 'cosine' or 'linear'.
  """
  name = cfg.get("name", "linear")
  shift = float(cfg.get("shift", 0.0) or 0.0)
  if cfg.get("continuous", False):
    if name not in ("cosine", "linear"):
      raise ValueError(f"continuous schedules are 'cosine' or 'linear', got '{name}'.")
    return ContinuousSchedule(kind=name, shift=shift)
  sched = make_schedule(name, int(cfg.get("num_timesteps", 1000)))
  return shift_schedule(sched, shift) if shift else sched
