/* SPDX-License-Identifier: Apache-2.0 */
/* The hashing batcher (hash_batcher.h): one submission queue, one thread that closes batches
 * and runs them on a launch backend, and per-loop sinks that hand completions back. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hash_batcher.h"
#include "hash_crossover.h"
#include "prom.h"

#define DEFAULT_DEADLINE_US 50u
#define DEFAULT_MAX_QUEUED 65536u
/* The jobs array of each slot is allocated up front: a device that claims more is capped. */
#define JOBS_CAP 65536u

/* What the batcher's thread waits for, so that a submission signals it only when that ends
 * the wait (not measured: it spares a wake-up per job while the thread collects a batch whose
 * deadline will wake it anyway). */
enum { SLEEP_NO = 0, SLEEP_IDLE, SLEEP_DEADLINE };

/* ---- tickets and sinks ------------------------------------------------------------------- */

struct kvg_hash_ticket {
    kvg_link link;       /* in the queue, a batch, or its sink's completion list */
    kvg_hash_sink *sink; /* holds a reference */
    kvg_hash_done_fn *done;
    void *ud;
    atomic_bool cancelled; /* written on the sink's thread; the batcher only skips the work */
    kvg_hash_ran ran;
    uint64_t submit_ns;
    size_t bytes;     /* input bytes, as the device counts them */
    kvg_hash_job job; /* points into this allocation: keys, then data, salt, model, adapter */
};

struct kvg_hash_sink {
    kvg_hash_batcher *b;
    kvg_hash_wake_fn *wake;
    void *wake_ud;
    pthread_mutex_t lock;
    kvg_link done;      /* completed tickets, in completion order (lock) */
    bool closed;        /* kvg_hash_sink_free ran: no more wakes, no callbacks (lock) */
    atomic_bool gone;   /* the same, for the batcher's lock-free skip of the work */
    atomic_size_t refs; /* the owner's, and one per ticket not yet freed */
};

static void sink_unref(kvg_hash_sink *s)
{
    if (atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) != 1)
        return;
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static void ticket_free(kvg_hash_ticket *t)
{
    kvg_hash_sink *s = t->sink;
    free(t);
    sink_unref(s);
}

/* ---- the batcher's state ----------------------------------------------------------------- */

typedef struct batch {
    kvg_link tickets; /* submission order */
    size_t n, bytes, keys;
    uint64_t first_ns;  /* the first job's submission */
    kvg_hash_job *jobs; /* the launched copies (not cancelled), JOBS_CAP at most */
    size_t njobs;
    bool hashed; /* the launch failed and the CPU hashed it already: no finish */
} batch;

/* Jobs per batch: powers of two up to the largest batch that a device takes by default. */
static const uint64_t batch_bounds[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096};
#define BATCH_BUCKETS KVG_ARRAY_LEN(batch_bounds)

/* Submit to completion ready: a batch's deadline is tens of microseconds, a device batch
 * hundreds; the top buckets catch a stalled device. The sum in microseconds. */
static const uint64_t queue_bounds_ns[] = {
    10000,   25000,    50000,    100000,   250000,    500000,    1000000,    2500000,
    5000000, 10000000, 25000000, 50000000, 100000000, 250000000, 1000000000,
};
static const kvg_prom_buckets queue_buckets = {
    .bounds_ns = queue_bounds_ns,
    .count = KVG_ARRAY_LEN(queue_bounds_ns),
    .sum_unit_ns = 1000,
};

struct kvg_hash_batcher {
    kvg_hash_device *dev;
    size_t max_jobs, max_bytes, max_keys;
    uint64_t deadline_ns;
    uint64_t crossover;
    uint32_t max_queued;

    pthread_t thread;
    pthread_mutex_t qlock;
    pthread_cond_t qcond; /* CLOCK_MONOTONIC: the deadline is a kvg_now_ns time */
    kvg_link queue;       /* submitted, not yet in a batch (qlock) */
    size_t nqueue;        /* its length (qlock) */
    int sleeping;         /* the thread waits: 0 no, SLEEP_IDLE, SLEEP_DEADLINE (qlock) */
    bool stopping;        /* (qlock) */
    bool ready;           /* the thread measured the crossover (qlock) */

    /* The batcher thread's own. */
    batch collect;   /* the batch being collected */
    batch *slots;    /* nslots, a ring in launch order */
    unsigned oldest; /* the slot launched first of those in flight */
    unsigned in_flight;

    atomic_uint_fast32_t queued; /* submitted and not yet completed */
    _Atomic uint64_t jobs[KVG_HASH_RAN_COUNT];
    _Atomic uint64_t device_errors;
    _Atomic uint64_t batch_hist[BATCH_BUCKETS + 1];
    _Atomic uint64_t batch_sum;
    kvg_prom_hist queue_hist;
};

static const char *const ran_names[KVG_HASH_RAN_COUNT] = {
    [KVG_HASH_RAN_CPU] = "cpu",
    [KVG_HASH_RAN_DEVICE] = "device",
    [KVG_HASH_RAN_FALLBACK] = "fallback",
};

const char *kvg_hash_ran_str(kvg_hash_ran r)
{
    return (unsigned)r < KVG_HASH_RAN_COUNT ? ran_names[r] : "?";
}

static void batch_reset(batch *bt)
{
    kvg_list_init(&bt->tickets);
    bt->n = bt->bytes = bt->keys = 0;
    bt->first_ns = 0;
    bt->njobs = 0;
    bt->hashed = false;
}

/* ---- completion -------------------------------------------------------------------------- */

static bool ticket_wanted(const kvg_hash_ticket *t)
{
    return !atomic_load_explicit(&t->cancelled, memory_order_relaxed) &&
           !atomic_load_explicit(&t->sink->gone, memory_order_relaxed);
}

/* On the batcher's thread: t's keys are final. The sink's lock is held while wake runs, so
 * that kvg_hash_sink_free (which takes it) guarantees no wake after it returns: the owner may
 * free what wake_ud points to. */
static void deliver(kvg_hash_batcher *b, kvg_hash_ticket *t)
{
    if (ticket_wanted(t)) { /* a cancelled job was not hashed */
        kvg_prom_hist_observe(&b->queue_hist, &queue_buckets, kvg_now_ns() - t->submit_ns);
        atomic_fetch_add_explicit(&b->jobs[t->ran], 1, memory_order_relaxed);
    }
    atomic_fetch_sub_explicit(&b->queued, 1, memory_order_relaxed);
    kvg_hash_sink *s = t->sink;
    pthread_mutex_lock(&s->lock);
    if (s->closed) {
        pthread_mutex_unlock(&s->lock);
        ticket_free(t);
        return;
    }
    bool was_empty = kvg_list_empty(&s->done);
    kvg_list_insert(s->done.prev, &t->link);
    /* One wake per empty-to-not transition: a drain takes the whole list, so a batch of a
     * hundred jobs for one loop wakes it once. */
    if (was_empty)
        s->wake(s->wake_ud);
    pthread_mutex_unlock(&s->lock);
}

static void deliver_batch(kvg_hash_batcher *b, batch *bt, kvg_hash_ran ran)
{
    while (!kvg_list_empty(&bt->tickets)) {
        kvg_hash_ticket *t = KVG_CONTAINER_OF(bt->tickets.next, kvg_hash_ticket, link);
        kvg_list_unlink(&t->link);
        t->ran = ran;
        deliver(b, t);
    }
    batch_reset(bt);
}

/* The jobs still wanted, copied into bt->jobs. Cancelled ones are not hashed: their keys are
 * never read. */
static void batch_pack(batch *bt)
{
    bt->njobs = 0;
    for (kvg_link *l = bt->tickets.next; l != &bt->tickets; l = l->next) {
        kvg_hash_ticket *t = KVG_CONTAINER_OF(l, kvg_hash_ticket, link);
        if (ticket_wanted(t))
            bt->jobs[bt->njobs++] = t->job;
    }
}

/* The keys arrays are the tickets' own; only nkeys lives in the copies. */
static void batch_unpack(batch *bt)
{
    size_t k = 0;
    for (kvg_link *l = bt->tickets.next; l != &bt->tickets && k < bt->njobs; l = l->next) {
        kvg_hash_ticket *t = KVG_CONTAINER_OF(l, kvg_hash_ticket, link);
        if (t->job.keys == bt->jobs[k].keys)
            t->job.nkeys = bt->jobs[k++].nkeys;
    }
}

/* On the batcher's thread, for jobs the device will not hash. The jobs were valid at submit
 * and are the batcher's copies, so kvg_hash_batch cannot refuse them. */
static void hash_on_cpu(batch *bt)
{
    kvg_hash_batch(bt->jobs, bt->njobs);
    batch_unpack(bt);
}

static void count_batch(kvg_hash_batcher *b, size_t n)
{
    size_t i = 0;
    while (i < BATCH_BUCKETS && n > batch_bounds[i])
        i++;
    atomic_fetch_add_explicit(&b->batch_hist[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&b->batch_sum, n, memory_order_relaxed);
}

static void device_error(kvg_hash_batcher *b, const char *what, int rc, size_t n)
{
    atomic_fetch_add_explicit(&b->device_errors, 1, memory_order_relaxed);
    kvg_log_warn("hash device %s: %s failed (%s): %zu jobs hashed on the CPU", b->dev->name, what,
                 kvg_strerror(rc), n);
}

/* Launch bt (in slot) on the device; on failure hash it here and now, and let finish_oldest
 * deliver it in its turn, so that completions keep the submission order. */
static void launch(kvg_hash_batcher *b, unsigned slot)
{
    batch *bt = &b->slots[slot];
    batch_pack(bt);
    bt->hashed = bt->njobs == 0;
    if (!bt->njobs)
        return;
    count_batch(b, bt->njobs);
    int rc = b->dev->ops->launch(b->dev, slot, bt->jobs, bt->njobs);
    if (rc < 0) {
        device_error(b, "launch", rc, bt->njobs);
        hash_on_cpu(bt);
        bt->hashed = true;
    }
}

static void finish_oldest(kvg_hash_batcher *b)
{
    unsigned slot = b->oldest;
    batch *bt = &b->slots[slot];
    kvg_hash_ran ran = KVG_HASH_RAN_DEVICE;
    if (bt->hashed) {
        ran = bt->njobs ? KVG_HASH_RAN_FALLBACK : KVG_HASH_RAN_DEVICE;
    } else {
        int rc = b->dev->ops->finish(b->dev, slot);
        if (rc < 0) {
            /* Whatever the device wrote is overwritten: no key of a failed batch leaks. */
            device_error(b, "finish", rc, bt->njobs);
            hash_on_cpu(bt);
            ran = KVG_HASH_RAN_FALLBACK;
        } else {
            batch_unpack(bt);
        }
    }
    deliver_batch(b, bt, ran);
    b->oldest = (b->oldest + 1) % b->dev->nslots;
    b->in_flight--;
}

/* ---- the batcher's thread ---------------------------------------------------------------- */

/* Move queued tickets into the batch being collected while they fit (qlock held). True when
 * the batch is full: at max_jobs, or the next ticket would take it past a limit. */
static bool collect(kvg_hash_batcher *b)
{
    batch *c = &b->collect;
    while (!kvg_list_empty(&b->queue)) {
        if (c->n >= b->max_jobs)
            return true;
        kvg_hash_ticket *t = KVG_CONTAINER_OF(b->queue.next, kvg_hash_ticket, link);
        if (c->n && (c->bytes + t->bytes > b->max_bytes || c->keys + t->job.nkeys > b->max_keys))
            return true;
        kvg_list_unlink(&t->link);
        b->nqueue--;
        kvg_list_insert(c->tickets.prev, &t->link);
        if (!c->n++)
            c->first_ns = t->submit_ns;
        c->bytes += t->bytes;
        c->keys += t->job.nkeys;
    }
    return c->n >= b->max_jobs;
}

/* Move the collected batch into the next free slot; its jobs array stays the slot's. */
static unsigned take_collected(kvg_hash_batcher *b)
{
    unsigned slot = (b->oldest + b->in_flight) % b->dev->nslots;
    batch *bt = &b->slots[slot];
    kvg_hash_job *jobs = bt->jobs;
    batch_reset(bt);
    bt->jobs = jobs;
    kvg_link *first = b->collect.tickets.next, *last = b->collect.tickets.prev;
    if (first != &b->collect.tickets) {
        bt->tickets.next = first;
        bt->tickets.prev = last;
        first->prev = &bt->tickets;
        last->next = &bt->tickets;
    }
    bt->n = b->collect.n;
    jobs = b->collect.jobs;
    batch_reset(&b->collect);
    b->collect.jobs = jobs;
    b->in_flight++;
    return slot;
}

/* At shutdown, after the batches in flight: what was still queued, hashed here in batches of
 * the slot's size (the jobs array is the collect batch's own). */
static void drain_on_cpu(kvg_hash_batcher *b, kvg_link *rest)
{
    batch *c = &b->collect;
    while (!kvg_list_empty(rest)) {
        while (!kvg_list_empty(rest) && c->n < b->max_jobs) {
            kvg_link *l = rest->next;
            kvg_list_unlink(l);
            kvg_list_insert(c->tickets.prev, l);
            c->n++;
        }
        batch_pack(c);
        hash_on_cpu(c);
        deliver_batch(b, c, KVG_HASH_RAN_CPU);
    }
}

static void wait_until(kvg_hash_batcher *b, uint64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000u),
                          .tv_nsec = (long)(ns % 1000000000u)};
    pthread_cond_timedwait(&b->qcond, &b->qlock, &ts);
}

static void *batcher_main(void *arg)
{
    kvg_hash_batcher *b = arg;
    uint64_t errors = 0;
    uint64_t crossover = b->crossover ? b->crossover : kvg_hash_crossover_measure(b->dev, &errors);
    atomic_fetch_add(&b->device_errors, errors);

    pthread_mutex_lock(&b->qlock);
    b->crossover = crossover;
    b->ready = true;
    pthread_cond_broadcast(&b->qcond);
    for (;;) {
        bool full = collect(b);
        if (b->stopping) {
            /* Batches in flight finish on the device; the rest hash here. */
            if (b->in_flight) {
                pthread_mutex_unlock(&b->qlock);
                finish_oldest(b);
                pthread_mutex_lock(&b->qlock);
                continue;
            }
            kvg_link rest;
            kvg_list_init(&rest);
            while (!kvg_list_empty(&b->collect.tickets)) {
                kvg_link *l = b->collect.tickets.next;
                kvg_list_unlink(l);
                kvg_list_insert(rest.prev, l);
            }
            while (!kvg_list_empty(&b->queue)) {
                kvg_link *l = b->queue.next;
                kvg_list_unlink(l);
                kvg_list_insert(rest.prev, l);
            }
            b->nqueue = 0;
            batch_reset(&b->collect);
            pthread_mutex_unlock(&b->qlock);
            drain_on_cpu(b, &rest);
            return NULL;
        }
        uint64_t due_ns = b->collect.first_ns + b->deadline_ns;
        bool closed = b->collect.n && (full || kvg_now_ns() >= due_ns);
        if (closed && b->in_flight < b->dev->nslots) {
            unsigned slot = take_collected(b);
            pthread_mutex_unlock(&b->qlock);
            launch(b, slot);
            pthread_mutex_lock(&b->qlock);
            continue;
        }
        /* No slot is free, or nothing to collect: wait for the oldest batch. finish blocks, so
         * a job that arrives meanwhile waits for it too (one device batch at most). */
        if (b->in_flight && (closed || !b->collect.n || b->in_flight == b->dev->nslots)) {
            pthread_mutex_unlock(&b->qlock);
            finish_oldest(b);
            pthread_mutex_lock(&b->qlock);
            continue;
        }
        b->sleeping = b->collect.n ? SLEEP_DEADLINE : SLEEP_IDLE;
        if (b->collect.n)
            wait_until(b, due_ns);
        else
            pthread_cond_wait(&b->qcond, &b->qlock);
        b->sleeping = SLEEP_NO;
    }
}

/* ---- the public API ---------------------------------------------------------------------- */

static void set_why(char *why, size_t why_len, const char *msg)
{
    if (why && why_len)
        snprintf(why, why_len, "%s", msg);
}

kvg_hash_batcher *kvg_hash_batcher_new(const kvg_hash_batcher_config *cfg, kvg_hash_device *dev,
                                       char *why, size_t why_len)
{
    if (!dev) {
        set_why(why, why_len, "no device");
        return NULL;
    }
    kvg_hash_batcher_config c = cfg ? *cfg : (kvg_hash_batcher_config){0};
    if (!dev->nslots || !dev->max_batch_jobs || !dev->max_batch_bytes || !dev->max_batch_keys) {
        set_why(why, why_len, "the device reports no slot or no batch room");
        goto fail_dev;
    }
    kvg_hash_batcher *b = calloc(1, sizeof(*b));
    if (!b) {
        set_why(why, why_len, "out of memory");
        goto fail_dev;
    }
    b->dev = dev;
    b->max_jobs = KVG_MIN(dev->max_batch_jobs, (size_t)JOBS_CAP);
    if (c.max_batch_jobs && c.max_batch_jobs < b->max_jobs)
        b->max_jobs = c.max_batch_jobs;
    b->max_bytes = dev->max_batch_bytes;
    b->max_keys = dev->max_batch_keys;
    b->deadline_ns = (uint64_t)(c.deadline_us ? c.deadline_us : DEFAULT_DEADLINE_US) * 1000u;
    b->crossover = c.crossover_bytes;
    b->max_queued = c.max_queued ? c.max_queued : DEFAULT_MAX_QUEUED;
    kvg_list_init(&b->queue);
    kvg_prom_hist_init(&b->queue_hist);
    batch_reset(&b->collect);

    b->collect.jobs = calloc(b->max_jobs, sizeof(kvg_hash_job));
    b->slots = calloc(dev->nslots, sizeof(batch));
    if (!b->collect.jobs || !b->slots) {
        set_why(why, why_len, "out of memory");
        goto fail_slots;
    }
    for (unsigned i = 0; i < dev->nslots; i++) {
        batch_reset(&b->slots[i]);
        b->slots[i].jobs = calloc(b->max_jobs, sizeof(kvg_hash_job));
        if (!b->slots[i].jobs) {
            set_why(why, why_len, "out of memory");
            goto fail_slots;
        }
    }

    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&b->qcond, &ca);
    pthread_condattr_destroy(&ca);
    if (rc) {
        set_why(why, why_len, "pthread_cond_init failed");
        goto fail_slots;
    }
    pthread_mutex_init(&b->qlock, NULL);
    rc = pthread_create(&b->thread, NULL, batcher_main, b);
    if (rc) {
        char msg[96];
        snprintf(msg, sizeof(msg), "pthread_create: %s", strerror(rc));
        set_why(why, why_len, msg);
        goto fail_thread;
    }
    pthread_mutex_lock(&b->qlock);
    while (!b->ready)
        pthread_cond_wait(&b->qcond, &b->qlock);
    pthread_mutex_unlock(&b->qlock);
    char cross[48] = "none: the CPU hashes every job";
    if (b->crossover != UINT64_MAX)
        snprintf(cross, sizeof(cross), "%llu bytes", (unsigned long long)b->crossover);
    kvg_log_info("hash batcher: %s (%s), batches of %zu jobs or %llu us, crossover %s", dev->name,
                 dev->description, b->max_jobs, (unsigned long long)(b->deadline_ns / 1000), cross);
    return b;

fail_thread:
    pthread_mutex_destroy(&b->qlock);
    pthread_cond_destroy(&b->qcond);
fail_slots:
    for (unsigned i = 0; b->slots && i < dev->nslots; i++)
        free(b->slots[i].jobs);
    free(b->slots);
    free(b->collect.jobs);
    free(b);
fail_dev:
    dev->ops->close(dev);
    return NULL;
}

void kvg_hash_batcher_free(kvg_hash_batcher *b)
{
    if (!b)
        return;
    pthread_mutex_lock(&b->qlock);
    b->stopping = true;
    pthread_cond_signal(&b->qcond);
    pthread_mutex_unlock(&b->qlock);
    pthread_join(b->thread, NULL);
    for (unsigned i = 0; i < b->dev->nslots; i++)
        free(b->slots[i].jobs);
    b->dev->ops->close(b->dev);
    free(b->slots);
    free(b->collect.jobs);
    pthread_cond_destroy(&b->qcond);
    pthread_mutex_destroy(&b->qlock);
    free(b);
}

uint64_t kvg_hash_batcher_crossover(const kvg_hash_batcher *b)
{
    return b->crossover;
}

const char *kvg_hash_batcher_device(const kvg_hash_batcher *b)
{
    return b->dev->name;
}

kvg_hash_sink *kvg_hash_sink_new(kvg_hash_batcher *b, kvg_hash_wake_fn *wake, void *wake_ud)
{
    if (!b || !wake)
        return NULL;
    kvg_hash_sink *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->b = b;
    s->wake = wake;
    s->wake_ud = wake_ud;
    pthread_mutex_init(&s->lock, NULL);
    kvg_list_init(&s->done);
    atomic_init(&s->gone, false);
    atomic_init(&s->refs, 1);
    return s;
}

/* Take the completion list whole, so that the callbacks run without the lock (they may submit
 * or cancel) and the batcher's next delivery wakes the loop again. */
static void take_done(kvg_hash_sink *s, kvg_link *out)
{
    kvg_list_init(out);
    pthread_mutex_lock(&s->lock);
    if (!kvg_list_empty(&s->done)) {
        out->next = s->done.next;
        out->prev = s->done.prev;
        out->next->prev = out;
        out->prev->next = out;
        kvg_list_init(&s->done);
    }
    pthread_mutex_unlock(&s->lock);
}

void kvg_hash_sink_free(kvg_hash_sink *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->lock);
    s->closed = true;
    atomic_store_explicit(&s->gone, true, memory_order_relaxed);
    pthread_mutex_unlock(&s->lock);
    kvg_link done;
    take_done(s, &done);
    while (!kvg_list_empty(&done)) {
        kvg_hash_ticket *t = KVG_CONTAINER_OF(done.next, kvg_hash_ticket, link);
        kvg_list_unlink(&t->link);
        ticket_free(t);
    }
    /* Tickets still queued or in flight keep the sink's memory until the batcher frees them. */
    sink_unref(s);
}

void kvg_hash_sink_drain(kvg_hash_sink *s)
{
    kvg_link done;
    take_done(s, &done);
    while (!kvg_list_empty(&done)) {
        kvg_hash_ticket *t = KVG_CONTAINER_OF(done.next, kvg_hash_ticket, link);
        kvg_list_unlink(&t->link);
        /* A callback may cancel a later ticket, or even free the sink: both read here, on the
         * sink's thread, while t's reference keeps the sink's memory. */
        if (!atomic_load_explicit(&t->cancelled, memory_order_relaxed) &&
            !atomic_load_explicit(&s->gone, memory_order_relaxed))
            t->done(t->ud, 0, t->job.keys, t->job.nkeys, t->ran);
        ticket_free(t);
    }
}

/* Bytes the device reads for a job: its full blocks (the rest is never hashed) and the root's
 * inputs. */
static size_t job_bytes(const kvg_hash_job *j, uint32_t blocks)
{
    size_t unit = j->unit == KVG_HASH_TOKENS ? 4 : 1;
    return (size_t)blocks * j->block_size * unit + j->salt_len + j->model_len + j->adapter_len;
}

static char *put_copy(char **o, const char *src, size_t len)
{
    char *at = *o;
    if (len)
        kvg_copy(at, src, len);
    *o += len;
    return len ? at : NULL;
}

/* One allocation: the ticket, its keys (8-aligned after the ticket), the data (4-aligned
 * after the keys, for token ids), then salt, model and adapter. Only full blocks are copied:
 * the keys do not depend on the rest. */
static kvg_hash_ticket *ticket_new(const kvg_hash_job *job, uint32_t blocks)
{
    size_t data = job_bytes(job, blocks) - job->salt_len - job->model_len - job->adapter_len;
    size_t size =
        sizeof(kvg_hash_ticket) + (size_t)blocks * sizeof(uint64_t) + job_bytes(job, blocks);
    kvg_hash_ticket *t = malloc(size);
    if (!t)
        return NULL;
    memset(t, 0, sizeof(*t));
    uint64_t *keys = (uint64_t *)(void *)(t + 1);
    char *o = (char *)(keys + blocks);
    t->job = *job;
    t->job.keys = keys;
    t->job.max_blocks = blocks;
    t->job.nkeys = 0;
    t->job.len = (size_t)blocks * job->block_size;
    t->job.data = put_copy(&o, job->data, data);
    t->job.salt = put_copy(&o, job->salt, job->salt_len);
    t->job.model = put_copy(&o, job->model, job->model_len);
    t->job.adapter = put_copy(&o, job->adapter, job->adapter_len);
    t->bytes = job_bytes(job, blocks);
    return t;
}

int kvg_hash_submit(kvg_hash_sink *s, kvg_hash_job *job, kvg_hash_done_fn *done, void *ud,
                    kvg_hash_ticket **ticket)
{
    if (!s || !job || !done || !kvg_hash_job_valid(job))
        return -EINVAL;
    kvg_hash_batcher *b = s->b;
    size_t full = job->len / job->block_size;
    uint32_t blocks = (uint32_t)KVG_MIN(full, (size_t)job->max_blocks);
    size_t data = job_bytes(job, blocks) - job->salt_len - job->model_len - job->adapter_len;
    if (!blocks || data < b->crossover || job_bytes(job, blocks) > b->max_bytes ||
        blocks > b->max_keys)
        goto cpu;
    if (atomic_fetch_add_explicit(&b->queued, 1, memory_order_relaxed) >= b->max_queued)
        goto cpu_unqueue;
    kvg_hash_ticket *t = ticket_new(job, blocks);
    if (!t) /* the CPU needs no memory: better than failing the request */
        goto cpu_unqueue;
    t->sink = s;
    t->done = done;
    t->ud = ud;
    atomic_init(&t->cancelled, false);
    t->submit_ns = kvg_now_ns();
    atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);

    pthread_mutex_lock(&b->qlock);
    if (b->stopping) {
        pthread_mutex_unlock(&b->qlock);
        ticket_free(t);
        goto cpu_unqueue;
    }
    kvg_list_insert(b->queue.prev, &t->link);
    b->nqueue++;
    if (b->sleeping == SLEEP_IDLE ||
        (b->sleeping == SLEEP_DEADLINE && b->collect.n + b->nqueue >= b->max_jobs))
        pthread_cond_signal(&b->qcond);
    pthread_mutex_unlock(&b->qlock);
    if (ticket)
        *ticket = t;
    return 0;

cpu_unqueue:
    atomic_fetch_sub_explicit(&b->queued, 1, memory_order_relaxed);
cpu:
    kvg_hash_batch(job, 1);
    atomic_fetch_add_explicit(&b->jobs[KVG_HASH_RAN_CPU], 1, memory_order_relaxed);
    return 1;
}

void kvg_hash_cancel(kvg_hash_ticket *t)
{
    if (t)
        atomic_store_explicit(&t->cancelled, true, memory_order_relaxed);
}

/* ---- metrics ----------------------------------------------------------------------------- */

static void put_batch_hist(const kvg_hash_batcher *b, kvg_buf *out)
{
    kvg_hash_batcher *m = (kvg_hash_batcher *)b; /* atomic loads take non-const pointers */
    kvg_prom_put_header(out, "kvgate_hash_batch_jobs", KVG_PROM_HISTOGRAM,
                        "Jobs per batch launched on the hashing device.");
    uint64_t cum = 0;
    for (size_t i = 0; i <= BATCH_BUCKETS; i++) {
        char le[24] = "+Inf";
        if (i < BATCH_BUCKETS)
            le[kvg_fmt_u64(le, batch_bounds[i])] = '\0';
        cum += atomic_load_explicit(&m->batch_hist[i], memory_order_relaxed);
        kvg_prom_put_u64(out, "kvgate_hash_batch_jobs_bucket", KVG_PROM_LABELS({"le", le}), cum);
    }
    kvg_prom_put_u64(out, "kvgate_hash_batch_jobs_sum", NULL, 0,
                     atomic_load_explicit(&m->batch_sum, memory_order_relaxed));
    kvg_prom_put_u64(out, "kvgate_hash_batch_jobs_count", NULL, 0, cum);
}

void kvg_hash_batcher_write_metrics(const kvg_hash_batcher *b, uint64_t cpu_jobs, kvg_buf *out)
{
    kvg_hash_batcher *m = (kvg_hash_batcher *)b;
    const char *jobs = "kvgate_hash_jobs_total";
    kvg_prom_put_header(out, jobs, KVG_PROM_COUNTER,
                        "Block-key hashing jobs by the backend that hashed them: cpu (on the "
                        "submitting loop, or queued at shutdown), the device, fallback (the "
                        "batcher's thread, after a device error).");
    if (!b) {
        kvg_prom_put_u64(out, jobs, KVG_PROM_LABELS({"backend", "cpu"}), cpu_jobs);
        return;
    }
    uint64_t n[KVG_HASH_RAN_COUNT];
    for (int r = 0; r < KVG_HASH_RAN_COUNT; r++)
        n[r] = atomic_load_explicit(&m->jobs[r], memory_order_relaxed);
    kvg_prom_put_u64(out, jobs, KVG_PROM_LABELS({"backend", "cpu"}),
                     n[KVG_HASH_RAN_CPU] + cpu_jobs);
    kvg_prom_put_u64(out, jobs, KVG_PROM_LABELS({"backend", b->dev->name}), n[KVG_HASH_RAN_DEVICE]);
    kvg_prom_put_u64(out, jobs, KVG_PROM_LABELS({"backend", "fallback"}), n[KVG_HASH_RAN_FALLBACK]);

    put_batch_hist(b, out);

    const char *q = "kvgate_hash_queue_seconds";
    kvg_prom_put_header(out, q, KVG_PROM_HISTOGRAM,
                        "Time from a job's submission to its completion being ready for its "
                        "loop (queued jobs only).");
    kvg_prom_put_hist(out, q, NULL, 0, &b->queue_hist, &queue_buckets);

    kvg_prom_put_scalar_u64(out, "kvgate_hash_device_errors_total", KVG_PROM_COUNTER,
                            "Device launches or finishes that failed; their batches were hashed "
                            "on the CPU.",
                            atomic_load_explicit(&m->device_errors, memory_order_relaxed));
    kvg_prom_put_scalar_u64(out, "kvgate_hash_crossover_bytes", KVG_PROM_GAUGE,
                            "Jobs with less data than this hash on the submitting loop's CPU "
                            "(18446744073709551615: every job).",
                            b->crossover);
}
