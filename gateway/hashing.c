/* SPDX-License-Identifier: Apache-2.0 */
/* Block-key hashing on the gateway's side: the GPU backend opened at start as hash.backend says
 * (or the CPU, said once in the log), its batcher, and each front thread's completion sink: an
 * eventfd the batcher's thread writes and the thread's loop watches (docs/hashing.md). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "gateway_int.h"
#include "prom.h"

/* The pool that makes large bodies' token-exact keys off the loops (decide.c). */
static int offload_setup(kvg_gateway *gw)
{
    unsigned n = gw->cfg.hash.exact_threads;
    if (n == 0)
        n = gw->nthreads > 1 ? gw->nthreads / 2 : 1;
    int rc = kvg_offload_new(n, 4096, &gw->offload);
    if (rc < 0)
        kvg_log_error("cannot start the token-exact pool: %s", kvg_strerror(rc));
    return rc;
}

int kvg_gateway_hash_setup(kvg_gateway *gw)
{
    int orc = offload_setup(gw);
    if (orc < 0)
        return orc;
    const kvg_hash_settings *hs = &gw->cfg.hash;
    if (hs->backend == KVG_HASH_BACKEND_CPU) {
        kvg_log_info("hash backend: cpu (hash.backend)");
        return 0;
    }
    kvg_hash_device_config dc = {
        .max_batch_jobs = hs->max_batch_jobs,
        .max_batch_bytes = (size_t)hs->batch_mib << 20,
        .device = (int)hs->device,
    };
    kvg_hash_device *dev = NULL;
    char why[256] = "";
    int rc;
    if (hs->backend == KVG_HASH_BACKEND_STANDIN) {
        kvg_hash_standin_config sc = {.max_batch_jobs = dc.max_batch_jobs,
                                      .max_batch_bytes = dc.max_batch_bytes};
        rc = kvg_hash_device_open_standin(&sc, &dev);
    } else {
        rc = kvg_hash_device_open_cuda(&dc, &dev, why, sizeof(why));
    }
    char what[sizeof(dev->description)] = "";
    if (rc == 0) {
        snprintf(what, sizeof(what), "%s", dev->description);
        kvg_hash_batcher_config bc = {
            .max_batch_jobs = hs->max_batch_jobs,
            .deadline_us = hs->batch_deadline_us,
            .crossover_bytes = hs->crossover_bytes,
            .max_queued = hs->max_queued,
        };
        gw->hasher = kvg_hash_batcher_new(&bc, dev, why, sizeof(why));
        if (!gw->hasher)
            rc = -EIO;
    }
    if (rc < 0) {
        if (hs->backend != KVG_HASH_BACKEND_AUTO) {
            kvg_log_error("hash.backend %s: %s",
                          hs->backend == KVG_HASH_BACKEND_CUDA ? "cuda" : "standin",
                          why[0] ? why : kvg_strerror(rc));
            return KVG_ECONFIG;
        }
        kvg_log_info("hash backend: cpu (no usable GPU: %s)", why[0] ? why : kvg_strerror(rc));
        return 0;
    }
    uint64_t cross = kvg_hash_batcher_crossover(gw->hasher);
    if (cross == UINT64_MAX)
        kvg_log_info("hash backend: %s (%s); every job on the CPU: the device was never faster",
                     kvg_hash_batcher_device(gw->hasher), what);
    else
        kvg_log_info("hash backend: %s (%s); jobs of %" PRIu64 " bytes and more in batches of at "
                     "most %u jobs or %u us",
                     kvg_hash_batcher_device(gw->hasher), what, cross, hs->max_batch_jobs,
                     hs->batch_deadline_us);
    return 0;
}

/* On the batcher's thread: completions wait; wake the loop (an eventfd write never blocks). */
static void wake(void *ud)
{
    kvg_thread *t = ud;
    uint64_t one = 1;
    ssize_t n = write(t->hash_fd, &one, sizeof(one));
    (void)n; /* EAGAIN: the counter is full, so the loop is due to wake anyway */
}

static void ready_cb(evutil_socket_t fd, short what, void *arg)
{
    kvg_thread *t = arg;
    uint64_t v;
    ssize_t n = read(fd, &v, sizeof(v));
    (void)n;
    kvg_hash_sink_drain(t->hash_sink);
}

int kvg_thread_hash_init(kvg_thread *t)
{
    t->hash_fd = -1;
    if (t->gw->offload) {
        int rc = kvg_offload_sink_new(t->gw->offload, t->base, &t->offload_sink);
        if (rc < 0)
            return rc;
    }
    if (!t->gw->hasher)
        return 0;
    t->hash_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (t->hash_fd < 0)
        return -errno;
    t->hash_ev = event_new(t->base, t->hash_fd, EV_READ | EV_PERSIST, ready_cb, t);
    if (!t->hash_ev || event_add(t->hash_ev, NULL) < 0)
        return -ENOMEM;
    t->hash_sink = kvg_hash_sink_new(t->gw->hasher, wake, t);
    return t->hash_sink ? 0 : -ENOMEM;
}

void kvg_thread_hash_done(kvg_thread *t)
{
    /* The pool is stopped first (kvg_gateway_free): nothing completes into the sink any more. */
    kvg_offload_sink_free(t->offload_sink);
    t->offload_sink = NULL;
    kvg_hash_sink_free(t->hash_sink); /* its pending jobs are cancelled: their exchanges are gone */
    t->hash_sink = NULL;
    if (t->hash_ev)
        event_free(t->hash_ev);
    t->hash_ev = NULL;
    if (t->hash_fd >= 0)
        close(t->hash_fd);
    t->hash_fd = -1;
}

void kvg_hash_stats_write(kvg_buf *out, void *arg)
{
    kvg_gateway *gw = arg;
    uint64_t cpu_jobs = 0;
    for (unsigned i = 0; i < gw->nthreads; i++)
        cpu_jobs += atomic_load_explicit(&gw->threads[i].hash_cpu_jobs, memory_order_relaxed);
    kvg_hash_batcher_write_metrics(gw->hasher, cpu_jobs, out);
    unsigned long long ran, refused;
    kvg_offload_counts(gw->offload, &ran, &refused);
    kvg_prom_put_header(out, "kvgate_token_exact_offload_total", KVG_PROM_COUNTER,
                        "Token-exact keys of large bodies (hash.exact_offload_bytes and more) "
                        "made on the offload pool (run), or on the event loop because the pool's "
                        "queue was full (refused).");
    kvg_prom_put_u64(out, "kvgate_token_exact_offload_total", KVG_PROM_LABELS({"outcome", "run"}),
                     ran);
    kvg_prom_put_u64(out, "kvgate_token_exact_offload_total",
                     KVG_PROM_LABELS({"outcome", "refused"}), refused);
}
