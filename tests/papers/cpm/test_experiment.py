"""CPM's experiment (`papers/cpm/experiment.py`): a smoke run of the tiny config on the shared data."""
import json
import os

import numpy as np


def test_tiny_run(tmp_path, shared_data):
  from iclr24_jax.configs import cpm as cfg_mod
  from iclr24_jax.papers.cpm import experiment
  c = cfg_mod.get_config("tiny")
  c.cache_dir = str(tmp_path / "cache")
  c.data.data_dir = str(shared_data)
  res = experiment.run(c, str(tmp_path / "run"))
  assert os.path.exists(tmp_path / "run" / "results.json")
  acc = res["preference"]["acc"]
  assert {"CPM", "standard PM", "length only", "CPM without length"} <= set(acc)
  assert all(0.0 <= v["mean"] <= 1.0 and len(v["per_seed"]) == c.num_seeds for v in acc.values())
  assert res["synthetic"]["acc_bayes"]["mean"] > 0.6
  assert set(res["bon"]) >= {"CPM", "standard PM"} and res["bon"]["CPM"]["n"] == [1, 2, 4]
  assert all(a[0] == 1.0 for a in res["bon"]["CPM"]["agreement"])   # n = 1: both models pick the only sample
  with open(tmp_path / "run" / "results.json") as f:
    assert json.load(f)["preference"]["num_train"] == 40
  for k in ("CPM", "standard PM"):   # per prompt at n = all 4 samples; averaged over prompts = the curve's last point
    b = res["bon"][k]
    np.testing.assert_allclose(np.mean(b["agree_prompt"], 1), [a[-1] for a in b["agreement"]], rtol=1e-6)
    np.testing.assert_allclose(np.mean(b["gap_prompt"], 1),
                               [a[-1] - s[-1] for a, s in zip(b["score_a"], b["score_b"])], rtol=1e-5, atol=1e-6)
  bj = res["bon_judge"]
  assert set(bj["win"]) == {"CPM", "standard PM"} and len(bj["head_to_head"]) == c.bon.num_prompts
  assert all(w in (0.0, 0.5, 1.0) for v in bj["win"].values() for w in v)
  assert len(bj["human_agreement"]) == c.bon.judge_check_pairs
  assert os.path.exists(tmp_path / "cache" / "judge.jsonl")
  pm = res["preference"]["pair_mean"]
  assert len(pm["CPM"]) == res["preference"]["num_pairs"] == len(res["preference"]["test_count"])
