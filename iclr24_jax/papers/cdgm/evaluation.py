"""Utility (train on synthetic, test on real) and detection (real vs synthetic) with scikit-learn classifiers.

Deviation: the official evaluation (`evaluation/stasy_utility_detection.py`) grid-searches six classifier
families (DT, AdaBoost, LR, MLP, RF, XGBoost; 184 settings) on a validation split and averages 5 sampling rounds;
here three fixed classifiers (logistic regression, decision tree, random forest) and one sampling round keep the
reproduction within minutes on CPU. Utility: binary F1 (HELOC, generated) or macro F1 (faults), averaged over the
classifiers. Detection: the same classifiers trained to separate real training rows (0) from synthetic rows (1)
on a 70/30 split; the reported detection F1/accuracy are lower-is-better (0.5 accuracy = indistinguishable).
"""
from __future__ import annotations

import warnings

import numpy as np


def _classifiers(seed: int):
  from sklearn.ensemble import RandomForestClassifier
  from sklearn.linear_model import LogisticRegression
  from sklearn.pipeline import make_pipeline
  from sklearn.preprocessing import StandardScaler
  from sklearn.tree import DecisionTreeClassifier
  return {
      "logreg": make_pipeline(StandardScaler(), LogisticRegression(max_iter=300)),
      "tree": DecisionTreeClassifier(max_depth=8, random_state=seed),
      "forest": RandomForestClassifier(n_estimators=50, max_depth=12, random_state=seed, n_jobs=1),
  }


def _split_xy(rows: np.ndarray, label: int) -> tuple[np.ndarray, np.ndarray]:
  x = np.delete(rows, label, axis=1)
  return np.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0), rows[:, label]


def _to_classes(y: np.ndarray, classes: np.ndarray) -> np.ndarray:
  """Snaps (possibly non-integer) synthetic labels to the nearest real class value."""
  return classes[np.argmin(np.abs(y[:, None] - classes[None]), axis=1)]


def utility(synthetic: np.ndarray, real_test: np.ndarray, label: int, num_classes: int, seed: int = 0) -> dict:
  """Machine-learning efficacy: classifiers trained on synthetic rows, F1 on real test rows.

  Args:
    synthetic: [M, D] synthetic rows (label column included).
    real_test: [N, D] real test rows.
    label: index of the label column.
    num_classes: number of classes (2: binary F1 of class 1; more: macro F1).
    seed: classifier seed.

  Returns:
    {'f1': mean F1, 'f1_<clf>': per classifier}.
  """
  from sklearn.metrics import f1_score
  x_tr, y_tr = _split_xy(np.asarray(synthetic, np.float64), label)
  x_te, y_te = _split_xy(np.asarray(real_test, np.float64), label)
  classes = np.unique(y_te)
  y_tr = _to_classes(y_tr, classes)
  avg = "binary" if num_classes == 2 else "macro"
  pos = classes.max() if num_classes == 2 else 1
  out = {}
  for name, clf in _classifiers(seed).items():
    if len(np.unique(y_tr)) < 2:
      pred = np.full_like(y_te, y_tr[0])
    else:
      with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf.fit(x_tr, y_tr)
      pred = clf.predict(x_te)
    kw = {"pos_label": pos} if avg == "binary" else {}
    out[f"f1_{name}"] = float(f1_score(y_te, pred, average=avg, zero_division=0, **kw))
  out["f1"] = float(np.mean([v for k, v in out.items() if k.startswith("f1_")]))
  return out


def detection(real: np.ndarray, synthetic: np.ndarray, seed: int = 0, max_rows: int = 3000,
              groups: dict[str, np.ndarray] | None = None) -> dict:
  """How well classifiers separate real from synthetic rows (lower is better).

  Args:
    real: [N, D] real rows.
    synthetic: [M, D] synthetic rows.
    seed: split/classifier seed.
    max_rows: rows used from each side.
    groups: optional {name: [M] bool mask over the synthetic rows} (e.g. rows the Constraint Layer changed vs
      left alone): for each group, the fraction of its held-out synthetic rows the classifiers call synthetic.

  Returns:
    {'f1': mean detection F1 (synthetic = positive), 'accuracy': mean accuracy, per-classifier values}, and per
    group 'detected_<name>' (mean over classifiers; NaN when the group has no held-out row) and 'count_<name>'.
  """
  from sklearn.metrics import accuracy_score, f1_score
  from sklearn.model_selection import train_test_split
  rng = np.random.default_rng(seed)
  n = min(len(real), len(synthetic), max_rows)
  groups = {} if groups is None else groups
  for g, mask in groups.items():
    if np.shape(mask) != (len(synthetic),):
      raise ValueError(f"group '{g}' mask has shape {np.shape(mask)}; expected ({len(synthetic)},) (one per "
                       "synthetic row).")
  r = np.asarray(real, np.float64)[rng.choice(len(real), n, replace=False)]
  s_idx = rng.choice(len(synthetic), n, replace=False)
  s = np.asarray(synthetic, np.float64)[s_idx]
  x = np.nan_to_num(np.concatenate([r, s]), nan=0.0, posinf=0.0, neginf=0.0)
  y = np.concatenate([np.zeros(n), np.ones(n)])
  # Row ids travel with the split so held-out synthetic rows can be traced back to their group (-1: real rows).
  ids = np.concatenate([np.full(n, -1), s_idx])
  x_tr, x_te, y_tr, y_te, _, id_te = train_test_split(x, y, ids, test_size=0.3, random_state=seed, stratify=y)
  out, detected = {}, {g: [] for g in groups}
  held = {g: (id_te >= 0) & np.asarray(m, bool)[np.maximum(id_te, 0)] for g, m in groups.items()}
  for name, clf in _classifiers(seed).items():
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      clf.fit(x_tr, y_tr)
    pred = clf.predict(x_te)
    out[f"f1_{name}"] = float(f1_score(y_te, pred, zero_division=0))
    out[f"accuracy_{name}"] = float(accuracy_score(y_te, pred))
    for g, sel in held.items():
      detected[g].append(float(np.mean(pred[sel] == 1)) if sel.any() else float("nan"))
  out["f1"] = float(np.mean([v for k, v in out.items() if k.startswith("f1_")]))
  out["accuracy"] = float(np.mean([v for k, v in out.items() if k.startswith("accuracy_")]))
  for g, sel in held.items():
    out[f"detected_{g}"] = float(np.mean(detected[g]))
    out[f"count_{g}"] = int(sel.sum())
  return out
