"""train_loop's scan chunks (K steps per compiled call), best-parameter keeping, stop requests and their
agreement across processes."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from iclr24_jax.common import loop
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.common.train_state import TrainState
from tests.common.helpers import run_workers

RNG = np.random.default_rng(0)
X = RNG.normal(size=(64, 3)).astype(np.float32)
W_TRUE = np.array([1.0, -2.0, 0.5], np.float32)
Y = X @ W_TRUE + 0.01 * RNG.normal(size=64).astype(np.float32)


def _init(key):
  return TrainState.create({"w": jnp.zeros(3), "b": jnp.zeros(())}, optax.sgd(0.05))


def _step(state, batch, key):
  noise = 1e-3 * jax.random.normal(jax.random.fold_in(key, state.step), ())  # exercises the folded key stream

  def loss_fn(p):
    return jnp.mean((batch["x"] @ p["w"] + p["b"] + noise - batch["y"]) ** 2)

  loss, grads = jax.value_and_grad(loss_fn)(state.params)
  return state.apply_gradients(grads=grads), {"loss": loss}


def _batches(step):
  idx = np.arange(16) + 16 * (step % 4)
  return {"x": X[idx], "y": Y[idx]}


def _run(**kw):
  return loop.train_loop(init_fn=_init, train_step=_step, batches=_batches, num_steps=kw.pop("num_steps", 40),
                         key=jax.random.key(0), log_every=kw.pop("log_every", 8), progress=False, **kw)


def test_scan_chunks_equal_single_steps():
  single, chunked = _run(), _run(steps_per_call=4)
  np.testing.assert_allclose(chunked.state.params["w"], single.state.params["w"], rtol=1e-6, atol=1e-7)
  # the logged interval means are the same numbers ([K] chunk metrics are averaged like K single rows)
  np.testing.assert_allclose([r["train/loss"] for r in chunked.history], [r["train/loss"] for r in single.history],
                             rtol=1e-5)
  assert int(chunked.state.step) == 40


def test_partial_last_chunk_runs_step_by_step():
  single, chunked = _run(num_steps=42, log_every=6), _run(num_steps=42, log_every=6, steps_per_call=6)
  np.testing.assert_allclose(chunked.state.params["w"], single.state.params["w"], rtol=1e-6, atol=1e-7)
  assert int(chunked.state.step) == 42


def test_keep_best_returns_the_best_eval_parameters():
  # eval metric: negative distance to the parameters at step 16, so the best eval is at step 16 exactly.
  ref = _run(num_steps=16).state.params

  def eval_fn(state):
    return {"closeness": -float(jnp.sum((state.params["w"] - ref["w"]) ** 2) + (state.params["b"] - ref["b"]) ** 2)}

  res = _run(eval_fn=eval_fn, eval_every=8, keep_best="closeness")
  assert res.best_step == 16 and res.best_metric == pytest.approx(0.0, abs=1e-10)
  np.testing.assert_allclose(res.best_params["w"], ref["w"], rtol=1e-6)
  # the final parameters moved on (step 40), the best copy did not follow them
  assert not np.allclose(res.state.params["w"], res.best_params["w"])
  worst = _run(eval_fn=eval_fn, eval_every=8, keep_best="eval/closeness", best_mode="min")
  assert worst.best_step in (8, 40) and worst.best_metric < -1e-6


def test_bad_options_are_named():
  with pytest.raises(ValueError, match="multiple of steps_per_call"):
    _run(steps_per_call=3, log_every=8)
  with pytest.raises(ValueError, match="needs eval_fn"):
    _run(keep_best="accuracy")
  with pytest.raises(ValueError, match="not among the eval metrics"):
    _run(eval_fn=lambda s: {"a": 1.0}, eval_every=8, keep_best="b")


def test_repeat_step_loop_and_host_paths_agree():
  """repeat_step: the fori_loop and the host loop run steps start..start+n-1 with the same keys (a hand-checked
  step counter and sum of i), the same parameters and mean metrics; n = 0 leaves the state unchanged."""
  x, y = jnp.asarray(X), jnp.asarray(Y)

  def step(state, i, x, y):
    rows = (jnp.arange(16) + 16 * (i % 4)) % 64
    new, m = _step(state, {"x": x[rows], "y": y[rows]}, jax.random.key(3))
    return new, {"loss": m["loss"], "i": i}

  out = {}
  for path in (True, False):
    run = loop.repeat_step(step, loop=path)
    st, m1 = run(_init(None), 0, 5, x, y)
    st, m2 = run(st, 5, 3, x, y)
    same, m0 = run(st, 8, 0, x, y)
    out[path] = (st.params, float(m1["loss"]), float(m2["i"]), int(st.step), same.params, float(m0["loss"]))
  for path in (True, False):
    assert out[path][3] == 8 and out[path][2] == 6.0 and out[path][5] == 0.0   # mean of i over 5, 6, 7
    np.testing.assert_array_equal(out[path][4]["w"], out[path][0]["w"])
  np.testing.assert_allclose(out[True][0]["w"], out[False][0]["w"], rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(out[True][1], out[False][1], rtol=1e-6)
  assert loop.loop_grads_are_slow("cpu") and not loop.loop_grads_are_slow("gpu")


# ------------------------------------------------------------------------------------------------------------------
# The pieces: keep-best rows, the loop state in the checkpoint, stops, time-based saves, the progress rate
# ------------------------------------------------------------------------------------------------------------------


def test_prefix_keys_keeps_named_groups():
  assert loop.prefix_keys({"loss": 1.0, "val/auc": 0.5}, "eval") == {"eval/loss": 1.0, "val/auc": 0.5}


def test_keep_best_per_row_keeps_each_rows_best():
  keep = loop.KeepBest("eval/score", "max")
  p = lambda v: {"w": jnp.asarray(v, jnp.float32)[:, None] * jnp.ones((3, 2))}   # [S=3, 2]
  keep.update(10, {"eval/score": [0.5, np.nan, 0.2]}, p([1.0, 1.0, 1.0]))
  keep.update(20, {"eval/score": [0.4, np.nan, 0.7]}, p([2.0, 2.0, 2.0]))
  keep.update(30, {"eval/score": np.array([0.6, np.nan, 0.7])}, p([3.0, 3.0, 3.0]))  # a tie is no better
  # row 0: 0.5 -> 0.4 (no) -> 0.6 (yes, step 30); row 1 never finite; row 2: 0.2 -> 0.7 (step 20) -> 0.7 (tie)
  assert keep.step == [30, -1, 20]
  np.testing.assert_array_equal(np.asarray(keep.value)[[0, 2]], [0.6, 0.7])
  best = keep.result(p([9.0, 9.0, 9.0]))     # row 1 never validated: the final parameters
  np.testing.assert_array_equal(best["w"][:, 0], [3.0, 9.0, 2.0])


def test_loop_state_round_trips_through_json():
  run = loop.LoopState(step=5, history=[{"step": 5, "train/loss": float("nan")}], best_step=[1, -1],
                       best_metric=[0.5, float("-inf")], key=loop._encode_key(jax.random.key(7)), extra={"epoch": 2})
  back = loop.LoopState.from_json(__import__("json").loads(__import__("json").dumps(run.to_json())))
  assert back.step == 5 and back.extra == {"epoch": 2} and back.best_step == [1, -1]
  assert back.history[0]["train/loss"] == "nan"          # non-finite values are written as strings, as in metrics.jsonl
  np.testing.assert_array_equal(jax.random.key_data(loop._decode_key(back.key)),
                                jax.random.key_data(jax.random.key(7)))


def _eval(state):
  return {"neg_err": -float(jnp.sum((state.params["w"] - jnp.asarray(W_TRUE)) ** 2))}


def test_stop_request_saves_at_the_boundary_and_resume_is_exact(tmp_path):
  full = _run(workdir=str(tmp_path / "full"), eval_fn=_eval, eval_every=8, keep_best="neg_err")

  def stop_at_16(step, row):
    if step == 16:
      loop.request_stop("SIGTERM")

  with loop.observe(stop_at_16), pytest.raises(loop.Preempted) as info:
    _run(workdir=str(tmp_path / "cut"), eval_fn=_eval, eval_every=8, keep_best="neg_err")
  assert info.value.step == 16 and info.value.exit_code == 143 and loop.stop_requested() is None
  resumed = _run(workdir=str(tmp_path / "cut"), eval_fn=_eval, eval_every=8, keep_best="neg_err")
  assert resumed.start_step == 16
  np.testing.assert_array_equal(resumed.state.params["w"], full.state.params["w"])
  np.testing.assert_array_equal(resumed.best_params["w"], full.best_params["w"])
  assert resumed.best_step == full.best_step and resumed.final_eval == full.final_eval
  strip = lambda h: [{k: v for k, v in r.items() if k != "steps_per_s"} for r in h]
  assert strip(resumed.history) == strip(full.history)
  # a finished run: restored as stored, nothing trains or is written
  path = tmp_path / "cut" / "metrics.jsonl"
  before = (path.read_bytes(), path.stat().st_mtime_ns)
  again = _run(workdir=str(tmp_path / "cut"), eval_fn=lambda s: 1 / 0, eval_every=8, keep_best="neg_err")
  assert again.start_step == 40 and again.best_step == full.best_step and strip(again.history) == strip(full.history)
  assert (path.read_bytes(), path.stat().st_mtime_ns) == before


def test_time_based_checkpoints(tmp_path, monkeypatch):
  clock = [0.0]
  monkeypatch.setattr(loop.time, "monotonic", lambda: clock[0])

  def tick(step, row):
    clock[0] += 25.0            # 25 "seconds" per logged interval of 8 steps: every_secs=60 saves every 3rd

  with loop.observe(tick):
    _run(workdir=str(tmp_path), checkpoint_every_secs=60.0, max_to_keep=10)
  # elapsed since the last save at the boundaries 8, 16, 24: 25, 50, 75 -> save at 24; then 32: 25, 40: the end
  assert sorted(int(s) for s in os.listdir(tmp_path / "checkpoints") if s.isdigit()) == [24, 40]


def test_progress_rate_starts_after_the_first_update():
  import io
  prog = metrics_lib.Progress(100, every_s=0.0, stream=io.StringIO())
  assert "ETA ?" in prog.line(10)            # before the first update: no rate yet (it would include compiling)
  prog.update(10)
  prog._ref = (prog._ref[0] - 2.0, 10)       # 2 s ago at step 10
  line = prog.line(30)                       # 20 steps in 2 s: 10 steps/s, 70 left -> 7 s
  assert "10.00 steps/s" in line and "ETA 7s" in line


def test_compile_fast_matches_jit_and_keeps_shardings():
  from iclr24_jax.common import sharding
  x = jnp.asarray(X[:8])
  f = lambda a: jnp.tanh(a) @ a.T   # noqa: E731
  np.testing.assert_allclose(loop.compile_fast(f, x)(x), jax.jit(f)(x), rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(loop.compile_fast(f, x, options={"xla_backend_optimization_level": 1})(x),
                             jax.jit(f)(x), rtol=1e-6, atol=1e-7)
  mesh = sharding.make_mesh()
  jitted = jax.jit(f, out_shardings=sharding.replicated_sharding(mesh))   # a jitted fn keeps its shardings
  out = loop.compile_fast(jitted, x, cpu_only=True)(x)
  assert out.sharding.is_equivalent_to(sharding.replicated_sharding(mesh), out.ndim)


def _init_with(key, tx):
  del key
  return TrainState.create({"w": jnp.zeros(3), "b": jnp.zeros(())}, tx)


def test_runs_with_equal_configs_compile_once():
  # The TrainState carries its optimizer as static data (part of the pytree structure jit compiles for): each run
  # builds its optimizer anew from the config, and equal configs must still share one compiled init and step.
  import functools
  import ml_collections
  from jax import monitoring
  from iclr24_jax.common import optim

  traced = []
  monitoring.register_event_duration_secs_listener(
      lambda event, secs, **kw: traced.append(kw.get("fun_name")) if event.endswith("jaxpr_trace_duration") else None)

  def run(lr):
    cfg = ml_collections.ConfigDict({"name": "sgd", "learning_rate": lr, "momentum": 0.0})
    tx = optim.make_optimizer(cfg, 8)                                  # a fresh build of the settings
    return loop.train_loop(init_fn=functools.partial(_init_with, tx=tx), train_step=_step, batches=_batches,
                           num_steps=8, key=jax.random.key(0), log_every=8, progress=False)

  first = run(0.05)
  second = run(0.05)
  np.testing.assert_array_equal(first.state.params["w"], second.state.params["w"])
  assert traced.count("_step") == 1 and traced.count("_init_with") == 1   # one trace, one compile
  third = run(0.1)                                                     # other settings: their own program
  assert traced.count("_step") == 2 and traced.count("_init_with") == 2
  assert not np.allclose(third.state.params["w"], first.state.params["w"])
  assert optim.make_optimizer(ml_collections.ConfigDict({"name": "sgd", "learning_rate": 0.05, "momentum": 0.0}),
                              8) is first.state.tx


@pytest.mark.slow
def test_two_processes_agree_on_the_stop_of_a_staged_driver(tmp_path):
  """JAX's preemption service on two processes: SIGTERM to one of them stops both at the same boundary of the
  same stage, although each stage's steps count from 0 in chunks of 5 (`StopCheck` gives the service its own
  consecutive count of checks; a stage's step would make the agreed id one that no boundary reaches)."""
  run_workers(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_stop_agree_worker.py"),
              [tmp_path / f"p{i}.json" for i in range(2)])
  out = [json.load(open(tmp_path / f"p{i}.json")) for i in range(2)]
  assert out[1]["signalled_at"] == ["first", 20]
  assert out[0]["stopped"] is not None and out[0]["stopped"] == out[1]["stopped"], out
  stage, step, name = out[0]["stopped"]
  # the first boundary after the signal that every process reaches once the notice is shared: usually a few chunks
  # later in the same stage, but the protocol runs on a background thread while the loops go on, so on a fast
  # machine the notice can land in the next stage, whose steps count from 0 again: the case the per-process count
  # of checks exists for (with the loop's step as the id the run never stopped, and `stopped` was None).
  assert name == "SIGTERM" and step % 5 == 0 and 0 < step < 100, out
  assert (stage == "first" and step > 20) or stage == "second", out
