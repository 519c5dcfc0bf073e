"""Paper-size programs of the RL family's small networks, for `experiments.scale` (see `common.scale`).

The papers' offline-RL networks are MLPs of at most a few million parameters: they fit on any device, so their
state is replicated and only the batch is split over the mesh's 'data' axis. Two helpers:

  mlp_flops(in_dim, widths)                      matmul FLOPs of one forward of an MLP, per example
  ADAM_FLOPS_PER_PARAM, CLIPPED_ADAM_FLOPS_PER_PARAM   an optimizer update's FLOPs per parameter
  replicated_program(name, fn, state, batch, mesh, constants=..., hand_flops=...)
                                                 a common.scale.Program of fn(state, batch, constants, key)
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
from jax.sharding import NamedSharding, PartitionSpec as P

from iclr24_jax.common import scale as scale_lib


# XLA's count of `optax.adam`'s update plus `optax.apply_updates` (jax 0.9.2, measured on a 1M-vector): 13 FLOPs per
# parameter (moments, bias corrections, sqrt, division, step), 18 with `clip_by_global_norm` in front. With
# replicated parameters every device runs the whole update, so for small networks at small batches (a 32-example
# diffusion step) the update is a large share of the step.
ADAM_FLOPS_PER_PARAM = 13.0
CLIPPED_ADAM_FLOPS_PER_PARAM = 18.0


def mlp_flops(in_dim: int, widths: Sequence[int]) -> float:
  """Matmul FLOPs of one forward pass of an MLP on one example: 2 x sum of in x out over its dense layers.

  Args:
    in_dim: input width.
    widths: the widths of every dense layer, the output last (e.g. (256, 256, 1) for a value net).

  Returns:
    FLOPs (float).
  """
  total, width = 0, int(in_dim)
  for w in widths:
    total += width * int(w)
    width = int(w)
  return float(2 * total)


def replicated_program(name: str, fn: Callable, state: Any, batch: Any, mesh: Any, *, constants: Any = None,
                       params: Any = None, state_shardings: Any = None, hand_flops: float | None = None,
                       update_flops_per_param: float = ADAM_FLOPS_PER_PARAM, items_per_step: int = 0,
                       item: str = "transitions", notes: str = "", paper_hardware: str = "",
                       paper_time: str = "") -> scale_lib.Program:
  """A train step `fn(state, batch, constants, key) -> (state, metrics)` as a Program over `mesh`.

  The state (and `constants`: frozen networks the step reads, e.g. a critic) is replicated unless
  `state_shardings` says otherwise (e.g. a replay buffer split over 'data'), every batch leaf is split over 'data'
  along its leading axis, the state is donated and carried from step to step.

  Args:
    name: the row's name.
    fn: the pure step.
    state: the abstract state (`jax.eval_shape` of its init).
    batch: pytree of ShapeDtypeStructs, leading axis the batch.
    mesh: the ('data', 'model') mesh.
    constants: pytree of ShapeDtypeStructs read by the step and not updated (None: none).
    params: the parameter sub-tree of `state` (counted and checked; default `state.params`); replicated.
    state_shardings: NamedShardings of `state` (default: all replicated).
    hand_flops: the model's FLOPs of one step by hand (forward and backward), all devices together; the
      optimizer update, `update_flops_per_param` x parameters, is added once per device (it runs replicated).
    update_flops_per_param: FLOPs of the optimizer update per parameter (0: not counted).
    items_per_step: examples per step.
    item: what an example is.
    notes, paper_hardware, paper_time: text for the table.

  Returns:
    common.scale.Program with args (state, batch, constants, key).
  """
  rep = NamedSharding(mesh, P())
  state_sh = scale_lib.replicated(state, mesh) if state_shardings is None else state_shardings
  state_abs = scale_lib.abstract(state, state_sh)
  batch_abs = scale_lib.abstract(batch, scale_lib.batch_shardings(batch, mesh))
  const_abs = scale_lib.abstract(constants, scale_lib.replicated(constants, mesh)) if constants is not None else None
  key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=rep)
  params = state.params if params is None else params
  params_abs = scale_lib.abstract(params, scale_lib.replicated(params, mesh))
  if hand_flops is not None:
    hand_flops = hand_flops + int(mesh.devices.size) * update_flops_per_param * scale_lib.num_elements(params)
  return scale_lib.Program(
      name=name, fn=fn, args=(state_abs, batch_abs, const_abs, key), out_shardings=(state_sh, rep),
      donate_argnums=(0,), carry=True, params=scale_lib.num_elements(params), items_per_step=items_per_step,
      item=item, hand_flops=hand_flops, kind="train", abstract_params=params_abs, notes=notes,
      paper_hardware=paper_hardware, paper_time=paper_time)
