"""An immutable train state: step, params, optimizer state and free-form extra state.

The optimizer (`tx`) rides along as static (non-pytree) data, so a state can update itself
(`state.apply_gradients(grads)`) while staying a plain pytree for `jax.jit`, sharding and orbax. Static data is
part of the pytree structure jit compiles for, and optax transformations compare by identity: build `tx` with
`common.optim.make_optimizer` (or a `common.optim.memoized_optimizer` builder), which returns one object per
distinct setting, so runs with equal configs share their compiled steps.
"""
from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax


@flax.struct.dataclass
class TrainState:
  """Training state.

  Attributes:
    step: scalar int32 array, number of optimizer updates applied so far.
    params: the model parameters (any pytree).
    opt_state: the optax optimizer state.
    extra: anything else a method carries between steps (batch statistics, EMA params, a
      particle pool, client weights ...); any pytree or None.
    tx: the optax transformation (static; not saved in checkpoints).
  """

  step: jax.Array
  params: Any
  opt_state: Any
  extra: Any = None
  tx: optax.GradientTransformation | None = flax.struct.field(pytree_node=False, default=None)

  @classmethod
  def create(cls, params: Any, tx: optax.GradientTransformation, extra: Any = None) -> "TrainState":
    """Builds a state at step 0 with a freshly initialised optimizer state.

    Args:
      params: the parameter pytree.
      tx: the optax optimizer (kept as a static field).
      extra: any other carried pytree (batch statistics, EMA params, observation statistics, ...), or None.

    Returns:
      TrainState with step int32 0 and opt_state = tx.init(params).
    """
    return cls(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
               extra=extra, tx=tx)

  def apply_gradients(self, grads: Any, **changes: Any) -> "TrainState":
    """Applies one optimizer update and increments `step`; `changes` replace other fields."""
    if self.tx is None:
      raise ValueError("TrainState.apply_gradients needs a state made by TrainState.create(params, tx).")
    updates, opt_state = self.tx.update(grads, self.opt_state, self.params)
    params = optax.apply_updates(self.params, updates)
    return self.replace(step=self.step + 1, params=params, opt_state=opt_state, **changes)
