#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The CUDA hashing backend on a device machine, in one go: build (release, -Dcuda=enabled), check
# its keys against the CPU's (tests/unit/gpu_hash/test_cuda_equiv), then time it: pinned H2D
# bandwidth, kernels alone, end to end through launch/finish, against the CPU backend on one
# core and on every core, for batches of 1..4096 jobs of 1 KB..512 KB; the crossover; the
# latency of one 32 KB job; the goals (kernel > 1 TB/s, end to end >= 70% of H2D).
# Without a device it says so and exits 0 after building. Needs no network: nvcc (the CUDA
# image's, or /usr/local/cuda/bin) and the project's Debian build dependencies.
# A few minutes in all; each figure is repeated for 0.15 s.
#
#   bench/gpu/run.sh
set -euo pipefail
. "$(dirname "$0")/../../scripts/lib.sh"
cd "$KVGATE_ROOT"
export PATH=$PATH:/usr/local/cuda/bin
if ! command -v nvcc >/dev/null; then
  echo "bench/gpu: no nvcc on this machine: cannot build the CUDA backend" >&2
  exit 1
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
kvg_build build-gpu -Dbuildtype=release -Dcuda=enabled -Dtests=enabled >&2

echo "==> equivalence: CUDA keys against kvg_hash_batch"
rc=0
build-gpu/tests/unit/gpu_hash/test_cuda_equiv || rc=$?
if [ "$rc" -eq 77 ]; then
  echo "bench/gpu: built; no CUDA device here, nothing to time"
  exit 0
fi
[ "$rc" -eq 0 ] || { echo "bench/gpu: equivalence FAILED (exit $rc): no figures" >&2; exit 1; }

echo "==> figures"
exec timeout 420 build-gpu/bench/gpu_bench
