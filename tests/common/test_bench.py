"""The shared timing helpers: one compiled function's row, and 1-vs-N-device rows."""
import time

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import bench, sharding


def test_across_devices_rows_for_each_size_and_mesh():
  def make_case(mesh, size):
    x = sharding.shard_batch(np.ones((size, 16), np.float32), mesh)
    w = jnp.ones((16, 4))
    fn = jax.jit(lambda x, w: jnp.tanh(x @ w).sum())
    return fn, (x, w), {"name": "matmul", "size": size, "items": size}

  rows = bench.across_devices(make_case, sizes=(64, 256), repeats=2)
  counts = bench.device_counts()
  assert counts == sorted({1, jax.device_count()})
  assert [(r["size"], r["mesh_devices"]) for r in rows] == [(s, n) for s in (64, 256) for n in counts]
  assert all(r["name"] == "matmul" and r["steps_per_s"] > 0 and r["compile_s"] is not None for r in rows)
  np.testing.assert_allclose(rows[0]["items_per_s"], 64 * rows[0]["steps_per_s"], rtol=1e-6)


def test_bench_time_fn_reports_compile_and_rate():
  f = jax.jit(lambda x: (x @ x.T).sum())
  row = bench.time_fn(f, jnp.ones((64, 64)), repeats=3, items=64, name="matmul", size=64)
  assert row["compile_s"] > 0 and row["median_s"] > 0 and row["items_per_s"] > 0
  assert row["size"] == 64 and row["compiled_bytes"] > 0
  table = bench.format_table([row], ["name", "size", "steps_per_s"])
  assert table.splitlines()[0] == "| name | size | steps_per_s |"


def test_peer_unavailable_names_the_module_and_the_fix():
  assert bench.peer_unavailable("json", "pip install json") is None
  why = bench.peer_unavailable("no_such_peer_module", "install the 'bench' extra")
  assert why.startswith("no_such_peer_module does not import (ModuleNotFoundError") and why.endswith("'bench' extra")


def test_alternate_times_every_side_each_round_and_a_slow_one_once():
  order = []

  def fast():
    order.append("fast")
    return np.ones(3)

  def slow():
    order.append("slow")
    time.sleep(0.02)
    return "not an array"       # a peer's output (a torch tensor, a list) is returned as is

  out = bench.alternate([fast, slow], repeats=3, once_over_s=0.01)
  assert order == ["fast", "slow", "fast", "fast"]         # alternating; the slow side timed once
  assert [len(o["wall"]) for o in out] == [3, 1] and out[1]["median_s"] >= 0.02
  assert all(o["cpu_s"] >= 0 and o["median_s"] == sorted(o["wall"])[len(o["wall"]) // 2] for o in out)
  assert [len(o["wall"]) for o in bench.alternate([fast, slow], repeats=2)] == [2, 2]
