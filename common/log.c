/* SPDX-License-Identifier: Apache-2.0 */
/* Leveled error log on stderr, and the clocks the log and everything else read. */
#include "common.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static _Atomic int log_level = KVG_LOG_INFO;

static const char *const level_names[KVG_LOG_LEVEL_COUNT] = {"error", "warn", "info", "debug"};

const char *kvg_log_level_str(kvg_log_level level)
{
    return level < KVG_LOG_LEVEL_COUNT ? level_names[level] : "?";
}

int kvg_log_level_parse(const char *name, kvg_log_level *out)
{
    for (int i = 0; i < KVG_LOG_LEVEL_COUNT; i++) {
        if (strcmp(name, level_names[i]) == 0) {
            *out = (kvg_log_level)i;
            return 0;
        }
    }
    return KVG_EPARSE;
}

void kvg_log_set_level(kvg_log_level level)
{
    atomic_store_explicit(&log_level, (int)level, memory_order_relaxed);
}

bool kvg_log_enabled(kvg_log_level level)
{
    return (int)level <= atomic_load_explicit(&log_level, memory_order_relaxed);
}

uint64_t kvg_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t kvg_wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void kvg_format_time(uint64_t wall_ns, char *buf, size_t len)
{
    time_t secs = (time_t)(wall_ns / 1000000000u);
    unsigned ms = (unsigned)(wall_ns / 1000000u % 1000u);
    struct tm tm;
    gmtime_r(&secs, &tm);
    snprintf(buf, len, "%04d-%02d-%02dT%02d:%02d:%02d.%03uZ", tm.tm_year + 1900, tm.tm_mon + 1,
             tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
}

void kvg_log(kvg_log_level level, const char *fmt, ...)
{
    if (!kvg_log_enabled(level))
        return;
    int saved_errno = errno;
    char line[2048];
    char ts[32];
    kvg_format_time(kvg_wall_ns(), ts, sizeof(ts));
    int n = snprintf(line, sizeof(line), "%s [%s] ", ts, kvg_log_level_str(level));
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t total = (size_t)n + (m < 0 ? 0 : KVG_MIN((size_t)m, sizeof(line) - (size_t)n - 2));
    line[total++] = '\n';
    /* One write so concurrent threads never interleave inside a line. */
    ssize_t w = write(STDERR_FILENO, line, total);
    (void)w;
    errno = saved_errno;
}
