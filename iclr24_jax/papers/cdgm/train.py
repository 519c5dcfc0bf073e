"""Training: a jitted `lax.scan` over chunks of steps, with batches sampled inside the step from device data.

Tabular models here are small, so per-step dispatch would dominate on CPU; a chunk of `log_every` steps is one
compiled call (the state is donated), and metrics are pulled once per chunk. `fit_seeds` trains S seeds at once
(the chunk vmapped over a leading seed axis of the state and the key: one compiled program for every seed).

Why not `common.loop.train_loop` (issue 31): train_loop feeds host batches (`batches(step)` -> numpy, stacked
K-deep for `steps_per_call`) and trains one state. Here the whole encoded table stays on device and each step
draws its rows there (`model.make_batch(data, key)`, CTGAN's conditional sampling included), and the
reproduction vmaps over seeds; neither fits train_loop's interface, and host batches would cost a transfer per
step that is larger than the step itself for these networks.
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


def make_seed_chunk(model: Any, length: int) -> Callable:
  """`make_chunk` vmapped over seeds: (states [S, ...], data, keys [S]) -> (states, metrics [S])."""
  return jax.vmap(make_chunk(model, length), in_axes=(0, None, 0))


def fit_seeds(model: Any, data: dict, num_steps: int, keys: jax.Array, log_every: int = 0) -> FitResult:
  """Trains `model` from S seeds at once (one compiled program: the chunk vmapped over the seed axis).

  Seed i follows exactly the stream of `fit(model, data, num_steps, keys[i])` (same init and batch keys); the
  results agree to float rounding (XLA may fuse the batched program differently).

  Args:
    model: a `TVAE` or `CTGAN`.
    data: device data for `model.make_batch`, shared by every seed.
    num_steps: optimizer steps per seed.
    keys: [S] typed keys, one per seed.
    log_every: steps per compiled chunk (0: one chunk of all steps).

  Returns:
    FitResult whose state has a leading [S] axis on every leaf; history rows hold [S]-lists of metrics.
  """
  if num_steps < 1:
    raise ValueError(f"num_steps must be >= 1, got {num_steps}.")
  if keys.ndim != 1:
    raise ValueError(f"keys must be a [S] array of keys (jax.random.split(key, S)), got shape {keys.shape}.")
  split = jax.vmap(jax.random.split)(keys)          # [S, 2]: (key_init, key_train) per seed, as in `fit`
  key_init, key_train = split[:, 0], split[:, 1]
  state = jax.jit(jax.vmap(model.init))(key_init)
  log_every = num_steps if log_every <= 0 else max(1, min(log_every, num_steps))
  history = []
  t0 = time.perf_counter()
  state = _run_chunks(lambda n: make_seed_chunk(model, n), state, data, key_train, 0, num_steps, log_every,
                      lambda done, m: history.append({"step": done, **{f"train/{k}": [float(x) for x in v]
                                                                        for k, v in m.items()}}))
  secs = time.perf_counter() - t0
  return FitResult(state=state, history=history, seconds=secs,
                   steps_per_s=num_steps * int(keys.shape[0]) / max(secs, 1e-9))


def _run_chunks(make: Callable[[int], Callable], state: Any, data: dict, key: jax.Array, done: int, num_steps: int,
                log_every: int, on_chunk: Callable[[int, dict], None]) -> Any:
  """Runs compiled chunks of `log_every` steps from step `done` to `num_steps`; `on_chunk(step, host metrics)`."""
  compiled = {}
  while done < num_steps:
    n = min(log_every, num_steps - done)
    if n not in compiled:
      compiled[n] = jax.jit(make(n), donate_argnums=0)
    state, m = compiled[n](state, data, key)
    done += n
    on_chunk(done, jax.device_get(m))
  return jax.block_until_ready(state)


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
  prog = metrics_lib.Progress(num_steps, name=name, enabled=progress)
  history = []

  def on_chunk(done, m):
    row = {f"{name}/{k}": float(v) for k, v in m.items()}
    history.append({"step": done, **row})
    if writer is not None:
      writer.write(done, row)
    prog.update(done, row.get(f"{name}/loss"))

  t0 = time.perf_counter()
  state = _run_chunks(lambda n: make_chunk(model, n), state, data, key_train, int(jax.device_get(state.step)),
                      num_steps, log_every, on_chunk)
  secs = time.perf_counter() - t0
  return FitResult(state=state, history=history, seconds=secs, steps_per_s=num_steps / max(secs, 1e-9))
