"""lm_inversion's experiment (`papers/lm_inversion/experiment.py`): a smoke run of the tiny config."""
import numpy as np

from .helpers import needs_data


@needs_data
def test_tiny_run_smoke(tmp_path):
  from iclr24_jax.configs import lm_inversion as cfg_mod
  from iclr24_jax.papers.lm_inversion import experiment
  c = cfg_mod.get_config("tiny")
  c.data.cache_dir = str(tmp_path / "cache")
  res = experiment.run(c, str(tmp_path / "run"))
  assert res["num_test"] == 32 and res["num_chunks"] == 8
  assert set(res["test"]) == {"bleu", "token_f1", "exact_match"} and np.isfinite(res["final_train_loss"])
  # the distribution cache is complete and reused: two files (train, test), each marked done for every row
  import json
  states = [json.loads(p.read_text()) for p in (tmp_path / "cache").glob("dist_*.json")]
  assert sorted(s["rows_done"] for s in states) == [32, 64] and all(s["rows_done"] == s["num_prompts"] for s in states)
  (samples,) = [json.loads(p.read_text()) for p in (tmp_path / "cache").glob("samples_*.json")]
  assert len(samples["texts"]) == 96 and samples["new_tokens"] == 4
