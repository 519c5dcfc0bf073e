"""Tests of Uni-O4 (iclr24_jax.papers.unio4): losses against hand-computed values, the replace rule, the
disagreement term (what the official form really does), multi-step vs one-step improvement under an exact critic,
value fitting on a toy MDP, the OPE on a hand-made model, a step under assert_max_traces, 1 vs 8 devices, clear
errors, and a smoke run of experiment.run with the tiny config."""
import json
import math
import os

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

C = 0.5 * math.log(2 * math.pi)


def _const_policy_params(means, log_stds, obs_dim=1):
  """GaussianPolicy(action_dim=1, hidden=(2,)) params whose output is constant: zero kernels, last bias set so
  tanh(bias) = (mean, (log_std + 5) / 2.5 - 1) (log_std bounds (-5, 0))."""
  out = []
  for m, s in zip(means, log_stds):
    t = (s + 5.0) / 2.5 - 1.0
    out.append({"MLP_0": {"Dense_0": {"kernel": jnp.zeros((obs_dim, 2)), "bias": jnp.zeros((2,))},
                          "Dense_1": {"kernel": jnp.zeros((2, 2)),
                                      "bias": jnp.asarray([math.atanh(m), math.atanh(t)], jnp.float32)}}})
  return out


POLICY_1D = unio4.GaussianPolicy(action_dim=1, hidden=(2,))


def test_ensemble_bc_loss_hand_values():
  # Three constant policies: pi1 = N(0.5, e^-1), pi2 = N(0, e^-1), pi3 = N(-0.5, e^-2); data actions a = 0.5, 0.
  # log N(a; m, s) = -((a - m) / s)^2 / 2 - log s - log(2 pi) / 2, log(2 pi) / 2 = 0.918938533:
  #   pi1: a=.5 -> 0 + 1 - 0.918938533 = 0.081061467; a=0 -> -(0.5 e)^2/2 + 1 - 0.9189 = -0.842570545
  #   pi2: a=.5 -> -0.842570545; a=0 -> 0.081061467
  #   pi3: a=.5 -> -(1 e^2)^2/2 + 2 - 0.9189 = -26.218013550; a=0 -> -(0.5 e^2)^2/2 + 2 - 0.9189 = -5.743707287
  # max over the others: i=1 -> (-0.842570545, 0.081061467); i=2 -> (0.081061467, -0.842570545);
  #                      i=3 -> (0.081061467, 0.081061467)
  # L_i = mean_b[-(1 + a) logp_i + a max_other], a = 0.1:
  #   L_1 = mean(-1.1 * 0.081061467 + 0.1 * -0.842570545, -1.1 * -0.842570545 + 0.1 * 0.081061467)
  #       = mean(-0.173424669, 0.934933746) = 0.380754539 = L_2
  #   L_3 = mean(1.1 * 26.218013550 + 0.0081061467, 1.1 * 5.743707287 + 0.0081061467)
  #       = mean(28.847921052, 6.326184163) = 17.587052607;  sum = 18.348561686
  params = _const_policy_params([0.5, 0.0, -0.5], [-1.0, -1.0, -2.0])
  batch = {"obs": jnp.zeros((2, 1)), "actions": jnp.asarray([[0.5], [0.0]])}
  total, m = unio4.ensemble_bc_loss(params, batch, 0.1)
  np.testing.assert_allclose(float(total), 18.348561686, atol=1e-4)
  np.testing.assert_allclose(np.asarray(m["bc_loss"]), [0.380754539, 0.380754539, 17.587052607], atol=1e-4)
  np.testing.assert_allclose(np.asarray(m["nll"]), [0.380754539, 0.380754539, 15.980860419], atol=1e-4)
  stacked = unio4.stack_trees(params)
  total_s, _ = unio4.ensemble_bc_loss(stacked, batch, 0.1, policy=POLICY_1D)
  np.testing.assert_allclose(float(total_s), float(total), rtol=1e-6)
  # alpha = 0: plain NLL per member: 0.380754539 * 2 + (26.21801355 + 5.743707287) / 2 = 16.742475917
  total0, _ = unio4.ensemble_bc_loss(stacked, batch, 0.0)
  np.testing.assert_allclose(float(total0), 16.742475917, atol=1e-4)


def _random_ensemble(key, k=3, obs_dim=3, action_dim=2, hidden=(16, 16), identical=False):
  policy = unio4.GaussianPolicy(action_dim, hidden)
  return policy, unio4.init_ensemble(key, policy, k, jnp.zeros((1, obs_dim)), identical=identical)


def _toy_bc_batch(n=64, obs_dim=3, action_dim=2, seed=0):
  rng = np.random.default_rng(seed)
  obs = rng.normal(size=(n, obs_dim)).astype(np.float32)
  w = rng.normal(size=(obs_dim, action_dim)).astype(np.float32)
  act = np.tanh(obs @ w + 0.1 * rng.normal(size=(n, action_dim))).astype(np.float32)
  return {"obs": jnp.asarray(obs), "actions": jnp.asarray(act)}


def test_official_disagreement_term_only_rescales_the_bc_gradient():
  # With the max over the other policies stop-gradient, grad L_i = -(1 + alpha) grad log pi_i(a|s).
  policy, params = _random_ensemble(jax.random.key(0))
  batch = _toy_bc_batch()
  grads = jax.jit(lambda p: (jax.grad(lambda q: unio4.ensemble_bc_loss(q, batch, 0.1, policy=policy)[0])(p),
                             jax.grad(lambda q: unio4.ensemble_bc_loss(q, batch, 0.0, policy=policy)[0])(p)))
  g_alpha, g_bc = grads(params)
  # (gradients are batch sums of terms up to ~1e2, so the absolute tolerance is float32 eps x 1e2 x a few)
  chex.assert_trees_all_close(g_alpha, jax.tree.map(lambda g: 1.1 * g, g_bc), rtol=1e-5, atol=1e-4)


@pytest.fixture(scope="module")
def bc_runs():
  """150 Adam steps of a 4-member ensemble on one batch: random or identical initial members, alpha 0.1 or 0."""
  batch = _toy_bc_batch(seed=1)
  tx = optax.adam(3e-3)
  policy, params = _random_ensemble(jax.random.key(1), k=4)
  _, same = _random_ensemble(jax.random.key(1), k=4, identical=True)
  out = {}
  for alpha in (0.0, 0.1):
    go = jax.jit(lambda state, alpha=alpha: jax.lax.scan(
        lambda st, _: unio4.bc_step(st, batch, policy=policy, alpha=alpha), state, None, length=150))
    for identical, p in ((False, params), (True, same)):  # one compile per alpha
      state, m = go(stages.ensemble_state(p, tx))
      out[(identical, alpha)] = (state.params, float(unio4.pairwise_disagreement(state.params, policy, batch["obs"])),
                                 m)
  return out


def test_ensemble_diversity_comes_from_initialisation(bc_runs):
  # The official disagreement term (max over the others, stop-gradient, at the data action) rescales each
  # member's BC gradient by (1 + alpha); Adam removes that scale, so the ensemble trains as with alpha = 0:
  p_alpha, d_alpha, m = bc_runs[(False, 0.1)]
  p_zero, d_zero, _ = bc_runs[(False, 0.0)]
  chex.assert_trees_all_close(p_alpha, p_zero, rtol=1e-3, atol=1e-4)
  np.testing.assert_allclose(d_alpha, d_zero, rtol=1e-3)
  # the members do differ (different initialisations) ...
  assert d_alpha > 0.01
  assert float(m["loss"][-1]) < float(m["loss"][0])
  # ... and identical members stay identical under the term: it is no diversity force by itself.
  assert bc_runs[(True, 0.1)][1] == 0.0 and bc_runs[(True, 0.0)][1] == 0.0


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


class _LineModel:
  """s' = s + a; terminal once |s'[0]| > 1."""

  def step(self, key, obs, action):
    nxt = obs + action
    return nxt, jnp.zeros(obs.shape[0]), jnp.abs(nxt[:, 0]) > 1.0


def test_offline_policy_evaluation_hand_values():
  # policy a = 0.5, q(s, a) = s. Row 0 from s=0: q = 0, 0.5, 1.0 (s'=1.5 terminal after the last step);
  # row 1 from s=0.6: q = 0.6, then s' = 1.1 is terminal. score = (0 + .5 + 1 + .6) / 4 = 0.525
  score = unio4.offline_policy_evaluation(jax.random.key(0), _LineModel(), lambda s: jnp.full_like(s, 0.5),
                                          lambda s, a: s[:, 0], jnp.asarray([[0.0], [0.6]]), 3)
  np.testing.assert_allclose(float(score), 0.525, rtol=1e-6)
  with pytest.raises(ValueError, match="horizon"):
    unio4.offline_policy_evaluation(jax.random.key(0), _LineModel(), lambda s: s, lambda s, a: s[:, 0],
                                    jnp.zeros((2, 1)), 0)


def test_ope_per_state_hand_values_and_paired_difference():
  # Same rollouts as above: row 0 sums q = 0 + .5 + 1 = 1.5 over 3 alive states, row 1 sums 0.6 over 1.
  q_sum, count = unio4.ope_per_state(jax.random.key(0), _LineModel(), lambda s: jnp.full_like(s, 0.5),
                                     lambda s, a: s[:, 0], jnp.asarray([[0.0], [0.6]]), 3)
  np.testing.assert_allclose(np.asarray(q_sum), [1.5, 0.6], rtol=1e-6)
  np.testing.assert_allclose(np.asarray(count), [3.0, 1.0])
  # Per-state scores 0.5 and 0.6 vs a behaviour policy scoring 0.2 and 0.5: d = (0.3, 0.1), mean 0.2,
  # SE = std([0.3, 0.1], ddof=1) / sqrt(2) = 0.141421 / 1.414214 = 0.1.
  mean, se = unio4.paired_ope_difference(q_sum, count, jnp.asarray([0.6, 0.5]), jnp.asarray([3.0, 1.0]))
  np.testing.assert_allclose(float(mean), 0.2, rtol=1e-5)
  np.testing.assert_allclose(float(se), 0.1, rtol=1e-5)
  with pytest.raises(ValueError, match=">= 2 start states"):
    unio4.paired_ope_difference(q_sum[:1], count[:1], q_sum[:1], count[:1])


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


def test_study_rank_correlation_and_accepted_margins():
  from iclr24_jax.papers.unio4 import study
  # OPE and returns in the same order at both checkpoints -> rho = 1; reversed -> -1. Step 0 counted once.
  run = {"history": [{"step": 0, "ope": [1.0, 2.0], "ope_best": [1.0, 2.0], "accepted": []},
                     {"step": 10, "ope": [3.0, 0.5], "ope_best": [3.0, 2.0], "accepted": [1, 0]}],
         "env_returns": [(0, np.array([10.0, 20.0])), (10, np.array([30.0, 5.0]))]}
  assert study.ope_rank_correlation([run, run]) == pytest.approx(1.0)
  rev = {**run, "env_returns": [(0, np.array([20.0, 10.0])), (10, np.array([5.0, 30.0]))]}
  assert study.ope_rank_correlation([rev]) == pytest.approx(-1.0)
  # member 0 accepted at step 10 with 3.0 over its previous best 1.0 -> margin 2.0
  assert study.accepted_margins(run) == [2.0]


def _chain_dataset(episodes=40, length=10):
  """A deterministic chain: state t / length, one action (0), reward 1, terminal at the last step."""
  t = np.tile(np.arange(length), episodes)
  obs = (t / length).astype(np.float32)[:, None]
  nxt = ((t + 1) / length).astype(np.float32)[:, None]
  return {"observations": obs, "actions": np.zeros((len(t), 1), np.float32), "rewards": np.ones(len(t), np.float32),
          "next_observations": nxt, "terminals": t == length - 1, "timeouts": np.zeros(len(t), bool)}


@pytest.mark.parametrize("mode", ["sarsa", "iql"])
def test_value_fitting_recovers_known_values_on_a_chain(mode):
  gamma, length = 0.9, 10
  data = unio4.prepare(_chain_dataset(length=length), gamma=gamma)
  cfg = dict(mode=mode, v_hidden=(64, 64), q_hidden=(64, 64), activation="relu", double_q=True, v_lr=3e-3,
             q_lr=3e-3, batch_size=128, num_steps=1500, gamma=gamma, tau=0.2, target_update_freq=1, expectile=0.7)
  critics, hist = unio4.fit_value_functions(jax.random.key(0), data, cfg, log_every=500)
  s = jnp.asarray((np.arange(length) / length)[:, None], jnp.float32)
  true = (1 - gamma ** (length - np.arange(length))) / (1 - gamma)  # V(s_t) = sum_{k < T - t} gamma^k
  v = np.asarray(critics.value(s))
  q = np.asarray(critics.q(s, jnp.zeros((length, 1))))
  # one action: V = Q = the discounted steps-to-go (6.513 at t = 0 ... 1 at t = 9)
  assert np.max(np.abs(q - true)) < 0.25, (q, true)
  assert np.max(np.abs(v - true)) < 0.25, (v, true)
  assert hist[-1]["q_loss"] < hist[0]["q_loss"]


def test_prepare_returns_next_actions_and_errors():
  # episode 1: rows 0-2 (terminal at 2), episode 2: rows 3-4 (timeout at 4); gamma = 0.5, r = 1:
  # G = [1 + .5 (1 + .5), 1 + .5, 1, 1 + .5, 1] = [1.75, 1.5, 1, 1.5, 1]
  ds = {"observations": np.arange(5, dtype=np.float32)[:, None],
        "actions": np.arange(5, dtype=np.float32)[:, None] / 10, "rewards": np.ones(5, np.float32),
        "next_observations": np.arange(1, 6, dtype=np.float32)[:, None],
        "terminals": np.asarray([0, 0, 1, 0, 0], bool), "timeouts": np.asarray([0, 0, 0, 0, 1], bool)}
  d = unio4.prepare(ds, gamma=0.5, state_norm=False, pad_to=8)
  np.testing.assert_allclose(np.asarray(d.returns[:5]), [1.75, 1.5, 1.0, 1.5, 1.0], rtol=1e-6)
  # a' = next row's action inside an episode; the row's own action at the terminal / the truncation
  np.testing.assert_allclose(np.asarray(d.next_actions[:5, 0]), [0.1, 0.2, 0.2, 0.4, 0.4], rtol=1e-6)
  np.testing.assert_allclose(np.asarray(d.not_done[:5]), [1, 1, 0, 1, 1])
  assert d.observations.shape == (8, 1) and int(d.num_rows) == 5
  idx_rows = np.asarray(unio4.sample(jax.random.key(0), d, 256)["observations"][:, 0])
  assert idx_rows.max() <= 4  # padded rows are never drawn
  bad = dict(ds)
  bad.pop("timeouts")
  with pytest.raises(ValueError, match="lacks"):
    unio4.prepare(bad)
  nan = dict(ds)
  nan["rewards"] = np.asarray([1, np.nan, 1, 1, 1], np.float32)
  with pytest.raises(ValueError, match="NaN"):
    unio4.prepare(nan)
  with pytest.raises(ValueError, match="pad_to"):
    unio4.prepare(ds, pad_to=3)


def test_shapes_and_dtypes():
  key = jax.random.key(0)
  obs, act = jnp.zeros((5, 4)), jnp.zeros((5, 2))
  pol = unio4.GaussianPolicy(2, (8,))
  d = pol.apply(pol.init(key, obs), obs)
  chex.assert_shape([d.mean, d.log_std], (5, 2))
  assert float(d.log_std.min()) >= -5.0 and float(d.log_std.max()) <= 0.0
  assert float(jnp.abs(d.mean).max()) <= 1.0
  q = unio4.QNetwork((8,), num_q=2)
  out = q.apply(q.init(key, obs, act), obs, act)
  chex.assert_shape(out, (2, 5))
  chex.assert_type(out, jnp.float32)
  member = unio4.DynamicsMember(5, (8,))
  params = {"members": jax.vmap(lambda k: member.init(k, jnp.zeros((1, 6)))["params"])(jax.random.split(key, 3)),
            "max_logvar": jnp.full((5,), 0.5), "min_logvar": jnp.full((5,), -10.0)}
  dyn = unio4.Dynamics(params, jnp.zeros(6), jnp.ones(6), jnp.asarray([0, 2]), member, "hopper")
  mean, logvar = jax.jit(lambda d: d.predict(obs, act))(dyn)
  chex.assert_shape([mean, logvar], (2, 5, 5))
  nxt, rew, term = jax.jit(lambda d: d.step(key, obs, act))(dyn)
  chex.assert_shape(nxt, (5, 4))
  chex.assert_shape([rew, term], (5,))
  assert term.dtype == jnp.bool_
  assert unio4.termination_for_env("brax/inverted_pendulum") == "inverted_pendulum"
  assert unio4.termination_for_env("gymnax/CartPole-v1") == "none"


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


def test_config_variants_and_errors():
  from iclr24_jax.configs import unio4 as cfg_mod
  c = cfg_mod.get_config("")
  assert c.paper == "unio4" and c.data.name == "brax/inverted_pendulum" and c.data.kind == "medium"
  assert c.bc.num_policies == 4 and c.bc.alpha == 0.1 and c.improve.clip_eps == 0.25 and c.improve.omega == 0.7
  assert cfg_mod.get_config("hopper_medium").data.name == "brax/hopper"
  assert cfg_mod.get_config("inverted_pendulum_medium_replay").data.kind == "medium-replay"
  assert cfg_mod.get_config("random").data.kind == "random"
  assert cfg_mod.get_config("online").online.compare_scratch
  assert c.improve.replace_rule == "best" and c.improve.paired_z == 2.0
  r, f, t = cfg_mod.get_config("reproduce"), cfg_mod.get_config("reproduce_fast"), cfg_mod.get_config("tiny")
  assert r.study.seeds == 3 and r.num_steps == 1000 and r.model.hidden == (256, 256) and r.online.compare_scratch
  # the fast reproduction is the tiny sizes with a few more steps
  assert f.model.hidden == t.model.hidden and f.dynamics.hidden == t.dynamics.hidden and f.num_steps == 40
  with pytest.raises(ValueError, match="unknown variant"):
    cfg_mod.get_config("walker")
  with pytest.raises(ValueError, match="critic.mode"):
    unio4.fit_value_functions(jax.random.key(0), None, {"mode": "td3"})
  with pytest.raises(ValueError, match=r"\[B, D\]"):
    unio4.ensemble_bc_loss(_const_policy_params([0.0], [-1.0]), {"obs": jnp.zeros((2,)), "actions": jnp.zeros((2,))},
                           0.1)


def _tiny_config(full: bool, replace_rule: str = "best"):
  from iclr24_jax.configs import unio4 as cfg_mod
  cfg = cfg_mod.get_config("tiny")
  cfg.improve.replace_rule = replace_rule
  cfg.progress = False
  if not full:  # the brax programs (evaluation ~10 s, PPO ~15 s of CPU to compile) run in the slow test below
    cfg.online.num_steps = 0
    cfg.eval_episodes = 0
  return cfg


def _stage_rows(workdir) -> dict:
  """stage -> its metrics.jsonl rows."""
  return {st: [json.loads(line) for line in open(os.path.join(workdir, st, "metrics.jsonl"))]
          for st in ("critic", "dynamics", "bc", "improve", "online") if os.path.exists(os.path.join(workdir, st,
                                                                                                   "metrics.jsonl"))}


def _run_tiny(tmp_path, full: bool, replace_rule: str = "best"):
  from iclr24_jax.papers.unio4 import experiment
  cfg = _tiny_config(full, replace_rule)
  out = experiment.run(cfg, str(tmp_path))
  assert os.path.exists(tmp_path / "results.json")
  res = json.load(open(tmp_path / "results.json"))
  assert len(res["last_ope"]) == cfg.bc.num_policies and np.all(np.isfinite(res["last_ope"]))
  assert 0 <= res["selected"] < cfg.bc.num_policies
  assert os.path.isdir(out["checkpoints"]["improve"]) and os.path.isdir(out["checkpoints"]["critic"])
  stages = set(_stage_rows(tmp_path))
  assert {"critic", "dynamics", "bc", "improve"} <= stages
  return cfg, res, stages


@pytest.fixture(scope="module")
def tiny_paired(tmp_path_factory):
  wd = tmp_path_factory.mktemp("unio4_tiny")
  return wd, _run_tiny(wd, full=False, replace_rule="paired")


def test_experiment_run_tiny(tiny_paired):
  wd, _ = tiny_paired
  checks = _stage_rows(wd)["improve"]
  assert [r["step"] for r in checks] == [0, 10, 20]   # the step-0 OPE, then every improve.eval_every steps
  assert all(len(r["paired_diff"]) == 4 and np.all(np.asarray(r["paired_se"]) >= 0) for r in checks[1:])


class _Crash(Exception):
  """Stands for a process killed without warning (nothing saved at the kill)."""


def test_kills_inside_stages_then_resume_equal_the_uninterrupted_run(tiny_paired, tmp_path):
  """Stopped three times: a real SIGTERM in the critic stage at step 20 (saved there, Preempted, exit code 143);
  killed without a save in the dynamics stage after its step-20 checkpoint (early-stopping state in the loop state's
  extra) and in the improvement stage after its step-10 checkpoint (the gate's best OPE scores and behaviour
  policies in the state); every rerun skips the finished stages and resumes inside the one it was in. The results
  and every stage's metrics.jsonl equal the uninterrupted run's, bit for bit (same programs)."""
  import signal
  from iclr24_jax.common import loop
  from iclr24_jax.papers.unio4 import experiment
  full_wd, (_, full, _) = tiny_paired
  cfg = _tiny_config(False, "paired")
  cfg.checkpoint_every = 10   # improve (eval_every 10) saves at 10; critic / dynamics / BC chunks end at 20, 40
  wd = str(tmp_path / "killed")

  def kill_at(stage_key, step, how):
    def fn(s, row):
      if s == step and stage_key in row:
        if how == "sigterm":
          os.kill(os.getpid(), signal.SIGTERM)   # the real signal, seen by the stage's loop at this boundary
        else:
          raise _Crash(s)
    return fn

  with loop.observe(kill_at("v_loss", 20, "sigterm")), pytest.raises(loop.Preempted) as stopped:
    experiment.run(cfg, wd)
  assert stopped.value.step == 20 and stopped.value.exit_code == 143 and loop.stop_requested() is None
  assert stopped.value.where == os.path.join(wd, "critic", "checkpoints")
  for stage_key, step in (("holdout_mse", 40), ("ope", 20)):
    with loop.observe(kill_at(stage_key, step, "crash")), pytest.raises(_Crash):
      experiment.run(cfg, wd)
  assert sorted(os.listdir(os.path.join(wd, "improve", "checkpoints"))) == ["10", "config.json"]
  resumed = experiment.run(cfg, wd)
  drop = lambda r: {k: v for k, v in r.items() if k not in ("seconds", "wall_seconds", "checkpoints", "plots")}
  assert drop(json.load(open(os.path.join(wd, "results.json")))) == drop(full)
  assert resumed["best_ope"] == full["best_ope"] and resumed["replacements"] == full["replacements"]
  assert _stage_rows(wd) == _stage_rows(full_wd)


@pytest.mark.slow
def test_experiment_run_tiny_with_evaluation_and_online(tmp_path):
  cfg, res, stages = _run_tiny(tmp_path, full=True)
  assert os.path.exists(tmp_path / "offline_curves.png") and os.path.exists(tmp_path / "online_curves.png")
  assert len(res["unio4_return"]) == cfg.bc.num_policies and np.isfinite(res["unio4_score_mean"])
  assert len(res["online_eval_return"]) == cfg.online.num_steps + 1
  assert "online" in stages
