"""TVAE and CTGAN (WGAN-GP with PacGAN and conditional vectors) in Flax, unconstrained or with the Constraint Layer.

Versions (official `--version`):
  'unconstrained'   the plain DGM;
  'postprocessing'  the plain DGM trained as usual, the layer applied to its samples (the paper's P- models,
                    the inference-time guardrail);
  'constrained'     the C-DGM: the layer sits between the decoded/inverse-transformed output and the loss during
                    training, and after the inverse transform at sampling time.

Where the layer sits (as in `synthetizers/TVAE/tvae.py` and `synthetizers/CTGAN/ctgan.py`):
  raw output -> activate (tanh, hard Gumbel-softmax tau=0.2) -> inverse transform -> CL -> re-encode alpha with
  the same (detached) mode one-hots. TVAE's reconstruction loss then compares the data's alpha with the re-encoded
  constrained alpha (no tanh); CTGAN's critic sees [constrained alpha, the activated one-hots]. At sampling time
  the CL is applied to the inverse-transformed rows, so every sample satisfies the constraints.
Every function here is pure and un-jitted; `train.fit` compiles a scan over steps.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from iclr24_jax.common.train_state import TrainState
from iclr24_jax.papers.cdgm import transform as tfm
from iclr24_jax.papers.cdgm.layer import ConstraintLayer

VERSIONS = ("unconstrained", "postprocessing", "constrained")


# --------------------------------------------------------------------------------------------------------------
# Networks
# --------------------------------------------------------------------------------------------------------------


class TVAEEncoder(nn.Module):
  """Linear-ReLU stack -> (mu, logvar) of the latent."""

  hidden: Sequence[int]
  latent: int

  @nn.compact
  def __call__(self, x):
    for h in self.hidden:
      x = nn.relu(nn.Dense(h)(x))
    return nn.Dense(self.latent, name="mu")(x), nn.Dense(self.latent, name="logvar")(x)


class TVAEDecoder(nn.Module):
  """Linear-ReLU stack -> raw [data_dim] outputs (alpha pre-tanh, component/category logits)."""

  hidden: Sequence[int]
  data_dim: int

  @nn.compact
  def __call__(self, z):
    for h in self.hidden:
      z = nn.relu(nn.Dense(h)(z))
    return nn.Dense(self.data_dim)(z)


class Residual(nn.Module):
  """CTGAN residual block: concat(relu(bn(dense(x))), x)."""

  features: int

  @nn.compact
  def __call__(self, x, train: bool):
    h = nn.Dense(self.features)(x)
    # torch BatchNorm1d(momentum=0.1, eps=1e-5) == flax momentum 0.9.
    h = nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5)(h)
    return jnp.concatenate([nn.relu(h), x], axis=-1)


class CTGANGenerator(nn.Module):
  hidden: Sequence[int]
  data_dim: int

  @nn.compact
  def __call__(self, z, train: bool = True):
    for h in self.hidden:
      z = Residual(h)(z, train)
    return nn.Dense(self.data_dim)(z)


class CTGANDiscriminator(nn.Module):
  """PacGAN critic: `pac` rows are concatenated; Linear-LeakyReLU(0.2)-Dropout(0.5) stack -> score."""

  hidden: Sequence[int]
  pac: int

  @nn.compact
  def __call__(self, x, train: bool = True):
    if x.shape[0] % self.pac:
      raise ValueError(f"the critic's batch {x.shape[0]} must be a multiple of pac={self.pac}.")
    x = x.reshape(x.shape[0] // self.pac, -1)
    for h in self.hidden:
      x = nn.Dense(h)(x)
      x = nn.leaky_relu(x, 0.2)
      x = nn.Dropout(0.5, deterministic=not train)(x)
    return nn.Dense(1)(x)[:, 0]


# --------------------------------------------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------------------------------------------


def _check(tf: tfm.TableTransform, layer: ConstraintLayer | None, version: str):
  if version not in VERSIONS:
    raise ValueError(f"unknown version '{version}'; choose one of {VERSIONS}.")
  if version != "unconstrained" and layer is None:
    raise ValueError(f"version '{version}' needs a ConstraintLayer (got layer=None).")
  if layer is not None:
    if layer.num_features != tf.num_features:
      raise ValueError(f"the layer expects {layer.num_features} features, the table has {tf.num_features}.")
    bad = sorted(set(layer.constraints.constrained_variables) & set(int(i) for i in tf.disc_idx))
    if bad:
      raise ValueError(f"constraints mention discrete columns {bad}; the layer corrects continuous columns only.")


def constrain_encoded(tf: tfm.TableTransform, layer: ConstraintLayer, act: jax.Array) -> jax.Array:
  """The official `_apply_constrained`: decode, correct, re-encode alpha under the same one-hots.

  Args:
    tf: the transform.
    layer: the Constraint Layer.
    act: [B, data_dim] activated outputs.

  Returns:
    [B, data_dim] with alpha replaced by the constrained alpha (one-hot blocks unchanged).
  """
  x = layer(tfm.decode(tf, act))
  _, comp, cat = tf.split(act)
  return tf.join(tfm.reencode_alpha(tf, x, comp), comp, cat)


def _sample_rows(tf: tfm.TableTransform, raw: jax.Array, key: jax.Array, layer: ConstraintLayer | None) -> jax.Array:
  rows = tfm.decode(tf, tfm.activate(tf, raw, key))
  return layer(rows) if layer is not None else rows


# --------------------------------------------------------------------------------------------------------------
# TVAE
# --------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class TVAE:
  """TVAE (Xu et al., 2019) as in the official `tvae.py`, with an optional Constraint Layer.

  Attributes:
    tf: the fitted table transform.
    layer: the Constraint Layer (None for 'unconstrained').
    version: 'unconstrained' | 'postprocessing' | 'constrained'.
    embedding_dim, compress_dims, decompress_dims: network sizes (official 128, (128, 128), (128, 128)).
    loss_factor: weight of the reconstruction term (official 2).
    batch_size: rows per step (official 500).
    tx: the optax optimizer (official Adam lr 1e-3, L2 1e-5).
  """

  tf: tfm.TableTransform
  layer: ConstraintLayer | None
  version: str
  tx: optax.GradientTransformation
  embedding_dim: int = 128
  compress_dims: tuple[int, ...] = (128, 128)
  decompress_dims: tuple[int, ...] = (128, 128)
  loss_factor: float = 2.0
  batch_size: int = 500

  def __post_init__(self):
    _check(self.tf, self.layer, self.version)

  @property
  def encoder(self) -> TVAEEncoder:
    return TVAEEncoder(tuple(self.compress_dims), self.embedding_dim)

  @property
  def decoder(self) -> TVAEDecoder:
    return TVAEDecoder(tuple(self.decompress_dims), self.tf.data_dim)

  def init(self, key: jax.Array) -> TrainState:
    """Parameters {encoder, decoder, sigma [Cc] = 0.1} and the optimizer state."""
    k1, k2 = jax.random.split(key)
    params = {"encoder": self.encoder.init(k1, jnp.zeros((1, self.tf.data_dim)))["params"],
              "decoder": self.decoder.init(k2, jnp.zeros((1, self.embedding_dim)))["params"],
              "sigma": jnp.full((self.tf.num_cont,), 0.1, jnp.float32)}
    return TrainState.create(params, self.tx)

  def make_batch(self, data: dict, key: jax.Array) -> dict:
    """Uniform rows of the encoded training matrix `data['x']` `[N, data_dim]` -> `{'x': [B, data_dim]}`."""
    idx = jax.random.randint(key, (self.batch_size,), 0, data["x"].shape[0])
    return {"x": data["x"][idx]}

  def loss_fn(self, params: Any, batch: dict, key: jax.Array) -> tuple[jax.Array, dict]:
    """ELBO loss (official `_loss_function`).

    Args:
      params: model parameters.
      batch: {'x': [B, data_dim] encoded real rows}.
      key: PRNG key (reparameterisation, Gumbel noise).

    Returns:
      (loss, metrics): loss = loss_factor * mean_rows(sum_c (eq^2 / 2 sigma_c^2 + log sigma_c) + CE) + KL.
    """
    x = batch["x"]
    k_eps, k_act = jax.random.split(key)
    mu, logvar = self.encoder.apply({"params": params["encoder"]}, x)
    std = jnp.exp(0.5 * logvar)
    z = mu + std * jax.random.normal(k_eps, std.shape)
    raw = self.decoder.apply({"params": params["decoder"]}, z)
    alpha_x, comp_x, cat_x = self.tf.split(x)
    alpha_r, comp_r, cat_r = tfm.masked_logits(self.tf, raw)
    if self.version == "constrained":
      act = tfm.activate(self.tf, raw, k_act)
      alpha_pred = self.tf.split(constrain_encoded(self.tf, self.layer, act))[0]
      eq = alpha_x - alpha_pred                    # official: no tanh for the constrained version
    else:
      eq = alpha_x - jnp.tanh(alpha_r)
    sigma = params["sigma"]
    rec = jnp.sum(eq ** 2 / (2 * sigma ** 2) + jnp.log(sigma), axis=-1)
    ce = -jnp.sum(comp_x * jax.nn.log_softmax(comp_r, -1), axis=(-1, -2))
    ce = ce - jnp.sum(cat_x * jax.nn.log_softmax(cat_r, -1), axis=(-1, -2))
    rec_loss = self.loss_factor * jnp.mean(rec + ce)
    kld = -0.5 * jnp.mean(jnp.sum(1 + logvar - mu ** 2 - jnp.exp(logvar), axis=-1))
    loss = rec_loss + kld
    return loss, {"loss": loss, "rec": rec_loss, "kld": kld}

  def train_step(self, state: TrainState, batch: dict, key: jax.Array) -> tuple[TrainState, dict]:
    """One Adam step; sigma is clamped to [0.01, 1] afterwards (official `sigma.data.clamp_`)."""
    key = jax.random.fold_in(key, state.step)
    grads, metrics = jax.grad(self.loss_fn, has_aux=True)(state.params, batch, key)
    state = state.apply_gradients(grads)
    params = dict(state.params)
    params["sigma"] = jnp.clip(params["sigma"], 0.01, 1.0)
    return state.replace(params=params), metrics

  def generate_raw(self, params: Any, key: jax.Array, num: int) -> jax.Array:
    """[num, data_dim] decoder outputs for z ~ N(0, I)."""
    z = jax.random.normal(key, (num, self.embedding_dim))
    return self.decoder.apply({"params": params["decoder"]}, z)

  def sample(self, params: Any, key: jax.Array, num: int, apply_layer: bool | None = None) -> jax.Array:
    """Samples rows in the original feature space.

    Args:
      params: model parameters (state.params).
      key: PRNG key.
      num: number of rows.
      apply_layer: apply the CL after the inverse transform (default: unless version == 'unconstrained').

    Returns:
      [num, D] rows.
    """
    k1, k2 = jax.random.split(key)
    use = (self.version != "unconstrained") if apply_layer is None else apply_layer
    return _sample_rows(self.tf, self.generate_raw(params, k1, num), k2, self.layer if use else None)


# --------------------------------------------------------------------------------------------------------------
# CTGAN
# --------------------------------------------------------------------------------------------------------------


@flax.struct.dataclass
class GANState:
  """Generator/critic parameters, optimizer states and the generator's BatchNorm statistics."""

  step: jax.Array
  g_params: Any
  d_params: Any
  g_opt: Any
  d_opt: Any
  batch_stats: Any
  tx_g: optax.GradientTransformation = flax.struct.field(pytree_node=False, default=None)
  tx_d: optax.GradientTransformation = flax.struct.field(pytree_node=False, default=None)


def conditional_data(tf: tfm.TableTransform, encoded: np.ndarray, log_frequency: bool = True) -> dict:
  """Host-side tables for CTGAN's training-by-sampling.

  Args:
    tf: the transform.
    encoded: [N, data_dim] encoded training rows.
    log_frequency: sample categories proportionally to log(1 + count) (official default).

  Returns:
    dict with x [N, data_dim], rows [Cd, Nc, M] row indices per category (padded), counts [Cd, Nc],
    cond_prob [Cd, Nc] category probabilities per discrete column.
  """
  n = encoded.shape[0]
  cd, nc = tf.num_disc, tf.num_categories
  _, _, cat = tf.split(jnp.asarray(encoded))
  cat = np.asarray(cat)
  counts = cat.sum(0).astype(np.int32) if cd else np.zeros((0, nc), np.int32)       # [Cd, Nc]
  m = max(int(counts.max()) if cd else 1, 1)
  rows = np.zeros((cd, nc, m), np.int32)
  for i in range(cd):
    idx = cat[:, i].argmax(-1)
    for j in range(nc):
      r = np.nonzero((idx == j) & (cat[:, i].sum(-1) > 0))[0]
      rows[i, j, :len(r)] = r
  freq = np.log1p(counts) if log_frequency else counts.astype(np.float64)
  freq = np.where(tf.cat_valid, freq, 0.0)
  prob = freq / np.maximum(freq.sum(-1, keepdims=True), 1e-12)
  del n
  return {"x": jnp.asarray(encoded, jnp.float32), "rows": jnp.asarray(rows), "counts": jnp.asarray(counts),
          "cond_prob": jnp.asarray(prob, jnp.float32)}


@dataclasses.dataclass(frozen=True, eq=False)
class CTGAN:
  """CTGAN (Xu et al., 2019) as in the official `ctgan.py`, with an optional Constraint Layer.

  Attributes:
    tf: the fitted transform.
    layer: the Constraint Layer (None for 'unconstrained').
    version: 'unconstrained' | 'postprocessing' | 'constrained'.
    tx_g, tx_d: optimizers (official Adam lr 2e-4, betas (0.5, 0.9), L2 1e-6).
    embedding_dim: noise size (128).
    generator_dim, discriminator_dim: (256, 256) each.
    pac: rows per critic input (10).
    batch_size: multiple of pac (official 500).
    gp_weight: gradient-penalty weight (10).
  """

  tf: tfm.TableTransform
  layer: ConstraintLayer | None
  version: str
  tx_g: optax.GradientTransformation
  tx_d: optax.GradientTransformation
  embedding_dim: int = 128
  generator_dim: tuple[int, ...] = (256, 256)
  discriminator_dim: tuple[int, ...] = (256, 256)
  pac: int = 10
  batch_size: int = 500
  gp_weight: float = 10.0

  def __post_init__(self):
    _check(self.tf, self.layer, self.version)
    if self.batch_size % self.pac:
      raise ValueError(f"batch_size {self.batch_size} must be a multiple of pac {self.pac}.")

  @property
  def cond_dim(self) -> int:
    return self.tf.num_disc * self.tf.num_categories

  @property
  def generator(self) -> CTGANGenerator:
    return CTGANGenerator(tuple(self.generator_dim), self.tf.data_dim)

  @property
  def critic(self) -> CTGANDiscriminator:
    return CTGANDiscriminator(tuple(self.discriminator_dim), self.pac)

  def init(self, key: jax.Array) -> GANState:
    kg, kd = jax.random.split(key)
    gv = self.generator.init(kg, jnp.zeros((2, self.embedding_dim + self.cond_dim)), train=False)
    dv = self.critic.init(kd, jnp.zeros((self.pac, self.tf.data_dim + self.cond_dim)), train=False)
    return GANState(step=jnp.zeros((), jnp.int32), g_params=gv["params"], d_params=dv["params"],
                    g_opt=self.tx_g.init(gv["params"]), d_opt=self.tx_d.init(dv["params"]),
                    batch_stats=gv["batch_stats"], tx_g=self.tx_g, tx_d=self.tx_d)

  # -- conditional vectors ------------------------------------------------------------------------------------
  def _condvec(self, key: jax.Array, prob: jax.Array, num: int):
    """Column uniformly, category from prob[column]; returns (cond [B, Cd*Nc], mask [B, Cd], col, cat)."""
    cd, nc = self.tf.num_disc, self.tf.num_categories
    k1, k2 = jax.random.split(key)
    col = jax.random.randint(k1, (num,), 0, cd)
    cat = jax.random.categorical(k2, jnp.log(jnp.maximum(prob[col], 1e-30)))
    cond = jax.nn.one_hot(col * nc + cat, cd * nc)
    return cond, jax.nn.one_hot(col, cd), col, cat

  def make_batch(self, data: dict, key: jax.Array) -> dict:
    """Training-by-sampling: a conditional vector per row and real rows matched to a permutation of them.

    Returns:
      {'cond': [B, Cd*Nc], 'mask': [B, Cd], 'real': [B, data_dim], 'real_cond': [B, Cd*Nc],
        'g_cond': [B, Cd*Nc], 'g_mask': [B, Cd]} (the g_ pair is the fresh conditional vector of the generator step).
    """
    b = self.batch_size
    k_c, k_p, k_r, k_g = jax.random.split(key, 4)
    if self.tf.num_disc == 0:
      idx = jax.random.randint(k_r, (b,), 0, data["x"].shape[0])
      z = jnp.zeros((b, 0))
      return {"cond": z, "mask": z, "real": data["x"][idx], "real_cond": z, "g_cond": z, "g_mask": z}
    g_cond, g_mask, _, _ = self._condvec(k_g, data["cond_prob"], b)
    cond, mask, col, cat = self._condvec(k_c, data["cond_prob"], b)
    perm = jax.random.permutation(k_p, b)
    pc, pk = col[perm], cat[perm]
    count = data["counts"][pc, pk]
    j = jnp.floor(jax.random.uniform(k_r, (b,)) * count).astype(jnp.int32)
    idx = data["rows"][pc, pk, jnp.minimum(j, jnp.maximum(count - 1, 0))]
    return {"cond": cond, "mask": mask, "real": data["x"][idx], "real_cond": cond[perm], "g_cond": g_cond,
            "g_mask": g_mask}

  # -- generator ------------------------------------------------------------------------------------------------
  def _generate(self, g_params, batch_stats, key, cond, train: bool):
    """Returns (raw [B, data_dim], activated-and-(maybe)-constrained [B, data_dim], new batch_stats)."""
    k_z, k_act = jax.random.split(key)
    z = jax.random.normal(k_z, (cond.shape[0], self.embedding_dim))
    inp = jnp.concatenate([z, cond], axis=1)
    if train:
      raw, upd = self.generator.apply({"params": g_params, "batch_stats": batch_stats}, inp, train=True,
                                      mutable=["batch_stats"])
      batch_stats = upd["batch_stats"]
    else:
      raw = self.generator.apply({"params": g_params, "batch_stats": batch_stats}, inp, train=False)
    act = tfm.activate(self.tf, raw, k_act)
    if self.version == "constrained":
      act = constrain_encoded(self.tf, self.layer, act)
    return raw, act, batch_stats

  def _critic(self, d_params, x, cond, key):
    return self.critic.apply({"params": d_params}, jnp.concatenate([x, cond], axis=1), train=True,
                             rngs={"dropout": key})

  def _cond_loss(self, raw: jax.Array, cond: jax.Array, mask: jax.Array) -> jax.Array:
    """Cross-entropy of the generated category logits of the conditioned column (official `_cond_loss`)."""
    if self.tf.num_disc == 0:
      return jnp.zeros(())
    _, _, cat_r = tfm.masked_logits(self.tf, raw)
    target = cond.reshape(cond.shape[0], self.tf.num_disc, self.tf.num_categories)
    ce = -jnp.sum(target * jax.nn.log_softmax(cat_r, -1), -1)       # [B, Cd]
    return jnp.sum(ce * mask) / raw.shape[0]

  def d_loss_fn(self, d_params, g_params, batch_stats, batch, key):
    """WGAN-GP critic loss: mean D(fake) - mean D(real) + 10 * (||grad D(interp)||_pac - 1)^2."""
    k_g, k_d1, k_d2, k_a, k_d3 = jax.random.split(key, 5)
    _, fake, batch_stats = self._generate(g_params, batch_stats, k_g, batch["cond"], train=True)
    fake = jax.lax.stop_gradient(fake)
    fake_c = jnp.concatenate([fake, batch["cond"]], 1)
    real_c = jnp.concatenate([batch["real"], batch["real_cond"]], 1)
    y_fake = self.critic.apply({"params": d_params}, fake_c, train=True, rngs={"dropout": k_d1})
    y_real = self.critic.apply({"params": d_params}, real_c, train=True, rngs={"dropout": k_d2})
    b = real_c.shape[0]
    a = jax.random.uniform(k_a, (b // self.pac, 1, 1))
    a = jnp.broadcast_to(a, (b // self.pac, self.pac, real_c.shape[1])).reshape(b, -1)
    interp = a * real_c + (1 - a) * fake_c

    def critic_sum(z):
      return jnp.sum(self.critic.apply({"params": d_params}, z, train=True, rngs={"dropout": k_d3}))

    grad = jax.grad(critic_sum)(interp).reshape(b // self.pac, -1)
    pen = self.gp_weight * jnp.mean((jnp.sqrt(jnp.sum(grad ** 2, -1) + 1e-12) - 1.0) ** 2)
    loss_w = jnp.mean(y_fake) - jnp.mean(y_real)
    return loss_w + pen, ({"d_loss": loss_w, "gp": pen}, batch_stats)

  def g_loss_fn(self, g_params, d_params, batch_stats, batch, key):
    """Generator loss: -mean D(fake) + conditional cross-entropy."""
    k_g, k_d = jax.random.split(key)
    cond, mask = batch["g_cond"], batch["g_mask"]
    raw, fake, batch_stats = self._generate(g_params, batch_stats, k_g, cond, train=True)
    y_fake = self._critic(d_params, fake, cond, k_d)
    ce = self._cond_loss(raw, cond, mask)
    loss = -jnp.mean(y_fake) + ce
    return loss, ({"g_loss": loss, "cond_ce": ce}, batch_stats)

  def train_step(self, state: GANState, batch: dict, key: jax.Array) -> tuple[GANState, dict]:
    """One critic step then one generator step (discriminator_steps = 1)."""
    key = jax.random.fold_in(key, state.step)
    k_d, k_g = jax.random.split(key)
    (_, (m_d, bs)), gd = jax.value_and_grad(self.d_loss_fn, has_aux=True)(
        state.d_params, state.g_params, state.batch_stats, batch, k_d)
    upd, d_opt = self.tx_d.update(gd, state.d_opt, state.d_params)
    d_params = optax.apply_updates(state.d_params, upd)
    (_, (m_g, bs)), gg = jax.value_and_grad(self.g_loss_fn, has_aux=True)(
        state.g_params, d_params, bs, batch, k_g)
    upd, g_opt = self.tx_g.update(gg, state.g_opt, state.g_params)
    g_params = optax.apply_updates(state.g_params, upd)
    new = state.replace(step=state.step + 1, g_params=g_params, d_params=d_params, g_opt=g_opt, d_opt=d_opt,
                        batch_stats=bs)
    return new, {**m_d, **m_g, "loss": m_g["g_loss"]}

  def sample(self, state: GANState, key: jax.Array, num: int, cond_prob: jax.Array | None = None,
             apply_layer: bool | None = None) -> jax.Array:
    """Samples rows (generator in eval mode; conditional vectors from the category probabilities, as the
    official `sample_original_condvec`).

    Args:
      state: the GAN state.
      key: PRNG key.
      num: number of rows.
      cond_prob: [Cd, Nc] category probabilities (the training data's `cond_prob`); required with discrete columns.
      apply_layer: apply the CL after the inverse transform (default: unless version == 'unconstrained').

    Returns:
      [num, D] rows.
    """
    k_c, k_g, k_act = jax.random.split(key, 3)
    if self.tf.num_disc:
      if cond_prob is None:
        raise ValueError("CTGAN.sample needs cond_prob (data['cond_prob']) when the table has discrete columns.")
      cd, nc = self.tf.num_disc, self.tf.num_categories
      flat = jnp.reshape(cond_prob, (-1,)) / cd
      pick = jax.random.categorical(k_c, jnp.log(jnp.maximum(flat, 1e-30)), shape=(num,))
      cond = jax.nn.one_hot(pick, cd * nc)
    else:
      cond = jnp.zeros((num, 0))
    z = jax.random.normal(k_g, (num, self.embedding_dim))
    raw = self.generator.apply({"params": state.g_params, "batch_stats": state.batch_stats},
                               jnp.concatenate([z, cond], 1), train=False)
    use = (self.version != "unconstrained") if apply_layer is None else apply_layer
    return _sample_rows(self.tf, raw, k_act, self.layer if use else None)
