/* SPDX-License-Identifier: Apache-2.0 */
/* kvgate-loadgen: command line, run and summary of the chat-completions load generator. */
#include "loadgen.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "kvg_config.h"

#define DEFAULT_REQUESTS 100
#define DEFAULT_CONCURRENCY 8
#define DEFAULT_MAX_TOKENS 16
#define DEFAULT_TIMEOUT_MS 30000
#define DEFAULT_MAX_RESPONSE (4u << 20)
#define MAX_CONCURRENCY 4096
#define NAME_MAX_LEN 256
#define MAX_API_KEYS 4096
#define MAX_KEY_FILE_BYTES (1u << 20)

static const char usage_head[] =
    "Usage: kvgate-loadgen --url http://HOST:PORT [--url ...] [OPTIONS]\n"
    "Send OpenAI chat-completions requests from a deterministic workload over a pool of\n"
    "keep-alive HTTP/1.1 connections and summarise status, latency, per-worker counts and the\n"
    "cached tokens the workers report (see docs/loadgen.md).\n"
    "\n"
    "  --url URL                 gateway base URL, e.g. http://127.0.0.1:8080 (required);\n"
    "                            requests go to its path + /v1/chat/completions; give it\n"
    "                            up to 64 times to spread the connections round robin over\n"
    "                            the URLs (each connection keeps its URL, like an L4 balancer)\n"
    "  --requests N              requests to send (default 100 unless --duration is given)\n"
    "  --duration S              send for S seconds (with --requests: whichever ends first)\n"
    "  --concurrency N           connections, one request in flight on each (default 8)\n"
    "  --model NAME              model field of every request (default sim-model)\n"
    "  --api-key KEY             send Authorization: Bearer KEY\n"
    "  --api-keys FILE           one API key per line; tenant t of the workload sends the key\n"
    "                            on line t mod (number of keys); blank and # lines skipped\n"
    "  --api-key-list K1,K2,...  the same keys given inline\n"
    "  --tenants N               tenants of the multi-tenant workload (default 8)\n"
    "  --max-tokens N            max_tokens of every request (default 16)\n"
    "  --stream                  stream: true with stream_options.include_usage; measures\n"
    "                            time to first token\n"
    "  --workload NAME           request generator (default shared-prefix), see below\n"
    "  --seed N                  workload seed (default 1): same seed, same requests\n"
    "  --format text|json        summary format on stdout (default text)\n"
    "  --timeout-ms N            limit on each whole request (default 30000)\n"
    "  --max-response-bytes N    larger responses fail (default 4194304)\n"
    "  --log-level LEVEL         error, warn (default), info or debug\n"
    "  --help                    print this help\n"
    "  --version                 print the version\n"
    "\n"
    "Workloads:\n";

static const char usage_tail[] =
    "\n"
    "Exit status: 0 when every request succeeded (2xx and a complete body), 1 when any failed\n"
    "or the run was interrupted, 2 for a usage error.\n";

enum {
    OPT_URL = 256,
    OPT_REQUESTS,
    OPT_DURATION,
    OPT_CONCURRENCY,
    OPT_MODEL,
    OPT_API_KEY,
    OPT_API_KEYS,
    OPT_API_KEY_LIST,
    OPT_TENANTS,
    OPT_MAX_TOKENS,
    OPT_STREAM,
    OPT_WORKLOAD,
    OPT_SEED,
    OPT_FORMAT,
    OPT_TIMEOUT,
    OPT_MAX_RESPONSE,
    OPT_LOG_LEVEL,
    OPT_HELP,
    OPT_VERSION,
};

static const struct option long_opts[] = {
    {"url", required_argument, NULL, OPT_URL},
    {"requests", required_argument, NULL, OPT_REQUESTS},
    {"duration", required_argument, NULL, OPT_DURATION},
    {"concurrency", required_argument, NULL, OPT_CONCURRENCY},
    {"model", required_argument, NULL, OPT_MODEL},
    {"api-key", required_argument, NULL, OPT_API_KEY},
    {"api-keys", required_argument, NULL, OPT_API_KEYS},
    {"api-key-list", required_argument, NULL, OPT_API_KEY_LIST},
    {"tenants", required_argument, NULL, OPT_TENANTS},
    {"max-tokens", required_argument, NULL, OPT_MAX_TOKENS},
    {"stream", no_argument, NULL, OPT_STREAM},
    {"workload", required_argument, NULL, OPT_WORKLOAD},
    {"seed", required_argument, NULL, OPT_SEED},
    {"format", required_argument, NULL, OPT_FORMAT},
    {"timeout-ms", required_argument, NULL, OPT_TIMEOUT},
    {"max-response-bytes", required_argument, NULL, OPT_MAX_RESPONSE},
    {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
    {"help", no_argument, NULL, OPT_HELP},
    {"version", no_argument, NULL, OPT_VERSION},
    {NULL, 0, NULL, 0},
};

typedef struct cli {
    lg_config cfg;
    const char *workload;
    uint64_t seed;
    bool json;
    bool requests_given;
    uint32_t tenants;
    const char *urls[LG_MAX_URLS]; /* borrowed from argv */
    size_t n_urls;
    char **keys; /* owned copies */
    size_t n_keys;
    int key_sources; /* how many of --api-key, --api-keys, --api-key-list were given */
} cli;

static void print_usage(FILE *f)
{
    fputs(usage_head, f);
    for (size_t i = 0; i < lg_workload_count(); i++)
        fprintf(f, "  %-24s  %s\n", lg_workload_list_name(i), lg_workload_list_help(i));
    fputs(usage_tail, f);
}

static int bad_flag(const char *flag, const char *value, const char *why)
{
    fprintf(stderr, "kvgate-loadgen: --%s %s: %s\n", flag, value, why);
    return KVG_ECONFIG;
}

static int parse_u64(const char *flag, const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
    uint64_t v;
    if (kvg_parse_u64(s, strlen(s), &v) < 0)
        return bad_flag(flag, s, "not a non-negative integer");
    if (v < min || v > max) {
        char why[96];
        snprintf(why, sizeof(why), "must be between %llu and %llu", (unsigned long long)min,
                 (unsigned long long)max);
        return bad_flag(flag, s, why);
    }
    *out = v;
    return 0;
}

static int parse_u32(const char *flag, const char *s, uint32_t min, uint32_t max, uint32_t *out)
{
    uint64_t v;
    int rc = parse_u64(flag, s, min, max, &v);
    if (rc == 0)
        *out = (uint32_t)v;
    return rc;
}

static int check_text(const char *flag, const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > NAME_MAX_LEN)
        return bad_flag(flag, s, "must be 1 to 256 characters");
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x21 || (unsigned char)s[i] > 0x7e)
            return bad_flag(flag, s, "must be printable ASCII without spaces");
    return 0;
}

static int add_key(cli *c, const char *flag, const char *key, size_t len)
{
    char shown[NAME_MAX_LEN + 2];
    snprintf(shown, sizeof(shown), "%.*s", (int)KVG_MIN(len, (size_t)NAME_MAX_LEN + 1), key);
    if (len > NAME_MAX_LEN)
        return bad_flag(flag, shown, "a key must be 1 to 256 characters");
    int rc = check_text(flag, shown);
    if (rc < 0)
        return rc;
    if (c->n_keys >= MAX_API_KEYS)
        return bad_flag(flag, "...", "more than 4096 keys");
    char **keys = realloc(c->keys, (c->n_keys + 1) * sizeof(*keys));
    if (!keys)
        return -ENOMEM;
    c->keys = keys;
    keys[c->n_keys] = strndup(key, len);
    if (!keys[c->n_keys])
        return -ENOMEM;
    c->n_keys++;
    return 0;
}

/* K1,K2,...: every element must be a usable key (no empty ones). */
static int parse_key_list(cli *c, const char *flag, const char *list)
{
    const char *p = list;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == 0)
            return bad_flag(flag, list, "empty key in the list");
        int rc = add_key(c, flag, p, len);
        if (rc < 0)
            return rc;
        if (!comma)
            return 0;
        p = comma + 1;
    }
}

/* One key per line; surrounding blanks, empty lines and lines starting with # are skipped. */
static int read_key_file(cli *c, const char *flag, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return bad_flag(flag, path, strerror(errno));
    kvg_buf b;
    kvg_buf_init(&b);
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0 && b.len <= MAX_KEY_FILE_BYTES)
        kvg_buf_append(&b, chunk, n);
    bool read_error = ferror(f);
    fclose(f);
    int rc = 0;
    if (read_error)
        rc = bad_flag(flag, path, "read error");
    else if (b.failed)
        rc = -ENOMEM;
    else if (b.len > MAX_KEY_FILE_BYTES)
        rc = bad_flag(flag, path, "larger than 1 MiB");
    size_t before = c->n_keys;
    for (size_t i = 0; rc == 0 && i < b.len;) {
        size_t end = i;
        while (end < b.len && b.data[end] != '\n')
            end++;
        size_t s = i, e = end;
        while (s < e && (b.data[s] == ' ' || b.data[s] == '\t' || b.data[s] == '\r'))
            s++;
        while (e > s && (b.data[e - 1] == ' ' || b.data[e - 1] == '\t' || b.data[e - 1] == '\r'))
            e--;
        if (e > s && b.data[s] != '#')
            rc = add_key(c, flag, b.data + s, e - s);
        i = end + 1;
    }
    kvg_buf_done(&b);
    if (rc == 0 && c->n_keys == before)
        rc = bad_flag(flag, path, "no key in the file");
    return rc;
}

/* Returns 0 to run, 1 when --help/--version was handled, or an error. */
static int parse_args(int argc, char **argv, cli *c)
{
    lg_config *cfg = &c->cfg;
    int opt;
    int rc = 0;
    opterr = 0;
    while (rc == 0 && (opt = getopt_long(argc, argv, "", long_opts, NULL)) != -1) {
        const char *flag = optind > 0 && optind <= argc ? argv[optind - 1] : "?";
        const char *name =
            opt >= OPT_URL && opt <= OPT_VERSION ? long_opts[opt - OPT_URL].name : flag;
        uint64_t u64;
        switch (opt) {
        case OPT_URL:
            if (c->n_urls == LG_MAX_URLS)
                rc = bad_flag(name, optarg, "given more than 64 times");
            else
                c->urls[c->n_urls++] = optarg;
            break;
        case OPT_REQUESTS:
            rc = parse_u64(name, optarg, 1, UINT64_MAX / 2, &cfg->requests);
            c->requests_given = true;
            break;
        case OPT_DURATION: {
            char *end = NULL;
            errno = 0;
            double v = strtod(optarg, &end);
            if (!*optarg || !end || *end || errno || !isfinite(v) || v <= 0 || v > 86400 * 7)
                rc = bad_flag(name, optarg, "must be a number of seconds, above 0, at most a week");
            cfg->duration_s = v;
            break;
        }
        case OPT_CONCURRENCY:
            rc = parse_u32(name, optarg, 1, MAX_CONCURRENCY, &cfg->concurrency);
            break;
        case OPT_MODEL:
            rc = check_text(name, optarg);
            cfg->model = optarg;
            break;
        case OPT_API_KEY:
            c->key_sources++;
            rc = add_key(c, name, optarg, strlen(optarg));
            break;
        case OPT_API_KEYS:
            c->key_sources++;
            rc = read_key_file(c, name, optarg);
            break;
        case OPT_API_KEY_LIST:
            c->key_sources++;
            rc = parse_key_list(c, name, optarg);
            break;
        case OPT_TENANTS:
            rc = parse_u32(name, optarg, 1, LG_MT_MAX_TENANTS, &c->tenants);
            break;
        case OPT_MAX_TOKENS:
            rc = parse_u32(name, optarg, 1, 1u << 20, &cfg->max_tokens);
            break;
        case OPT_STREAM:
            cfg->stream = true;
            break;
        case OPT_WORKLOAD:
            c->workload = optarg;
            break;
        case OPT_SEED:
            rc = parse_u64(name, optarg, 0, UINT64_MAX, &u64);
            c->seed = u64;
            break;
        case OPT_FORMAT:
            if (strcmp(optarg, "json") == 0)
                c->json = true;
            else if (strcmp(optarg, "text") == 0)
                c->json = false;
            else
                rc = bad_flag(name, optarg, "expected text or json");
            break;
        case OPT_TIMEOUT:
            rc = parse_u32(name, optarg, 1, 3600u * 1000u, &cfg->timeout_ms);
            break;
        case OPT_MAX_RESPONSE:
            rc = parse_u64(name, optarg, 1024, 1ull << 32, &u64);
            cfg->max_response_bytes = (size_t)u64;
            break;
        case OPT_LOG_LEVEL: {
            kvg_log_level lvl;
            if (kvg_log_level_parse(optarg, &lvl) < 0)
                rc = bad_flag(name, optarg, "expected error, warn, info or debug");
            else
                kvg_log_set_level(lvl);
            break;
        }
        case OPT_HELP:
            print_usage(stdout);
            return 1;
        case OPT_VERSION:
            printf("kvgate-loadgen %s\n", KVG_VERSION);
            return 1;
        case ':':
            fprintf(stderr, "kvgate-loadgen: %s needs a value\n", flag);
            rc = KVG_ECONFIG;
            break;
        default:
            fprintf(stderr, "kvgate-loadgen: unknown option %s (see --help)\n", flag);
            rc = KVG_ECONFIG;
            break;
        }
    }
    if (rc == 0 && optind < argc) {
        fprintf(stderr, "kvgate-loadgen: unexpected argument %s (see --help)\n", argv[optind]);
        rc = KVG_ECONFIG;
    }
    if (rc == 0 && c->key_sources > 1) {
        fprintf(stderr, "kvgate-loadgen: give the API keys with one of --api-key, --api-keys "
                        "and --api-key-list\n");
        rc = KVG_ECONFIG;
    }
    if (rc == 0 && c->n_urls == 0) {
        fprintf(stderr, "kvgate-loadgen: --url is required (see --help)\n");
        rc = KVG_ECONFIG;
    }
    /* Each URL needs a connection of its own, or a replica would silently get nothing. */
    if (rc == 0 && cfg->concurrency < c->n_urls) {
        fprintf(stderr,
                "kvgate-loadgen: --concurrency %u is below the number of --url (%zu): "
                "every URL needs a connection\n",
                cfg->concurrency, c->n_urls);
        rc = KVG_ECONFIG;
    }
    if (rc < 0)
        return rc;
    if (!c->requests_given && cfg->duration_s <= 0)
        cfg->requests = DEFAULT_REQUESTS;
    cfg->urls = c->urls;
    cfg->n_urls = c->n_urls;
    cfg->api_keys = (const char *const *)c->keys;
    cfg->n_api_keys = c->n_keys;
    return 0;
}

int main(int argc, char **argv)
{
    cli c = {
        .cfg =
            {
                .concurrency = DEFAULT_CONCURRENCY,
                .model = "sim-model",
                .max_tokens = DEFAULT_MAX_TOKENS,
                .timeout_ms = DEFAULT_TIMEOUT_MS,
                .max_response_bytes = DEFAULT_MAX_RESPONSE,
            },
        .workload = "shared-prefix",
        .seed = 1,
    };
    /* Only problems matter on stderr; stdout carries the summary. */
    kvg_log_set_level(KVG_LOG_WARN);
    int status = 1;
    lg_workload *wl = NULL;
    int rc = parse_args(argc, argv, &c);
    if (rc == 1 || rc < 0) {
        status = rc == 1 ? 0 : rc == -ENOMEM ? 1 : 2;
        if (rc == -ENOMEM)
            fprintf(stderr, "kvgate-loadgen: out of memory\n");
        goto out_keys;
    }

    lg_workload_opts wopts = {.tenants = c.tenants, .max_tokens = c.cfg.max_tokens};
    rc = lg_workload_new_opts(c.workload, c.seed, &wopts, &wl);
    if (rc == KVG_ENOTFOUND) {
        fprintf(stderr, "kvgate-loadgen: --workload %s: unknown (see --help)\n", c.workload);
        status = 2;
        goto out_keys;
    }
    if (rc < 0) {
        fprintf(stderr, "kvgate-loadgen: cannot build the workload: %s\n", kvg_strerror(rc));
        goto out_keys;
    }

    /* A server that closes mid-write must be an error return, not a fatal signal. */
    struct sigaction sa = {.sa_handler = SIG_IGN};
    sigaction(SIGPIPE, &sa, NULL);

    lg_stats stats;
    lg_stats_init(&stats);
    uint64_t elapsed = 0;
    bool interrupted = false;
    rc = lg_run(&c.cfg, wl, &stats, &elapsed, &interrupted);
    if (rc == KVG_ECONFIG) {
        status = 2;
        goto out;
    }
    if (rc < 0) {
        fprintf(stderr, "kvgate-loadgen: %s\n", kvg_strerror(rc));
        goto out;
    }
    lg_stats_finish(&stats);
    lg_report_meta meta = {
        .url = c.urls[0],
        .urls = c.urls,
        .n_urls = c.n_urls,
        .model = c.cfg.model,
        .workload = lg_workload_name(wl),
        .seed = c.seed,
        .tenants = lg_workload_tenants(wl),
        .n_api_keys = c.n_keys,
        .concurrency = c.cfg.concurrency,
        .max_tokens = c.cfg.max_tokens,
        .stream = c.cfg.stream,
        .requests_planned = c.cfg.requests,
        .duration_planned_s = c.cfg.duration_s,
        .elapsed_ns = elapsed,
        .interrupted = interrupted,
    };
    kvg_buf out;
    kvg_buf_init(&out);
    if (c.json)
        lg_report_json(&out, &stats, &meta);
    else
        lg_report_text(&out, &stats, &meta);
    if (out.failed) {
        fprintf(stderr, "kvgate-loadgen: out of memory writing the summary\n");
    } else {
        fwrite(out.data, 1, out.len, stdout);
        fflush(stdout);
        bool all_ok = stats.requests > 0 && stats.by_outcome[LG_OK] == stats.requests;
        status = all_ok && !interrupted ? 0 : 1;
    }
    kvg_buf_done(&out);
out:
    lg_stats_done(&stats);
    lg_workload_free(wl);
    libevent_global_shutdown();
out_keys:
    for (size_t i = 0; i < c.n_keys; i++)
        free(c.keys[i]);
    free(c.keys);
    return status;
}
