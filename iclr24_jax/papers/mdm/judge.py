"""The MDM study's sample judge: an MNIST CNN's accuracy on requested digits and sliced W2 of its features.

`train_judge` trains it on the 32x32 training digits; `Judge.score` / `Judge.feature_sw` score samples.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import data as data_lib
from iclr24_jax.diffusion import metrics as dmetrics


class Judge:
  """An MNIST CNN (vision.classify) trained on the 32x32 training digits: accuracy on requested labels and
  sliced W2 of its penultimate features against held-out real digits (with the data-vs-data floor)."""

  def __init__(self, model, state, test_accuracy, real_features):
    self.model, self.state, self.test_accuracy, self.real_features = model, state, test_accuracy, real_features

  def logits_features(self, images: np.ndarray):
    """Judge logits [N, 10] and penultimate features [N, F] of images [N, S, S, 1] in [-1, 1] (mapped to [0, 1])."""
    from iclr24_jax.vision import classify
    x = np.clip((np.asarray(images, np.float32) + 1.0) / 2.0, 0.0, 1.0)
    return classify.predict(self.model, self.state, x, return_features=True)

  def score(self, images: np.ndarray, labels: np.ndarray, key: jax.Array | None = None) -> dict[str, float]:
    """Accuracy of the judge on requested labels plus the feature sliced W2 (and its floor) of generated images.

    Args:
      images: [N, S, S, 1] samples in [-1, 1].
      labels: [N] int requested digits.
      key: PRNG key of the sliced W2 (None: key(0)).

    Returns:
      {'accuracy', 'feature_sw', 'feature_sw_floor'} floats.

    Raises:
      ValueError: N larger than half the held-out real digits.
    """
    logits, feats = self.logits_features(images)
    out = {"accuracy": float(np.mean(logits.argmax(-1) == labels))}
    out.update(self.feature_sw(feats, key if key is not None else jax.random.key(0)))
    return out

  def feature_sw(self, feats: np.ndarray, key: jax.Array) -> dict[str, float]:
    """Sliced W2 of features [N, F] to held-out real features, with its data-vs-data floor
    (`diffusion.metrics.sliced_wasserstein_vs_data`).

    Args:
      feats: [N, F] penultimate features of the samples.
      key: PRNG key (reference draws and projections).

    Returns:
      {'feature_sw', 'feature_sw_floor'} floats.

    Raises:
      ValueError: N larger than half the held-out real digits.
    """
    real = jnp.asarray(self.real_features)
    n = feats.shape[0]
    if n > real.shape[0] // 2:
      raise ValueError(f"{n} samples need at least {2 * n} held-out real digits for the data-vs-data floor.")
    draw = lambda k, m: real[jax.random.choice(k, real.shape[0], (m,), replace=False)]  # noqa: E731
    sw, floor = dmetrics.sliced_wasserstein_vs_data(jnp.asarray(feats), draw, key, num_refs=4, num_projections=128)
    return {"feature_sw": float(sw), "feature_sw_floor": float(floor)}


def train_judge(judge_cfg: Any, arrays: dict[str, np.ndarray]) -> Judge:
  """Trains the MNIST CNN on the training digits (in [0, 1]) and embeds the held-out digits.

  Args:
    judge_cfg: the config.judge block (see `vision.judge.train_digits_classifier`).
    arrays: {'x_train': [N, S, S, 1] in [-1, 1], 'y_train': [N] int, 'x_eval': [M, S, S, 1], 'y_eval': [M]};
      the first half of the eval digits is the judge's val split, the second half its test split.

  Returns:
    Judge with its test accuracy and real_features [M, F] (penultimate features of all eval digits).
  """
  from iclr24_jax.vision.judge import train_digits_classifier
  to01 = lambda x: ((x + 1.0) / 2.0).astype(np.float32)  # noqa: E731
  n_eval = arrays["x_eval"].shape[0]
  half = n_eval // 2
  ds = data_lib.Dataset("mnist_judge", data_lib.Split(to01(arrays["x_train"]), arrays["y_train"]),
                        data_lib.Split(to01(arrays["x_eval"][:half]), arrays["y_eval"][:half]),
                        data_lib.Split(to01(arrays["x_eval"][half:]), arrays["y_eval"][half:]), 10)
  model, state, acc = train_digits_classifier(judge_cfg, ds)
  j = Judge(model, state, float(acc), None)
  j.real_features = j.logits_features(arrays["x_eval"])[1]
  return j
