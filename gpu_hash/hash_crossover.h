/* SPDX-License-Identifier: Apache-2.0 */
/* Private to gpu_hash/: the batcher's start-up measure of the job size from which the device
 * beats the CPU (hash_crossover.c). */
#ifndef KVG_HASH_CROSSOVER_H
#define KVG_HASH_CROSSOVER_H

#include <stdint.h>

#include "hash_device.h"

/** On the batcher's thread, with no batch in flight: time kvg_hash_batch and a device batch of
 *  one job (launch + finish in slot 0) for jobs of 1 KiB .. 1 MiB of text (powers of 4, block
 *  64), and return the smallest size whose device latency is below 90% of the CPU's, or
 *  UINT64_MAX when there is none (or the measure could not run). Device errors are added to
 * *errors; a failed run does not count as a win. Logs the table at info. */
uint64_t kvg_hash_crossover_measure(kvg_hash_device *dev, uint64_t *errors);

#endif
