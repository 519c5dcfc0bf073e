"""Worker for test_run: the `iclr24 run` command line, whose progress callback sends this process SIGTERM at the
first logged row at or after step $SIGTERM_AT (default 10, pmp:tiny's first checkpoint; a staged driver's rows
count each stage's own steps), so the signal lands at a known step boundary."""
import os
import pathlib
import signal
import sys


def main():
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
  from iclr24_jax.launch import run
  at = int(os.environ.get("SIGTERM_AT", "10"))

  def progress_fn(step, row):
    del row
    if step >= at:
      os.kill(os.getpid(), signal.SIGTERM)

  return run.main([sys.argv[0]] + sys.argv[1:], progress_fn=progress_fn)


if __name__ == "__main__":
  sys.exit(main())
