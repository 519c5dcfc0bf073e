"""coboosting: partitions, the weighted ensemble, losses vs hand values, the weight update, one-shot clients,
a distillation step that lowers the KL, 1 vs 8 devices, a smoke run through the launcher API and resume."""
import dataclasses
import json
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.configs import coboosting as cfg_mod
from iclr24_jax.common import data as data_lib
from iclr24_jax.common import sharding
from iclr24_jax.papers import coboosting
from iclr24_jax.papers.coboosting import coboost, experiment, losses, model as model_lib, partition
from iclr24_jax.vision.models import MLP

K = 4
S = 8


# ------------------------------------------------------------------------------------------ partition


def test_partition_covers_every_index_once_with_balanced_sizes():
  y = np.random.default_rng(0).integers(0, 10, 1003)
  parts = coboosting.dirichlet_partition(y, 10, 0.1, jax.random.key(0))
  assert len(parts) == 10
  allidx = np.concatenate(parts)
  np.testing.assert_array_equal(np.sort(allidx), np.arange(1003))
  sizes = [len(p) for p in parts]
  assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 1003


def test_partition_label_skew_grows_as_alpha_shrinks():
  y = data_lib.load_digits().train.y
  ent = {a: partition.mean_label_entropy(y, coboosting.dirichlet_partition(y, 10, a, jax.random.key(1)), 10)
         for a in (0.1, 1.0, 100.0)}
  assert ent[0.1] < ent[1.0] < ent[100.0]
  assert ent[100.0] > 0.95 * np.log(10)  # near-IID clients see (almost) every class evenly


def test_partition_is_deterministic_in_the_key():
  y = np.arange(200) % 5
  a = coboosting.dirichlet_partition(y, 4, 0.3, jax.random.key(3))
  b = coboosting.dirichlet_partition(y, 4, 0.3, jax.random.key(3))
  for pa, pb in zip(a, b):
    np.testing.assert_array_equal(pa, pb)


def test_partition_errors():
  y = np.arange(20) % 2
  with pytest.raises(ValueError, match="alpha"):
    coboosting.dirichlet_partition(y, 2, 0.0, jax.random.key(0))
  with pytest.raises(ValueError, match="num_clients"):
    coboosting.dirichlet_partition(y, 21, 0.5, jax.random.key(0))
  with pytest.raises(ValueError, match="1-D integer"):
    coboosting.dirichlet_partition(y.astype(np.float32), 2, 0.5, jax.random.key(0))


# ---------------------------------------------------------------------------------------------- losses


def test_ensemble_logits_equal_weights_is_the_mean_and_weights_are_normalised():
  cl = jnp.asarray(np.random.default_rng(0).normal(size=(5, 3, K)), jnp.float32)
  out = coboosting.ensemble_logits(cl, jnp.full((5,), 0.2))
  chex.assert_shape(out, (3, K))
  np.testing.assert_allclose(out, cl.mean(0), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(coboosting.ensemble_logits(cl, jnp.full((5,), 0.7)), cl.mean(0), rtol=1e-5, atol=1e-6)
  # (1 * [1, 2] + 3 * [5, 6]) / (1 + 3) = [4, 5]
  two = jnp.asarray([[[1.0, 2.0]], [[5.0, 6.0]]])
  np.testing.assert_allclose(coboosting.ensemble_logits(two, jnp.asarray([1.0, 3.0])), [[4.0, 5.0]], rtol=1e-6)


def test_ensemble_logits_shape_errors():
  with pytest.raises(ValueError, match=r"\[C, B, K\]"):
    coboosting.ensemble_logits(jnp.zeros((3, K)), jnp.ones(3))
  with pytest.raises(ValueError, match="weights"):
    coboosting.ensemble_logits(jnp.zeros((3, 2, K)), jnp.ones(2))


def test_hard_sample_loss_hand_values():
  logits = jnp.asarray([[2.0, 0.0], [0.0, 0.0]])
  labels = jnp.asarray([0, 0])
  # Row 1: p = e^2 / (e^2 + 1) = 0.88079708, CE = 0.12692801, weight 1 - p = 0.11920292 -> 0.01513019.
  # Row 2: p = 0.5, CE = ln 2 = 0.69314718, weight 0.5 -> 0.34657359.  Mean (h = 1): 0.18085189.
  np.testing.assert_allclose(coboosting.hard_sample_loss(logits, labels, 1.0), 0.18085189, atol=1e-4)
  # h = 2: (0.11920292^2 * 0.12692801 + 0.25 * 0.69314718) / 2 = 0.08754518.
  np.testing.assert_allclose(coboosting.hard_sample_loss(logits, labels, 2.0), 0.08754518, atol=1e-4)
  # h = 0 is the plain CE (DENSE): (0.12692801 + 0.69314718) / 2 = 0.41003760.
  np.testing.assert_allclose(coboosting.hard_sample_loss(logits, labels, 0.0), 0.41003760, atol=1e-4)


def test_hard_sample_weight_is_not_differentiated():
  logits = jnp.asarray([[2.0, 0.0, -1.0], [0.5, 0.2, 0.1]])
  labels = jnp.asarray([0, 2])
  g = jax.grad(coboosting.hard_sample_loss)(logits, labels, 1.0)
  p = jax.nn.softmax(logits)
  w = 1.0 - p[jnp.arange(2), labels]
  expected = w[:, None] * (p - jax.nn.one_hot(labels, 3)) / 2  # d mean(w * CE) with w held constant
  np.testing.assert_allclose(g, expected, rtol=1e-5, atol=1e-6)


def test_adversarial_and_kd_losses_hand_values():
  t = jnp.asarray([[np.log(3.0), 0.0]])  # softmax = [0.75, 0.25]
  s = jnp.zeros((1, 2))                  # softmax = [0.5, 0.5]
  # KL(t || s) = 0.75 ln 1.5 + 0.25 ln 0.5 = 0.13081204
  np.testing.assert_allclose(coboosting.adversarial_loss(s, t, 1.0), -0.13081204, atol=1e-4)
  # Doubling the logits at T = 2 gives the same distributions; the T^2 factor makes it 4 x 0.13081204.
  np.testing.assert_allclose(coboosting.kd_loss(s, 2.0 * t, 2.0), 0.52324814, atol=1e-4)
  # DENSE mask: both predict class 0 here, so the masked term is zero.
  s_agree = jnp.asarray([[1.0, 0.0]])
  mask = losses.disagreement_mask(s_agree, t)
  np.testing.assert_allclose(coboosting.adversarial_loss(s_agree, t, 1.0, mask), 0.0, atol=1e-6)


# -------------------------------------------------------------------------------------- weight update


def test_update_weights_direction_hand_example():
  # Two clients, one sample of class 0. f1 = [2, 0] (right), f2 = [0, 2] (wrong), w = [0.5, 0.5]:
  # f_ens = (w1 f1 + w2 f2) / (w1 + w2) = [1, 1], p = [0.5, 0.5], dCE/df_ens = p - onehot = [-0.5, 0.5].
  # d f_ens / d w1 = (f1 - f_ens) / (w1 + w2) = [1, -1]  -> dCE/dw1 = -0.5 - 0.5 = -1 (raise w1);
  # d f_ens / d w2 = (f2 - f_ens) / (w1 + w2) = [-1, 1]  -> dCE/dw2 = +1 (lower w2).
  # Step 0.1: w = [0.6, 0.4]; the CE before the step is ln 2.
  cl = jnp.asarray([[[2.0, 0.0]], [[0.0, 2.0]]])
  w, loss = coboosting.update_weights(jnp.asarray([0.5, 0.5]), cl, jnp.asarray([0]), 0.1)
  np.testing.assert_allclose(w, [0.6, 0.4], rtol=1e-6)
  np.testing.assert_allclose(loss, np.log(2.0), atol=1e-4)
  # The better ensemble has a lower CE.
  _, loss_after = coboosting.update_weights(w, cl, jnp.asarray([0]), 0.1)
  assert float(loss_after) < float(loss)


def test_update_weights_clips_to_unit_interval():
  cl = jnp.asarray([[[2.0, 0.0]], [[0.0, 2.0]]])
  # Signed steps +0.1 for w1, -0.1 for w2 (as above) push 0.95 -> 1.05 and 0.02 -> -0.08: clipped to [1, 0].
  w, _ = coboosting.update_weights(jnp.asarray([0.95, 0.02]), cl, jnp.asarray([0]), 0.1)
  np.testing.assert_allclose(w, [1.0, 0.0], rtol=1e-6)


# ---------------------------------------------------------------------------------------- small nets


@pytest.fixture(scope="module")
def mlp_method():
  """3 MLP clients (stacked), an MLP server and a tiny generator on 8x8 images."""
  c = 3
  m = MLP(K, hidden=(16,))
  params = model_lib.stack_params([m.init(jax.random.key(i), jnp.zeros((1, S, S, 1)))["params"] for i in range(c)])
  clients = model_lib.ClientSet((m,), c, stacked=True, vmap=True)
  method = coboosting.Method(clients=clients, server=MLP(K, hidden=(16,)),
                             generator=model_lib.Generator(S, 1, ngf=4), num_classes=K, nz=8)
  return method, params


def test_generator_shapes_and_range(mlp_method):
  method, _ = mlp_method

  @jax.jit
  def init_and_generate(k, z):
    v = model_lib.init_generator(method.generator, k, 8)
    return v, model_lib.generate(method.generator, v, z)

  v, x = init_and_generate(jax.random.key(0), jax.random.normal(jax.random.key(1), (6, 8)))
  chex.assert_shape(x, (6, S, S, 1))
  assert x.dtype == jnp.float32 and float(x.min()) > 0.0 and float(x.max()) < 1.0
  # Official reset_model: conv/linear weights N(0, 0.02), biases 0.
  w = np.asarray(v["params"]["Dense_0"]["kernel"])
  assert abs(w.std() - 0.02) < 0.005 and np.all(np.asarray(v["params"]["Dense_0"]["bias"]) == 0)
  with pytest.raises(ValueError, match="multiple of 4"):
    jax.eval_shape(lambda: model_lib.Generator(6, 1, 4).init(jax.random.key(0), jnp.zeros((2, 8))))


def test_vmap_and_unrolled_clients_agree(mlp_method):
  method, params = mlp_method
  x = jax.random.uniform(jax.random.key(0), (5, S, S, 1))
  a = method.clients.logits(params, x)
  b = dataclasses.replace(method.clients, vmap=False).logits(params, x)
  chex.assert_shape(a, (3, 5, K))
  np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_heterogeneous_clients_are_a_list_of_models():
  models = (MLP(K, hidden=(8,)), MLP(K, hidden=(16, 8)))
  params = tuple(m.init(jax.random.key(i), jnp.zeros((1, S, S, 1)))["params"] for i, m in enumerate(models))
  clients = model_lib.ClientSet(models, 2, stacked=False)
  x = jax.random.uniform(jax.random.key(0), (5, S, S, 1))
  out = jax.jit(clients.logits)(params, x)
  chex.assert_shape(out, (2, 5, K))
  np.testing.assert_allclose(out[1], models[1].apply({"params": params[1]}, x), rtol=1e-5, atol=1e-6)
  method = coboosting.Method(clients=clients, server=models[0], generator=model_lib.Generator(S, 1, 4),
                             num_classes=K, nz=8)
  teacher, m = coboosting.weight_step(method, {"clients": params, "weights": jnp.asarray([0.5, 0.5])},
                                      {"x": x, "y": jnp.arange(5) % K}, 0.1)
  assert teacher["weights"].shape == (2,) and np.isfinite(float(m["ensemble_ce"]))
  with pytest.raises(ValueError, match="exactly one model"):
    model_lib.ClientSet(models, 2, stacked=True)


def test_fedavg_mean_of_stacked_params(mlp_method):
  _, params = mlp_method
  avg = coboosting.fedavg_params(params)
  leaf = jax.tree.leaves(params)[0]
  np.testing.assert_allclose(jax.tree.leaves(avg)[0], leaf.mean(0), rtol=1e-6)
  weighted = coboosting.fedavg_params(params, sizes=[1, 0, 0])
  np.testing.assert_allclose(jax.tree.leaves(weighted)[0], leaf[0], rtol=1e-6)


def test_ods_perturbation_is_a_signed_step(mlp_method):
  method, params = mlp_method
  teacher = {"clients": params, "weights": jnp.full((3,), 1 / 3)}
  x = jax.random.uniform(jax.random.key(0), (4, S, S, 1))
  fn = lambda v: coboost.teacher_logits(method, teacher, v)
  xp = coboosting.ods_perturb(fn, x, jax.random.key(1), eps=8 / 255)
  d = np.abs(np.asarray(xp - x))
  assert np.all((np.isclose(d, 8 / 255, rtol=1e-4)) | (d == 0)) and np.mean(d > 0) > 0.5
  np.testing.assert_array_equal(coboosting.ods_perturb(fn, x, jax.random.key(1), eps=0.0), x)


def test_synthesis_keeps_the_best_batch_and_fori_loop_matches(mlp_method):
  method, params = mlp_method
  teacher = {"clients": params, "weights": jnp.asarray([0.2, 0.3, 0.5])}
  server = coboosting.init(method, jax.random.key(5), (S, S, 1))
  state = jax.jit(lambda k: coboosting.init_synthesis(method, k, 8, (S, S, 1)))(jax.random.key(2))
  step = jax.jit(lambda s: coboosting.synthesis_step(method, s, teacher, server.params, server.extra))
  seen = []
  for _ in range(3):
    state, m = step(state)
    seen.append(float(m["gen_loss"]))
  chex.assert_shape(state.best_x, (8, S, S, 1))
  np.testing.assert_allclose(float(state.best_loss), min(seen), rtol=1e-6)
  assert int(state.step) == 3
  # The whole phase as one fori_loop (for accelerators) gives the same result.
  looped, _ = jax.jit(lambda k: coboosting.hard_sample_synthesis(method, k, teacher, server.params, server.extra,
                                                                   8, (S, S, 1), 3))(jax.random.key(2))
  np.testing.assert_allclose(looped.best_x, state.best_x, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(looped.z, state.z, rtol=1e-5, atol=1e-6)


def test_distill_step_lowers_kl_and_compiles_once(mlp_method):
  method, params = mlp_method
  teacher = {"clients": params, "weights": jnp.asarray([0.2, 0.3, 0.5])}
  state = coboosting.init(method, jax.random.key(5), (S, S, 1))
  x = jax.random.uniform(jax.random.key(0), (16, S, S, 1))
  t = coboost.teacher_logits(method, teacher, x)

  def kl(st):
    return float(coboosting.kd_loss(method.server.apply({"params": st.params}, x), t, method.kd_temperature))

  before = kl(state)

  @jax.jit
  @chex.assert_max_traces(n=1)
  def step(st, key):
    return coboosting.distill_step(method, st, teacher, {"x": x}, key, 0.05, coboosting.knobs(method))

  for _ in range(8):
    state, m = step(state, jax.random.key(1))
  assert kl(state) < before
  assert int(state.step) == 8 and np.isfinite(float(m["kd_loss"]))


def test_distill_step_same_on_1_and_8_devices(mlp_method):
  method, params = mlp_method
  teacher = {"clients": params, "weights": jnp.asarray([0.2, 0.3, 0.5])}
  x = np.asarray(jax.random.uniform(jax.random.key(0), (16, S, S, 1)))
  outs = []
  for n in (1, 8):
    mesh = sharding.make_mesh(devices=jax.devices()[:n])
    state = sharding.replicate(coboosting.init(method, jax.random.key(5), (S, S, 1)), mesh)
    fn = jax.jit(lambda st, b: coboosting.distill_step(method, st, teacher, b, jax.random.key(1), 0.05))
    state, _ = fn(state, sharding.shard_batch({"x": x}, mesh))
    outs.append(jax.device_get(state.params))
  for a, b in zip(jax.tree.leaves(outs[0]), jax.tree.leaves(outs[1])):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------- runs and configs


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
