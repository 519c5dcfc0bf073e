"""Tests for DA-CLIP (iclr24_jax.papers.daclip): IR-SDE closed forms vs simulation and the bridge posterior,
the controller's zero-init identity, the losses, the degradation suite, and a tiny end-to-end run."""
import math
import os

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from iclr24_jax.common.train_state import TrainState
from iclr24_jax.papers import daclip
from iclr24_jax.vision import clip


@pytest.fixture(scope="module")
def sde():
  return daclip.irsde_schedule(T=100, lambda_=50.0, eps=0.005)


def test_schedule_matches_official_definitions(sde):
  # lambda = 50 / 255 (values >= 1 are 8-bit units); dt chosen so that exp(-theta_bar_T dt) = 0.005.
  np.testing.assert_allclose(float(sde.lambda_), 50 / 255, rtol=1e-6)
  np.testing.assert_allclose(float(daclip.irsde.mean_factor(100, sde)), 0.005, rtol=1e-5)
  assert float(sde.thetas_cumsum[0]) == 0.0 and float(sde.sigma_bars[0]) == 0.0
  # sigma_t^2 = 2 lambda^2 theta_t, and the terminal std is lambda sqrt(1 - 0.005^2).
  np.testing.assert_allclose(np.asarray(sde.sigmas) ** 2, 2 * (50 / 255) ** 2 * np.asarray(sde.thetas), rtol=1e-5)
  np.testing.assert_allclose(float(sde.sigma_bars[-1]), 50 / 255 * math.sqrt(1 - 0.005 ** 2), rtol=1e-5)
  # Cosine thetas, by hand for T = 1: n = 3, abar(x) = cos(((x / 3) + s) / (1 + s) pi / 2)^2 / abar(0),
  # thetas = 1 - abar(1), 1 - abar(2).
  s = 0.008
  f = lambda x: math.cos(((x / 3) + s) / (1 + s) * math.pi / 2) ** 2  # noqa: E731
  np.testing.assert_allclose(np.asarray(daclip.irsde.cosine_thetas(1)), [1 - f(1) / f(0), 1 - f(2) / f(0)],
                             rtol=1e-5)
  with pytest.raises(ValueError, match="eps"):
    daclip.irsde_schedule(eps=0.0)
  with pytest.raises(ValueError, match="schedule"):
    daclip.irsde_schedule(schedule="sigmoid")


def test_forward_marginal_matches_monte_carlo_simulation(sde):
  """Simulates dx = theta_t (mu - x) dt + sigma_t dW with 20 Euler-Maruyama sub-steps per interval (theta is
  piecewise constant on each interval, as the closed form assumes) for 20,000 paths and compares mean and
  variance at t = 10, 50, 100 with m_t and v_t of Eq. (5)."""
  x0, mu, n_paths, sub = 0.9, 0.2, 20000, 20
  key = jax.random.key(0)

  @jax.jit
  def simulate(key):
    def interval(x, inp):
      t, k = inp
      h = sde.dt / sub

      def substep(x, kk):
        dw = jnp.sqrt(h) * jax.random.normal(kk, x.shape)
        return x + sde.thetas[t] * (mu - x) * h + sde.sigmas[t] * dw, None

      x, _ = jax.lax.scan(substep, x, jax.random.split(k, sub))
      return x, x

    ts = jnp.arange(1, 101)
    _, xs = jax.lax.scan(interval, jnp.full((n_paths,), x0), (ts, jax.random.split(key, 100)))
    return xs                                                               # [100, n_paths], xs[t-1] = x_t

  xs = np.asarray(simulate(key), np.float64)
  for t in (10, 50, 100):
    m = float(daclip.irsde_mean(jnp.asarray(x0), jnp.asarray(mu), t, sde))
    sd = float(daclip.irsde_std(t, sde))
    emp_m, emp_v = xs[t - 1].mean(), xs[t - 1].var()
    # Monte-Carlo standard errors: sd / sqrt(n) for the mean, v sqrt(2 / n) for the variance; 4 se + 1%
    # for the Euler sub-step bias (theta dt / 20 <= 0.005 per sub-step).
    assert abs(emp_m - m) < 4 * sd / math.sqrt(n_paths) + 0.01 * abs(x0 - mu), (t, emp_m, m)
    assert abs(emp_v - sd ** 2) < 4 * sd ** 2 * math.sqrt(2 / n_paths) + 0.01 * sd ** 2, (t, emp_v, sd ** 2)
  # The closed-form sampler draws from the same marginal.
  draws = np.asarray(daclip.irsde_forward_sample(jax.random.key(1), jnp.full((n_paths,), x0), jnp.full((n_paths,), mu),
                                                 50, sde))
  assert abs(draws.mean() - xs[49].mean()) < 6 * float(sde.sigma_bars[50]) / math.sqrt(n_paths)


def test_optimal_reverse_step_is_the_gaussian_bridge_posterior(sde):
  """x*_{t-1} and its std equal the posterior of x_{t-1} given (x_t, x0) obtained by conditioning the joint
  Gaussian of (x_{t-1}, x_t) | x0: x_{t-1} ~ N(m_{t-1}, v_{t-1}), x_t = mu + A (x_{t-1} - mu) + N(0, lam^2 (1 - A^2)),
  A = exp(-theta_t dt). Posterior mean m_{t-1} + Cov / Var(x_t) (x_t - m_t), var v_{t-1} - Cov^2 / Var(x_t)."""
  lam2 = float(sde.lambda_) ** 2
  dt = float(sde.dt)
  rng = np.random.default_rng(0)
  x0, mu, xt = rng.normal(size=(3, 8))
  for t in (1, 2, 37, 100):
    a = math.exp(-float(sde.thetas[t]) * dt)
    m_prev = mu + (x0 - mu) * math.exp(-float(sde.thetas_cumsum[t - 1]) * dt)
    v_prev = lam2 * (1 - math.exp(-2 * float(sde.thetas_cumsum[t - 1]) * dt))
    m_t = mu + a * (m_prev - mu)
    var_t = a * a * v_prev + lam2 * (1 - a * a)
    cov = a * v_prev
    post_mean = m_prev + cov / var_t * (xt - m_t)
    post_var = v_prev - cov ** 2 / var_t
    got = daclip.optimal_reverse_step(jnp.asarray(xt), jnp.asarray(x0), jnp.asarray(mu), t, sde)
    np.testing.assert_allclose(np.asarray(got), post_mean, rtol=2e-4, atol=2e-5)
    if t > 1:   # at t = 1 the posterior is a point mass (v_0 = 0); the official floor keeps it tiny
      np.testing.assert_allclose(float(daclip.optimal_reverse_std(t, sde)) ** 2, post_var, rtol=2e-3)
  # Its marginal var also matches the simulation variance v_t = lam^2 (1 - B^2) at t.
  np.testing.assert_allclose(var_t, float(sde.sigma_bars[100]) ** 2, rtol=1e-4)
  # Per-sample times broadcast: [B] t against [B, H, W, C] images.
  x = jnp.ones((2, 4, 4, 1))
  out = daclip.optimal_reverse_step(x, 0 * x, 0.5 * x, jnp.asarray([1, 100]), sde)
  chex.assert_shape(out, (2, 4, 4, 1))


def test_perfect_noise_makes_the_matching_loss_zero_at_the_first_step(sde):
  # At t = 1 the optimal step returns x0 exactly (C = 1); x0_from_noise with the true noise recovers x0 at any t.
  rng = np.random.default_rng(1)
  x0, mu, z = (jnp.asarray(rng.random((2, 4, 4, 1)), jnp.float32) for _ in range(3))
  t = jnp.asarray([1, 60])
  xt = daclip.irsde_mean(x0, mu, t, sde) + sde.sigma_bars[t][:, None, None, None] * z
  np.testing.assert_allclose(np.asarray(daclip.x0_from_noise(xt, z, mu, t, sde)), np.asarray(x0), atol=2e-4)
  np.testing.assert_allclose(np.asarray(daclip.optimal_reverse_step(xt, x0, mu, 1, sde))[0], np.asarray(x0)[0],
                             atol=1e-5)
  # The L1 matching loss is |reverse_sde_mean - x*| averaged; with the true noise it is the Euler error of
  # one step only: small next to the loss of a zero prediction.
  true_loss = float(daclip.matching_loss(z, xt, x0, mu, t, sde))
  zero_loss = float(daclip.matching_loss(jnp.zeros_like(z), xt, x0, mu, t, sde))
  assert true_loss < 0.2 * zero_loss


def _tiny_clip():
  cfg = ml_collections.ConfigDict(dict(embed_dim=8, image=dict(name="vit", patch_size=4, width=16, depth=3, heads=2),
                                       text=dict(name="transformer", max_len=6, width=16, depth=1, heads=2)))
  model = clip.create_clip(cfg, 12)
  params = model.init(jax.random.key(0), jnp.zeros((2, 8, 8, 1)), jnp.ones((2, 6), jnp.int32))["params"]
  return model, params


def test_zero_init_controller_gives_the_frozen_encoder_output():
  clip_model, clip_params = _tiny_clip()
  model = daclip.daclip_from_clip(clip_model)
  params = daclip.init_daclip_params(model, clip_params, (8, 8, 1))
  x = jnp.asarray(np.random.default_rng(0).random((3, 8, 8, 1)), jnp.float32)
  e_c, e_d = jax.jit(model.apply)({"params": params}, x)
  chex.assert_shape([e_c, e_d], (3, 8))
  frozen = jax.jit(lambda p, x: clip_model.apply({"params": p}, x, method=clip.CLIP.encode_image,
                                                 normalize=False))(clip_params, x)
  np.testing.assert_allclose(np.asarray(e_c), np.asarray(frozen), rtol=1e-6, atol=1e-7)   # zero controls
  np.testing.assert_allclose(np.asarray(e_d), np.asarray(frozen), rtol=1e-6, atol=1e-7)   # an exact copy at init
  # Non-zero projections change e_c; only the controller side gets gradients (the encoder is frozen).
  batch = {"image": x, "caption_emb": clip.l2_normalize(jnp.eye(3, 8)),
           "degradation_emb": clip.l2_normalize(jnp.eye(3, 8)[::-1])}
  grads = jax.jit(jax.grad(lambda p: daclip.controller_loss(p, model, batch)[0]))(params)
  assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree_util.tree_leaves(grads["encoder"]))
  assert float(jnp.abs(grads["control_proj_0"]["kernel"]).max()) > 0
  with pytest.raises(ValueError, match="ViT"):
    daclip.daclip_from_clip(clip.create_clip(ml_collections.ConfigDict(dict(
        embed_dim=8, image=dict(name="cnn", features=(4,), dense=8), text=dict(name="transformer"))), 12))


def test_controls_are_added_in_reversed_block_order():
  """The controller's block-i control goes after frozen block L-1-i (official `control.pop()`): with only the
  last projection non-zero, the frozen encoder's first block is the one that sees it."""
  clip_model, clip_params = _tiny_clip()
  model = daclip.daclip_from_clip(clip_model)
  params = daclip.init_daclip_params(model, clip_params, (8, 8, 1))
  params["control_proj_2"] = {"kernel": jnp.zeros((16, 16)), "bias": jnp.ones((16,))}    # control = +1 everywhere
  x = jnp.asarray(np.random.default_rng(0).random((2, 8, 8, 1)), jnp.float32)
  e_c, _ = model.apply({"params": params}, x)
  vit = clip_model.image_encoder
  ones = jnp.ones((2, 5, 16))
  want = vit.apply({"params": clip_params["image_encoder"]}, x, controls=[ones, 0 * ones, 0 * ones])
  np.testing.assert_allclose(np.asarray(e_c), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_controller_loss_by_hand_and_train_step_lowers_it():
  clip_model, clip_params = _tiny_clip()
  model = daclip.daclip_from_clip(clip_model)
  params = daclip.init_daclip_params(model, clip_params, (8, 8, 1))
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.random((8, 8, 8, 1)), jnp.float32)
  cap = clip.l2_normalize(jnp.asarray(rng.normal(size=(8, 8)), jnp.float32))
  deg = clip.l2_normalize(jnp.asarray(rng.normal(size=(8, 8)), jnp.float32))
  batch = {"image": x, "caption_emb": cap, "degradation_emb": deg}
  loss, m = daclip.controller_loss(params, model, batch)
  e_c, e_d = model.apply({"params": params}, x)
  scale = math.exp(float(params["logit_scale"]))
  want = clip.clip_loss(clip.l2_normalize(e_c), cap, scale) + clip.clip_loss(clip.l2_normalize(e_d), deg, scale)
  np.testing.assert_allclose(float(loss), float(want), atol=1e-5)
  np.testing.assert_allclose(float(m["content_loss"] + m["degradation_loss"]), float(loss), atol=1e-5)
  opt = ml_collections.ConfigDict(dict(learning_rate=3e-3, schedule="constant", weight_decay=0.0))
  state = TrainState.create(params, daclip.make_controller_optimizer(opt, 20, params))
  step = jax.jit(chex.assert_max_traces(daclip.make_controller_train_step(model), n=1))
  losses = []
  for _ in range(6):
    state, metrics = step(state, batch, jax.random.key(0))
    losses.append(float(metrics["loss"]))
  assert losses[-1] < losses[0]
  chex.assert_trees_all_equal(state.params["encoder"], params["encoder"])        # frozen: bit-identical
  with pytest.raises(KeyError, match="degradation_emb"):
    daclip.controller_loss(params, model, {"image": x, "caption_emb": cap})


def test_degradation_suite_is_deterministic_and_named():
  x, _ = daclip.load_clean_digits(dataset="digits", size=16)
  chex.assert_shape(x, (1797, 16, 16, 1))
  assert len(daclip.DEGRADATIONS) >= 6
  suite = daclip.make_suite(x[:21], seed=3, types=np.arange(21) % 7)
  again = daclip.make_suite(x[:21], seed=3, types=np.arange(21) % 7)
  np.testing.assert_array_equal(suite["lq"], again["lq"])
  assert suite["lq"].min() >= 0 and suite["lq"].max() <= 1 and suite["lq"].dtype == np.float32
  gt, lq = suite["gt"], suite["lq"]
  # hazy: x t + A (1 - t) with t <= 0.6, A >= 0.7 lifts the black background to >= 0.28.
  assert lq[1].min() >= 0.7 * 0.4 - 1e-6
  # low-light: at most 0.35 of the peak.
  assert lq[3].max() <= 0.35 + 1e-6
  # uncompleted: some pixels set to exactly 1 that were not.
  assert np.any((lq[6] == 1.0) & (gt[6] < 1.0))
  # every type changes the image
  assert all(np.abs(lq[i] - gt[i]).mean() > 1e-3 for i in range(7))
  assert daclip.degradation_captions([0, 4]) == ["motion-blurry", "noisy"]
  with pytest.raises(ValueError, match="unknown degradation"):
    daclip.degrade_one(x[0], "foggy", np.random.default_rng(0))
  with pytest.raises(ValueError, match="one degradation per image"):
    daclip.degrade(x[:3], [0, 1])


def test_restore_shapes_and_errors(sde):
  net = daclip.create_restorer(ml_collections.ConfigDict(dict(base_channels=8, channel_mults=(1,),
                                                              num_res_blocks=1, attention_levels=(0,), num_heads=2,
                                                              out_channels=1, num_groups=4)))
  x = jnp.zeros((2, 8, 8, 1))
  e = jnp.zeros((2, 8))
  params = net.init(jax.random.key(0), jnp.zeros((2, 8, 8, 2)), jnp.ones((2,)), cond=e, context=e[:, None])["params"]
  small = daclip.irsde_schedule(T=3)
  out = jax.jit(lambda k, p, lq, c, d: daclip.restore(k, p, lq, model=net, schedule=small, e_c=c, e_d=d))(
      jax.random.key(0), params, x + 0.5, e, e)
  chex.assert_shape(out, (2, 8, 8, 1))
  assert np.isfinite(np.asarray(out)).all()
  with pytest.raises(ValueError, match="e_c must be"):
    daclip.restore(jax.random.key(0), params, x, model=net, schedule=small, e_c=jnp.zeros((3, 8)), e_d=e)
  with pytest.raises(ValueError, match="method"):
    daclip.restore(jax.random.key(0), params, x, model=net, schedule=small, method="ode")


@pytest.mark.slow   # ~70 s CPU: ten small programs to compile (CLIP, controller, embeddings, UNet train, sampling)
def test_experiment_run_tiny(tmp_path):
  """Smoke run of the whole pipeline with the tiny config: files written, numbers in range, paired models."""
  from iclr24_jax.configs import daclip as cfg_mod
  from iclr24_jax.papers.daclip import experiment
  cfg = cfg_mod.get_config("tiny")
  res = experiment.run(cfg, str(tmp_path), progress=False)
  for name in ("results.json", "restorations.png", "psnr_by_degradation.png", "heldout_loss.png",
               "clip/metrics.jsonl", "controller/metrics.jsonl", "controller_s2/metrics.jsonl",
               "restorer_oracle_s1/metrics.jsonl", "restorer_none_s0/checkpoints"):
    assert (tmp_path / name).exists(), name
  assert set(res["accuracy"]) == {"ed_zero_shot", "frozen_zero_shot", "frozen_linear_probe", "content_ec",
                                  "content_frozen"}
  assert len(res["accuracy_items_by_seed"]["ed_zero_shot"]) == cfg.controller.seeds
  rest = res["restoration"]
  assert rest["heldout_steps"] == list(range(1, cfg.num_steps + 1))          # log_every = 1: one point a step
  for c in cfg.conditions:
    loss = rest["heldout_loss"][c]
    assert len(loss["per_seed"]) == cfg.num_seeds and len(loss["per_image"]) == res["num_test"]
    np.testing.assert_allclose(np.mean(loss["per_seed"]), np.mean(loss["per_image"]), rtol=1e-5)
    assert len(rest["single_sample"][c]["psnr"]) == cfg.num_seeds
  assert all(0.0 <= v <= 1.0 for v in res["accuracy"].values())
  assert len(res["accuracy_items"]["ed_zero_shot"]) == res["num_test"] == 7 * cfg.data.test_per_type
  per = res["restoration"]["per_condition"]
  assert set(per) == set(cfg.conditions)
  for c in cfg.conditions:
    assert len(per[c]["psnr"]) == cfg.num_seeds and np.isfinite(per[c]["psnr"]).all()
    assert all(-1.0 <= v <= 1.0 for v in per[c]["ssim"])
  with pytest.raises(ValueError, match="unknown variant"):
    cfg_mod.get_config("huge")
  bad = cfg_mod.get_config("tiny")
  bad.restore_conditions = ("daclip", "unconditioned")
  with pytest.raises(ValueError, match="restore_conditions"):
    experiment.run(bad, str(tmp_path / "bad"), progress=False)


@pytest.mark.parametrize("method", ["sde", "posterior"])
def test_reverse_sample_with_the_true_noise_restores_the_clean_image(method):
  # The reference that rules out a sampler bug behind a weak restoration row: feed reverse_sample the exact noise
  # of x_t given the clean image, eps_t = (x_t - m_t(x0, mu)) / sigma_bar_t; the reverse IR-SDE must then end at
  # x0 from x_T = mu + lambda z, up to the Euler error of 100 steps (the official schedule and lambda).
  sched = daclip.irsde_schedule(T=100, lambda_=50.0 / 255.0, eps=0.005)
  rng = np.random.default_rng(3)
  x0 = jnp.asarray(rng.random((4, 8, 8, 1)), jnp.float32)
  mu = jnp.clip(x0 + 0.3 * jnp.asarray(rng.standard_normal((4, 8, 8, 1)), jnp.float32), 0.0, 1.0)  # "degraded"

  def oracle(params, x_t, mu_, t):
    sig = sched.sigma_bars[t][:, None, None, None]
    return (x_t - daclip.irsde_mean(x0, mu_, t, sched)) / jnp.maximum(sig, 1e-12)

  out = jax.jit(lambda k: daclip.reverse_sample(k, None, mu, noise_fn=oracle, schedule=sched, method=method))(
      jax.random.key(0))
  rms_out = float(jnp.sqrt(jnp.mean((out - x0) ** 2)))
  rms_in = float(jnp.sqrt(jnp.mean((mu - x0) ** 2)))
  assert rms_in > 0.2
  assert rms_out < 0.03, (rms_out, rms_in)


def _gaussian_chain_std(sched, s, method, scale=1.0):
  """Exact output std of the reverse chain for Gaussian data x0 ~ N(mu, s^2) with the exact noise prediction
  eps_hat = scale sqrt(v_t) (x_t - mu) / (B_t^2 s^2 + v_t), B_t = exp(-theta_bar_t dt), v_t = sigma_bar_t^2: every
  step is linear, y_{t-1} = g_t y_t + sd_t n (y = x - mu), so Var_{t-1} = g_t^2 Var_t + sd_t^2, from Var_T =
  lambda^2. numpy, float64, from the official formulas (sde_utils.py: reverse_sde_step, reverse_posterior_step =
  get_init_state_from_noise + reverse_optimum_step + reverse_optimum_std)."""
  th, thb = np.asarray(sched.thetas, np.float64), np.asarray(sched.thetas_cumsum, np.float64)
  sig, sb, dt, lam = np.asarray(sched.sigmas, np.float64), np.asarray(sched.sigma_bars, np.float64), sched.dt, \
      sched.lambda_
  var = lam ** 2
  for t in range(sched.num_steps, 0, -1):
    b, v = np.exp(-thb[t] * dt), sb[t] ** 2
    k = scale * np.sqrt(v) / (b ** 2 * s ** 2 + v)                     # eps_hat = k y
    if method == "sde":          # x - (theta (mu - x) - sigma^2 score) dt - sigma sqrt(dt) n, score = -eps / sqrt(v)
      g, sd2 = 1 + th[t] * dt - sig[t] ** 2 * k / np.sqrt(v) * dt, sig[t] ** 2 * dt
    else:                        # x0_hat - mu = (1 - sqrt(v) k) e^{theta_bar dt} y, then the bridge posterior
      a, c = np.exp(-th[t] * dt), np.exp(-thb[t - 1] * dt)
      x0k = (1 - np.sqrt(v) * k) * np.exp(thb[t] * dt)
      g = a * (1 - c ** 2) / (1 - b ** 2) + c * (1 - a ** 2) / (1 - b ** 2) * x0k
      sd2 = max((1 - a ** 2) * (1 - c ** 2) / (1 - b ** 2), 1e-20 * dt) * lam ** 2
    var = g ** 2 * var + sd2
  return float(np.sqrt(var))


@pytest.mark.parametrize("method,tol", [("sde", 0.03), ("posterior", 0.06)])
def test_reverse_chain_returns_the_spread_of_a_gaussian_posterior(method, tol):
  """Known x0 = mu + s z (s = 0.1): with the exact noise prediction the reverse chain must end at spread s, and a
  score off by x0.8 / x1.2 must not (the true-noise test above cannot see such a scale error). At the official
  T = 100 the chains' exact spreads are 1.021 s (Euler-Maruyama) and 0.953 s (posterior: the x0 estimate's own
  uncertainty is dropped at every step); both reach s as T grows (1.002 / 0.995 at T = 1000, checked here)."""
  sched = daclip.irsde_schedule(T=100, lambda_=50.0 / 255.0, eps=0.005)
  s, n = 0.1, 20000
  mu = jnp.full((n, 1), 0.5)

  def oracle(params, x_t, mu_, t):
    b = jnp.exp(-sched.thetas_cumsum[t] * sched.dt)[:, None]
    v = sched.sigma_bars[t][:, None] ** 2
    return params * jnp.sqrt(v) * (x_t - mu_) / (b ** 2 * s ** 2 + v)    # params: the score-scale error

  run = jax.jit(lambda k, scale: daclip.reverse_sample(k, scale, mu, noise_fn=oracle, schedule=sched, method=method))
  exact = _gaussian_chain_std(sched, s, method)
  assert abs(exact / s - 1) < tol
  assert abs(_gaussian_chain_std(daclip.irsde_schedule(T=1000, lambda_=50.0 / 255.0, eps=0.005), s, method) / s
             - 1) < 0.01
  out = np.asarray(run(jax.random.key(0), 1.0))
  np.testing.assert_allclose(out.std(), exact, rtol=0.02)              # the chain is the official math (SE 0.5%)
  assert abs(out.mean() - 0.5) < 3 * s / np.sqrt(n) * 3
  assert abs(out.std() / s - 1) < tol                                  # spread s
  for scale in (0.8, 1.2):
    wrong = np.asarray(run(jax.random.key(0), scale)).std()
    np.testing.assert_allclose(wrong, _gaussian_chain_std(sched, s, method, scale), rtol=0.02)
    assert abs(wrong / s - 1) > 2 * tol, (scale, wrong / s)            # a scale error fails the spread check


def test_chunk_runner_host_loop_equals_scan():
  """The CPU host loop and the accelerator lax.scan run the same steps with the same keys (a conv step)."""
  import flax.linen as nn
  import optax
  from iclr24_jax.papers.daclip import train as train_lib

  net = nn.Conv(4, (3, 3))
  tx = optax.adam(1e-2)
  x_all = jax.random.normal(jax.random.key(0), (32, 8, 8, 2))
  params = net.init(jax.random.key(1), x_all[:1])["params"]
  state0 = TrainState.create(params, tx)

  def step(state, batch, key):
    def loss(p):
      out = net.apply({"params": p}, batch)
      return jnp.mean((out - jax.random.normal(key, out.shape)) ** 2)
    val, g = jax.value_and_grad(loss)(state.params)
    return state.apply_gradients(g), {"loss": val}

  def sample(d, k):
    return d["x"][jax.random.randint(k, (4,), 0, d["x"].shape[0])]

  key = jax.random.key(2)
  data = {"x": x_all}
  out = {}
  for scan in (True, False):
    run = train_lib.chunk_runner(step, sample, key, scan=scan)
    st, m1 = run(state0, data, 0, 3)
    st, m2 = run(st, data, 3, 2)
    out[scan] = (st.params, m1["loss"], m2["loss"], int(st.step))
  chex.assert_trees_all_close(out[True][0], out[False][0], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose([out[True][1], out[True][2]], [out[False][1], out[False][2]], rtol=1e-5)
  assert out[True][3] == out[False][3] == 5


def test_mean_of_posterior_chains_keeps_a_quarter_of_the_posterior_variance():
  """x0 = mu + s z with the exact noise prediction: one posterior chain ends at spread `exact` (~0.953 s, the
  numpy recursion above) around mu; the mean of K = 4 independent chains must spread exact / 2 (its variance is
  1 / K of one chain's), and it must equal the mean of the K chains run one by one with keys fold_in(key, k)."""
  from iclr24_jax.papers.daclip import irsde
  sched = daclip.irsde_schedule(T=100, lambda_=50.0 / 255.0, eps=0.005)
  s, n, k = 0.1, 20000, 4
  mu = jnp.full((n, 1), 0.5)

  def oracle(params, x_t, mu_, t):
    b = jnp.exp(-sched.thetas_cumsum[t] * sched.dt)[:, None]
    v = sched.sigma_bars[t][:, None] ** 2
    return jnp.sqrt(v) * (x_t - mu_) / (b ** 2 * s ** 2 + v)

  key = jax.random.key(0)
  mean = np.asarray(jax.jit(lambda kk: daclip.reverse_sample_mean(kk, None, mu, noise_fn=oracle, schedule=sched,
                                                                  num_samples=k))(key))
  one = jax.jit(lambda kk: daclip.reverse_sample(kk, None, mu, noise_fn=oracle, schedule=sched))
  chains = [np.asarray(one(jax.random.fold_in(key, i))) for i in range(k)]
  np.testing.assert_allclose(mean, np.mean(chains, axis=0), rtol=1e-5, atol=1e-6)
  exact = _gaussian_chain_std(sched, s, "posterior")
  np.testing.assert_allclose(np.std(chains[0]), exact, rtol=0.02)           # one chain: SE of a std 0.5%
  np.testing.assert_allclose(mean.std(), exact / np.sqrt(k), rtol=0.02)     # K chains: exact / 2
  with pytest.raises(ValueError, match="num_samples"):
    irsde.reverse_sample_mean(key, None, mu, noise_fn=oracle, schedule=sched, num_samples=0)


def test_heldout_draws_are_stratified_and_the_heldout_loss_is_the_matching_loss(sde):
  """Draw r of every image lies in the r-th of R equal strata of 1..T; the held-out loss of an image is the mean
  over its draws of `matching_loss_per_example` at x_t = m_t + sigma_bar_t z, whose batch mean is `matching_loss`."""
  from iclr24_jax.papers.daclip import restoration
  times, noise = restoration.heldout_draws(jax.random.key(0), 50, (4, 4, 1), 100, 10)
  chex.assert_shape(times, (50, 10))
  chex.assert_shape(noise, (50, 10, 4, 4, 1))
  lo = 1 + 10 * np.arange(10)                          # strata 1..10, 11..20, ..., 91..100
  assert (times >= lo).all() and (times <= lo + 9).all()
  assert len(np.unique(times[:, 0])) > 5               # uniform inside a stratum, not its left edge
  again = restoration.heldout_draws(jax.random.key(0), 50, (4, 4, 1), 100, 10)
  np.testing.assert_array_equal(again[0], times)
  with pytest.raises(ValueError, match="num_times"):
    restoration.heldout_draws(jax.random.key(0), 2, (4, 4, 1), 10, 11)

  net = daclip.create_restorer(ml_collections.ConfigDict(dict(base_channels=8, channel_mults=(1,),
                                                              num_res_blocks=1, attention_levels=(0,), num_heads=2,
                                                              out_channels=1, num_groups=4)))
  rng = np.random.default_rng(0)
  gt = jnp.asarray(rng.random((3, 4, 4, 1)), jnp.float32)
  lq = jnp.asarray(rng.random((3, 4, 4, 1)), jnp.float32)
  params = net.init(jax.random.key(1), jnp.zeros((3, 4, 4, 2)), jnp.ones((3,)))["params"]
  t2, z2 = times[:3, ::5], noise[:3, ::5]                                     # R = 2 draws per image
  got = np.asarray(daclip.heldout_matching_loss(params, net, {"gt": gt, "lq": lq}, jnp.asarray(t2),
                                                jnp.asarray(z2), sde))
  per_draw = []
  for r in range(2):
    t = jnp.asarray(t2[:, r])
    x_t = daclip.irsde_mean(gt, lq, t, sde) + daclip.irsde_std(t, sde)[:, None, None, None] * z2[:, r]
    pred = daclip.predict_noise(net, params, x_t, lq, t)
    per_ex = np.asarray(daclip.matching_loss_per_example(pred, x_t, gt, lq, t, sde))
    np.testing.assert_allclose(per_ex.mean(), float(daclip.matching_loss(pred, x_t, gt, lq, t, sde)), rtol=1e-6)
    per_draw.append(per_ex)
  np.testing.assert_allclose(got, np.mean(per_draw, axis=0), rtol=1e-5)
  with pytest.raises(ValueError, match="times must be"):
    daclip.heldout_matching_loss(params, net, {"gt": gt, "lq": lq}, jnp.asarray(t2[:2]), jnp.asarray(z2), sde)


def test_linear_probe_picks_its_regularisation_on_training_folds_only():
  """Separable classes: the probe is perfect; labels unrelated to the features: it is near chance (1/3), not
  silently perfect (the test labels never reach the fit), and its CV accuracy says so too."""
  from iclr24_jax.papers.daclip import train as train_lib
  rng = np.random.default_rng(0)
  centres = 5.0 * np.eye(3, 8)
  y_tr, y_te = rng.integers(0, 3, 150), rng.integers(0, 3, 90)
  x_tr = centres[y_tr] + rng.normal(size=(150, 8)) + 10.0      # offset: the unit-normalisation keeps directions
  x_te = centres[y_te] + rng.normal(size=(90, 8)) + 10.0
  correct, info = train_lib.linear_probe(x_tr, y_tr, x_te, y_te)
  chex.assert_shape(correct, (90,))
  assert correct.mean() > 0.95 and info["cv_accuracy"] > 0.95
  assert info["C"] in train_lib.PROBE_CS
  noise_tr, noise_te = rng.normal(size=(150, 8)), rng.normal(size=(300, 8))
  correct, info = train_lib.linear_probe(noise_tr, y_tr, noise_te, rng.integers(0, 3, 300))
  assert abs(correct.mean() - 1 / 3) < 0.12 and info["cv_accuracy"] < 0.5


def _comparable(tree, workdir: str):
  """results.json's numbers without wall-clock figures (keys ending in '_s' or 'wall_s'), plot paths relative."""
  if isinstance(tree, dict):
    return {k: _comparable(v, workdir) for k, v in tree.items() if not k.endswith("_s")}
  if isinstance(tree, list):
    return [_comparable(v, workdir) for v in tree]
  return tree.replace(workdir, "<workdir>") if isinstance(tree, str) else tree


def _stage_rows(workdir: str) -> dict:
  """Every stage's metrics.jsonl rows (stage folder -> rows without their timing columns)."""
  from iclr24_jax.common import metrics as metrics_lib
  out = {}
  for name in sorted(os.listdir(workdir)):
    path = os.path.join(workdir, name, "metrics.jsonl")
    if os.path.exists(path):
      out[name] = [{k: v for k, v in r.items() if not k.endswith(("_s", "steps_per_s"))}
                   for r in metrics_lib.read_jsonl(path)]
  return out


@pytest.mark.slow   # ~5 min CPU: an uninterrupted tiny run, a run crashed inside a restorer stage, its resume
def test_tiny_crash_inside_a_restorer_stage_then_resume_equals_uninterrupted(tmp_path):
  """Killed without warning (nothing saved at the kill) at step 3 of restorer_daclip_s0, after its step-2
  checkpoint: the launcher's rerun restores the finished stages without training, resumes that stage from step 2,
  and reports the uninterrupted run's results.json numbers and metrics rows exactly."""
  from iclr24_jax.common import checkpoint as ckpt_lib
  from iclr24_jax.configs import daclip as cfg_mod
  from iclr24_jax.launch import run as launch
  cfg = cfg_mod.get_config("tiny")
  every = int(cfg.checkpoint_every)
  assert 0 < every < int(cfg.num_steps) and 0 < every < int(cfg.clip.num_steps)
  full_wd, wd = str(tmp_path / "full"), str(tmp_path / "killed")
  full = launch.run(cfg, full_wd).results

  class Crash(Exception):
    pass

  def crash(step, row):
    if "restorer_daclip_s0/loss" in row and step > every:
      raise Crash(step)

  with pytest.raises(Crash):
    launch.run(cfg, wd, progress_fn=crash)
  assert ckpt_lib.read_status(wd)["status"] == "failed"
  steps = ckpt_lib.checkpoint_steps(wd)
  assert steps[os.path.join("restorer_daclip_s0", "checkpoints")] == every       # saved before the kill
  assert steps[os.path.join("clip", "checkpoints")] == int(cfg.clip.num_steps)    # a finished stage
  assert os.path.join("restorer_daclip_s1", "checkpoints") not in steps          # not reached

  logged = []
  resumed = launch.run(cfg, wd, progress_fn=lambda step, row: logged.append(row)).results
  trained = sorted({k.split("/")[0] for r in logged for k in r if k.endswith("/loss")})
  assert "clip" not in trained and "controller" not in trained and "restorer_none_s0" not in trained
  assert [r["step"] for r in logged if "restorer_daclip_s0/loss" in r] == list(range(every + 1, cfg.num_steps + 1))
  assert _comparable(resumed, wd) == _comparable(full, full_wd)
  assert _stage_rows(wd) == _stage_rows(full_wd)
