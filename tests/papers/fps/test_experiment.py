"""FPS's experiment (`papers/fps/experiment.py`): the config variants, a smoke run of the tiny
config, the image path end to end (slow)."""
import os

import numpy as np
import pytest

from iclr24_jax.configs import fps as fps_config
from iclr24_jax.papers.fps import experiment


def test_config_variants():
  for v in fps_config.VARIANTS:
    c = fps_config.get_config(v)
    assert c.paper == "fps"
    for field in ("seed", "model", "optimizer", "num_steps", "data", "log_every", "eval_every", "checkpoint_every",
                  "mesh"):
      assert field in c
  assert fps_config.get_config("super_resolution").images.tasks == ("super_resolution",)
  assert fps_config.get_config("official").fps.sampler == "ddim"
  with pytest.raises(ValueError, match="unknown variant"):
    fps_config.get_config("ffhq")


def test_run_tiny_smoke(tmp_path):
  cfg = fps_config.get_config("tiny")
  res = experiment.run(cfg, str(tmp_path), progress=False)
  assert os.path.exists(tmp_path / "results.json")
  for p in res["exactness"]["plots"] + res["gaussian_limit"]["plots"]:
    assert os.path.exists(p)
  r2 = res["exactness"]["dims"][2]
  assert set(r2["fps"]) == {"ddpm c=0.95", "ddpm c=0.95 sigma=0.05", "ddpm c=0.95 telescoping",
                            "ddpm c=0.95 telescoping sigma=0.05"}
  assert all(np.isfinite(v) for v in r2["fps"]["ddpm c=0.95"][4].values())
  seeds = r2["fps_seeds"]["ddpm c=0.95 telescoping"][4]
  assert all(len(v) == cfg.exactness.num_seeds and np.all(np.isfinite(v)) for v in seeds.values())
  # DPS: one zeta in the tiny grid, chosen on validation runs; the test runs' metrics are those reported
  dps = r2["dps"]["main"]
  assert dps["zeta"] == 0.3 and set(dps["val_sw_by_zeta"]) == {0.3}
  assert dps["test"]["sw_ratio"] == dps["test_sw_ratio_by_zeta"][0.3] and np.isfinite(dps["test"]["sw"])
  # the Gaussian limit: the noise-tracking filter is the exact posterior on FPS's own sequences
  nt = [r for r in res["gaussian_limit"]["rows"] if r["filter"] == "noise_tracking"]
  assert nt and all(abs(r["obs_var_ratio"] - 1) < 1e-6 for r in nt)


@pytest.mark.slow
def test_run_tiny_images_smoke(tmp_path):
  """The image path end to end; DPS picks its step size on 2 validation images (the best mean PSNR there) and runs
  the test images at that step size, with FPS's number of steps."""
  cfg = fps_config.get_config("tiny_images")
  cfg.images.methods = ("fps", "pinv", "dps")
  cfg.images.dps_zetas = (0.3, 3.0)
  cfg.images.num_val_images = 2
  res = experiment.run(cfg, str(tmp_path), progress=False)
  task = res["images"]["tasks"]["inpainting"]
  sc = task["scores"]
  assert set(sc) == {"fps", "pinv", "dps"} and all(np.isfinite(v["psnr"]) for v in sc.values())
  val = task["dps_val_psnr_by_zeta"]
  assert set(val) == {0.3, 3.0} and task["dps_zeta"] == max(val, key=val.get)
  assert res["images"]["num_val_images"] == 2 and res["images"]["num_steps"] == cfg.fps.num_steps
  assert os.path.exists(tmp_path / "images.png")
