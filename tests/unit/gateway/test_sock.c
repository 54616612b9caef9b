/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the gateway's socket layer over socketpairs: coalesced writes, the write
 * callback at the low-water mark, read throttling, EOF after the last bytes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common.h"
#include "sock.h"

typedef struct fixture {
    struct event_base *base;
    kvg_sock s;
    int peer;
    int reads, writes, events, last_event;
} fixture;

static void on_read(kvg_sock *s, void *ud)
{
    ((fixture *)ud)->reads++;
}

static void on_write(kvg_sock *s, void *ud)
{
    ((fixture *)ud)->writes++;
}

static void on_event(kvg_sock *s, int what, void *ud)
{
    fixture *f = ud;
    f->events++;
    f->last_event = what;
}

static int setup(void **state)
{
    signal(SIGPIPE, SIG_IGN);
    fixture *f = calloc(1, sizeof(*f));
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    f->base = event_base_new();
    assert_int_equal(kvg_sock_init(&f->s, f->base, sv[0], NULL), 0);
    f->peer = sv[1];
    kvg_sock_set_callbacks(&f->s, on_read, on_write, on_event, f);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    kvg_sock_done(&f->s);
    close(f->peer);
    event_base_free(f->base);
    free(f);
    return 0;
}

static void turn(fixture *f, int n)
{
    for (int i = 0; i < n; i++)
        event_base_loop(f->base, EVLOOP_NONBLOCK);
}

static size_t drain_peer(fixture *f)
{
    char buf[65536];
    size_t total = 0;
    ssize_t n;
    while ((n = read(f->peer, buf, sizeof(buf))) > 0)
        total += (size_t)n;
    return total;
}

/* Several flush requests in one turn cost one write, and the bytes arrive in order. */
static void test_flush_soon_coalesces(void **state)
{
    fixture *f = *state;
    evbuffer_add(f->s.out, "ab", 2);
    kvg_sock_flush_soon(&f->s);
    evbuffer_add(f->s.out, "cd", 2);
    kvg_sock_flush_soon(&f->s);
    assert_int_equal(evbuffer_get_length(f->s.out), 4); /* nothing written inside the call */
    turn(f, 1);
    assert_int_equal(evbuffer_get_length(f->s.out), 0);
    char buf[8] = {0};
    assert_int_equal(read(f->peer, buf, sizeof(buf)), 4);
    assert_string_equal(buf, "abcd");
}

/* The write callback fires once output falls to the low-water mark after a loop write, even
 * when the kernel took everything at once (no EAGAIN): a paused producer must hear of it. */
static void test_write_callback_at_low_water(void **state)
{
    fixture *f = *state;
    f->s.write_low = 1024;
    char *chunk = calloc(1, 4096);
    evbuffer_add(f->s.out, chunk, 4096);
    free(chunk);
    kvg_sock_flush_soon(&f->s);
    turn(f, 1);
    assert_int_equal(evbuffer_get_length(f->s.out), 0);
    assert_int_equal(f->writes, 1);
    /* Below the mark from the start: no callback. */
    evbuffer_add(f->s.out, "x", 1);
    kvg_sock_flush_soon(&f->s);
    turn(f, 1);
    assert_int_equal(f->writes, 1);
    assert_int_equal(drain_peer(f), 4097);
}

/* A full socket: EAGAIN arms the write event, and the callback comes when the peer reads. */
static void test_blocked_then_writable(void **state)
{
    fixture *f = *state;
    f->s.write_low = 0;
    char *chunk = calloc(1, 1 << 20);
    evbuffer_add(f->s.out, chunk, 1 << 20);
    free(chunk);
    kvg_sock_flush_soon(&f->s);
    turn(f, 1);
    assert_true(evbuffer_get_length(f->s.out) > 0); /* a socketpair holds far less than 1 MiB */
    assert_int_equal(f->writes, 0);
    size_t got = 0;
    for (int i = 0; i < 1000 && f->writes == 0; i++) {
        got += drain_peer(f);
        turn(f, 1);
    }
    got += drain_peer(f);
    assert_int_equal(f->writes, 1);
    assert_int_equal(got, 1 << 20);
}

/* read_high stops reading; kvg_sock_consumed resumes; EOF comes after the last bytes. */
static void test_read_throttle_and_eof(void **state)
{
    fixture *f = *state;
    f->s.read_high = 100;
    kvg_sock_read(&f->s, true);
    char data[300];
    memset(data, 'z', sizeof(data));
    assert_int_equal(write(f->peer, data, sizeof(data)), (ssize_t)sizeof(data));
    shutdown(f->peer, SHUT_WR);
    turn(f, 3);
    assert_int_equal(evbuffer_get_length(f->s.in), 100);
    assert_int_equal(f->events, 0); /* EOF not yet: input is still unread */
    size_t total = 100;
    for (int i = 0; i < 10 && f->events == 0; i++) {
        evbuffer_drain(f->s.in, evbuffer_get_length(f->s.in));
        kvg_sock_consumed(&f->s);
        turn(f, 1);
        total += evbuffer_get_length(f->s.in);
    }
    assert_int_equal(total, 300);
    assert_int_equal(f->events, 1);
    assert_int_equal(f->last_event, KVG_SOCK_EOF);
    assert_true(f->reads >= 3);
}

/* A write to a peer that is gone reports an error from the loop, not inside the flush. */
static void test_write_error_reported(void **state)
{
    fixture *f = *state;
    close(f->peer);
    f->peer = -1;
    evbuffer_add(f->s.out, "lost", 4);
    kvg_sock_flush(&f->s);
    assert_int_equal(f->events, 0);
    turn(f, 2);
    assert_int_equal(f->events, 1);
    assert_int_equal(f->last_event, KVG_SOCK_ERROR);
    assert_int_equal(f->s.error, EPIPE);
}

/* After stop, nothing is delivered any more. */
static void test_stop_silences(void **state)
{
    fixture *f = *state;
    kvg_sock_read(&f->s, true);
    kvg_sock_stop(&f->s);
    assert_int_equal(write(f->peer, "x", 1), 1);
    turn(f, 3);
    assert_int_equal(f->reads, 0);
    assert_int_equal(f->events, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_flush_soon_coalesces, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_callback_at_low_water, setup, teardown),
        cmocka_unit_test_setup_teardown(test_blocked_then_writable, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_throttle_and_eof, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_error_reported, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_silences, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
