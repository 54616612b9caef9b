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
#define MAX_POLICIES 32

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
    "  --settings JSON            policy settings over the defaults of kvgate's policies, as\n"
    "                             PUT /admin/v1/policy takes them (e.g. '{\"load_factor\":2}')\n"
    "  --record decision|first-token  when kvgate's index learns a request's blocks: when it is\n"
    "                             routed (as the gateway does for streams, default) or at its\n"
    "                             first token\n"
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
        {"help", no_argument, NULL, O_HELP},
        {"version", no_argument, NULL, O_VER},
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
    bool skip = false, json = false;
    const char *settings = NULL;
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
            bad = strcmp(optarg, "text") && strcmp(optarg, "json");
            json = strcmp(optarg, "json") == 0;
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
            return 0;
        case O_VER:
            printf("kvgate-replay %s\n", KVG_VERSION);
            return 0;
        default:
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
        return 2;
    }

    if (settings && apply_settings(settings, policies, npolicies) < 0)
        return 2;

    replay_trace t;
    if (replay_trace_read(trace, scale, skip, &t) < 0)
        return 1;
    size_t nrows = npolicies + REPLAY_REFERENCE_ROWS;
    replay_row *rows = calloc(nrows, sizeof(*rows));
    uint64_t distinct = 0;
    ec.capacity = capacity;
    int rc = rows ? replay_run(&t, &ec, fraction, policies, npolicies, rows, &distinct) : -ENOMEM;
    if (rc == 0) {
        replay_report rep = {.trace = trace,
                             .t = &t,
                             .ec = &ec,
                             .distinct_blocks = distinct,
                             .rows = rows,
                             .nrows = nrows};
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
    return rc == 0 ? 0 : 1;
}
