/* SPDX-License-Identifier: Apache-2.0 */
/* A redis-server of a test's own: started on a free loopback port with nothing persisted, and
 * gone when the test process is, however it ends. */
#ifndef KVG_TEST_REDIS_SERVER_H
#define KVG_TEST_REDIS_SERVER_H

#include <stdint.h>
#include <sys/types.h>

struct redisContext;

typedef struct test_redis {
    pid_t pid; /* 0: not running */
    uint16_t port;
} test_redis;

/** Start redis-server (PATH, or $KVG_REDIS_SERVER) on 127.0.0.1 and a free port, with `--save ''
 *  --appendonly no` plus extra (NULL-terminated, may be NULL), and wait until it answers PING.
 *  The server gets SIGKILL when the calling process dies (PR_SET_PDEATHSIG), so a crashed test
 *  leaves nothing behind. 0, or -1 with the reason on stderr. */
int test_redis_start(test_redis *r, const char *const *extra);
/** A blocking connection to it (10 s timeouts), or NULL. The caller redisFree()s it. */
struct redisContext *test_redis_connect(const test_redis *r);
/** Kill it (SIGKILL) and reap it. Stopped or never started: no-op. */
void test_redis_stop(test_redis *r);

#endif
