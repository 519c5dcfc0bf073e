"""Worker for test_runs: the `iclr24 run` command line, whose progress callback sends this process SIGTERM at the
first logged row at or after step 10 (pmp:tiny's first checkpoint), so the signal lands at a known step boundary."""
import os
import pathlib
import signal
import sys


def main():
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
  from iclr24_jax.launch import run

  def progress_fn(step, row):
    del row
    if step >= 10:
      os.kill(os.getpid(), signal.SIGTERM)

  return run.main([sys.argv[0]] + sys.argv[1:], progress_fn=progress_fn)


if __name__ == "__main__":
  sys.exit(main())
