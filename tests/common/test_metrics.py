"""Tests for the image-quality metrics in iclr24_jax.common.metrics (psnr, ssim, psnr_ssim)."""
import math

import numpy as np
import pytest

from iclr24_jax.common import metrics


def test_psnr_by_hand():
  # Inputs in [-1, 1] map to [0, 1] by (v + 1) / 2.
  # image 0: x = 0 everywhere -> 0.5, truth = -1 -> 0.0: MSE 0.25, PSNR = 10 log10(4) = 6.0206 dB.
  # image 1: x - truth = 0.2 in [-1, 1] units = 0.1 in [0, 1]: MSE 0.01, PSNR = 20 dB.
  # image 2: identical: MSE floored at 1e-10 -> 100 dB.
  x = np.stack([np.zeros((4, 4, 1)), np.full((4, 4, 1), 0.2), np.full((4, 4, 1), 0.3)])
  t = np.stack([np.full((4, 4, 1), -1.0), np.zeros((4, 4, 1)), np.full((4, 4, 1), 0.3)])
  np.testing.assert_allclose(metrics.psnr(x, t), [10 * math.log10(4), 20.0, 100.0], rtol=1e-9)
  # value_range (0, 1): the same numbers halved in [-1, 1] units are full-size here: 0.1 -> MSE 0.01 -> 20 dB.
  np.testing.assert_allclose(metrics.psnr(np.full((1, 3, 3, 2), 0.6), np.full((1, 3, 3, 2), 0.5), (0.0, 1.0)),
                             [20.0], rtol=1e-9)
  # Values outside the range are clipped first: 1.7 and 1.0 in [0, 1] are both 1 -> identical.
  np.testing.assert_allclose(metrics.psnr(np.full((1, 3, 3, 1), 1.7), np.ones((1, 3, 3, 1)), (0.0, 1.0)), [100.0])


def test_ssim_closed_form_for_constant_images():
  # Constant images a and b: means a, b, variances and covariance 0, so
  # SSIM = (2ab + C1) / (a^2 + b^2 + C1) * (0 + C2) / (0 + C2), C1 = (0.01 * 1)^2 (data_range 1).
  a, b = 0.3, 0.5
  c1 = 0.01 ** 2
  want = (2 * a * b + c1) / (a * a + b * b + c1)                   # 0.30001 / 0.34001 = 0.882356
  got = metrics.ssim(np.full((1, 9, 9, 1), a), np.full((1, 9, 9, 1), b), value_range=(0.0, 1.0))
  np.testing.assert_allclose(got, [want], rtol=1e-6)
  # Three channels: the mean over channels of the same closed form.
  got3 = metrics.ssim(np.full((1, 9, 9, 3), a), np.full((1, 9, 9, 3), b), value_range=(0.0, 1.0))
  np.testing.assert_allclose(got3, [want], rtol=1e-6)


def test_ssim_identity_and_noise_ordering():
  rng = np.random.default_rng(0)
  truth = rng.uniform(-1, 1, (3, 8, 8, 1))
  p, s = metrics.psnr_ssim(truth, truth)
  np.testing.assert_allclose(s, 1.0, rtol=1e-9)
  np.testing.assert_allclose(p, 100.0)
  small = truth + 0.05 * rng.normal(size=truth.shape)
  big = truth + 0.5 * rng.normal(size=truth.shape)
  assert np.all(metrics.ssim(small, truth) > metrics.ssim(big, truth))
  assert np.all(metrics.psnr(small, truth) > metrics.psnr(big, truth))
  # 5x5 images use the largest odd window that fits (5), and 6x6 use 5 too; both run.
  assert metrics.ssim(np.zeros((1, 5, 5, 1)), np.zeros((1, 5, 5, 1))).shape == (1,)
  assert metrics.ssim(np.zeros((1, 6, 6, 1)), np.zeros((1, 6, 6, 1))).shape == (1,)


def test_metric_errors_name_the_problem():
  with pytest.raises(ValueError, match=r"\[N, H, W, C\]"):
    metrics.psnr(np.zeros((4, 4)), np.zeros((4, 4)))
  with pytest.raises(ValueError, match="same shape"):
    metrics.psnr(np.zeros((1, 4, 4, 1)), np.zeros((2, 4, 4, 1)))
  with pytest.raises(ValueError, match="NaN"):
    metrics.ssim(np.full((1, 4, 4, 1), np.nan), np.zeros((1, 4, 4, 1)))
  with pytest.raises(ValueError, match="at least 3x3"):
    metrics.ssim(np.zeros((1, 2, 2, 1)), np.zeros((1, 2, 2, 1)))
  with pytest.raises(ValueError, match="high > low"):
    metrics.psnr(np.zeros((1, 4, 4, 1)), np.zeros((1, 4, 4, 1)), value_range=(1.0, 0.0))
