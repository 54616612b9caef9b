/* SPDX-License-Identifier: Apache-2.0 */
/* Private to gpu_hash, its tests and bench/gpu: measurements of the CUDA backend that the
 * launch/finish interface (hash_device.h) cannot give. Without CUDA (hash_cuda_none.c) every
 * function answers -ENODEV. */
#ifndef KVG_HASH_CUDA_H
#define KVG_HASH_CUDA_H

#include <stddef.h>

#include "hash_device.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Pinned host-to-device copy bandwidth on dev's device: reps copies of bytes with
 *  cudaMemcpyAsync, timed with CUDA events; *gbps in 10^9 bytes per second. 0, -ENOMEM (the
 *  buffers), -EIO (a CUDA error), -ENODEV (no CUDA). */
int kvg_hash_cuda_h2d_gbps(kvg_hash_device *dev, size_t bytes, int reps, double *gbps);

/** The kernels alone: slot holds a batch launched and not yet finished; its two kernels run
 *  reps more times between CUDA events, and *ms is the time of one run. The batch's keys are
 *  unchanged (finish still gives them). 0, -EINVAL (slot idle), -EIO, -ENODEV. */
int kvg_hash_cuda_kernel_ms(kvg_hash_device *dev, unsigned slot, int reps, double *ms);

#ifdef __cplusplus
}
#endif

#endif
