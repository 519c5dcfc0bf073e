"""GraphCare metrics (`papers/graphcare/metrics.py`) against scikit-learn."""
import numpy as np

from iclr24_jax.papers.graphcare import metrics as m


def test_metrics_match_sklearn():
  import sklearn.metrics as skm
  rng = np.random.default_rng(0)
  y = rng.integers(0, 2, 200)
  p = np.round(rng.random(200) * 0.5 + 0.4 * y, 2)  # ties on purpose
  pred = (p >= 0.5).astype(int)
  b = m.binary_metrics(y, p)
  np.testing.assert_allclose(b["auroc"], skm.roc_auc_score(y, p), rtol=1e-10)
  np.testing.assert_allclose(b["auprc"], skm.average_precision_score(y, p), rtol=1e-10)
  np.testing.assert_allclose(b["f1"], skm.f1_score(y, pred), rtol=1e-10)
  np.testing.assert_allclose(b["f1_macro"], skm.f1_score(y, pred, average="macro"), rtol=1e-10)
  np.testing.assert_allclose(b["jaccard"], skm.jaccard_score(y, pred), rtol=1e-10)
  yc = rng.integers(0, 10, 300)
  pc = rng.dirichlet(np.ones(10), 300)
  pc[np.arange(300), yc] += 0.2
  pc /= pc.sum(1, keepdims=True)
  c = m.multiclass_metrics(yc, pc)
  np.testing.assert_allclose(c["accuracy"], skm.accuracy_score(yc, pc.argmax(1)), rtol=1e-10)
  np.testing.assert_allclose(c["f1_macro"], skm.f1_score(yc, pc.argmax(1), average="macro"), rtol=1e-10)
  np.testing.assert_allclose(c["f1_weighted"], skm.f1_score(yc, pc.argmax(1), average="weighted"), rtol=1e-10)
  np.testing.assert_allclose(c["kappa"], skm.cohen_kappa_score(yc, pc.argmax(1)), rtol=1e-10)
  np.testing.assert_allclose(c["auroc"], skm.roc_auc_score(yc, pc, multi_class="ovr", average="weighted"), rtol=1e-10)
  yl = rng.integers(0, 2, (50, 12))
  yl[:, 0], yl[:, 1] = 1, 0  # every row has both classes (sklearn's sample AUROC needs it)
  pl = np.clip(rng.random((50, 12)) * 0.6 + 0.3 * yl, 0, 1)
  ml = m.multilabel_metrics(yl, pl)
  np.testing.assert_allclose(ml["jaccard"], skm.jaccard_score(yl, pl >= 0.5, average="samples", zero_division=1),
                             rtol=1e-10)
  np.testing.assert_allclose(ml["f1"], skm.f1_score(yl, pl >= 0.5, average="samples", zero_division=1), rtol=1e-10)
  np.testing.assert_allclose(ml["auprc"], skm.average_precision_score(yl, pl, average="samples"), rtol=1e-10)
  np.testing.assert_allclose(ml["auroc"], skm.roc_auc_score(yl, pl, average="samples"), rtol=1e-10)
  lo, hi = m.bootstrap_ci("binary", y, p, num_resamples=100, metrics=("auroc",))["auroc"]
  assert lo <= b["auroc"] <= hi
