"""Constants shared by the FPS test modules: the linear schedule, small instances of every operator, a
2-D Gaussian prior and its exact denoiser, random Gaussian priors by dimension."""
import jax.numpy as jnp
import numpy as np

from iclr24_jax.diffusion import gmm as gmm_lib
from iclr24_jax.diffusion import schedules
from iclr24_jax.papers import fps


SCHED = schedules.linear_beta_schedule()


def _ops():
  """Small instances of every operator (dense checks are O(n^2))."""
  rng = np.random.default_rng(0)
  mask = (rng.uniform(size=(6, 6, 1)) > 0.4).astype(np.float32)
  return {
      "inpainting": fps.Inpainting(mask),
      "super_resolution": fps.SuperResolution(2, (4, 6, 2)),
      "super_resolution_2d": fps.SuperResolution(3, (6, 6)),
      "gaussian_blur": fps.GaussianBlur(3, 1.0, (6, 6, 1)),
      "motion_blur": fps.MotionBlur(5, (7, 6), angle=30.0),
      "dense_wide": fps.Dense(rng.standard_normal((3, 5))),
      "dense_tall": fps.Dense(rng.standard_normal((6, 4))),
  }


OPS = _ops()


def _basis_matrix(fn, shape):
  """Columns fn(e_j) for the standard basis of `shape` -> [out, n]."""
  n = int(np.prod(shape))
  eye = np.eye(n, dtype=np.float32).reshape((n,) + tuple(shape))
  return np.asarray(fn(jnp.asarray(eye))).reshape(n, -1).T


D = 2
_RNG = np.random.default_rng(0)
MEAN0 = np.array([0.5, -0.3])
_L = _RNG.standard_normal((D, D))
COV0 = _L @ _L.T + 0.5 * np.eye(D)
GAUSS = gmm_lib.GaussianMixture(jnp.ones(1), jnp.asarray(MEAN0[None], jnp.float32),
                                jnp.asarray(COV0[None], jnp.float32))
DEN = gmm_lib.gmm_denoiser(GAUSS, SCHED)
N_STEPS = 30


def _prior(dim):
  rng = np.random.default_rng(10 + dim)
  l = rng.standard_normal((dim, dim))
  return rng.standard_normal(dim) * 0.5, l @ l.T + 0.5 * np.eye(dim)
