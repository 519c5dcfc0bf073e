"""Checkpoints and the run's workdir: orbax saves of the whole resumable state, the config record, the lock.

A checkpoint step is an orbax composite of up to three items:
  state  the TrainState (StandardSave: sharded arrays, restored onto the shardings of an abstract state)
  loop   the loop's own state as JSON (`common.loop.LoopState`: step, eval history, best metric and step, the
         training key, wall time, an own driver's data position)
  best   the keep-best parameters (only when the loop keeps them)
orbax writes each step into a temporary folder and renames it only when the save is complete, so a run killed
mid-save leaves the previous complete step as the latest one. Restoring needs an abstract state
(`jax.eval_shape` of the init function), which also carries the target shardings.

The workdir holds one run: `run.lock` (pid, host, start time) while a launcher runs in it, `config.json` (the
config of the first start, never overwritten), `config_changes.jsonl` (changes accepted later, each with the
step it applied from) and `status.json` ('running' | 'preempted' | 'failed' | 'finished'). The config record is
checked by the launcher (`check_config`) and, for a staged driver called without it, by `loop.Stages.from_config`
(`ensure_config`), once per run.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import warnings
from typing import Any, Iterator, Mapping

import jax
import orbax.checkpoint as ocp


class CheckpointError(RuntimeError):
  """A checkpoint folder exists but cannot be restored into the expected state."""


class WorkdirError(ValueError):
  """The workdir cannot hold a run (it is a file, or not writable)."""


class WorkdirBusy(RuntimeError):
  """Another launcher holds the workdir's lock."""


class ConfigDrift(ValueError):
  """A resumed run's config differs from the one the workdir's record says trained it."""

  def __init__(self, message: str, changes: Mapping[str, tuple[Any, Any]]):
    super().__init__(message)
    self.changes = dict(changes)


def config_to_dict(config: Any) -> Any:
  """A ConfigDict / FrozenConfigDict / mapping as a plain dict (None stays None)."""
  if config is None:
    return None
  if hasattr(config, "to_dict"):
    return config.to_dict()
  return dict(config)


def _write_json(path: str, obj: Any) -> None:
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2, sort_keys=True, default=str)
  os.replace(tmp, path)


class _Manager(ocp.CheckpointManager):
  """orbax's CheckpointManager, except that it never asks JAX's preemption sync point itself.

  orbax's `save` calls `multihost_utils.reached_preemption_sync_point(step)` with the checkpoint's step (for its
  logs and metrics only; the saves here are forced), once on the caller's thread and once from the thread that
  finalises an async save. The service keeps only the last id it was given and sets the agreed stop to the
  largest last id of all processes + 1, so those calls (a stage's own step count, at a time that differs between
  processes) would replace the consecutive ids `common.loop.StopCheck` gives it, and the agreed id could be one
  that no process ever reaches. The loop decides preemption itself (`StopCheck`), so this query answers False.
  """

  def reached_preemption(self, step: int) -> bool:
    del step
    return False


class Checkpointer:
  """Thin wrapper over `orbax.checkpoint.CheckpointManager` saving the composite described in the module docstring.

  Args:
    directory: the checkpoint folder (created if missing), e.g. `workdir/checkpoints`.
    max_to_keep: how many most recent steps to keep.
    config: optional ConfigDict/dict, written as `directory/config.json` when that file does not exist yet (the
      record of what trained the first steps; a resumed run never overwrites it).
    async_save: save in the background (orbax copies the arrays to host before `save` returns, so the caller
      may donate the state's buffers right away); `wait` / `close` block until the writes are complete.
  """

  def __init__(self, directory: str, max_to_keep: int = 3, config: Any = None, async_save: bool = True):
    self.directory = os.path.abspath(directory)
    if os.path.exists(self.directory) and not os.path.isdir(self.directory):
      raise CheckpointError(f"checkpoint path {self.directory} exists and is not a folder; "
                            "remove it or choose another --workdir.")
    os.makedirs(self.directory, exist_ok=True)
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                           enable_async_checkpointing=async_save)
    self._manager = _Manager(self.directory, options=options)
    self.async_save = async_save
    path = os.path.join(self.directory, "config.json")
    if config is not None and jax.process_index() == 0 and not os.path.exists(path):
      _write_json(path, config_to_dict(config))

  def latest_step(self) -> int | None:
    """The newest complete step, or None when there is none."""
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    """Every step with a saved checkpoint (at most max_to_keep of them), as ints."""
    return list(self._manager.all_steps())

  def save(self, step: int, state: Any, wait: bool | None = None, loop: Mapping[str, Any] | None = None,
           best: Any = None) -> None:
    """Saves `state` (and the loop's JSON state and keep-best parameters, when given) at `step`, atomically.

    Args:
      step: the training step the state belongs to (the step folder's name).
      state: pytree of arrays (e.g. a TrainState), possibly sharded.
      wait: block until the write is complete (default: not when async_save).
      loop: JSON-serialisable dict (`LoopState.to_json()`).
      best: pytree of arrays (the keep-best parameters) or None.
    """
    items = {"state": ocp.args.StandardSave(state)}
    if loop is not None:
      items["loop"] = ocp.args.JsonSave(dict(loop))
    if best is not None:
      items["best"] = ocp.args.StandardSave(best)
    self._manager.save(int(step), args=ocp.args.Composite(**items), force=True)
    if wait or (wait is None and not self.async_save):
      self._manager.wait_until_finished()

  def _restore(self, step: int | None, items: dict) -> Any:
    step = self.latest_step() if step is None else step
    if step is None:
      raise CheckpointError(f"no complete checkpoint in {self.directory}.")
    try:
      return self._manager.restore(int(step), args=ocp.args.Composite(**items))
    except Exception as e:  # orbax raises many types from deep inside; name the folder instead.
      raise CheckpointError(
          f"checkpoint step {step} in {self.directory} is corrupt or does not match this model/config "
          f"({type(e).__name__}: {str(e)[:300]}). Delete that step folder to resume from an earlier one, "
          "or start in a fresh --workdir.") from e

  def restore(self, abstract_state: Any, step: int | None = None) -> Any:
    """Restores the state saved at `step` (default: latest) into the structure of `abstract_state`.

    Args:
      abstract_state: a pytree of `jax.ShapeDtypeStruct` (with shardings), e.g.
        `jax.eval_shape(init_fn, key)`, or a concrete state of the right structure.
      step: which step; None for the latest.

    Returns:
      the state pytree.

    Raises:
      CheckpointError: naming the folder and the step when nothing can be restored or the files
        do not match the expected state.
    """
    return self._restore(step, {"state": ocp.args.StandardRestore(abstract_state)}).state

  def restore_loop(self, step: int | None = None) -> dict | None:
    """The loop's JSON state saved at `step` (default: latest), or None when that step saved none."""
    step = self.latest_step() if step is None else step
    if step is None:
      return None
    try:
      return dict(self._restore(step, {"loop": ocp.args.JsonRestore()}).loop)
    except CheckpointError:
      if not os.path.isdir(os.path.join(self.directory, str(step), "loop")):
        return None   # a state-only checkpoint (an own driver that saves no loop state)
      raise

  def restore_best(self, abstract_best: Any, step: int | None = None) -> Any:
    """The keep-best parameters saved at `step` (default: latest), restored into `abstract_best`'s structure."""
    return self._restore(step, {"best": ocp.args.StandardRestore(abstract_best)}).best

  def wait(self) -> None:
    """Blocks until background saves are complete."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    """Waits for pending saves, then releases the checkpoint manager."""
    self._manager.wait_until_finished()
    self._manager.close()


# ----------------------------------------------------------------------------------------------------------------
# The workdir: checked up front, locked, its config recorded, its status
# ----------------------------------------------------------------------------------------------------------------

LOCK_FILE, CONFIG_FILE, CHANGES_FILE, STATUS_FILE = "run.lock", "config.json", "config_changes.jsonl", "status.json"


def check_workdir(workdir: str) -> str:
  """Checks that `workdir` can hold a run before anything else happens, and creates it.

  Args:
    workdir: the run's folder (need not exist; its nearest existing parent must then be writable).

  Returns:
    the absolute path (created).

  Raises:
    WorkdirError: it exists as a file, or it (or the parent that would hold it) is not writable.
  """
  if not workdir:
    raise WorkdirError("--workdir is empty; give the folder the run writes to, e.g. --workdir=runs/pmp.")
  path = os.path.abspath(os.path.expanduser(workdir))
  if os.path.exists(path) and not os.path.isdir(path):
    raise WorkdirError(f"workdir {path} exists and is a file, not a folder; remove it or choose another --workdir.")
  probe = path
  while not os.path.exists(probe):
    probe = os.path.dirname(probe)
  if not os.path.isdir(probe):
    raise WorkdirError(f"{probe} is a file, so the workdir {path} cannot be created under it; choose another "
                       "--workdir.")
  if not os.access(probe, os.W_OK | os.X_OK):
    where = f"workdir {path}" if probe == path else f"folder {probe}, which would hold the workdir {path},"
    raise WorkdirError(f"{where} is not writable; fix its permissions or choose another --workdir.")
  os.makedirs(path, exist_ok=True)
  return path


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:   # someone else's live process
    return True
  return True


class WorkdirLock:
  """One run per workdir: `workdir/run.lock` holds {pid, host, started, command} while a launcher runs.

  Taken with an exclusive create, so two launchers starting together cannot both win. A lock left by a dead
  process on this host is taken over with a warning; a lock from another host cannot be checked and is refused.
  Only process 0 of a multi-host run takes it (the others share process 0's workdir or have their own).

  Args:
    workdir: the run's folder (exists).
    command: what to record as the holder's command line.
  """

  def __init__(self, workdir: str, command: str = ""):
    self.path = os.path.join(os.path.abspath(workdir), LOCK_FILE)
    self.workdir = os.path.dirname(self.path)
    self.command = command
    self.held = False

  def _record(self) -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "command": self.command,
            "started": datetime.datetime.now().isoformat(timespec="seconds")}

  def acquire(self) -> "WorkdirLock":
    """Takes the lock.

    Returns:
      self.

    Raises:
      WorkdirBusy: a live process (or one on another host) holds it; the message names the workdir, the holder
        and how to clear a stale lock.
    """
    if jax.process_index() != 0:
      return self
    for _ in range(2):
      try:
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
      except FileExistsError:
        holder = self.holder()
        host = socket.gethostname()
        pid = holder.get("pid") if isinstance(holder.get("pid"), int) else -1
        if holder.get("host") == host and pid > 0 and not _pid_alive(pid):
          warnings.warn(f"taking over the stale lock of {self.workdir}: its holder (pid {pid} on {host}, started "
                        f"{holder.get('started', '?')}) is no longer running.", stacklevel=2)
          try:
            os.remove(self.path)
          except FileNotFoundError:
            pass
          continue
        raise WorkdirBusy(
            f"workdir {self.workdir} is in use: its lock {self.path} is held by pid {holder.get('pid', '?')} on host "
            f"{holder.get('host', '?')} (started {holder.get('started', '?')}: {holder.get('command', '')}). Wait for "
            f"that run or stop it, or choose another --workdir; if that process is gone (e.g. a crashed host), delete "
            f"{self.path} and start again.") from None
      with os.fdopen(fd, "w") as f:
        json.dump(self._record(), f)
      self.held = True
      return self
    raise WorkdirBusy(f"could not take the lock {self.path}: another launcher took it at the same moment.")

  def holder(self) -> dict:
    """The lock file's record ({} when it is unreadable or absent)."""
    try:
      with open(self.path) as f:
        return json.load(f)
    except (OSError, ValueError):
      return {}

  def release(self) -> None:
    """Removes the lock if this process holds it."""
    if self.held:
      try:
        if self.holder().get("pid") == os.getpid():
          os.remove(self.path)
      except FileNotFoundError:
        pass
      self.held = False

  def __enter__(self) -> "WorkdirLock":
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()


def flatten_config(config: Any, prefix: str = "") -> dict[str, Any]:
  """{'optimizer.learning_rate': 0.001, ...}: a nested config as dotted keys (lists / tuples stay values).

  Args:
    config: ConfigDict or nested mapping.
    prefix: prepended to every key.

  Returns:
    flat dict of JSON-normalised values (tuples as lists), so a config and its JSON record compare equal.
  """
  d = config_to_dict(config) if not isinstance(config, Mapping) else dict(config)
  out = {}
  for k, v in d.items():
    key = f"{prefix}{k}"
    if isinstance(v, Mapping) or hasattr(v, "to_dict"):
      out.update(flatten_config(v, key + "."))
    else:
      out[key] = json.loads(json.dumps(v, default=str))
  return out


def config_changes(old: Any, new: Any) -> dict[str, tuple[Any, Any]]:
  """Keys whose values differ between two configs: {dotted key: (old, new)} (a missing key reads as '<absent>')."""
  a, b = flatten_config(old), flatten_config(new)
  missing = "<absent>"
  return {k: (a.get(k, missing), b.get(k, missing)) for k in sorted(set(a) | set(b)) if a.get(k, missing) !=
          b.get(k, missing)}


def recorded_config(workdir: str) -> dict | None:
  """The config the workdir's record says is in force: `config.json` with the accepted changes applied (flat)."""
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    flat = flatten_config(json.load(f))
  changes = os.path.join(workdir, CHANGES_FILE)
  if os.path.exists(changes):
    with open(changes) as f:
      for line in f:
        if line.strip():
          for k, (_, new) in json.loads(line)["changes"].items():
            if new == "<absent>":
              flat.pop(k, None)
            else:
              flat[k] = new
  return flat


def checkpoint_steps(workdir: str, max_depth: int = 3) -> dict[str, int]:
  """The newest complete step of every `checkpoints` folder under `workdir` (a run with several loops keeps one
  per loop, e.g. `baselines/sage/checkpoints`), read from the folder names; no checkpoint manager is opened.

  Args:
    workdir: the run's folder.
    max_depth: how deep below workdir to look.

  Returns:
    {folder relative to workdir: step} for the folders holding at least one complete step.
  """
  out = {}
  base = os.path.abspath(workdir)
  for root, dirs, _ in os.walk(base):
    depth = 0 if root == base else os.path.relpath(root, base).count(os.sep) + 1
    if depth >= max_depth:
      dirs[:] = []
    if os.path.basename(root) == "checkpoints":
      steps = [int(d) for d in dirs if d.isdigit()]
      if steps:
        out[os.path.relpath(root, base)] = max(steps)
      dirs[:] = []
  return out


def resumed_step(workdir: str) -> int:
  """The step a rerun in `workdir` resumes from: the newest complete checkpoint in `workdir/checkpoints`, else the
  last step in metrics.jsonl, else 0 (read from the files; no checkpoint manager is opened)."""
  top = checkpoint_steps(workdir, max_depth=1).get("checkpoints")
  if top is not None:
    return top
  path = os.path.join(workdir, "metrics.jsonl")
  if os.path.exists(path):
    last = 0
    with open(path) as f:
      for line in f:
        try:
          last = max(last, int(json.loads(line).get("step", 0)))
        except ValueError:
          pass
    return last
  return 0


def check_config(workdir: str, config: Any, allow_change: bool = False) -> dict[str, tuple[Any, Any]]:
  """Compares `config` with the workdir's record; records it on a first start, or an accepted change.

  Args:
    workdir: the run's folder (exists).
    config: this start's config.
    allow_change: accept a differing config: the change is appended to `config_changes.jsonl` with the step it
      applies from (`resumed_step`, and every checkpoint folder's step) instead of overwriting the record.

  Returns:
    the changes {dotted key: (old, new)} ({} on a first start or an unchanged config).

  Raises:
    ConfigDrift: the config differs and allow_change is False; the message lists every key as old -> new.
  """
  old = recorded_config(workdir)
  if old is None:
    if jax.process_index() == 0:
      _write_json(os.path.join(workdir, CONFIG_FILE), config_to_dict(config))
    return {}
  changes = config_changes(old, config)
  if not changes:
    return {}
  lines = "\n".join(f"  {k}: {json.dumps(o, default=str)} -> {json.dumps(n, default=str)}"
                    for k, (o, n) in changes.items())
  if not allow_change:
    raise ConfigDrift(f"the config differs from the one that trained {workdir} (its {CONFIG_FILE}"
                      f"{' and ' + CHANGES_FILE if os.path.exists(os.path.join(workdir, CHANGES_FILE)) else ''}):\n"
                      f"{lines}\nResume with the recorded config, pass --allow_config_change to accept and record the "
                      "change (from Python: `launch.run.run(..., allow_config_change=True)`, or "
                      "`checkpoint.check_config(workdir, config, allow_change=True)` before calling the experiment), "
                      "or start over with --fresh or a new --workdir.", changes)
  if jax.process_index() == 0:
    row = {"step": resumed_step(workdir), "checkpoints": checkpoint_steps(workdir),
           "time": datetime.datetime.now().isoformat(timespec="seconds"),
           "changes": {k: [o, n] for k, (o, n) in changes.items()}}
    with open(os.path.join(workdir, CHANGES_FILE), "a") as f:
      f.write(json.dumps(row, default=str) + "\n")
  return changes


# Workdirs whose config a caller checked for the run in progress (`config_checked`): the launcher checks before
# anything runs (and before it reads a finished workdir), so the staged drivers' own check (`ensure_config`) does
# not read and compare the record a second time inside a launched run.
_CHECKED: set[str] = set()


@contextlib.contextmanager
def config_checked(workdir: str) -> Iterator[None]:
  """While active, `ensure_config(workdir, ...)` trusts the check its caller made (the launcher's `check_config`).

  Args:
    workdir: the run's folder, its config already checked (and recorded) for this run.
  """
  path = os.path.abspath(workdir)
  added = path not in _CHECKED
  _CHECKED.add(path)
  try:
    yield
  finally:
    if added:
      _CHECKED.discard(path)


def ensure_config(workdir: str, config: Any) -> dict[str, tuple[Any, Any]]:
  """`check_config(workdir, config)` unless the run in progress checked it already (`config_checked`).

  For code that opens a run's workdir itself (`loop.Stages.from_config`), so that `experiment.run(config, workdir)`
  called directly refuses a changed config as the launcher does, instead of restoring stages that an older config
  trained. To accept a change from Python, call `check_config(workdir, config, allow_change=True)` first (it
  records the change; this check then finds the config equal to the record).

  Args:
    workdir: the run's folder (created here if missing).
    config: this start's config.

  Returns:
    {} (an accepted change is recorded by `check_config(..., allow_change=True)`, never here).

  Raises:
    ConfigDrift: the config differs from the workdir's record; the message lists every key as old -> new.
  """
  path = os.path.abspath(workdir)
  if path in _CHECKED:
    return {}
  os.makedirs(path, exist_ok=True)
  return check_config(path, config)


def read_status(workdir: str) -> dict:
  """The workdir's `status.json` ({} when absent or unreadable)."""
  try:
    with open(os.path.join(workdir, STATUS_FILE)) as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}


def write_status(workdir: str, status: str, **fields: Any) -> None:
  """Writes `status.json` = {status, updated, **fields} atomically (process 0 only).

  Args:
    workdir: the run's folder.
    status: 'running' | 'preempted' | 'failed' | 'finished'.
    **fields: extra JSON values (e.g. step, message).
  """
  if jax.process_index() == 0:
    _write_json(os.path.join(workdir, STATUS_FILE),
                {"status": status, "updated": datetime.datetime.now().isoformat(timespec="seconds"), **fields})


def is_finished(workdir: str) -> bool:
  """True when a launcher finished a run in `workdir` (status 'finished' and results.json present)."""
  return read_status(workdir).get("status") == "finished" and os.path.exists(os.path.join(workdir, "results.json"))
