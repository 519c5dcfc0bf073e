"""iclr24_jax: ICLR 2024 methods as pure, composable JAX/Flax functions."""
import os
import re

import setuptools

HERE = os.path.dirname(os.path.abspath(__file__))


def _version() -> str:
  """`__version__` of iclr24_jax/__init__.py: the one place the version is written."""
  with open(os.path.join(HERE, "iclr24_jax", "__init__.py")) as f:
    return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


CORE = [
    "jax>=0.9.2,<0.10",
    "jaxlib>=0.9.2,<0.10",
    "flax==0.12.6",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "chex==0.1.92",
    "jraph==0.0.6.dev0",
    "ml_collections>=1.0",
    "absl-py>=2.1",
    "numpy>=1.26",
    "scipy>=1.11",
    "scikit-learn>=1.4",
    "scikit-image>=0.22",
    "mlxtend==0.25.*",
    "matplotlib>=3.8",
    "Pillow>=10",  # JPEG degradations (daclip); explicit rather than through matplotlib
    "tensorflow-datasets==4.9.10",
    "tensorboardX>=2.6",  # TensorBoard event files beside metrics.jsonl, without TensorFlow
    "grain==0.2.18",   # per-host shards of the papers' large data sets (common.data.process_shard, TFDS sources)
    "pyarrow>=15",     # parquet / Arrow files of the text sets in the HF layouts (common.data.read_records)
]
LM = ["transformers==4.57.6", "tokenizers>=0.20", "safetensors>=0.4", "gguf>=0.10", "jinja2>=3.1"]
RL = ["brax==0.14.2", "mujoco==3.17.0", "mujoco-mjx==3.17.0", "gymnax>=0.0.8", "nle==1.3.0", "gymnasium==1.2.0",
      "h5py>=3.10"]  # D4RL's HDF5 files (rl.offline.load_d4rl: unio4, ldcq)
TEST = ["pytest>=8", "pytest-xdist>=3.5", "hypothesis>=6.100",
        "pyflakes>=3",  # tests/test_registry.py: no undefined names after code moves between modules
        "setuptools>=68", "wheel>=0.41",  # tests/launch/test_init.py builds a wheel without build isolation
        "mkdocs>=1.6,<2", "mkdocstrings-python>=1.10",  # tests/test_docs.py: the API reference builds (--strict)
        "sacrebleu>=2.4"]  # tests/papers/lm_inversion/test_evaluation.py: our BLEU against sacrebleu (the official metric)
# Optional: the llama.cpp anchor that experiments/benchmark.py times beside our SmolLM2 decoding (it compiles
# llama.cpp from source, natively for the build machine's CPU; not in 'all' so that setup and CI stay fast).
# On 2 cores: CMAKE_ARGS="-DLLAVA_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL=2 pip install llama-cpp-python took ~40 min
# while other jobs loaded the machine.
# >= 0.3.36: the benchmark's batched decoding uses its llama_batch / llama_memory_* API.
# PiShield: the official constraint layer of cdgm (packaged by the paper's first author), timed beside ours; it
# needs torch (a CPU build, installed first, keeps the download small: `pip install torch==<version>+cpu`).
BENCH = ["llama-cpp-python>=0.3.36", "pishield>=1.0"]

setuptools.setup(
    name="iclr24_jax",
    version=_version(),
    description="Pure-functional JAX/Flax reimplementations of 19 ICLR 2024 papers.",
    long_description=(open(os.path.join(HERE, "README.md")).read()
                      if os.path.exists(os.path.join(HERE, "README.md")) else ""),
    long_description_content_type="text/markdown",
    # The library only (configs and the launcher `iclr24_jax.launch` included). The top-level experiments/ and
    # configs/ folders are checkout shims (`python -m experiments.main`); installing a package named
    # `experiments` would collide with a user's own.
    packages=setuptools.find_packages(include=["iclr24_jax", "iclr24_jax.*"]),
    entry_points={"console_scripts": ["iclr24 = iclr24_jax.launch:main"]},
    package_data={"iclr24_jax": ["py.typed", "rl/*.json", "papers/*/*.json", "**/README.md", "lm/kernels/*.cc"]},
    license="Apache-2.0",
    python_requires=">=3.10",
    install_requires=CORE,
    extras_require={"lm": LM, "rl": RL, "test": TEST, "bench": BENCH, "all": LM + RL + TEST},
)
