"""lm_inversion's study (`papers/lm_inversion/study.py`, slow): the fast rows."""
import pytest

from iclr24_jax.configs import lm_inversion as cfg_mod
from .helpers import needs_data


@pytest.mark.slow
@needs_data
def test_study_fast_rows(tmp_path, monkeypatch):
  """The whole 3-seed study (lm_inversion_seeds) on the tiny config: every arm trains and the rows carry
  seed-judged verdicts."""
  from iclr24_jax.papers.lm_inversion import study
  monkeypatch.setenv("ICLR24_LM_INVERSION_CACHE", str(tmp_path / "cache"))
  rows = study.reproduce_seeds(str(tmp_path / "study"), fast=True, get_config=cfg_mod.get_config)
  # 10 seed comparisons (F1 and BLEU each): shuffled input (claims), the sample inverter's own control (checks),
  # vs samples (claims only where that control says 'yes'), bag of tokens and nearest by KL (measurements)
  compared = [r for r in rows if r.get("judgement")]
  assert len(compared) == 10 and all(r["judgement"]["n"] == 3 for r in compared)
  assert all(r["holds"] in ("yes", "no", "inconclusive") for r in compared if r["kind"] in ("claim", "check"))
  assert all(r["holds"] is None for r in compared if r["kind"] == "measurement")
  by_metric = {r["metric"]: r for r in compared}
  for key in ("token_f1", "bleu"):
    control = by_metric[f"{key}: sample inversion (T5) vs sample inversion, shuffled input"]
    vs_samples = by_metric[f"{key}: inverter vs sample inversion (T5)"]
    assert control["kind"] == "check"
    assert vs_samples["kind"] == ("claim" if control["holds"] == "yes" else "measurement")
  assert sum(r["metric"].startswith("top-") for r in rows) == 2
