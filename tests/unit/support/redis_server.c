/* SPDX-License-Identifier: Apache-2.0 */
/* Start and stop a redis-server for a unit test (redis_server.h). */
#include "redis_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#define MAX_EXTRA 32
/* Another process may take the port between our probe and the server's bind: try again. */
#define START_TRIES 5
#define START_WAIT_MS 5000

/* A port nobody listens on now: bind port 0 and read back what the kernel chose. */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static pid_t spawn(uint16_t port, const char *const *extra)
{
    const char *bin = getenv("KVG_REDIS_SERVER");
    if (!bin || !*bin)
        bin = "redis-server";
    char port_s[8];
    snprintf(port_s, sizeof(port_s), "%u", port);
    const char *argv[16 + MAX_EXTRA] = {
        bin,  "--port", port_s, "--bind",      "127.0.0.1", "--save",    "", "--appendonly",
        "no", "--dir",  "/tmp", "--daemonize", "no",        "--logfile", "",
    };
    size_t n = 15;
    for (size_t i = 0; extra && extra[i] && i < MAX_EXTRA; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;

    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    /* The child: die with the test, stay quiet. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(127);
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) {
        dup2(null, STDIN_FILENO);
        dup2(null, STDOUT_FILENO);
        close(null);
    }
    execvp(bin, (char *const *)argv);
    fprintf(stderr, "redis_server: cannot run %s: %s\n", bin, strerror(errno));
    _exit(127);
}

/* Wait until it answers PING; false when it exited or did not answer in time. */
static bool wait_ready(const test_redis *r)
{
    for (long waited = 0; waited < START_WAIT_MS; waited += 20) {
        int status;
        if (waitpid(r->pid, &status, WNOHANG) == r->pid)
            return false;
        redisContext *c = test_redis_connect(r);
        if (c) {
            redisReply *rep = redisCommand(c, "PING");
            bool ok = rep && rep->type == REDIS_REPLY_STATUS;
            freeReplyObject(rep);
            redisFree(c);
            if (ok)
                return true;
        }
        sleep_ms(20);
    }
    return false;
}

int test_redis_start(test_redis *r, const char *const *extra)
{
    *r = (test_redis){0};
    for (int t = 0; t < START_TRIES; t++) {
        int port = free_port();
        if (port <= 0)
            continue;
        r->port = (uint16_t)port;
        r->pid = spawn(r->port, extra);
        if (r->pid < 0) {
            fprintf(stderr, "redis_server: fork: %s\n", strerror(errno));
            r->pid = 0;
            return -1;
        }
        if (wait_ready(r))
            return 0;
        test_redis_stop(r);
    }
    fprintf(stderr, "redis_server: no redis-server answered after %d tries\n", START_TRIES);
    return -1;
}

redisContext *test_redis_connect(const test_redis *r)
{
    struct timeval tv = {.tv_sec = 10};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);
    if (!c)
        return NULL;
    if (c->err || redisSetTimeout(c, tv) != REDIS_OK) {
        redisFree(c);
        return NULL;
    }
    return c;
}

void test_redis_stop(test_redis *r)
{
    if (r->pid <= 0)
        return;
    kill(r->pid, SIGKILL);
    while (waitpid(r->pid, NULL, 0) < 0 && errno == EINTR)
        ;
    r->pid = 0;
}
