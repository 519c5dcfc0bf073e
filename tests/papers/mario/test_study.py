"""MARIO study (`papers/mario/study.py`): accuracy notes, the study rows on the tiny model."""
import json
import os

import pytest

from iclr24_jax.configs import mario as cfg_mod


def test_valid_accuracy_and_majority_baseline():
  from iclr24_jax.papers.mario import study
  # 5 responses, 4 valid; correct among the valid: 1, 0, 1, 1 -> 3 / 4 = 0.75 (the invalid one cannot be right)
  acc, ok = [1.0, 0.0, 1.0, 0.0, 1.0], [True, True, True, False, True]
  assert study._valid_accuracy(acc, ok) == (0.75, 4)
  items = [{"answer": a} for a in ("no", "yes", "no", "No", "yes")]     # 'no' 3 of 5 (case-insensitive)
  assert study._majority_baseline(items) == ("no", 0.6)
  note = study._accuracy_note({"SFT": (acc, ok)}, items)
  assert "SFT 0.750 on 4/5 valid" in note and "always 'no'): 0.600" in note


@pytest.mark.slow
def test_study_rows_on_the_tiny_model(tmp_path):
  from iclr24_jax.papers.mario import study
  rows = study.reproduce(str(tmp_path), fast=True, variant="strategyqa,tiny", get_config=cfg_mod.get_config)
  assert len(rows) == 12 and rows[0]["plots"] and os.path.exists(rows[0]["plots"][0])
  for r in rows[:8]:   # one seed: measurements, the bootstrap's word in the notes, never 'no' without a reference
    assert r["holds"] is None and "mario_seeds" in r["notes"] and "'no'" not in r["notes"]
  assert all(r["holds"] is None for r in rows[8:])
  for r in rows[:8]:   # beside every accuracy row: accuracy on valid responses and the majority baseline
    assert ("majority baseline" in r["notes"]) == r["metric"].startswith("accuracy")


@pytest.mark.slow
def test_seeded_study_on_the_tiny_model(tmp_path):
  """reproduce_seeds: 3 training seeds on one test subset, every comparison judged on per-seed means."""
  from iclr24_jax.papers.mario import study
  rows = study.reproduce_seeds(str(tmp_path), fast=True, get_config=cfg_mod.get_config)
  # (a) 4 + (b) 4 + budget-matched SFT (the seeds variant's sft_matched='pool') 4 + the reference row 4
  assert len(rows) == 16 and os.path.exists(rows[0]["plots"][0])
  for r in rows[:12]:
    unmatched_sft = r["experiment"].startswith("(b) SFT vs MaRio")
    assert r["kind"] == ("measurement" if unmatched_sft else "check" if r["experiment"].startswith("(a)") else "claim")
    assert r["holds"] in ((None,) if unmatched_sft else ("yes", "inconclusive")) and len(r["judgement"]["a"]) == 3
    assert "3 seeds, paired" in r["ours"] and "pooled over seeds" in r["notes"]
    assert ("majority baseline" in r["notes"]) == r["metric"].startswith("accuracy")
  assert sum("budget-matched" in r["experiment"] for r in rows) == 4
  assert all(r["holds"] is None for r in rows[12:])
  with open(os.path.join(tmp_path, "mario_seeds_details.json")) as f:
    details = json.load(f)
  assert [d["seed"] for d in details["seeds"]] == [0, 1, 2]
