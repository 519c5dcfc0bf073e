"""GraphCare data (`papers/graphcare/data.py`): the MIMIC-III demo tasks."""
from iclr24_jax.papers import graphcare
from iclr24_jax.papers.graphcare import data as data_lib


def test_mimic3_demo_tasks(shared_data):
  mv = data_lib.read_mimic3_demo(shared_data / "mimic3_demo")
  # visits are chronological per patient, across the 2199 -> 2200 wrap of the two-digit years
  for i in range(1, len(mv.subject)):
    if mv.subject[i] == mv.subject[i - 1]:
      assert mv.admit[i] >= mv.admit[i - 1]
  assert all(d >= a for a, d in zip(mv.admit, mv.discharge))
  assert [graphcare.categorize_los(d) for d in (0, 1, 7, 8, 14, 15)] == [0, 1, 7, 8, 8, 9]
  sizes = {}
  for task in ("mortality", "readmission", "los", "drugrec"):
    ds, raw = data_lib.mimic3_demo_task(task, mv=mv)
    sizes[task] = len(ds)
    assert len(ds.visits) == len(ds.labels) == len(ds.patient_ids)
    assert all(len(v) > 0 and all(len(x) > 0 for x in v) for v in ds.visits)
  assert sizes["los"] == sizes["drugrec"] and sizes["mortality"] == sizes["readmission"] < sizes["los"]
  ds, _ = data_lib.mimic3_demo_task("drugrec", mv=mv)
  assert ds.labels.ndim == 2 and ds.labels.shape[1] == ds.num_outputs
