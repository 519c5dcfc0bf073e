"""Noise schedules against their formulas at chosen points (arithmetic in the comments)."""
import math

import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.diffusion import schedules


def test_linear_schedule_values():
  s = schedules.linear_beta_schedule(1000, 1e-4, 0.02)
  assert s.num_timesteps == 1000
  # beta_t = 1e-4 + t (0.02 - 1e-4) / 999: beta_0 = 1e-4, beta_1 = 1e-4 + 0.0199 / 999 = 1.19920e-4, beta_999 = 0.02.
  np.testing.assert_allclose(np.asarray(s.betas)[[0, 1, 999]], [1e-4, 1.1991992e-4, 0.02], rtol=1e-6)
  np.testing.assert_allclose(s.alphas, 1.0 - s.betas, rtol=1e-6)
  # alpha_bar_1 = (1 - 1e-4)(1 - 1.1991992e-4) = 1 - 2.1991992e-4 + 1.1992e-8 = 0.99978009207.
  np.testing.assert_allclose(s.alpha_bars[1], 0.99978009207, rtol=1e-6)
  # log alpha_bar_999 = sum log(1 - beta) = -(sum beta) - (sum beta^2) / 2 - (sum beta^3) / 3 - ...
  # sum beta = 1000 (1e-4 + 0.02) / 2 = 10.05; sum beta^2 / 2 = 0.0670347; sum beta^3 / 3 = 0.00067068
  # -> alpha_bar_999 = exp(-10.1177054) = 4.03586e-5 (the 4th-order term changes the 6th digit).
  np.testing.assert_allclose(s.alpha_bars[999], 4.03586e-5, rtol=1e-4)
  # SNR and log-SNR at t = 1: 0.99978009 / 2.1990793e-4 = 4546.4; log = 8.42210.
  np.testing.assert_allclose(s.snr(1), 0.99978009207 / (1 - 0.99978009207), rtol=1e-4)
  np.testing.assert_allclose(s.log_snr(1), math.log(0.99978009207 / (1 - 0.99978009207)), rtol=1e-5)
  # t = -1 is clean data.
  assert float(s.alpha_bar(-1)) == 1.0
  np.testing.assert_allclose(s.alpha_bars_prev[1:], s.alpha_bars[:-1], rtol=1e-6)


def test_cosine_schedule_values_and_cap():
  s = schedules.cosine_beta_schedule(1000)
  f = lambda u: math.cos((u + 0.008) / 1.008 * math.pi / 2) ** 2  # noqa: E731  Nichol & Dhariwal Eq. (17)
  # alpha_bar at DDPM step 500 (our index 499) = f(0.5) / f(0) = 0.4937668 / 0.9998446 = 0.4938436:
  # (0.508 / 1.008) * 90 deg = 45.357 deg, cos^2 = 0.49377.
  np.testing.assert_allclose(s.alpha_bars[499], 0.49384359, rtol=1e-5)
  np.testing.assert_allclose(s.alpha_bars[0], f(0.001) / f(0), rtol=1e-6)   # 0.99995872
  # f(1) = cos(pi / 2)^2 = 0, so the last beta is capped at 0.999.
  np.testing.assert_allclose(s.betas[-1], 0.999, rtol=1e-6)
  assert float(s.betas[:-1].max()) < 0.999
  # diffusers' squaredcos_cap_v2 is the same schedule.
  v2 = schedules.squaredcos_cap_v2(1000)
  np.testing.assert_allclose(v2.betas, s.betas, rtol=1e-6)
  assert v2.name == "squaredcos_cap_v2"
  np.testing.assert_allclose(schedules.make_schedule("squaredcos_cap_v2").alpha_bars, s.alpha_bars, rtol=1e-6)


def test_scaled_linear_and_from_alpha_bars_roundtrip():
  s = schedules.scaled_linear_beta_schedule(10, 0.0001, 0.01)
  # sqrt endpoints 0.01 and 0.1: beta_0 = 1e-4, beta_9 = 0.01, beta_mid between them on a square-root line.
  np.testing.assert_allclose(np.asarray(s.betas)[[0, 9]], [1e-4, 1e-2], rtol=1e-6)
  r = schedules.from_alpha_bars(np.asarray(s.alpha_bars, np.float64))
  # alpha_bars are stored in float32, so 1 - alpha_bar carries ~6e-8 absolute error near t = 0.
  np.testing.assert_allclose(r.betas, s.betas, rtol=1e-5, atol=2e-7)


def test_continuous_cosine_values_and_shift():
  c = schedules.ContinuousSchedule("cosine", logsnr_min=-15.0, logsnr_max=15.0)
  # Endpoints: lambda(0) = -2 log tan(atan(e^-7.5)) = 15; lambda(1) = -2 log tan(atan(e^7.5)) = -15.
  np.testing.assert_allclose(c.log_snr(jnp.array([0.0, 1.0])), [15.0, -15.0], rtol=1e-5)
  # Midpoint: a/2 + b = (atan(e^7.5) + atan(e^-7.5)) / 2 = pi / 4, tan = 1, lambda = 0, alpha_bar = 1/2.
  np.testing.assert_allclose(c.log_snr(0.5), 0.0, atol=1e-5)
  np.testing.assert_allclose(c.alpha_bar(0.5), 0.5, rtol=1e-6)
  # Away from the clipped ends alpha_bar(t) ~ cos^2(pi t / 2): t = 1/3 -> cos^2(30 deg) = 0.75 (b = 5.5e-4 rad).
  np.testing.assert_allclose(c.alpha_bar(1.0 / 3.0), 0.75, atol=2e-3)
  # SNR shift by resolution: 2 log(64 / 256) = -2.7725887; at t = 0.5 alpha_bar = sigmoid(-2 log 4) = 1/17.
  shift = schedules.resolution_shift(64, 256)
  np.testing.assert_allclose(shift, -2.7725887, rtol=1e-6)
  cs = schedules.ContinuousSchedule("cosine", shift=shift)
  np.testing.assert_allclose(cs.alpha_bar(0.5), 1.0 / 17.0, rtol=1e-5)
  t = jnp.linspace(0.05, 0.95, 7)
  np.testing.assert_allclose(cs.log_snr(t) - c.log_snr(t), shift, atol=1e-5)
  np.testing.assert_allclose(cs.snr(t) / c.snr(t), 1.0 / 16.0, rtol=1e-4)


def test_continuous_linear_vp_values():
  c = schedules.ContinuousSchedule("linear", beta_min=0.1, beta_max=20.0)
  # integral of beta over [0, t] = 0.1 t + 19.9 t^2 / 2: t = 0.5 -> 0.05 + 2.4875 = 2.5375, alpha_bar = e^-2.5375.
  np.testing.assert_allclose(c.alpha_bar(0.5), 0.07906381, rtol=1e-5)
  # t = 1 -> 10.05, alpha_bar = e^-10.05 = 4.31857e-5.
  np.testing.assert_allclose(c.alpha_bar(1.0), 4.3185749e-5, rtol=1e-4)


def test_discretize_and_shift_schedule():
  c = schedules.ContinuousSchedule("cosine")
  d = schedules.discretize(c, 50)
  # alpha_bars[i] = alpha_bar((i + 1) / 50): index 24 is t = 0.5 -> 0.5.
  np.testing.assert_allclose(d.alpha_bars[24], 0.5, rtol=1e-5)
  lin = schedules.linear_beta_schedule(100)
  sh = schedules.shift_schedule(lin, -1.0)
  np.testing.assert_allclose(sh.log_snr(jnp.arange(100)) - lin.log_snr(jnp.arange(100)), -1.0, atol=1e-5)


def test_sampling_times():
  s = schedules.linear_beta_schedule(1000)
  np.testing.assert_array_equal(s.sampling_times(10, "leading"), np.arange(900, -1, -100))
  np.testing.assert_array_equal(s.sampling_times(10, "trailing"), np.arange(999, 0, -100))
  np.testing.assert_array_equal(s.sampling_times(4, "linspace"), [999, 666, 333, 0])
  np.testing.assert_array_equal(s.sampling_times(), np.arange(999, -1, -1))
  c = schedules.ContinuousSchedule()
  np.testing.assert_allclose(c.sampling_times(4), [1.0, 0.75, 0.5, 0.25])


def test_from_config():
  import ml_collections
  cfg = ml_collections.ConfigDict(dict(name="cosine", num_timesteps=100, continuous=True, shift=-1.0))
  s = schedules.from_config(cfg)
  assert not s.is_discrete and s.shift == -1.0
  cfg.continuous = False
  assert schedules.from_config(cfg).num_timesteps == 100


def test_schedule_errors():
  with pytest.raises(ValueError, match="unknown schedule"):
    schedules.make_schedule("quadratic")
  with pytest.raises(ValueError, match="strictly inside"):
    schedules.from_betas([0.1, 1.0])
  with pytest.raises(ValueError, match="num_steps"):
    schedules.linear_beta_schedule(10).sampling_times(11)
  with pytest.raises(ValueError, match="unknown continuous"):
    schedules.ContinuousSchedule("sigmoid")
  with pytest.raises(ValueError, match="positive"):
    schedules.resolution_shift(0, 64)
  with pytest.raises(ValueError, match="spacing"):
    schedules.linear_beta_schedule(10).sampling_times(5, "random")
