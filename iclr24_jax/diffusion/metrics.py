"""Distances between sample sets: sliced Wasserstein, moment errors and mixture-weight recovery."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from iclr24_jax.common import checks
from iclr24_jax.diffusion.gmm import GaussianMixture


def random_directions(key: jax.Array, num_projections: int, dim: int) -> jax.Array:
  """[P, D] unit vectors uniform on the sphere.

  Args:
    key: PRNG key.
    num_projections: P.
    dim: D.

  Returns:
    float32 [P, D], each row of unit norm.
  """
  d = jax.random.normal(key, (num_projections, dim))
  return d / jnp.linalg.norm(d, axis=-1, keepdims=True)


def sliced_wasserstein(x: jax.Array, y: jax.Array, key: jax.Array, num_projections: int = 256, p: int = 2
                       ) -> jax.Array:
  """Sliced p-Wasserstein distance between two equal-size point clouds (Rabin et al. 2011).

  SW_p(x, y) = (E_theta W_p^p(theta^T x, theta^T y))^(1/p); each 1-D W_p between n points is the mean
  |sorted difference|^p. The expectation over theta ~ Uniform(sphere) uses `num_projections` fixed draws from
  `key` (use the same key to compare several samplers on the same directions).

  Args:
    x: [N, D] samples.
    y: [N, D] samples.
    key: the directions' key.
    num_projections: P.
    p: the order.

  Returns:
    scalar SW_p.
  """
  where = "diffusion.sliced_wasserstein"
  checks.shapes(where, x=(x, "N D"), y=(y, "N D"))
  num_projections = checks.static_int(where, "num_projections", num_projections, low=1)
  checks.in_range(where, "p", p, 1.0, None, hint="the order of the Wasserstein distance.")
  theta = random_directions(key, num_projections, x.shape[1])
  px = jnp.sort(x @ theta.T, axis=0)
  py = jnp.sort(y @ theta.T, axis=0)
  return jnp.mean(jnp.abs(px - py) ** p) ** (1.0 / p)


def component_frequencies(gmm: GaussianMixture, x: jax.Array) -> jax.Array:
  """[K] fraction of points whose most responsible component (at alpha_bar = 1) is k.

  Args:
    gmm: the mixture (K components in D dimensions).
    x: [N, D] points.

  Returns:
    float32 [K] frequencies summing to 1.
  """
  comp = jnp.argmax(gmm.responsibilities(x), -1)
  return jnp.mean(jax.nn.one_hot(comp, gmm.num_components), 0)


def moment_errors(gmm: GaussianMixture, x: jax.Array) -> dict[str, jax.Array]:
  """Errors of the sample mean and covariance against the mixture's exact moments.

  Args:
    gmm: the mixture (K components in D dimensions).
    x: [N, D] samples (N >= 2).

  Returns:
    dict: mean_err (max |mean_hat - mean|), cov_err (max |cov_hat - cov|), weight_err (max |freq_k - w_k|),
    each a scalar.
  """
  mean_hat = jnp.mean(x, 0)
  cov_hat = jnp.cov(x, rowvar=False)
  return {"mean_err": jnp.max(jnp.abs(mean_hat - gmm.mean())),
          "cov_err": jnp.max(jnp.abs(cov_hat - gmm.covariance())),
          "weight_err": jnp.max(jnp.abs(component_frequencies(gmm, x) - gmm.weights))}


def sliced_wasserstein_vs_data(x: jax.Array, sample_data, key: jax.Array, num_refs: int = 4,
                               num_projections: int = 256) -> tuple[jax.Array, jax.Array]:
  """Sliced W2 of samples to the data distribution, with its finite-sample floor.

  Both numbers average over `num_refs` independent data draws of x's size: sw = mean_i SW(x, ref_i) and
  floor = mean_i SW(fresh_i, ref_i). An exact sampler has E[sw] = E[floor], so sw / floor ~ 1 says "as close as
  another data draw"; averaging over draws tames the heavy seed-to-seed spread of a single distance.

  Args:
    x: [N, D] samples.
    sample_data: (key, n) -> [n, D] data draws.
    key: randomness (data draws and projections).
    num_refs: data draws averaged over.
    num_projections: projections per distance (the same directions throughout).

  Returns:
    (sw, floor) scalars.
  """
  key_ref, key_fresh, key_proj = jax.random.split(key, 3)
  n = x.shape[0]
  sw, floor = [], []
  for k_ref, k_fresh in zip(jax.random.split(key_ref, num_refs), jax.random.split(key_fresh, num_refs)):
    ref = sample_data(k_ref, n)
    sw.append(sliced_wasserstein(x, ref, key_proj, num_projections))
    floor.append(sliced_wasserstein(sample_data(k_fresh, n), ref, key_proj, num_projections))
  return jnp.mean(jnp.stack(sw)), jnp.mean(jnp.stack(floor))
