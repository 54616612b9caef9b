/* SPDX-License-Identifier: Apache-2.0 */
/* The offload pool: a queue under a mutex, threads that take jobs from it, and per loop a list
 * of completed jobs with an eventfd that wakes the loop to run their callbacks. */
#include "offload.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common.h"

struct kvg_offload {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    kvg_offload_job *head, *tail; /* queued, oldest first */
    size_t queued, max_queued;
    bool stopping;
    unsigned nthreads;
    pthread_t *threads;
    _Atomic unsigned long long run, refused;
};

struct kvg_offload_sink {
    kvg_offload *pool;
    pthread_mutex_t lock;
    kvg_offload_job *done; /* completed, newest first */
    int fd;
    struct event *ev;
};

static void *pool_main(void *arg)
{
    kvg_offload *o = arg;
    pthread_mutex_lock(&o->lock);
    for (;;) {
        while (!o->head && !o->stopping)
            pthread_cond_wait(&o->wake, &o->lock);
        if (o->stopping)
            break;
        kvg_offload_job *j = o->head;
        o->head = j->next;
        if (!o->head)
            o->tail = NULL;
        o->queued--;
        pthread_mutex_unlock(&o->lock);

        j->run(j);
        atomic_fetch_add_explicit(&o->run, 1, memory_order_relaxed);
        kvg_offload_sink *s = j->sink;
        pthread_mutex_lock(&s->lock);
        j->next = s->done;
        s->done = j;
        pthread_mutex_unlock(&s->lock);
        uint64_t one = 1;
        ssize_t n = write(s->fd, &one, sizeof(one));
        (void)n; /* EAGAIN: the counter is full, so the loop is due to wake anyway */

        pthread_mutex_lock(&o->lock);
    }
    pthread_mutex_unlock(&o->lock);
    return NULL;
}

int kvg_offload_new(unsigned nthreads, size_t max_queued, kvg_offload **out)
{
    *out = NULL;
    if (nthreads < 1 || nthreads > 64 || max_queued < 1)
        return -EINVAL;
    kvg_offload *o = calloc(1, sizeof(*o));
    if (!o)
        return -ENOMEM;
    o->threads = calloc(nthreads, sizeof(*o->threads));
    if (!o->threads) {
        free(o);
        return -ENOMEM;
    }
    pthread_mutex_init(&o->lock, NULL);
    pthread_cond_init(&o->wake, NULL);
    o->max_queued = max_queued;
    for (unsigned i = 0; i < nthreads; i++) {
        int rc = pthread_create(&o->threads[i], NULL, pool_main, o);
        if (rc != 0) {
            kvg_offload_free(o);
            return -rc;
        }
        o->nthreads++;
    }
    *out = o;
    return 0;
}

void kvg_offload_free(kvg_offload *o)
{
    if (!o)
        return;
    pthread_mutex_lock(&o->lock);
    o->stopping = true;
    pthread_cond_broadcast(&o->wake);
    pthread_mutex_unlock(&o->lock);
    for (unsigned i = 0; i < o->nthreads; i++)
        pthread_join(o->threads[i], NULL);
    for (kvg_offload_job *j = o->head, *next; j; j = next) {
        next = j->next;
        j->discard(j);
    }
    pthread_cond_destroy(&o->wake);
    pthread_mutex_destroy(&o->lock);
    free(o->threads);
    free(o);
}

/* The loop: run the callbacks of what completed, oldest first. */
static void ready_cb(evutil_socket_t fd, short what, void *arg)
{
    kvg_offload_sink *s = arg;
    uint64_t v;
    ssize_t n = read(fd, &v, sizeof(v));
    (void)n;
    pthread_mutex_lock(&s->lock);
    kvg_offload_job *list = s->done;
    s->done = NULL;
    pthread_mutex_unlock(&s->lock);
    kvg_offload_job *rev = NULL;
    while (list) {
        kvg_offload_job *next = list->next;
        list->next = rev;
        rev = list;
        list = next;
    }
    while (rev) {
        kvg_offload_job *next = rev->next;
        if (rev->cancelled)
            rev->discard(rev);
        else
            rev->done(rev);
        rev = next;
    }
}

int kvg_offload_sink_new(kvg_offload *o, struct event_base *base, kvg_offload_sink **out)
{
    *out = NULL;
    kvg_offload_sink *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    s->pool = o;
    pthread_mutex_init(&s->lock, NULL);
    s->fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->fd < 0) {
        int rc = -errno;
        pthread_mutex_destroy(&s->lock);
        free(s);
        return rc;
    }
    s->ev = event_new(base, s->fd, EV_READ | EV_PERSIST, ready_cb, s);
    if (!s->ev || event_add(s->ev, NULL) < 0) {
        kvg_offload_sink_free(s);
        return -ENOMEM;
    }
    *out = s;
    return 0;
}

void kvg_offload_sink_free(kvg_offload_sink *s)
{
    if (!s)
        return;
    for (kvg_offload_job *j = s->done, *next; j; j = next) {
        next = j->next;
        j->discard(j);
    }
    if (s->ev)
        event_free(s->ev);
    close(s->fd);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

int kvg_offload_submit(kvg_offload_sink *sink, kvg_offload_job *j)
{
    kvg_offload *o = sink->pool;
    j->sink = sink;
    j->cancelled = false;
    j->next = NULL;
    pthread_mutex_lock(&o->lock);
    if (o->queued >= o->max_queued || o->stopping) {
        pthread_mutex_unlock(&o->lock);
        atomic_fetch_add_explicit(&o->refused, 1, memory_order_relaxed);
        return -EBUSY;
    }
    if (o->tail)
        o->tail->next = j;
    else
        o->head = j;
    o->tail = j;
    o->queued++;
    pthread_cond_signal(&o->wake);
    pthread_mutex_unlock(&o->lock);
    return 0;
}

void kvg_offload_cancel(kvg_offload_job *j)
{
    j->cancelled = true;
}

void kvg_offload_counts(const kvg_offload *o, unsigned long long *run, unsigned long long *refused)
{
    *run = o ? atomic_load_explicit(&o->run, memory_order_relaxed) : 0;
    *refused = o ? atomic_load_explicit(&o->refused, memory_order_relaxed) : 0;
}
