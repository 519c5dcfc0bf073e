"""Small shared helpers: per-member optimizers, where the stages save (`Checkpoints`), and the chunked supervised
loop of the critic and BC stages."""
from __future__ import annotations

from typing import Any, Callable

import jax
import optax

from iclr24_jax.common import loop as loop_lib
from iclr24_jax.common.train_state import TrainState


def ensemble_state(params: Any, tx: optax.GradientTransformation, extra: Any = None) -> TrainState:
  """A TrainState over stacked params [K, ...] whose optimizer state is per member (vmapped `tx.init`), so
  gradient clipping and Adam statistics are per policy, as with K separate optimizers."""
  return TrainState(step=jax.numpy.zeros((), jax.numpy.int32), params=params, opt_state=jax.vmap(tx.init)(params),
                    extra=extra, tx=tx)


def ensemble_apply_gradients(state: TrainState, grads: Any, **changes: Any) -> TrainState:
  """`state.apply_gradients` for an `ensemble_state`: the optimizer update is vmapped over the members."""
  updates, opt_state = jax.vmap(state.tx.update)(grads, state.opt_state, state.params)
  return state.replace(step=state.step + 1, params=optax.apply_updates(state.params, updates), opt_state=opt_state,
                       **changes)


# Where the pipeline's stages save and how often: stage `name` keeps `checkpoints/` and `metrics.jsonl` in
# `workdir/name` (`common.loop.Stages`); every_steps counts each stage's own unit (critic / dynamics / BC /
# improvement steps, online PPO updates).
Checkpoints = loop_lib.Stages


def stage_loop(checkpoints: Checkpoints | None, name: str, num_steps: int) -> loop_lib.ResumableLoop:
  """`checkpoints.loop(name, num_steps)`, or a loop that writes nothing when `checkpoints` is None."""
  return loop_lib.stage_loop(checkpoints, name, num_steps)


def run_in_chunks(chunk: Callable, init: Callable[[], Any], data: Any, key: jax.Array, num_steps: int,
                  log_every: int | None, to_row: Callable[[dict], dict],
                  callback: Callable[[int, dict], Any] | None = None, checkpoints: Checkpoints | None = None,
                  name: str = "stage") -> tuple[Any, list[dict]]:
  """Runs `chunk(state, data, key, n) -> (state, metrics)` (a compiled `lax.scan` of n steps) from `init()` until
  `num_steps`, one logged row per chunk; resumable in `checkpoints.workdir/name` (batches are drawn from the
  key folded with the step, so the state is all a resumed stage needs).

  Args:
    chunk: the compiled multi-step program (n static).
    init: () -> the initial state (not called when a checkpoint is restored).
    data: what `chunk` samples its batches from.
    key: training key (the chunk folds in the step).
    num_steps: total steps.
    log_every: steps per chunk (default num_steps / 10).
    to_row: host metrics of one chunk -> the row's values (the step is added).
    callback: called as callback(step, row) after each chunk (of this invocation).
    checkpoints: where the stage saves (None: nothing saved).
    name: the stage's folder name.

  Returns:
    (final state, rows [{'step', ...}] over every resume).

  Raises:
    loop.Preempted: SIGTERM / SIGINT; the checkpoint of the chunk end it names is saved.
  """
  every = int(log_every) if log_every else max(1, num_steps // 10)
  with stage_loop(checkpoints, name, num_steps) as lp:
    state, run = lp.start(init)
    while not lp.finished and run.step < num_steps:
      n = min(every, num_steps - run.step)
      state, m = chunk(state, data, key, n)
      row = to_row(jax.device_get(m))
      lp.boundary(run.step + n, state, row)
      if callback:
        callback(run.step, {"step": run.step, **row})
    lp.finish(state)
  return state, run.history
