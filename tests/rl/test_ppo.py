"""PPO (`rl/ppo.py`, jitted make_train): determinism, vmap over seeds, 1 vs 8 devices, fine-tuning and
the reward hook, a loss-lowering step, reward scaling by hand, config errors; slow: brax
inverted_pendulum well above random."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from iclr24_jax.common import sharding
from iclr24_jax.common.train_state import TrainState
from iclr24_jax.configs import ppo as ppo_config
from iclr24_jax.rl import ppo, rollout
from .helpers import _tiny


@pytest.fixture(scope="module")
def tiny_run():
  """The tiny CartPole config trained for seeds 0 and 1 in one vmapped, jitted call."""
  c = _tiny()
  train = jax.jit(jax.vmap(ppo.make_train(c)))
  keys = jnp.stack([jax.random.key(0), jax.random.key(1)])
  return c, train, keys, train(keys)


def _row(tree, i):
  return jax.tree.map(lambda x: x[i], tree)


def test_same_seed_same_curve_and_vmap_over_seeds(tiny_run):
  c, train, keys, out = tiny_run
  again = train(keys)
  for k in ("loss", "last_episode_return", "entropy"):
    chex.assert_shape(out["metrics"][k], (2, c.num_steps))
    np.testing.assert_array_equal(out["metrics"][k], again["metrics"][k])
  assert not np.array_equal(out["metrics"]["loss"][0], out["metrics"]["loss"][1])  # seeds differ
  chex.assert_trees_all_equal(out["runner_state"].train_state.params, again["runner_state"].train_state.params)


def test_sharded_8_devices_matches_unsharded(tiny_run):
  # make_train with the environments sharded over 8 devices vs seed 0 of the (unsharded) vmapped run.
  c, _, _, out = tiny_run
  mesh8 = sharding.make_mesh(devices=jax.devices()[:8])
  out8 = jax.jit(ppo.make_train(c, mesh=mesh8))(jax.random.key(0))
  np.testing.assert_allclose(out8["metrics"]["last_episode_return"], out["metrics"]["last_episode_return"][0],
                             rtol=1e-5)
  np.testing.assert_allclose(out8["metrics"]["loss"], out["metrics"]["loss"][0], rtol=1e-3, atol=1e-4)
  assert len(out8["runner_state"].env_state.obs.sharding.device_set) == 8


@pytest.fixture(scope="module")
def hooked_update(tiny_run):
  """One jitted update of an agent fine-tuned from seed 0's params, with reward_scale 0.5, reward_clip 0.3 and a
  reward hook that adds 2 to the reward it sees."""
  c, _, _, out = tiny_run
  c = c.copy_and_resolve_references()
  c.ppo.update(dict(reward_scale=0.5, reward_clip=0.3))
  given = _row(out["runner_state"].train_state.params, 0)
  calls = []

  def reward_fn(tr):
    calls.append(tr.reward.shape)
    return tr.reward + 2.0

  agent = ppo.PPO(c, init_params=given, reward_fn=reward_fn)
  runner = agent.init(jax.random.key(5))
  _, m, tr = jax.jit(agent.update_with_trajectory)(runner)
  return c, given, agent, runner, m, tr, calls


def test_finetune_from_params_and_reward_hook(hooked_update):
  c, given, agent, runner, m, _, calls = hooked_update
  chex.assert_trees_all_equal(runner.train_state.params, given)
  assert calls == [(c.ppo.rollout_steps, c.ppo.num_envs)]
  # CartPole pays 1 per step: the hook sees clip(0.5 * 1, -0.3, 0.3) = 0.3 and its output 2.3 enters GAE
  # unscaled (scaling the hook's output, the old rule, would give 0.5 * (1 + 2) = 1.5)
  np.testing.assert_allclose(m["reward"], 2.3, rtol=1e-6)
  # only the value half given: the policy keeps its fresh initialisation
  half = ppo.PPO(c, init_params={"policy": None, "value": given["value"]})
  p = half.init_params_fn(jax.random.key(0))
  chex.assert_trees_all_equal(p["value"], given["value"])
  bad = ppo.PPO(c, init_params={"policy": {"w": jnp.zeros(3)}})
  with pytest.raises(ValueError, match="does not match"):
    bad.init_params_fn(jax.random.key(0))


def test_ppo_step_lowers_loss_on_fixed_batch(hooked_update):
  _, _, agent, runner, _, tr, _ = hooked_update
  ts = runner.train_state
  n = agent.num_envs * agent.rollout_steps

  @jax.jit
  @chex.assert_max_traces(n=1)
  def step(state, tr):
    _, values, adv, ret = agent.advantages(ts.params, state.extra, tr)  # targets from the behaviour params
    batch = jax.tree.map(lambda x: x.reshape((n,) + x.shape[2:]),
                         {"obs": tr.obs, "action": tr.action, "log_prob": tr.extras["log_prob"], "value": values,
                          "advantage": adv, "return": ret})
    (loss, _), grads = jax.value_and_grad(agent.loss_fn, has_aux=True)(state.params, state.extra, batch,
                                                                         jax.random.key(0))
    return state.apply_gradients(grads), loss

  # a constant rate (the tiny config's schedule reaches 0 after 12 steps)
  state = TrainState.create(ts.params, optax.adam(3e-3), extra=ts.extra)
  losses_ = []
  for _ in range(25):
    state, loss = step(state, tr)
    losses_.append(float(loss))
  assert losses_[-1] < losses_[0], losses_[::6]


def test_scale_env_reward_and_process_reward_hand_computed():
  r = jnp.array([[150.0, -3.0], [-250.0, 0.5]])
  # 0.1 * r = [15, -0.3, -25, 0.05] -> clipped to +-10: [10, -0.3, -10, 0.05]
  np.testing.assert_allclose(ppo.scale_env_reward(r, 0.1, 10.0), [[10.0, -0.3], [-10.0, 0.05]], rtol=1e-6)
  np.testing.assert_allclose(ppo.scale_env_reward(r, 0.1, 0.0), 0.1 * np.asarray(r), rtol=1e-6)   # no clip
  tr = rollout.Transition(obs=jnp.zeros((2, 2, 1)), action=jnp.zeros((2, 2), jnp.int32),
                          env_action=jnp.zeros((2, 2), jnp.int32), reward=r, terminated=jnp.zeros((2, 2), bool),
                          truncated=jnp.zeros((2, 2), bool), next_obs=jnp.zeros((2, 2, 1)),
                          episode_return=jnp.zeros((2, 2)), episode_length=jnp.zeros((2, 2)), extras={})
  bonus = lambda t: 0.5 * t.reward + 1.0                    # a hook with its own extrinsic and intrinsic weights
  np.testing.assert_allclose(ppo.process_reward(tr, 0.1, 10.0, bonus), [[6.0, 0.85], [-4.0, 1.025]], rtol=1e-6)
  with pytest.raises(ValueError, match="reward_fn returned shape"):
    ppo.process_reward(tr, 1.0, 0.0, lambda t: t.reward[0])


def test_ppo_config_errors():
  with pytest.raises(ValueError, match="num_minibatches"):
    ppo.PPO(_tiny(num_minibatches=3))
  with pytest.raises(ValueError, match="unknown variant"):
    ppo_config.get_config("pong")
  with pytest.raises(ValueError, match="unknown PPO preset"):
    ppo_config.preset("pong")
  for v in ppo_config.VARIANTS:
    assert ppo_config.get_config(v).paper == "ppo"


@pytest.mark.slow
def test_brax_inverted_pendulum_well_above_random():
  c = ppo_config.preset("inverted_pendulum")
  agent = ppo.PPO(c)

  def run(k):
    ts = agent.train(k)["runner_state"].train_state
    return agent.evaluate(ts.params, ts.extra, jax.random.fold_in(k, 1), num_envs=16)["return"]

  ret = float(jax.jit(run)(jax.random.key(0)))
  rnd = float(jax.jit(lambda k: rollout.evaluate(agent.env, rollout.random_policy(agent.env), k, 16))(
      jax.random.key(1))["return"])
  assert ret >= 500.0 and ret >= 10 * rnd, (ret, rnd)
