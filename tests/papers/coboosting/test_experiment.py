"""Co-Boosting experiment (`papers/coboosting/experiment.py`): a tiny run and its results, pairing, no client
retraining, crash and resume, config variants."""
import json
import os

import jax
import numpy as np
import pytest

from iclr24_jax.configs import coboosting as cfg_mod
from iclr24_jax.common import data as data_lib
from iclr24_jax.common import sharding
from iclr24_jax.papers import coboosting
from iclr24_jax.papers.coboosting import experiment


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("coboosting_tiny"))
  cfg = cfg_mod.get_config("tiny")
  cfg.progress = False
  return cfg, workdir, coboosting.run(cfg, workdir)


def test_smoke_run_writes_results_metrics_and_plots(tiny_run):
  cfg, workdir, res = tiny_run
  for name in ("coboosting", "dense", "fedavg", "ensemble"):
    acc = res[f"{name}/test_accuracy"]
    assert 0.0 <= acc <= 1.0
  assert len(res["coboosting/weights"]) == cfg.fl.num_clients
  assert res["dense/weights"] == [1.0 / 3] * 3 or np.allclose(res["dense/weights"], 1.0 / 3)
  with open(os.path.join(workdir, "results.json")) as f:
    assert json.load(f)["num_clients"] == 3
  for name in ("coboosting", "dense"):   # one folder per distilled method: its metrics and checkpoints
    rows = [json.loads(l) for l in open(os.path.join(workdir, name, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == [1, 2] and all(np.isfinite(r["kd/kd_loss"]) for r in rows)
  for p in ("curves.png", "synthetic_coboosting.png"):
    assert os.path.exists(os.path.join(workdir, p))


def test_best_epoch_accuracy_is_the_max_of_the_evaluated_curve(tiny_run):
  _, _, res = tiny_run
  for name in ("coboosting", "dense"):
    curve = res["curves"][name]
    assert len(curve) == 2  # tiny: eval_every=1, 2 epochs
    assert res[f"{name}/best_test_accuracy"] == max(a for _, a in curve)
    assert res[f"{name}/best_test_accuracy"] >= res[f"{name}/test_accuracy"]
    assert dict(curve)[res[f"{name}/best_epoch"]] == res[f"{name}/best_test_accuracy"]


def test_coboosting_and_dense_are_paired_by_key(monkeypatch, tmp_path):
  seen = {}
  real_fit = experiment.coboost.fit

  def spy(method, client_params, *, key, **kw):
    seen[method.hardness] = jax.random.key_data(key)
    return real_fit(method, client_params, key=key, **kw)

  monkeypatch.setattr(experiment.coboost, "fit", spy)
  cfg = cfg_mod.get_config("tiny")
  cfg.progress, cfg.plots, cfg.num_epochs, cfg.methods = False, False, 1, ("coboosting", "dense")
  experiment.run(cfg, None)
  assert len(seen) == 2  # Co-Boosting (hardness 1) and DENSE-like (hardness 0) both ran ...
  a, b = seen.values()
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # ... on the same server / generator key


def test_clients_are_never_retrained(tiny_run):
  cfg, _, _ = tiny_run
  ds = data_lib.load_dataset(cfg.data.name)
  _, clients, params, _ = experiment.setup_clients(cfg, ds, jax.random.key(0))
  before = jax.device_get(params)
  method = experiment.make_method(cfg, clients, experiment.create_model(cfg.model, 10), ds.input_shape, 10)
  res = coboosting.fit(method, params, key=jax.random.key(1), input_shape=ds.input_shape, epochs=2,
                       g_steps=2, batch_size=cfg.batch_size, kd_lr=0.01,
                       mesh=sharding.make_mesh(cfg.mesh))
  after = jax.device_get(params)
  for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
    assert a.tobytes() == b.tobytes()
  # ... while the ensemble weights did move (epoch 2 re-weights on the epoch-1 pool) and the pool grew.
  assert not np.allclose(res.weights, 1.0 / 3)
  assert res.pool_x.shape == (2 * cfg.batch_size,) + ds.input_shape


class _Crash(Exception):
  """Stands for a process killed without warning (nothing saved at the kill)."""


def test_crash_after_the_first_epoch_then_resume_equals_the_uninterrupted_run(tmp_path, tiny_run, monkeypatch):
  """Killed after epoch 1's checkpoint (a crash: no save at the kill), then rerun: the clients come from their
  checkpoint (never retrained), Co-Boosting resumes at epoch 2 with the saved server, ensemble weights and pool,
  and reports the uninterrupted run's numbers bit for bit; metrics.jsonl reads as one run. A rerun of the
  finished workdir trains nothing."""
  from iclr24_jax.common import loop
  cfg0, _, straight = tiny_run  # the same seed and settings (tiny: checkpoint_every = 1), run without interruption
  cfg = cfg_mod.get_config("tiny,coboosting")
  cfg.progress, cfg.plots = False, False
  wd = str(tmp_path / "resumed")

  def crash(step, row):
    if step == 2:
      raise _Crash(step)

  with loop.observe(crash), pytest.raises(_Crash):
    coboosting.run(cfg, wd)
  assert sorted(os.listdir(os.path.join(wd, "coboosting", "checkpoints"))) == ["1", "config.json"]
  trained = []
  monkeypatch.setattr(experiment.clients_lib, "train_clients", lambda *a, **k: trained.append(1))
  resumed = coboosting.run(cfg, wd)
  assert not trained   # the clients came from workdir/clients/checkpoints
  for key in ("test_accuracy", "weighted_ensemble_accuracy", "best_test_accuracy", "weights"):
    assert resumed[f"coboosting/{key}"] == straight[f"coboosting/{key}"], key
  assert resumed["curves"]["coboosting"] == straight["curves"]["coboosting"]
  read = lambda w: [{k: v for k, v in r.items() if not k.startswith("time/")}   # noqa: E731
                    for r in map(json.loads, open(os.path.join(w, "coboosting", "metrics.jsonl")))]
  assert read(wd) == read(tiny_run[1])
  assert cfg0.checkpoint_every == 1
  before = os.stat(os.path.join(wd, "coboosting", "metrics.jsonl")).st_mtime_ns
  again = coboosting.run(cfg, wd)   # finished: restored, nothing trained or logged
  assert again["coboosting/test_accuracy"] == straight["coboosting/test_accuracy"]
  assert os.stat(os.path.join(wd, "coboosting", "metrics.jsonl")).st_mtime_ns == before


def test_config_variants_and_errors():
  c = cfg_mod.get_config("digits,alpha=0.3,hetero")
  assert c.data.name == "digits" and c.fl.alpha == 0.3 and len(c.client.models) == 3
  assert "fedavg" not in c.methods
  assert cfg_mod.get_config("dense").methods == ("dense",)
  assert cfg_mod.get_config("").num_epochs == 200 and cfg_mod.get_config("").coboost.g_steps == 30
  with pytest.raises(ValueError, match="unknown variant"):
    cfg_mod.get_config("nope")
  with pytest.raises(ValueError, match="alpha"):
    cfg_mod.get_config("alpha=abc")
