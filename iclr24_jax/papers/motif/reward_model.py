"""Motif's reward model r_phi(caption) and its preference loss.

The encoder is the official character CNN over the 256-byte NetHack message (`encoder_msg_model='lt_cnn'` of
rl_baseline/encoders_nle.py: a 32-wide character embedding with the NUL padding character fixed at zero, six
1-D convolutions with max pooling, then 5 x 64 -> 128), followed by the official TorchBeastEncoder trunk
(128 -> 256 -> 512, ReLU between) and the reward head ReLU -> Linear(512, 1) of rlaif/reward_model.py. The
official reward run uses only the message (use_crop = use_glyphs = use_blstats = False).

Loss (the paper's reward-model loss, Sec. 2; scripts/train_reward.py): cross-entropy between softmax([r(c1), r(c2)]) and the
preference, with the label convention of the official annotator (AnnotationIdx): 0 = first preferred,
1 = second preferred, 2 = no preference (target 0.5 / 0.5).
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from iclr24_jax.common import checks

MESSAGE_LEN = 256
NUM_CHARS = 256
# The official annotator's AnnotationIdx: FIRST = 0, SECOND = 1, TIE = 2 (UNKOWN = 3 pairs are masked out of the
# official PairsDataset, so they never reach the loss).
LABELS = (0, 1, 2)


class MessageCNN(nn.Module):
  """The official 'lt_cnn' character CNN: message bytes [B, 256] -> features [B, 2 * hidden].

  Lengths (valid convolutions, pools of 3 with stride 3): 256 -conv7-> 250 -pool-> 83 -conv7-> 77 -pool-> 25
  -conv3 x4-> 17 -pool-> 5, so the flattened features are 5 x hidden, then Linear(5 hidden, 2 hidden) + ReLU.

  Attributes:
    embed_dim: character embedding width (official 32).
    hidden: convolution channels (official 64).
  """

  embed_dim: int = 32
  hidden: int = 64

  @nn.compact
  def __call__(self, message: jax.Array) -> jax.Array:
    if message.ndim != 2:
      raise ValueError(f"MessageCNN expects message bytes [B, L], got shape {message.shape}.")
    if message.shape[-1] < 100:
      raise ValueError(f"MessageCNN needs messages of >= 100 characters (NetHack's are 256), got {message.shape[-1]}.")
    ids = message.astype(jnp.int32)
    # padding_idx=0 in the official nn.Embedding: the NUL character embeds to zero and gets no gradient.
    x = nn.Embed(NUM_CHARS, self.embed_dim, name="char_embed")(ids) * (ids > 0)[..., None].astype(jnp.float32)
    pool = lambda y: nn.max_pool(y, (3,), strides=(3,), padding="VALID")
    x = pool(nn.relu(nn.Conv(self.hidden, (7,), padding="VALID", name="conv1")(x)))
    x = pool(nn.relu(nn.Conv(self.hidden, (7,), padding="VALID", name="conv2")(x)))
    for i in range(3, 7):
      x = nn.relu(nn.Conv(self.hidden, (3,), padding="VALID", name=f"conv{i}")(x))
    x = pool(x)
    x = x.reshape((x.shape[0], -1))
    return nn.relu(nn.Dense(2 * self.hidden, name="fc")(x))


class RewardModel(nn.Module):
  """r_phi: message bytes [B, 256] (uint8, NUL-padded) -> reward [B] float32.

  Attributes:
    embed_dim, hidden: of the character CNN (official 32, 64).
    trunk: width of the encoder output (official encoder_hidden_dim 512; the trunk is trunk/2 -> trunk).
  """

  embed_dim: int = 32
  hidden: int = 64
  trunk: int = 512

  @nn.compact
  def __call__(self, message: jax.Array) -> jax.Array:
    h = MessageCNN(self.embed_dim, self.hidden, name="message_cnn")(message)
    h = nn.Dense(self.trunk // 2, name="trunk_1")(h)
    h = nn.Dense(self.trunk, name="trunk_2")(nn.relu(h))
    return nn.Dense(1, name="reward")(nn.relu(h))[..., 0]


def init_params(key: jax.Array, model: RewardModel | None = None) -> Any:
  """Fresh reward-model params (from a [1, 256] dummy message).

  Args:
    key: PRNG key.
    model: the RewardModel (None: the default RewardModel()).

  Returns:
    the params pytree.
  """
  model = model or RewardModel()
  return model.init(key, jnp.zeros((1, MESSAGE_LEN), jnp.uint8))["params"]


def model_for(params: Any, model: RewardModel | None = None, where: str = "motif") -> RewardModel:
  """The RewardModel that `params` belong to: `model` checked against the params' shapes, or (model=None) one
  built from them, so a smaller or larger network is never silently read as the official-size one.

  Args:
    params: RewardModel params ({'message_cnn': {'char_embed', 'conv1', ...}, 'trunk_1', 'trunk_2', 'reward'}).
    model: the module, or None to infer embed_dim, hidden and trunk from the params.
    where: the calling function, for messages.

  Returns:
    The RewardModel.

  Raises:
    ShapeError: params that are not a RewardModel's, or that do not match `model`'s sizes.
  """
  if model is not None and not isinstance(model, RewardModel):
    return model          # a user's own reward module: its params are its business
  try:
    sizes = dict(embed_dim=int(np.shape(params["message_cnn"]["char_embed"]["embedding"])[1]),
                 hidden=int(np.shape(params["message_cnn"]["conv1"]["kernel"])[-1]),
                 trunk=int(np.shape(params["trunk_2"]["kernel"])[-1]))
  except (KeyError, TypeError, IndexError) as e:
    raise checks.ShapeError(f"{where}: params are not a motif RewardModel's (missing {e}); pass the params of "
                            "motif.init_params / fit_reward_model.") from e
  if model is None:
    return RewardModel(**sizes)
  want = dict(embed_dim=model.embed_dim, hidden=model.hidden, trunk=model.trunk)
  if want != sizes:
    raise checks.ShapeError(f"{where}: params have sizes {sizes} but model= has {want}; pass the model the params "
                            "were trained with (or model=None to build it from the params).")
  return model


def _check_messages(where: str, name: str, x: Any, spec: str = "B L") -> None:
  checks.shapes(where, **{name: (x, spec)})
  checks.dtype(where, name, x, "integer", "messages are uint8 byte buffers (NUL-padded, `caption_bytes`); float "
               "values would be truncated to byte 0 and read as empty messages.")


# Official state-dict names (rlaif/reward_model.py RewardSharedWeights: encoder = TorchBeastEncoder with
# msg_model 'lt_cnn', reward_fn = Sequential(ReLU, Linear)); conv2..conv6 and fc are positions in the
# encoder's conv2_6_fc Sequential (ReLU, MaxPool, Conv, ReLU, MaxPool, Conv, ReLU, Conv, ReLU, Conv, ReLU,
# Conv, ReLU, MaxPool, Flatten, Linear, ReLU).
OFFICIAL_CONVS = {"conv1": "encoder.conv1", "conv2": "encoder.conv2_6_fc.2", "conv3": "encoder.conv2_6_fc.5",
                  "conv4": "encoder.conv2_6_fc.7", "conv5": "encoder.conv2_6_fc.9", "conv6": "encoder.conv2_6_fc.11"}


def params_from_official(state_dict: dict) -> Any:
  """Official reward-model weights (a torch state dict as numpy arrays) -> RewardModel params.

  Layout changes: Conv1d weights [out, in, k] -> Flax [k, in, out]; Linear weights [out, in] -> [in, out]; the
  first fc layer reads torch's channel-major flattening of the [B, C, 5] features (index c * 5 + l), Flax
  flattens [B, 5, C] (index l * C + c), so its input rows are permuted. Keys other than the reward model's
  (the policy heads of the shared actor-critic) are ignored.

  Args:
    state_dict: name -> array with 'encoder.char_lt.weight' [256, E], the convolutions of `OFFICIAL_CONVS`
      ('.weight' [H, in, k], '.bias' [H]), 'encoder.conv2_6_fc.15.*' [2H, 5H], 'encoder.fc.0.*' [T/2, 2H],
      'encoder.fc.2.*' [T, T/2], 'reward_fn.1.*' [1, T].

  Returns:
    params for RewardModel(embed_dim=E, hidden=H, trunk=T).

  Raises:
    ValueError: a missing key.
  """
  need = (["encoder.char_lt.weight"] + [f"{v}.{w}" for v in OFFICIAL_CONVS.values() for w in ("weight", "bias")]
          + [f"{k}.{w}" for k in ("encoder.conv2_6_fc.15", "encoder.fc.0", "encoder.fc.2", "reward_fn.1")
             for w in ("weight", "bias")])
  missing = [k for k in need if k not in state_dict]
  if missing:
    raise ValueError(f"params_from_official: the state dict lacks {missing}; expected the official 'lt_cnn' "
                     "reward model (rlaif/reward_model.py).")
  sd = {k: np.asarray(state_dict[k], np.float32) for k in need}
  dense = lambda k: {"kernel": sd[k + ".weight"].T, "bias": sd[k + ".bias"]}
  cnn = {"char_embed": {"embedding": sd["encoder.char_lt.weight"]}}
  for name, k in OFFICIAL_CONVS.items():
    cnn[name] = {"kernel": sd[k + ".weight"].transpose(2, 1, 0), "bias": sd[k + ".bias"]}
  w = sd["encoder.conv2_6_fc.15.weight"]                                    # [2H, H * 5], index c * 5 + l
  h = cnn["conv6"]["kernel"].shape[-1]
  cnn["fc"] = {"kernel": w.reshape(w.shape[0], h, -1).transpose(2, 1, 0).reshape(-1, w.shape[0]),
               "bias": sd["encoder.conv2_6_fc.15.bias"]}
  return {"message_cnn": cnn, "trunk_1": dense("encoder.fc.0"), "trunk_2": dense("encoder.fc.2"),
          "reward": dense("reward_fn.1")}


def label_targets(labels: jax.Array) -> jax.Array:
  """Official labels (0 first, 1 second, 2 no preference) -> probability that the second is preferred [...].

  Labels outside {0, 1, 2} (e.g. the official UNKOWN = 3, which the official data set drops, or -1) raise a
  `checks.LabelError` eagerly and give NaN targets under jit / vmap.
  """
  where = "motif.label_targets"
  checks.dtype(where, "labels", labels, "real")
  ok = checks.labels_in(where, "labels", labels, LABELS, "0 first preferred, 1 second, 2 no preference; drop "
                        "unparsable / unknown annotations (label 3 or None) first, as the official data set does.")
  labels = jnp.asarray(labels)
  out = jnp.where(labels == 0, 0.0, jnp.where(labels == 1, 1.0, 0.5)).astype(jnp.float32)
  return checks.poison(out, ok)


def pair_rewards(params: Any, batch: dict, model: RewardModel | None = None) -> jax.Array:
  """Rewards of both members of each pair, [B, 2].

  `batch` either holds the pairs' messages ('message_1', 'message_2': [B, 256]) or, equivalently and cheaper
  when messages repeat, the unique messages 'messages' [M, 256] and 'pairs' [B, 2] int indices into them.

  Args:
    params: reward-model params.
    batch: one of the two layouts above (integer, usually uint8, message buffers).
    model: the RewardModel (None: built from the params' shapes, see `model_for`).

  Returns:
    float32 [B, 2] rewards r_phi of the first and second message (NaN under jit / vmap for pair indices
    outside [0, M); eager calls raise).

  Raises:
    ContractError: neither layout, float messages, shapes that do not match, an empty batch.
  """
  where = "motif.pair_rewards"
  model = model_for(params, model, where)
  if "pairs" in batch:
    _check_messages(where, "messages", batch["messages"], "M L")
    checks.shapes(where, pairs=(batch["pairs"], "B 2"))
    checks.dtype(where, "pairs", batch["pairs"], "integer")
    num_messages = np.shape(batch["messages"])[0]
    checks.nonempty(where, "pairs", np.shape(batch["pairs"])[0], "pairs")
    checks.nonempty(where, "messages", num_messages, "messages")
    ok = checks.indices(where, "pairs", batch["pairs"], num_messages, "they index the rows of 'messages'.")
    r = model.apply({"params": params}, batch["messages"])
    return checks.poison(r[jnp.asarray(batch["pairs"])], ok)
  if "message_1" not in batch or "message_2" not in batch:
    raise checks.ContractError(f"{where}: the preference batch needs 'message_1' and 'message_2' [B, 256], or "
                               f"'messages' [M, 256] and 'pairs' [B, 2]; got keys {sorted(batch)}.")
  m1, m2 = batch["message_1"], batch["message_2"]
  _check_messages(where, "message_1", m1)
  _check_messages(where, "message_2", m2)
  checks.shapes(where, message_1=(m1, "B L"), message_2=(m2, "B L"))
  checks.nonempty(where, "message_1", np.shape(m1)[0], "pairs")
  r = model.apply({"params": params}, jnp.concatenate([m1, m2], axis=0))
  return jnp.stack([r[:m1.shape[0]], r[m1.shape[0]:]], axis=1)


def preference_loss(params: Any, batch: dict, model: RewardModel | None = None) -> tuple[jax.Array, dict]:
  """Cross-entropy between softmax([r(c1), r(c2)]) and the preference (the paper's reward-model loss; official train_reward.py).

  Args:
    params: RewardModel params.
    batch: pairs as in `pair_rewards`, plus 'label' [B] int (0 first, 1 second, 2 no preference -> 0.5 / 0.5)
      and optionally 'weight' [B] (e.g. multiplicities of repeated pairs; 0 masks a pair).
    model: the RewardModel (None: built from the params' shapes, see `model_for`).

  Returns:
    (loss: weighted mean over pairs, metrics: {'loss', 'accuracy'}) with accuracy = argmax agreement on pairs
    that have a preference (official validation accuracy). Labels outside {0, 1, 2}, pair indices out of range
    or negative weights raise named errors eagerly and give NaN under jit / vmap.
  """
  where = "motif.preference_loss"
  if "label" not in batch:
    raise checks.ContractError(f"{where}: the batch needs 'label' [B] (0 first, 1 second, 2 no preference).")
  first = batch["pairs"] if "pairs" in batch else batch.get("message_1")
  if first is not None and np.ndim(first) >= 1:
    checks.shapes(where, known={"B": np.shape(first)[0]}, label=(batch["label"], "B"),
                  weight=(batch.get("weight"), "B"))
  r = pair_rewards(params, batch, model)                                  # [B, 2]
  target = label_targets(batch["label"])                                 # p(second preferred)
  ok = True
  if "weight" in batch:
    ok = checks.require(where, checks.xp(batch["weight"]).asarray(batch["weight"]) >= 0,
                        checks.HyperparameterError, "weight must be >= 0 (0 masks a pair).")
  w = jnp.asarray(batch.get("weight", jnp.ones_like(target)), jnp.float32)
  logp = jax.nn.log_softmax(r, axis=-1)
  nll = -((1.0 - target) * logp[:, 0] + target * logp[:, 1])  # the paper's loss: cross-entropy with the soft label
  loss = jnp.sum(w * nll) / jnp.maximum(jnp.sum(w), 1e-8)
  decided = (target != 0.5).astype(jnp.float32) * w
  correct = ((r[:, 1] > r[:, 0]).astype(jnp.float32) == target).astype(jnp.float32)
  acc = jnp.sum(decided * correct) / jnp.maximum(jnp.sum(decided), 1e-8)
  return checks.poison((loss, {"loss": loss, "accuracy": acc}), ok)


def pair_accuracy(rewards: np.ndarray, pairs: np.ndarray, labels: np.ndarray) -> tuple[float, int]:
  """Agreement of reward ordering with labels on pairs that have a preference (labels 0 or 1).

  Args:
    rewards: [M] reward per unique message; pairs: [P, 2] indices; labels: [P] ints.

  Returns:
    (accuracy, number of decided pairs); accuracy is nan when no pair is decided.
  """
  where = "motif.pair_accuracy"
  rewards = checks.host_array(where, "rewards", rewards)
  pairs = checks.host_array(where, "pairs", pairs)
  labels = checks.host_array(where, "labels", labels)
  checks.shapes(where, rewards=(rewards, "M"), pairs=(pairs, "P 2"), labels=(labels, "P"))
  checks.indices(where, "pairs", pairs, rewards.shape[0], "they index `rewards`.")
  checks.labels_in(where, "labels", labels, LABELS)
  keep = (labels == 0) | (labels == 1)
  if not keep.any():
    return float("nan"), 0
  pred_second = rewards[pairs[keep, 1]] > rewards[pairs[keep, 0]]
  return float(np.mean(pred_second == (labels[keep] == 1))), int(keep.sum())


def fit_reward_model(key: jax.Array, messages: np.ndarray, pairs: np.ndarray, labels: np.ndarray,
                     weights: np.ndarray | None = None, num_steps: int = 300, learning_rate: float = 1e-3,
                     model: RewardModel | None = None, stages: Any = None, every: int = 0) -> tuple[Any, dict]:
  """Trains r_phi on annotated pairs with full-batch Adam (a loop of one jitted step).

  With `stages` (a `common.loop.Stages`) the fit is the resumable stage 'reward_model' in `stages.workdir/
  reward_model`: chunks of `every` steps end at a `ResumableLoop` boundary (a row of the chunk's last loss and
  accuracy; a save when due, or on SIGTERM / SIGINT), the checkpoint holds the parameters and the Adam state and
  the history so far rides in the loop state, so a resumed fit returns what an uninterrupted one does.

  Deviation: the official run trains on 500k pairs with minibatches of 1024 for 10 epochs at lr 1e-5; the
  small data sets here are fitted full-batch (unique messages forwarded once per step) at a larger rate.

  Args:
    key: init key.
    messages: [M, 256] uint8 unique messages; pairs: [P, 2] int indices; labels: [P] ints (0/1/2).
    weights: [P] optional pair weights (multiplicities).
    num_steps: Adam steps; learning_rate: Adam rate.
    model: RewardModel (default official sizes).
    stages: where the fit saves (None: nothing saved).
    every: steps per chunk (0: the whole fit in one chunk).

  Returns:
    (params, history dict of [num_steps] arrays 'loss' and 'accuracy' on the training pairs).

  Raises:
    common.loop.Preempted: SIGTERM / SIGINT stopped the fit (its checkpoint is saved).
  """
  # Deviation: full-batch Adam over the unique messages (the same loss as per-pair minibatches, tested) at
  # lr 1e-3 for small data sets; the official uses minibatches of 1024 pairs, lr 1e-5, 10 epochs.
  where = "motif.fit_reward_model"
  model = model or RewardModel()
  messages = checks.host_array(where, "messages", messages)
  pairs = checks.host_array(where, "pairs", pairs)
  labels = checks.host_array(where, "labels", labels)
  _check_messages(where, "messages", messages, "M L")
  checks.shapes(where, pairs=(pairs, "P 2"), labels=(labels, "P"), weights=(weights, "P"))
  checks.dtype(where, "pairs", pairs, "integer")
  checks.nonempty(where, "pairs", pairs.shape[0], "annotated pairs")
  checks.indices(where, "pairs", pairs, messages.shape[0], "they index the rows of `messages`.")
  checks.labels_in(where, "labels", labels, LABELS, "0 first preferred, 1 second, 2 no preference.")
  pairs, labels = pairs.astype(np.int32), labels.astype(np.int32)
  weights = np.ones(len(labels), np.float32) if weights is None else checks.host_array(where, "weights", weights,
                                                                                      np.float32)
  checks.require(where, weights >= 0, checks.HyperparameterError, "weights must be >= 0.")
  # Pad to buckets (zero messages; pairs of weight 0) so fits of similar sizes reuse one compiled step.
  m_pad, p_pad = _bucket(len(messages), 32), _bucket(len(labels), 64)
  messages = np.concatenate([messages, np.zeros((m_pad - len(messages), messages.shape[1]), messages.dtype)])
  pairs = np.concatenate([pairs, np.zeros((p_pad - len(pairs), 2), np.int32)])
  weights = np.concatenate([weights, np.zeros(p_pad - len(weights), np.float32)])
  labels = np.concatenate([labels, np.full(p_pad - len(labels), 2, np.int32)])
  batch = {"messages": jnp.asarray(messages, jnp.uint8), "pairs": jnp.asarray(pairs), "label": jnp.asarray(labels),
           "weight": jnp.asarray(weights)}
  # Deviation: Flax default initialisation (the official applies sample-factory's initialize_weights).
  params = model.init(key, jnp.zeros((1, messages.shape[1]), jnp.uint8))["params"]
  tx = _adam(float(learning_rate))

  step = _jitted_step(model, tx)
  from iclr24_jax.common import loop   # (imported here: common.loop imports orbax, which plain fits do not need)
  num_steps = int(num_steps)
  chunk = max(1, min(int(every) or num_steps, num_steps)) if num_steps else 1
  with loop.stage_loop(stages, "reward_model", num_steps) as lp:
    state, run = lp.start(lambda: {"params": params, "opt_state": tx.init(params)})
    hist = run.extra.setdefault("history", {"loss": [], "accuracy": []})
    while not lp.finished and run.step < num_steps:
      n = min(chunk, num_steps - run.step)
      p, o = state["params"], state["opt_state"]
      rows = []
      for _ in range(n):  # a Python loop of one compiled step: XLA:CPU compiles convolutions inside a
        p, o, m = step(p, o, batch)  # lax.scan ~5x slower and runs them ~6x slower here
        rows.append(m)
      state = {"params": p, "opt_state": o}
      for m in jax.device_get(rows):
        for k in hist:
          hist[k].append(float(m[k]))
      lp.boundary(run.step + n, state, {"reward_model/loss": hist["loss"][-1],
                                        "reward_model/accuracy": hist["accuracy"][-1]})
    lp.finish(state)
  out = {k: np.asarray(v, np.float32) for k, v in run.extra["history"].items()} if num_steps else {}
  return state["params"], out


def message_rewards(params: Any, messages: np.ndarray, model: RewardModel | None = None,
                    batch_size: int = 256) -> np.ndarray:
  """r_phi of many messages [N, 256] -> [N] float32 (batched; batches padded to one compiled shape).

  Args:
    params: reward-model params.
    messages: [N, 256] uint8 message buffers.
    model: the RewardModel (None: the default).
    batch_size: rows per compiled call (the last batch is zero-padded).

  Returns:
    numpy float32 [N] (empty for N = 0).
  """
  where = "motif.message_rewards"
  model = model_for(params, model, where)
  messages = checks.host_array(where, "messages", messages)
  _check_messages(where, "messages", messages, "N L")
  messages = messages.astype(np.uint8)
  fn = _jitted_apply(model)
  out = []
  for s in range(0, len(messages), batch_size):
    chunk = messages[s:s + batch_size]
    n = len(chunk)
    pad = np.zeros((batch_size - n, messages.shape[1]), np.uint8) if n < batch_size else None
    x = chunk if pad is None else np.concatenate([chunk, pad])
    out.append(np.asarray(jax.device_get(fn(params, x)))[:n])
  return np.concatenate(out) if out else np.zeros((0,), np.float32)


_APPLY_CACHE: dict = {}
_STEP_CACHE: dict = {}


def _bucket(n: int, multiple: int) -> int:
  return max(multiple, -(-n // multiple) * multiple)


_ADAM: dict = {}


def _adam(lr: float):
  if lr not in _ADAM:
    _ADAM[lr] = optax.adam(lr)
  return _ADAM[lr]


def _jitted_step(model: RewardModel, tx: Any):
  key = (model, id(tx))
  if key not in _STEP_CACHE:
    def step(p, o, batch):
      (_, m), g = jax.value_and_grad(lambda q: preference_loss(q, batch, model), has_aux=True)(p)
      u, o = tx.update(g, o, p)
      return optax.apply_updates(p, u), o, m
    _STEP_CACHE[key] = jax.jit(step, donate_argnums=(0, 1))
  return _STEP_CACHE[key]


def _jitted_apply(model: RewardModel):
  if model not in _APPLY_CACHE:
    _APPLY_CACHE[model] = jax.jit(lambda p, x: model.apply({"params": p}, x))
  return _APPLY_CACHE[model]
