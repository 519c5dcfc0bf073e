"""`iclr24 reproduce` (`iclr24_jax.launch.reproduce`; `experiments/reproduce.py` from a checkout): every row has
a kind (claim / check / measurement), the summary counts claims (yes / no / inconclusive / not run) apart from
checks (pass / fail / inconclusive) and measurements, a row without a valid kind stops the table, and every
paper's NOT_RUN claims are tabled as 'not run'."""
import glob
import json
import os

import pytest

from iclr24_jax.launch import reproduce
from iclr24_jax import registry
from iclr24_jax.common import stats

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _claim(holds, **kw):
  return dict(paper="p", experiment="e", metric="m", ours="1", holds=holds, kind="claim", basis="'x' (abstract)", **kw)


def _rows():
  return {"alpha": [_claim("yes"), _claim("no"), _claim("inconclusive"),
                    dict(paper="p", experiment="e", metric="m", ours="1", holds="yes", kind="check"),
                    dict(paper="p", experiment="e", metric="m", ours="1", holds=None, kind="measurement")],
          "beta": [dict(paper="p", experiment="e", metric="m", ours="1", holds=False, kind="check"),
                   dict(paper="p", experiment="e", metric="m", ours="1", holds="inconclusive", kind="check"),
                   stats.not_run_row(paper="p", basis="'y' (abstract)", reason="no data", variant="configs/p.py:big")]}


def test_summary_counts_claims_apart_from_checks_and_measurements():
  counts = reproduce.summary_counts(_rows())
  assert [counts["alpha"][c] for c in reproduce.COLUMNS] == [1, 1, 1, 0, 1, 0, 0, 1]
  # beta: a check judged False is a fail, a not-run row is a claim counted as 'not run'
  assert [counts["beta"][c] for c in reproduce.COLUMNS] == [0, 0, 0, 1, 0, 1, 1, 0]
  lines = reproduce.summary_lines(_rows())
  assert lines[0].startswith("| experiment | claims: yes | no | inconclusive | not run | checks: pass | fail |")
  # the totals: 1+0, 1+0, 1+0, 0+1 | 1+0, 0+1, 0+1 | 1+0
  assert lines[-1] == "| **all** | **1** | **1** | **1** | **1** | **1** | **1** | **1** | **1** |"


def test_a_row_without_a_valid_kind_stops_the_table(tmp_path):
  rows = _rows()
  del rows["beta"][1]["kind"]
  with pytest.raises(stats.RowKindError, match=r"experiment 'beta', row 1 \('e' / 'm'\) has no 'kind'"):
    reproduce.write_markdown(rows, {}, {}, str(tmp_path), fast=False)
  assert not os.path.exists(tmp_path / "REPRODUCTION.md")      # nothing half-written
  rows["beta"][1]["kind"] = "verdict"
  with pytest.raises(stats.RowKindError, match="has kind 'verdict'"):
    reproduce.summary_lines(rows)


@pytest.mark.parametrize("row, message", [
    (dict(holds="yes", kind="measurement"), "a measurement carries no verdict"),
    (dict(holds=None, kind="check"), "a check is judged"),
    (dict(holds=None, kind="claim", basis="'x'"), "a claim without a verdict"),
    (dict(holds="yes", kind="claim"), "a claim without a basis"),
    (dict(holds="not run", kind="claim", basis="'x'"), "'not run' without a variant"),
])
def test_a_kind_that_does_not_fit_the_verdict_is_refused(row, message):
  with pytest.raises(stats.RowKindError, match=message):
    stats.row_kind(dict(experiment="e", metric="m", **row))


def test_smoke_tables_accept_unjudged_claims_and_checks(tmp_path):
  rows = {"alpha": [_claim(None), dict(experiment="e", metric="m", holds=None, kind="check")]}
  with pytest.raises(stats.RowKindError):
    reproduce.summary_lines(rows)
  lines = reproduce.summary_lines(rows, smoke=True)
  assert lines[0].endswith("| unjudged (smoke run) |") and lines[-1].endswith("| **2** |")
  path = reproduce.write_markdown(rows, {}, {}, str(tmp_path), fast=True)
  assert "| alpha | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 2 |" in open(path).read()


def test_compare_row_kinds():
  a, b = [0.8, 0.82, 0.81], [0.7, 0.71, 0.69]   # diff 0.11 +- 0.0058: beyond 2 SE, 'yes' when judged
  claim = stats.compare_row(paper="p", experiment="e", metric="acc", a=a, b=b, name_a="x", name_b="y",
                            kind="claim", basis="'x beats y' (Table 1)")
  assert (claim["holds"], claim["kind"], claim["basis"]) == ("yes", "claim", "'x beats y' (Table 1)")
  meas = stats.compare_row(paper="p", experiment="e", metric="acc", a=a, b=b, name_a="x", name_b="y",
                           kind="measurement")
  assert meas["holds"] is None and meas["judgement"]["holds"] == "yes" and "basis" not in meas
  assert "kind" not in stats.compare_row(paper="p", experiment="e", metric="acc", a=a, b=b, name_a="x", name_b="y")
  with pytest.raises(stats.RowKindError, match="kind must be one of"):
    stats.compare_row(paper="p", experiment="e", metric="acc", a=a, b=b, name_a="x", name_b="y", kind="claims")
  with pytest.raises(stats.RowKindError, match="needs a basis"):
    stats.not_run_row(paper="p", basis="", reason="r", variant="v")


def test_markdown_has_a_kind_column_and_the_basis_in_the_notes(tmp_path):
  path = reproduce.write_markdown(_rows(), {}, {}, str(tmp_path), fast=False)
  text = open(path).read()
  assert "| paper | experiment | kind | metric | ours | paper's value / claim | holds | notes |" in text
  assert "| p | e | check | m | 1 | - | fail | - |" in text
  assert "| p | headline claim (abstract) | claim | - | - | - | not run | 'y' (abstract); not run: no data; would run " \
         "with configs/p.py:big |" in text


def test_with_not_run_appends_each_papers_not_run_claims_once():
  rows = reproduce.with_not_run({"cpm": [_claim("yes")], "classify": []})
  cpm_not_run = registry.study_module("cpm").NOT_RUN
  assert len(rows["cpm"]) == 1 + len(cpm_not_run) >= 2 and rows["classify"] == []
  assert reproduce.with_not_run(rows)["cpm"] == rows["cpm"]     # a row already there is not repeated
  assert reproduce.summary_counts(rows)["cpm"][("claim", "not run")] == len(cpm_not_run)


def test_every_recorded_row_and_not_run_claim_has_a_valid_kind():
  """results/rows/*.json and every paper's NOT_RUN: a valid kind each; the summary's totals equal the rows."""
  names = [os.path.basename(p)[:-5] for p in sorted(glob.glob(os.path.join(ROOT, "results", "rows", "*.json")))]
  assert names, "no recorded rows"
  rows, _ = reproduce.load_saved_rows(os.path.join(ROOT, "results"), names)
  rows = reproduce.with_not_run(rows)
  for paper in registry.PAPERS:   # every paper's headline claims have a row or a NOT_RUN entry
    for i, r in enumerate(reproduce.not_run_rows(paper)):
      assert stats.row_kind(r, f"{paper} NOT_RUN[{i}]") == "claim" and r["holds"] == "not run" and r["variant"]
  counts = reproduce.summary_counts(rows)     # raises on any row without a valid kind
  assert sum(sum(c.values()) for c in counts.values()) == sum(len(r) for r in rows.values())
  with open(os.path.join(ROOT, "results", "rows", "cdgm.json")) as f:   # a recorded claim quotes the paper
    assert all(r.get("basis") for r in json.load(f)["rows"] if r["kind"] == "claim")


# README's first screen: the main job takes ~80 minutes on 2 cores, two experiments at once (~2 CPU-s per second).
MAIN_JOB_BUDGET_CPU_S = 9600


def test_the_main_job_fits_its_time_budget():
  """Every experiment of the main job has recorded CPU seconds, and they sum to at most the README's budget; a
  study that outgrows it runs by name (`registry.EXTENDED`) beside a miniature in the main job."""
  names = registry.available()
  _, times = reproduce.load_saved_rows(os.path.join(ROOT, "results"), names)
  missing = [n for n in names if (times.get(n) or {}).get("cpu_seconds") is None]
  assert not missing, f"experiments of the main job without recorded CPU seconds: {missing}"
  total = sum(times[n]["cpu_seconds"] for n in names)
  largest = sorted(names, key=lambda n: -times[n]["cpu_seconds"])[:3]
  assert total <= MAIN_JOB_BUDGET_CPU_S, (
      f"the main job's recorded CPU seconds sum to {total:,.0f} > {MAIN_JOB_BUDGET_CPU_S:,}; largest {largest}: "
      "move the heaviest study to registry.EXTENDED with a miniature in the main job, or raise the budget in README")
  for name in registry.extended():    # the extended studies stay out of the sum but keep their recorded rows
    assert name not in names and os.path.exists(os.path.join(ROOT, "results", "rows", f"{name}.json")), name
