/* SPDX-License-Identifier: Apache-2.0 */
/* The gateway's socket layer. libevent's bufferevents cost four epoll_ctl calls, an extra loop
 * turn and a FIONREAD ioctl per request and response (they add the write event when output
 * appears, write only when epoll reports writability, then remove it); a proxy's hot path is
 * mostly that. Here output is written right after the callback that produced it, the write
 * event is armed only when the kernel says EAGAIN, and reads go straight into reserved evbuffer
 * space. TLS uses the same paths through SSL_read/SSL_write on the non-blocking fd. */
#include "sock.h"

#include "common.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#define SOCK_READ_CHUNK 16384
#define SOCK_SMALL_READ 2048 /* reads up to this size go through the scratch */
#define SOCK_WRITE_IOV 16

static void on_read_ready(evutil_socket_t fd, short what, void *arg);
static void on_write_ready(evutil_socket_t fd, short what, void *arg);
static void on_flush(evutil_socket_t fd, short what, void *arg);
static void flush_now(kvg_sock *s);
static void read_ready(kvg_sock *s);

/*
 * Writes asked for with kvg_sock_flush_soon during a socket callback are made when that
 * callback returns: the thread's sockets with output waiting sit in a list that the outermost
 * socket callback drains on its way out. Activating a libevent event instead (what is done
 * outside socket callbacks) runs the write after every other event already active in this loop
 * turn: with 32 connections readable at once, the first request's upstream write waited for
 * the other 31 to be parsed and routed, and that wait showed in the tail (2026-12-02).
 */
typedef struct pending_flushes {
    kvg_sock *head;
    unsigned depth; /* socket callbacks on the stack */
    uint64_t now;   /* kvg_sock_clock_ns of the outermost callback, 0 until read */
} pending_flushes;

static _Thread_local pending_flushes pending;

static void enter(void)
{
    if (pending.depth++ == 0)
        pending.now = 0;
}

uint64_t kvg_sock_clock_ns(void)
{
    if (pending.depth == 0)
        return kvg_now_ns();
    if (!pending.now)
        pending.now = kvg_now_ns();
    return pending.now;
}

static void leave(void)
{
    if (pending.depth > 1) {
        pending.depth--;
        return;
    }
    /* Still "inside" while draining: what the flushes' callbacks queue joins this drain. */
    while (pending.head) {
        kvg_sock *s = pending.head;
        pending.head = s->pend_next;
        s->pend_next = NULL;
        s->pend_queued = false;
        flush_now(s);
    }
    pending.depth = 0;
}

static void unqueue(kvg_sock *s)
{
    if (!s->pend_queued)
        return;
    for (kvg_sock **p = &pending.head; *p; p = &(*p)->pend_next) {
        if (*p == s) {
            *p = s->pend_next;
            break;
        }
    }
    s->pend_next = NULL;
    s->pend_queued = false;
}

static void set_rev(kvg_sock *s, bool on)
{
    if (on && !s->rev_added) {
        event_add(&s->rev, NULL);
        s->rev_added = true;
    } else if (!on && s->rev_added) {
        event_del(&s->rev);
        s->rev_added = false;
    }
}

static void set_wev(kvg_sock *s, bool on)
{
    if (on && !s->wev_added) {
        event_add(&s->wev, NULL);
        s->wev_added = true;
    } else if (!on && s->wev_added) {
        event_del(&s->wev);
        s->wev_added = false;
    }
}

/* Whether the read event should be armed now. */
static void update_rev(kvg_sock *s)
{
    bool full = s->read_high && evbuffer_get_length(s->in) >= s->read_high;
    bool need = !s->stopped && !s->eof && !s->failed && !s->connecting &&
                (s->handshaking || s->write_wants_read || (s->want_read && !full));
    set_rev(s, need);
}

static int setup(kvg_sock *s, struct event_base *base, evutil_socket_t fd)
{
    s->fd = fd;
    s->base = base;
    s->in = evbuffer_new();
    s->out = evbuffer_new();
    if (!s->in || !s->out)
        return -ENOMEM;
    event_assign(&s->rev, base, fd, EV_READ | EV_PERSIST, on_read_ready, s);
    event_assign(&s->wev, base, fd, EV_WRITE | EV_PERSIST, on_write_ready, s);
    event_assign(&s->flush_ev, base, -1, 0, on_flush, s);
    return 0;
}

int kvg_sock_init(kvg_sock *s, struct event_base *base, evutil_socket_t fd, SSL *ssl)
{
    memset(s, 0, sizeof(*s));
    s->fd = -1;
    int rc = setup(s, base, fd);
    s->ssl = ssl;
    if (rc < 0)
        return rc;
    if (ssl) {
        SSL_set_fd(ssl, fd);
        SSL_set_accept_state(ssl);
        SSL_set_mode(ssl, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                              SSL_MODE_RELEASE_BUFFERS);
        s->handshaking = true;
        update_rev(s);
        /* The ClientHello is usually waiting already. */
        event_active(&s->rev, EV_READ, 1);
    }
    return 0;
}

int kvg_sock_connect(kvg_sock *s, struct event_base *base, const struct sockaddr *sa,
                     socklen_t salen)
{
    memset(s, 0, sizeof(*s));
    s->fd = -1;
    evutil_socket_t fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int rc = setup(s, base, fd);
    if (rc < 0)
        return rc;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(fd, sa, salen) < 0 && errno != EINPROGRESS)
        return -errno;
    /* Completion (or failure) shows as writability. */
    s->connecting = true;
    set_wev(s, true);
    return 0;
}

void kvg_sock_done(kvg_sock *s)
{
    unqueue(s);
    if (s->base) {
        event_del(&s->rev);
        event_del(&s->wev);
        event_del(&s->flush_ev);
    }
    if (s->ssl) {
        if (!s->handshaking && !s->failed)
            SSL_shutdown(s->ssl); /* best effort close_notify; never waits */
        SSL_free(s->ssl);
        ERR_clear_error();
    }
    if (s->fd >= 0)
        close(s->fd);
    if (s->in)
        evbuffer_free(s->in);
    if (s->out)
        evbuffer_free(s->out);
    memset(s, 0, sizeof(*s));
    s->fd = -1;
}

void kvg_sock_set_callbacks(kvg_sock *s, kvg_sock_fn read_fn, kvg_sock_fn write_fn,
                            kvg_sock_event_fn event_fn, void *ud)
{
    s->read_fn = read_fn;
    s->write_fn = write_fn;
    s->event_fn = event_fn;
    s->ud = ud;
}

void kvg_sock_read(kvg_sock *s, bool on)
{
    s->want_read = on;
    update_rev(s);
    /* TLS may hold decrypted bytes the kernel no longer signals. */
    if (on && s->ssl && !s->handshaking && SSL_pending(s->ssl) > 0)
        event_active(&s->rev, EV_READ, 1);
}

void kvg_sock_consumed(kvg_sock *s)
{
    update_rev(s);
}

void kvg_sock_stop(kvg_sock *s)
{
    s->stopped = true;
    unqueue(s);
    if (!s->base)
        return;
    set_rev(s, false);
    set_wev(s, false);
    event_del(&s->flush_ev);
}

static void fail(kvg_sock *s, int err)
{
    s->failed = true;
    s->error = err;
    set_wev(s, false);
    update_rev(s);
}

/* Report failure or EOF to the owner (after any input it still has to read). */
static void report(kvg_sock *s, int what)
{
    if (s->stopped || !s->event_fn)
        return;
    s->event_fn(s, what, s->ud);
}

/* ---- writing ------------------------------------------------------------------------------- */

/* Returns true when output is fully sent. */
static bool write_out(kvg_sock *s)
{
    while (evbuffer_get_length(s->out) > 0) {
        if (s->ssl) {
            struct evbuffer_iovec v;
            if (evbuffer_peek(s->out, -1, NULL, &v, 1) < 1)
                break;
            ERR_clear_error();
            int n = SSL_write(s->ssl, v.iov_base, (int)KVG_MIN(v.iov_len, 1u << 30));
            if (n > 0) {
                evbuffer_drain(s->out, (size_t)n);
                s->bytes_written += (uint64_t)n;
                continue;
            }
            int e = SSL_get_error(s->ssl, n);
            if (e == SSL_ERROR_WANT_WRITE)
                return false;
            if (e == SSL_ERROR_WANT_READ) {
                s->write_wants_read = true;
                update_rev(s);
                return false;
            }
            fail(s, e == SSL_ERROR_SYSCALL && errno ? errno : EPROTO);
            return false;
        }
        struct evbuffer_iovec v[SOCK_WRITE_IOV];
        int nv = evbuffer_peek(s->out, -1, NULL, v, SOCK_WRITE_IOV);
        if (nv > SOCK_WRITE_IOV)
            nv = SOCK_WRITE_IOV;
        ssize_t n = writev(s->fd, (struct iovec *)v, nv);
        if (n > 0) {
            evbuffer_drain(s->out, (size_t)n);
            s->bytes_written += (uint64_t)n;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return false;
        if (n < 0 && errno == EINTR)
            continue;
        fail(s, n < 0 ? errno : EPIPE);
        return false;
    }
    return true;
}

void kvg_sock_flush(kvg_sock *s)
{
    if (s->stopped || s->failed || s->connecting || s->handshaking)
        return;
    if (s->flush_active) { /* the loop would flush again for nothing */
        event_del(&s->flush_ev);
        s->flush_active = false;
    }
    bool done = write_out(s);
    if (s->failed) {
        /* Tell the owner from the loop, not from inside its own call. */
        event_active(&s->rev, EV_READ, 1);
        return;
    }
    if (!done)
        s->blocked = true;
    set_wev(s, !done && !s->write_wants_read);
}

void kvg_sock_flush_soon(kvg_sock *s)
{
    if (s->stopped || s->failed)
        return;
    if (pending.depth > 0) { /* inside a socket callback: written when it returns */
        if (!s->pend_queued) {
            s->pend_queued = true;
            s->pend_next = pending.head;
            pending.head = s;
        }
        return;
    }
    /* Same-priority events activated now run in this very loop turn, after the current
     * callback: the write is coalesced without an extra epoll_wait. */
    s->flush_active = true;
    event_active(&s->flush_ev, EV_WRITE, 1);
}

/* After a write from the loop: tell the owner when output fell to the low-water mark (as a
 * bufferevent's write callback does), or emptied when it asked to know. */
static void notify_written(kvg_sock *s, size_t before)
{
    size_t left = evbuffer_get_length(s->out);
    if (s->stopped || s->failed || !s->write_fn)
        return;
    bool fell = left <= s->write_low && (before > s->write_low || s->blocked);
    if (fell || (s->drain_notify && left == 0)) {
        if (left <= s->write_low)
            s->blocked = false;
        s->write_fn(s, s->ud);
    }
}

/* The deferred write: from the loop or from the drain of pending flushes, so the owner is never
 * re-entered from its own call. */
static void flush_now(kvg_sock *s)
{
    if (s->stopped)
        return;
    size_t before = evbuffer_get_length(s->out);
    kvg_sock_flush(s);
    notify_written(s, before);
}

static void on_flush(evutil_socket_t fd, short what, void *arg)
{
    ((kvg_sock *)arg)->flush_active = false;
    enter();
    flush_now(arg);
    leave();
}

static void finish_handshake(kvg_sock *s);

static void write_ready(kvg_sock *s);

static void on_write_ready(evutil_socket_t fd, short what, void *arg)
{
    enter();
    write_ready(arg);
    leave();
}

static void write_ready(kvg_sock *s)
{
    evutil_socket_t fd = s->fd;
    if (s->connecting) {
        int err = 0;
        socklen_t len = sizeof(err);
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
            err = errno;
        s->connecting = false;
        set_wev(s, false);
        if (err) {
            fail(s, err);
            report(s, KVG_SOCK_ERROR);
            return;
        }
        update_rev(s);
        report(s, KVG_SOCK_CONNECTED);
        if (!s->stopped)
            kvg_sock_flush(s);
        return;
    }
    if (s->handshaking) {
        finish_handshake(s);
        return;
    }
    if (s->read_wants_write) {
        s->read_wants_write = false;
        set_wev(s, evbuffer_get_length(s->out) > 0);
        read_ready(s);
        return;
    }
    size_t before = evbuffer_get_length(s->out);
    bool done = write_out(s);
    if (s->failed) {
        report(s, KVG_SOCK_ERROR);
        return;
    }
    set_wev(s, !done && !s->write_wants_read);
    notify_written(s, before);
}

/* ---- reading and the TLS handshake --------------------------------------------------------- */

static void finish_handshake(kvg_sock *s)
{
    ERR_clear_error();
    int r = SSL_do_handshake(s->ssl);
    if (r == 1) {
        s->handshaking = false;
        set_wev(s, false);
        update_rev(s);
        report(s, KVG_SOCK_CONNECTED);
        return;
    }
    int e = SSL_get_error(s->ssl, r);
    if (e == SSL_ERROR_WANT_READ) {
        set_wev(s, false);
        update_rev(s);
        return;
    }
    if (e == SSL_ERROR_WANT_WRITE) {
        set_wev(s, true);
        return;
    }
    fail(s, EPROTO);
    report(s, KVG_SOCK_ERROR);
}

/* A plaintext read that returned n <= 0: the status to report (KVG_SOCK_EOF, KVG_SOCK_ERROR,
 * or 0 when the socket is drained), or -1 to read again (EINTR). Reads errno. */
static int read_ended(kvg_sock *s, ssize_t n)
{
    if (n == 0) {
        s->eof = true;
        return KVG_SOCK_EOF;
    }
    if (errno == EINTR)
        return -1;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
        return 0;
    s->failed = true;
    s->error = errno;
    return KVG_SOCK_ERROR;
}

static int out_of_memory(kvg_sock *s)
{
    s->failed = true;
    s->error = ENOMEM;
    return KVG_SOCK_ERROR;
}

static void on_read_ready(evutil_socket_t fd, short what, void *arg)
{
    enter();
    read_ready(arg);
    leave();
}

static void read_ready(kvg_sock *s)
{
    if (s->stopped)
        return;
    if (s->failed) { /* a write failure noticed earlier */
        report(s, KVG_SOCK_ERROR);
        return;
    }
    if (s->handshaking) {
        finish_handshake(s);
        return;
    }
    if (s->write_wants_read) {
        s->write_wants_read = false;
        kvg_sock_flush(s);
        if (s->stopped || s->failed)
            return;
    }
    if (!s->want_read) {
        update_rev(s);
        return;
    }
    size_t got = 0;
    int status = 0;
    for (;;) {
        size_t have = evbuffer_get_length(s->in);
        if (s->read_high && have >= s->read_high)
            break;
        size_t want = SOCK_READ_CHUNK;
        if (s->read_high && s->read_high - have < want)
            want = s->read_high - have;
        if (!s->ssl && !s->bulk) {
            /* Small reads land in the thread's scratch and are added at their size: a chain
             * that glibc's per-thread cache serves, where reserving SOCK_READ_CHUNK makes
             * (and the drain frees) a 16 KiB block from its bins on every read. */
            static _Thread_local char scratch[SOCK_SMALL_READ];
            ssize_t n = read(s->fd, scratch, KVG_MIN(want, sizeof(scratch)));
            if (n <= 0) {
                if ((status = read_ended(s, n)) < 0) {
                    status = 0;
                    continue;
                }
                break;
            }
            if (evbuffer_add(s->in, scratch, (size_t)n) < 0) {
                status = out_of_memory(s);
                break;
            }
            got += (size_t)n;
            if ((size_t)n < KVG_MIN(want, sizeof(scratch)))
                break;      /* drained */
            s->bulk = true; /* a full scratch: more is coming, read it in place */
            continue;
        }
        struct evbuffer_iovec v;
        if (evbuffer_reserve_space(s->in, (ev_ssize_t)want, &v, 1) < 1) {
            status = out_of_memory(s);
            break;
        }
        if (v.iov_len > want)
            v.iov_len = want;
        ssize_t n;
        if (s->ssl) {
            ERR_clear_error();
            int r = SSL_read(s->ssl, v.iov_base, (int)v.iov_len);
            if (r > 0) {
                n = r;
            } else {
                int e = SSL_get_error(s->ssl, r);
                evbuffer_commit_space(s->in, &v, 0);
                if (e == SSL_ERROR_WANT_READ)
                    break;
                if (e == SSL_ERROR_WANT_WRITE) {
                    s->read_wants_write = true;
                    set_wev(s, true);
                    break;
                }
                if (e == SSL_ERROR_ZERO_RETURN ||
                    (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0 && errno == 0)) {
                    s->eof = true; /* close_notify, or a peer that just closed */
                    status = KVG_SOCK_EOF;
                    break;
                }
                s->failed = true;
                s->error = e == SSL_ERROR_SYSCALL && errno ? errno : EPROTO;
                status = KVG_SOCK_ERROR;
                break;
            }
        } else {
            n = read(s->fd, v.iov_base, v.iov_len);
            if (n <= 0) {
                int e = errno;
                evbuffer_commit_space(s->in, &v, 0);
                errno = e;
                if ((status = read_ended(s, n)) < 0) {
                    status = 0;
                    continue;
                }
                break;
            }
        }
        v.iov_len = (size_t)n;
        evbuffer_commit_space(s->in, &v, 1);
        got += (size_t)n;
        /* A short plaintext read means the socket is drained: skip the EAGAIN round trip. */
        if (!s->ssl && (size_t)n < want) {
            s->bulk = (size_t)n >= SOCK_SMALL_READ;
            break;
        }
    }
    update_rev(s);
    if (got && s->read_fn) {
        s->read_fn(s, s->ud);
        if (s->stopped)
            return;
    }
    if (status)
        report(s, status);
}

/* ---- reading an HTTP/1.1 head -----------------------------------------------------------------
 */

bool kvg_sock_skip_line_ends(kvg_sock *s)
{
    struct evbuffer_iovec v;
    for (;;) {
        if (evbuffer_get_length(s->in) == 0 || evbuffer_peek(s->in, -1, NULL, &v, 1) < 1)
            return false;
        const char *p = v.iov_base;
        size_t k = 0;
        while (k < v.iov_len && (p[k] == '\r' || p[k] == '\n'))
            k++;
        if (k) {
            evbuffer_drain(s->in, k);
            kvg_sock_consumed(s);
        }
        if (k < v.iov_len)
            return true;
    }
}

char *kvg_sock_contiguous(kvg_sock *s, size_t want, bool *oom)
{
    struct evbuffer_iovec v;
    *oom = false;
    if (evbuffer_peek(s->in, -1, NULL, &v, 1) < 1)
        return NULL;
    if (v.iov_len >= want)
        return v.iov_base;
    char *p = (char *)evbuffer_pullup(s->in, (ev_ssize_t)want);
    *oom = p == NULL;
    return p;
}

char *kvg_sock_take(kvg_sock *s, size_t n, kvg_arena *a)
{
    char *copy = kvg_arena_alloc(a, n + 1);
    if (!copy || evbuffer_remove(s->in, copy, n) != (int)n)
        return NULL;
    copy[n] = '\0';
    kvg_sock_consumed(s);
    return copy;
}
