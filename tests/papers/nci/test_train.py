"""NCI training (`papers/nci/train.py`): the shared step, the adversarial ramp, clear shape errors, fine-tuning from
pretrained params."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from iclr24_jax.papers import nci
from iclr24_jax.papers.nci import model as model_lib, train as train_lib
from .helpers import K, S


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
