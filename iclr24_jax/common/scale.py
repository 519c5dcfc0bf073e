"""Paper scale: a paper's own configuration compiled ahead of time on abstract sharded inputs.

`jax.jit(fn).lower(*abstract_args).compile()` on `jax.ShapeDtypeStruct` inputs that carry shardings allocates
nothing, so a CPU can say whether a Llama-2-7B finetuning step compiles over 8 or 64 devices, how many bytes each
device holds, and how many FLOPs a step costs. `iclr24 scale` (`iclr24_jax/launch/scale.py`) runs this for every paper and writes
`results/SCALE.md` and `results/scale/<slug>.json`.

The interface a paper implements (in `iclr24_jax/papers/<slug>/study.py`):

  def scale_program(config, mesh) -> common.scale.Program

for its `paper` config variant (`configs/<slug>.py:paper`): the paper's train step, or its core routine where
the paper trains nothing (a sampler, a selection pass, an annotation or judging batch), built from the library's
own pure functions at the sizes of the official run script. A `Program` holds

  name            what runs, e.g. 'llama2_7b full finetuning step'
  fn              the pure, un-jitted function
  args            its arguments: a tuple of pytrees of `jax.ShapeDtypeStruct`, each leaf carrying its
                  `NamedSharding` over `mesh` (`abstract(shapes, shardings)` builds them)
  in_shardings / out_shardings / donate_argnums   passed to `jax.jit` (None: taken from args / propagated)
  params          number of model parameters (a LoRA base or a frozen reference copy counted once)
  items_per_step  tokens (or images, samples, ...) per step, with `item` naming the unit
  hand_flops      FLOPs of one step by hand (e.g. 6 x params x tokens + attention), all devices together
  kind            'train' or 'inference'; carry: the first output replaces the first argument on the next
                  step (a train state) when `experiments.scale --run` times it
  abstract_params the parameter pytree (a sub-tree of args) whose per-device bytes and replication are checked
  notes, paper_hardware, paper_time   free text for the table (deviations, the paper's reported setup)

The `paper` variant of `configs/<slug>.py` sets the paper's own hyperparameters in its usual fields (optimizer,
num_steps, data.name, mesh) and a `scale` block with at least `batch_size` (the global batch the program shards
over 'data'; `experiments.scale` builds the mesh with `mesh_for(devices, batch_size, config.mesh.model)`),
`paper_hardware`, `paper_time` and `source` (the official files and lines the sizes come from); `paper_scale`
fetches it.

Building blocks for those programs: `logical_shardings` (MaxText-style logical axis names -> mesh axes, with
FSDP on 'data' and tensor parallelism on 'model'), `fsdp_shardings` (models without axis names: the largest
divisible dimension over 'data'), `train_state_shardings` (a `TrainState` whose optimizer state follows its
params), `abstract`, `batch_shardings`, `mesh_for` (a mesh whose 'data' axis divides the batch). The LM family's
builders (`iclr24_jax/lm/scale.py`) show the whole path; a model without axis names (a UNet, a ResNet) needs
only these:

  def scale_program(config, mesh):
    s = scale.paper_scale(config, 'mdm')
    state = jax.eval_shape(lambda: init(jax.random.key(0), config))     # the TrainState, nothing allocated
    state_sh = scale.train_state_shardings(state, scale.fsdp_shardings(state.params, mesh), mesh)
    batch = {'images': jax.ShapeDtypeStruct((s.batch_size, 256, 256, 3), jnp.float32)}
    rep = NamedSharding(mesh, P())
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=rep)
    return scale.Program('UNet train step', train_step, (scale.abstract(state, state_sh),
                         scale.abstract(batch, scale.batch_shardings(batch, mesh)), key),
                         out_shardings=(state_sh, rep), donate_argnums=(0,), carry=True,
                         params=scale.num_elements(state.params), items_per_step=s.batch_size, item='images',
                         abstract_params=scale.abstract(state.params, state_sh.params), ...)

Deep stacks should be scanned (`lax.scan` over stacked layer weights: one compiled layer) and, under a mesh,
keep their activations batch-sharded (`common.sharding.constrain_batch`), or XLA may follow the FSDP-sharded weights
and replicate the activations instead.

`analyse(program, mesh)` compiles and returns one row (a dict); its keys (binding, read by other code):
  devices, mesh, params, argument_bytes, output_bytes, alias_bytes, temp_bytes, peak_bytes (per device, bytes),
  flops, flops_xla, hand_flops, bytes_accessed, bytes_accessed_xla (per device, one step), compile_s,
  step_s_h100, step_s_v5e (roofline seconds per step per device), fits_h100_80gb, fits_v5e_16gb,
  param_bytes, replicated_param_bytes (per device), paper_hardware, paper_time, notes, ...

What the numbers are:
* Memory is XLA's buffer assignment for this program (`compiled.memory_analysis()`): per device, exact for
  XLA:CPU; XLA:GPU/TPU assign buffers differently (fusion, async collectives), so read it as an estimate there.
  peak_bytes = argument + output - alias (donated) + temp. On CPU the analysis compiles without XLA's
  while-loop-invariant code motion (`CPU_COMPILER_OPTIONS`: it would hoist a CPU-only float32 copy of every
  bfloat16 weight stack out of the layer loop). Activations stay float32 where XLA:CPU widens bfloat16 matmuls,
  so bfloat16 programs' temporaries are over-, not under-estimated.
* XLA's `cost_analysis()` counts a while loop's body once (checked: a 32-layer `lax.scan` reports one layer).
  `flops` adds the matmul / convolution FLOPs of the uncounted iterations of every `lax.scan` (counted from the
  jaxpr, where trip counts are known), split evenly over the devices (their elementwise work stays uncounted:
  2% of a 128-wide test model, less at paper widths); `bytes_accessed` adds their operand and
  result bytes (a lower bound: no re-reads, no collectives). Rematerialised layers are counted as XLA runs
  them (the recomputation included); `hand_flops` is the model's own count (no recomputation).
* The roofline: max(flops / peak FLOP/s, bytes_accessed / HBM bandwidth) per device, with H100 SXM at 989
  TFLOP/s bf16 dense and 3.35 TB/s, TPU v5e at 197 TFLOP/s and 819 GB/s. It ignores communication and
  assumes bf16 matmul throughput whatever the program's dtypes are: a lower bound on the step time.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from iclr24_jax.common.sharding import DATA_AXIS, MODEL_AXIS
from iclr24_jax.common.train_state import TrainState


@dataclasses.dataclass(frozen=True)
class Hardware:
  """One accelerator chip for the roofline: peak dense bf16 FLOP/s, HBM bandwidth (bytes/s), usable HBM bytes."""

  name: str
  flops_per_s: float
  bytes_per_s: float
  memory_bytes: float


# Memory in decimal GB, a margin below the physical 85.9e9 (80 GiB) and 17.2e9 (16 GiB) bytes.
H100 = Hardware("h100", 989e12, 3.35e12, 80e9)
V5E = Hardware("v5e", 197e12, 819e9, 16e9)

# Logical axis names of parameters and activations -> mesh axes (MaxText's defaults on a ('data', 'model') mesh:
# FSDP shards the model width over 'data', tensor parallelism the heads / MLP / vocabulary over 'model').
DEFAULT_RULES: tuple[tuple[str, str | None], ...] = (
    ("batch", DATA_AXIS), ("embed", DATA_AXIS), ("heads", MODEL_AXIS), ("kv", MODEL_AXIS), ("mlp", MODEL_AXIS),
    ("vocab", MODEL_AXIS), ("layers", None), ("norm", None))


@dataclasses.dataclass(frozen=True)
class Program:
  """A step (or core routine) at paper size, ready to compile on abstract inputs (see the module docstring)."""

  name: str
  fn: Callable
  args: tuple
  in_shardings: Any = None
  out_shardings: Any = None
  donate_argnums: tuple[int, ...] = ()
  params: int = 0
  items_per_step: int = 0
  item: str = "tokens"
  hand_flops: float | None = None
  kind: str = "train"
  carry: bool = False
  abstract_params: Any = None
  notes: str = ""
  paper_hardware: str = ""
  paper_time: str = ""

  def __post_init__(self):
    if self.kind not in ("train", "inference"):
      raise ValueError(f"Program.kind={self.kind!r}; choose 'train' or 'inference'.")
    if not isinstance(self.args, tuple):
      raise TypeError("Program.args must be a tuple of argument pytrees (one entry per positional argument).")


# ------------------------------------------------------------------------------------------------- meshes


def mesh_for(devices: int, batch_size: int, model: int = 1, device_list: Sequence[jax.Device] | None = None
             ) -> Mesh:
  """A ('data', 'model') mesh over `devices` whose 'data' axis divides the batch.

  The model axis starts at `model` (the paper's tensor parallelism, e.g. 8 for a 70B judge) and doubles while the
  data axis does not divide `batch_size` (a global batch of 16 on 64 devices gets data=16, model=4).

  Args:
    devices: number of devices (the first `devices` of `jax.devices()` unless `device_list` is given).
    batch_size: the global batch the program shards over 'data'.
    model: the requested size of the 'model' axis (a divisor of `devices`).
    device_list: the devices to use.

  Returns:
    Mesh of shape (devices // m, m) with Auto axis types.

  Raises:
    ValueError: `model` does not divide `devices`, or no power-of-two model axis makes the data axis divide the batch.
  """
  if devices < 1 or model < 1 or devices % model:
    raise ValueError(f"mesh: model={model} must be a positive divisor of devices={devices}.")
  m = model
  while batch_size % (devices // m):
    m *= 2
    if m > devices or devices % m:
      raise ValueError(f"no mesh over {devices} devices has a data axis dividing the batch of {batch_size}; "
                       "choose a batch size that shares a power-of-two factor with the device count.")
  devs = list(device_list if device_list is not None else jax.devices()[:devices])
  if len(devs) != devices:
    raise ValueError(f"asked for {devices} devices, {len(devs)} available; simulate more with "
                     "common.sharding.simulate_cpu_devices(n) before JAX starts.")
  return jax.make_mesh((devices // m, m), (DATA_AXIS, MODEL_AXIS),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2, devices=devs)


def mesh_str(mesh: Mesh) -> str:
  """'data=8,model=1'."""
  return ",".join(f"{k}={v}" for k, v in mesh.shape.items())


def paper_scale(config: Any, slug: str) -> Any:
  """The `scale` block of a paper's `paper` config variant (what `scale_program` reads).

  Args:
    config: the paper's ConfigDict.
    slug: the paper's slug (for the error message).

  Returns:
    config.scale (at least `batch_size`, `paper_hardware`, `paper_time`, `source`).

  Raises:
    ValueError: the config has no `scale` block (it is not the `paper` variant).
  """
  block = config.get("scale") if hasattr(config, "get") else None
  if not block:
    raise ValueError(f"scale_program needs the paper-size config: get_config('paper') from configs/{slug}.py "
                     "(its `scale` block sets the sizes); this config has none.")
  return block


# ------------------------------------------------------------------------------------------------ shardings


def logical_shardings(shapes: Any, logical_axes: Any, mesh: Mesh,
                      rules: Sequence[tuple[str, str | None]] = DEFAULT_RULES) -> Any:
  """NamedShardings from logical axis names (MaxText's logical partitioning for plain pytrees).

  A dimension is sharded over the mesh axis its name maps to when the axis size divides it and no earlier
  dimension of the same array already uses that axis; otherwise it stays whole (a 12-head T5 on a model axis of
  8 keeps its heads unsharded). `replicated_bytes` reports what that leaves replicated.

  Args:
    shapes: pytree of arrays or ShapeDtypeStructs.
    logical_axes: the same pytree structure with, per leaf, a tuple of names (or None) of length ndim.
    mesh: the device mesh.
    rules: (logical name, mesh axis or None) pairs; names not in the rules stay unsharded.

  Returns:
    Pytree of NamedSharding.

  Raises:
    ValueError: a leaf's axis names do not match its rank.
  """
  table = dict(rules)

  def one(x, names):
    if len(names) != len(x.shape):
      raise ValueError(f"logical axes {names} do not match the shape {tuple(x.shape)}.")
    used, spec = set(), []
    for size, name in zip(x.shape, names):
      axis = table.get(name) if name is not None else None
      if axis is None or axis in used or axis not in mesh.shape or size % mesh.shape[axis]:
        spec.append(None)
      else:
        spec.append(axis)
        used.add(axis)
    return NamedSharding(mesh, P(*spec))

  return jax.tree.map(one, shapes, logical_axes, is_leaf=lambda t: isinstance(t, tuple))


def fsdp_shardings(shapes: Any, mesh: Mesh, axis: str = DATA_AXIS, min_bytes: int = 1 << 20) -> Any:
  """Shards every leaf of at least `min_bytes` along its largest dimension divisible by the `axis` size.

  For models without logical axis names (convolutional nets, small heads): plain ZeRO-3 / FSDP. Smaller leaves
  and leaves with no divisible dimension are replicated.

  Args:
    shapes: pytree of arrays or ShapeDtypeStructs.
    mesh: the device mesh.
    axis: the mesh axis to shard over.
    min_bytes: leaves below this size stay replicated.

  Returns:
    Pytree of NamedSharding.
  """
  n = mesh.shape[axis]

  def one(x):
    nbytes = int(np.prod(x.shape, dtype=np.int64)) * x.dtype.itemsize
    dims = sorted(range(len(x.shape)), key=lambda i: -x.shape[i])
    for i in dims:
      if nbytes >= min_bytes and n > 1 and x.shape[i] % n == 0:
        spec = [None] * len(x.shape)
        spec[i] = axis
        return NamedSharding(mesh, P(*spec))
    return NamedSharding(mesh, P())

  return jax.tree.map(one, shapes)


def replicated(tree: Any, mesh: Mesh) -> Any:
  """A replicated NamedSharding for every leaf of `tree`."""
  return jax.tree.map(lambda _: NamedSharding(mesh, P()), tree)


def batch_shardings(batch: Any, mesh: Mesh) -> Any:
  """Leading axis over 'data' for every leaf with one (scalars replicated)."""
  return jax.tree.map(lambda x: NamedSharding(mesh, P(DATA_AXIS) if len(x.shape) else P()), batch)


def train_state_shardings(state: TrainState, param_shardings: Any, mesh: Mesh, extra: Any = None) -> TrainState:
  """Shardings of a TrainState: step replicated, params as given, optimizer state following its params.

  Every copy of the parameter tree inside the optax state (Adam's mu and nu, ...) gets the parameter shardings
  (`optax.tree_map_params`); counters and other non-parameter leaves are replicated.

  Args:
    state: the (abstract) TrainState, e.g. `jax.eval_shape(init_fn)`; its `tx` must be set.
    param_shardings: NamedShardings with the structure of `state.params`.
    mesh: the device mesh.
    extra: shardings of `state.extra` (default: replicated).

  Returns:
    A TrainState whose leaves are NamedShardings (usable as `in_shardings` / `out_shardings`).
  """
  if state.tx is None:
    raise ValueError("train_state_shardings needs a state built with TrainState.create(params, tx).")
  rep = NamedSharding(mesh, P())
  opt = optax.tree_map_params(state.tx, lambda _, s: s, state.opt_state, param_shardings,
                              transform_non_params=lambda _: rep)
  if extra is None:
    extra = replicated(state.extra, mesh)
  return state.replace(step=rep, params=param_shardings, opt_state=opt, extra=extra)


def abstract(shapes: Any, shardings: Any) -> Any:
  """ShapeDtypeStructs carrying the given shardings (the inputs `analyse` lowers on).

  Args:
    shapes: pytree of arrays / ShapeDtypeStructs (e.g. from `jax.eval_shape`).
    shardings: the same structure with a NamedSharding per leaf.

  Returns:
    Pytree of `jax.ShapeDtypeStruct(shape, dtype, sharding=...)`.
  """
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, shardings)


def _shard_bytes(x: jax.ShapeDtypeStruct) -> int:
  shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
  return int(np.prod(shape, dtype=np.int64)) * x.dtype.itemsize


def per_device_bytes(tree: Any) -> int:
  """Bytes one device holds of a pytree of sharded ShapeDtypeStructs (or jax.Arrays)."""
  return int(sum(_shard_bytes(x) for x in jax.tree.leaves(tree)))


def replicated_bytes(tree: Any, min_bytes: int = 1 << 24) -> int:
  """Per-device bytes of leaves of at least `min_bytes` that are fully replicated over a mesh of > 1 device.

  A matrix replicated by accident shows here; norms and biases (a stacked Llama-2-70B norm is 1.3 MB) stay below
  the default 16 MiB.

  Args:
    tree: pytree of sharded ShapeDtypeStructs or jax.Arrays.
    min_bytes: smaller leaves are ignored.

  Returns:
    Bytes (int).
  """
  total = 0
  for x in jax.tree.leaves(tree):
    full = int(np.prod(x.shape, dtype=np.int64)) * x.dtype.itemsize
    sharding = x.sharding
    if (full >= min_bytes and sharding is not None and len(sharding.device_set) > 1
        and sharding.is_fully_replicated):
      total += full
  return total


def num_elements(tree: Any) -> int:
  """Number of scalars in a pytree of arrays / ShapeDtypeStructs."""
  return int(sum(int(np.prod(x.shape, dtype=np.int64)) for x in jax.tree.leaves(tree)))


# ---------------------------------------------------------------------------------------- jaxpr loop counts


def _sub_jaxprs(params: Mapping[str, Any]):
  for value in params.values():
    vals = value if isinstance(value, (tuple, list)) else (value,)
    for v in vals:
      if isinstance(v, jax.extend.core.ClosedJaxpr):
        yield v.jaxpr
      elif isinstance(v, jax.extend.core.Jaxpr):
        yield v


def _aval_bytes(v) -> int:
  aval = v.aval
  if not hasattr(aval, "shape") or not hasattr(aval, "dtype"):
    return 0
  return int(np.prod(aval.shape, dtype=np.int64)) * aval.dtype.itemsize


def _eqn_cost(eqn) -> tuple[float, float]:
  """(FLOPs, operand + result bytes) of one matmul / convolution equation; (0, 0) for anything else."""
  name = eqn.primitive.name
  if name == "dot_general":
    (lhs_contract, _), _ = eqn.params["dimension_numbers"]
    lhs = eqn.invars[0].aval
    k = int(np.prod([lhs.shape[d] for d in lhs_contract], dtype=np.int64))
    out = int(np.prod(eqn.outvars[0].aval.shape, dtype=np.int64))
  elif name == "conv_general_dilated":
    rhs = eqn.invars[1].aval
    dn = eqn.params["dimension_numbers"]
    out_features = rhs.shape[dn.rhs_spec[0]]
    k = int(np.prod(rhs.shape, dtype=np.int64)) // out_features  # inputs per output (per group)
    out = int(np.prod(eqn.outvars[0].aval.shape, dtype=np.int64))
  else:
    return 0.0, 0.0
  nbytes = sum(_aval_bytes(v) for v in (*eqn.invars, *eqn.outvars))
  return 2.0 * out * k, float(nbytes)


def loop_costs(jaxpr) -> dict[str, float]:
  """Matmul / convolution FLOPs and bytes of a jaxpr, with and without the repeats of `lax.scan` loops.

  Args:
    jaxpr: a `Jaxpr` (e.g. `jax.jit(fn).trace(*args).jaxpr.jaxpr`).

  Returns:
    {'flops': every iteration counted, 'flops_once': each loop body counted once (as XLA's cost analysis
    does), 'bytes', 'bytes_once' likewise, 'scans': number of scan loops of length >= 2, 'while_loops': number
    of while loops (trip count unknown: counted once in both)}; FLOPs and bytes are for the whole program
    (all devices together).
  """
  out = {"flops": 0.0, "flops_once": 0.0, "bytes": 0.0, "bytes_once": 0.0, "scans": 0, "while_loops": 0}
  for eqn in jaxpr.eqns:
    flops, nbytes = _eqn_cost(eqn)
    out["flops"] += flops
    out["flops_once"] += flops
    out["bytes"] += nbytes
    out["bytes_once"] += nbytes
    name = eqn.primitive.name
    subs = [loop_costs(j) for j in _sub_jaxprs(eqn.params)]
    if not subs:
      continue
    if name == "scan":
      length = int(eqn.params["length"])
      body = subs[0]
      out["scans"] += body["scans"] + (1 if length >= 2 else 0)
      out["while_loops"] += body["while_loops"]
      for k in ("flops", "bytes"):
        out[k] += length * body[k]
        out[k + "_once"] += body[k + "_once"]
      continue
    if name == "while":
      out["while_loops"] += 1
    if name == "cond":  # one branch runs: the costliest
      best = max(subs, key=lambda c: c["flops"])
      subs = [best]
    for body in subs:
      for k in ("flops", "flops_once", "bytes", "bytes_once", "scans", "while_loops"):
        out[k] += body[k]
  return out


# ----------------------------------------------------------------------------------------------- analysis


def _jit(program: Program):
  return jax.jit(program.fn, in_shardings=program.in_shardings, out_shardings=program.out_shardings,
                 donate_argnums=program.donate_argnums)


# XLA:CPU has no bfloat16 matmul: it widens the operands to float32, and its while-loop-invariant code motion then
# hoists that conversion out of a scanned layer stack, materialising a float32 copy of every [L, ...] weight stack
# (measured: Llama-2-70B in bfloat16 over 8 devices reported 38.5 GB of temporaries, 34 GB of them that copy).
# GPUs and TPUs multiply bfloat16 natively, so the CPU analysis compiles without that pass.
CPU_COMPILER_OPTIONS = {"xla_disable_hlo_passes": "while-loop-invariant-code-motion"}


def compiler_options() -> dict[str, str] | None:
  """XLA options `analyse` compiles with on the current backend (`CPU_COMPILER_OPTIONS` on CPU, else None)."""
  return dict(CPU_COMPILER_OPTIONS) if jax.default_backend() == "cpu" else None


def roofline_s(flops: float, nbytes: float, hw: Hardware) -> float:
  """max(compute time, memory time) of one step on one chip, in seconds."""
  return max(flops / hw.flops_per_s, nbytes / hw.bytes_per_s)


def analyse(program: Program, mesh: Mesh) -> dict[str, Any]:
  """Lowers and compiles `program` on its abstract inputs over `mesh`; one table row of per-device figures.

  Args:
    program: the Program (its args carry shardings over `mesh`).
    mesh: the device mesh; it is also set as the current mesh while tracing (`jax.set_mesh`), so activation
      sharding constraints in the model (`common.sharding.constrain_batch`) apply.

  Returns:
    The row described in the module docstring (all byte and FLOP figures per device, for one step).
  """
  devices = int(mesh.devices.size)
  t0 = time.perf_counter()
  with jax.set_mesh(mesh):
    traced = _jit(program).trace(*program.args)
    compiled = traced.lower().compile(compiler_options())
  compile_s = time.perf_counter() - t0
  ma = compiled.memory_analysis()
  ca = compiled.cost_analysis()
  ca = ca[0] if isinstance(ca, (list, tuple)) else (ca or {})
  loops = loop_costs(traced.jaxpr.jaxpr)
  hlo_whiles = compiled.as_text().count(" while(")
  flops_xla = float(ca.get("flops", 0.0))
  bytes_xla = float(ca.get("bytes accessed", 0.0))
  flops = flops_xla + (loops["flops"] - loops["flops_once"]) / devices
  nbytes = bytes_xla + (loops["bytes"] - loops["bytes_once"]) / devices
  arg, out, alias, temp = (int(ma.argument_size_in_bytes), int(ma.output_size_in_bytes),
                           int(ma.alias_size_in_bytes), int(ma.temp_size_in_bytes))
  peak = arg + out - alias + temp
  row = {
      "program": program.name, "kind": program.kind, "devices": devices, "mesh": mesh_str(mesh),
      "params": int(program.params), "items_per_step": int(program.items_per_step), "item": program.item,
      "argument_bytes": arg, "output_bytes": out, "alias_bytes": alias, "temp_bytes": temp, "peak_bytes": peak,
      "flops": flops, "flops_xla": flops_xla,
      "hand_flops": (float(program.hand_flops) / devices) if program.hand_flops else None,
      "bytes_accessed": nbytes, "bytes_accessed_xla": bytes_xla,
      "compile_s": round(compile_s, 2),
      "step_s_h100": roofline_s(flops, nbytes, H100), "step_s_v5e": roofline_s(flops, nbytes, V5E),
      "fits_h100_80gb": peak <= H100.memory_bytes, "fits_v5e_16gb": peak <= V5E.memory_bytes,
      "scan_loops": loops["scans"], "hlo_while_loops": hlo_whiles,
      "paper_hardware": program.paper_hardware, "paper_time": program.paper_time, "notes": program.notes,
      "backend": jax.default_backend(), "jax": jax.__version__,
  }
  if program.abstract_params is not None:
    row["param_bytes"] = per_device_bytes(program.abstract_params)
    row["replicated_param_bytes"] = replicated_bytes(program.abstract_params)
  if loops["while_loops"]:
    row["notes"] = (row["notes"] + " " if row["notes"] else "") + (
        f"{loops['while_loops']} while loop(s) of unknown trip count counted once.")
  return row


# ------------------------------------------------------------------------------------------------ running


def random_args(program: Program, seed: int = 0) -> tuple:
  """Concrete arguments for `program`, made on the devices with the args' shardings (nothing on the host).

  Floating leaves are uniform in [0, 0.02) (non-negative, so optimizer second moments stay valid), integers 0
  (valid token ids, indices and step counters), booleans True, PRNG keys from `seed`. The values only have to
  keep the program finite: `measure` times it.

  Args:
    program: the Program.
    seed: seed of the random leaves.

  Returns:
    A tuple like program.args with jax.Arrays.
  """
  leaves, treedef = jax.tree.flatten(program.args)

  def make(key):
    keys = jax.random.split(key, max(len(leaves), 1))
    out = []
    for k, x in zip(keys, leaves):
      if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        out.append(jax.random.split(k, int(np.prod(x.shape, dtype=np.int64))).reshape(x.shape)
                   if x.shape else k)
      elif jnp.issubdtype(x.dtype, jnp.floating):
        out.append(jax.random.uniform(k, x.shape, jnp.float32, 0.0, 0.02).astype(x.dtype))
      elif x.dtype == jnp.bool_:
        out.append(jnp.ones(x.shape, bool))
      else:
        out.append(jnp.zeros(x.shape, x.dtype))
    return out

  shardings = [x.sharding for x in leaves]
  made = jax.jit(make, out_shardings=shardings)(jax.random.key(seed))
  return jax.tree.unflatten(treedef, made)


def measure(program: Program, mesh: Mesh, steps: int = 10, seed: int = 0) -> dict[str, Any]:
  """Runs `program` on random inputs (`random_args`) and times it: what `experiments.scale --run` records.

  Args:
    program: the Program.
    mesh: the mesh its args are sharded over (the available accelerators).
    steps: timed steps after one untimed warm-up step.
    seed: seed of the random inputs.

  Returns:
    {'measured_steps_per_s', 'measured_step_s', 'measured_compile_s', 'measured_steps', 'measured_backend',
    'measured_peak_bytes' (device 0, where the backend reports it)}.
  """
  if steps < 1:
    raise ValueError(f"measure needs steps >= 1, got {steps}.")
  need = per_device_bytes(program.args)
  stats = mesh.devices.flat[0].memory_stats() if hasattr(mesh.devices.flat[0], "memory_stats") else None
  limit = (stats or {}).get("bytes_limit")
  if limit and need > limit:
    raise ValueError(f"{program.name}: the inputs alone need {need / 1e9:.1f} GB per device, the device has "
                     f"{limit / 1e9:.1f} GB; run it on more devices (a larger mesh).")
  with jax.set_mesh(mesh):
    args = random_args(program, seed)
    t0 = time.perf_counter()
    compiled = _jit(program).lower(*args).compile()
    compile_s = time.perf_counter() - t0
    out = jax.block_until_ready(compiled(*args))
    if program.carry:
      args = (out[0],) + tuple(args[1:])
    t0 = time.perf_counter()
    for _ in range(steps):
      out = compiled(*args)
      if program.carry:
        args = (out[0],) + tuple(args[1:])
    jax.block_until_ready(out)
    elapsed = time.perf_counter() - t0
  peak = None
  stats = mesh.devices.flat[0].memory_stats() if hasattr(mesh.devices.flat[0], "memory_stats") else None
  if stats:
    peak = int(stats.get("peak_bytes_in_use", 0))
  return {"measured_steps_per_s": steps / elapsed, "measured_step_s": elapsed / steps,
          "measured_compile_s": round(compile_s, 2), "measured_steps": steps,
          "measured_backend": jax.default_backend(), "measured_peak_bytes": peak}


def gb(nbytes: float | None) -> str:
  """Bytes as GB with two decimals ('-' for None)."""
  return "-" if nbytes is None else f"{nbytes / 1e9:.2f}"
