"""Uni-O4 policy improvement (`papers/unio4/improvement.py`): advantage weights and the asymmetric clipped
objective by hand, the offline PPO loss against a numpy transcription of the official loss, the replace rules,
policy selection, multi-step vs one-step improvement under an exact critic, a step under assert_max_traces, 1 vs 8
devices."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from iclr24_jax.papers import unio4
from iclr24_jax.papers.unio4 import stages
from iclr24_jax.papers.unio4 import data as data_lib
from iclr24_jax.rl import normalization
from .helpers import _random_ensemble


def test_normalize_advantage_and_weights_hand_values():
  # [1, 2, 3]: mean 2, unbiased std 1 -> [-1, 0, 1]
  np.testing.assert_allclose(np.asarray(unio4.normalize_advantage(jnp.asarray([1.0, 2.0, 3.0]))), [-1, 0, 1],
                             rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(np.asarray(unio4.advantage_weights(jnp.asarray([2.0, 0.0, -1.0]), 0.7)),
                             [0.7, 0.3, 0.3], rtol=1e-6)
  # omega 0.5: the official weighted_advantage returns A itself (weight 1, not 0.5)
  np.testing.assert_array_equal(np.asarray(unio4.advantage_weights(jnp.asarray([2.0, 0.0, -1.0]), 0.5)), 1.0)


def test_asymmetric_clipped_objective_hand_values():
  # r = [1.5, 0.5, 1.1, 0.9, 0.6], A = [1, 1, -2, -1, -1], eps = 0.25, omega = 0.7 -> w = [.7, .7, .3, .3, .3]
  # min(rA, clip(r, .75, 1.25) A) = [min(1.5, 1.25), min(.5, .75), min(-2.2, -2.2), min(-.9, -.9), min(-.6, -.75)]
  #                               = [1.25, 0.5, -2.2, -0.9, -0.75]
  # w * that = [0.875, 0.35, -0.66, -0.27, -0.225]; sum 0.07; mean 0.014; loss = -0.014
  r = jnp.asarray([1.5, 0.5, 1.1, 0.9, 0.6])
  adv = jnp.asarray([1.0, 1.0, -2.0, -1.0, -1.0])
  loss, stats = unio4.asymmetric_clipped_objective(jnp.log(r), jnp.zeros(5), adv, 0.25, 0.7)
  np.testing.assert_allclose(float(loss), -0.014, atol=1e-6)
  # the official form min(r * wA, clip(r) * wA) is the same number
  wa = unio4.advantage_weights(adv, 0.7) * adv
  official = -jnp.mean(jnp.minimum(r * wa, jnp.clip(r, 0.75, 1.25) * wa))
  np.testing.assert_allclose(float(loss), float(official), rtol=1e-6)
  np.testing.assert_allclose(float(stats.clip_fraction), 3 / 5, rtol=1e-6)  # |r - 1| > .25 for 1.5, 0.5, 0.6


def test_replace_rule_only_accepts_strictly_higher_scores():
  behaviour = {"w": jnp.asarray([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]])}
  candidate = {"w": jnp.asarray([[10.0, 10.0], [11.0, 11.0], [12.0, 12.0]])}
  best = jnp.asarray([1.0, 2.0, 3.0])
  cand = jnp.asarray([1.5, 2.0, 2.5])  # higher, equal, lower
  new_beh, new_best, acc = unio4.replace_if_better(behaviour, candidate, best, cand)
  np.testing.assert_array_equal(np.asarray(acc), [True, False, False])
  np.testing.assert_allclose(np.asarray(new_best), [1.5, 2.0, 3.0])
  np.testing.assert_allclose(np.asarray(new_beh["w"]), [[10.0, 10.0], [1.0, 1.0], [2.0, 2.0]])
  with pytest.raises(ValueError, match="shapes differ"):
    unio4.replace_if_better(behaviour, candidate, best, cand[:2])


def test_select_policy():
  assert unio4.select_policy([0.1, 0.5, 0.3, 0.4]) == 1
  # top-3 by OPE = members 1, 3, 2; the best return among them is member 2 (member 0 is not eligible)
  assert unio4.select_policy([0.1, 0.5, 0.3, 0.4], [99.0, 10.0, 30.0, 20.0], top_k=3) == 2


def test_paired_replace_rule_needs_a_win_beyond_z_standard_errors():
  behaviour = {"w": jnp.asarray([[0.0], [1.0], [2.0]])}
  candidate = {"w": jnp.asarray([[10.0], [11.0], [12.0]])}
  # member 0 wins by 3 SE (accepted), member 1 by 1 SE (noise: kept), member 2 loses by 3 SE (kept).
  new_beh, acc = unio4.replace_if_paired_better(behaviour, candidate, jnp.asarray([0.3, 0.1, -0.3]),
                                                jnp.asarray([0.1, 0.1, 0.1]), z=2.0)
  np.testing.assert_array_equal(np.asarray(acc), [True, False, False])
  np.testing.assert_allclose(np.asarray(new_beh["w"])[:, 0], [10.0, 1.0, 2.0])
  # The official rule would accept member 1 on the same numbers (any strictly higher score).
  assert bool(unio4.replace_if_better(behaviour, candidate, jnp.zeros(3), jnp.asarray([0.3, 0.1, -0.3]))[2][1])


@pytest.fixture(scope="module")
def ppo_setup():
  key = jax.random.key(3)
  obs_dim, act_dim = 3, 2
  policy, params = _random_ensemble(key, k=3, obs_dim=obs_dim, action_dim=act_dim)
  spec = dict(mode="iql", v_hidden=(16,), q_hidden=(16,), activation="relu", double_q=True)
  from iclr24_jax.papers.unio4.critics import critic_modules
  v_module, q_module = critic_modules(spec)
  critics = unio4.Critics(v_module.init(key, jnp.zeros((1, obs_dim)))["params"],
                          q_module.init(key, jnp.zeros((1, obs_dim)), jnp.zeros((1, act_dim)))["params"],
                          normalization.init((obs_dim,)), v_module, q_module)
  obs = jax.random.normal(jax.random.key(4), (64, obs_dim))
  return policy, params, critics, obs


def test_offline_ppo_step_lowers_its_loss(ppo_setup):
  policy, params, critics, obs = ppo_setup
  stats = normalization.init((3,))
  tx = optax.adam(1e-3)
  state = stages.ensemble_state(params, tx, extra={"behaviour": params})
  key = jax.random.key(7)

  @jax.jit
  @chex.assert_max_traces(n=1)
  def step(st, o, k):
    return unio4.offline_ppo_step(st, o, k, policy=policy, critics=critics, obs_stats=stats)

  loss = jax.jit(lambda p: unio4.offline_ppo_loss(p, params, obs, jax.random.fold_in(key, 0), policy=policy,
                                                  critics=critics, obs_stats=stats, clip_eps=0.25, omega=0.7)[0])
  before = float(loss(state.params))
  new, m = step(state, obs, key)
  after = float(loss(new.params))
  assert after < before
  chex.assert_shape(m["loss"], (3,))
  new2, _ = step(new, obs, key)  # no retrace
  assert int(new2.step) == 2


def _official_bppo_loss(log_prob, old_log_prob, adv, clip_eps, omega):
  """numpy transcription of the official offline PPO loss (abppo.py): weighted_advantage (A itself at omega
  0.5, else omega / 1 - omega by the sign of A), then -mean(min(r A, clamp(r, 1 - eps, 1 + eps) A)), entropy
  weight 0."""
  adv = np.asarray(adv, np.float64)
  if omega != 0.5:
    adv = np.where(adv > 0, omega, 1.0 - omega) * adv
  r = np.exp(np.asarray(log_prob, np.float64) - np.asarray(old_log_prob, np.float64))
  return -np.mean(np.minimum(r * adv, np.clip(r, 1 - clip_eps, 1 + clip_eps) * adv))


@pytest.mark.parametrize("omega", [0.5, 0.7])
def test_ppo_loss_equals_the_official_loss_on_one_minibatch(ppo_setup, omega):
  # One member, one minibatch: the behaviour policy is member 0 and the trained policy member 1, so r != 1.
  policy, params, critics, obs = ppo_setup
  stats = normalization.init((3,))
  cur, beh = (jax.tree.map(lambda x: x[i], params) for i in (1, 0))
  key = jax.random.key(11)
  loss, _ = jax.jit(lambda p: unio4.policy_improvement_loss(p, beh, obs, key, policy=policy, critics=critics,
                                                             obs_stats=stats, clip_eps=0.25, omega=omega))(cur)
  # the same sampled actions, log-probs and normalised advantages, recomputed outside the loss
  x = data_lib.normalize_obs(stats, obs, 10.0)
  old = policy.apply({"params": beh}, x)
  action = old.sample(key)
  adv = unio4.normalize_advantage(critics.advantage(obs, action))
  ref = _official_bppo_loss(policy.apply({"params": cur}, x).log_prob(action), old.log_prob(action), adv, 0.25,
                            omega)
  assert abs(ref) > 1e-3
  np.testing.assert_allclose(float(loss), ref, rtol=1e-5, atol=1e-7)


class _KnownCritic:
  """A(s, a) = -|a - 0.5|^2: the best action is 0.5 in every state."""

  def advantage(self, obs, action):
    return -jnp.sum(jnp.square(action - 0.5), axis=-1)


def test_multi_step_improvement_moves_further_than_one_step_under_a_known_critic():
  # With an exact critic, offline PPO moves each member's mean action toward 0.5. Anchored to the BC policy
  # (one-step) the clip (eps 0.25) stalls it; replacing the behaviour by the current policy when a (here exact)
  # evaluation score is higher lets it keep going (multi-step): init > one-step > multi-step distance to 0.5.
  policy, params = _random_ensemble(jax.random.key(0), k=2, obs_dim=3, action_dim=2)
  obs = jax.random.normal(jax.random.key(1), (64, 3))
  stats, tx = normalization.init((3,)), optax.adam(3e-3)
  dist = jax.vmap(lambda p: jnp.mean(jnp.abs(policy.apply({"params": p}, obs).mean - 0.5)))  # [K]

  @jax.jit
  def train(params, replace):
    def outer(st, _):
      st, _ = jax.lax.scan(lambda s, _: unio4.offline_ppo_step(s, obs, jax.random.key(2), policy=policy,
                                                               critics=_KnownCritic(), obs_stats=stats),
                           st, None, length=20)
      beh, best, _ = unio4.replace_if_better(st.extra["behaviour"], st.params, st.extra["best"], -dist(st.params))
      beh = jax.tree.map(lambda b, old: jnp.where(replace, b, old), beh, st.extra["behaviour"])
      return st.replace(extra={"behaviour": beh, "best": best}), None

    st = stages.ensemble_state(params, tx, extra={"behaviour": params, "best": -dist(params)})
    return jax.lax.scan(outer, st, None, length=8)[0].params

  d0, d_one, d_multi = np.asarray(dist(params)), np.asarray(dist(train(params, False))), \
      np.asarray(dist(train(params, True)))
  assert np.all(d_one < d0) and np.all(d_multi < d_one), (d0, d_one, d_multi)


def test_offline_ppo_step_one_vs_eight_devices(ppo_setup):
  policy, params, critics, obs = ppo_setup
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 (simulated) devices")
  from iclr24_jax.common import sharding
  stats = normalization.init((3,))
  tx = optax.adam(1e-3)
  outs = []
  for mesh in sharding.device_meshes((1, 8)):
    rep, dat = sharding.replicated_sharding(mesh), sharding.data_sharding(mesh)
    state = jax.device_put(stages.ensemble_state(params, tx, extra={"behaviour": params}), rep)
    fn = jax.jit(lambda s, o, k: unio4.offline_ppo_step(s, o, k, policy=policy, critics=critics, obs_stats=stats),
                 in_shardings=(rep, dat, rep), out_shardings=(rep, rep))
    outs.append(jax.device_get(fn(state, jax.device_put(obs, dat), jax.random.key(9))[0].params))
  chex.assert_trees_all_close(outs[0], outs[1], rtol=1e-5, atol=1e-6)
