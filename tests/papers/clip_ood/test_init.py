"""CLIP OOD package API (`papers/clip_ood/__init__.py`): the vision CLIP is re-exported, every name in __all__
exists."""
import jax.numpy as jnp
import numpy as np

from iclr24_jax.papers import clip_ood
from iclr24_jax.vision import clip


def test_public_api_reexports_the_vision_clip():
  assert clip_ood.clip_loss is clip.clip_loss
  assert clip_ood.zero_shot_accuracy is clip.zero_shot_accuracy
  for name in clip_ood.__all__:
    assert hasattr(clip_ood, name)
  # the loss on a hand example: identity pairs at scale 1 -> log(1 + e^-1) = 0.3132617 (see tests/vision)
  np.testing.assert_allclose(float(clip_ood.clip_loss(jnp.eye(2), jnp.eye(2), 1.0)), 0.3132617, atol=1e-4)
