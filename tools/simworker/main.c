/* SPDX-License-Identifier: Apache-2.0 */
/* kvgate-simworker: command line, event loop and signals of the simulated vLLM engine. */
#include "simworker.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <event2/event.h>

#include "kvg_config.h"

#define NAME_MAX_LEN 256
#define FD_TARGET 65536

static const char usage_text[] =
    "Usage: kvgate-simworker [OPTIONS]\n"
    "A simulated vLLM engine with prefix caching: OpenAI-compatible HTTP/1.1 server whose\n"
    "latencies and cache hits follow a model of the engine (see docs/simworker.md).\n"
    "\n"
    "  --listen HOST:PORT            address to serve (default 127.0.0.1:8000; port 0 = any)\n"
    "  --port-file PATH              after binding, write the port and a newline to PATH\n"
    "  --name NAME                   worker name, sent as x-simworker-name (default simworker)\n"
    "  --model NAME                  served model name; repeat for aliases (default sim-model)\n"
    "  --kv-blocks N                 KV cache capacity in blocks (default 4096)\n"
    "  --block-tokens N              tokens per block (default 16)\n"
    "  --max-model-len N             context length (default min(32768, kv-blocks*block-tokens))\n"
    "  --prefill-us-per-token F      prefill time per uncached prompt token (default 50)\n"
    "  --decode-us-per-token F       time per generated token (default 5000)\n"
    "  --max-running N               sequences running at once (default 256)\n"
    "  --max-waiting N               sequences queued before 503 (default 10000)\n"
    "  --default-max-tokens N        max_tokens when a request sets none (default 16)\n"
    "  --time-scale F                multiplies every simulated time; 0 = instant (default 1)\n"
    "  --keep-alive-timeout S        close idle connections after S seconds (default 5)\n"
    "  --max-body-bytes N            request body limit, larger gets 413 (default 67108864)\n"
    "  --error-rate F                fraction of inference requests answered 500 (default 0)\n"
    "  --close-mid-stream-rate F     fraction of streams cut after the first content chunk\n"
    "  --slow-headers-ms N           delay every response by N ms before its headers\n"
    "  --seed N                      seed of fault injection and response ids (default 0)\n"
    "  --log-level LEVEL             error, warn, info or debug (default info)\n"
    "  --help                        print this help\n"
    "  --version                     print the version\n";

enum {
    OPT_LISTEN = 256,
    OPT_PORT_FILE,
    OPT_NAME,
    OPT_MODEL,
    OPT_KV_BLOCKS,
    OPT_BLOCK_TOKENS,
    OPT_MAX_MODEL_LEN,
    OPT_PREFILL,
    OPT_DECODE,
    OPT_MAX_RUNNING,
    OPT_MAX_WAITING,
    OPT_DEFAULT_MAX_TOKENS,
    OPT_TIME_SCALE,
    OPT_KEEP_ALIVE,
    OPT_MAX_BODY,
    OPT_ERROR_RATE,
    OPT_CUT_RATE,
    OPT_SLOW_HEADERS,
    OPT_SEED,
    OPT_LOG_LEVEL,
    OPT_HELP,
    OPT_VERSION,
};

static const struct option long_opts[] = {
    {"listen", required_argument, NULL, OPT_LISTEN},
    {"port-file", required_argument, NULL, OPT_PORT_FILE},
    {"name", required_argument, NULL, OPT_NAME},
    {"model", required_argument, NULL, OPT_MODEL},
    {"kv-blocks", required_argument, NULL, OPT_KV_BLOCKS},
    {"block-tokens", required_argument, NULL, OPT_BLOCK_TOKENS},
    {"max-model-len", required_argument, NULL, OPT_MAX_MODEL_LEN},
    {"prefill-us-per-token", required_argument, NULL, OPT_PREFILL},
    {"decode-us-per-token", required_argument, NULL, OPT_DECODE},
    {"max-running", required_argument, NULL, OPT_MAX_RUNNING},
    {"max-waiting", required_argument, NULL, OPT_MAX_WAITING},
    {"default-max-tokens", required_argument, NULL, OPT_DEFAULT_MAX_TOKENS},
    {"time-scale", required_argument, NULL, OPT_TIME_SCALE},
    {"keep-alive-timeout", required_argument, NULL, OPT_KEEP_ALIVE},
    {"max-body-bytes", required_argument, NULL, OPT_MAX_BODY},
    {"error-rate", required_argument, NULL, OPT_ERROR_RATE},
    {"close-mid-stream-rate", required_argument, NULL, OPT_CUT_RATE},
    {"slow-headers-ms", required_argument, NULL, OPT_SLOW_HEADERS},
    {"seed", required_argument, NULL, OPT_SEED},
    {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
    {"help", no_argument, NULL, OPT_HELP},
    {"version", no_argument, NULL, OPT_VERSION},
    {NULL, 0, NULL, 0},
};

typedef struct cli {
    sim_config cfg;
    char host[256];
    bool model_given;
    bool max_model_len_given;
} cli;

static int bad_flag(const char *flag, const char *value, const char *why)
{
    fprintf(stderr, "kvgate-simworker: --%s %s: %s\n", flag, value, why);
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

static int parse_double(const char *flag, const char *s, double min, double max, double *out)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || !end || *end || errno || !isfinite(v))
        return bad_flag(flag, s, "not a number");
    if (v < min || v > max) {
        char why[96];
        snprintf(why, sizeof(why), "must be between %g and %g", min, max);
        return bad_flag(flag, s, why);
    }
    *out = v;
    return 0;
}

/* Names travel in a response header and in label values: printable ASCII only. */
static int check_name(const char *flag, const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > NAME_MAX_LEN)
        return bad_flag(flag, s, "must be 1 to 256 characters");
    for (size_t i = 0; i < n; i++)
        if (s[i] < 0x21 || s[i] > 0x7e)
            return bad_flag(flag, s, "must be printable ASCII without spaces");
    return 0;
}

/* Returns 0 to run, 1 when --help/--version was handled, or an error. */
static int parse_args(int argc, char **argv, cli *c)
{
    sim_config *cfg = &c->cfg;
    int opt;
    int rc = 0;
    opterr = 0;
    while (rc == 0 && (opt = getopt_long(argc, argv, ":", long_opts, NULL)) != -1) {
        const char *flag = optind > 0 && optind <= argc ? argv[optind - 1] : "?";
        const char *name =
            opt >= OPT_LISTEN && opt <= OPT_VERSION ? long_opts[opt - OPT_LISTEN].name : flag;
        uint64_t u64;
        switch (opt) {
        case OPT_LISTEN:
            if (kvg_parse_hostport(optarg, c->host, sizeof(c->host), &cfg->listen_port) < 0)
                rc = bad_flag(name, optarg, "expected HOST:PORT or [V6]:PORT");
            cfg->listen_host = c->host;
            break;
        case OPT_PORT_FILE:
            cfg->port_file = optarg;
            break;
        case OPT_NAME:
            rc = check_name(name, optarg);
            cfg->name = optarg;
            break;
        case OPT_MODEL:
            rc = check_name(name, optarg);
            if (!c->model_given)
                cfg->n_models = 0;
            c->model_given = true;
            if (rc == 0 && cfg->n_models == SIM_MAX_MODELS)
                rc = bad_flag(name, optarg, "at most 8 model names");
            if (rc == 0)
                cfg->models[cfg->n_models++] = optarg;
            break;
        case OPT_KV_BLOCKS:
            rc = parse_u32(name, optarg, 1, SIM_MAX_KV_BLOCKS, &cfg->kv_blocks);
            break;
        case OPT_BLOCK_TOKENS:
            rc = parse_u32(name, optarg, 1, SIM_MAX_BLOCK_TOKENS, &cfg->block_tokens);
            break;
        case OPT_MAX_MODEL_LEN:
            rc = parse_u32(name, optarg, 1, 1u << 24, &cfg->max_model_len);
            c->max_model_len_given = true;
            break;
        case OPT_PREFILL:
            rc = parse_double(name, optarg, 0, 1e9, &cfg->prefill_us_per_token);
            break;
        case OPT_DECODE:
            rc = parse_double(name, optarg, 0, 1e9, &cfg->decode_us_per_token);
            break;
        case OPT_MAX_RUNNING:
            rc = parse_u32(name, optarg, 1, 1u << 20, &cfg->max_running);
            break;
        case OPT_MAX_WAITING:
            rc = parse_u32(name, optarg, 1, 1u << 24, &cfg->max_waiting);
            break;
        case OPT_DEFAULT_MAX_TOKENS:
            rc = parse_u32(name, optarg, 1, 1u << 24, &cfg->default_max_tokens);
            break;
        case OPT_TIME_SCALE:
            rc = parse_double(name, optarg, 0, 1e6, &cfg->time_scale);
            break;
        case OPT_KEEP_ALIVE:
            rc = parse_u32(name, optarg, 1, 86400, &cfg->keep_alive_s);
            break;
        case OPT_MAX_BODY:
            rc = parse_u64(name, optarg, 1024, 1ull << 32, &cfg->max_body_bytes);
            break;
        case OPT_ERROR_RATE:
            rc = parse_double(name, optarg, 0, 1, &cfg->error_rate);
            break;
        case OPT_CUT_RATE:
            rc = parse_double(name, optarg, 0, 1, &cfg->close_mid_stream_rate);
            break;
        case OPT_SLOW_HEADERS:
            rc = parse_u32(name, optarg, 0, 600000, &cfg->slow_headers_ms);
            break;
        case OPT_SEED:
            rc = parse_u64(name, optarg, 0, UINT64_MAX, &u64);
            cfg->seed = u64;
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
            fputs(usage_text, stdout);
            return 1;
        case OPT_VERSION:
            printf("kvgate-simworker %s\n", KVG_VERSION);
            return 1;
        case ':':
            fprintf(stderr, "kvgate-simworker: %s needs a value\n", flag);
            rc = KVG_ECONFIG;
            break;
        default:
            fprintf(stderr, "kvgate-simworker: unknown option %s (see --help)\n", flag);
            rc = KVG_ECONFIG;
            break;
        }
    }
    if (rc == 0 && optind < argc) {
        fprintf(stderr, "kvgate-simworker: unexpected argument %s (see --help)\n", argv[optind]);
        rc = KVG_ECONFIG;
    }
    if (rc < 0)
        return rc;
    uint64_t capacity = (uint64_t)cfg->kv_blocks * cfg->block_tokens;
    if (!c->max_model_len_given)
        cfg->max_model_len = (uint32_t)KVG_MIN(capacity, (uint64_t)SIM_MAX_MODEL_LEN_DEFAULT);
    if (cfg->max_model_len > capacity) {
        /* vLLM refuses to start when one full-length request cannot fit in the cache. */
        fprintf(
            stderr,
            "kvgate-simworker: --max-model-len %u needs %llu KV blocks; the cache has %u "
            "(raise --kv-blocks or lower --max-model-len)\n",
            cfg->max_model_len,
            (unsigned long long)((cfg->max_model_len + cfg->block_tokens - 1) / cfg->block_tokens),
            cfg->kv_blocks);
        return KVG_ECONFIG;
    }
    return 0;
}

/* Hundreds of client connections must not hit a low soft descriptor limit. */
static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < FD_TARGET) {
        rlim_t want = rl.rlim_max == RLIM_INFINITY ? FD_TARGET : KVG_MIN(rl.rlim_max, FD_TARGET);
        if (want > rl.rlim_cur) {
            rl.rlim_cur = want;
            if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
                kvg_log_debug("simworker: cannot raise RLIMIT_NOFILE: %s", strerror(errno));
        }
    }
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    struct event_base *base = arg;
    (void)what;
    kvg_log_info("simworker: signal %d, shutting down", (int)sig);
    event_base_loopbreak(base);
}

int main(int argc, char **argv)
{
    cli c;
    memset(&c, 0, sizeof(c));
    sim_config_defaults(&c.cfg);
    int rc = parse_args(argc, argv, &c);
    if (rc == 1)
        return 0;
    if (rc < 0)
        return 2;
    const sim_config *cfg = &c.cfg;

    /* A client that vanishes mid-write must be an error return, not a fatal signal. */
    struct sigaction sa = {.sa_handler = SIG_IGN};
    sigaction(SIGPIPE, &sa, NULL);
    raise_fd_limit();

    int status = 1;
    sim_engine *eng = NULL;
    sim_server *srv = NULL;
    /* The simulated engine's clock is its whole point: libevent's default timer rounds to the
     * kernel's coarse clock (4 ms ticks here), which made a 0.5 ms decode step take 4 ms. */
    struct event_config *ecfg = event_config_new();
    if (ecfg)
        event_config_set_flag(ecfg, EVENT_BASE_FLAG_PRECISE_TIMER);
    struct event_base *base = ecfg ? event_base_new_with_config(ecfg) : NULL;
    if (ecfg)
        event_config_free(ecfg);
    if (!base) {
        kvg_log_error("simworker: cannot create the event loop");
        return 1;
    }
    struct event *sigterm = evsignal_new(base, SIGTERM, on_signal, base);
    struct event *sigint = evsignal_new(base, SIGINT, on_signal, base);
    if (!sigterm || !sigint || evsignal_add(sigterm, NULL) < 0 || evsignal_add(sigint, NULL) < 0) {
        kvg_log_error("simworker: cannot install signal handlers");
        goto fail_signals;
    }
    rc = sim_engine_new(base, cfg, &eng);
    if (rc < 0) {
        kvg_log_error("simworker: cannot create the engine: %s", kvg_strerror(rc));
        goto fail_signals;
    }
    rc = sim_server_new(base, cfg, eng, &srv);
    if (rc < 0) {
        kvg_log_error("simworker: cannot listen on %s:%u: %s", cfg->listen_host,
                      (unsigned)cfg->listen_port, kvg_strerror(rc));
        goto fail_engine;
    }
    bool v6 = strchr(cfg->listen_host, ':') != NULL;
    kvg_log_info("kvgate-simworker %s: %s listening on http://%s%s%s:%u model=%s kv_blocks=%u "
                 "block_tokens=%u max_model_len=%u max_running=%u prefill_us=%g decode_us=%g "
                 "time_scale=%g",
                 KVG_VERSION, cfg->name, v6 ? "[" : "", cfg->listen_host, v6 ? "]" : "",
                 (unsigned)sim_server_port(srv), cfg->models[0], cfg->kv_blocks, cfg->block_tokens,
                 cfg->max_model_len, cfg->max_running, cfg->prefill_us_per_token,
                 cfg->decode_us_per_token, cfg->time_scale);
    if (event_base_dispatch(base) < 0)
        kvg_log_error("simworker: event loop failed");
    else
        status = 0;

    sim_server_free(srv);
fail_engine:
    sim_engine_free(eng);
fail_signals:
    if (sigterm)
        event_free(sigterm);
    if (sigint)
        event_free(sigint);
    event_base_free(base);
    libevent_global_shutdown();
    return status;
}
