"""Cross-device transfer bench: figures as JSON, then a ratio line against the
seed's serial staging copy measured in the same run (and torch's pinned-host
copy where torch sees two CUDA GPUs).

    python bench/transfer.py [--virtual 2] [--reps N] [--plot out.png] [--quick]
"""
import sys

from vkmulti.benchmarks import main

if __name__ == "__main__":
    sys.exit(main())
