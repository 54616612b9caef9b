#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The CUDA hashing backend on a device machine, in one go: build, check its keys against the
# CPU's (tests/unit/gpu_hash/test_cuda_equiv), then time it: pinned H2D bandwidth, kernels
# alone, end to end through launch/finish, against the CPU backend on one core and on every
# core, for batches of 1..4096 jobs of 1 KB..512 KB; the crossover; the latency of one 32 KB
# job; the goals (kernel > 1 TB/s, end to end >= 70% of H2D). Without a device it says so and
# exits 0 after building.
#
# It builds only what it runs (gpu_hash's CPU and CUDA backends, the test, the bench) with nvcc
# and the C compiler directly, not with meson: the device machine's image has CUDA, gcc, meson
# and ninja but none of the gateway's Debian libraries, and nothing can be installed there. The
# one header it needs from Debian is xxhash.h (the CPU backend inlines XXH3): from
# /usr/include, or from .gpu/ at the repository root, which a session carries to the device:
#
#   mkdir -p .gpu && cp /usr/include/xxhash.h .gpu/      (.gpu/ is in .gitignore)
#   device run, carry [".gpu"]:  bench/gpu/run.sh
#
# A few minutes in all; each figure is repeated for 0.15 s.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH=$PATH:/usr/local/cuda/bin
command -v nvcc >/dev/null || { echo "bench/gpu: no nvcc on this machine" >&2; exit 1; }
cuda_root=$(dirname "$(dirname "$(command -v nvcc)")")
xxh=""
for d in "${KVGATE_XXHASH_INCLUDE:-}" /usr/include .gpu; do
  [ -n "$d" ] && [ -f "$d/xxhash.h" ] && { xxh=$d; break; }
done
[ -n "$xxh" ] || { echo "bench/gpu: no xxhash.h (apt-get install libxxhash-dev, or carry .gpu/)" >&2; exit 1; }
libdir=$cuda_root/lib64
[ -f "$libdir/libcudart_static.a" ] || libdir=$cuda_root/targets/x86_64-linux/lib
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true

out=build-gpu-direct
mkdir -p "$out"
cc=${CC:-gcc}
cflags=(-O2 -std=gnu11 -Wall -Wextra -Werror -D_GNU_SOURCE -DKVG_HAVE_CUDA=1 -Igpu_hash -I"$xxh")
echo "==> build ($(nvcc --version | tail -1), $($cc --version | head -1))"
nvcc -std=c++17 -O3 -DKVG_HAVE_CUDA=1 -Igpu_hash \
  -gencode 'arch=compute_90,code=[sm_90,compute_90]' -gencode arch=compute_80,code=sm_80 \
  -Xcompiler -fPIC,-Wall,-Wextra,-fno-exceptions,-fno-threadsafe-statics -Werror all-warnings \
  -c gpu_hash/hash_cuda.cu -o "$out/hash_cuda.o"
"$cc" "${cflags[@]}" -c gpu_hash/hash_cpu.c -o "$out/hash_cpu.o"
libs=("$out/hash_cpu.o" "$out/hash_cuda.o" -L"$libdir" -lcudart_static -ldl -lrt -lpthread -lm)
"$cc" "${cflags[@]}" tests/unit/gpu_hash/test_cuda_equiv.c "${libs[@]}" -o "$out/test_cuda_equiv"
"$cc" "${cflags[@]}" bench/gpu/gpu_bench.c "${libs[@]}" -o "$out/gpu_bench"

echo "==> equivalence: CUDA keys against kvg_hash_batch"
rc=0
"$out/test_cuda_equiv" || rc=$?
if [ "$rc" -eq 77 ]; then
  echo "bench/gpu: built; no CUDA device here, nothing to time"
  exit 0
fi
[ "$rc" -eq 0 ] || { echo "bench/gpu: equivalence FAILED (exit $rc): no figures" >&2; exit 1; }

echo "==> figures"
exec timeout 420 "$out/gpu_bench"
