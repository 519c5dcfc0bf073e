"""Optimizers from config: adam / adamw / sgd / lamb with constant, cosine or linear schedules.

Equal settings give the same optimizer object (`memoized_optimizer`). `TrainState` keeps its optimizer as static
data, which is part of the pytree structure that `jax.jit` keys its compilations on, and optax transformations
compare by identity; so a fresh object for the same settings would recompile every step that takes the state
(one compile per seed, fold or run instead of one in all). Building optimizers from hashable settings through
this module fixes that at the source, for every paper at once.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

import optax


def freeze(value: Any) -> Any:
  """A hashable copy of nested settings: mappings (dicts, ConfigDicts) become sorted tuples of (key, value) pairs,
  lists and tuples become tuples; scalars stay as they are.

  Args:
    value: settings (a ConfigDict, dict, list or scalar), nested.

  Returns:
    an equal-settings-equal, hashable value.
  """
  if hasattr(value, "to_dict"):
    value = value.to_dict()
  if isinstance(value, Mapping):
    return tuple(sorted((str(k), freeze(v)) for k, v in value.items()))
  if isinstance(value, (list, tuple)):
    return tuple(freeze(v) for v in value)
  return value


def thaw(frozen: Any) -> Any:
  """Inverse of `freeze` at the mapping levels: tuples of (str, value) pairs become dicts again, recursively.

  A compiled-program cache keyed on `freeze(config)` rebuilds the settings inside with `thaw`. Lists come back
  as tuples (freeze made them tuples), and a list of (str, value) pairs would come back as a dict: settings that
  round-trip must not hold such lists.

  Args:
    frozen: a value from `freeze`.

  Returns:
    nested dicts / tuples / scalars with the settings' values (`freeze(thaw(f)) == f`).
  """
  if isinstance(frozen, tuple) and frozen and all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str)
                                                   for x in frozen):
    return {k: thaw(v) for k, v in frozen}
  return frozen


def memoized_optimizer(builder: Callable[..., optax.GradientTransformation]
                       ) -> Callable[..., optax.GradientTransformation]:
  """Decorates an optimizer builder so equal arguments (settings compared by value) return the same object.

  Why: see the module docstring (the TrainState's static optimizer is part of what jit compiles for). Arguments
  that cannot be frozen into a hashable key (a schedule function) build a fresh object each call.

  Args:
    builder: (*settings) -> optax.GradientTransformation.

  Returns:
    the memoized builder (`.cache_clear()` forgets the objects built so far).
  """
  built: dict[Any, optax.GradientTransformation] = {}

  @functools.wraps(builder)
  def build(*args: Any, **kwargs: Any) -> optax.GradientTransformation:
    key = (freeze(args), freeze(kwargs))
    try:
      hash(key)
    except TypeError:
      return builder(*args, **kwargs)
    if key not in built:
      built[key] = builder(*args, **kwargs)
    return built[key]

  build.cache_clear = built.clear
  return build


def make_schedule(opt_config: Any, num_steps: int) -> optax.Schedule:
  """Learning-rate schedule.

  Config fields: learning_rate, schedule ('constant' | 'cosine' | 'linear'), warmup_steps (default 0),
  end_factor (final lr / peak lr for cosine/linear, default 0).

  Args:
    opt_config: ConfigDict-like (supports `.learning_rate` and `.get`) with the fields above.
    num_steps: total training steps; the decay spans max(num_steps - warmup_steps, 1) steps after a linear
      warm-up from 0 to learning_rate.

  Returns:
    optax schedule: step (int) -> float32 learning rate.

  Raises:
    ValueError: unknown schedule kind.
  """
  lr = float(opt_config.learning_rate)
  kind = opt_config.get("schedule", "constant")
  warmup = int(opt_config.get("warmup_steps", 0))
  end = lr * float(opt_config.get("end_factor", 0.0))
  decay_steps = max(int(num_steps) - warmup, 1)
  if kind == "constant":
    main = optax.constant_schedule(lr)
  elif kind == "cosine":
    main = optax.cosine_decay_schedule(lr, decay_steps, alpha=end / lr if lr else 0.0)
  elif kind == "linear":
    main = optax.linear_schedule(lr, end, decay_steps)
  else:
    raise ValueError(f"unknown optimizer.schedule '{kind}'; choose 'constant', 'cosine' or 'linear'.")
  if warmup:
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), main], [warmup])
  return main


def make_optimizer(opt_config: Any, num_steps: int) -> optax.GradientTransformation:
  """Builds the optax optimizer described by `config.optimizer`; equal settings give the same object.

  Config fields: name ('adam' | 'adamw' | 'sgd' | 'lamb'), learning_rate, schedule, warmup_steps,
  weight_decay, momentum (sgd; 0 = none), nesterov (sgd), b1, b2, eps (adam / adamw), grad_clip (global norm;
  0 = off). For 'adam' and 'sgd' weight_decay is an L2 term added to the gradient (torch style); 'adamw' and
  'lamb' decouple it.

  Args:
    opt_config: ConfigDict-like with the fields above (see `make_schedule` for the schedule ones).
    num_steps: total training steps (for the schedule).

  Returns:
    optax.GradientTransformation (one object per distinct setting: see the module docstring).

  Raises:
    ValueError: unknown optimizer name or schedule.
  """
  # A constant schedule does not depend on num_steps: one object for every run length.
  steps = 0 if opt_config.get("schedule", "constant") == "constant" else int(num_steps)
  return _make_optimizer(freeze(opt_config), steps)


@memoized_optimizer
def _make_optimizer(frozen_config: tuple, num_steps: int) -> optax.GradientTransformation:
  opt_config = _Settings(frozen_config)
  name = opt_config.get("name", "adam")
  sched = make_schedule(opt_config, num_steps)
  wd = float(opt_config.get("weight_decay", 0.0))
  b1, b2 = float(opt_config.get("b1", 0.9)), float(opt_config.get("b2", 0.999))
  eps = float(opt_config.get("eps", 1e-8))
  if name == "adam":
    tx = optax.adam(sched, b1=b1, b2=b2, eps=eps)
    if wd:
      tx = optax.chain(optax.add_decayed_weights(wd), tx)  # L2 penalty as in torch.optim.Adam
  elif name == "adamw":
    tx = optax.adamw(sched, b1=b1, b2=b2, eps=eps, weight_decay=wd)
  elif name == "sgd":
    tx = optax.sgd(sched, momentum=float(opt_config.get("momentum", 0.9)) or None,
                   nesterov=bool(opt_config.get("nesterov", False)))
    if wd:
      tx = optax.chain(optax.add_decayed_weights(wd), tx)
  elif name == "lamb":
    tx = optax.lamb(sched, weight_decay=wd)
  else:
    raise ValueError(f"unknown optimizer.name '{name}'; choose 'adam', 'adamw', 'sgd' or 'lamb'.")
  clip = float(opt_config.get("grad_clip", 0.0))
  if clip:
    tx = optax.chain(optax.clip_by_global_norm(clip), tx)
  return tx


class _Settings(dict):
  """Frozen settings read back like a ConfigDict (`.learning_rate`, `.get`), for the memoized builder."""

  def __init__(self, frozen: tuple):
    super().__init__((k, v) for k, v in frozen)

  def __getattr__(self, name: str) -> Any:
    try:
      return self[name]
    except KeyError as e:
      raise AttributeError(f"optimizer settings have no '{name}' (given: {sorted(self)}).") from e
