"""Training: a jitted `lax.scan` over chunks of steps, with batches sampled inside the step from device data.

Tabular models here are small, so per-step dispatch would dominate on CPU; a chunk of `log_every` steps is one
compiled call (the state is donated), and metrics are pulled once per chunk.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp

from iclr24_jax.common import metrics as metrics_lib


@dataclasses.dataclass
class FitResult:
  state: Any
  history: list[dict]
  seconds: float
  steps_per_s: float


def make_chunk(model: Any, length: int) -> Callable:
  """A pure function running `length` steps: (state, data, key) -> (state, mean metrics).

  Each step draws its batch with `jax.random.fold_in(key, state.step)` so a resumed run replays the same stream.
  """

  def chunk(state, data, key):
    def body(state, _):
      k = jax.random.fold_in(key, state.step)
      k_batch, k_step = jax.random.split(k)
      batch = model.make_batch(data, k_batch)
      return model.train_step(state, batch, k_step)

    state, ms = jax.lax.scan(body, state, None, length=length)
    return state, jax.tree.map(jnp.mean, ms)

  return chunk


def fit(model: Any, data: dict, num_steps: int, key: jax.Array, log_every: int = 100,
        writer: metrics_lib.MetricWriter | None = None, progress: bool = False, name: str = "train",
        state: Any = None) -> FitResult:
  """Trains `model` for `num_steps` steps.

  Args:
    model: a `TVAE` or `CTGAN`.
    data: device data for `model.make_batch` ({'x': [N, data_dim], ...}).
    num_steps: optimizer steps.
    key: the run's key (split into init and train keys).
    log_every: steps per compiled chunk / metrics row.
    writer: optional MetricWriter (rows 'train/<metric>' per chunk).
    progress: print a progress line.
    name: prefix of the metric keys and the progress label.
    state: resume from this state instead of initialising.

  Returns:
    FitResult(state, history rows, seconds, steps/s).
  """
  if num_steps < 1:
    raise ValueError(f"num_steps must be >= 1, got {num_steps}.")
  key_init, key_train = jax.random.split(key)
  if state is None:
    state = jax.jit(model.init)(key_init)
  log_every = max(1, min(log_every, num_steps))
  compiled = {}
  prog = metrics_lib.Progress(num_steps, name=name, enabled=progress)
  history = []
  t0 = time.perf_counter()
  done = int(jax.device_get(state.step))
  while done < num_steps:
    n = min(log_every, num_steps - done)
    if n not in compiled:
      compiled[n] = jax.jit(make_chunk(model, n), donate_argnums=0)
    state, m = compiled[n](state, data, key_train)
    done += n
    row = {f"{name}/{k}": float(v) for k, v in jax.device_get(m).items()}
    history.append({"step": done, **row})
    if writer is not None:
      writer.write(done, row)
    prog.update(done, row.get(f"{name}/loss"))
  secs = time.perf_counter() - t0
  return FitResult(state=state, history=history, seconds=secs, steps_per_s=num_steps / max(secs, 1e-9))
