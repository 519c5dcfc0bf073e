"""Metrics on disk (`metrics.jsonl`, `results.json`), a progress line, and PNG plots."""
from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any, Iterable, Mapping

import jax
import numpy as np


def to_python(tree: Any) -> Any:
  """Converts arrays/numpy scalars inside a pytree of dicts/lists into JSON-safe Python values."""
  tree = jax.device_get(tree)
  if isinstance(tree, Mapping):
    return {str(k): to_python(v) for k, v in tree.items()}
  if isinstance(tree, (list, tuple)):
    return [to_python(v) for v in tree]
  if isinstance(tree, np.ndarray):
    return tree.item() if tree.ndim == 0 else tree.tolist()
  if isinstance(tree, np.generic):
    return tree.item()
  if isinstance(tree, float) and not math.isfinite(tree):
    return str(tree)
  return tree


class MetricWriter:
  """Appends one JSON object per logged step to `workdir/metrics.jsonl` (process 0 writes; the others no-op), and
  the same scalars to TensorBoard event files in `workdir/tensorboard/` (`tensorboard --logdir runs/`).

  On resume (`resume_step` given) rows logged after that step by the interrupted run are dropped, so
  the file reads as one uninterrupted run (TensorBoard hides them through its purge step); a fresh start
  (`resume_step` None) replaces the file and the event files. Build it with `open_writer` (the one place that
  decides between the two).

  Args:
    workdir: the run's folder.
    resume_step: the step a resumed run continues from; None for a fresh run.
    filename: the JSON-lines file; a name other than metrics.jsonl gets its own TensorBoard folder
      (`tensorboard/<name without .jsonl>`).
    tensorboard: also write event files (needs tensorboardX, a core dependency).
  """

  def __init__(self, workdir: str, resume_step: int | None = None, filename: str = "metrics.jsonl",
               tensorboard: bool = True):
    os.makedirs(workdir, exist_ok=True)
    self.path = os.path.join(workdir, filename)
    self.enabled = jax.process_index() == 0
    self.tensorboard = None
    if not self.enabled:
      return
    if tensorboard:
      from iclr24_jax.common import tensorboard as tb_lib
      stem = os.path.splitext(filename)[0]
      logdir = os.path.join(workdir, "tensorboard", *(() if filename == "metrics.jsonl" else (stem,)))
      if resume_step is None and os.path.isdir(logdir):
        for old in os.listdir(logdir):
          if old.startswith("events.out.tfevents."):
            os.remove(os.path.join(logdir, old))
      self.tensorboard = tb_lib.TensorBoardWriter(
          logdir, purge_step=None if resume_step is None else int(resume_step) + 1)
    if resume_step is not None and os.path.exists(self.path):
      rows = [r for r in read_jsonl(self.path) if int(r.get("step", 0)) <= resume_step]
      tmp = self.path + ".tmp"
      with open(tmp, "w") as f:
        for r in rows:
          f.write(json.dumps(r) + "\n")
      os.replace(tmp, self.path)
    elif resume_step is None and os.path.exists(self.path):
      os.remove(self.path)

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    """Writes `{"step": step, **metrics}` (arrays pulled to host once, here).

    Args:
      step: the row's step.
      metrics: mapping name -> scalar (arrays and numpy values are converted with `to_python`).
    """
    row = {"step": int(step), **to_python(dict(metrics))}
    if self.enabled:
      with open(self.path, "a") as f:
        f.write(json.dumps(row) + "\n")
      if self.tensorboard is not None:
        self.tensorboard.write_scalars(int(step), {k: v for k, v in row.items() if k != "step"})

  def close(self) -> None:
    """Closes the TensorBoard event file (the JSON-lines file is closed after every row)."""
    if self.tensorboard is not None:
      self.tensorboard.close()
      self.tensorboard = None

  def __enter__(self) -> "MetricWriter":
    return self

  def __exit__(self, *exc: Any) -> None:
    self.close()


def open_writer(workdir: str | None, start_step: int = 0, filename: str = "metrics.jsonl") -> MetricWriter | None:
  """The metrics writer of a run that starts (or resumes) at `start_step`.

  Args:
    workdir: the run's folder; None gives None (nothing written).
    start_step: 0 for a fresh run (an old file is replaced); the resumed step otherwise (rows after it are dropped).
    filename: the file inside workdir.

  Returns:
    MetricWriter, or None without a workdir.
  """
  if workdir is None:
    return None
  return MetricWriter(workdir, resume_step=int(start_step) if start_step else None, filename=filename)


def read_jsonl(path: str) -> list[dict]:
  """Reads a JSON-lines file into a list of dicts."""
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def write_results(workdir: str, results: Mapping[str, Any], filename: str = "results.json") -> str:
  """Writes the final numbers of a run as `workdir/results.json`; returns the path.

  Values are converted with `to_python` (arrays -> lists, numpy scalars -> Python) and written atomically
  (temporary file, then rename), keys sorted.

  Args:
    workdir: output folder (created if missing).
    results: mapping of JSON-serialisable values (after `to_python`).
    filename: file name inside workdir.

  Returns:
    the path written.
  """
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, filename)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(to_python(dict(results)), f, indent=2, sort_keys=True)
  os.replace(tmp, path)
  return path


def _fmt_seconds(s: float) -> str:
  if not math.isfinite(s):
    return "?"
  s = int(round(s))
  h, rem = divmod(s, 3600)
  m, sec = divmod(rem, 60)
  return f"{h}h{m:02d}m{sec:02d}s" if h else (f"{m}m{sec:02d}s" if m else f"{sec}s")


class Progress:
  """A one-line progress report: step/total, steps/s, ETA and the last loss.

  Prints at most every `every_s` seconds (and at the end) to `stream`. The rate (and so the ETA) is measured from
  the first update on: the interval before it holds the compilation, which would make the first ETA hours long
  for a run of minutes; until a second update there is no rate ('?').
  """

  def __init__(self, total: int, start: int = 0, every_s: float = 5.0, name: str = "train", stream=None,
               enabled: bool = True):
    self.total, self.start, self.every_s, self.name = total, start, every_s, name
    self.stream = stream or sys.stderr
    self.enabled = enabled
    self.t0 = time.perf_counter()
    self.last_print = -float("inf")
    self._ref: tuple[float, int] | None = None   # (time, step) of the first update: the rate is measured after it

  def line(self, step: int, loss: float | None = None) -> str:
    """The progress line at `step`: step/total (percent), steps/s after the first update, ETA and the loss if given.

    Args:
      step: the current global step.
      loss: the latest loss, or None.

    Returns:
      the line as str.
    """
    now = time.perf_counter()
    t_ref, s_ref = self._ref if self._ref is not None else (now, step)
    done, elapsed = step - s_ref, now - t_ref
    rate = done / elapsed if elapsed > 0 and done > 0 else float("nan")
    eta = (self.total - step) / rate if rate == rate and rate > 0 else float("nan")
    pct = 100.0 * step / max(self.total, 1)
    parts = [f"[{self.name}] step {step}/{self.total} ({pct:.0f}%)",
             f"{rate:.2f} steps/s" if rate == rate else "? steps/s", f"ETA {_fmt_seconds(eta)}"]
    if loss is not None:
      parts.append(f"loss {loss:.4g}")
    return " | ".join(parts)

  def update(self, step: int, loss: float | None = None, force: bool = False) -> None:
    """Prints `line(step, loss)` when enabled and at least every_s seconds have passed (or at the end, or forced).

    Args:
      step: the current global step.
      loss: the latest loss, or None.
      force: print regardless of the time since the last line.
    """
    now = time.perf_counter()
    if self.enabled and (force or step >= self.total or now - self.last_print >= self.every_s):
      self.last_print = now
      print(self.line(step, loss), file=self.stream, flush=True)
    if self._ref is None:
      self._ref = (now, step)


def save_figure(fig, path: str) -> str:
  """Saves a matplotlib figure as PNG (creating folders) and closes it; returns the path.

  Args:
    fig: a matplotlib Figure.
    path: output file path (dpi 110, tight bounding box).

  Returns:
    path.
  """
  import matplotlib
  matplotlib.use("Agg", force=False)
  import matplotlib.pyplot as plt
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(fig)
  return path


def new_figure(ncols: int = 1, nrows: int = 1, size: tuple[float, float] = (4.0, 3.0)):
  """Returns (fig, axes) from a headless matplotlib backend.

  Args:
    ncols: number of subplot columns.
    nrows: number of subplot rows.
    size: (width, height) in inches of ONE subplot; the figure is ncols * width by nrows * height.

  Returns:
    (fig, axes) with axes a numpy object array [nrows, ncols] (never squeezed).
  """
  import matplotlib
  matplotlib.use("Agg", force=False)
  import matplotlib.pyplot as plt
  return plt.subplots(nrows, ncols, figsize=(size[0] * ncols, size[1] * nrows), squeeze=False)


def plot_curves(rows: Iterable[Mapping[str, Any]], keys: Iterable[str], path: str, x: str = "step",
                title: str | None = None) -> str:
  """Plots metric curves (e.g. rows of metrics.jsonl) for the given keys into a PNG.

  Args:
    rows: dicts, each holding the x key and some of `keys`; rows whose value is not an int/float are skipped.
    keys: metric names to draw, one line each (keys absent from every row draw nothing).
    path: PNG output path.
    x: the row key used as abscissa.
    title: optional axes title.

  Returns:
    path.
  """
  rows = list(rows)
  fig, axes = new_figure()
  ax = axes[0, 0]
  for k in keys:
    pts = [(r[x], r[k]) for r in rows if k in r and isinstance(r[k], (int, float))]
    if pts:
      xs, ys = zip(*pts)
      ax.plot(xs, ys, label=k)
  ax.set_xlabel(x)
  ax.legend()
  if title:
    ax.set_title(title)
  return save_figure(fig, path)


def plot_image_grid(images: np.ndarray, path: str, ncols: int = 8, title: str | None = None) -> str:
  """Saves a grid of images [N, H, W] or [N, H, W, C] (values in [0, 1]) as PNG.

  Args:
    images: [N, H, W] or [N, H, W, C] (C = 1 or 3) with values in [0, 1] (clipped); grey images use a grey map.
    path: PNG output path.
    ncols: images per row; rows = ceil(N / ncols).
    title: optional figure title.

  Returns:
    path.
  """
  images = np.asarray(images)
  n = images.shape[0]
  nrows = max(1, math.ceil(n / ncols))
  fig, axes = new_figure(ncols=ncols, nrows=nrows, size=(1.2, 1.2))
  for i, ax in enumerate(axes.flat):
    ax.axis("off")
    if i < n:
      img = images[i]
      if img.ndim == 3 and img.shape[-1] == 1:
        img = img[..., 0]
      ax.imshow(np.clip(img, 0, 1), cmap="gray" if img.ndim == 2 else None, vmin=0, vmax=1)
  if title:
    fig.suptitle(title)
  return save_figure(fig, path)


# ----------------------------------------------------------------------------------------------------------------
# Image quality (moved here from papers/fps so fps, daclip and mdm share one definition)
# ----------------------------------------------------------------------------------------------------------------


def _to_unit_range(x, value_range: tuple[float, float], name: str) -> np.ndarray:
  """[N, H, W, C] array in `value_range` -> float64 in [0, 1] (clipped); validates shape and values."""
  a = np.asarray(x, np.float64)
  if a.ndim != 4:
    raise ValueError(f"{name} must be images [N, H, W, C], got shape {a.shape}; add the batch/channel axes.")
  if not np.all(np.isfinite(a)):
    raise ValueError(f"{name} contains NaN or inf values; check the sampler output before scoring it.")
  lo, hi = float(value_range[0]), float(value_range[1])
  if not hi > lo:
    raise ValueError(f"value_range={value_range} must be (low, high) with high > low.")
  return np.clip((a - lo) / (hi - lo), 0.0, 1.0)


def _check_pair(x, truth, value_range) -> tuple[np.ndarray, np.ndarray]:
  a = _to_unit_range(x, value_range, "x")
  b = _to_unit_range(truth, value_range, "truth")
  if a.shape != b.shape:
    raise ValueError(f"x {a.shape} and truth {b.shape} must have the same shape [N, H, W, C].")
  return a, b


def psnr(x, truth, value_range: tuple[float, float] = (-1.0, 1.0)) -> np.ndarray:
  """Peak signal-to-noise ratio (dB) per image.

  Both arrays are mapped from `value_range` to [0, 1] and clipped, then
  PSNR = 10 log10(1 / max(MSE, 1e-10)) (peak 1; the floor caps identical images at 100 dB).

  Args:
    x: images [N, H, W, C] (e.g. restored / sampled), values in `value_range`.
    truth: reference images [N, H, W, C].
    value_range: (low, high) of the inputs; (-1, 1) as the diffusion samplers (fps), (0, 1) for images.

  Returns:
    [N] float64 PSNR in dB.
  """
  a, b = _check_pair(x, truth, value_range)
  mse = np.mean((a - b) ** 2, axis=(1, 2, 3))
  return 10.0 * np.log10(1.0 / np.maximum(mse, 1e-10))


def ssim(x, truth, value_range: tuple[float, float] = (-1.0, 1.0)) -> np.ndarray:
  """Structural similarity per image (scikit-image, data_range 1, Gaussian-free 7x7 uniform window).

  As fps computed it: inputs mapped to [0, 1] and clipped; the window is 7 or the largest odd size that
  fits a smaller image; multi-channel images average the per-channel SSIM (`channel_axis=-1`).

  Args:
    x: images [N, H, W, C] in `value_range`.
    truth: reference images [N, H, W, C].
    value_range: (low, high) of the inputs.

  Returns:
    [N] float64 SSIM in [-1, 1] (1 = identical).
  """
  from skimage.metrics import structural_similarity
  a, b = _check_pair(x, truth, value_range)
  side = min(a.shape[1], a.shape[2])
  win = min(7, side - (1 - side % 2))
  if win < 3:
    raise ValueError(f"ssim needs images of at least 3x3 pixels, got {a.shape[1]}x{a.shape[2]}.")
  if a.shape[-1] == 1:
    return np.array([structural_similarity(a[i, ..., 0], b[i, ..., 0], data_range=1.0, win_size=win)
                     for i in range(a.shape[0])])
  return np.array([structural_similarity(a[i], b[i], data_range=1.0, win_size=win, channel_axis=-1)
                   for i in range(a.shape[0])])


def psnr_ssim(x, truth, value_range: tuple[float, float] = (-1.0, 1.0)) -> tuple[np.ndarray, np.ndarray]:
  """(PSNR dB [N], SSIM [N]) per image for [N, H, W, C] arrays in `value_range` (compared in [0, 1]).

  Args:
    x: images [N, H, W, C] in `value_range`.
    truth: reference images [N, H, W, C].
    value_range: (low, high) of the inputs.

  Returns:
    (psnr [N] float64 in dB, ssim [N] float64), see `psnr` and `ssim`.

  Raises:
    ValueError: shapes differ or are not 4-D, non-finite values, a bad value_range, or images under 3x3.
  """
  return psnr(x, truth, value_range), ssim(x, truth, value_range)
