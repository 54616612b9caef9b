/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of the offload pool (gateway/offload.c): every job completes once on its loop
 * (done, or discard when cancelled), the queue bound refuses, and freeing the pool discards what
 * never ran. Run under ASan and TSan-like scrutiny by CI's sanitizer build. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <event2/event.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "offload.h"

typedef struct job {
    kvg_offload_job base;
    uint64_t in, out;
    pthread_t ran_on;
    int *done, *discarded;
    pthread_t loop;
} job;

static void run(kvg_offload_job *j)
{
    job *x = (job *)j;
    uint64_t h = x->in;
    for (int i = 0; i < 1000; i++)
        h = h * 6364136223846793005ull + 1442695040888963407ull;
    x->out = h;
    x->ran_on = pthread_self();
}

static void done(kvg_offload_job *j)
{
    job *x = (job *)j;
    assert_true(pthread_equal(pthread_self(), x->loop));
    assert_false(pthread_equal(x->ran_on, x->loop));
    uint64_t h = x->in;
    for (int i = 0; i < 1000; i++)
        h = h * 6364136223846793005ull + 1442695040888963407ull;
    assert_true(x->out == h);
    (*x->done)++;
    free(x);
}

static void discard(kvg_offload_job *j)
{
    job *x = (job *)j;
    (*x->discarded)++;
    free(x);
}

static job *new_job(uint64_t in, int *d, int *disc)
{
    job *x = calloc(1, sizeof(*x));
    assert_non_null(x);
    x->base.run = run;
    x->base.done = done;
    x->base.discard = discard;
    x->in = in;
    x->done = d;
    x->discarded = disc;
    x->loop = pthread_self();
    return x;
}

/* Run the loop until n callbacks came (or a few seconds passed). */
static void loop_until(struct event_base *base, int *a, int *b, int n)
{
    for (int i = 0; i < 5000 && *a + *b < n; i++) {
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
        usleep(1000);
    }
}

static void test_jobs_complete_on_their_loop(void **state)
{
    (void)state;
    struct event_base *base = event_base_new();
    kvg_offload *o;
    assert_int_equal(kvg_offload_new(3, 10000, &o), 0);
    kvg_offload_sink *s;
    assert_int_equal(kvg_offload_sink_new(o, base, &s), 0);
    int d = 0, disc = 0;
    job *cancelled[100];
    for (int i = 0; i < 2000; i++) {
        job *x = new_job((uint64_t)i, &d, &disc);
        assert_int_equal(kvg_offload_submit(s, &x->base), 0);
        if (i % 20 == 0)
            cancelled[i / 20] = x;
    }
    for (int i = 0; i < 100; i++)
        kvg_offload_cancel(&cancelled[i]->base);
    loop_until(base, &d, &disc, 2000);
    assert_int_equal(d, 1900);
    assert_int_equal(disc, 100);
    unsigned long long ran, refused;
    kvg_offload_counts(o, &ran, &refused);
    assert_int_equal(ran, 2000);
    assert_int_equal(refused, 0);
    kvg_offload_free(o);
    kvg_offload_sink_free(s);
    event_base_free(base);
}

/* The bound refuses; freeing the pool discards the queued jobs and the sink the completed ones
 * nobody drained. */
static void run_slow(kvg_offload_job *j)
{
    usleep(20000);
    run(j);
}

static void test_bound_and_free(void **state)
{
    (void)state;
    struct event_base *base = event_base_new();
    kvg_offload *o;
    assert_int_equal(kvg_offload_new(1, 4, &o), 0);
    kvg_offload_sink *s;
    assert_int_equal(kvg_offload_sink_new(o, base, &s), 0);
    int d = 0, disc = 0, accepted = 0, refused_here = 0;
    for (int i = 0; i < 12; i++) {
        job *x = new_job((uint64_t)i, &d, &disc);
        x->base.run = run_slow;
        if (kvg_offload_submit(s, &x->base) == 0) {
            accepted++;
        } else {
            refused_here++;
            free(x);
        }
    }
    assert_true(accepted >= 4 && accepted <= 5); /* 4 queued, and maybe one already taken */
    unsigned long long ran, refused;
    kvg_offload_counts(o, &ran, &refused);
    assert_int_equal(refused, (unsigned long long)refused_here);
    kvg_offload_free(o); /* the running one finishes; the queued ones are discarded */
    kvg_offload_sink_free(s);
    assert_int_equal(d, 0); /* the loop never ran: no done */
    assert_int_equal(disc, accepted);
    event_base_free(base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jobs_complete_on_their_loop),
        cmocka_unit_test(test_bound_and_free),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
