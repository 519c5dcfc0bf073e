"""The shared timing helpers: one compiled function's row, and 1-vs-N-device rows."""
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
