"""TensorBoard event files beside `metrics.jsonl`, written and read without TensorFlow.

Runs log scalars the way the Flax examples do (a TensorBoard folder per run: `tensorboard --logdir runs/`), through
tensorboardX, which writes the same event-file format without TensorFlow. `read_scalars` reads the files back
(records are TFRecord frames: an 8-byte length, its CRC, the serialised `Event`, its CRC), so tests and users can
check what a run logged without installing TensorBoard.
"""
from __future__ import annotations

import glob
import math
import os
import struct
import uuid
from typing import Any, Mapping


class TensorBoardWriter:
  """Appends scalar summaries to an event file in `logdir` (created if missing).

  Only process 0 of a multi-host run should write; the caller decides (see `common.metrics.MetricWriter`).

  Args:
    logdir: the folder of the event files (e.g. `workdir/tensorboard`).
    purge_step: on a resumed run, the first step it writes again: TensorBoard hides the earlier run's events at
      and after this step, so the curves read as one uninterrupted run (None: a fresh run).
  """

  def __init__(self, logdir: str, purge_step: int | None = None):
    from tensorboardX import SummaryWriter  # imported here: the library imports without it
    os.makedirs(logdir, exist_ok=True)
    self.logdir = logdir
    # A unique suffix: two writers opened within one second (a quick resume) would otherwise share a file name.
    self._writer = SummaryWriter(logdir=logdir, purge_step=purge_step,
                                 filename_suffix=f".{os.getpid()}.{uuid.uuid4().hex[:8]}")

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Writes every finite number in `scalars` as a scalar summary at `step` (tags keep their `train/` etc.).

    Args:
      step: the global step.
      scalars: name -> Python / numpy number; non-numbers and non-finite values are skipped (TensorBoard plots
        neither).
    """
    for tag, value in scalars.items():
      if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "item"):
        continue
      try:
        value = float(value)
      except (TypeError, ValueError):
        continue
      if math.isfinite(value):
        self._writer.add_scalar(str(tag), value, global_step=int(step))
    self._writer.flush()

  def close(self) -> None:
    """Flushes and closes the event file."""
    self._writer.close()


def _records(path: str):
  with open(path, "rb") as f:
    while True:
      header = f.read(8)
      if len(header) < 8:
        return
      (length,) = struct.unpack("<Q", header)
      f.read(4)                      # CRC of the length
      data = f.read(length)
      f.read(4)                      # CRC of the data
      if len(data) < length:         # a record cut by a crash: stop at the last whole one
        return
      yield data


def read_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
  """Reads every scalar summary from the event files in `logdir`.

  Args:
    logdir: a folder written by `TensorBoardWriter` (or any TensorBoard writer).

  Returns:
    tag -> list of (step, value), in the order written (files in the order of their first event's time). A
    resumed run's restart marker (a `SessionLog.START` event at its purge step) hides the earlier values at and
    after that step, as TensorBoard does, so a killed and resumed run reads as one run.

  Raises:
    FileNotFoundError: when `logdir` holds no event file.
  """
  from tensorboardX.proto import event_pb2
  files = sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*")))
  if not files:
    raise FileNotFoundError(f"no TensorBoard event file (events.out.tfevents.*) in {logdir}.")
  events = []
  for path in files:
    file_events = [event_pb2.Event.FromString(data) for data in _records(path)]
    if file_events:
      events.append((file_events[0].wall_time, path, file_events))
  out: dict[str, list[tuple[int, float]]] = {}
  for _, _, file_events in sorted(events, key=lambda e: (e[0], e[1])):
    for event in file_events:
      if event.HasField("session_log") and event.session_log.status == event_pb2.SessionLog.START:
        out = {tag: [(s, v) for s, v in vals if s < event.step] for tag, vals in out.items()}
      for value in event.summary.value:
        if value.HasField("simple_value"):
          out.setdefault(value.tag, []).append((int(event.step), float(value.simple_value)))
  return out
