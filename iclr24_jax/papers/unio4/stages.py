"""Small shared helpers: hashable config specs (to cache compiled programs), per-member optimizers, and the
chunked supervised loop of the critic and BC stages."""
from __future__ import annotations

from typing import Any, Callable

import jax
import optax

from iclr24_jax.common.train_state import TrainState


def freeze(cfg: Any) -> Any:
  """A hashable, order-independent copy of a (nested) ConfigDict / dict / list (for lru_cache keys)."""
  if hasattr(cfg, "to_dict"):
    cfg = cfg.to_dict()
  if isinstance(cfg, dict):
    return tuple(sorted((k, freeze(v)) for k, v in cfg.items()))
  if isinstance(cfg, (list, tuple)):
    return tuple(freeze(v) for v in cfg)
  return cfg


def thaw(spec: Any) -> Any:
  """Inverse of `freeze` for the dict level (tuples of (key, value) pairs become dicts)."""
  if isinstance(spec, tuple) and spec and all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str)
                                               for x in spec):
    return {k: thaw(v) for k, v in spec}
  return spec


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


def run_in_chunks(chunk: Callable, state: Any, data: Any, key: jax.Array, num_steps: int, log_every: int | None,
                  to_row: Callable[[dict], dict], callback: Callable[[int, dict], Any] | None = None
                  ) -> tuple[Any, list[dict]]:
  """Runs `chunk(state, data, key, n) -> (state, metrics)` (a compiled `lax.scan` of n steps) until
  `num_steps`, one logged row per chunk.

  Args:
    chunk: the compiled multi-step program (n static).
    state: the initial state.
    data: what `chunk` samples its batches from.
    key: training key (the chunk folds in the step).
    num_steps: total steps.
    log_every: steps per chunk (default num_steps / 10).
    to_row: host metrics of one chunk -> the row's values (the step is added).
    callback: called as callback(step, row) after each chunk.

  Returns:
    (final state, rows [{'step', ...}]).
  """
  every = int(log_every) if log_every else max(1, num_steps // 10)
  history, done = [], 0
  while done < num_steps:
    n = min(every, num_steps - done)
    state, m = chunk(state, data, key, n)
    done += n
    row = {"step": done, **to_row(jax.device_get(m))}
    history.append(row)
    if callback:
      callback(done, row)
  return state, history
