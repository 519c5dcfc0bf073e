"""FPS experiments: the exactness study (exact GMM denoiser vs the exact posterior), the Gaussian M -> infinity
limit (Kalman), and image inverse problems on digits with a trained diffusion prior.

run(config, workdir): config.task = 'exactness' (default) | 'images' | 'both' (tiny); writes results.json and PNGs.
study.py holds reproduce(workdir, fast) (the reproduction rows) and benchmark(quick) (particles x steps per
second vs number of particles and image size, 1 and all devices).

Where things are: the method in `smc.py` (FPS), `operators.py`, `resampling.py`, `exact.py` (exact posteriors and
Kalman references), `baselines.py` (DPS, pseudo-inverse), `model.py`; compiled batched sampler runs in `programs.py`;
the studies `run` launches in `study_exactness.py` (`exactness_study`, `gaussian_limit_study`) and
`study_images.py` (`image_study`).
"""
from __future__ import annotations

import os
import time
from typing import Any

from iclr24_jax.common import data as common_data
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.papers.fps.study_exactness import exactness_study, gaussian_limit_study
from iclr24_jax.papers.fps.study_images import image_study
from iclr24_jax.papers.fps import data as fps_data

PAPER = "fps"


def run(config: Any, workdir: str, progress: bool = True) -> dict:
  """Runs the configured study (config.task: 'exactness' | 'images' | 'both') and writes results.json + PNGs.

  Args:
    config: the fps ConfigDict (`configs/fps.py`).
    workdir: output folder (created).
    progress: print progress lines.

  Returns:
    results dict: paper, task, exactness and gaussian_limit (exactness / both), images (images / both), seconds.

  Raises:
    ValueError: unknown config.task.
  """
  if config.data.name in fps_data.DATASETS:   # the paper's own data: read first (DataNotFoundError
    fps_data.load(config.data)                  # naming the layout and source when absent)
    raise common_data.paper_data_not_wired("fps", config.data)   # run() does not train on it yet
  os.makedirs(workdir, exist_ok=True)
  if config.task not in ("exactness", "images", "both"):
    raise ValueError(f"config.task must be 'exactness', 'images' or 'both', got '{config.task}'.")
  results: dict[str, Any] = {"paper": PAPER, "task": config.task}
  t0 = time.perf_counter()
  if config.task in ("exactness", "both"):
    results["exactness"] = exactness_study(config, workdir, progress)
    results["gaussian_limit"] = gaussian_limit_study(config, workdir)
  if config.task in ("images", "both"):
    results["images"] = image_study(config, workdir, progress)
  results["seconds"] = time.perf_counter() - t0
  metrics_lib.write_results(workdir, results)
  return results
