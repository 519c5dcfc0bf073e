"""Worker of test_multihost: one of two processes (2 CPU devices each) calling public functions EAGERLY on
global arrays that span both processes (not fully addressable here)."""
import sys


def inputs():
  """The global inputs (every process builds them and feeds its own rows)."""
  import numpy as np
  rng = np.random.default_rng(0)
  p = rng.uniform(size=(8, 3)).astype(np.float32)
  fa = rng.normal(size=(8, 3)).astype(np.float32)
  fb = rng.normal(size=(8, 3)).astype(np.float32)
  y = (fa[:, 0] > fb[:, 0]).astype(np.int32)
  x = rng.normal(size=(8, 10))
  lp = (x - np.log(np.exp(x).sum(-1, keepdims=True))).astype(np.float32)
  lp[1, 2] = -np.inf                                                  # a masked entry (valid)
  return {"p": p, "fa": fa, "fb": fb, "y": y, "lp": lp}


FRONT = {"w": [1.0, -2.0, 0.5], "b": 0.1}


def compute(arrays, gather, host_function=True):
  """The calls under test; `gather` brings a (possibly global) result to the host."""
  import jax.numpy as jnp
  import numpy as np
  from iclr24_jax.common import checks
  from iclr24_jax.papers import cpm, lm_inversion, safeguards
  front = {"w": jnp.asarray(FRONT["w"]), "b": jnp.asarray(FRONT["b"])}
  out = {"propagate": gather(safeguards.propagate(arrays["p"], front)),
         "propagate_bad": gather(safeguards.propagate(arrays["p_bad"], front)),
         "fit": gather(cpm.fit(arrays["fa"], arrays["fb"], arrays["y"]).weights),
         "unroll": gather(lm_inversion.unroll(arrays["lp"], jnp.zeros(10), 4))}
  if not host_function:
    return out
  try:                                              # a host-side function names the problem instead of crashing
    cpm.cross_validate(arrays["fa"], arrays["fb"], arrays["y"], Cs=(1.0,), penalties=("l2",), num_folds=2)
    out["host_function"] = np.array(0)
  except checks.ContractError:
    out["host_function"] = np.array(1)
  return out


def main():
  port, pid, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
  import pathlib
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
  from iclr24_jax.common import sharding
  sharding.initialize_distributed(f"127.0.0.1:{port}", num_processes=2, process_id=pid, cpu_devices_per_process=2)
  import jax
  import numpy as np
  from jax.experimental import multihost_utils
  from jax.sharding import NamedSharding, PartitionSpec as P
  assert jax.process_count() == 2 and jax.device_count() == 4
  mesh = jax.make_mesh((4,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  data = inputs()
  data["p_bad"] = data["p"].copy()
  data["p_bad"][6, 1] = 1.7                          # a bad value in process 1's rows only
  rows = slice(4 * pid, 4 * pid + 4)
  arrays = {k: jax.make_array_from_process_local_data(NamedSharding(mesh, P("data")), v[rows])
            for k, v in data.items()}
  assert not arrays["p"].is_fully_addressable
  out = compute(arrays, lambda a: np.asarray(multihost_utils.process_allgather(a, tiled=True)))
  np.savez(path, **out)


if __name__ == "__main__":
  main()
