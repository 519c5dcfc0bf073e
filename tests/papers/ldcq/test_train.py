"""LDCQ training and acting (`papers/ldcq/train.py`): the schedule, the Q update with the official prioritized
replay, the reverse diffusion chain against the official step, latent sampling and the planners, the evaluation
protocols, the random floor, the diffusion prior on a known mixture (slow), errors on bad input."""
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.papers import ldcq
from iclr24_jax.papers.ldcq import data as data_lib
from iclr24_jax.rl.env_base import EnvSpec
from .helpers import _q_setup, _segments, _spec, _tiny_vae


def test_official_linear_schedule_does_not_reach_noise():
  spec = _spec(_tiny_vae())
  ab_T = float(spec.make_schedule().alpha_bars[-1])
  # prod_t (1 - beta_t), beta linear 1e-4 .. 0.02 over 100 steps: exp(-sum beta) ~ exp(-1.005) ~ 0.366
  assert 0.35 < ab_T < 0.38
  assert float(_spec(_tiny_vae(), schedule="cosine").make_schedule().alpha_bars[-1]) < 1e-3


def _q_data(key, m=64, d=3, zd=2, k=6):
  ks = jax.random.split(key, 5)
  s0 = jax.random.normal(ks[0], (m, d))
  return {"s0": s0, "z": jax.random.normal(ks[1], (m, zd)), "reward": jnp.tanh(s0[:, 0]),
          "next_state": jax.random.normal(ks[2], (m, d)), "done": jnp.zeros((m,)),
          "next_latents": jax.random.normal(ks[3], (m, k, zd))}


def test_q_train_step_fits_targets_updates_priorities_and_polyak():
  """Also the official PER rule (NaivePrioritizedBuffer, DDQN.learn): items enter at priority 100; P(i) =
  p_i^0.6 / sum p^0.6; weights (N P(i))^-beta / max over the batch; the loss sum_j mean_b w (Q_j - y_j)^2
  (reported / 2); new priorities (TD_0^2 + 5e-6 + TD_1^2 + 5e-6) / 2."""
  from iclr24_jax.rl import replay
  q_net, _ = _q_setup(jax.random.key(0))
  m, alpha = 64, 0.6
  data = _q_data(jax.random.key(1), m=m)
  # tau = 0: the target nets stay fixed, so the update is a regression that must lower its loss
  cfg = ldcq.QConfig(q_net, discount=0.9, batch_size=32, num_target_samples=4, tau=0.0, steps_per_epoch=2)
  state = jax.jit(lambda k: ldcq.q_init(k, cfg, ldcq.make_buffer(data, alpha), 3, 2, learning_rate=3e-3))(
      jax.random.key(2))
  p0 = np.asarray(state.extra["buffer"].priorities())
  np.testing.assert_allclose(p0, 100.0 ** 0.6, rtol=1e-6)  # official push: every item enters at priority 100

  @jax.jit
  @chex.assert_max_traces(n=1)
  def step(st, k):
    return ldcq.q_train_step(st, None, k, cfg=cfg)

  state, _ = step(state, jax.random.key(3))    # after one step: a mix of untouched (100) and updated priorities
  buf = state.extra["buffer"]
  raw = np.asarray(buf.priorities(), np.float64) ** (1 / alpha)
  assert np.sum(np.isclose(raw, 100.0)) > 20 and np.sum(raw < 10.0) > 20
  beta = 0.3 + 0.01 * (1 // 2)                 # beta0 + 0.01 per epoch of steps_per_epoch = 2 steps
  key = jax.random.key(3)
  k_sample, k_perm = jax.random.split(jax.random.fold_in(key, state.step))   # q_train_step's own split

  @jax.jit
  def reference_pieces(st):
    _, idx, w = replay.prioritized_sample(st.extra["buffer"], k_sample, 32, beta=beta)
    batch = jax.tree.map(lambda x: x[idx], data)
    perm = jax.random.permutation(k_perm, 6)[:4]
    y = ldcq.q_target(q_net, st.extra["target"], batch["reward"], batch["next_state"],
                      batch["next_latents"][:, perm], batch["done"], discount=0.9)["targets"]
    return idx, w, ldcq.twin_q_apply(q_net, st.params, batch["s0"], batch["z"]), y

  idx, w, q, y = jax.tree.map(np.asarray, reference_pieces(state))
  prob = raw ** alpha / np.sum(raw ** alpha)
  w_ref = (m * prob[idx]) ** -beta
  w_ref = w_ref / w_ref.max()
  np.testing.assert_allclose(w, w_ref, rtol=1e-5)
  new, metrics = step(state, key)
  td2 = (q.astype(np.float64) - y) ** 2                                  # [2, B]
  np.testing.assert_allclose(metrics["loss"], np.sum(np.mean(td2 * w_ref[None], 1)) / 2, rtol=1e-5)
  want = (td2[0] + 5e-6 + td2[1] + 5e-6) / 2
  got = np.asarray(new.extra["buffer"].priorities(), np.float64) ** (1 / alpha)
  last = {i: j for j, i in enumerate(idx)}      # a slot drawn twice keeps its last write (the official loop too)
  np.testing.assert_allclose([got[i] for i in last], [want[j] for j in last.values()], rtol=1e-4)
  untouched = np.setdiff1d(np.arange(m), idx)
  np.testing.assert_allclose(got[untouched], raw[untouched], rtol=1e-5)
  state = new

  losses = []
  for i in range(150):
    state, m = step(state, jax.random.key(3))
    losses.append(float(m["loss"]))
  assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10]), (losses[:3], losses[-3:])
  p1 = np.asarray(state.extra["buffer"].priorities())
  assert not np.allclose(p1, 100.0 ** 0.6) and np.all(p1 > 0)   # priorities now track the squared TD errors
  # Polyak averaging: tau = 0.5 gives target = 0.5 online_new + 0.5 target_old after one step
  cfg2 = ldcq.QConfig(q_net, discount=0.9, batch_size=32, num_target_samples=4, tau=0.5)
  batch = jax.tree.map(lambda x: x[:16], data)

  @jax.jit
  def polyak(k):
    st2 = ldcq.q_init(k, cfg2, None, 3, 2)
    st2 = st2.replace(extra={**st2.extra, "target": jax.tree.map(jnp.zeros_like, st2.extra["target"])})
    return ldcq.q_train_step(st2, batch, jax.random.key(5), cfg=cfg2)[0]

  new = polyak(jax.random.key(4))
  chex.assert_trees_all_close(new.extra["target"], jax.tree.map(lambda p: 0.5 * p, new.params), rtol=1e-6)


class _Linear:
  """A fixed x0-predicting 'denoiser' of (z_t, t, cond) for the reference chain."""

  def apply(self, variables, z_t, t, cond):
    return 0.8 * z_t + 0.3 * cond[:, :z_t.shape[1]] - 0.002 * t[:, None]


def test_reverse_diffusion_chain_matches_the_official_step_on_the_runs_schedule():
  """sample_latents on the runs' schedule (linear betas 1e-4..0.02, T = 100, x0-prediction, variance beta) against
  a numpy loop of the official Model_Cond_Diffusion.sample_extra step (models/diffusion_models.py:593-624):
    eps = (z_i - sqrt(abar_i) x0) / sqrt(1 - abar_i)
    z_{i-1} = (z_i - eps (1 - alpha_i) / sqrt(1 - abar_i)) / sqrt(alpha_i) + sqrt(beta_i) noise  (no noise at the end)
  with the same draws."""
  from iclr24_jax.diffusion import samplers
  spec = ldcq.LDCQSpec(vae=_tiny_vae(z=2), denoiser=_Linear(), q_net=ldcq.QNetwork(16, (16, 8)))
  sched = spec.make_schedule()
  s0 = jnp.array([[0.5, -1.0, 2.0], [1.5, 0.2, -0.3]])
  key = jax.random.key(5)
  out = jax.jit(lambda k: ldcq.sample_latents(k, ldcq.LDCQParams(vae=None, diffusion={}, spec=spec), s0, 3))(key)
  times, _, _ = samplers.sampling_grid(sched)
  np.testing.assert_array_equal(times, np.arange(99, -1, -1))            # every step, T - 1 .. 0
  beta = np.linspace(1e-4, 0.02, 100)
  abar = np.cumprod(1 - beta)
  key_init, step_keys = samplers.split_sampler_keys(key, 100)
  z = np.asarray(jax.random.normal(key_init, (6, 2)), np.float64)
  cond = np.repeat(np.asarray(s0, np.float64), 3, axis=0)
  for i, t in enumerate(range(99, -1, -1)):
    x0 = 0.8 * z + 0.3 * cond[:, :2] - 0.002 * t
    eps = (z - np.sqrt(abar[t]) * x0) / np.sqrt(1 - abar[t])
    z = (z - eps * beta[t] / np.sqrt(1 - abar[t])) / np.sqrt(1 - beta[t])
    if t > 0:
      z = z + np.sqrt(beta[t]) * np.asarray(jax.random.normal(step_keys[i], (6, 2)), np.float64)
  np.testing.assert_allclose(out, z.reshape(2, 3, 2), rtol=1e-4, atol=1e-5)


def test_sample_latents_and_act_pick_the_best_sampled_latent():
  vae = _tiny_vae(z=2)
  seg = _segments(jax.random.key(0), b=2)
  vp = jax.jit(vae.init)(jax.random.key(1), seg["states"], seg["actions"])["params"]
  spec = _spec(vae, "gaussian")
  q_net, qp = _q_setup(jax.random.key(2))
  _, qt = _q_setup(jax.random.key(9))      # target nets that disagree with the online ones
  params = ldcq.LDCQParams(vae=vp, q=qp, q_target=qt, spec=spec)
  s = jax.random.normal(jax.random.key(3), (5, 3))
  key = jax.random.key(4)

  @jax.jit
  def run(p, st):
    z = ldcq.sample_latents(key, p, st, 7)
    return (z, ldcq.act(key, p, st, 7), ldcq.q_values(p, st, z, target=False), ldcq.act(key, p, st[0], 7),
            ldcq.act(key, p.replace(q=None, q_target=None), st, 7), ldcq.sample_latents(key, p, st, 1),
            ldcq.act_maze(key, p, st, 7))

  z, chosen, q, single, no_q, one, maze = run(params, s)
  chex.assert_shape(z, (5, 7, 2))
  # acting scores with the online nets (the official evaluation sets target_net_j = q_net_j)
  np.testing.assert_allclose(chosen, np.asarray(z)[np.arange(5), np.argmax(np.asarray(q), 1)], rtol=1e-6)
  chex.assert_shape(single, (2,))
  np.testing.assert_allclose(no_q, one[:, 0], rtol=1e-6)       # no Q: one prior sample (latent BC)
  # the maze2d planner (official q_policy, plan_skills_diffusion_maze2d.py:57-87): N latents z1 at s, their
  # predicted end states, one latent z2 sampled at each, the best (s_H, z2) by min-Q; z2 is executed
  k1, k2 = jax.random.split(key)
  z1 = ldcq.sample_latents(k1, params, s, 7)
  s_end = vae.apply({"params": vp}, jnp.repeat(s, 7, 0), z1.reshape(35, 2), method=ldcq.SkillVAE.terminal)[0]
  z2 = np.asarray(ldcq.sample_latents(k2, params, s_end, 1)[:, 0]).reshape(5, 7, 2)
  q2 = np.min(np.asarray(ldcq.twin_q_apply(q_net, qp, s_end, z2.reshape(35, 2))), 0).reshape(5, 7)
  np.testing.assert_allclose(maze, z2[np.arange(5), np.argmax(q2, 1)], rtol=1e-5, atol=1e-6)
  # diffusion prior: DDPM samples of the requested shape through the diffusion core's sampler
  sd = _spec(vae, "diffusion", num_timesteps=10)

  @jax.jit
  def diff_samples(k):
    den_p = sd.denoiser.init(k, jnp.zeros((1, 2)), jnp.zeros((1,), jnp.int32), cond=jnp.zeros((1, 3)))["params"]
    return ldcq.sample_latents(k, ldcq.LDCQParams(vae=vp, diffusion=den_p, spec=sd), s, 3)

  chex.assert_shape(diff_samples(key), (5, 3, 2))


class _Walk:
  """A 1-D walk that ignores the action: position + 1 per step, reward 1 at positions goal .. goal + 2."""

  def __init__(self, goal):
    self.goal = goal
    self.spec = EnvSpec("walk", (3,), False, 2, -1.0, 1.0, max_episode_steps=20)

  def reset_core(self, key):
    del key
    return jnp.zeros(()), jnp.zeros(3)

  def step_core(self, key, core, action):
    del key, action
    pos = core + 1.0
    r = ((pos >= self.goal) & (pos <= self.goal + 2)).astype(jnp.float32)
    return pos, jnp.stack([pos, 0.0, 0.0]), r, jnp.zeros((), bool)


def test_maze_protocol_scores_time_to_goal_and_stops_there():
  """The official maze2d score (plan_skills_diffusion_maze2d.py:349-360): the episode stops at its first rewarded
  step t (0-based) and scores T - t, 0 if never rewarded; the 'return' score sums the reward of the whole episode.
  Goal 7: the 7th step (t = 6) reaches it, T = 20 gives 20 - 6 = 14; rewarded at positions 7, 8, 9: return 3."""
  vae = _tiny_vae()
  seg = _segments(jax.random.key(0), b=2)
  vp = jax.jit(vae.init)(jax.random.key(1), seg["states"], seg["actions"])["params"]
  _, qp = _q_setup(jax.random.key(2), z=4)
  agent = ldcq.LDCQParams(vae=vp, q=qp, q_target=qp, spec=_spec(vae, "gaussian"))
  bc = ldcq.BCPolicy(2, 8)
  bc_p = bc.init(jax.random.key(3), jnp.zeros((1, 3)))["params"]
  skills = jax.jit(lambda k, goal, planner, score: ldcq.evaluate_skills(
      k, agent, _Walk(goal), num_episodes=3, num_samples=4, exec_horizon=5, episode_steps=20, planner=planner,
      score=score), static_argnums=(2, 3))
  bc_run = jax.jit(lambda k, goal, score: ldcq.evaluate_bc(k, bc, bc_p, _Walk(goal), num_episodes=3,
                                                           episode_steps=20, score=score), static_argnums=2)
  rand_run = jax.jit(lambda k, goal, score: ldcq.evaluate_random(k, _Walk(goal), num_episodes=3, episode_steps=20,
                                                                 score=score), static_argnums=2)
  for goal, want_time, want_return in ((7.0, 14.0, 3.0), (50.0, 0.0, 0.0)):
    k, g = jax.random.key(4), jnp.float32(goal)
    np.testing.assert_allclose(skills(k, g, "maze", "time_to_goal"), [want_time] * 3)
    np.testing.assert_allclose(skills(k, g, "argmax", "return"), [want_return] * 3)
    np.testing.assert_allclose(bc_run(k, g, "time_to_goal"), [want_time] * 3)
    np.testing.assert_allclose(bc_run(k, g, "return"), [want_return] * 3)
    # the random floor is scored by the same protocol (the walk ignores actions, so the same numbers)
    np.testing.assert_allclose(rand_run(k, g, "time_to_goal"), [want_time] * 3)
    np.testing.assert_allclose(rand_run(k, g, "return"), [want_return] * 3)
  env = _Walk(7.0)
  with pytest.raises(ValueError, match="unknown LDCQ planner"):
    ldcq.evaluate_skills(jax.random.key(0), agent, env, num_episodes=1, num_samples=1, exec_horizon=1,
                         episode_steps=2, planner="beam")
  with pytest.raises(ValueError, match="unknown LDCQ evaluation score"):
    ldcq.evaluate_bc(jax.random.key(0), bc, bc_p, env, num_episodes=1, episode_steps=2, score="success")


class _ActionMeter:
  """Rewards the first action coordinate, plus 1000 for any coordinate outside [-2, 3] (a bounds alarm)."""

  spec = EnvSpec("meter", (2,), False, 3, -2.0, 3.0, max_episode_steps=400)

  def reset_core(self, key):
    return jax.random.uniform(key, ()), jnp.zeros(2)

  def step_core(self, key, core, action):
    del key
    out = jnp.any((action < -2.0) | (action > 3.0))
    return core, jnp.zeros(2), action[0] + 1000.0 * out, jnp.zeros((), bool)


def test_random_policy_draws_uniform_actions_in_the_spec_bounds():
  """evaluate_random: actions ~ U[-2, 3]^3 from env.spec (mean 0.5, variance 5^2 / 12 = 2.083); 8 episodes x 400
  steps = 3,200 draws of the first coordinate: the mean return per step is 0.5 +- sqrt(2.083 / 3200) = 0.0255 (a
  bound of 4 se = 0.102), and no draw leaves the bounds (one would add 1000 to an episode's return)."""
  env = _ActionMeter()
  ret = jax.jit(lambda k: ldcq.evaluate_random(k, env, num_episodes=8, score="return"))(jax.random.key(0))
  chex.assert_shape(ret, (8,))
  assert float(jnp.max(ret)) < 1000.0
  assert abs(float(jnp.sum(ret)) / 3200 - 0.5) < 4 * math.sqrt(25 / 12 / 3200)
  # a policy_fn sees this step's own key: two runs with different keys draw different actions
  other = jax.jit(lambda k: ldcq.evaluate_random(k, env, num_episodes=8, score="return"))(jax.random.key(1))
  assert not np.allclose(ret, other)
  discrete = _ActionMeter()
  discrete.spec = EnvSpec("meter", (2,), True, 3)
  with pytest.raises(ValueError, match="discrete action space"):
    ldcq.evaluate_random(jax.random.key(0), discrete, num_episodes=1)


@pytest.mark.slow
def test_diffusion_prior_recovers_a_conditional_mixture():
  """z | s=+1 is a 2-component mixture at (+-2, 0), z | s=-1 at (0, +-2) (std 0.15); trained with the library's
  loss on a schedule that reaches noise (cosine, T = 100), the DDPM samples must put their mass on the right
  condition's two modes in equal shares."""
  m = 4096
  rng = np.random.default_rng(0)
  s = rng.choice([-1.0, 1.0], m)
  comp = rng.choice([-2.0, 2.0], m)
  z = np.where(s[:, None] > 0, np.stack([comp, 0 * comp], 1), np.stack([0 * comp, comp], 1))
  z = (z + 0.15 * rng.normal(size=z.shape)).astype(np.float32)
  cond = np.stack([s, 0.5 * s], 1).astype(np.float32)
  vae = _tiny_vae(d=2, z=2)
  spec = _spec(vae, "diffusion", schedule="cosine", hidden=64)
  train = jax.jit(lambda k: ldcq.train_diffusion(k, spec, jnp.asarray(cond), jnp.asarray(z), num_steps=1500,
                                                 batch_size=256, learning_rate=2e-3))
  dp, hist = train(jax.random.key(0))
  assert float(np.mean(hist["loss"][-100:])) < float(np.mean(hist["loss"][:100]))
  params = ldcq.LDCQParams(vae=None, diffusion=dp, spec=spec)
  out = jax.jit(lambda k: ldcq.sample_latents(k, params, jnp.array([[1.0, 0.5], [-1.0, -0.5]]), 400))(
      jax.random.key(1))
  out = np.asarray(out)
  for i, modes in enumerate((np.array([[2.0, 0.0], [-2.0, 0.0]]), np.array([[0.0, 2.0], [0.0, -2.0]]))):
    d = np.linalg.norm(out[i][:, None] - modes[None], axis=-1)      # [400, 2]
    near = d.min(1) < 0.6
    assert near.mean() > 0.9, near.mean()                           # mass on this condition's modes
    share = np.mean(np.argmin(d[near], 1) == 0)
    assert 0.38 < share < 0.62, share                               # both modes, about equally


def test_bad_inputs_raise_clear_errors():
  vae = _tiny_vae()
  seg = _segments(jax.random.key(0), b=2)
  vp = vae.init(jax.random.key(1), seg["states"], seg["actions"])["params"]
  with pytest.raises(ValueError, match=r"states must be \[B, H, D\]"):
    ldcq.vae_loss(vp, vae, {"states": seg["states"][:, 0], "actions": seg["actions"]}, jax.random.key(0))
  with pytest.raises(ValueError, match="unknown LDCQ prior"):
    _spec(vae, "flow")
  params = ldcq.LDCQParams(vae=vp, spec=_spec(vae, "diffusion"))
  with pytest.raises(ValueError, match="no diffusion params"):
    ldcq.sample_latents(jax.random.key(0), params, jnp.zeros((2, 3)), 4)
  with pytest.raises(ValueError, match=r"\[D\] or \[B, D\]"):
    ldcq.sample_latents(jax.random.key(0), params, jnp.zeros((2, 2, 3)), 4)
  with pytest.raises(ValueError, match=r"next_latents must be \[B, K, Z\]"):
    q_net, tp = _q_setup(jax.random.key(0))
    ldcq.q_target(q_net, tp, jnp.zeros(2), jnp.zeros((2, 3)), jnp.zeros((2, 2)), jnp.zeros(2), discount=0.9)
  with pytest.raises(FileNotFoundError, match="config.data.path"):
    data_lib.load("maze/medium", "noisy", data_path="/nonexistent/maze2d.hdf5")
  from iclr24_jax.configs import ldcq as cfg
  with pytest.raises(ValueError, match="unknown variant"):
    cfg.get_config("huge")
