"""The one launcher: python -m experiments.main --config=configs/<slug>.py[:variant] --workdir=runs/<slug>

Runs `iclr24_jax.papers.<config.paper>.experiment.run(config, workdir)` (or a family experiment such as
`classify`). Add `--distributed` on multi-host systems (TPU pods, GPU clusters) to join the run first.
"""
import json

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a configs/<slug>.py file (with :variant).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where metrics, checkpoints, results and plots go.")
_DISTRIBUTED = flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() first (multi-host).")
_COORD = flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (multi-host without a scheduler).")
_NPROC = flags.DEFINE_integer("num_processes", None, "Number of processes (multi-host without a scheduler).")
_PID = flags.DEFINE_integer("process_id", None, "This process's index (multi-host without a scheduler).")
_CPU_DEVICES = flags.DEFINE_integer("cpu_devices", None, "Simulated CPU devices per process (testing).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO; --verbosity=0 brings it back
  from iclr24_jax.common.compile_cache import enable_compilation_cache
  enable_compilation_cache()  # ~/.cache/iclr24_jax/jax; ICLR24_JAX_COMPILATION_CACHE=0 turns it off
  if _DISTRIBUTED.value:
    from iclr24_jax.common.sharding import initialize_distributed
    initialize_distributed(_COORD.value, _NPROC.value, _PID.value, _CPU_DEVICES.value)
  elif _CPU_DEVICES.value:
    from iclr24_jax.common.sharding import simulate_cpu_devices
    simulate_cpu_devices(_CPU_DEVICES.value)
  from iclr24_jax import registry
  config = _CONFIG.value
  module = registry.experiment_module(config.paper)
  print(f"running {config.paper} in {_WORKDIR.value}", flush=True)
  results = module.run(config, _WORKDIR.value)
  print(json.dumps({k: v for k, v in (results or {}).items() if isinstance(v, (int, float, str, bool))}, indent=1))


if __name__ == "__main__":
  app.run(main)
