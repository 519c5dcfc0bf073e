"""PMP metrics (`papers/pmp/metrics.py`) against scikit-learn."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn import metrics as skm

from iclr24_jax.papers import pmp
from iclr24_jax.papers.pmp import metrics as pmp_metrics


def _fixed_predictions():
  rng = np.random.default_rng(0)
  labels = (rng.random(500) < 0.12).astype(np.int32)
  scores = np.round(np.clip(0.3 * labels + rng.normal(0.3, 0.2, 500), 0, 1), 2).astype(np.float32)  # with ties
  return scores, labels


def test_metrics_equal_sklearn():
  scores, labels = _fixed_predictions()
  thr = 0.45
  preds = (scores >= thr).astype(int)
  got = pmp.evaluate(jnp.asarray(scores), jnp.asarray(labels), threshold=thr)
  assert set(got) == {"auc", "f1_macro", "gmean"}
  np.testing.assert_allclose(float(got["auc"]), skm.roc_auc_score(labels, scores), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(float(got["f1_macro"]), skm.f1_score(labels, preds, average="macro"), rtol=1e-5,
                             atol=1e-6)
  tn, fp, fn, tp = skm.confusion_matrix(labels, preds).ravel()
  np.testing.assert_allclose(float(got["gmean"]), np.sqrt(tp * tn / ((tp + fn) * (tn + fp))), rtol=1e-5, atol=1e-6)
  # A mask equals evaluating the selected entries only (inside jit too).
  mask = np.random.default_rng(1).random(500) < 0.5
  masked = jax.jit(pmp.evaluate)(jnp.asarray(scores), jnp.asarray(labels), jnp.asarray(mask), thr)
  np.testing.assert_allclose(float(masked["auc"]), skm.roc_auc_score(labels[mask], scores[mask]), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(float(masked["f1_macro"]),
                             skm.f1_score(labels[mask], preds[mask], average="macro"), rtol=1e-5, atol=1e-6)


def test_best_f1_threshold_matches_official_rule():
  scores, labels = _fixed_predictions()
  precision, recall, thresholds = skm.precision_recall_curve(labels, scores)
  with np.errstate(invalid="ignore", divide="ignore"):
    f1 = np.nan_to_num(2 * precision * recall / (precision + recall))
  want = thresholds[np.argmax(f1)]
  assert pmp.best_f1_threshold(scores, labels) == pytest.approx(float(want))
  with pytest.raises(ValueError, match="no positive"):
    pmp.best_f1_threshold(scores, np.zeros_like(labels))


def test_multiclass_auc_equals_sklearn_ovr():
  rng = np.random.default_rng(2)
  labels = rng.integers(0, 4, 300)
  probs = jax.nn.softmax(jnp.asarray(rng.normal(size=(300, 4)) + 0.8 * np.eye(4)[labels]), -1)
  np.testing.assert_allclose(pmp_metrics.multiclass_auc(np.asarray(probs), labels),
                             skm.roc_auc_score(labels, np.asarray(probs, np.float64), multi_class="ovr"), rtol=1e-5)
  np.testing.assert_allclose(pmp_metrics.multiclass_f1_macro(np.asarray(probs), labels),
                             skm.f1_score(labels, np.argmax(probs, -1), average="macro"), rtol=1e-6)
