"""A digits CNN that judges generated images: is a sample the digit it was asked for?

`train_digits_classifier` (the judging CNN, trained with `classify.train_classifier` on one device),
`to_classifier_input` (samples in [-1, 1] at any size -> the classifier's [0, 1] input) and `judge_samples`
(accuracy vs the requested labels, mean confidence, class-histogram entropy). Used by the diffusion family's
study and by mdm's sample judge.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from iclr24_jax.common import data as data_lib
from iclr24_jax.common import sharding
from iclr24_jax.vision import classify


def to_classifier_input(samples: np.ndarray, size: int = 8) -> np.ndarray:
  """Samples [N, S, S, 1] in [-1, 1] -> [N, size, size, 1] in [0, 1], the judging classifier's input.

  Args:
    samples: [N, S, S, 1] in [-1, 1].
    size: the classifier's input side (8 for scikit-learn digits, 28 for MNIST-5k); antialiased resize when S differs.

  Returns:
    float32 numpy [N, size, size, 1] in [0, 1].
  """
  x = np.clip((np.asarray(samples) + 1.0) / 2.0, 0.0, 1.0)
  if x.shape[1] != size:
    x = np.asarray(jax.image.resize(x, (x.shape[0], size, size, 1), "linear", antialias=True))
  return x


def train_digits_classifier(cfg: Any, ds: data_lib.Dataset, progress: bool = False):
  """Trains the judging CNN on 8x8 digits; returns (model, state, test accuracy).

  Args:
    cfg: the config.classifier block: num_steps, batch_size, features, dense, learning_rate.
    ds: the Dataset (grey x [N, H, W, 1] in [0, 1], 10 classes: 8x8 digits here, 32x32 MNIST in mdm's judge);
      trained on one device.
    progress: print a progress line.

  Returns:
    (Linen CNN, TrainState, test accuracy float in [0, 1]).
  """
  ccfg = ml_collections.ConfigDict(dict(
      seed=0, num_steps=int(cfg.num_steps), batch_size=int(cfg.batch_size), log_every=max(int(cfg.num_steps), 1),
      eval_every=0, checkpoint_every=0,
      model=dict(name="cnn", features=tuple(cfg.features), dense=int(cfg.dense)),
      optimizer=dict(name="adam", learning_rate=float(cfg.learning_rate), schedule="cosine", warmup_steps=0)))
  # One device: the judge is small, and a 1-device compile is cheaper than an 8-way sharded one.
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  model, res = classify.train_classifier(ccfg, ds, mesh=mesh, progress=progress)
  acc = classify.evaluate(model, res.state, ds.test, mesh=mesh)["accuracy"]
  return model, res.state, acc


def judge_samples(model, state, samples: np.ndarray, labels: np.ndarray | None, logits: np.ndarray | None = None,
                  input_size: int = 8) -> dict[str, float]:
  """Classifier verdict on samples: accuracy vs the requested labels, mean confidence, class-histogram entropy.

  Args:
    model: the judging classifier.
    state: its TrainState.
    samples: [N, S, S, 1] in [-1, 1] (only used when logits is None).
    labels: [N] int requested digits, or None (unconditional: no accuracy).
    logits: precomputed [N, 10] judge logits, or None to compute them.
    input_size: the classifier's input side (see `to_classifier_input`).

  Returns:
    {'confidence': mean max-probability, 'class_entropy_bits': entropy of the predicted-class histogram
    (log2 10 = 3.32 for uniform), 'accuracy' (with labels)}.
  """
  if logits is None:
    logits = classify.predict(model, state, to_classifier_input(samples, input_size))
  probs = np.asarray(jax.nn.softmax(jnp.asarray(logits), -1))
  pred = probs.argmax(-1)
  hist = np.bincount(pred, minlength=probs.shape[-1]) / len(pred)
  out = {"confidence": float(probs.max(-1).mean()),
         "class_entropy_bits": float(-(hist[hist > 0] * np.log2(hist[hist > 0])).sum())}
  if labels is not None:
    out["accuracy"] = float(np.mean(pred == labels))
  return out
