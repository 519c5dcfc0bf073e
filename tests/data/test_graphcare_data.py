"""graphcare.data.load on MIMIC-III tables written with the PhysioNet CSV headers (ISO times, one table gzipped as
PhysioNet ships the full database), checked against PyHealth's task rules by hand."""
import gzip

import numpy as np
import pytest

from iclr24_jax.common import data as common_data
from iclr24_jax.papers.graphcare import data as gc_data

HEADERS = {
    "ADMISSIONS": "ROW_ID,SUBJECT_ID,HADM_ID,ADMITTIME,DISCHTIME,DEATHTIME,ADMISSION_TYPE,ADMISSION_LOCATION,"
                  "DISCHARGE_LOCATION,INSURANCE,LANGUAGE,RELIGION,MARITAL_STATUS,ETHNICITY,EDREGTIME,EDOUTTIME,"
                  "DIAGNOSIS,HOSPITAL_EXPIRE_FLAG,HAS_CHARTEVENTS_DATA",
    "ICUSTAYS": "ROW_ID,SUBJECT_ID,HADM_ID,ICUSTAY_ID,DBSOURCE,FIRST_CAREUNIT,LAST_CAREUNIT,FIRST_WARDID,LAST_WARDID,"
                "INTIME,OUTTIME,LOS",
    "DIAGNOSES_ICD": "ROW_ID,SUBJECT_ID,HADM_ID,SEQ_NUM,ICD9_CODE",
    "PROCEDURES_ICD": "ROW_ID,SUBJECT_ID,HADM_ID,SEQ_NUM,ICD9_CODE",
    "PRESCRIPTIONS": "ROW_ID,SUBJECT_ID,HADM_ID,ICUSTAY_ID,STARTDATE,ENDDATE,DRUG_TYPE,DRUG,DRUG_NAME_POE,"
                     "DRUG_NAME_GENERIC,FORMULARY_DRUG_CD,GSN,NDC,PROD_STRENGTH,DOSE_VAL_RX,DOSE_UNIT_RX,"
                     "FORM_VAL_DISP,FORM_UNIT_DISP,ROUTE",
    "D_ICD_DIAGNOSES": "ROW_ID,ICD9_CODE,SHORT_TITLE,LONG_TITLE",
    "D_ICD_PROCEDURES": "ROW_ID,ICD9_CODE,SHORT_TITLE,LONG_TITLE",
}
# (subject, hadm, admit, discharge, expire): patient 7's admissions are listed out of order and their HADM_IDs are
# not chronological; the loader orders them by time.
ADMISSIONS = [(7, 300, "2150-03-20 08:00:00", "2150-03-25 10:00:00", 1),
              (7, 100, "2150-01-01 08:00:00", "2150-01-04 09:00:00", 0),
              (7, 200, "2150-01-10 08:00:00", "2150-01-12 09:00:00", 0),
              (9, 400, "2120-05-01 00:00:00", "2120-05-03 00:00:00", 0),
              (9, 500, "2121-05-01 00:00:00", "2121-05-02 00:00:00", 0)]


def _write_mimic(root):
  root.mkdir(parents=True, exist_ok=True)
  rows = {k: [] for k in HEADERS}
  for i, (s, h, a, d, e) in enumerate(ADMISSIONS):
    rows["ADMISSIONS"].append(f"{i},{s},{h},{a},{d},,EMERGENCY,,HOME,Medicare,,,,WHITE,,,X,{e},1")
    rows["ICUSTAYS"].append(f"{i},{s},{h},{9000 + i},carevue,MICU,MICU,1,1,{a},{d},1.0")
    rows["DIAGNOSES_ICD"].append(f"{i},{s},{h},1,4019")
    rows["PROCEDURES_ICD"].append(f"{i},{s},{h},1,3893")
    rows["PRESCRIPTIONS"].append(f"{i},{s},{h},,{a},{d},MAIN,Heparin,Heparin,Heparin,H,1,1,5u,1,u,1,vial,IV")
  rows["D_ICD_DIAGNOSES"].append('1,4019,Hypertension NOS,"Unspecified essential hypertension"')
  rows["D_ICD_PROCEDURES"].append("1,3893,Venous cath NEC,Venous catheterization not elsewhere classified")
  for name, header in HEADERS.items():
    text = header + "\n" + "".join(r + "\n" for r in rows[name])
    if name == "PRESCRIPTIONS":
      with gzip.open(root / f"{name}.csv.gz", "wt") as f:   # PhysioNet's full release is gzipped
        f.write(text)
    else:
      (root / f"{name}.csv").write_text(text)


def test_mimic3_tasks(tmp_path):
  _write_mimic(tmp_path / "mimic")
  cfg = {"name": "mimic3", "data_dir": str(tmp_path / "mimic"), "task": "mortality"}
  ds, kg = gc_data.load(cfg)
  # mortality: every admission but a patient's last, labelled by the NEXT admission's expire flag:
  # patient 7 (100 -> 200 -> 300): [expire(200), expire(300)] = [0, 1]; patient 9 (400 -> 500): [0]
  np.testing.assert_array_equal(ds.labels, [0, 1, 0])
  np.testing.assert_array_equal(ds.patient_ids, [7, 7, 9])
  assert [len(v) for v in ds.visits] == [1, 2, 1]             # the history grows visit by visit
  assert ds.labels.dtype == np.int32 and ds.num_outputs == 1
  ds, _ = gc_data.load(dict(cfg, task="readmission"))
  # readmission within 15 days of the admission: 100 -> 200 is 9 days (1), 200 -> 300 is 69 (0), 400 -> 500 a year
  np.testing.assert_array_equal(ds.labels, [1, 0, 0])
  ds, _ = gc_data.load(dict(cfg, task="los"))
  # length of stay in days (3, 2, 5, 2, 1 in time order) as PyHealth's categories 0..9
  np.testing.assert_array_equal(ds.labels, [gc_data.categorize_los(d) for d in (3, 2, 5, 2, 1)])


def test_mimic3_missing_table(tmp_path):
  _write_mimic(tmp_path / "mimic")
  (tmp_path / "mimic" / "ICUSTAYS.csv").unlink()
  with pytest.raises(common_data.DataNotFoundError, match=r"ICUSTAYS.*physionet"):
    gc_data.load({"name": "mimic3", "data_dir": str(tmp_path / "mimic"), "task": "mortality"})
  with pytest.raises(common_data.DataNotFoundError, match="mimic3"):   # the full set never falls back to the demo
    gc_data.load({"name": "mimic3", "data_dir": "", "task": "mortality"})
