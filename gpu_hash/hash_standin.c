/* SPDX-License-Identifier: Apache-2.0 */
/* The CPU stand-in of a launch backend (hash_device.h): launch records the batch, finish hashes
 * it with kvg_hash_batch after an optional delay, and either can be made to fail on request, so
 * that the batcher's logic and its fallback are tested on machines without a GPU. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hash_device.h"

typedef struct standin_slot {
    kvg_hash_job *jobs; /* NULL: free */
    size_t n;
} standin_slot;

typedef struct standin {
    kvg_hash_device dev; /* first: the ops get a kvg_hash_device * */
    kvg_hash_standin_config cfg;
    uint64_t launches, finishes; /* calls since open, for the fault injection */
    standin_slot slots[];
} standin;

static standin *standin_of(kvg_hash_device *dev)
{
    return (standin *)(void *)dev;
}

static int standin_launch(kvg_hash_device *dev, unsigned slot, kvg_hash_job *jobs, size_t n)
{
    standin *s = standin_of(dev);
    if (slot >= dev->nslots || s->slots[slot].jobs || !jobs || !n || n > dev->max_batch_jobs)
        return -EINVAL;
    if (++s->launches == s->cfg.fail_launch_at)
        return -EIO;
    s->slots[slot] = (standin_slot){.jobs = jobs, .n = n};
    return 0;
}

static void sleep_us(uint32_t us)
{
    struct timespec ts = {.tv_sec = us / 1000000u, .tv_nsec = (long)(us % 1000000u) * 1000};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
        ;
}

/* Keys no backend would give, and as many as the job has room for: what a device that failed
 * half-way might leave behind. */
static void write_wrong_keys(kvg_hash_job *jobs, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        kvg_hash_job *j = &jobs[k];
        size_t blocks = j->len / j->block_size;
        j->nkeys = (uint32_t)(blocks < j->max_blocks ? blocks : j->max_blocks);
        for (uint32_t i = 0; i < j->nkeys; i++)
            j->keys[i] = UINT64_C(0xbad0bad0bad0bad0) ^ i;
    }
}

static int standin_finish(kvg_hash_device *dev, unsigned slot)
{
    standin *s = standin_of(dev);
    if (slot >= dev->nslots || !s->slots[slot].jobs)
        return -EINVAL;
    standin_slot sl = s->slots[slot];
    s->slots[slot] = (standin_slot){0};
    if (s->cfg.finish_delay_us)
        sleep_us(s->cfg.finish_delay_us);
    if (++s->finishes == s->cfg.fail_finish_at) {
        write_wrong_keys(sl.jobs, sl.n);
        return -EIO;
    }
    int rc = kvg_hash_batch(sl.jobs, sl.n);
    if (rc == 0 && s->finishes == s->cfg.corrupt_finish_at)
        for (size_t k = sl.n; k-- > 0;) /* the last key of the last job that has one */
            if (sl.jobs[k].nkeys) {
                sl.jobs[k].keys[sl.jobs[k].nkeys - 1] ^= 1;
                break;
            }
    return rc;
}

static void standin_close(kvg_hash_device *dev)
{
    free(standin_of(dev));
}

static const kvg_hash_device_ops standin_ops = {
    .launch = standin_launch,
    .finish = standin_finish,
    .close = standin_close,
};

int kvg_hash_device_open_standin(const kvg_hash_standin_config *cfg, kvg_hash_device **out)
{
    kvg_hash_standin_config c = cfg ? *cfg : (kvg_hash_standin_config){0};
    if (!c.nslots)
        c.nslots = 2;
    if (!c.max_batch_jobs)
        c.max_batch_jobs = 4096;
    if (!c.max_batch_bytes)
        c.max_batch_bytes = (size_t)64 << 20;
    if (!c.max_batch_keys)
        c.max_batch_keys = (size_t)1 << 22;
    if (c.nslots > 64)
        return -EINVAL;
    standin *s = calloc(1, sizeof(*s) + c.nslots * sizeof(standin_slot));
    if (!s)
        return -ENOMEM;
    s->cfg = c;
    s->dev.ops = &standin_ops;
    s->dev.name = "standin";
    s->dev.nslots = c.nslots;
    s->dev.max_batch_jobs = c.max_batch_jobs;
    s->dev.max_batch_bytes = c.max_batch_bytes;
    s->dev.max_batch_keys = c.max_batch_keys;
    snprintf(s->dev.description, sizeof(s->dev.description),
             "CPU stand-in, %u slots, finish delay %u us", c.nslots, c.finish_delay_us);
    *out = &s->dev;
    return 0;
}
