"""The device mesh: the one distributed engine of the library.

Every compiled step runs over a `jax.sharding.Mesh` with axes ('data', 'model'). Batches are split
over 'data' (`P('data')`), parameters are replicated unless a method shards them over 'model'. The
same code runs on 1 CPU device, 8 simulated CPU devices in tests, a GPU box and a TPU pod; for many
hosts call `initialize_distributed()` first and feed each host's slice through `shard_batch`.
"""
from __future__ import annotations

import os
from typing import Any, Iterator, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

DATA_AXIS = "data"
MODEL_AXIS = "model"


def make_mesh(mesh_config: Mapping[str, int] | Any | None = None,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
  """Builds a ('data', 'model') mesh.

  Args:
    mesh_config: mapping (or ConfigDict) with `data` and `model` sizes; -1 means "all remaining
      devices". None means data=-1, model=1 (pure data parallelism over every device).
    devices: the devices to use (default: all of `jax.devices()`); tests pass a subset to compare
      1-device and 8-device runs.

  Returns:
    A `Mesh` of shape [data, model] with Auto axis types.

  Raises:
    ValueError: if the sizes do not multiply to the number of devices.
  """
  devices = list(jax.devices() if devices is None else devices)
  n = len(devices)
  cfg = dict(mesh_config) if mesh_config is not None else {}
  unknown = set(cfg) - {DATA_AXIS, MODEL_AXIS}
  if unknown:
    raise ValueError(f"mesh config has unknown axes {sorted(unknown)}; only 'data' and 'model' exist.")
  data, model = int(cfg.get(DATA_AXIS, -1)), int(cfg.get(MODEL_AXIS, 1))
  if data == -1 and model == -1:
    raise ValueError("mesh: at most one of mesh.data / mesh.model may be -1.")
  if data == -1:
    data = n // max(model, 1)
  if model == -1:
    model = n // max(data, 1)
  if data * model != n or data < 1 or model < 1:
    raise ValueError(f"mesh data={data} x model={model} does not use the {n} available devices exactly; "
                     f"set mesh.data / mesh.model so their product is {n} (or use -1).")
  return jax.make_mesh((data, model), (DATA_AXIS, MODEL_AXIS),
                       axis_types=(AxisType.Auto, AxisType.Auto), devices=devices)


def device_meshes(counts: Sequence[int] | None = None) -> Iterator[Mesh]:
  """Data-parallel meshes over the first n devices, for each n in `counts`: the one way to compare 1 and N
  devices (benchmarks time each, `common.bench.across_devices`; tests check that they give the same numbers).

  Args:
    counts: device counts (default: 1 and every device, once each when there is one device).

  Yields:
    `make_mesh(devices=jax.devices()[:n])` for each n.

  Raises:
    ValueError: a count above the number of devices, or below 1.
  """
  available = jax.device_count()
  for n in (sorted({1, available}) if counts is None else counts):
    if not 1 <= int(n) <= available:
      raise ValueError(f"a mesh of {n} devices was asked for; {available} are available (counts {list(counts)}).")
    yield make_mesh(devices=jax.devices()[:int(n)])


def data_sharding(mesh: Mesh) -> NamedSharding:
  """Sharding of a batch: leading axis split over 'data', the rest replicated."""
  return NamedSharding(mesh, P(DATA_AXIS))


def constrain_batch(x: jax.Array) -> jax.Array:
  """Pins an activation's leading (batch) axis to the mesh's 'data' axis when a mesh is set (`jax.set_mesh`).

  Without a mesh (CPU tests, eager use), or when the 'data' axis does not divide B, it returns `x` unchanged.
  Under a ('data', 'model') mesh it keeps the residual stream batch-sharded and whole over 'model' (the
  Megatron layout). Without it XLA's sharding propagation may follow the FSDP-sharded weights instead:
  measured on flan-t5-xl over 8 devices, it kept every activation whole on every device and all-reduced them
  (10.9 GB of temporaries per device for a 2-layer stack at batch 256 x 512, 2.7 GB with the constraint); on
  the clip_ood paper step over 8 devices every device held the whole batch of 33,600 images (20 GB in
  float32) and activations were sharded over their width instead. MaxText pins activations the same way
  (logical activation constraints). Used by the LM family (Llama, T5) and the CLIP towers.

  Args:
    x: [B, ...] activations.

  Returns:
    [B, ...]: x, with a sharding constraint P('data') when the current mesh has a 'data' axis dividing B.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or DATA_AXIS not in mesh.axis_names or x.shape[0] % mesh.shape[DATA_AXIS]:
    return x
  return jax.lax.with_sharding_constraint(x, P(DATA_AXIS))


def replicated_sharding(mesh: Mesh) -> NamedSharding:
  """Sharding of a fully replicated array (params, keys, scalars)."""
  return NamedSharding(mesh, P())


def replicate(tree: Any, mesh: Mesh) -> Any:
  """Places every leaf of `tree` replicated on all devices of `mesh`.

  Args:
    tree: pytree of arrays (numpy or jax), any shapes.
    mesh: the device mesh.

  Returns:
    the same pytree of jax.Arrays with sharding P() (a full copy on each device).
  """
  return jax.device_put(tree, replicated_sharding(mesh))


def shard_batch(host_batch: Any, mesh: Mesh, stacked: bool = False) -> Any:
  """Turns this host's slice of a batch into global arrays sharded over 'data'.

  On one host the slice is the whole batch. On many hosts each process passes its own rows (same
  local size everywhere) and the global batch is their concatenation in process order.

  Args:
    host_batch: pytree of numpy/jax arrays, each [B_local, ...] (or [K, B_local, ...] when `stacked`).
    mesh: the mesh to shard over.
    stacked: the leaves carry K steps' batches on a leading axis (a `lax.scan` chunk): shard axis 1, P(None, 'data').

  Returns:
    The same pytree of global `jax.Array`s, each [B_local * process_count, ...], sharded `P('data')`.

  Raises:
    ValueError: if the global batch size is not divisible by the mesh's data axis.
  """
  sharding = NamedSharding(mesh, P(None, DATA_AXIS)) if stacked else data_sharding(mesh)
  n_data = mesh.shape[DATA_AXIS]
  axis = 1 if stacked else 0

  def put(x):
    x = np.asarray(x) if not isinstance(x, jax.Array) else x
    if x.ndim <= axis:
      raise ValueError("shard_batch got a leaf without a batch axis; batches must have a leading batch axis"
                       + (" after the chunk axis (stacked=True)." if stacked else "."))
    global_rows = x.shape[axis] * jax.process_count()
    if global_rows % n_data:
      raise ValueError(f"batch size {global_rows} is not divisible by the mesh's data axis ({n_data} devices); "
                       f"choose a batch size that is a multiple of {n_data}.")
    if jax.process_count() == 1:
      return jax.device_put(x, sharding)
    return jax.make_array_from_process_local_data(sharding, np.asarray(x))

  return jax.tree.map(put, host_batch)


def simulate_cpu_devices(n: int) -> None:
  """Splits the host CPU into `n` XLA devices (tests, benchmarks, CPU rehearsals of a sharded run).

  Must run before the CPU backend is first used. It also widens XLA's CPU thread pools: XLA sizes them
  to max(cores, devices), and its thunk runtime runs each device's program, collectives included, on
  that pool, so with exactly `devices` threads one extra queued task (a transfer, a second in-flight
  step) leaves a device unscheduled while the others block in an all-reduce. On a 2-core machine that
  deadlock aborts the process after XLA's 40 s collective timeout ("may be stuck ... not all of them
  arrived"). XLA reads the pool size from the NPROC environment variable; we set it to 4 x devices
  unless the user set it already.
  """
  n = int(n)
  if n < 1:
    raise ValueError(f"simulate_cpu_devices needs n >= 1, got {n}")
  if n > 1 and "NPROC" not in os.environ:
    os.environ["NPROC"] = str(max(4 * n, os.cpu_count() or 1))
  jax.config.update("jax_num_cpu_devices", n)


def initialize_distributed(coordinator_address: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None, cpu_devices_per_process: int | None = None) -> None:
  """Joins a multi-host run (TPU pod, GPU cluster, or several CPU processes on one machine).

  On TPU pods and SLURM/GPU clusters all arguments may be None (JAX detects them). For CPU processes
  (tests, the notes in shared/notes/jax-distributed-cpu.md) pass the coordinator address, the process
  count and id, and the number of CPU devices per process; gloo collectives are enabled for them.
  Must run before any other JAX call in the process.

  Args:
    coordinator_address: 'host:port' of process 0's coordinator, or None to auto-detect.
    num_processes: total number of processes, or None.
    process_id: this process's index in [0, num_processes), or None.
    cpu_devices_per_process: None (real accelerators) or the number of simulated CPU devices per process.

  Raises:
    ValueError: cpu_devices_per_process < 1 (from `simulate_cpu_devices`).
  """
  if cpu_devices_per_process is not None:
    simulate_cpu_devices(cpu_devices_per_process)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                             process_id=process_id)


def host_key(key: jax.Array) -> jax.Array:
  """Folds the process index into a data/environment key (params keys stay global)."""
  return jax.random.fold_in(key, jax.process_index())
