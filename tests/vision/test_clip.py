"""Tests for the CLIP-style dual encoder (iclr24_jax.vision.clip): tokenizer, towers, loss, zero-shot, training."""
import math

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from iclr24_jax.common import loop as loop_lib
from iclr24_jax.common import sharding
from iclr24_jax.vision import clip

TINY = ml_collections.ConfigDict(dict(
    embed_dim=8, image=dict(name="cnn", features=(4, 8), dense=16),
    text=dict(name="transformer", max_len=6, width=16, depth=1, heads=2)))
OPT = ml_collections.ConfigDict(dict(learning_rate=1e-2, schedule="constant", weight_decay=0.0))
VOCAB = 12


@pytest.fixture(scope="module")
def tiny():
  """A tiny CLIP, its state and a fixed batch of 16 image-caption pairs (shared by the tests below)."""
  model = clip.create_clip(TINY, VOCAB)
  tx = clip.make_optimizer(OPT, 100)
  state = jax.jit(lambda k: clip.init(k, model, (8, 8, 1), (6,), jnp.int32, tx))(jax.random.key(0))
  rng = np.random.default_rng(0)
  ids = np.zeros((16, 6), np.int32)
  ids[:, 0] = clip.WordTokenizer.SOT
  ids[:, 1:4] = rng.integers(4, VOCAB, (16, 3))
  ids[:, 4] = clip.WordTokenizer.EOT
  batch = {"image": rng.random((16, 8, 8, 1)).astype(np.float32), "text": ids}
  return model, state, batch


def test_word_tokenizer_encodes_with_markers_and_unknowns():
  tok = clip.WordTokenizer.build(["a photo of the digit seven", "a rotated 7", "a photo"])
  # 'a' (3x) and 'photo' (2x) come first, then the rest alphabetically.
  assert tok.words[:2] == ("a", "photo")
  assert tok.vocab_size == 4 + len(tok.words)
  ids = tok.encode(["A photo of zebras", "seven " * 10], max_len=6)
  chex.assert_shape(ids, (2, 6))
  assert ids.dtype == np.int32
  a, photo, of = (tok.words.index(w) + 4 for w in ("a", "photo", "of"))
  assert ids[0].tolist() == [tok.SOT, a, photo, of, tok.UNK, tok.EOT]
  assert ids[1, 0] == tok.SOT and ids[1, -1] == tok.EOT            # long text cut, <eot> kept
  assert tok.decode(ids[0]) == "a photo of <unk>"
  with pytest.raises(ValueError, match="max_len"):
    tok.encode(["a"], max_len=2)
  with pytest.raises(TypeError, match="list of strings"):
    tok.encode("a photo", max_len=6)


def test_clip_loss_by_hand():
  eye = jnp.eye(2)
  # scale 1, I = T = identity: logits = I; each row's CE = -log(e / (e + 1)) = log(1 + e^-1) = 0.3132617,
  # for both directions, so the loss is 0.3132617.
  np.testing.assert_allclose(float(clip.clip_loss(eye, eye, 1.0)), math.log1p(math.exp(-1.0)), atol=1e-4)
  # T = [[1, 0], [1, 0]]: logits_per_image = [[1, 1], [0, 0]]
  #   image->text: row 0 -log(e / 2e) = log 2, row 1 -log(1 / 2) = log 2            -> mean 0.6931472
  #   text->image (transpose [[1, 0], [1, 0]]): row 0 log(1 + e^-1) = 0.3132617, row 1 log(1 + e) = 1.3132617
  #                                                                                   -> mean 0.8132617
  #   loss = (0.6931472 + 0.8132617) / 2 = 0.7532044
  txt = jnp.asarray([[1.0, 0.0], [1.0, 0.0]])
  np.testing.assert_allclose(float(clip.clip_loss(eye, txt, 1.0)), 0.7532044, atol=1e-4)
  # scale 2 on the identity: CE = log(1 + e^-2) = 0.1269280
  np.testing.assert_allclose(float(clip.clip_loss(eye, eye, 2.0)), 0.1269280, atol=1e-4)
  with pytest.raises(ValueError, match="paired"):
    clip.clip_loss(eye, jnp.ones((3, 2)), 1.0)


def test_logit_scale_init_and_clamp(tiny):
  _, state, _ = tiny
  np.testing.assert_allclose(float(state.params["logit_scale"]), math.log(1 / 0.07), rtol=1e-6)
  big = clip.clamp_logit_scale({**state.params, "logit_scale": jnp.asarray(10.0)})
  np.testing.assert_allclose(float(jnp.exp(big["logit_scale"])), 100.0, rtol=1e-5)
  neg = clip.clamp_logit_scale({**state.params, "logit_scale": jnp.asarray(-1.0)})
  assert float(neg["logit_scale"]) == 0.0


def test_zero_shot_by_hand():
  # class 0 templates [1, 0] and [0.6, 0.8] -> mean [0.8, 0.4] -> unit [0.8944, 0.4472]
  # class 1 templates [0, 1] and [0, 2] (normalised to [0, 1] first) -> [0, 1]
  cls = jnp.asarray([[[1.0, 0.0], [0.6, 0.8]], [[0.0, 1.0], [0.0, 2.0]]])
  w = clip.zero_shot_classifier(cls)
  np.testing.assert_allclose(np.asarray(w), [[2 / math.sqrt(5), 1 / math.sqrt(5)], [0.0, 1.0]], rtol=1e-6)
  # image [1, 0]: sims (0.894, 0) -> 0; [0.6, 0.8]: (0.894, 0.8) -> 0; [0, 1]: (0.447, 1) -> 1
  img = jnp.asarray([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]])
  labels = jnp.asarray([0, 1, 1])
  np.testing.assert_allclose(float(clip.zero_shot_accuracy(img, cls, labels)), 2 / 3, rtol=1e-6)
  np.testing.assert_allclose(float(clip.zero_shot_accuracy(img, cls, labels, mask=jnp.asarray([1, 0, 1]))), 1.0)
  np.testing.assert_allclose(float(clip.zero_shot_accuracy(img, w, labels)), 2 / 3, rtol=1e-6)   # [C, D] too
  with pytest.raises(ValueError, match="labels"):
    clip.zero_shot_accuracy(img, cls, labels[:2])


def test_towers_shapes_and_errors(tiny):
  model, state, batch = tiny
  img, txt, scale = jax.jit(model.apply)({"params": state.params}, batch["image"], batch["text"])
  chex.assert_shape([img, txt], (16, 8))
  chex.assert_type([img, txt], jnp.float32)
  np.testing.assert_allclose(np.linalg.norm(np.asarray(img), axis=1), 1.0, rtol=1e-5)
  vit = clip.ViT(num_classes=8, patch_size=4, width=16, depth=1, heads=2)
  v_params = jax.jit(vit.init)(jax.random.key(0), jnp.zeros((2, 8, 8, 1)))
  out, feats = jax.jit(vit.apply, static_argnames="return_features")(v_params, jnp.zeros((3, 8, 8, 1)),
                                                                      return_features=True)
  chex.assert_shape(out, (3, 8))
  chex.assert_shape(feats, (3, 16))
  with pytest.raises(ValueError, match="patch_size"):
    vit.apply(v_params, jnp.zeros((1, 10, 10, 1)))
  feat_tower = clip.FeatureTextTower(embed_dim=8)
  f_params = feat_tower.init(jax.random.key(0), jnp.zeros((2, 5)))
  chex.assert_shape(feat_tower.apply(f_params, jnp.ones((4, 5))), (4, 8))
  with pytest.raises(ValueError, match="float features"):
    feat_tower.apply(f_params, jnp.ones((4, 5), jnp.int32))
  with pytest.raises(ValueError, match="integer token ids"):
    model.apply({"params": state.params}, batch["text"].astype(np.float32), method=clip.CLIP.encode_text)
  with pytest.raises(ValueError, match="unknown image tower"):
    clip.create_image_encoder(ml_collections.ConfigDict(dict(name="swin")), 8)


def test_text_tower_pools_at_last_token_and_ignores_trailing_pads(tiny):
  model, state, batch = tiny
  ids = batch["text"][:4]                                 # [4, 6], the last column is padding
  shorter = ids[:, :5]                                    # drops the trailing pad column
  enc = jax.jit(lambda p, t: model.apply({"params": p}, t, method=clip.CLIP.encode_text))
  a, b = enc(state.params, ids), enc(state.params, shorter)
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_train_step_lowers_loss_once_compiled(tiny):
  model, state, batch = tiny
  step = jax.jit(chex.assert_max_traces(clip.make_train_step(model), n=1))
  key = jax.random.key(1)
  losses = []
  for _ in range(8):
    state, metrics = step(state, batch, key)
    losses.append(float(metrics["loss"]))
  assert losses[-1] < losses[0]
  assert float(jnp.exp(state.params["logit_scale"])) <= 100.0 + 1e-4


def test_train_step_same_on_1_and_8_devices(tiny):
  model, state, batch = tiny
  step = clip.make_train_step(model)
  outs = []
  for devs in (jax.devices()[:1], jax.devices()):
    mesh = sharding.make_mesh(devices=devs)
    s = sharding.replicate(state, mesh)
    fn = loop_lib.compile_step(step, mesh, donate=False)
    new, metrics = fn(s, sharding.shard_batch(batch, mesh), jax.random.key(2))
    outs.append((float(metrics["loss"]), np.asarray(new.params["logit_scale"])))
  np.testing.assert_allclose(outs[0][0], outs[1][0], rtol=1e-5)
  np.testing.assert_allclose(outs[0][1], outs[1][1], rtol=1e-5)


def test_encode_helpers_pad_and_normalise(tiny):
  model, state, batch = tiny
  emb = clip.encode_images(model, state.params, batch["image"][:11], batch_size=4)
  chex.assert_shape(emb, (11, 8))
  np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-5)
  direct = model.apply({"params": state.params}, batch["image"][:11], method=clip.CLIP.encode_image)
  np.testing.assert_allclose(emb, np.asarray(direct), rtol=1e-5, atol=1e-6)
  txt = clip.encode_texts(model, state.params, batch["text"][:5])
  chex.assert_shape(txt, (5, 8))


def test_l2_normalize_has_finite_gradient_at_zero():
  g = jax.grad(lambda x: jnp.sum(clip.l2_normalize(x)))(jnp.zeros((2, 3)))
  assert np.isfinite(np.asarray(g)).all()


def test_vit_controls_and_hidden_states():
  """Per-block additive controls (DA-CLIP): zeros change nothing; a control after the last block is added to
  the token stream before ln_post; hidden states are the block outputs; the param names are the plain ViT's."""
  vit = clip.ViT(num_classes=6, patch_size=4, width=16, depth=3, heads=2)
  x = jnp.asarray(np.random.default_rng(0).random((2, 8, 8, 1)), jnp.float32)
  params = jax.jit(vit.init)(jax.random.key(0), x)
  # No new parameters: the same tree as a ViT without controls (a frozen encoder's weights load unchanged).
  assert set(params["params"]) == {"patch_embed", "cls_token", "pos_embed", "ln_pre", "block0", "block1", "block2",
                                   "ln_post", "proj"}
  apply = jax.jit(vit.apply, static_argnames=("return_features", "return_hidden"))
  plain = apply(params, x)
  out, feats, hidden = apply(params, x, return_features=True, return_hidden=True)
  assert len(hidden) == 3
  chex.assert_shape(list(hidden), (2, 5, 16))                       # 1 + (8/4)^2 tokens
  np.testing.assert_allclose(np.asarray(out), np.asarray(plain), rtol=1e-6)
  zeros = [jnp.zeros((2, 5, 16))] * 3
  np.testing.assert_allclose(np.asarray(apply(params, x, controls=zeros)), np.asarray(plain), rtol=1e-6, atol=1e-7)
  # A control c after the last block: out = proj(ln_post(hidden[-1] + c)[:, 0]), computed here by hand.
  c = jnp.asarray(np.random.default_rng(1).normal(size=(2, 5, 16)), jnp.float32)
  got = apply(params, x, controls=zeros[:2] + [c])
  ln = params["params"]["ln_post"]
  h = hidden[-1] + c
  mean = h.mean(-1, keepdims=True)
  var = ((h - mean) ** 2).mean(-1, keepdims=True)
  normed = (h - mean) / jnp.sqrt(var + 1e-5) * ln["scale"] + ln["bias"]
  want = normed[:, 0] @ params["params"]["proj"]["kernel"]
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)
  # A control after block 0 changes the later hidden states but not hidden[0] (recorded before the addition).
  _, hid_c = apply(params, x, controls=[c] + zeros[:2], return_hidden=True)
  np.testing.assert_allclose(np.asarray(hid_c[0]), np.asarray(hidden[0]), rtol=1e-6)
  assert not np.allclose(np.asarray(hid_c[1]), np.asarray(hidden[1]))
  with pytest.raises(ValueError, match="controls for depth"):
    vit.apply(params, x, controls=zeros[:2])
  with pytest.raises(ValueError, match="control 1 has shape"):
    vit.apply(params, x, controls=[zeros[0], jnp.zeros((2, 4, 16)), zeros[0]])


def _vit_clip(dtype, remat, scan=False):
  """A tiny ViT + text-transformer CLIP with the given compute dtype, remat and scan (OpenCLIP amp / checkpointing)."""
  opts = dict(dtype=dtype, remat=remat, scan=scan)
  cfg = ml_collections.ConfigDict(dict(
      embed_dim=8, image=dict(name="vit", patch_size=4, width=16, depth=2, heads=2, **opts),
      text=dict(name="transformer", max_len=6, width=16, depth=2, heads=2, **opts)))
  return clip.create_clip(cfg, VOCAB)


def _stack_blocks(tower, depth):
  """Unrolled tower params (block0..block{L-1}) -> the scanned layout (blocks/block, leaves stacked [L, ...])."""
  out = {k: v for k, v in tower.items() if not k.startswith("block")}
  out["blocks"] = {"block": jax.tree.map(lambda *xs: jnp.stack(xs), *[tower[f"block{i}"] for i in range(depth)])}
  return out


def test_mixed_precision_and_remat_keep_the_loss(tiny):
  _, _, batch = tiny
  reference = _vit_clip("float32", False)
  params = jax.jit(reference.init)(jax.random.key(3), batch["image"], batch["text"])["params"]

  def loss_and_grads(model):
    fn = jax.jit(jax.value_and_grad(lambda p: clip.loss_fn(p, model, batch)[0]))
    return fn(params)

  loss_ref, g_ref = loss_and_grads(reference)
  remat_model, bf16_model = _vit_clip("float32", True), _vit_clip("bfloat16", True)
  # The same parameter tree for all three: a checkpoint moves between them unchanged, parameters stay float32.
  for model in (remat_model, bf16_model):
    shapes = jax.eval_shape(model.init, jax.random.key(3), batch["image"], batch["text"])["params"]
    assert jax.tree.structure(shapes) == jax.tree.structure(params)
    assert {x.dtype for x in jax.tree.leaves(shapes)} == {jnp.dtype(jnp.float32)}
  # Remat recomputes the same forward: the loss is bit-identical; the gradients equal up to float32 reassociation.
  text = str(jax.make_jaxpr(lambda p: jax.grad(lambda q: clip.loss_fn(q, remat_model, batch)[0])(p))(params))
  assert "checkpoint" in text or "remat" in text
  loss_remat, g_remat = loss_and_grads(remat_model)
  assert float(loss_remat) == float(loss_ref)
  for a, b in zip(jax.tree.leaves(g_remat), jax.tree.leaves(g_ref)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
  # bfloat16 compute rounds every matmul input to 8 significant bits (unit roundoff u = 2^-9): the loss agrees to
  # 2u relative; gradients come back float32 (f32 master weights) and point the same way (cosine > 0.99; their
  # relative L2 error is 4.6% on this random-init model, where small gradient entries carry bf16's absolute error).
  loss_bf16, g_bf16 = loss_and_grads(bf16_model)
  assert float(loss_bf16) != float(loss_ref)                      # bf16 really is used
  np.testing.assert_allclose(float(loss_bf16), float(loss_ref), rtol=2.0 ** -8)
  flat = lambda g: np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(g)])  # noqa: E731
  assert {x.dtype for x in jax.tree.leaves(g_bf16)} == {jnp.dtype(jnp.float32)}
  cosine = flat(g_bf16) @ flat(g_ref) / (np.linalg.norm(flat(g_bf16)) * np.linalg.norm(flat(g_ref)))
  assert cosine > 0.99, cosine
  # The scanned towers (params stacked [depth, ...]) compute the same loss from the same weights.
  stacked = {**params, "image_encoder": _stack_blocks(params["image_encoder"], 2),
             "text_encoder": _stack_blocks(params["text_encoder"], 2)}
  scan_model = _vit_clip("float32", True, scan=True)
  shapes = jax.eval_shape(scan_model.init, jax.random.key(3), batch["image"], batch["text"])["params"]
  assert jax.tree.structure(shapes) == jax.tree.structure(stacked)
  loss_scan = jax.jit(lambda p: clip.loss_fn(p, scan_model, batch)[0])(stacked)
  np.testing.assert_allclose(float(loss_scan), float(loss_ref), rtol=1e-6)
  emb = bf16_model.apply({"params": params}, batch["image"], method=clip.CLIP.encode_image)
  assert emb.dtype == jnp.float32                                 # the loss and its [B, B] logits run in float32
  with pytest.raises(ValueError, match="tower dtype 'float16'"):
    _vit_clip("float16", False)


def test_scanned_vit_matches_unrolled_with_controls_and_hidden():
  x = jnp.asarray(np.random.default_rng(2).random((2, 8, 8, 1)), jnp.float32)
  plain, scanned = clip.ViT(num_classes=6, width=16, depth=3, heads=2), clip.ViT(num_classes=6, width=16, depth=3,
                                                                                 heads=2, scan=True)
  params = plain.init(jax.random.key(0), x)["params"]
  stacked = _stack_blocks(params, 3)
  controls = list(jnp.asarray(np.random.default_rng(3).normal(size=(3, 2, 5, 16)), jnp.float32))
  want, want_hidden = plain.apply({"params": params}, x, controls=controls, return_hidden=True)
  got, got_hidden = scanned.apply({"params": stacked}, x, controls=controls, return_hidden=True)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
  for g, w in zip(got_hidden, want_hidden, strict=True):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)
