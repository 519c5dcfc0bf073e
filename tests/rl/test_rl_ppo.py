"""PPO (jitted make_train): determinism, vmap over seeds, a loss-lowering step, fine-tuning, the reward hook,
1 vs 8 devices, the experiment smoke run; slow: CartPole solved, brax inverted_pendulum well above random."""
import json
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from configs import ppo as ppo_config
from iclr24_jax.common import sharding
from iclr24_jax.common.train_state import TrainState
from iclr24_jax.rl import envs, experiment, networks, ppo, rollout


def _tiny(**ppo_overrides):
  c = ppo_config.get_config("tiny")
  c.num_steps = 3
  c.ppo.update(ppo_overrides)
  return c


@pytest.fixture(scope="module")
def tiny_run():
  c = _tiny()
  train = jax.jit(ppo.make_train(c))
  return c, train, train(jax.random.key(0))


def test_same_seed_same_curve(tiny_run):
  c, train, out = tiny_run
  again = train(jax.random.key(0))
  other = train(jax.random.key(1))
  for k in ("loss", "last_episode_return", "entropy"):
    chex.assert_shape(out["metrics"][k], (c.num_steps,))
    np.testing.assert_array_equal(out["metrics"][k], again["metrics"][k])
  assert not np.array_equal(out["metrics"]["loss"], other["metrics"]["loss"])
  chex.assert_trees_all_equal(out["runner_state"].train_state.params, again["runner_state"].train_state.params)


def test_vmap_over_seeds(tiny_run):
  c, _, out = tiny_run
  outs = jax.jit(jax.vmap(ppo.make_train(c)))(jnp.stack([jax.random.key(0), jax.random.key(1)]))
  chex.assert_shape(outs["metrics"]["loss"], (2, c.num_steps))
  # seed 0 of the vmapped run is the single run (same arithmetic up to batching of the matmuls)
  np.testing.assert_allclose(outs["metrics"]["last_episode_return"][0], out["metrics"]["last_episode_return"],
                             rtol=1e-5)
  np.testing.assert_allclose(outs["metrics"]["loss"][0], out["metrics"]["loss"], rtol=1e-3, atol=1e-4)


def test_ppo_step_lowers_loss_on_fixed_batch(tiny_run):
  c, _, _ = tiny_run
  agent = ppo.PPO(c)
  runner = agent.init(jax.random.key(3))
  _, _, tr = jax.jit(agent.update_with_trajectory)(runner)
  ts = runner.train_state
  _, values, adv, ret = agent.advantages(ts.params, ts.extra, tr)
  n = agent.num_envs * agent.rollout_steps
  batch = jax.tree.map(lambda x: x.reshape((n,) + x.shape[2:]),
                       {"obs": tr.obs, "action": tr.action, "log_prob": tr.extras["log_prob"], "value": values,
                        "advantage": adv, "return": ret})
  tx = optax.adam(3e-3)  # constant rate (the tiny config's schedule reaches 0 after 12 steps)

  @jax.jit
  @chex.assert_max_traces(n=1)
  def step(state, batch):
    (loss, _), grads = jax.value_and_grad(agent.loss_fn, has_aux=True)(state.params, state.extra, batch,
                                                                         jax.random.key(0))
    return state.apply_gradients(grads), loss

  state = TrainState.create(ts.params, tx, extra=ts.extra)
  losses_ = []
  for _ in range(25):
    state, loss = step(state, batch)
    losses_.append(float(loss))
  assert losses_[-1] < losses_[0], losses_[::6]


def test_finetune_from_params_and_reward_hook(tiny_run):
  c, _, out = tiny_run
  given = out["runner_state"].train_state.params
  calls = []

  def reward_fn(tr):
    calls.append(tr.reward.shape)
    return jnp.full_like(tr.reward, 2.0)

  agent = ppo.PPO(c, init_params=given, reward_fn=reward_fn)
  runner = agent.init(jax.random.key(5))
  chex.assert_trees_all_equal(runner.train_state.params, given)
  _, m = jax.jit(agent.update)(runner)
  assert calls == [(c.ppo.rollout_steps, c.ppo.num_envs)]
  np.testing.assert_allclose(m["reward"], 2.0 * c.ppo.reward_scale)
  # only the value half given: the policy keeps its fresh initialisation
  half = ppo.PPO(c, init_params={"policy": None, "value": given["value"]})
  p = half.init_params_fn(jax.random.key(0))
  chex.assert_trees_all_equal(p["value"], given["value"])
  bad = ppo.PPO(c, init_params={"policy": {"w": jnp.zeros(3)}})
  with pytest.raises(ValueError, match="does not match"):
    bad.init_params_fn(jax.random.key(0))


def test_sharded_rollout_and_update_match_one_device():
  # 8 environments over 8 devices vs 1 device: the same numbers.
  c = _tiny(num_envs=8)
  c.num_steps = 2
  mesh8 = sharding.make_mesh(devices=jax.devices()[:8])
  out1 = jax.jit(ppo.make_train(c))(jax.random.key(0))
  out8 = jax.jit(ppo.make_train(c, mesh=mesh8))(jax.random.key(0))
  np.testing.assert_allclose(out8["metrics"]["last_episode_return"], out1["metrics"]["last_episode_return"],
                             rtol=1e-5)
  np.testing.assert_allclose(out8["metrics"]["loss"], out1["metrics"]["loss"], rtol=1e-4, atol=1e-5)
  env_state = out8["runner_state"].env_state
  assert env_state.obs.sharding.spec[0] == "data" or len(env_state.obs.sharding.device_set) == 8


def test_ppo_config_errors():
  with pytest.raises(ValueError, match="num_minibatches"):
    ppo.PPO(_tiny(num_minibatches=3))
  with pytest.raises(ValueError, match="unknown variant"):
    ppo_config.get_config("pong")
  with pytest.raises(ValueError, match="unknown PPO preset"):
    ppo.preset_config("pong")
  for v in ppo_config.VARIANTS:
    assert ppo_config.get_config(v).paper == "ppo"


def test_experiment_run_tiny(tmp_path):
  c = _tiny()
  c.log_every, c.eval_every, c.eval_episodes = 1, 3, 4
  res = experiment.run(c, str(tmp_path))
  rows = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
  assert [r["step"] for r in rows] == [1, 2, 3] and "eval/return" in rows[-1]
  assert res["env_steps"] == 3 * c.ppo.num_envs * c.ppo.rollout_steps
  assert os.path.exists(tmp_path / "results.json") and os.path.exists(tmp_path / "curves.png")
  assert np.isfinite(res["eval_return"]) and res["random_return"] > 0


@pytest.mark.slow
def test_cartpole_solved():
  row = experiment._cartpole(os.environ.get("TMPDIR", "/tmp"), fast=False)
  assert row["ours"] >= experiment.CARTPOLE_THRESHOLD, row


@pytest.mark.slow
def test_brax_inverted_pendulum_well_above_random():
  c = ppo.preset_config("inverted_pendulum")
  agent = ppo.PPO(c)

  def run(k):
    ts = agent.train(k)["runner_state"].train_state
    return agent.evaluate(ts.params, ts.extra, jax.random.fold_in(k, 1), num_envs=16)["return"]

  ret = float(jax.jit(run)(jax.random.key(0)))
  rnd = float(jax.jit(lambda k: rollout.evaluate(agent.env, rollout.random_policy(agent.env), k, 16))(
      jax.random.key(1))["return"])
  assert ret >= 500.0 and ret >= 10 * rnd, (ret, rnd)
