"""FPS's image study (`papers/fps/study_images.py`): validation images apart from the test
images, the DPS step size never tuned on the test images."""
import numpy as np
import pytest

from iclr24_jax.configs import fps as fps_config
from iclr24_jax.papers.fps import study_images


def test_split_images_keeps_validation_apart_from_the_test_images():
  """Test images = the generator's first draw (the same whatever the validation count, so earlier rows' test set is
  kept); validation images come from the rest of the pool: no image is in both."""
  pool = np.arange(40, dtype=np.float32).reshape(40, 1, 1, 1)    # image i is the value i
  test, val = study_images.split_images(pool, 12, 8, seed=0)
  want = pool[np.random.default_rng(0).choice(40, 12, replace=False)]
  np.testing.assert_array_equal(test, want)
  np.testing.assert_array_equal(study_images.split_images(pool, 12, 0, seed=0)[0], want)
  assert val.shape == (8, 1, 1, 1) and not set(val.ravel()) & set(test.ravel())
  assert len(set(val.ravel())) == 8
  with pytest.raises(ValueError, match="num_val_images"):
    study_images.split_images(pool, 35, 8, seed=0)


def test_dps_step_size_is_never_tuned_on_the_test_images(tmp_path):
  """Several DPS step sizes and no validation images: refused before the prior is trained."""
  cfg = fps_config.get_config("tiny_images")
  cfg.images.methods = ("fps", "dps")
  cfg.images.dps_zetas = (0.3, 1.0)
  cfg.images.num_val_images = 0
  with pytest.raises(ValueError, match="validation images"):
    study_images.image_study(cfg, str(tmp_path), progress=False)
  assert not (tmp_path / "prior").exists()
  assert fps_config.get_config("images").images.num_val_images > 0
