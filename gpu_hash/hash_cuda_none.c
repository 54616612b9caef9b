/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA backend of a build without CUDA (meson -Dcuda=disabled, or no nvcc): it says so. */
#include <errno.h>
#include <stdio.h>

#include "hash_cuda.h"
#include "hash_device.h"

int kvg_hash_device_open_cuda(const kvg_hash_device_config *cfg, kvg_hash_device **out, char *why,
                              size_t why_len)
{
    (void)cfg, (void)out;
    if (why && why_len)
        snprintf(why, why_len, "built without CUDA");
    return -ENODEV;
}

int kvg_hash_cuda_h2d_gbps(kvg_hash_device *dev, size_t bytes, int reps, double *gbps)
{
    (void)dev, (void)bytes, (void)reps, (void)gbps;
    return -ENODEV;
}

int kvg_hash_cuda_kernel_ms(kvg_hash_device *dev, unsigned slot, int reps, double *ms)
{
    (void)dev, (void)slot, (void)reps, (void)ms;
    return -ENODEV;
}
