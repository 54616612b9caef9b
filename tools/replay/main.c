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
#define MAX_POLICIES 32
/* Sweeps (--sweep, --svg): the default capacity fractions and worker counts, and the most of
 * each a list may name. */
#define DEFAULT_FRACTIONS "0.01,0.02,0.05,0.1,0.2,0.5"
#define DEFAULT_WORKER_COUNTS "4,8,16,32"
#define MAX_SWEEP_VALUES 64

static const char usage[] =
    "Usage: kvgate-replay --trace FILE [OPTIONS]\n"
    "Replay a trace offline on simulated engines in virtual time, routed by kvgate's\n"
    "own router under each policy, and report cache hit rates, time to first token and load\n"
    "beside the ceiling (infinite cache), one pooled LRU and the offline optimum (Belady's\n"
    "MIN) on the same pooled capacity (see docs/replay.md).\n"
    "\n"
    "  --trace FILE               JSON lines (required): Mooncake's (timestamp (ms),\n"
    "                             input_length, output_length, hash_ids of 512-token blocks)\n"
    "                             or kvgate's (timestamp, tenant, model, prompt or messages,\n"
    "                             output_length; see docs/replay.md)\n"
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
    "  --settings JSON            policy settings over the defaults of kvgate's policies, as\n"
    "                             PUT /admin/v1/policy takes them (e.g. '{\"load_factor\":2}')\n"
    "  --record decision|first-token  when kvgate's index learns a request's blocks: when it is\n"
    "                             routed (as the gateway does for streams, default) or at its\n"
    "                             first token\n"
    "  --on-error skip|stop       a bad trace line: warn and skip it, or stop (default stop)\n"
    "  --format text|json|csv     report format on stdout (default text)\n"
    "  --trace-format auto|mooncake|kvgate\n"
    "                             the trace's format (default auto: a first line with\n"
    "                             hash_ids is Mooncake, else kvgate: docs/replay.md)\n"
    "  --shared-scope             kvgate format: every tenant in the global scope (default:\n"
    "                             each line's tenant, sharing and group, as tenancy/ says)\n"
    "  --sweep                    every policy and reference at each worker count x capacity\n"
    "                             fraction below (progress on stderr when it is a terminal)\n"
    "  --fractions a,b,...        the sweep's capacity fractions (default " DEFAULT_FRACTIONS ")\n"
    "  --worker-counts a,b,...    the sweep's worker counts (default " DEFAULT_WORKER_COUNTS ";\n"
    "                             with --svg and no --sweep: --workers)\n"
    "  --svg FILE                 a chart of block hit rate against capacity fraction per\n"
    "                             row, one panel per worker count (implies the sweep)\n"
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

static int parse_policies(const char *list, replay_policy *policies, size_t cap, size_t *n)
{
    char buf[512];
    if (strlen(list) >= sizeof(buf))
        return -1;
    strcpy(buf, list);
    *n = 0;
    for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        bool repeated = false;
        for (size_t i = 0; i < *n; i++)
            repeated |= strcmp(policies[i].name, tok) == 0;
        if (*n == cap || repeated || replay_policy_parse(tok, &policies[*n]) < 0) {
            fprintf(stderr, "kvgate-replay: --policies: unknown or repeated policy \"%s\"\n", tok);
            return -1;
        }
        (*n)++;
    }
    return *n ? 0 : -1;
}

/* --settings: a policy settings object (PUT /admin/v1/policy's fields, docs/admin-api.md) over
 * the defaults of every kvgate policy replayed; its "policy" field, if any, is ignored. */
static int apply_settings(const char *text, replay_policy *policies, size_t n)
{
    kvg_arena arena;
    kvg_arena_init(&arena, 0);
    kvg_json *obj = NULL;
    kvg_json_error err = {0};
    int rc = kvg_json_parse(text, strlen(text), &arena, NULL, &obj, &err);
    if (rc < 0 || obj->type != KVG_JSON_OBJECT) {
        fprintf(stderr, "kvgate-replay: --settings: not a JSON object%s%s\n", rc < 0 ? ": " : "",
                rc < 0 ? err.message : "");
        kvg_arena_done(&arena);
        return -1;
    }
    for (size_t i = 0; rc == 0 && i < n; i++) {
        if (policies[i].peer != REPLAY_PEER_NONE)
            continue;
        kvg_policy_kind kind = policies[i].cfg.kind;
        char msg[256];
        if (kvg_policy_config_apply_json(&policies[i].cfg, obj, msg, sizeof(msg)) < 0) {
            fprintf(stderr, "kvgate-replay: --settings: %s\n", msg);
            rc = -1;
        }
        policies[i].cfg.kind = kind;
    }
    kvg_arena_done(&arena);
    return rc;
}

/* ---- the sweep's lists (--fractions, --worker-counts) ---- */

/* A comma-separated list of numbers in [min, max] (integers when integral), none repeated. */
static int parse_list(const char *list, double min, double max, bool integral, double *out,
                      size_t *n)
{
    char buf[1024];
    if (strlen(list) >= sizeof(buf))
        return -1;
    strcpy(buf, list);
    *n = 0;
    for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        double v;
        if (*n == MAX_SWEEP_VALUES || parse_double(tok, min, max, &v) < 0 ||
            (integral && v != floor(v)))
            return -1;
        for (size_t i = 0; i < *n; i++)
            if (out[i] == v)
                return -1;
        out[(*n)++] = v;
    }
    return *n ? 0 : -1;
}

typedef struct sweep_opts {
    bool sweep;
    const char *svg;
    double fractions[MAX_SWEEP_VALUES];
    size_t nfractions;
    double workers[MAX_SWEEP_VALUES];
    size_t nworkers; /* 0: the default, or --workers with --svg alone */
} sweep_opts;

/* The sweep (and the chart), reported on stdout in the format; 0 or 1 (the exit status). */
static int run_sweep(const char *trace, const replay_trace *t, const replay_engine_config *ec,
                     const replay_policy *policies, size_t npolicies, const sweep_opts *so,
                     char format)
{
    unsigned workers[MAX_SWEEP_VALUES];
    size_t nworkers = so->nworkers;
    for (size_t i = 0; i < nworkers; i++)
        workers[i] = (unsigned)so->workers[i];
    if (!nworkers && !so->sweep)
        workers[nworkers++] = ec->workers;
    replay_progress progress;
    replay_progress_init(&progress);
    replay_sweep s;
    int rc = replay_sweep_run(t, ec, so->fractions, so->nfractions, workers, nworkers, policies,
                              npolicies, replay_progress_update, &progress, &s);
    replay_progress_end(&progress);
    if (rc < 0) {
        fprintf(stderr, "kvgate-replay: %s\n", kvg_strerror(rc));
        return 1;
    }
    s.trace = trace;
    if (format == 'j')
        replay_sweep_json(&s, stdout);
    else if (format == 'c')
        replay_sweep_csv(&s, stdout);
    else
        replay_sweep_text(&s, stdout);
    if (so->svg) {
        FILE *f = fopen(so->svg, "w");
        rc = f ? replay_svg_write(&s, f) : -errno;
        if (f && fclose(f) != 0 && rc == 0)
            rc = -EIO;
        if (rc < 0)
            fprintf(stderr, "kvgate-replay: %s: %s\n", so->svg, kvg_strerror(rc));
    }
    replay_sweep_done(&s);
    return rc < 0 ? 1 : 0;
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
        O_SETTINGS,
        O_RECORD,
        /* formats, sweeps, charts */
        O_TFMT,
        O_SHARED,
        O_SWEEP,
        O_FRACS,
        O_WCOUNTS,
        O_SVG,
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
        {"settings", required_argument, NULL, O_SETTINGS},
        {"record", required_argument, NULL, O_RECORD},
        /* formats, sweeps, charts */
        {"trace-format", required_argument, NULL, O_TFMT},
        {"shared-scope", no_argument, NULL, O_SHARED},
        {"sweep", no_argument, NULL, O_SWEEP},
        {"fractions", required_argument, NULL, O_FRACS},
        {"worker-counts", required_argument, NULL, O_WCOUNTS},
        {"svg", required_argument, NULL, O_SVG},
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
        .record_at_decision = true,
    };
    uint32_t capacity = 0;
    double fraction = DEFAULT_FRACTION, scale = 1.0;
    replay_policy policies[MAX_POLICIES];
    size_t npolicies = replay_policy_all(policies, MAX_POLICIES);
    bool skip = false;
    const char *settings = NULL;
    char format = 't'; /* text, json, csv */
    replay_format trace_format = REPLAY_FORMAT_AUTO;
    bool shared_scope = false;
    sweep_opts so = {0};
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
            bad = parse_u32(optarg, 1, REPLAY_MAX_WORKERS, &u);
            ec.workers = u;
            break;
        case O_CAP:
            bad = parse_u32(optarg, 1, UINT32_MAX / 2, &capacity);
            break;
        case O_FRAC:
            bad = parse_double(optarg, 1e-9, 1e6, &fraction);
            break;
        case O_POL:
            bad = parse_policies(optarg, policies, MAX_POLICIES, &npolicies);
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
            bad = strcmp(optarg, "text") && strcmp(optarg, "json") && strcmp(optarg, "csv");
            format = optarg[0];
            break;
        /* formats, sweeps, charts */
        case O_TFMT:
            bad = -1;
            for (int i = 0; i < REPLAY_FORMAT_COUNT; i++)
                if (strcmp(optarg, replay_format_str((replay_format)i)) == 0) {
                    trace_format = (replay_format)i;
                    bad = 0;
                }
            break;
        case O_SHARED:
            shared_scope = true;
            break;
        case O_SWEEP:
            so.sweep = true;
            break;
        case O_FRACS:
            bad = parse_list(optarg, 1e-9, 1e6, false, so.fractions, &so.nfractions);
            break;
        case O_WCOUNTS:
            bad = parse_list(optarg, 1, REPLAY_MAX_WORKERS, true, so.workers, &so.nworkers);
            break;
        case O_SVG:
            so.svg = optarg;
            break;
        case O_RECORD:
            bad = strcmp(optarg, "decision") && strcmp(optarg, "first-token");
            ec.record_at_decision = strcmp(optarg, "decision") == 0;
            break;
        case O_SETTINGS:
            settings = optarg;
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
    if (!so.nfractions)
        parse_list(DEFAULT_FRACTIONS, 0, 1, false, so.fractions, &so.nfractions);
    if (!so.nworkers && so.sweep)
        parse_list(DEFAULT_WORKER_COUNTS, 1, REPLAY_MAX_WORKERS, true, so.workers, &so.nworkers);

    if (settings && apply_settings(settings, policies, npolicies) < 0)
        return 2;

    replay_trace t;
    replay_read_options ro = {
        .time_scale = scale, .skip = skip, .format = trace_format, .shared_scope = shared_scope};
    if (replay_trace_read(trace, &ro, &t) < 0) {
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
    if (so.sweep || so.svg) {
        int st = run_sweep(trace, &t, &ec, policies, npolicies, &so, format);
        replay_trace_done(&t);
        replay_live_options_done(&live);
        return st;
    }
    replay_live_errors live_errs = {0};
    size_t nrows = npolicies + REPLAY_REFERENCE_ROWS + (live.cfg.url ? 1 : 0);
    replay_row *rows = calloc(nrows, sizeof(*rows));
    uint64_t distinct = 0;
    ec.capacity = capacity;
    int rc = rows ? replay_run(&t, &ec, fraction, policies, npolicies, rows, &distinct) : -ENOMEM;
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
        if (format == 'j')
            replay_report_json(&rep, stdout);
        else if (format == 'c')
            replay_report_csv(&rep, stdout);
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
