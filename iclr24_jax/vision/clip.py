"""A CLIP-style dual encoder (Radford et al., 2021; OpenCLIP) as pure Flax Linen functions.

Two towers map an image and a caption into one embedding space; a symmetric InfoNCE loss with a learned
temperature pulls matching pairs together and pushes the other pairs of the batch apart; zero-shot
classification embeds text templates per class ("a photo of the digit {}.") and picks the class whose
averaged template embedding is closest to the image embedding. Shared by clip_ood and daclip.

  from iclr24_jax.vision import clip
  tok = clip.WordTokenizer.build(captions)                       # word-level vocabulary of the captions
  model = clip.create_clip(config.model, vocab_size=tok.vocab_size)
  state = clip.init(key, model, (16, 16, 1), (12,), jnp.int32, clip.make_optimizer(opt, steps))
  step = jax.jit(clip.make_train_step(model))                    # or common.loop.compile_step over a mesh
  state, metrics = step(state, {"image": x [B, H, W, C], "text": tok.encode(captions, 12)}, key)
  img = clip.encode_images(model, state.params, x_test)          # [N, D], unit norm
  cls = clip.encode_texts(model, state.params, tok.encode(prompts, 12)).reshape(C, T, D)
  acc = clip.zero_shot_accuracy(img, cls, labels)                 # templates averaged per class

Image towers: `vision.models.CNN` / `ResNet` / `MLP` with `num_classes = embed_dim` (their last dense
layer is the image projection), or the small `ViT` below. `ViT(x, controls=[c_0..c_{L-1}], return_hidden=True)`
adds per-block controls and returns the block outputs: a weight copy of a frozen ViT becomes its controller
(DA-CLIP, papers/daclip) without renaming a parameter. Text towers: `TextTransformer` (token ids
[B, T] from `WordTokenizer` or any tokenizer, trained from scratch, causal mask, pooled at the last token
as CLIP pools at EOT) or `FeatureTextTower` (a trainable projection of frozen sentence embeddings [B, F],
e.g. MiniLM from `iclr24_jax.lm`; the vision family does not import lm, the caller embeds).

Conventions (as OpenCLIP): embeddings are L2-normalised before the loss; `logit_scale` is stored as a log
(init log(1/0.07)) and exponentiated in the forward pass; after every optimizer update the stored log is
clamped to [0, log(100)] (`clamp_logit_scale`), so the multiplier never exceeds 100; AdamW with
beta2 = 0.98, eps = 1e-6 and no weight decay on biases, norms and the logit scale.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import math
import re
from typing import Any, Callable, ClassVar, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from iclr24_jax.common import data as data_lib
from iclr24_jax.common.sharding import constrain_batch
from iclr24_jax.common.optim import make_schedule
from iclr24_jax.common.train_state import TrainState
from iclr24_jax.vision import models as vision_models

LOGIT_SCALE_INIT = math.log(1.0 / 0.07)  # CLIP's initial temperature 0.07, stored as log(1 / T)
LOGIT_SCALE_MAX = 100.0                   # CLIP / OpenCLIP clamp of exp(logit_scale)

__all__ = ["LOGIT_SCALE_INIT", "LOGIT_SCALE_MAX", "WordTokenizer", "TransformerBlock", "ViT", "TextTransformer",
           "FeatureTextTower", "CLIP", "create_image_encoder", "create_text_encoder", "create_clip", "l2_normalize",
           "clip_logits", "clip_loss", "clamp_logit_scale", "zero_shot_classifier", "zero_shot_logits",
           "zero_shot_accuracy", "init", "loss_fn", "make_train_step", "make_optimizer", "encode_images",
           "encode_texts"]


# ----------------------------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------------------------

_WORD = re.compile(r"[a-z0-9]+")


@dataclasses.dataclass(frozen=True)
class WordTokenizer:
  """A word-level tokenizer over a fixed vocabulary (lower-cased alphanumeric words).

  Ids: 0 = pad, 1 = start of text, 2 = end of text, 3 = unknown word, then the vocabulary. Enough for
  template captions ("a rotated handwritten 7"); use a BPE tokenizer (`iclr24_jax.lm`) for free text.

  Attributes:
    words: the vocabulary, in id order after the four special tokens.
  """

  words: tuple[str, ...]
  PAD: ClassVar[int] = 0
  SOT: ClassVar[int] = 1
  EOT: ClassVar[int] = 2
  UNK: ClassVar[int] = 3
  SPECIALS: ClassVar[tuple[str, ...]] = ("<pad>", "<sot>", "<eot>", "<unk>")

  @classmethod
  def build(cls, texts: Sequence[str], min_count: int = 1) -> "WordTokenizer":
    """Vocabulary of every word occurring >= min_count times in `texts` (most frequent first, ties by name).

    Args:
      texts: strings (a list, not one str); words are lower-cased `split` tokens.
      min_count: the fewest occurrences a word needs.

    Returns:
      WordTokenizer (ids 0-3 are <pad>, <sot>, <eot>, <unk>; words follow).

    Raises:
      TypeError: texts is a single str.
    """
    if isinstance(texts, str):
      raise TypeError("WordTokenizer.build expects a list of strings, got one str; wrap it in a list.")
    counts = collections.Counter(w for t in texts for w in cls.split(t))
    words = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
    return cls(tuple(words))

  @staticmethod
  def split(text: str) -> list[str]:
    """The lower-cased word tokens of a text (the module's word regex)."""
    return _WORD.findall(text.lower())

  @property
  def vocab_size(self) -> int:
    return len(self.SPECIALS) + len(self.words)

  @functools.cached_property
  def _index(self) -> dict[str, int]:
    return {w: i + len(self.SPECIALS) for i, w in enumerate(self.words)}

  def encode(self, texts: Sequence[str], max_len: int) -> np.ndarray:
    """Token ids [N, max_len] int32: <sot> words... <eot>, right-padded with 0; long texts are cut and keep <eot>.

    Args:
      texts: N strings (a list); unknown words map to <unk>.
      max_len: row length (>= 3).

    Returns:
      numpy int32 [N, max_len].

    Raises:
      TypeError: texts is a single str.
      ValueError: if max_len < 3 (no room for one word between the markers).
    """
    if isinstance(texts, str):
      raise TypeError("WordTokenizer.encode expects a list of strings, got one str; wrap it in a list.")
    if max_len < 3:
      raise ValueError(f"max_len={max_len} leaves no room for a word between <sot> and <eot>; use >= 3.")
    out = np.zeros((len(texts), max_len), np.int32)
    index = self._index
    for r, t in enumerate(texts):
      ids = [self.SOT] + [index.get(w, self.UNK) for w in self.split(t)][:max_len - 2] + [self.EOT]
      out[r, :len(ids)] = ids
    return out

  def decode(self, ids: Sequence[int]) -> str:
    """Text of one id sequence: its words joined by spaces (<pad>, <sot>, <eot> dropped; <unk> kept)."""
    names = self.SPECIALS + self.words
    return " ".join(names[i] for i in ids if i not in (self.PAD, self.SOT, self.EOT))


# ----------------------------------------------------------------------------------------------------------------
# Towers
# ----------------------------------------------------------------------------------------------------------------


class TransformerBlock(nn.Module):
  """Pre-LayerNorm transformer block (as CLIP's ResidualAttentionBlock): x + attn(ln(x)), x + mlp(ln(x)).

  Attributes:
    width: model width.
    heads: attention heads (width must be divisible by heads).
    mlp_ratio: hidden width of the MLP / width.
    dtype: compute dtype of the layers (parameters stay float32, the residual stream stays in the input's
      dtype because a float32 stream plus a bfloat16 branch promotes to float32). bfloat16 is the mixed
      precision of OpenCLIP's `--precision amp_bf16`: bf16 matrix products, f32 master weights; LayerNorm
      statistics and the attention softmax are computed in float32 (Flax's defaults), as autocast does.
  """

  width: int
  heads: int
  mlp_ratio: float = 4.0
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """x [B, T, width], mask broadcastable to [B, heads, T, T] (True = attend) -> [B, T, width]."""
    h = nn.LayerNorm(epsilon=1e-5, dtype=self.dtype)(x)
    h = nn.MultiHeadDotProductAttention(num_heads=self.heads, qkv_features=self.width, deterministic=True,
                                        dtype=self.dtype, force_fp32_for_softmax=True)(h, h, mask=mask)
    x = x + h
    h = nn.LayerNorm(epsilon=1e-5, dtype=self.dtype)(x)
    h = nn.Dense(int(self.width * self.mlp_ratio), dtype=self.dtype)(h)
    h = nn.gelu(h)
    return x + nn.Dense(self.width, dtype=self.dtype)(h)


def _block_class(remat: bool, prevent_cse: bool = True) -> type[nn.Module]:
  """TransformerBlock, or its rematerialised form (activations inside a block are recomputed in the backward).

  Same parameter names either way, so a checkpoint moves between the two. OpenCLIP's `--grad-checkpointing`
  (mlfoundations/open_clip@89fb801 src/open_clip_train/params.py:461-465) checkpoints each residual block the
  same way (src/open_clip/transformer.py:440-441: `checkpoint(blk, x, ...)` per block).
  """
  return nn.remat(TransformerBlock, prevent_cse=prevent_cse) if remat else TransformerBlock


class _BlockStep(nn.Module):
  """One scanned layer: h -> (block(h) + control, block(h)); the block's params are stacked over the scan."""

  width: int
  heads: int
  dtype: Any
  remat: bool

  @nn.compact
  def __call__(self, h: jax.Array, control: jax.Array | None, mask: jax.Array | None):
    # Inside a scan the loop boundary already keeps XLA from merging the recomputation with the forward.
    out = _block_class(self.remat, prevent_cse=False)(self.width, self.heads, dtype=self.dtype, name="block")(h, mask)
    out = constrain_batch(out)
    return (out if control is None else out + control), out


def _scanned_blocks(width: int, heads: int, depth: int, dtype: Any, remat: bool) -> nn.Module:
  """`depth` blocks as one `nn.scan` (params stacked [depth, ...] under 'blocks/block'; the MaxText habit).

  Called as (h [B, T, width], controls [depth, B, T, width] or None, mask or None) -> (h, hidden [depth, B, T, width]).
  One compiled layer instead of `depth` (faster compiles), and with remat the backward loop recomputes one
  layer at a time, so only the `depth` layer inputs stay live (an unrolled remat lets XLA schedule the
  recomputations early and keep them all).
  """
  return nn.scan(_BlockStep, variable_axes={"params": 0}, split_rngs={"params": True}, in_axes=(0, nn.broadcast),
                 length=depth)(width, heads, dtype, remat, name="blocks")


class ViT(nn.Module):
  """A small Vision Transformer: patches -> class token + learned positions -> pre-LN blocks -> projection.

  Controls (DA-CLIP, Luo et al. 2024; ControlNet-style): `controls` is an optional sequence of `depth` arrays
  [B, T, width] (T = 1 + number of patches); controls[i] is added to the token stream right after block i.
  `return_hidden` hands out the output of every block (before its control is added), so a weight copy of
  this encoder run with `return_hidden=True` can act as the controller of a frozen one. The controls add
  no parameters: a frozen encoder's params and the controller copy's params have the same names.

  Attributes:
    num_classes: output size (the embedding dimension when used as a CLIP image tower).
    patch_size: square patch side (image sides must be divisible by it).
    width, depth, heads: transformer size.
    pool: 'cls' (CLIP's choice) or 'mean' over patch tokens.
    dtype: compute dtype (float32, or bfloat16 for mixed precision; parameters stay float32, see
      `TransformerBlock`); the output is float32 either way.
    remat: rematerialise every transformer block (activation checkpointing; same numbers, less memory).
    scan: run the blocks as one `nn.scan` (params stacked under 'blocks/block' instead of block0..block{depth-1}).
  """

  num_classes: int = 64
  patch_size: int = 4
  width: int = 64
  depth: int = 2
  heads: int = 4
  pool: str = "cls"
  dtype: Any = jnp.float32
  remat: bool = False
  scan: bool = False

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False, return_features: bool = False,
               controls: Sequence[jax.Array] | None = None, return_hidden: bool = False):
    """Encodes images.

    Args:
      x: images [B, H, W, C].
      train: unused (no dropout); kept for the tower interface.
      return_features: also return the pooled features [B, width] before the projection.
      controls: None or `depth` arrays [B, T, width], controls[i] added after block i (T = 1 + H W / p^2).
      return_hidden: also return the `depth` block outputs, each [B, T, width] (before the control is added).

    Returns:
      out [B, num_classes]; with return_features (out, feats); with return_hidden the tuple of hidden
      states is appended: (out, hidden) or (out, feats, hidden).
    """
    b, hgt, wid, _ = x.shape
    p = self.patch_size
    if hgt % p or wid % p:
      raise ValueError(f"ViT: image size {hgt}x{wid} is not divisible by patch_size={p}; resize the images "
                       "or choose a patch size that divides both sides.")
    num_tokens = 1 + (hgt // p) * (wid // p)
    if controls is not None:
      controls = tuple(controls)
      if len(controls) != self.depth:
        raise ValueError(f"ViT got {len(controls)} controls for depth={self.depth}; pass one [B, T, width] "
                         "array per block (or None).")
      for i, c in enumerate(controls):
        if c.shape != (b, num_tokens, self.width):
          raise ValueError(f"ViT control {i} has shape {c.shape}; expected {(b, num_tokens, self.width)} "
                           "(batch, 1 + patches, width).")
    h = nn.Conv(self.width, (p, p), strides=(p, p), padding="VALID", dtype=self.dtype,
                name="patch_embed")(constrain_batch(x))
    h = constrain_batch(h.reshape(b, -1, self.width))
    cls_tok = self.param("cls_token", nn.initializers.normal(0.02), (1, 1, self.width))
    # The token stream stays float32 (f32 class token and positions promote the bf16 patch embedding), as
    # under autocast, where the residual additions run in the stream's float32.
    h = jnp.concatenate([jnp.broadcast_to(cls_tok, (b, 1, self.width)), h.astype(cls_tok.dtype)], axis=1)
    h = h + self.param("pos_embed", nn.initializers.normal(0.02), (1, h.shape[1], self.width))
    h = nn.LayerNorm(epsilon=1e-5, name="ln_pre")(h)
    if self.scan:
      stacked = None if controls is None else jnp.stack(controls)
      h, hid = _scanned_blocks(self.width, self.heads, self.depth, self.dtype, self.remat)(h, stacked, None)
      hidden = [hid[i] for i in range(self.depth)] if return_hidden else []
    else:
      hidden = []
      block = _block_class(self.remat)
      for i in range(self.depth):
        h = constrain_batch(block(self.width, self.heads, dtype=self.dtype, name=f"block{i}")(h))
        hidden.append(h)
        if controls is not None:
          h = h + controls[i]
    h = nn.LayerNorm(epsilon=1e-5, name="ln_post")(h)
    if self.pool == "cls":
      feats = h[:, 0]
    elif self.pool == "mean":
      feats = jnp.mean(h[:, 1:], axis=1)
    else:
      raise ValueError(f"ViT.pool='{self.pool}' is unknown; choose 'cls' or 'mean'.")
    out = nn.Dense(self.num_classes, use_bias=False, dtype=self.dtype, name="proj")(feats).astype(jnp.float32)
    result = (out, feats) if return_features else (out,)
    if return_hidden:
      result = result + (tuple(hidden),)
    return result if len(result) > 1 else out


class TextTransformer(nn.Module):
  """CLIP's text tower, small: token + position embeddings, causal pre-LN blocks, pooled at the last token.

  CLIP pools at the end-of-text token; with right padding and a causal mask that is the last non-pad
  position, which is what is used here (so any tokenizer with pad id `pad_id` works).

  Attributes:
    vocab_size: number of token ids.
    max_len: longest sequence (positions).
    embed_dim: output embedding size.
    width, depth, heads: transformer size.
    pad_id: padding id (right padding).
    causal: causal attention mask (CLIP) or bidirectional with a padding mask.
    dtype: compute dtype (float32, or bfloat16 for mixed precision; parameters stay float32, see
      `TransformerBlock`); the output is float32 either way.
    remat: rematerialise every transformer block (activation checkpointing; same numbers, less memory).
    scan: run the blocks as one `nn.scan` (params stacked under 'blocks/block' instead of block0..block{depth-1}).
  """

  vocab_size: int
  max_len: int = 16
  embed_dim: int = 64
  width: int = 64
  depth: int = 2
  heads: int = 4
  pad_id: int = 0
  causal: bool = True
  dtype: Any = jnp.float32
  remat: bool = False
  scan: bool = False

  @nn.compact
  def __call__(self, ids: jax.Array, train: bool = False) -> jax.Array:
    """ids [B, T] int (T <= max_len) -> [B, embed_dim] (not normalised)."""
    if ids.ndim != 2 or not jnp.issubdtype(ids.dtype, jnp.integer):
      raise ValueError(f"TextTransformer expects integer token ids [B, T], got {ids.dtype} {ids.shape}.")
    b, t = ids.shape
    if t > self.max_len:
      raise ValueError(f"TextTransformer got sequences of length {t} > max_len={self.max_len}; encode shorter "
                       "texts or raise model.text.max_len.")
    h = nn.Embed(self.vocab_size, self.width, embedding_init=nn.initializers.normal(0.02), name="token_embed")(ids)
    h = h + self.param("pos_embed", nn.initializers.normal(0.01), (self.max_len, self.width))[:t]
    h = constrain_batch(h)
    valid = ids != self.pad_id
    if self.causal:
      mask = nn.make_causal_mask(ids)                                  # [B, 1, T, T]
    else:
      mask = nn.make_attention_mask(valid, valid)
    if self.scan:
      h, _ = _scanned_blocks(self.width, self.heads, self.depth, self.dtype, self.remat)(h, None, mask)
    else:
      block = _block_class(self.remat)
      for i in range(self.depth):
        h = constrain_batch(block(self.width, self.heads, dtype=self.dtype, name=f"block{i}")(h, mask))
    h = nn.LayerNorm(epsilon=1e-5, name="ln_final")(h)
    last = jnp.maximum(jnp.sum(valid, axis=1) - 1, 0)                  # the <eot> position
    pooled = h[jnp.arange(b), last]
    return nn.Dense(self.embed_dim, use_bias=False, dtype=self.dtype, name="proj")(pooled).astype(jnp.float32)


class FeatureTextTower(nn.Module):
  """A trainable projection (optionally an MLP) of frozen, precomputed sentence embeddings [B, F].

  Attributes:
    embed_dim: output size.
    hidden: widths of hidden layers (empty: one linear projection, as LiT-style locked text towers).
  """

  embed_dim: int = 64
  hidden: Sequence[int] = ()

  @nn.compact
  def __call__(self, feats: jax.Array, train: bool = False) -> jax.Array:
    """feats [B, F] float -> [B, embed_dim]."""
    if feats.ndim != 2 or not jnp.issubdtype(feats.dtype, jnp.floating):
      raise ValueError(f"FeatureTextTower expects float features [B, F], got {feats.dtype} {feats.shape}.")
    h = feats
    for w in self.hidden:
      h = nn.gelu(nn.Dense(w)(h))
    return nn.Dense(self.embed_dim, use_bias=False, name="proj")(h)


class CLIP(nn.Module):
  """Dual encoder with a learned temperature.

  Attributes:
    image_encoder: images [B, H, W, C] -> [B, D] (called with `train=`).
    text_encoder: texts (ids [B, T] or features [B, F]) -> [B, D] (called with `train=`).
    logit_scale_init: initial value of the stored log scale (log(1/0.07)).
  """

  image_encoder: nn.Module
  text_encoder: nn.Module
  logit_scale_init: float = LOGIT_SCALE_INIT

  def setup(self):
    self.logit_scale = self.param("logit_scale", nn.initializers.constant(self.logit_scale_init), ())

  def encode_image(self, images: jax.Array, train: bool = False, normalize: bool = True) -> jax.Array:
    """images [B, H, W, C] -> [B, D] (unit norm unless normalize=False).

    Args:
      images: [B, H, W, C] float32.
      train: training mode of the tower (dropout / batch norm).
      normalize: L2-normalise the embeddings.

    Returns:
      [B, D] float32.
    """
    z = self.image_encoder(images, train=train)
    return l2_normalize(z) if normalize else z

  def encode_text(self, texts: jax.Array, train: bool = False, normalize: bool = True) -> jax.Array:
    """texts [B, T] ids or [B, F] features -> [B, D] (unit norm unless normalize=False).

    Args:
      texts: [B, T] int32 token ids or [B, F] float32 features.
      train: training mode of the tower.
      normalize: L2-normalise the embeddings.

    Returns:
      [B, D] float32.
    """
    z = self.text_encoder(texts, train=train)
    return l2_normalize(z) if normalize else z

  def __call__(self, images: jax.Array, texts: jax.Array, train: bool = False):
    """-> (image_emb [B, D], text_emb [B, D], scale = exp(logit_scale) scalar)."""
    return self.encode_image(images, train), self.encode_text(texts, train), jnp.exp(self.logit_scale)


_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def _compute_dtype(cfg: Any) -> Any:
  """The tower's compute dtype from its config field `dtype` ('float32' default, or 'bfloat16')."""
  name = str(cfg.get("dtype", "float32"))
  if name not in _DTYPES:
    raise ValueError(f"tower dtype '{name}' is unknown; choose 'float32' or 'bfloat16' (parameters stay float32).")
  return _DTYPES[name]


def create_image_encoder(cfg: Any, embed_dim: int) -> nn.Module:
  """Image tower from config: name 'cnn' | 'resnet' | 'mlp' (vision.models, last layer = projection) | 'vit'.

  Args:
    cfg: the tower's ConfigDict (name; 'vit' reads patch_size, width, depth, heads, pool, dtype ('float32' |
      'bfloat16' compute), remat, scan (bool); the others are passed to `vision.models.create_model`).
    embed_dim: D, the output (projection) width.

  Returns:
    Linen module images [B, H, W, C] -> [B, D] (not normalised; CLIP.encode_image normalises).

  Raises:
    ValueError: unknown tower name.
  """
  name = cfg.get("name", "cnn")
  if name == "vit":
    return ViT(embed_dim, patch_size=int(cfg.get("patch_size", 4)), width=int(cfg.get("width", 64)),
               depth=int(cfg.get("depth", 2)), heads=int(cfg.get("heads", 4)), pool=cfg.get("pool", "cls"),
               dtype=_compute_dtype(cfg), remat=bool(cfg.get("remat", False)),
               scan=bool(cfg.get("scan", False)))
  if name in ("cnn", "resnet", "resnet18", "mlp"):
    return vision_models.create_model(cfg, embed_dim)
  raise ValueError(f"unknown image tower '{name}'; choose 'cnn', 'resnet', 'mlp' or 'vit'.")


def create_text_encoder(cfg: Any, embed_dim: int, vocab_size: int | None = None) -> nn.Module:
  """Text tower from config: name 'transformer' (needs vocab_size) | 'features' (frozen embeddings + projection).

  Args:
    cfg: the tower's ConfigDict ('transformer': max_len, width, depth, heads, causal, dtype ('float32' |
      'bfloat16' compute), remat, scan (bool); 'features': hidden).
    embed_dim: D, the output width.
    vocab_size: token vocabulary size (required for 'transformer').

  Returns:
    Linen module texts ([B, T] int ids or [B, F] float features) -> [B, D].

  Raises:
    ValueError: unknown tower name, or 'transformer' without vocab_size.
  """
  name = cfg.get("name", "transformer")
  if name == "transformer":
    if not vocab_size:
      raise ValueError("a 'transformer' text tower needs vocab_size (e.g. WordTokenizer.vocab_size).")
    return TextTransformer(int(vocab_size), max_len=int(cfg.get("max_len", 16)), embed_dim=embed_dim,
                           width=int(cfg.get("width", 64)), depth=int(cfg.get("depth", 2)),
                           heads=int(cfg.get("heads", 4)), causal=bool(cfg.get("causal", True)),
                           dtype=_compute_dtype(cfg), remat=bool(cfg.get("remat", False)),
                           scan=bool(cfg.get("scan", False)))
  if name == "features":
    return FeatureTextTower(embed_dim, hidden=tuple(cfg.get("hidden", ())))
  raise ValueError(f"unknown text tower '{name}'; choose 'transformer' or 'features'.")


def create_clip(model_config: Any, vocab_size: int | None = None) -> CLIP:
  """CLIP from `config.model` with fields embed_dim, image (tower config), text (tower config), logit_scale_init.

  Args:
    model_config: the ConfigDict above (embed_dim default 64).
    vocab_size: text vocabulary size (for a 'transformer' text tower).

  Returns:
    the CLIP module.
  """
  d = int(model_config.get("embed_dim", 64))
  return CLIP(create_image_encoder(model_config.image, d), create_text_encoder(model_config.text, d, vocab_size),
              float(model_config.get("logit_scale_init", LOGIT_SCALE_INIT)))


# ----------------------------------------------------------------------------------------------------------------
# Loss and zero-shot classification
# ----------------------------------------------------------------------------------------------------------------


def l2_normalize(x: jax.Array, axis: int = -1, eps: float = 1e-12) -> jax.Array:
  """x / max(||x||, eps) along `axis` (the rows of a [N, D] matrix by default).

  Written as x * rsqrt(max(sum x^2, eps^2)) so the gradient stays finite at x = 0 (an all-black image
  through a ReLU network at init gives an exactly zero embedding; the gradient of ||x|| there is NaN).

  Args:
    x: float array of any shape, e.g. [N, D].
    axis: the axis normalised.
    eps: norm floor.

  Returns:
    x's shape, unit norm along axis (zero vectors stay zero).
  """
  sq = jnp.sum(jnp.square(x), axis=axis, keepdims=True)
  return x * jax.lax.rsqrt(jnp.maximum(sq, eps * eps))


def clip_logits(image_emb: jax.Array, text_emb: jax.Array, logit_scale: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Scaled cosine-similarity logits.

  Args:
    image_emb: [B, D] unit-norm image embeddings.
    text_emb: [B, D] unit-norm text embeddings (row i is the caption of image i).
    logit_scale: the multiplier exp(stored log scale), a scalar (<= 100 after clamping).

  Returns:
    logits_per_image [B, B] = scale * I T^T, and logits_per_text [B, B] (its transpose).
  """
  logits_per_image = logit_scale * image_emb @ text_emb.T
  return logits_per_image, logits_per_image.T


def clip_loss(image_emb: jax.Array, text_emb: jax.Array, logit_scale: jax.Array) -> jax.Array:
  """Symmetric InfoNCE (CLIP Eq.): mean of image->text and text->image cross-entropy, targets on the diagonal.

  Args:
    image_emb: [B, D] unit-norm image embeddings.
    text_emb: [B, D] unit-norm text embeddings, paired row by row.
    logit_scale: scalar multiplier exp(log scale) (OpenCLIP passes the exponentiated value, as here).

  Returns:
    scalar loss = (CE(logits_per_image, arange(B)) + CE(logits_per_text, arange(B))) / 2.
  """
  if image_emb.ndim != 2 or image_emb.shape != text_emb.shape:
    raise ValueError(f"clip_loss needs paired [B, D] embeddings of equal shape, got image {image_emb.shape} "
                     f"and text {text_emb.shape}.")
  logits_i, logits_t = clip_logits(image_emb, text_emb, logit_scale)
  labels = jnp.arange(image_emb.shape[0])
  loss_i = optax.softmax_cross_entropy_with_integer_labels(logits_i, labels)
  loss_t = optax.softmax_cross_entropy_with_integer_labels(logits_t, labels)
  return 0.5 * (jnp.mean(loss_i) + jnp.mean(loss_t))


def clamp_logit_scale(params: Any, max_scale: float = LOGIT_SCALE_MAX) -> Any:
  """Clamps the stored log scale to [0, log(max_scale)] (OpenCLIP does this after every optimizer step).

  Args:
    params: CLIP params dict with a scalar 'logit_scale' (the log of the multiplier).
    max_scale: the largest multiplier exp(logit_scale) allowed (100 in CLIP).

  Returns:
    params with 'logit_scale' clipped (other entries shared, not copied).

  Raises:
    KeyError: params have no 'logit_scale'.
  """
  if "logit_scale" not in params:
    raise KeyError("params have no 'logit_scale' entry; pass the params of a CLIP module.")
  return {**params, "logit_scale": jnp.clip(params["logit_scale"], 0.0, math.log(max_scale))}


def zero_shot_classifier(class_text_emb: jax.Array) -> jax.Array:
  """Class weights from template embeddings: normalise each, average over templates, renormalise.

  Args:
    class_text_emb: [C, T, D] (T templates per class) or [C, D] (one prompt per class).

  Returns:
    [C, D] unit-norm class embeddings (the OpenAI / OpenCLIP zero-shot classifier).
  """
  if class_text_emb.ndim == 2:
    return l2_normalize(class_text_emb)
  if class_text_emb.ndim != 3:
    raise ValueError(f"class_text_emb must be [C, T, D] or [C, D], got shape {class_text_emb.shape}.")
  return l2_normalize(jnp.mean(l2_normalize(class_text_emb), axis=1))


def zero_shot_logits(image_emb: jax.Array, class_text_emb: jax.Array) -> jax.Array:
  """Cosine similarities [N, C] between unit-norm images [N, D] and the class classifier of `class_text_emb`.

  Args:
    image_emb: [N, D] unit-norm image embeddings.
    class_text_emb: [C, T, D] template embeddings or [C, D] class embeddings (see `zero_shot_classifier`).

  Returns:
    [N, C] cosine similarities in [-1, 1] (unscaled).

  Raises:
    ValueError: class_text_emb is neither 2-D nor 3-D.
  """
  return image_emb @ zero_shot_classifier(class_text_emb).T


def zero_shot_accuracy(image_emb: jax.Array, class_text_emb: jax.Array, labels: jax.Array,
                       mask: jax.Array | None = None) -> jax.Array:
  """Top-1 zero-shot accuracy.

  Args:
    image_emb: [N, D] unit-norm image embeddings.
    class_text_emb: [C, T, D] template embeddings per class (averaged) or [C, D] class embeddings.
    labels: [N] int class ids.
    mask: optional [N] bool, rows to count (padding excluded).

  Returns:
    scalar float32 accuracy in [0, 1].
  """
  if labels.shape != image_emb.shape[:1]:
    raise ValueError(f"labels {labels.shape} do not match image_emb {image_emb.shape}.")
  correct = (jnp.argmax(zero_shot_logits(image_emb, class_text_emb), -1) == labels).astype(jnp.float32)
  if mask is None:
    return jnp.mean(correct)
  mask = mask.astype(jnp.float32)
  return jnp.sum(correct * mask) / jnp.maximum(jnp.sum(mask), 1.0)


# ----------------------------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------------------------


def make_optimizer(opt_config: Any, num_steps: int) -> optax.GradientTransformation:
  """AdamW as OpenCLIP: no weight decay on biases, LayerNorm gains and logit_scale.

  Config fields: learning_rate, schedule, warmup_steps, end_factor (see common.optim.make_schedule),
  weight_decay (0.2 in OpenCLIP), b1 (0.9), b2 (0.98), eps (1e-6), grad_clip (0 = off).
  Weight decay applies only to leaves with ndim >= 2 not named bias / scale / logit_scale.

  Args:
    opt_config: ConfigDict with the fields above.
    num_steps: total training steps (for the schedule).

  Returns:
    optax.GradientTransformation.
  """
  sched = make_schedule(opt_config, num_steps)

  def decay_mask(params):
    def keep(path, p):
      name = str(getattr(path[-1], "key", path[-1]))
      return p.ndim >= 2 and name not in ("bias", "scale", "logit_scale")
    return jax.tree_util.tree_map_with_path(keep, params)

  tx = optax.adamw(sched, b1=float(opt_config.get("b1", 0.9)), b2=float(opt_config.get("b2", 0.98)),
                   eps=float(opt_config.get("eps", 1e-6)), weight_decay=float(opt_config.get("weight_decay", 0.2)),
                   mask=decay_mask)
  clip = float(opt_config.get("grad_clip", 0.0))
  return optax.chain(optax.clip_by_global_norm(clip), tx) if clip else tx


def init(key: jax.Array, model: CLIP, image_shape: Sequence[int], text_shape: Sequence[int],
         text_dtype: Any, tx: optax.GradientTransformation) -> TrainState:
  """Initialises CLIP params -> TrainState.

  Args:
    key: init key.
    model: a `CLIP` module.
    image_shape: one image's shape, e.g. (16, 16, 1).
    text_shape: one text's shape: (T,) token ids or (F,) features.
    text_dtype: jnp.int32 for ids, jnp.float32 for features.
    tx: the optimizer.

  Returns:
    TrainState (step 0).
  """
  images = jnp.zeros((2,) + tuple(image_shape), jnp.float32)
  texts = jnp.zeros((2,) + tuple(text_shape), text_dtype)
  params = model.init({"params": key}, images, texts)["params"]
  return TrainState.create(params, tx)



def loss_fn(params: Any, model: CLIP, batch: dict, key: jax.Array | None = None):
  """CLIP loss of a batch {'image': [B, H, W, C], 'text': [B, T] ids or [B, F]} -> (loss, metrics).

  Metrics: loss, logit_scale (the multiplier), i2t / t2i in-batch retrieval accuracy.

  Args:
    params: CLIP params (differentiated).
    model: the CLIP module.
    batch: {'image': [B, H, W, C] float32, 'text': [B, T] int32 ids or [B, F] float32 features}.
    key: dropout key (None: no dropout rng).

  Returns:
    (scalar loss, metrics dict of scalars).
  """
  rngs = {"dropout": key} if key is not None else None
  img, txt, scale = model.apply({"params": params}, batch["image"], batch["text"], train=True, rngs=rngs)
  loss = clip_loss(img, txt, scale)
  logits_i, _ = clip_logits(img, txt, scale)
  labels = jnp.arange(img.shape[0])
  metrics = {"loss": loss, "logit_scale": scale,
             "i2t_accuracy": jnp.mean(jnp.argmax(logits_i, 1) == labels),
             "t2i_accuracy": jnp.mean(jnp.argmax(logits_i, 0) == labels)}
  return loss, metrics


def make_train_step(model: CLIP, logit_scale_max: float = LOGIT_SCALE_MAX) -> Callable:
  """Returns the pure `train_step(state, batch, key) -> (state, metrics)` (clamps the scale after the update).

  The step is written in the global view: under `common.loop.compile_step` the batch is sharded over the
  mesh's 'data' axis and XLA gathers the embeddings for the [B, B] similarity matrix (CLIP's all-gather).

  Args:
    model: the CLIP module.
    logit_scale_max: see `clamp_logit_scale`.

  Returns:
    train_step(state, batch as in `loss_fn`, key) -> (TrainState, metrics); it folds state.step into key.
  """

  def train_step(state: TrainState, batch: dict, key: jax.Array):
    key = jax.random.fold_in(key, state.step)
    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, model, batch, key)
    state = state.apply_gradients(grads)
    return state.replace(params=clamp_logit_scale(state.params, logit_scale_max)), metrics

  return train_step


@functools.lru_cache(maxsize=64)   # one jitted function per static value: jit caches by function identity
def _compiled_encoder(model: CLIP, which: str) -> Callable:
  def fwd(params, x):
    if which == "image":
      return model.apply({"params": params}, x, method=CLIP.encode_image)
    return model.apply({"params": params}, x, method=CLIP.encode_text)
  return jax.jit(fwd)


def _encode(model: CLIP, params: Any, x: np.ndarray, which: str, batch_size: int) -> np.ndarray:
  x = np.asarray(x)
  n = x.shape[0]
  if n == 0:
    raise ValueError(f"encode_{which}s got no rows.")
  fn = _compiled_encoder(model, which)
  bs = min(int(batch_size), n)
  outs = [np.asarray(jax.device_get(fn(params, b[which]))) for b, _ in data_lib.eval_batches({which: x}, bs)]
  return np.concatenate(outs)[:n]


def encode_images(model: CLIP, params: Any, images: np.ndarray, batch_size: int = 1024) -> np.ndarray:
  """Unit-norm image embeddings [N, D] of images [N, H, W, C] (fixed-size batches, compiled once).

  Args:
    model: the CLIP module.
    params: its params.
    images: [N, H, W, C] float32 (N >= 1), in the range the model was trained on.
    batch_size: rows per call (capped at N; the last batch is padded).

  Returns:
    numpy float32 [N, D].

  Raises:
    ValueError: N == 0.
  """
  return _encode(model, params, images, "image", batch_size)


def encode_texts(model: CLIP, params: Any, texts: np.ndarray, batch_size: int = 1024) -> np.ndarray:
  """Unit-norm text embeddings [N, D] of token ids [N, T] or features [N, F] (fixed-size batches).

  Args:
    model: the CLIP module.
    params: its params.
    texts: [N, T] int token ids or [N, F] float features (N >= 1).
    batch_size: rows per call (capped at N; the last batch is padded).

  Returns:
    numpy float32 [N, D].

  Raises:
    ValueError: N == 0.
  """
  return _encode(model, params, texts, "text", batch_size)
