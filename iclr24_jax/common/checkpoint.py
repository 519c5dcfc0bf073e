"""Checkpoints with orbax: atomic saves, `max_to_keep`, the config as JSON beside them, resume.

orbax writes each step into a temporary folder and renames it only when the save is complete, so a
run killed mid-save leaves the previous complete step as the latest one. Restoring needs an abstract
state (`jax.eval_shape` of the init function), which also carries the target shardings.
"""
from __future__ import annotations

import json
import os
from typing import Any

import jax
import orbax.checkpoint as ocp


class CheckpointError(RuntimeError):
  """A checkpoint folder exists but cannot be restored into the expected state."""


def _config_to_dict(config: Any) -> Any:
  if config is None:
    return None
  if hasattr(config, "to_dict"):
    return config.to_dict()
  return dict(config)


class Checkpointer:
  """Thin wrapper over `orbax.checkpoint.CheckpointManager`.

  Args:
    directory: the checkpoint folder (created if missing), e.g. `workdir/checkpoints`.
    max_to_keep: how many most recent steps to keep.
    config: optional ConfigDict/dict, written as `directory/config.json` for provenance.
  """

  def __init__(self, directory: str, max_to_keep: int = 3, config: Any = None):
    self.directory = os.path.abspath(directory)
    if os.path.exists(self.directory) and not os.path.isdir(self.directory):
      raise CheckpointError(f"checkpoint path {self.directory} exists and is not a folder; "
                            "remove it or choose another --workdir.")
    os.makedirs(self.directory, exist_ok=True)
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True)
    self._manager = ocp.CheckpointManager(self.directory, options=options)
    if config is not None and jax.process_index() == 0:
      with open(os.path.join(self.directory, "config.json"), "w") as f:
        json.dump(_config_to_dict(config), f, indent=2, sort_keys=True, default=str)

  def latest_step(self) -> int | None:
    """The newest complete step, or None when there is none."""
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    """Every step with a saved checkpoint (at most max_to_keep of them), as ints."""
    return list(self._manager.all_steps())

  def save(self, step: int, state: Any, wait: bool = True) -> None:
    """Saves `state` at `step` (atomic). With `wait=False` the write finishes in the background.

    Args:
      step: the training step the state belongs to (the step folder's name).
      state: pytree of arrays (e.g. a TrainState), possibly sharded.
      wait: block until the write is complete.
    """
    self._manager.save(int(step), args=ocp.args.StandardSave(state), force=True)
    if wait:
      self._manager.wait_until_finished()

  def restore(self, abstract_state: Any, step: int | None = None) -> Any:
    """Restores the state saved at `step` (default: latest) into the structure of `abstract_state`.

    Args:
      abstract_state: a pytree of `jax.ShapeDtypeStruct` (with shardings), e.g.
        `jax.eval_shape(init_fn, key)`, or a concrete state of the right structure.
      step: which step; None for the latest.

    Raises:
      CheckpointError: naming the folder and the step when nothing can be restored or the files
        do not match the expected state.
    """
    step = self.latest_step() if step is None else step
    if step is None:
      raise CheckpointError(f"no complete checkpoint in {self.directory}.")
    try:
      return self._manager.restore(int(step), args=ocp.args.StandardRestore(abstract_state))
    except Exception as e:  # orbax raises many types from deep inside; name the folder instead.
      raise CheckpointError(
          f"checkpoint step {step} in {self.directory} is corrupt or does not match this model/config "
          f"({type(e).__name__}: {str(e)[:300]}). Delete that step folder to resume from an earlier one, "
          "or start in a fresh --workdir.") from e

  def wait(self) -> None:
    """Blocks until background saves (`save(..., wait=False)`) are complete."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    """Waits for pending saves, then releases the checkpoint manager."""
    self._manager.wait_until_finished()
    self._manager.close()
