"""Tests of LDCQ (iclr24_jax.papers.ldcq): losses against closed forms, the autoregressive policy's structure, the
batch-constrained double-Q target, the Q update, acting, the diffusion prior on a known mixture, the segment cutter,
errors on bad input, and a smoke run of experiment.run."""
import json
import math
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.diffusion.unet import MLPDenoiser
from iclr24_jax.papers import ldcq
from iclr24_jax.papers.ldcq import data as data_lib


def _tiny_vae(d=3, a=2, z=4):
  return ldcq.SkillVAE(d, a, z_dim=z, hidden=16, gru_layers=1)


def _segments(key, b=32, h=5, d=3, a=2):
  k1, k2, k3 = jax.random.split(key, 3)
  states = jax.random.normal(k1, (b, h, d))
  # actions a deterministic function of the state plus a per-segment offset (a learnable skill structure)
  offset = jax.random.normal(k2, (b, 1, a))
  actions = jnp.tanh(states[..., :a] + offset)
  return {"states": states, "actions": actions, "next_state": jax.random.normal(k3, (b, d))}


def test_gaussian_log_prob_and_kl_closed_form():
  # log N(1; 0, 1) = -0.5 (1 + log 2 pi) = -1.4189385
  np.testing.assert_allclose(ldcq.gaussian_log_prob(jnp.array(1.0), 0.0, 1.0), -1.4189385, rtol=1e-6)
  # KL(N(1, 0.5^2) || N(0, 1)) = log(1 / 0.5) + (0.25 + 1) / 2 - 0.5 = 0.6931472 + 0.625 - 0.5 = 0.8181472
  np.testing.assert_allclose(ldcq.gaussian_kl(jnp.array(1.0), 0.5, 0.0, 1.0), 0.8181472, rtol=1e-6)
  np.testing.assert_allclose(ldcq.gaussian_kl(jnp.array(0.3), 0.7, 0.3, 0.7), 0.0, atol=1e-7)


def test_vae_loss_terms_and_training_lowers_it():
  import optax
  from iclr24_jax.common.train_state import TrainState
  vae = _tiny_vae()
  batch = _segments(jax.random.key(0))
  params = jax.jit(vae.init)(jax.random.key(1), batch["states"][:2], batch["actions"][:2])["params"]
  key = jax.random.key(2)
  state = TrainState.create(params, optax.adam(3e-3))

  @jax.jit
  @chex.assert_max_traces(n=1)
  def step(st, k):
    (_, mm), g = jax.value_and_grad(ldcq.vae_loss, has_aux=True)(st.params, vae, batch, k, beta=0.05)
    return st.apply_gradients(g), mm

  # the loss is action NLL + beta KL + terminal NLL (KL and terminal NLL per step: divided by H)
  _, m = step(state, key)
  np.testing.assert_allclose(m["loss"], m["action_nll"] + 0.05 * m["kl"] + m["terminal_nll"], rtol=1e-6)
  assert float(m["kl"]) >= 0.0
  first = float(m["loss"])
  for i in range(60):     # train on the fixed batch: one trace, the loss falls
    state, m = step(state, jax.random.fold_in(key, i))
  _, m = step(state, key)
  assert float(m["loss"]) < first - 1.0, (first, float(m["loss"]))


def test_autoregressive_policy_structure():
  vae = _tiny_vae()
  batch = _segments(jax.random.key(3), b=4)
  params = jax.jit(vae.init)(jax.random.key(4), batch["states"][:2], batch["actions"][:2])["params"]
  s = batch["states"][:, 0]
  z = jax.random.normal(jax.random.key(5), (4, 4))
  a = batch["actions"][:, 0]
  pol = jax.jit(lambda acts: vae.apply({"params": params}, s, z, acts, method=ldcq.SkillVAE.policy)[0])
  m1 = pol(a)
  m2 = pol(a.at[:, 1].add(1.0))          # changing a_1 moves neither component (component i sees a_{<i})
  np.testing.assert_allclose(m1, m2, rtol=1e-6)
  m3 = pol(a.at[:, 0].add(1.0))          # changing a_0 moves the second component only
  np.testing.assert_allclose(m3[:, 0], m1[:, 0], rtol=1e-6)
  assert np.max(np.abs(np.asarray(m3[:, 1] - m1[:, 1]))) > 1e-4
  # deterministic sampling = the means, fed back dimension by dimension
  det = jax.jit(lambda k: ldcq.low_level_action(k, ldcq.LDCQParams(vae=params, spec=_spec(vae)), s, z, True))(
      jax.random.key(0))
  np.testing.assert_allclose(det, pol(det), rtol=1e-5, atol=1e-6)


def _spec(vae, prior="gaussian", schedule="linear", hidden=16, q_hidden=16, **kw):
  return ldcq.LDCQSpec(vae=vae, denoiser=MLPDenoiser(hidden=hidden, num_blocks=2, time_embed_dim=32),
                       q_net=ldcq.QNetwork(q_hidden, (16, 8)), prior=prior, schedule=schedule, **kw)


class _FixedDenoiser:
  """A denoiser 'module' returning a fixed function of (z_t, t, cond), for the hand-computed loss."""

  def apply(self, variables, z_t, t, cond):
    return 0.5 * z_t + 0.1 * cond[:, :z_t.shape[1]]


def test_latent_diffusion_loss_is_min_snr_weighted_x0_error():
  from iclr24_jax.diffusion import schedules
  sched = schedules.linear_beta_schedule(100, 1e-4, 0.02)
  s0 = jnp.array([[1.0, 2.0, 3.0], [0.5, -1.0, 0.0]])
  z = jnp.array([[0.3, -0.2], [1.0, 0.5]])
  key = jax.random.key(0)
  loss, aux = ldcq.latent_diffusion_loss(None, _FixedDenoiser(), sched, s0, z, key)
  # recompute with the same draws: t and eps from split(key)
  k_t, k_n = jax.random.split(key)
  t = sched.sample_time(k_t, (2,))
  eps = jax.random.normal(k_n, z.shape)
  ab = np.asarray(sched.alpha_bars)[np.asarray(t)]
  z_t = np.sqrt(ab)[:, None] * np.asarray(z) + np.sqrt(1 - ab)[:, None] * np.asarray(eps)
  pred = 0.5 * z_t + 0.1 * np.asarray(s0)[:, :2]
  w = np.minimum(ab / (1 - ab), 5.0)              # official min(SNR, 5) weight on the x0 error
  want = np.mean(w * np.mean((pred - np.asarray(z)) ** 2, axis=1))
  np.testing.assert_allclose(loss, want, rtol=1e-5)
  np.testing.assert_array_equal(aux["t"], t)


def test_official_linear_schedule_does_not_reach_noise():
  spec = _spec(_tiny_vae())
  ab_T = float(spec.make_schedule().alpha_bars[-1])
  # prod_t (1 - beta_t), beta linear 1e-4 .. 0.02 over 100 steps: exp(-sum beta) ~ exp(-1.005) ~ 0.366
  assert 0.35 < ab_T < 0.38
  assert float(_spec(_tiny_vae(), schedule="cosine").make_schedule().alpha_bars[-1]) < 1e-3


def _q_setup(key, d=3, z=2):
  q_net = ldcq.QNetwork(16, (16, 8))
  params = ldcq.twin_q_init(key, q_net, d, z)
  return q_net, params


def test_q_target_is_batch_constrained_double_q_with_gamma_h():
  q_net, tp = _q_setup(jax.random.key(0))
  b, k, zd = 6, 5, 2
  keys = jax.random.split(jax.random.key(1), 4)
  s_h = jax.random.normal(keys[0], (b, 3))
  lat = jax.random.normal(keys[1], (b, k, zd))
  r = jax.random.uniform(keys[2], (b,))
  done = jnp.array([0, 0, 1, 0, 1, 0], jnp.float32)
  disc = 0.99 ** 10
  target_fn = jax.jit(lambda lt: ldcq.q_target(q_net, tp, r, s_h, lt, done, discount=disc))
  out = target_fn(lat)
  # brute force over the sampled latents only: every (net, latent) pair evaluated on its own
  q_one = jax.jit(lambda p, zz: q_net.apply({"params": p}, s_h, zz))
  q = np.stack([np.stack([np.asarray(q_one(jax.tree.map(lambda x: x[j], tp), lat[:, i])) for i in range(k)], 1)
                for j in range(2)])  # [2, B, K]
  for j in range(2):
    idx = np.argmax(q[1 - j], axis=1)                         # the other target net picks z*
    val = np.minimum(q[0], q[1])[np.arange(b), idx]          # the min of both values it
    want = np.asarray(r) + disc * (1 - np.asarray(done)) * val
    np.testing.assert_allclose(out["targets"][j], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["z_star"][j], np.asarray(lat)[np.arange(b), idx], rtol=1e-6)
  # done segments bootstrap nothing: y = r exactly
  np.testing.assert_allclose(out["targets"][:, done > 0], np.broadcast_to(r[done > 0], (2, 2)), rtol=1e-6)
  # batch constraint: over a dense grid of latents (outside the sampled set) the selecting nets find higher values;
  # the target never uses them: its z* is always one of the sampled latents (checked above)
  grid = jnp.stack(jnp.meshgrid(jnp.linspace(-6, 6, 41), jnp.linspace(-6, 6, 41)), -1).reshape(-1, zd)
  big = jax.jit(lambda lt: ldcq.q_target(q_net, tp, r, s_h, lt, done, discount=disc))(
      jnp.broadcast_to(grid, (b,) + grid.shape))
  sel_grid = np.asarray(big["q_next"]).max(-1)
  sel_samp = np.asarray(out["q_next"]).max(-1)
  assert np.all(sel_grid >= sel_samp - 1e-6) and np.any(sel_grid > sel_samp + 1e-3)


def _q_data(key, m=64, d=3, zd=2, k=6):
  ks = jax.random.split(key, 5)
  s0 = jax.random.normal(ks[0], (m, d))
  return {"s0": s0, "z": jax.random.normal(ks[1], (m, zd)), "reward": jnp.tanh(s0[:, 0]),
          "next_state": jax.random.normal(ks[2], (m, d)), "done": jnp.zeros((m,)),
          "next_latents": jax.random.normal(ks[3], (m, k, zd))}


def test_q_train_step_fits_targets_updates_priorities_and_polyak():
  q_net, _ = _q_setup(jax.random.key(0))
  data = _q_data(jax.random.key(1))
  # tau = 0: the target nets stay fixed, so the update is a regression that must lower its loss
  cfg = ldcq.QConfig(q_net, discount=0.9, batch_size=32, num_target_samples=4, tau=0.0, steps_per_epoch=2)
  state = jax.jit(lambda k: ldcq.q_init(k, cfg, ldcq.make_buffer(data), 3, 2, learning_rate=3e-3))(
      jax.random.key(2))
  p0 = np.asarray(state.extra["buffer"].priorities())
  np.testing.assert_allclose(p0, 1.0)                      # every item enters at priority 1 (p^alpha = 1)

  @jax.jit
  @chex.assert_max_traces(n=1)
  def step(st, k):
    return ldcq.q_train_step(st, None, k, cfg=cfg)

  losses = []
  for i in range(150):
    state, m = step(state, jax.random.key(3))
    losses.append(float(m["loss"]))
  assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10]), (losses[:3], losses[-3:])
  p1 = np.asarray(state.extra["buffer"].priorities())
  assert not np.allclose(p1, 1.0) and np.all(p1 > 0)       # priorities now track the squared TD errors
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


def test_sample_latents_and_act_pick_the_best_sampled_latent():
  vae = _tiny_vae(z=2)
  seg = _segments(jax.random.key(0), b=2)
  vp = jax.jit(vae.init)(jax.random.key(1), seg["states"], seg["actions"])["params"]
  spec = _spec(vae, "gaussian")
  q_net, qp = _q_setup(jax.random.key(2))
  params = ldcq.LDCQParams(vae=vp, q=qp, q_target=qp, spec=spec)
  s = jax.random.normal(jax.random.key(3), (5, 3))
  key = jax.random.key(4)

  @jax.jit
  def run(p, st):
    z = ldcq.sample_latents(key, p, st, 7)
    return (z, ldcq.act(key, p, st, 7), ldcq.q_values(p, st, z), ldcq.act(key, p, st[0], 7),
            ldcq.act(key, p.replace(q=None, q_target=None), st, 7))

  z, chosen, q, single, no_q = run(params, s)
  chex.assert_shape(z, (5, 7, 2))
  np.testing.assert_allclose(chosen, np.asarray(z)[np.arange(5), np.argmax(np.asarray(q), 1)], rtol=1e-6)
  chex.assert_shape(single, (2,))
  np.testing.assert_allclose(no_q, z[:, 0], rtol=1e-6)       # no Q: latent BC takes the first sample
  # diffusion prior: DDPM samples of the requested shape through the diffusion core's sampler
  sd = _spec(vae, "diffusion", num_timesteps=10)

  @jax.jit
  def diff_samples(k):
    den_p = sd.denoiser.init(k, jnp.zeros((1, 2)), jnp.zeros((1,), jnp.int32), cond=jnp.zeros((1, 3)))["params"]
    return ldcq.sample_latents(k, ldcq.LDCQParams(vae=vp, diffusion=den_p, spec=sd), s, 3)

  chex.assert_shape(diff_samples(key), (5, 3, 2))


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


def test_segments_respect_episode_ends():
  n = 12
  ds = {"observations": np.arange(n, dtype=np.float32)[:, None].repeat(2, 1),
        "actions": np.ones((n, 2), np.float32), "rewards": np.arange(n, dtype=np.float32),
        "next_observations": np.arange(1, n + 1, dtype=np.float32)[:, None].repeat(2, 1),
        "terminals": np.zeros(n, bool), "timeouts": np.zeros(n, bool)}
  ds["timeouts"][4] = True
  ds["terminals"][9] = True
  ds["timeouts"][11] = True
  # windows t..t+2 with no episode end at rows t, t+1 (an end at the last row is allowed)
  np.testing.assert_array_equal(data_lib.segment_starts(ds, 3), [0, 1, 2, 5, 6, 7])
  seg = data_lib.make_segments(ds, 3, gamma=0.5)
  chex.assert_shape(seg["states"], (6, 3, 2))
  # reward_sum of the window at 7: 7 + 0.5 * 8 + 0.25 * 9 = 13.25; it ends in the terminal at row 9
  np.testing.assert_allclose(seg["reward_sum"][-1], 13.25)
  np.testing.assert_array_equal(seg["done"], [0, 0, 0, 0, 0, 1])
  np.testing.assert_allclose(seg["next_state"][:, 0], [3, 4, 5, 8, 9, 10])  # s_H = next obs of the last row
  # maze relabelling: reward 1 within the radius of the evaluation goal
  rel = data_lib.relabel_maze_rewards(ds, goal=[5.0, 5.0], goal_radius=0.5)
  np.testing.assert_array_equal(np.nonzero(rel["rewards"])[0], [4])


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


def test_experiment_run_tiny(tmp_path):
  from iclr24_jax.configs import ldcq as cfg
  from iclr24_jax.papers.ldcq import experiment
  c = cfg.get_config("tiny")
  c.methods = ("ldcq",)
  res = experiment.run(c, str(tmp_path))
  saved = json.loads((tmp_path / "results.json").read_text())
  assert set(saved["methods"]) == {"ldcq"}
  assert math.isfinite(saved["methods"]["ldcq"]["score_mean"])
  assert len(saved["sliced_w2_heldout"]["diffusion"]) == 1
  assert all(os.path.exists(p) for p in res["plots"])
  assert (tmp_path / "metrics.jsonl").exists()
