"""Training: a jitted `lax.scan` over chunks of steps, with batches sampled inside the step from device data.

Tabular models here are small, so per-step dispatch would dominate on CPU; a chunk of `log_every` steps is one
compiled call (the state is donated), and metrics are pulled once per chunk. `fit_seeds` trains S seeds at once
(the chunk vmapped over a leading seed axis of the state and the key: one compiled program for every seed).

Why not `common.loop.train_loop`: train_loop feeds host batches (`batches(step)` -> numpy, stacked
K-deep for `steps_per_call`) and trains one state. Here the whole encoded table stays on device and each step
draws its rows there (`model.make_batch(data, key)`, CTGAN's conditional sampling included), and the
reproduction vmaps over seeds; neither fits train_loop's interface, and host batches would cost a transfer per
step that is larger than the step itself for these networks. `fit` still takes everything a resumable run needs
from `common.loop`'s pieces (checkpoints with the loop state, the metrics writer, preemption): the worked example of
an own driver on them.
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp

from iclr24_jax.common import loop as loop_lib


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
                      lambda done, m: history.append({"step": done, **loop_lib.prefix_keys(
                          {k: [float(x) for x in v] for k, v in m.items()}, "train")}))
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


def fit(model: Any, data: dict, num_steps: int, key: jax.Array, log_every: int = 100, workdir: str | None = None,
        progress: bool = False, name: str = "train", checkpoint_every: int = 0, checkpoint_every_secs: float = 0.0,
        max_to_keep: int = 3, config: Any = None) -> FitResult:
  """Trains `model` for `num_steps` steps; with a workdir, resumable and preemptible through `common.loop`'s pieces.

  The driver stays its own (chunks of `log_every` steps drawing batches on device), and uses the shared pieces
  for everything a resumed run needs: `CheckpointHook` (restore-or-init, saves by steps and/or seconds, the final
  save marked finished), `RunLog` (metrics.jsonl, history, progress), `StopCheck` + `stop_on_signals` (SIGTERM /
  SIGINT save at the next chunk boundary and raise `loop.Preempted`). Batches are drawn from
  `fold_in(key, state.step)`, so the data position is the step, and a resumed run replays the same stream.

  Args:
    model: a `TVAE` or `CTGAN`.
    data: device data for `model.make_batch` ({'x': [N, data_dim], ...}).
    num_steps: optimizer steps.
    key: the run's key (split into init and train keys).
    log_every: steps per compiled chunk / metrics row.
    workdir: metrics.jsonl and checkpoints/ go here (None: nothing written, no resume).
    progress: print a progress line.
    name: prefix of the metric keys and the progress label.
    checkpoint_every: save every N steps, a multiple of log_every (saves happen at chunk ends); 0: not by steps.
    checkpoint_every_secs: also save when this many seconds passed since the last save (0: not by time).
    max_to_keep: checkpoints kept.
    config: recorded beside the checkpoints on the first start.

  Returns:
    FitResult(state, history rows (over every resume), seconds and steps/s in the loop over every resume).

  Raises:
    loop.Preempted: a stop was requested; the checkpoint of the chunk boundary it names is saved.
  """
  if num_steps < 1:
    raise ValueError(f"num_steps must be >= 1, got {num_steps}.")
  key_init, key_train = jax.random.split(key)
  log_every = max(1, min(log_every, num_steps))
  if checkpoint_every and checkpoint_every % log_every:
    raise ValueError(f"checkpoint_every={checkpoint_every} is not a multiple of log_every={log_every}: saves happen "
                     "at the end of a compiled chunk of log_every steps; choose a multiple.")
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  hook = None
  if workdir is not None:
    hook = loop_lib.CheckpointHook(os.path.join(workdir, "checkpoints"), every_steps=checkpoint_every,
                                   every_secs=checkpoint_every_secs, max_to_keep=max_to_keep, config=config)
  try:
    if hook is not None:
      state, run = hook.restore_or_init(model.init, key_init, device)
    else:
      state, run = loop_lib.init_state(model.init, key_init, device), loop_lib.LoopState()
    if not run.finished:
      log = loop_lib.RunLog(workdir, run, num_steps=num_steps, name=name, progress=progress)
      stop_check, compiled = loop_lib.StopCheck(), {}
      with loop_lib.stop_on_signals():
        stop = stop_check(run.step)
        if stop:
          raise loop_lib.Preempted(None, stop, hook.directory if hook else None)
        while run.step < num_steps:
          n = min(log_every, num_steps - run.step)
          if n not in compiled:
            compiled[n] = jax.jit(make_chunk(model, n), donate_argnums=0)
          state, m = compiled[n](state, data, key_train)
          step = run.step + n
          log.write(step, loop_lib.prefix_keys(jax.device_get(m), name))   # pulls the chunk's metrics: a sync
          run.step = step
          stop = stop_check(step)
          if hook is not None:
            hook.step_boundary(step, state, run, num_steps=num_steps, stop=stop)
          elif stop and step < num_steps:
            raise loop_lib.Preempted(step, stop, None)
        if hook is not None:
          hook.finish(num_steps, state, run)
        stop = stop or stop_check(num_steps)
        if stop:
          raise loop_lib.Preempted(num_steps, stop, hook.directory if hook else None)
  finally:
    if hook is not None:
      hook.close()
  state = jax.block_until_ready(state)
  return FitResult(state=state, history=run.history, seconds=run.train_seconds, steps_per_s=run.steps_per_s or 0.0)
