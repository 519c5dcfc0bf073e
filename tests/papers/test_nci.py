"""nci: losses against hand-computed values, the non-commutative gradient, the shared step, a smoke run."""
import json
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from iclr24_jax.configs import nci as nci_config
from iclr24_jax.papers import nci
from iclr24_jax.papers.nci import model as model_lib, train as train_lib

K, B, S = 2, 4, 8


@pytest.fixture(scope="module")
def setup():
  import ml_collections
  cfg = ml_collections.ConfigDict(dict(name="mnist_cnn", widths=(8, 8), discriminator="linear"))
  nets = model_lib.make_networks(cfg, 10, K)
  tx = optax.adam(1e-2)
  state = nci.init(jax.random.key(0), nets, (S, S, 1), tx, tx)
  rng = np.random.default_rng(0)
  src = {"x": jnp.asarray(rng.random((K, B, S, S, 1), np.float32)),
         "y": jnp.asarray(rng.integers(0, 10, (K, B)), jnp.int32)}
  tgt = jnp.asarray(rng.random((B, S, S, 1), np.float32))
  return nets, state, src, tgt


def _biased_disc(state, bias):
  disc = jax.tree.map(jnp.zeros_like, state.params["disc"])
  disc["Dense_0"]["bias"] = jnp.asarray(bias, jnp.float32)
  return disc


def test_discriminator_loss_labels_and_value(setup):
  nets, state, src, tgt = setup
  # Zero weights and bias b = [0, 1, 2]: CE(label c) = lse(b) - b_c, lse = log(1 + e + e^2) = 2.40760596.
  # Sources are domains 1 and 2, the target is 0:
  # loss = (2.40760596 - 1) + (2.40760596 - 2) + (2.40760596 - 0) = 4.22281788.
  disc = _biased_disc(state, [0.0, 1.0, 2.0])
  fs = jnp.ones((K, B, 8))
  ft = jnp.ones((B, 8))
  loss, m = nci.discriminator_loss(disc, nets, fs, ft)
  np.testing.assert_allclose(float(loss), 4.22281788, atol=1e-4)
  # argmax is always domain 2, so only source domain 2's B examples are right: 4 / 12.
  np.testing.assert_allclose(float(m["d_acc"]), 4 / 12, rtol=1e-6)


def test_model_loss_adds_lambda_times_target_ce(setup):
  nets, state, src, tgt = setup
  disc = _biased_disc(state, [0.0, 1.0, 2.0])
  erm, _ = nci.erm_model_loss(state.params["model"], disc, nets, src["x"], src["y"], tgt, 0.5)
  nci_loss, m = nci.loss_fn(state.params["model"], disc, nets, src["x"], src["y"], tgt, 0.5)
  # adversarial CE towards label 0 with logits b: lse(b) - 0 = 2.40760596; lambda = 0.5.
  np.testing.assert_allclose(float(m["adv"]), 2.40760596, atol=1e-4)
  np.testing.assert_allclose(float(nci_loss - erm), 0.5 * 2.40760596, atol=1e-4)


def _random_disc(state):
  """A discriminator with random N(0, 1) weights (the initial one is zero: uniform outputs, no gradient)."""
  leaves, tree = jax.tree.flatten(state.params["disc"])
  keys = jax.random.split(jax.random.key(7), len(leaves))
  return jax.tree.unflatten(tree, [jax.random.normal(k, l.shape, l.dtype) for k, l in zip(keys, leaves)])


def _ref_ce(logits, label):
  """Cross-entropy written out: logsumexp(logits) - logits[label], averaged over the leading axes."""
  return jnp.mean(jax.nn.logsumexp(logits, -1) - logits[..., label])


def _ref_losses(nets, params, disc, src, tgt, lam):
  """Independent references: NCI pushes only source features to the target label 0; DANN reverses the
  discriminator's loss on sources (labels 1..K) and target (label 0), averaged over the K + 1 domains."""
  fs, logits = nets.features_and_logits(params, src["x"])
  nll = jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, src["y"][..., None], -1)[..., 0])
  nci_ref = nll + lam * _ref_ce(nets.domain_logits(disc, fs), 0)
  ft, _ = nets.features_and_logits(params, tgt)
  d = sum(_ref_ce(nets.domain_logits(disc, fs[k]), k + 1) for k in range(K)) + _ref_ce(nets.domain_logits(disc, ft), 0)
  dann_ref = nll - lam * d / (K + 1)
  return nci_ref, dann_ref, d / (K + 1)


def test_model_gradients_match_independent_references(setup):
  nets, state, src, tgt = setup
  params, disc = state.params["model"], _random_disc(state)
  for fn, which in ((nci.loss_fn, 0), (nci.dann_model_loss, 1)):
    got = jax.grad(lambda p: fn(p, disc, nets, src["x"], src["y"], tgt, 0.7)[0])(params)
    want = jax.grad(lambda p: _ref_losses(nets, p, disc, src, tgt, 0.7)[which])(params)
    chex.assert_trees_all_close(got, want, rtol=1e-4, atol=1e-6)
  # DANN moves the target's features too (commutative), NCI leaves them alone (its loss never sees them)
  g_dann = jax.grad(lambda t: nci.dann_model_loss(params, disc, nets, src["x"], src["y"], t, 1.0)[0])(tgt)
  assert float(jnp.max(jnp.abs(g_dann))) > 0.0


def test_adversarial_updates_move_features_the_right_way(setup):
  # One small SGD step on the model loss with a large lambda (the adversarial term dominates), discriminator
  # fixed: NCI must bring the source features closer to the target label (its adversarial CE falls), DANN
  # must confuse the discriminator (its averaged domain CE rises). A flipped sign in either fails here.
  nets, state, src, tgt = setup
  params, disc, lam, lr = state.params["model"], _random_disc(state), 1e3, 1e-5

  def sgd(fn):
    g = jax.grad(lambda p: fn(p, disc, nets, src["x"], src["y"], tgt, lam)[0])(params)
    return jax.tree.map(lambda p, d: p - lr * d, params, g)

  def adv_terms(p):
    nci_ref, _, d = _ref_losses(nets, p, disc, src, tgt, 1.0)
    fs, _ = nets.features_and_logits(p, src["x"])
    return float(_ref_ce(nets.domain_logits(disc, fs), 0)), float(d)

  nci_before, d_before = adv_terms(params)
  assert adv_terms(sgd(nci.loss_fn))[0] < nci_before
  assert adv_terms(sgd(nci.dann_model_loss))[1] > d_before


def test_ramp_schedule_applies_to_nci_when_asked(setup):
  import ml_collections
  nets, state, src, tgt = setup
  # At step 0 the ramp is 0: NCI on the ramp makes exactly ERM's model update; at a constant lambda it does not.
  erm = jax.jit(train_lib.make_train_step(nets, "erm", 0.5))(state, src, tgt, jax.random.key(0))[0]
  ramped = jax.jit(train_lib.make_train_step(nets, "nci", 0.5, ramp_steps=100))(state, src, tgt, jax.random.key(0))[0]
  const = jax.jit(train_lib.make_train_step(nets, "nci", 0.5))(state, src, tgt, jax.random.key(0))[0]
  chex.assert_trees_all_close(ramped.params["model"], erm.params["model"], rtol=1e-6, atol=1e-7)
  assert max(jax.tree.leaves(jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), const.params["model"],
                                          erm.params["model"]))) > 0.0
  cfg = ml_collections.ConfigDict(dict(num_steps=300, adv_schedule="official"))
  assert train_lib.ramp_steps(cfg, "nci") is None and train_lib.ramp_steps(cfg, "dann") == 300
  cfg.adv_schedule = "ramp"
  assert train_lib.ramp_steps(cfg, "nci") == train_lib.ramp_steps(cfg, "dann") == 300
  cfg.adv_schedule = "constant"
  assert train_lib.ramp_steps(cfg, "nci") is None and train_lib.ramp_steps(cfg, "dann") is None
  cfg.adv_schedule = "cosine"
  with pytest.raises(ValueError, match="adv_schedule"):
    train_lib.ramp_steps(cfg, "nci")


def test_methods_share_everything_but_the_model_loss(setup):
  nets, state, src, tgt = setup
  out = {m: jax.jit(train_lib.make_train_step(nets, m, 0.5))(state, src, tgt, jax.random.key(0))[0]
         for m in ("erm", "nci", "dann")}
  # the discriminator update comes first and sees the same frozen features in every method
  chex.assert_trees_all_close(out["erm"].params["disc"], out["nci"].params["disc"], out["dann"].params["disc"])
  diff = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), out["erm"].params["model"],
                      out["nci"].params["model"])
  assert max(jax.tree.leaves(diff)) > 0.0


def test_list_of_domain_batches_equals_stacked(setup):
  nets, state, src, tgt = setup
  as_list = [(src["x"][k], src["y"][k]) for k in range(K)]
  a, _ = nci.train_step(state, src, tgt, jax.random.key(0), nets=nets)
  b, _ = nci.train_step(state, as_list, tgt, jax.random.key(0), nets=nets)
  chex.assert_trees_all_close(a.params, b.params)


def test_train_step_lowers_loss_and_compiles_once(setup):
  nets, state, src, tgt = setup
  step = jax.jit(chex.assert_max_traces(train_lib.make_train_step(nets, "nci", 0.5), n=1))
  first = None
  for _ in range(15):
    state, m = step(state, src, tgt, jax.random.key(0))
    first = float(m["nll"]) if first is None else first
  assert float(m["nll"]) < first
  assert int(state.step) == 15


def test_dann_ramp():
  # 2 / (1 + exp(-10 p)) - 1: 0 at p = 0, tanh(2.5) = 0.98661 at p = 0.5.
  np.testing.assert_allclose(float(train_lib.dann_lambda(jnp.asarray(0), 100)), 0.0, atol=1e-7)
  np.testing.assert_allclose(float(train_lib.dann_lambda(jnp.asarray(50), 100)), np.tanh(2.5), rtol=1e-6)


def test_bad_shapes_are_named(setup):
  nets, state, src, tgt = setup
  with pytest.raises(ValueError, match=r"source_x must be \[K, B, H, W, C\]"):
    nci.train_step(state, {"x": src["x"][0], "y": src["y"][0]}, tgt, jax.random.key(0), nets=nets)
  with pytest.raises(ValueError, match="target_x must be"):
    nci.train_step(state, src, tgt[:, :4], jax.random.key(0), nets=nets)
  with pytest.raises(ValueError, match="unknown method"):
    train_lib.make_train_step(nets, "coral")


def test_domains_are_disjoint_and_styled():
  doms = nci.make_domains(("mnist", "mnist_rot60", "mnist_inv", "digits"), image_size=28)  # 28: no resize
  assert [d.x.shape[1:] for d in doms] == [(28, 28, 1)] * 4
  assert doms[2].x.mean() > 0.6 > doms[0].x.mean()  # inverted: white background
  # Disjoint: the MNIST styles are drawn from disjoint parts of MNIST-5k, so no 'mnist' image comes back when
  # the inversion of 'mnist_inv' is undone (exact pixel match; the same check on 'mnist' itself finds all).
  def keys(x):  # pixel levels k/255 as bytes
    return {np.rint(v * 255).astype(np.uint8).tobytes() for v in x.reshape(len(x), -1)}
  plain, undone = keys(doms[0].x), keys(1.0 - doms[2].x)
  assert len(plain & undone) == 0
  assert len(plain & keys(1.0 - (1.0 - doms[0].x))) == len(plain)  # the check can find a match
  assert len(doms[0].x) + len(doms[1].x) + len(doms[2].x) <= 5000  # parts of the one 5k pool
  with pytest.raises(ValueError, match="unknown domains"):
    nci.make_domains(("svhn",))


def test_tiny_run(tmp_path):
  from iclr24_jax.configs import nci as cfg
  from iclr24_jax.papers.nci import experiment
  res = experiment.run(cfg.get_config("tiny"), str(tmp_path))
  assert 0.0 <= res["target_acc"] <= 1.0
  assert os.path.exists(tmp_path / "curves.png")
  assert json.load(open(tmp_path / "results.json"))["method"] == "nci"
  with pytest.raises(ValueError, match="unknown variant"):
    cfg.get_config("huge")


def test_config_domains_match_the_data_module():
  # configs import no paper module, so the config spells the domains out; they must stay the data's.
  from iclr24_jax.configs import nci as cfg
  from iclr24_jax.papers.nci import data as nci_data
  assert tuple(cfg.DOMAINS) == tuple(nci_data.DOMAINS)


def _image_keys(x):  # pixel levels k/255 as bytes, one per image
  return [np.rint(v * 255).astype(np.uint8).tobytes() for v in x.reshape(len(x), -1)]


def test_pretraining_pool_is_disjoint_and_covers_every_style():
  from iclr24_jax.configs import nci as cfg
  from iclr24_jax.papers.nci import data as nci_data
  doms = nci.make_domains(nci.DOMAINS, image_size=16, max_per_domain=400)
  pool, rest = nci_data.split_pool(doms, 0.25, seed=0)
  assert [d.name for d in pool] == [n + "_pool" for n in nci.DOMAINS]  # every style, the targets' included
  assert [d.name for d in rest] == list(nci.DOMAINS)
  for dom, p, r in zip(doms, pool, rest):
    assert len(p.y) == 100 and len(r.y) == 300  # round(0.25 * 400)
    assert set(p.y.tolist()) == set(range(10))  # all ten labels in each style's share of the pool
    keys, pk, rk = _image_keys(dom.x), _image_keys(p.x), _image_keys(r.x)
    assert sorted(pk + rk) == sorted(keys)  # a partition of the domain ...
    assert len(set(keys)) == len(keys)  # ... of distinct images (else the next check could not see a leak)
    assert not set(pk) & set(rk)  # ... and disjoint
  # The study's data (sources, the target's adaptation and evaluation splits) never contains a pool image.
  config = cfg.get_config("pretrained")
  config.data.max_per_domain = 400
  pool_keys = {k for p in pool for k in _image_keys(p.x)}
  assert train_lib.pretraining_pool(config)[0].x.shape == pool[0].x.shape
  sources, uda, evl, *_ = train_lib.setup(config, "mnist_rot60", "nci")
  seen = [k for d in sources + [uda, evl] for k in _image_keys(d.x)]
  assert len(seen) == 5 * 300 and not pool_keys & set(seen)
  # Without a pool the study's domains are make_domains' (the from-scratch rows do not change).
  config.data.pool_fraction = 0.0
  np.testing.assert_array_equal(train_lib.study_domains(config)[4].x, doms[4].x)
  with pytest.raises(ValueError, match="pool fraction"):
    nci_data.split_pool(doms, 1.0)


def test_fine_tuning_starts_from_the_pretrained_params():
  import ml_collections
  cfg = ml_collections.ConfigDict(dict(name="mnist_cnn", widths=(8, 8), discriminator="linear"))
  nets = model_lib.make_networks(cfg, 10, K)
  lr = 1e-3
  tx = optax.adam(lr)
  pre = nci.init(jax.random.key(42), nets, (S, S, 1), tx, tx).params["model"]  # the "pretrained" params
  rng = np.random.default_rng(0)
  sx = jnp.asarray(rng.random((K, 16, S, S, 1), np.float32))
  sy = jnp.asarray(rng.integers(0, 10, (K, 16)), jnp.int32)
  sn, tx_ = jnp.asarray([16, 16], jnp.int32), jnp.asarray(rng.random((16, S, S, 1), np.float32))
  keys = jax.random.split(jax.random.key(0), 2)
  args = (keys, sx, sy, sn, tx_)
  same = lambda a, b: jax.tree.map(np.testing.assert_array_equal, a, b)
  # Zero steps: every seed returns the pretrained params exactly.
  params, _ = train_lib.make_train_fn(nets, "nci", 0.5, tx, tx, 0, 4, (S, S, 1), init_params=pre)(*args)
  same(jax.tree.map(lambda a: a[1], params["model"]), pre)
  # fresh_head: the featurizer is the pretrained one, the head each seed's own random init.
  params, _ = train_lib.make_train_fn(nets, "nci", 0.5, tx, tx, 0, 4, (S, S, 1), init_params=pre,
                                      fresh_head=True)(*args)
  head = train_lib.head_name(pre)
  assert head == "Dense_0"
  same({k: v for k, v in jax.tree.map(lambda a: a[0], params["model"]).items() if k != head},
       {k: v for k, v in pre.items() if k != head})
  assert not np.allclose(params["model"][head]["kernel"][0], pre[head]["kernel"])
  assert not np.allclose(params["model"][head]["kernel"][0], params["model"][head]["kernel"][1])
  # Two Adam steps move each weight by at most 2 lr (Adam's step is <= lr per coordinate): fine-tuning.
  params, _ = train_lib.make_train_fn(nets, "nci", 0.5, tx, tx, 2, 4, (S, S, 1), init_params=pre)(*args)
  moved = jax.tree.map(lambda a, b: float(np.max(np.abs(a[0] - b))), params["model"], pre)
  assert 0.0 < max(jax.tree.leaves(moved)) <= 2 * lr * (1 + 1e-3)


def test_pretrained_config_fine_tunes_at_a_tenth_of_the_lr():
  from iclr24_jax.configs import nci as cfg
  pre, scratch = cfg.get_config("pretrained"), cfg.get_config("reproduce")
  assert pre.optimizer.learning_rate == pytest.approx(0.1 * scratch.optimizer.learning_rate)
  assert pre.data.pool_fraction == 0.25 and scratch.data.pool_fraction == 0.0 and pre.adv_schedule == "ramp"
  assert cfg.get_config("pretrained,tiny").pretrain.steps == 10


@pytest.mark.slow
def test_reproduce_pretrained_fast(tmp_path):
  from iclr24_jax.papers.nci import study
  rows = study.reproduce_pretrained(str(tmp_path), fast=True, get_config=nci_config.get_config)
  assert len(rows) == 1 + 4 + 1 + 1
  assert all(r["holds"] is None for r in rows)
  assert rows[0]["ours"].startswith("checkpoint ")
  assert os.path.exists(tmp_path / "lodo.png")  # results/plots/nci_pretrained_lodo.png in a full run
