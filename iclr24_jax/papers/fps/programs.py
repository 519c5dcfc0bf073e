"""Compiled, batched runs of the samplers, shared by `experiment.run` and the studies.

`compile_call` (lower + compile, at XLA optimisation level 0 on CPU), `fps_runs_fn` (C configurations x R
independent FPS particle filters as one jitted program) and `dps_runs_fn` (one vmapped DPS run per configuration).
The samplers themselves are in `smc.py` (FPS) and `baselines.py` (DPS).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from iclr24_jax.common import loop as loop_lib
from iclr24_jax.diffusion import samplers
from iclr24_jax.papers.fps import baselines, smc


def compile_call(fn, *args, fast_compile: bool = True):
  """Lowers and compiles a jitted `fn` for `args`; on CPU with `fast_compile`, at XLA backend optimisation level 0
  (`common.loop.compile_fast`: the image study's programs run about a second and compile 3-4x faster there).

  Args:
    fn: a jax.jit-wrapped function.
    *args: example arguments (their shapes / dtypes / shardings fix the compiled program).
    fast_compile: use optimisation level 0 on CPU (ignored on other backends).

  Returns:
    the compiled executable; call it with arguments like `args`.
  """
  return loop_lib.compile_fast(fn, *args, cpu_only=True) if fast_compile else fn.lower(*args).compile()


def fps_runs_fn(denoiser, schedule, operator, num_particles: int, num_steps: int, clip_x0=None,
                resampling: str = "multinomial"):
  """A jitted f(keys [C, R], y [C, *y_shape], sigma [C], c [C], rates [C, N], tele [C])
  -> (x [C, R, M, *x_shape], ess [C, R]).

  Each of the C configurations (a measurement, a noise level, a bridge c-rate, kernel rates and the weights: tele
  = 0 FPS's, 1 telescoping -- so both kernels and both weightings share one program) runs R independent FPS
  samplers with M = `num_particles` particles; a run returns its final (equally weighted) particles -- the official
  code returns the first one -- and its mean ESS / M.

  Args:
    denoiser: (x_t [B, ...], t [B]) -> eps prediction.
    schedule: the diffusion schedule.
    operator: the linear measurement operator A.
    num_particles: M.
    num_steps: N, sampler steps.
    clip_x0: None, a float c or a (lo, hi) pair.
    resampling: 'multinomial' | 'systematic' | 'stratified'.

  Returns:
    the jitted f above (ess as a fraction of M, in (0, 1]).
  """
  times, a_t, a_s = samplers.sampling_grid(schedule, num_steps)

  def one(key, y, sigma, c, rates, tele):
    key_y, key_f = jax.random.split(key)
    y_start, ys = smc.measurement_sequence(key_y, operator, y, a_t, a_s, c)
    x, info = smc.particle_filter(key_f, denoiser, operator, y_start, ys, times, a_t, a_s, sigma, num_particles,
                                  rates=rates, resampling=resampling, clip_x0=clip_x0, weights=tele)
    return x, jnp.mean(info["ess"]) / num_particles

  flat = jax.vmap(one)   # one vmap over C * R runs (a nested vmap compiles about twice as slowly on CPU)

  def run(keys, y, sigma, c, rates, tele):
    n_c, n_r = keys.shape
    rep = lambda a: jnp.repeat(a, n_r, axis=0)  # noqa: E731
    x, ess = flat(keys.reshape(-1), rep(y), rep(sigma), rep(c), rep(rates), rep(tele))
    return x.reshape((n_c, n_r) + x.shape[1:]), ess.reshape(n_c, n_r)

  return jax.jit(run)


def dps_runs_fn(denoiser, schedule, operator, num_samples: int, num_steps: int, clip_x0=None):
  """A jitted f(keys [C], y [C, *y_shape], zeta [C]) -> DPS samples [C, num_samples, *x_shape].

  Args:
    denoiser: (x_t [B, ...], t [B]) -> eps prediction.
    schedule: the diffusion schedule.
    operator: the linear measurement operator A.
    num_samples: samples per configuration.
    num_steps: sampler steps.
    clip_x0: None, a float c or a (lo, hi) pair.

  Returns:
    the jitted f above (one vmapped DPS run per configuration, step size zeta).
  """
  return jax.jit(jax.vmap(lambda k, y, z: baselines.dps_sample(k, denoiser, schedule, operator, y, num_samples,
                                                               num_steps, z, clip_x0=clip_x0)))
