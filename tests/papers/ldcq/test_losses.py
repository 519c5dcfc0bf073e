"""LDCQ losses (`papers/ldcq/losses.py`) against closed forms and numpy: Gaussian log-prob and KL, the VAE loss
from the module's own heads, the min-SNR weighted latent diffusion loss, the batch-constrained double-Q target."""
import chex
import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.papers import ldcq
from .helpers import _q_setup, _segments, _tiny_vae


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


def test_vae_loss_against_a_numpy_composition_of_the_heads():
  """vae_loss recomposed in numpy from the module's own heads (official SkillModel.get_losses scaling):
  -mean_{b,t} sum_a log N(a; pi) + beta mean_b sum_z KL(q || p(z|s_0)) / H - mean_b sum_d log N(s_H; .) / H,
  with z = mean_q + std_q eps, eps the draw the loss makes from its key."""
  vae = _tiny_vae()
  batch = _segments(jax.random.key(10), b=6, h=5)
  params = jax.jit(vae.init)(jax.random.key(11), batch["states"][:2], batch["actions"][:2])["params"]
  key = jax.random.key(12)
  loss, m = jax.jit(lambda p: ldcq.vae_loss(p, vae, batch, key, beta=0.05))(params)

  def heads(p):
    ap = lambda method, *a: vae.apply({"params": p}, *a, method=method)  # noqa: E731
    mq, sq = ap(ldcq.SkillVAE.encode, batch["states"], batch["actions"])
    z = mq + sq * jax.random.normal(key, mq.shape)
    return (mq, sq, ap(ldcq.SkillVAE.policy, batch["states"], z[:, None], batch["actions"]),
            ap(ldcq.SkillVAE.prior, batch["states"][:, 0]), ap(ldcq.SkillVAE.terminal, batch["states"][:, 0], z))

  (mq, sq, (am, asd), (pm, ps), (tm, ts)) = jax.tree.map(lambda x: np.asarray(x, np.float64), jax.jit(heads)(params))
  acts, s_h = np.asarray(batch["actions"], np.float64), np.asarray(batch["next_state"], np.float64)
  log_n = lambda x, mu, sd: -0.5 * ((x - mu) / sd) ** 2 - np.log(sd) - 0.5 * np.log(2 * np.pi)  # noqa: E731
  h = 5
  action_nll = -np.mean(np.sum(log_n(acts, am, asd), -1))               # mean over B and H, sum over A
  kl = np.mean(np.sum(np.log(ps / sq) + (sq ** 2 + (mq - pm) ** 2) / (2 * ps ** 2) - 0.5, -1)) / h
  terminal_nll = -np.mean(np.sum(log_n(s_h, tm, ts), -1)) / h
  np.testing.assert_allclose(m["action_nll"], action_nll, rtol=1e-5)
  np.testing.assert_allclose(m["kl"], kl, rtol=1e-5)
  np.testing.assert_allclose(m["terminal_nll"], terminal_nll, rtol=1e-5)
  np.testing.assert_allclose(loss, action_nll + 0.05 * kl + terminal_nll, rtol=1e-5)


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
