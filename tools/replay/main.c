/* SPDX-License-Identifier: Apache-2.0 */
/* kvgate-replay: command line; replays a trace for each policy and prints the report. */
#include "replay.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kvg_config.h"

#define DEFAULT_WORKERS 8
#define DEFAULT_FRACTION 0.10
#define DEFAULT_MAX_RUNNING 32
#define DEFAULT_PREFILL_US 100.0
#define DEFAULT_DECODE_US 20000.0
#define MAX_WORKERS 1024

static const char usage[] =
    "Usage: kvgate-replay --trace FILE [OPTIONS]\n"
    "Replay a Mooncake trace offline on simulated engines in virtual time, routed by kvgate's\n"
    "own router under each policy, and report cache hit rates, time to first token and load\n"
    "beside the ceiling (infinite cache), one pooled LRU and the offline optimum (Belady's\n"
    "MIN) on the same pooled capacity (see docs/replay.md).\n"
    "\n"
    "  --trace FILE               JSON lines: timestamp (ms), input_length, output_length,\n"
    "                             hash_ids (512-token blocks) (required)\n"
    "  --workers N                simulated workers (default 8)\n"
    "  --capacity BLOCKS          KV blocks per worker\n"
    "  --capacity-fraction F      or: per worker F x the trace's distinct blocks / workers,\n"
    "                             at least 1 (default 0.10)\n"
    "  --policies a,b,...         kvgate policies (default cost,prefix_only,least_loaded,\n"
    "                             round_robin,random)\n"
    "  --max-running N            sequences running at once per worker (default 32)\n"
    "  --prefill-us US            prefill time per uncached prompt token; one prefill at a\n"
    "                             time per worker (default 100)\n"
    "  --decode-us US             time per output token after the first (default 20000)\n"
    "  --time-scale S             multiply the trace's timestamps by S (default 1; 0.5 = twice\n"
    "                             the request rate)\n"
    "  --on-error skip|stop       a bad trace line: warn and skip it, or stop (default stop)\n"
    "  --format text|json         report format on stdout (default text)\n"
    "  --help, --version\n";

static int parse_double(const char *s, double min, double max, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

static int parse_u32(const char *s, uint32_t min, uint32_t max, uint32_t *out)
{
    double v;
    if (parse_double(s, min, max, &v) < 0 || v != floor(v))
        return -1;
    *out = (uint32_t)v;
    return 0;
}

static int parse_policies(const char *list, kvg_policy_kind *kinds, size_t *n)
{
    char buf[256];
    if (strlen(list) >= sizeof(buf))
        return -1;
    strcpy(buf, list);
    *n = 0;
    for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (*n == KVG_POLICY_KIND_COUNT || kvg_policy_kind_parse(tok, &kinds[*n]) < 0) {
            fprintf(stderr, "kvgate-replay: --policies: unknown or repeated policy \"%s\"\n", tok);
            return -1;
        }
        (*n)++;
    }
    return *n ? 0 : -1;
}

int main(int argc, char **argv)
{
    enum {
        O_TRACE = 256,
        O_WORKERS,
        O_CAP,
        O_FRAC,
        O_POL,
        O_RUN,
        O_PRE,
        O_DEC,
        O_SCALE,
        O_ERR,
        O_FMT,
        O_HELP,
        O_VER
    };
    static const struct option opts[] = {
        {"trace", required_argument, NULL, O_TRACE},
        {"workers", required_argument, NULL, O_WORKERS},
        {"capacity", required_argument, NULL, O_CAP},
        {"capacity-fraction", required_argument, NULL, O_FRAC},
        {"policies", required_argument, NULL, O_POL},
        {"max-running", required_argument, NULL, O_RUN},
        {"prefill-us", required_argument, NULL, O_PRE},
        {"decode-us", required_argument, NULL, O_DEC},
        {"time-scale", required_argument, NULL, O_SCALE},
        {"on-error", required_argument, NULL, O_ERR},
        {"format", required_argument, NULL, O_FMT},
        {"help", no_argument, NULL, O_HELP},
        {"version", no_argument, NULL, O_VER},
        REPLAY_LIVE_OPTIONS,
        {NULL, 0, NULL, 0},
    };
    const char *trace = NULL;
    replay_engine_config ec = {
        .workers = DEFAULT_WORKERS,
        .max_running = DEFAULT_MAX_RUNNING,
        .prefill_us = DEFAULT_PREFILL_US,
        .decode_us = DEFAULT_DECODE_US,
    };
    uint32_t capacity = 0;
    double fraction = DEFAULT_FRACTION, scale = 1.0;
    kvg_policy_kind kinds[KVG_POLICY_KIND_COUNT] = {KVG_POLICY_COST, KVG_POLICY_PREFIX_ONLY,
                                                    KVG_POLICY_LEAST_LOADED, KVG_POLICY_ROUND_ROBIN,
                                                    KVG_POLICY_RANDOM};
    size_t nkinds = KVG_POLICY_KIND_COUNT;
    bool skip = false, json = false;
    replay_live_options live; /* live mode and the slice: live_cli.c */
    replay_live_options_init(&live);
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int bad = 0;
        uint32_t u;
        switch (c) {
        case O_TRACE:
            trace = optarg;
            break;
        case O_WORKERS:
            bad = parse_u32(optarg, 1, MAX_WORKERS, &u);
            ec.workers = u;
            break;
        case O_CAP:
            bad = parse_u32(optarg, 1, UINT32_MAX / 2, &capacity);
            break;
        case O_FRAC:
            bad = parse_double(optarg, 1e-9, 1e6, &fraction);
            break;
        case O_POL:
            bad = parse_policies(optarg, kinds, &nkinds);
            break;
        case O_RUN:
            bad = parse_u32(optarg, 1, 1u << 20, &ec.max_running);
            break;
        case O_PRE:
            bad = parse_double(optarg, 0, 1e9, &ec.prefill_us);
            break;
        case O_DEC:
            bad = parse_double(optarg, 0, 1e9, &ec.decode_us);
            break;
        case O_SCALE:
            bad = parse_double(optarg, 0, 1e6, &scale);
            break;
        case O_ERR:
            bad = strcmp(optarg, "skip") && strcmp(optarg, "stop");
            skip = strcmp(optarg, "skip") == 0;
            break;
        case O_FMT:
            bad = strcmp(optarg, "text") && strcmp(optarg, "json");
            json = strcmp(optarg, "json") == 0;
            break;
        case O_HELP:
            fputs(usage, stdout);
            fputs(replay_live_usage, stdout);
            return 0;
        case O_VER:
            printf("kvgate-replay %s\n", KVG_VERSION);
            return 0;
        default:
            if (c >= REPLAY_LIVE_OPT_BASE) {
                if (replay_live_option(&live, c, optarg) < 0) {
                    replay_live_options_done(&live);
                    return 2;
                }
                break;
            }
            fputs(usage, stderr);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "kvgate-replay: bad value for --%s: \"%s\"\n", opts[c - O_TRACE].name,
                    optarg);
            return 2;
        }
    }
    if (!trace || optind < argc) {
        fputs(usage, stderr);
        replay_live_options_done(&live);
        return 2;
    }

    replay_trace t;
    if (replay_trace_read(trace, scale, skip, &t) < 0) {
        replay_live_options_done(&live);
        return 1;
    }
    if (replay_trace_slice(&t, live.first, live.count) < 0) {
        fprintf(stderr, "kvgate-replay: --first %zu: the trace has %zu requests\n", live.first,
                t.n);
        replay_trace_done(&t);
        replay_live_options_done(&live);
        return 1;
    }
    replay_live_errors live_errs = {0};
    size_t nrows = nkinds + 3 + (live.cfg.url ? 1 : 0);
    replay_row *rows = calloc(nrows, sizeof(*rows));
    uint64_t distinct = 0;
    int rc = rows ? replay_ceiling(&t, &rows[nkinds], &distinct) : -ENOMEM;
    if (rc == 0) {
        if (!capacity) {
            double per = floor(fraction * (double)distinct / ec.workers);
            capacity = per < 1 ? 1 : per > UINT32_MAX / 2 ? UINT32_MAX / 2 : (uint32_t)per;
        }
        ec.capacity = capacity;
        rc = replay_pooled_lru(&t, (uint64_t)capacity * ec.workers, &rows[nkinds + 1]);
    }
    if (rc == 0)
        rc = replay_min(&t, (uint64_t)capacity * ec.workers, &rows[nkinds + 2]);
    for (size_t i = 0; rc == 0 && i < nkinds; i++) {
        kvg_policy_config pc;
        kvg_policy_config_init(&pc);
        pc.kind = kinds[i];
        rc = replay_simulate(&t, &ec, &pc, &rows[i]);
    }
    if (rc == 0 && live.cfg.url) /* the live row last, after the offline ones it is compared to */
        rc = replay_live_run(&t, &live.cfg, &rows[nrows - 1], &live_errs);
    if (rc == 0) {
        replay_report rep = {.trace = trace,
                             .t = &t,
                             .ec = &ec,
                             .distinct_blocks = distinct,
                             .rows = rows,
                             .nrows = nrows,
                             .live = live.cfg.url ? &live_errs : NULL};
        if (json)
            replay_report_json(&rep, stdout);
        else
            replay_report_text(&rep, stdout);
    } else {
        fprintf(stderr, "kvgate-replay: %s\n", kvg_strerror(rc));
    }
    for (size_t i = 0; rows && i < nrows; i++)
        replay_row_done(&rows[i]);
    free(rows);
    replay_trace_done(&t);
    replay_live_options_done(&live);
    bool failed = live_errs.status || live_errs.timeout || live_errs.connection ||
                  live_errs.protocol || live_errs.tokens || live_errs.unsent || live_errs.first[0];
    if (rc == 0 && failed)
        fprintf(stderr, "kvgate-replay: live: some requests failed (%s)\n", live_errs.first);
    return rc == 0 && !failed ? 0 : 1;
}
