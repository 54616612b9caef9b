/* SPDX-License-Identifier: Apache-2.0 */
/* kvgate_build_info and the standard process_* series, read from /proc/self on each scrape. */
#include "process_metrics.h"

#include <dirent.h>
#include <event2/event.h>
#include <nghttp2/nghttp2.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "kvg_build_info.h"
#include "kvg_config.h"
#include "prom.h"

#if defined(__clang__)
#define COMPILER "clang " __clang_version__
#elif defined(__GNUC__)
#define COMPILER "gcc " __VERSION__
#else
#define COMPILER "unknown"
#endif

static void put_build_info(kvg_buf *out)
{
    const nghttp2_info *h2 = nghttp2_version(0);
    kvg_prom_put_header(out, "kvgate_build_info", KVG_PROM_GAUGE,
                        "1, labelled with the version, the commit and the compiler kvgate was "
                        "built from and the libraries it runs with.");
    kvg_prom_put_u64(out, "kvgate_build_info",
                     KVG_PROM_LABELS({"version", KVG_VERSION}, {"commit", KVG_BUILD_COMMIT},
                                     {"compiler", COMPILER}, {"libevent", event_get_version()},
                                     {"nghttp2", h2 ? h2->version_str : "unknown"},
                                     {"openssl", OpenSSL_version(OPENSSL_VERSION)}),
                     1);
}

/* Fields 14 (utime), 15 (stime), 22 (starttime), 23 (vsize), 24 (rss) of /proc/self/stat, as
 * proc(5) numbers them. The command name (field 2) may hold spaces and parentheses: fields
 * are counted from its last ')'. */
typedef struct proc_stat {
    unsigned long long utime, stime, starttime, vsize, rss;
} proc_stat;

static bool read_proc_stat(proc_stat *ps)
{
    char buf[1024];
    FILE *f = fopen("/proc/self/stat", "re");
    if (!f)
        return false;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    if (!p)
        return false;
    /* After ')': field 3 (state) onwards. */
    unsigned long long v[25] = {0};
    char *end;
    p++;
    for (int field = 3; field <= 24; field++) {
        while (*p == ' ')
            p++;
        if (field == 3) { /* state: one character */
            if (!*p)
                return false;
            p++;
            continue;
        }
        v[field] = strtoull(p, &end, 10);
        if (end == p)
            return false;
        p = end;
    }
    ps->utime = v[14];
    ps->stime = v[15];
    ps->starttime = v[22];
    ps->vsize = v[23];
    ps->rss = v[24];
    return true;
}

/* The boot time (seconds since the epoch), from /proc/stat's btime line; 0 when unknown. */
static unsigned long long boot_time(void)
{
    char line[256];
    unsigned long long btime = 0;
    FILE *f = fopen("/proc/stat", "re");
    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "btime %llu", &btime) == 1)
            break;
    fclose(f);
    return btime;
}

static long open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    long n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n - 1; /* not the directory's own descriptor */
}

void kvg_process_stats_write(kvg_buf *out, void *arg)
{
    (void)arg;
    put_build_info(out);
    long ticks = sysconf(_SC_CLK_TCK);
    long page = sysconf(_SC_PAGESIZE);
    proc_stat ps;
    if (ticks > 0 && page > 0 && read_proc_stat(&ps)) {
        kvg_prom_put_header(out, "process_cpu_seconds_total", KVG_PROM_COUNTER,
                            "Total user and system CPU time spent in seconds.");
        kvg_buf_printf(out, "process_cpu_seconds_total %.2f\n",
                       (double)(ps.utime + ps.stime) / (double)ticks);
        kvg_prom_put_scalar_u64(out, "process_resident_memory_bytes", KVG_PROM_GAUGE,
                                "Resident memory size in bytes.", ps.rss * (uint64_t)page);
        kvg_prom_put_scalar_u64(out, "process_virtual_memory_bytes", KVG_PROM_GAUGE,
                                "Virtual memory size in bytes.", ps.vsize);
        unsigned long long btime = boot_time();
        if (btime) {
            kvg_prom_put_header(out, "process_start_time_seconds", KVG_PROM_GAUGE,
                                "Start time of the process since unix epoch in seconds.");
            kvg_buf_printf(out, "process_start_time_seconds %.2f\n",
                           (double)btime + (double)ps.starttime / (double)ticks);
        }
    }
    long fds = open_fds();
    if (fds >= 0)
        kvg_prom_put_scalar_i64(out, "process_open_fds", KVG_PROM_GAUGE,
                                "Number of open file descriptors.", fds);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
        kvg_prom_put_scalar_u64(out, "process_max_fds", KVG_PROM_GAUGE,
                                "Maximum number of open file descriptors.",
                                rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur);
}
