"""The training loop, as small pieces and their composition: compile a pure step over the mesh, run it with
logging, eval, keep-best, checkpoints, preemption and exact resume.

A method supplies pure functions:
  init_fn(key) -> TrainState
  train_step(state, batch, key) -> (state, metrics)   # folds state.step into key itself
  batches(step) -> host batch (dict of numpy arrays [B_local, ...]), deterministic in `step`
and `train_loop` does the rest. The step is compiled once with
`jax.jit(step, in_shardings=(state: replicated, batch: P('data'), key: replicated), donate_argnums=0)`.

Two options cover what papers used to write their own loops for:
- `steps_per_call=K` runs K steps per compiled call as one `lax.scan` chunk over K stacked batches (small steps
  are dominated by dispatch; a chunk amortises it). Logging, eval and checkpoints happen at chunk boundaries, so
  their intervals must be multiples of K.
- `keep_best='eval/accuracy'` (with `best_mode='max'|'min'`) keeps a copy of the parameters at the best eval so
  far; `LoopResult.best_params / best_step / best_metric` return them (early stopping by a validation metric).
  A metric of shape [S] keeps the best of each row of parameters stacked on a leading [S] axis (seeds trained
  together, vmapped).

Everything a result depends on is in the checkpoint, so a run killed at any point and started again reports what
an uninterrupted run reports: the TrainState, the keep-best parameters, and `LoopState` (step, the logged history
the results are computed from, the final eval, best metric and step, the training key, cumulative train time and an
own driver's data position in `extra`). A finished run's last checkpoint is marked `finished`: calling the loop
again restores it and returns the same `LoopResult` without training, evaluating or writing anything.

The pieces (`train_loop` is their composition; a paper with its own driver uses them directly):
  StepRunner      the compiled step, or a `lax.scan` chunk of K steps, over the mesh
  EvalHook        when to evaluate, and the eval metrics with their 'eval/' prefix (`prefix_keys`)
  KeepBest        the best-so-far parameters by one eval metric (scalar, or one per stacked row)
  CheckpointHook  restore-or-init (or `restore_latest`: restore or None), when to save (every N steps and/or every
                  N seconds), the composite save
  RunLog          metrics.jsonl (`metrics.open_writer`), the in-memory history, the progress line and callbacks
  StopCheck       SIGTERM / SIGINT (`stop_on_signals`) seen at a step boundary, one agreed step on multi-host
  Preempted       raised once the checkpoint of that boundary is saved; the launcher turns it into one line
  ResumableLoop   the pieces above put together for an own driver's loop (one per stage of a staged driver)
  Stages          a staged driver's ResumableLoops, one folder per stage (`stage_loop`); `from_config` checks
                  the workdir's config record (`checkpoint.ensure_config`) unless the launcher did

An own driver (say, a chunked loop whose batches are drawn on device from a key; `papers/cdgm/train.py:fit` is
the worked example) reads:

  hook = loop.CheckpointHook(os.path.join(workdir, 'checkpoints'), config=config,
                             every_steps=config.checkpoint_every, every_secs=config.checkpoint_every_secs)
  try:
    state, run = hook.restore_or_init(init_fn, key_init, shardings)   # run: LoopState (run.step 0 when fresh)
    if not run.finished:
      log, stop_check = loop.RunLog(workdir, run, num_steps=num_steps, name='mine'), loop.StopCheck()
      with loop.stop_on_signals():
        while run.step < num_steps:
          state, metrics = chunk(state, n)                   # the driver's own compiled call of n steps
          log.write(run.step + n, loop.prefix_keys(jax.device_get(metrics), 'train'))
          run.step += n
          hook.step_boundary(run.step, state, run, num_steps=num_steps, stop=stop_check(run.step))
        hook.finish(num_steps, state, run)                   # the final save, marked finished
  finally:
    hook.close()

`hook.step_boundary` saves when an interval is due or a stop was requested, and raises `Preempted` after a
requested stop's save; a rerun of a finished run restores it and skips the loop. A data position that is not a
function of the step (an iterator, an environment state) goes into `run.extra` (JSON) or into the state pytree;
keep-best parameters go through `KeepBest` and `step_boundary(..., best=keep.params)`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import signal
import sys
import threading
import time
from typing import Any, Callable, Iterator, Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from iclr24_jax.common import checkpoint as ckpt_lib
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.common import sharding

TrainStep = Callable[[Any, Any, jax.Array], tuple[Any, Mapping[str, jax.Array]]]


def compile_step(step_fn: TrainStep, mesh: Mesh, state_sharding: Any = None, batch_sharding: Any = None,
                 donate: bool = True) -> Callable:
  """Compiles `step_fn(state, batch, key) -> (state, metrics)` over `mesh`.

  Args:
    step_fn: the pure step.
    mesh: the device mesh.
    state_sharding: a sharding (or pytree prefix of shardings) for the state; default replicated.
    batch_sharding: default `P('data')` on every batch leaf.
    donate: donate the input state's buffers (the caller must not reuse the old state).

  Returns:
    The jitted step.
  """
  rep = sharding.replicated_sharding(mesh)
  state_sh = rep if state_sharding is None else state_sharding
  batch_sh = sharding.data_sharding(mesh) if batch_sharding is None else batch_sharding
  return _jit(step_fn, in_shardings=(state_sh, batch_sh, rep), out_shardings=(state_sh, rep),
              donate_argnums=(0,) if donate else ())


# One jitted function per (partial, jit options), so a second run with equal settings reuses the first run's
# compilations. A `functools.partial` of hashable arguments (a top-level step or init with its model, sizes and
# optimizer bound) is keyed by value: every run builds a new partial object, and jit keys its own cache by the
# function's identity. Equal optimizers are the same object (`common.optim`), so equal configs give equal keys.
# Anything else (a closure, a partial holding arrays) goes to jax.jit as it is: jit's own cache holds functions
# weakly, and a closure may hold large arrays that this cache must not keep alive.
_JITTED: dict[Any, Callable] = {}
_JITTED_MAX = 256


def _jit(fn: Callable, **jit_kwargs: Any) -> Callable:
  """`jax.jit(fn, **jit_kwargs)`; the same object for partials of equal hashable arguments and equal options."""
  if not isinstance(fn, functools.partial):
    return jax.jit(fn, **jit_kwargs)
  key = (fn.func, fn.args, tuple(sorted(fn.keywords.items())), tuple(sorted(jit_kwargs.items())))
  try:
    hit = _JITTED.get(key)
  except TypeError:   # an argument or option that does not hash (an array, a pytree of shardings)
    return jax.jit(fn, **jit_kwargs)
  if hit is None:
    if len(_JITTED) >= _JITTED_MAX:
      _JITTED.pop(next(iter(_JITTED)))   # the oldest: a long study does not hold every program forever
    hit = _JITTED[key] = jax.jit(fn, **jit_kwargs)
  return hit


def loop_grads_are_slow(backend: str | None = None) -> bool:
  """True where gradients of convolutions run far slower inside a compiled loop than in a plain jitted call.

  On XLA:CPU the backward convolutions (their dimension numbers are not channel-last) lose the fast Eigen path
  inside a while-loop body (jax-ml/jax#12868, open). Measured here with jax 0.9.2 on 2 cores: a 3-layer CNN
  step 6.6 ms plain vs 133 ms per step under `lax.scan` (20x); DA-CLIP's restorer UNet 67 ms vs 573 ms (8.5x);
  the forward pass alone is as fast in a loop. Papers whose train step contains a convolution therefore run
  steps as a host loop of one jitted step on CPU, and as a `lax.scan` on accelerators.

  Args:
    backend: a backend name; None = `jax.default_backend()`.

  Returns:
    bool.
  """
  return (backend or jax.default_backend()) == "cpu"


def repeat_step(step_fn: Callable[..., tuple[Any, Mapping[str, jax.Array]]], *, loop: bool | None = None,
                donate: bool = False) -> Callable[..., tuple[Any, dict]]:
  """`run(state, start, n, *args) -> (state, mean metrics)`: `state, m = step_fn(state, i, *args)` for i in
  start .. start + n - 1 (batches drawn on device inside `step_fn`, e.g. keyed by i).

  Args:
    step_fn: `(state, i int32 scalar, *args) -> (state, metrics)`, pure.
    loop: True runs the n steps as one jitted `lax.fori_loop` (n traced: no recompile for a new n); False as a
      host loop of one jitted step; None = False where `loop_grads_are_slow()` (CPU), True elsewhere.
    donate: donate the state's buffers to each call (the caller must not reuse the state it passed).

  Returns:
    run(state, start, n, *args): the final state and the mean of each metric over the n steps.
  """
  if loop is None:
    loop = not loop_grads_are_slow()
  tree_map = jax.tree_util.tree_map
  if loop:
    def run_loop(state, start, n, *args):
      shapes = jax.eval_shape(lambda: step_fn(state, start, *args)[1])

      def body(i, carry):
        st, total = carry
        st, m = step_fn(st, start + i, *args)
        return st, tree_map(lambda a, b: a + b.astype(a.dtype), total, m)

      zeros = tree_map(lambda sd: jax.numpy.zeros(sd.shape, jax.numpy.float32), shapes)
      state, total = jax.lax.fori_loop(0, n, body, (state, zeros))
      return state, tree_map(lambda v: v / jax.numpy.maximum(n, 1), total)

    compiled = jax.jit(run_loop, donate_argnums=(0,) if donate else ())
    return lambda state, start, n, *args: compiled(state, np.int32(start), np.int32(n), *args)

  one = jax.jit(step_fn, donate_argnums=(0,) if donate else ())

  def run_host(state, start, n, *args):
    total = None
    for i in range(int(n)):
      state, m = one(state, np.int32(start + i), *args)
      m = tree_map(lambda v: v.astype(jax.numpy.float32), m)
      total = m if total is None else tree_map(lambda a, b: a + b, total, m)
    if total is None:   # n = 0: the state unchanged, zero metrics (as the loop path gives)
      shapes = jax.eval_shape(step_fn, state, np.int32(start), *args)[1]
      return state, tree_map(lambda sd: jax.numpy.zeros(sd.shape, jax.numpy.float32), shapes)
    return state, tree_map(lambda v: v / int(n), total)

  return run_host


def scan_steps(step_fn: TrainStep) -> TrainStep:
  """K steps as one function: `chunk(state, stacked_batches [K, B, ...], key) -> (state, metrics [K])`.

  Args:
    step_fn: the pure step `(state, batch, key) -> (state, metrics)` (it folds state.step into key itself, so
      every step of the chunk gets its own stream, identical to K single calls).

  Returns:
    The chunked step; its metrics carry a leading [K] axis.
  """
  def chunk(state, batches, key):
    def body(st, batch):
      return step_fn(st, batch, key)
    return jax.lax.scan(body, state, batches)
  return chunk


# Backend optimisation level 0: what `compile_fast` asks XLA for.
FAST_COMPILE_OPTIONS = {"xla_backend_optimization_level": 0}


def compile_fast(fn: Callable, *args: Any, cpu_only: bool = False,
                 options: Mapping[str, Any] | None = None) -> Any:
  """Lowers and compiles `fn` for `args` at XLA backend optimisation level 0: for programs that run once or briefly.

  Why level 0: on XLA:CPU the backend optimisations dominate the compile time of one-shot programs while saving
  little run time. Measured on this project's 2-core CPU: a conv net's init compiles 4-7x faster (values agree
  with an optimised compile to float rounding, ~1e-7); FPS's image-study programs (about 1 s of run time) took
  8-13 s to compile at the default level and compile 3-4x faster at level 0 for about 2x slower runs. A program
  that runs long (a train step) keeps the default level. A backend without the option compiles normally.

  Args:
    fn: a function, or a `jax.jit`-wrapped one (its shardings and static arguments are kept).
    *args: example arguments (their shapes, dtypes and shardings fix the program).
    cpu_only: use level 0 only on the CPU backend (for programs that run long enough on an accelerator that its
      optimisations pay off).
    options: other XLA compile options instead of level 0 (a measured per-program choice).

  Returns:
    the compiled executable; call it with arguments like `args`.
  """
  lowered = (fn if hasattr(fn, "lower") else jax.jit(fn)).lower(*args)
  if cpu_only and jax.default_backend() != "cpu":
    return lowered.compile()
  try:
    return lowered.compile(dict(FAST_COMPILE_OPTIONS if options is None else options))
  except Exception:  # a backend without these options compiles normally
    return lowered.compile()


def init_state(init_fn: Callable[[jax.Array], Any], key: jax.Array, shardings: Any) -> Any:
  """Runs `init_fn(key)` once, compiled straight onto `shardings` (at level 0: see `compile_fast`).

  Args:
    init_fn: key -> state pytree (e.g. a TrainState).
    key: PRNG key passed to init_fn.
    shardings: a sharding, or a pytree of shardings matching the state (jit's out_shardings).

  Returns:
    the state pytree, its arrays placed on `shardings`.
  """
  return compile_fast(_jit(init_fn, out_shardings=shardings), key)(key)


def abstract_state(init_fn: Callable[[jax.Array], Any], key: jax.Array, shardings: Any) -> Any:
  """`jax.eval_shape(init_fn, key)` with target shardings attached (for restoring).

  Args:
    init_fn: key -> state pytree.
    key: PRNG key (only its shape / dtype matter).
    shardings: one sharding for every leaf, or a pytree of shardings matching the state.

  Returns:
    pytree of jax.ShapeDtypeStruct (shape, dtype, sharding) shaped like the state; no computation runs.
  """
  shapes = jax.eval_shape(init_fn, key)
  if isinstance(shardings, jax.sharding.Sharding):
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=shardings), shapes)
  return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)


# ----------------------------------------------------------------------------------------------------------------
# The pieces
# ----------------------------------------------------------------------------------------------------------------


def prefix_keys(metrics: Mapping[str, Any], prefix: str) -> dict[str, Any]:
  """`{'loss': v, 'val/auc': w}` -> `{'<prefix>/loss': v, 'val/auc': w}`: keys that already name a group keep it.

  Args:
    metrics: name -> value.
    prefix: the group, e.g. 'train' or 'eval'.

  Returns:
    a new dict.
  """
  return {k if "/" in k else f"{prefix}/{k}": v for k, v in metrics.items()}


def _mean_metrics(rows: list[Mapping[str, Any]]) -> dict[str, float]:
  rows = jax.device_get(rows)
  out = {}
  for k in rows[-1]:
    vals = [np.asarray(r[k], np.float64).ravel() for r in rows if k in r]  # a scan chunk logs [K] values
    out[k] = float(np.mean(np.concatenate(vals)))
  return out


def _encode_key(key: jax.Array) -> dict:
  return {"impl": str(jax.random.key_impl(key)), "data": np.asarray(jax.random.key_data(key)).tolist()}


def _decode_key(saved: Mapping[str, Any]) -> jax.Array:
  return jax.random.wrap_key_data(np.asarray(saved["data"], np.uint32), impl=saved["impl"])


@dataclasses.dataclass
class LoopState:
  """What a loop carries besides the TrainState; saved as JSON in every checkpoint (`to_json` / `from_json`).

  Attributes:
    step: the global step reached.
    history: the rows written to metrics.jsonl so far (train means, eval metrics), the results' source.
    final_eval: the eval after the last step (None before it).
    finished: the run reached num_steps and its final eval; a rerun returns it as stored.
    best_step, best_metric: keep-best's step and value (lists for a per-row metric), None before any eval.
    train_seconds, timed_steps: wall seconds spent in the loop and the steps they covered, over every resume.
    save_seconds: seconds the loop was blocked by checkpoint saves (the part before an async write goes on).
    key: the training key ({'impl', 'data'}), so a resumed run draws the same stream.
    extra: an own driver's JSON state (a data position that is not a function of the step, counters, ...).
  """

  step: int = 0
  history: list = dataclasses.field(default_factory=list)
  final_eval: dict | None = None
  finished: bool = False
  best_step: Any = None
  best_metric: Any = None
  train_seconds: float = 0.0
  timed_steps: int = 0
  save_seconds: float = 0.0
  key: dict | None = None
  extra: dict = dataclasses.field(default_factory=dict)

  def to_json(self) -> dict:
    """The JSON-safe dict saved in the checkpoint's 'loop' item."""
    return metrics_lib.to_python(dataclasses.asdict(self))

  @classmethod
  def from_json(cls, saved: Mapping[str, Any]) -> "LoopState":
    """The LoopState of a saved dict (unknown keys, e.g. from a newer version, are ignored)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in saved.items() if k in names})

  @property
  def steps_per_s(self) -> float | None:
    """Steps per wall second in the loop over the whole run (every resume), or None before any timed step."""
    return self.timed_steps / self.train_seconds if self.timed_steps and self.train_seconds > 0 else None


class Preempted(Exception):
  """A stop was requested (SIGTERM / SIGINT); the checkpoint of step `step` is saved and the run can resume.

  Attributes:
    step: the step the checkpoint holds (None: the signal came outside a training loop, e.g. while data loaded
      or between two loops; the last complete checkpoint resumes the run).
    signal_name: 'SIGTERM', 'SIGINT' or what `request_stop` was given.
    where: the checkpoint folder (or None when the loop writes none).
    exit_code: 128 + the signal number (143 SIGTERM, 130 SIGINT), as a shell reports a process the signal ended.
  """

  def __init__(self, step: int | None, signal_name: str, where: str | None):
    self.step, self.signal_name, self.where = (None if step is None else int(step)), signal_name, where
    num = {"SIGINT": signal.SIGINT}.get(signal_name, signal.SIGTERM)
    self.exit_code = 128 + int(num)
    if step is None:
      msg = (f"stopped by {signal_name} outside a training loop (loading data, evaluating, or between two loops); "
             "nothing new was saved, the last complete checkpoint resumes the run.")
    else:
      saved = f"checkpoint of step {step} saved in {where}" if where else "no workdir, nothing saved"
      msg = f"stopped by {signal_name} at step {step}; {saved}."
    super().__init__(msg)


_STOP: dict[str, str | None] = {"signal": None}
_DEPTH = [0]   # nesting of `stop_on_signals` contexts


def request_stop(reason: str = "SIGTERM") -> None:
  """Asks every running loop to save and stop at its next step boundary (what the signal handlers do).

  Args:
    reason: the name reported by `Preempted` ('SIGTERM', 'SIGINT', ...).
  """
  _STOP["signal"] = reason


def stop_requested() -> str | None:
  """The pending stop request of this process, or None."""
  return _STOP["signal"]


def clear_stop() -> None:
  """Forgets a pending stop request (the launcher does this when a run starts)."""
  _STOP["signal"] = None


def _preemption_sync_manager() -> Any:
  try:
    from jax._src import distributed
    return distributed.global_state.preemption_sync_manager
  except (ImportError, AttributeError):
    return None


@contextlib.contextmanager
def stop_on_signals(immediate: bool = False) -> Iterator[None]:
  """While active, SIGTERM and SIGINT request a stop at the next step boundary instead of killing the process.

  A second SIGINT interrupts at once (KeyboardInterrupt). On a multi-process run with JAX's preemption service
  (`jax.distributed.initialize`), SIGTERM is left to that service, which agrees on one step for every process
  (`multihost_utils.reached_preemption_sync_point`, read by `StopCheck`). Outside the main thread nothing is
  installed. The previous handlers come back on exit; nesting is fine (the loop nests its own inside the
  launcher's), and when the outermost context exits the request is forgotten (it belonged to the run it stopped).

  Args:
    immediate: raise `Preempted` (step None) at once instead: the launcher's setting around a whole run, so a
      signal outside any training loop (data loading, sampling) still ends the run promptly, while the loops
      (which enter this context themselves) stop at a step boundary with a checkpoint.
  """
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  service = jax.process_count() > 1 and _preemption_sync_manager() is not None
  names = {signal.SIGINT: "SIGINT"} if service else {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}

  def handler(signum, frame):
    del frame
    name = names[signum]
    if name == "SIGINT" and _STOP["signal"] == "SIGINT":
      raise KeyboardInterrupt
    _STOP["signal"] = name
    if immediate:
      raise Preempted(None, name, None)
    print(f"{name} received: saving a checkpoint at the next step boundary"
          + (" (Ctrl-C again stops at once, unsaved)." if name == "SIGINT" else "."), file=sys.stderr, flush=True)

  old = {s: signal.signal(s, handler) for s in names}
  _DEPTH[0] += 1
  try:
    yield
  finally:
    for s, h in old.items():
      signal.signal(s, h)
    _DEPTH[0] -= 1
    if _DEPTH[0] == 0:   # the outermost context (the launcher's, or a loop called on its own) ends the request
      clear_stop()


# The number of stop checks this process has made, over every loop and stage: the id each check gives JAX's
# preemption sync point. The service agrees on (the largest last id of all processes) + 1 and answers True only at
# a call with exactly that id, so the ids must be consecutive and the same sequence on every process. A loop's step
# is neither across the loops of one run: a staged driver's stages each count from 0 (a notice that came while the
# last stage ended would agree on an id the next stage reaches mid-way or never), and a chunked loop's steps jump
# by the chunk (max + 1 is then never a step). Every process runs the same loops with the same boundaries, so the
# n-th check is the same boundary everywhere.
_SYNC_IDS = [0]


class StopCheck:
  """`check(step, sync_point) -> reason | None` at step boundaries: the same answer on every process.

  One process: the pending request (`stop_requested`). Several: JAX's preemption sync point (SIGTERM seen by any
  host; its id is this process's count of stop checks over every loop and stage of the run, not the loop's step:
  see `_SYNC_IDS`), and at sync points (the loop's logging boundaries, where it waits for the device anyway) any
  process's SIGINT / request, gathered with `multihost_utils.process_allgather`. Every `train_loop`,
  `ResumableLoop` (each stage of `Stages`) and own driver makes its checks through this class, so they share the
  one sequence of ids.
  """

  def __init__(self):
    self.multi = jax.process_count() > 1

  def __call__(self, step: int, sync_point: bool = True) -> str | None:
    del step   # the stop is agreed on by this process's count of checks (see `_SYNC_IDS`), not by a loop's step
    if not self.multi:
      return stop_requested()
    from jax.experimental import multihost_utils
    _SYNC_IDS[0] += 1
    if _preemption_sync_manager() is not None and multihost_utils.reached_preemption_sync_point(_SYNC_IDS[0]):
      return stop_requested() or "SIGTERM"
    if sync_point:
      flags = multihost_utils.process_allgather(np.int32(stop_requested() is not None))
      if np.any(flags):
        return stop_requested() or "SIGTERM"
    return None


_OBSERVERS: list[Callable[[int, dict], None]] = []


@contextlib.contextmanager
def observe(progress_fn: Callable[[int, dict], None] | None) -> Iterator[None]:
  """While active, every `RunLog` row is also passed to `progress_fn(step, row)` (brax's `progress_fn` habit).

  Args:
    progress_fn: called on the host with the global step and the logged row (Python floats); None: nothing.
  """
  if progress_fn is None:
    yield
    return
  _OBSERVERS.append(progress_fn)
  try:
    yield
  finally:
    _OBSERVERS.remove(progress_fn)


class RunLog:
  """The writer: metrics.jsonl (process 0), the run's history, the progress line and the progress callbacks.

  Args:
    workdir: the run's folder (None: nothing written; history and callbacks still work).
    run: the LoopState; its `history` is appended to and its train time kept up to date, so a checkpoint taken
      at any boundary holds both. `run.step` is where this invocation starts: rows after it are dropped from
      metrics.jsonl (a resumed run's file reads as one run); a fresh start (step 0) replaces the file.
    num_steps: the run's total (for the progress line).
    name: the progress line's label.
    progress: print the progress line (process 0).
  """

  def __init__(self, workdir: str | None, run: LoopState, *, num_steps: int, name: str = "train",
               progress: bool = True):
    self.run = run
    self.writer = metrics_lib.open_writer(workdir, run.step)
    self.prog = metrics_lib.Progress(num_steps, start=run.step, name=name,
                                     enabled=progress and jax.process_index() == 0)
    self._t0, self._start = time.perf_counter(), run.step
    self._base_seconds, self._base_steps = run.train_seconds, run.timed_steps

  @property
  def history(self) -> list[dict]:
    """The rows logged so far (over every resume)."""
    return self.run.history

  def tick(self, step: int) -> None:
    """Counts the wall time since this invocation started toward the run's train time, up to `step`."""
    self.run.train_seconds = self._base_seconds + time.perf_counter() - self._t0
    self.run.timed_steps = self._base_steps + int(step) - self._start

  def write(self, step: int, row: Mapping[str, Any], show: bool = True, loss_key: str | None = None) -> dict:
    """Logs one row: history, metrics.jsonl, progress callbacks and (`show`) the progress line.

    Args:
      step: the global step.
      row: metric name -> value (arrays are pulled to host here).
      show: update the progress line (False for eval-only rows).
      loss_key: the key shown as the progress line's loss (default: the first key ending in 'loss').

    Returns:
      the row as written (Python values, with 'step').
    """
    self.tick(step)
    out = {"step": int(step), **metrics_lib.to_python(dict(row))}
    self.run.history.append(out)
    if self.writer is not None:
      self.writer.write(step, {k: v for k, v in out.items() if k != "step"})
    for fn in list(_OBSERVERS):
      fn(int(step), dict(out))
    if show:
      key = loss_key or next((k for k in out if k.endswith("loss")), None)
      loss = out.get(key) if key else None
      self.prog.update(int(step), loss if isinstance(loss, (int, float)) else None)
    return out

  def close(self) -> None:
    """Closes the TensorBoard event file of the writer (metrics.jsonl needs nothing)."""
    if self.writer is not None:
      self.writer.close()


class StepRunner:
  """One compiled step, or a `lax.scan` chunk of K steps, over the mesh: `runner(state, batches, step, last, key)`.

  Args:
    train_step: the pure step `(state, batch, key) -> (state, metrics)`.
    mesh: the mesh.
    state_sharding: the state's shardings (default replicated).
    steps_per_call: K; the last steps before `last` that do not fill a chunk run one by one.
  """

  def __init__(self, train_step: TrainStep, mesh: Mesh, *, state_sharding: Any = None, steps_per_call: int = 1):
    if steps_per_call < 1:
      raise ValueError(f"steps_per_call must be >= 1, got {steps_per_call}.")
    self.mesh, self.k = mesh, int(steps_per_call)
    self.step_fn = compile_step(train_step, mesh, state_sharding=state_sharding)
    self.chunk_fn = None
    if self.k > 1:
      chunk_sh = NamedSharding(mesh, jax.sharding.PartitionSpec(None, sharding.DATA_AXIS))
      self.chunk_fn = compile_step(scan_steps(train_step), mesh, state_sharding=state_sharding,
                                   batch_sharding=chunk_sh)

  def __call__(self, state: Any, batches: Callable[[int], Any], step: int, last: int, key: jax.Array
               ) -> tuple[Any, Any, int]:
    """Runs the steps from `step`: a chunk of K when it fits before `last`, else one.

    Args:
      state: the (donated) state.
      batches: step -> this host's batch.
      step: the first step to run.
      last: the step not to pass.
      key: the training key.

    Returns:
      (state, metrics (a leading [K] axis for a chunk), the number of steps run).
    """
    if self.chunk_fn is not None and step + self.k <= last:
      host = [batches(i) for i in range(step, step + self.k)]
      stacked = jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *host)
      state, metrics = self.chunk_fn(state, sharding.shard_batch(stacked, self.mesh, stacked=True), key)
      return state, metrics, self.k
    state, metrics = self.step_fn(state, sharding.shard_batch(batches(step), self.mesh), key)
    return state, metrics, 1


class EvalHook:
  """When to evaluate and the eval metrics, prefixed 'eval/'.

  Args:
    eval_fn: state -> dict of metrics (host side), or None (never due).
    every: evaluate every N steps before the last (0: only the final eval).
    num_steps: the run's last step (its eval is the final one, run by the loop once).
  """

  def __init__(self, eval_fn: Callable[[Any], Mapping[str, Any]] | None, every: int, num_steps: int):
    self.eval_fn, self.every, self.num_steps = eval_fn, int(every or 0), int(num_steps)

  def due(self, step: int) -> bool:
    """True at the interval's steps before the last."""
    return self.eval_fn is not None and self.every > 0 and step % self.every == 0 and step != self.num_steps

  def __call__(self, state: Any) -> dict[str, Any]:
    """The eval metrics of `state` as Python values with the 'eval/' prefix."""
    return metrics_lib.to_python(prefix_keys(self.eval_fn(state), "eval"))


class KeepBest:
  """The parameters at the best value so far of one eval metric (early stopping by validation).

  A scalar metric keeps one copy. A metric of shape [S] keeps, row by row, the best of parameters stacked on a
  leading [S] axis (S seeds trained together). A NaN value is never the best. The copies live on device (the
  loop donates the state's buffers, so a reference would not survive the next step).

  Args:
    metric: the eval key ('eval/accuracy', or 'accuracy' for 'eval/accuracy').
    mode: 'max' or 'min'.
  """

  def __init__(self, metric: str, mode: str = "max"):
    if mode not in ("max", "min"):
      raise ValueError(f"best_mode must be 'max' or 'min', got {mode!r}.")
    self.metric, self.mode = metric, mode
    self.params: Any = None
    self.step: Any = None
    self.value: Any = None

  def _name(self, metrics: Mapping[str, Any]) -> str:
    for name in (self.metric, f"eval/{self.metric}"):
      if name in metrics:
        return name
    raise ValueError(f"keep_best={self.metric!r} is not among the eval metrics {sorted(metrics)}.")

  def update(self, step: int, metrics: Mapping[str, Any], params: Any) -> bool:
    """Keeps a copy of `params` where `metrics[metric]` beats the best so far.

    Args:
      step: the eval's step.
      metrics: the eval metrics.
      params: the current parameters (leading [S] axis for a per-row metric).

    Returns:
      True when any row improved.
    """
    value = np.asarray(metrics[self._name(metrics)], np.float64)
    worst = -np.inf if self.mode == "max" else np.inf
    old = np.full(value.shape, worst) if self.value is None else np.asarray(self.value, np.float64)
    better = (value > old) if self.mode == "max" else (value < old)
    better &= ~np.isnan(value)
    if not np.any(better):
      return False
    if value.ndim == 0:
      self.params = jax.tree.map(lambda x: x.copy() if hasattr(x, "copy") else x, params)
      self.step, self.value = int(step), float(value)
      return True
    if value.ndim != 1:
      raise ValueError(f"keep_best={self.metric!r} must be a scalar or one value per row [S], got shape "
                       f"{value.shape}.")
    mask = jax.numpy.asarray(better)
    pick = lambda new, cur: jax.numpy.where(mask.reshape((-1,) + (1,) * (new.ndim - 1)), new, cur)
    self.params = (jax.tree.map(lambda x: x.copy(), params) if self.params is None
                   else jax.tree.map(pick, params, self.params))
    steps = np.full(value.shape, -1) if self.step is None else np.asarray(self.step)
    self.step = np.where(better, int(step), steps).tolist()
    self.value = np.where(better, value, old).tolist()
    return True

  def result(self, final_params: Any) -> Any:
    """The best parameters; `final_params` where nothing was kept (no eval, or a row never finite)."""
    if self.params is None:
      return final_params
    if self.value is None or np.ndim(self.value) == 0:
      return self.params
    never = jax.numpy.asarray(np.asarray(self.step) < 0)
    return jax.tree.map(lambda b, f: jax.numpy.where(never.reshape((-1,) + (1,) * (b.ndim - 1)), f, b),
                        self.params, final_params)

  def save_to(self, run: LoopState) -> None:
    """Writes the best step and value into the LoopState (the parameters go into the checkpoint's 'best')."""
    run.best_step, run.best_metric = self.step, self.value

  def load_from(self, run: LoopState, params: Any) -> None:
    """Restores the best step, value and parameters (`params`: the checkpoint's 'best' item, or None)."""
    self.step, self.value, self.params = run.best_step, run.best_metric, params


class CheckpointHook:
  """Restore-or-init, when to save (steps and/or wall seconds), the composite save and the final one.

  Args:
    directory: the checkpoint folder (e.g. `workdir/checkpoints`).
    every_steps: save every N steps (0: not by steps).
    every_secs: save when N wall seconds passed since the last save (0: not by time); on multi-host the decision
      is process 0's, taken at sync points (the loop's logging boundaries).
    max_to_keep: checkpoints kept.
    config: recorded as `directory/config.json` on the first start.
    async_save: write in the background (orbax copies to host first; see `Checkpointer`).
  """

  def __init__(self, directory: str, *, every_steps: int = 0, every_secs: float = 0.0, max_to_keep: int = 3,
               config: Any = None, async_save: bool = True):
    self.checkpointer = ckpt_lib.Checkpointer(directory, max_to_keep=max_to_keep, config=config,
                                              async_save=async_save)
    self.directory = self.checkpointer.directory
    self.every_steps, self.every_secs = int(every_steps or 0), float(every_secs or 0.0)
    self._last_save = time.monotonic()

  def restore_or_init(self, init_fn: Callable[[jax.Array], Any], key: jax.Array, shardings: Any,
                      keep: KeepBest | None = None) -> tuple[Any, LoopState]:
    """The latest checkpoint's state and LoopState, or `init_fn(key)` and a fresh LoopState.

    Args:
      init_fn: key -> state (pure).
      key: the init key.
      shardings: the state's shardings.
      keep: restores the keep-best parameters, step and value into it when given.

    Returns:
      (state, LoopState).
    """
    if self.checkpointer.latest_step() is None:
      return init_state(init_fn, key, shardings), LoopState()
    return self.restore_latest(abstract_state(init_fn, key, shardings), keep)

  def restore_latest(self, target: Any, keep: KeepBest | None = None) -> tuple[Any, LoopState] | None:
    """The latest checkpoint's state and LoopState, or None when the folder holds none.

    For a driver whose fresh state is not `init_fn(key)` compiled on its own (state built by several compiled
    pieces, or trained by an earlier phase): it restores, and builds the fresh state itself on None.

    Args:
      target: the state's structure: a pytree of `jax.ShapeDtypeStruct` with shardings (`abstract_state`), or
        a concrete state of the right structure.
      keep: restores the keep-best parameters (of `target.params`' structure), step and value into it when given.

    Returns:
      (state, LoopState), or None.
    """
    step = self.checkpointer.latest_step()
    if step is None:
      return None
    state = self.checkpointer.restore(target, step)
    saved = self.checkpointer.restore_loop(step)
    run = LoopState.from_json(saved) if saved is not None else LoopState(step=int(step))
    if keep is not None and run.best_step is not None:
      keep.load_from(run, self.checkpointer.restore_best(target.params, step))
    self._last_save = time.monotonic()
    return state, run

  def due(self, step: int, sync_point: bool = True) -> bool:
    """True when the step interval or the time interval has come.

    Args:
      step: the step reached.
      sync_point: on multi-host, the time rule is decided only here (process 0's clock, broadcast).
    """
    if self.every_steps and step % self.every_steps == 0:
      return True
    if not self.every_secs:
      return False
    if jax.process_count() == 1:
      return time.monotonic() - self._last_save >= self.every_secs
    if not sync_point:
      return False
    from jax.experimental import multihost_utils
    mine = np.int32(time.monotonic() - self._last_save >= self.every_secs)
    return bool(multihost_utils.broadcast_one_to_all(mine))

  def save(self, step: int, state: Any, run: LoopState, best: Any = None, wait: bool = False) -> None:
    """Saves state, `run` (JSON) and `best` at `step`; the blocking time is added to `run.save_seconds`."""
    t0 = time.perf_counter()
    run.step = int(step)
    self.checkpointer.save(step, state, wait=wait, loop=run.to_json(), best=best)
    run.save_seconds += time.perf_counter() - t0
    self._last_save = time.monotonic()

  def step_boundary(self, step: int, state: Any, run: LoopState, *, num_steps: int, stop: str | None = None,
                    best: Any = None, sync_point: bool = True) -> None:
    """At a step boundary before the last: saves when due or stopping; after a stop's save, raises Preempted.

    At the last step it does nothing: the caller runs its final eval and `finish`, then stops if asked.

    Args:
      step: the step reached.
      state, run, best: what to save.
      num_steps: the run's last step (saved by `finish` instead).
      stop: a stop reason from `StopCheck` (None: continue).
      sync_point: passed to `due`.

    Raises:
      Preempted: when `stop` is set, once the save is complete.
    """
    if step >= num_steps:   # the last step: `finish` saves it, after the final eval
      return
    if stop or self.due(step, sync_point):
      self.save(step, state, run, best=best, wait=bool(stop))
    if stop:
      raise Preempted(step, stop, self.directory)

  def finish(self, step: int, state: Any, run: LoopState, best: Any = None) -> None:
    """The final save, with `run.finished` set: a rerun restores it and trains nothing."""
    run.finished = True
    self.save(step, state, run, best=best)

  def close(self) -> None:
    """Waits for pending writes and releases the manager."""
    self.checkpointer.close()


def checkpoint_options(config: Any) -> dict[str, Any]:
  """`train_loop`'s checkpoint keywords from a config: checkpoint_every, checkpoint_every_secs, max_to_keep."""
  out = {"checkpoint_every": int(config.get("checkpoint_every", 0) or 0),
         "checkpoint_every_secs": float(config.get("checkpoint_every_secs", 0.0) or 0.0)}
  if config.get("max_to_keep") is not None:
    out["max_to_keep"] = int(config.get("max_to_keep"))
  return out


class ResumableLoop:
  """An own driver's loop on the pieces, for drivers with several loops (stages) or state built by many programs.

  `CheckpointHook` in `workdir/checkpoints`, `RunLog` in `workdir/metrics.jsonl`, `StopCheck` under
  `stop_on_signals`, and the bookkeeping between them (the step, the stop seen at a boundary, the final save).
  With workdir None nothing is written or restored; the history, the progress callbacks and the stops still work.

    with loop.ResumableLoop(os.path.join(workdir, 'critic'), num_steps=n, config=config, every_steps=...) as lp:
      state, run = lp.start(fresh)          # the latest checkpoint, or fresh() (run.step 0)
      while not lp.finished and run.step < n:
        state, metrics = chunk(state, ...)  # the driver's own compiled call(s)
        lp.boundary(run.step + k, state, row)   # logs; saves when due; a stop: saves, raises Preempted
      lp.finish(state)                       # the final save, marked finished (a rerun skips the loop)

  A driver's own decisions and data position go into `run.extra` (JSON) or the state pytree before `boundary`.

  Args:
    workdir: the loop's folder (None: nothing written).
    num_steps: the loop's last step (the progress line's total; boundaries at it leave the save to `finish`).
    name: the progress line's label.
    every_steps, every_secs, max_to_keep, config: `CheckpointHook`'s.
    progress: print a progress line.
  """

  def __init__(self, workdir: str | None, *, num_steps: int, name: str = "train", every_steps: int = 0,
               every_secs: float = 0.0, max_to_keep: int = 3, config: Any = None, progress: bool = False):
    self.workdir, self.num_steps, self.name, self.progress = workdir, int(num_steps), name, progress
    self.hook = None
    if workdir is not None:
      import os
      self.hook = CheckpointHook(os.path.join(workdir, "checkpoints"), every_steps=every_steps, every_secs=every_secs,
                                 max_to_keep=max_to_keep, config=config)
    self.where = self.hook.directory if self.hook is not None else None
    self.run: LoopState | None = None
    self.log: RunLog | None = None
    self.stop: str | None = None
    self._check = StopCheck()
    self._signals = stop_on_signals()

  def __enter__(self) -> "ResumableLoop":
    self._signals.__enter__()
    return self

  def __exit__(self, *exc) -> None:
    try:
      if self.log is not None:
        self.log.close()
      if self.hook is not None:
        self.hook.close()
    finally:
      self._signals.__exit__(*exc)

  @property
  def finished(self) -> bool:
    """The restored run was finished: return its state and `run` as they are."""
    return self.run is not None and self.run.finished

  def start(self, fresh: Callable[[], Any], target: Any = None) -> tuple[Any, LoopState]:
    """The latest checkpoint's state and LoopState, or `fresh()` and a new LoopState; opens the log unless finished.

    Args:
      fresh: () -> the initial state (called only when there is no checkpoint).
      target: the state's structure for restoring (abstract with shardings, or concrete); default
        `jax.eval_shape(fresh)` on the first device.

    Returns:
      (state, LoopState).

    Raises:
      Preempted: a stop was requested before the loop ran (nothing new to save).
    """
    got = None
    if self.hook is not None and self.hook.checkpointer.latest_step() is not None:
      if target is None:
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        target = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=device), jax.eval_shape(fresh))
      got = self.hook.restore_latest(target)
    state, self.run = got if got is not None else (fresh(), LoopState())
    if not self.run.finished:
      self.log = RunLog(self.workdir, self.run, num_steps=self.num_steps, name=self.name, progress=self.progress)
      stop = self._check(self.run.step)
      if stop:
        raise Preempted(None, stop, self.where)
    return state, self.run

  def write(self, step: int, row: Mapping[str, Any], show: bool = True, loss_key: str | None = None) -> dict:
    """Logs a row that is no boundary (e.g. an evaluation before the first step): `RunLog.write`."""
    return self.log.write(step, row, show=show, loss_key=loss_key)

  def boundary(self, step: int, state: Any, row: Mapping[str, Any] | None = None, *, best: Any = None,
               loss_key: str | None = None) -> None:
    """After the driver reached `step`: logs `row`, saves when due or stopping, raises Preempted after a stop's save.

    Args:
      step: the step reached.
      state: the state to save.
      row: the metrics row to log (None: nothing logged).
      best: keep-best parameters to save beside the state.
      loss_key: the row's key shown as the progress line's loss.

    Raises:
      Preempted: a stop was requested (before the last step; at it, `finish` saves and raises).
    """
    if row is not None:
      self.log.write(step, row, loss_key=loss_key)
    self.run.step = int(step)
    self.stop = self._check(step)
    if self.hook is not None:
      self.hook.step_boundary(step, state, self.run, num_steps=self.num_steps, stop=self.stop, best=best)
    elif self.stop and step < self.num_steps:
      raise Preempted(step, self.stop, None)

  def finish(self, state: Any, step: int | None = None, row: Mapping[str, Any] | None = None, *, best: Any = None,
             loss_key: str | None = None) -> None:
    """The final save, marked finished (also for a loop that stops early, at `step`); then a pending stop raises.

    Args:
      state: the final state.
      step: the step the loop ended at (default num_steps).
      row: a last metrics row to log at `step` first (an early stop's; None: nothing logged).
      best: keep-best parameters to save beside the state.
      loss_key: the row's key shown as the progress line's loss.

    Raises:
      Preempted: a stop came during the last interval (the finished loop is saved; the next phase does not start).
    """
    if self.finished:
      return
    step = self.num_steps if step is None else int(step)
    if row is not None:
      self.log.write(step, row, loss_key=loss_key)
    self.run.step = step
    if self.hook is not None:
      self.hook.finish(step, state, self.run, best=best)
    else:
      self.run.finished = True   # (the hook's finish sets it with the save)
    stop = self.stop or self._check(step)
    if stop:
      raise Preempted(step, stop, self.where)


@dataclasses.dataclass(frozen=True)
class Stages:
  """Where a staged driver's loops save and how often: stage `name` is a `ResumableLoop` in `workdir/name`
  (its `checkpoints/` and `metrics.jsonl`), so a killed run resumes inside the stage it was in and skips the
  finished ones.

  Attributes:
    workdir: the run's folder (None: nothing written; the loops still log in memory and stop on signals).
    every_steps: save every N steps of a stage (its own unit), at its boundaries; 0: not by steps.
    every_secs: also save when this many wall seconds passed since the stage's last save (0: not by time).
    config: recorded beside each stage's checkpoints.
    progress: print a progress line per stage.
    label: the progress lines' prefix (the paper's slug).
  """

  workdir: str | None
  every_steps: int = 0
  every_secs: float = 0.0
  config: Any = None
  progress: bool = False
  label: str = ""

  @classmethod
  def from_config(cls, config: Any, workdir: str | None, label: str = "") -> "Stages":
    """The stages of a run of `config` in `workdir`, its config checked against the workdir's record first.

    `checkpoint_options(config)`'s intervals, the config recorded, progress unless `config.progress` is False.
    The workdir's config record is checked as the launcher checks it (`checkpoint.ensure_config`; skipped inside
    a launched run, which checked it already), so `experiment.run(config, workdir)` called directly on a workdir
    that another config trained is refused instead of restoring that config's finished stages.

    Args:
      config: the run's config (the whole experiment config, as the launcher records it).
      workdir: the run's folder (None: nothing written or checked).
      label: the progress lines' prefix (the paper's slug).

    Returns:
      Stages.

    Raises:
      checkpoint.ConfigDrift: `config` differs from the one recorded in `workdir` (the keys, old -> new). To
        accept the change, call `checkpoint.check_config(workdir, config, allow_change=True)` first (it records
        it), or run through `launch.run.run(..., allow_config_change=True)` / `--allow_config_change`.
    """
    if workdir is not None:
      ckpt_lib.ensure_config(workdir, config)
    opts = checkpoint_options(config)
    return cls(workdir, every_steps=opts["checkpoint_every"], every_secs=opts["checkpoint_every_secs"],
               config=config, progress=bool(config.get("progress", True)) and jax.process_index() == 0,
               label=label)

  def loop(self, name: str, num_steps: int, every_steps: int | None = None) -> ResumableLoop:
    """The ResumableLoop of stage `name` (`num_steps` of them); `every_steps` overrides the step interval for a
    stage counted in another unit (say, epochs)."""
    import os
    where = None if self.workdir is None else os.path.join(self.workdir, name)
    every = self.every_steps if every_steps is None else int(every_steps)
    return ResumableLoop(where, num_steps=num_steps, name=f"{self.label} {name}".strip(),
                         every_steps=every, every_secs=self.every_secs, config=self.config,
                         progress=self.progress and where is not None)


def stage_loop(stages: Stages | None, name: str, num_steps: int, every_steps: int | None = None) -> ResumableLoop:
  """`stages.loop(name, num_steps, every_steps)`, or a loop that writes nothing when `stages` is None."""
  return (stages or Stages(None)).loop(name, num_steps, every_steps)


# ----------------------------------------------------------------------------------------------------------------
# Their composition
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class LoopResult:
  state: Any
  history: list[dict]              # every row logged by the run (over every resume): train means, evals, final eval
  final_eval: dict | None
  start_step: int                  # the step this invocation started from (> 0 when resumed)
  steps_per_s: float | None        # over the whole run (every resume), compilation included
  best_params: Any = None          # with keep_best: the parameters at the best eval (a copy)
  best_step: Any = None
  best_metric: Any = None
  save_seconds: float = 0.0        # seconds the loop was blocked by checkpoint saves (over every resume)


def train_loop(*, init_fn: Callable[[jax.Array], Any], train_step: TrainStep, batches: Callable[[int], Any],
               num_steps: int, key: jax.Array, workdir: str | None = None, mesh: Mesh | None = None,
               log_every: int = 100, eval_every: int = 0, eval_fn: Callable[[Any], Mapping[str, Any]] | None = None,
               checkpoint_every: int = 0, max_to_keep: int = 3, config: Any = None, progress: bool = True,
               state_sharding: Any = None, stop_at: int | None = None, name: str = "train",
               steps_per_call: int = 1, keep_best: str | None = None, best_mode: str = "max",
               checkpoint_every_secs: float = 0.0) -> LoopResult:
  """Runs a compiled train step for `num_steps` steps with logging, eval, keep-best, checkpoints and exact resume.

  Args:
    init_fn: key -> initial TrainState (pure; compiled with replicated outputs).
    train_step: pure step; see module docstring.
    batches: step -> this host's batch at that step (deterministic, so a resumed run sees the same data).
    num_steps: total optimizer steps.
    key: the run's key; split into key_init and key_train here.
    workdir: where metrics.jsonl and checkpoints/ go (None: nothing written, no resume).
    mesh: the mesh (default: all devices on 'data').
    log_every: pull and write metrics every N steps (averaged over the interval).
    eval_every: call eval_fn every N steps (0: only at the end).
    eval_fn: state -> dict of eval metrics (host side; may run its own compiled function).
    checkpoint_every: save every N steps (0: not by steps); needs workdir. The last step is always saved.
    max_to_keep: checkpoints kept.
    config: recorded as JSON beside the checkpoints on the first start.
    progress: print a progress line.
    state_sharding: shardings of the state (default replicated).
    stop_at: stop early after this step (simulates a killed run in tests) without the final save.
    name: label of the progress line.
    steps_per_call: K > 1 runs K steps per compiled call (`scan_steps`); log_every, eval_every and
      checkpoint_every must then be multiples of K (a last partial chunk runs step by step).
    keep_best: an eval metric key ('eval/accuracy' or 'accuracy'): keep the parameters at its best value.
    best_mode: 'max' or 'min' for keep_best.
    checkpoint_every_secs: also save when this many wall seconds passed since the last save (0: not by time).

  Returns:
    LoopResult with the final state, metric history, final eval, speed and (keep_best) the best parameters.

  Raises:
    ValueError: on intervals that are not multiples of steps_per_call, or keep_best without eval_fn.
    Preempted: SIGTERM / SIGINT (or `request_stop`) arrived; the checkpoint of the boundary it was seen at is saved.
  """
  if steps_per_call < 1:
    raise ValueError(f"steps_per_call must be >= 1, got {steps_per_call}.")
  for what, every in (("log_every", log_every), ("eval_every", eval_every), ("checkpoint_every", checkpoint_every)):
    if steps_per_call > 1 and every and every % steps_per_call:
      raise ValueError(f"{what}={every} is not a multiple of steps_per_call={steps_per_call}: events happen at "
                       "chunk boundaries; choose intervals that are multiples of the chunk.")
  if keep_best is not None and eval_fn is None:
    raise ValueError("keep_best needs eval_fn (the metric is read from its output).")
  keep = KeepBest(keep_best, best_mode) if keep_best is not None else None
  mesh = sharding.make_mesh() if mesh is None else mesh
  state_sh = sharding.replicated_sharding(mesh) if state_sharding is None else state_sharding
  key_init, key_train = jax.random.split(key)
  hook = None
  if workdir is not None:
    hook = CheckpointHook(f"{workdir}/checkpoints", every_steps=checkpoint_every, every_secs=checkpoint_every_secs,
                          max_to_keep=max_to_keep, config=config)
  log = None
  try:
    with jax.set_mesh(mesh):
      if hook is not None:
        state, run = hook.restore_or_init(init_fn, key_init, state_sh, keep)
      else:
        state, run = init_state(init_fn, key_init, state_sh), LoopState()
      start_step = run.step
      key_train = _decode_key(run.key) if run.key is not None else key_train
      run.key = _encode_key(key_train)
      if not run.finished:   # a finished run is returned as stored: nothing trains, evaluates or is written
        log = RunLog(workdir, run, num_steps=num_steps, name=name, progress=progress)
        runner = StepRunner(train_step, mesh, state_sharding=state_sh, steps_per_call=steps_per_call)
        state = _run_steps(state, run, runner=runner, batches=batches, key=key_train, num_steps=num_steps,
                           stop_at=stop_at, log=log, log_every=log_every,
                           evals=EvalHook(eval_fn, eval_every, num_steps), keep=keep, hook=hook)
  finally:
    if log is not None:
      log.close()
    if hook is not None:
      hook.close()
  best = keep is not None and keep.params is not None
  return LoopResult(state=state, history=run.history, final_eval=run.final_eval, start_step=start_step,
                    steps_per_s=run.steps_per_s, best_params=keep.result(state.params) if best else None,
                    best_step=keep.step if keep else None, best_metric=keep.value if keep else None,
                    save_seconds=run.save_seconds)


def _run_steps(state: Any, run: LoopState, *, runner: StepRunner, batches: Callable[[int], Any], key: jax.Array,
               num_steps: int, stop_at: int | None, log: RunLog, log_every: int, evals: EvalHook,
               keep: KeepBest | None, hook: CheckpointHook | None) -> Any:
  """`train_loop`'s body: steps from run.step, logging, evals, keep-best, saves, stops; returns the last state."""
  last = min(num_steps, stop_at) if stop_at is not None else num_steps
  pending: list[Mapping[str, jax.Array]] = []
  check = StopCheck()
  where = hook.directory if hook is not None else None

  def evaluate(st: Any, s: int) -> dict:
    ev = evals(st)
    if keep is not None:
      keep.update(s, ev, st.params)
      keep.save_to(run)
    return ev

  with stop_on_signals():
    stop = check(run.step)
    if stop:   # requested before this loop ran a step (e.g. between two loops of one run): nothing new to save
      raise Preempted(None, stop, where)
    step = run.step
    while step < last:
      state, metrics, k = runner(state, batches, step, last, key)
      pending.append(metrics)
      step += k
      run.step = step
      logged = step % max(log_every, 1) == 0 or step == num_steps
      if logged:
        row = prefix_keys(_mean_metrics(pending), "train")
        pending = []
        log.tick(step)
        row["steps_per_s"] = run.steps_per_s
        if evals.due(step):
          row.update(evaluate(state, step))
        log.write(step, row)
      elif evals.due(step):
        log.write(step, evaluate(state, step), show=False)
      stop = check(step, sync_point=logged)
      if hook is not None:
        hook.step_boundary(step, state, run, num_steps=num_steps, stop=stop, sync_point=logged,
                           best=keep.params if keep is not None else None)
      elif stop and step < num_steps:
        raise Preempted(step, stop, None)
    if stop_at is not None and last < num_steps:
      return state
    if evals.eval_fn is not None:
      final_step = int(jax.device_get(state.step))
      run.final_eval = evaluate(state, final_step)
      log.write(final_step, run.final_eval, show=False)
    if hook is not None:
      hook.finish(num_steps, state, run, best=keep.params if keep is not None else None)
    stop = stop or check(num_steps)
    if stop:   # a signal during the last interval or the final eval: the finished run is saved; stop before more
      raise Preempted(num_steps, stop, where)
  return state
