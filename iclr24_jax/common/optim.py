"""Optimizers from config: adam / adamw / sgd / lamb with constant, cosine or linear schedules."""
from __future__ import annotations

from typing import Any

import optax


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
  """Builds the optax optimizer described by `config.optimizer`.

  Config fields: name ('adam' | 'adamw' | 'sgd' | 'lamb'), learning_rate, schedule, warmup_steps,
  weight_decay, momentum (sgd; 0 = none), nesterov (sgd), b1, b2, eps (adam / adamw), grad_clip (global norm;
  0 = off). For 'adam' and 'sgd' weight_decay is an L2 term added to the gradient (torch style); 'adamw' and
  'lamb' decouple it.

  Args:
    opt_config: ConfigDict-like with the fields above (see `make_schedule` for the schedule ones).
    num_steps: total training steps (for the schedule).

  Returns:
    optax.GradientTransformation.

  Raises:
    ValueError: unknown optimizer name or schedule.
  """
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
