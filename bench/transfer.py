"""Cross-device transfer bench: figures as JSON, then a ratio line against the
seed's serial staging copy measured in the same run (and torch's pinned-host
copy where torch sees two CUDA GPUs).

    python bench/transfer.py [--virtual 2] [--reps N] [--plot out.png] [--quick | --small]

--small times the per-transfer cost instead of bandwidth: a 256x256 RGBA16F
image and a 64 KiB buffer, 1000 transfers per method each timed alone
(interleaved with the seed's copy), then submit() and wait() timed apart.
"""
import sys

from vkmulti.apps.benchmarks import main

if __name__ == "__main__":
    sys.exit(main())
