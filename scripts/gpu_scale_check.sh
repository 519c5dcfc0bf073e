#!/usr/bin/env bash
# The paper-scale check on one accelerator machine, as one short script: the gpu-marked tests, then
# `iclr24 scale --run` paper by paper (cheapest first, each under its own time limit, all under a deadline), the
# rows merged into a copy of results/ that is packed into $OUT/scale_rows.tgz. Merge it here with
#   tar xzf scale_rows.tgz -C /tmp/rows && python -m experiments.scale --table   (after copying the rows in).
# Packages the machine lacks travel as wheels in .whl/ (pure-Python ml_collections, jraph, tensorboardX).
set -u
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD || exit 1
fi
export PYTHONUNBUFFERED=1 ICLR24_JAX_COMPILATION_CACHE=0
PY=${PY:-python3}
DEADLINE=$(( $(date +%s) + ${BUDGET_S:-480} ))
nvidia-smi -L
$PY -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())"
rm -rf "$OUT/res" && cp -r results "$OUT/res"
timeout 75 $PY -m pytest -q -p no:cacheprovider -o addopts="" -m gpu tests/common/test_scale.py 2>&1 | tail -4
for s in ${PAPERS:-pmp graphcare cdgm d2pruning unio4 ldcq safeguards nci coboosting fps cpm mario lm_inversion daclip}; do
  left=$(( DEADLINE - $(date +%s) ))
  [ "$left" -lt 20 ] && { echo "=== deadline: $s and later not run"; break; }
  limit=$(( left < ${PER_PAPER_S:-60} ? left : ${PER_PAPER_S:-60} ))
  echo "=== $s (limit ${limit}s) $(date +%T)"
  timeout "$limit" $PY -m iclr24_jax.launch.scale --only "$s" --run --steps 10 --out "$OUT/res" 2>&1 \
    | grep -E "^---|FAILED|Error|error" | tail -4
done
tar czf "$OUT/scale_rows.tgz" -C "$OUT/res" scale SCALE.md && rm -rf "$OUT/res"
