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
    "Token-exact mode (vLLM with --prefix-caching-hash-algo and a fixed PYTHONHASHSEED):\n"
    "  --tokenizer FILE              the model's tokenizer.json: real token ids, vLLM's block "
    "hash\n"
    "  --tokenizer-config FILE       tokenizer_config.json (default: beside --tokenizer, if any)\n"
    "  --chat-template FILE          chat template overriding the tokenizer config's\n"
    "  --hash-algo ALGO              sha256_cbor or xxhash_cbor (default sha256_cbor)\n"
    "  --hash-seed S                 the engine's PYTHONHASHSEED (required with --tokenizer)\n"
    "KV-cache events in vLLM's format (token-exact mode; see docs/simworker.md):\n"
    "  --kv-events-endpoint EP       ZeroMQ PUB bind address, tcp://HOST:PORT (port 0 = any)\n"
    "  --kv-events-replay-endpoint EP  ROUTER bind address answering replay requests\n"
    "  --kv-events-topic T           topic frame of every message (default empty)\n"
    "  --kv-events-buffer N          batches kept for replay (default 10000)\n"
    "  --kv-events-port-file PATH    after binding, write the bound endpoints, one a line\n"
    "  --kv-events-drop-rate F       fraction of batches not sent on PUB (still replayable)\n"
    "  --kv-events-delay-ms N        send each batch N ms late\n"
    "  --kv-events-format F          events as array (vLLM before 2026-06) or map (default array)\n"
    "  --kv-events-heartbeat-ms N    an empty batch after N ms without one, as vLLM with a\n"
    "                                snapshot endpoint (1000); 0 = none, as released vLLM "
    "(default)\n"
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
    OPT_TOKENIZER,
    OPT_TOKENIZER_CONFIG,
    OPT_CHAT_TEMPLATE,
    OPT_HASH_ALGO,
    OPT_HASH_SEED,
    OPT_KV_EVENTS_ENDPOINT,
    OPT_KV_EVENTS_REPLAY,
    OPT_KV_EVENTS_TOPIC,
    OPT_KV_EVENTS_BUFFER,
    OPT_KV_EVENTS_PORT_FILE,
    OPT_KV_EVENTS_DROP,
    OPT_KV_EVENTS_DELAY,
    OPT_KV_EVENTS_FORMAT,
    OPT_KV_EVENTS_HEARTBEAT,
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
    {"tokenizer", required_argument, NULL, OPT_TOKENIZER},
    {"tokenizer-config", required_argument, NULL, OPT_TOKENIZER_CONFIG},
    {"chat-template", required_argument, NULL, OPT_CHAT_TEMPLATE},
    {"hash-algo", required_argument, NULL, OPT_HASH_ALGO},
    {"hash-seed", required_argument, NULL, OPT_HASH_SEED},
    {"kv-events-endpoint", required_argument, NULL, OPT_KV_EVENTS_ENDPOINT},
    {"kv-events-replay-endpoint", required_argument, NULL, OPT_KV_EVENTS_REPLAY},
    {"kv-events-topic", required_argument, NULL, OPT_KV_EVENTS_TOPIC},
    {"kv-events-buffer", required_argument, NULL, OPT_KV_EVENTS_BUFFER},
    {"kv-events-port-file", required_argument, NULL, OPT_KV_EVENTS_PORT_FILE},
    {"kv-events-drop-rate", required_argument, NULL, OPT_KV_EVENTS_DROP},
    {"kv-events-delay-ms", required_argument, NULL, OPT_KV_EVENTS_DELAY},
    {"kv-events-format", required_argument, NULL, OPT_KV_EVENTS_FORMAT},
    {"kv-events-heartbeat-ms", required_argument, NULL, OPT_KV_EVENTS_HEARTBEAT},
    {"help", no_argument, NULL, OPT_HELP},
    {"version", no_argument, NULL, OPT_VERSION},
    {NULL, 0, NULL, 0},
};

typedef struct cli {
    sim_config cfg;
    char host[256];
    bool model_given;
    bool max_model_len_given;
    const char *exact_flag;  /* a token-exact flag given, for the error without --tokenizer */
    const char *events_flag; /* a --kv-events-* flag given */
} cli;

static int bad_flag(const char *flag, const char *value, const char *why)
{
    fprintf(stderr, "kvgate-simworker: --%s %s: %s\n", flag, value, why);
    return KVG_ECONFIG;
}

/* ZeroMQ endpoints the publisher binds: tcp://HOST:PORT (HOST may be *), ipc://, inproc://. */
static int check_endpoint(const char *flag, const char *s)
{
    size_t n = strlen(s);
    if (n > 200)
        return bad_flag(flag, s, "longer than 200 characters");
    if (strncmp(s, "tcp://", 6) != 0 && strncmp(s, "ipc://", 6) != 0 &&
        strncmp(s, "inproc://", 9) != 0)
        return bad_flag(flag, s, "expected tcp://HOST:PORT, ipc://PATH or inproc://NAME");
    return 0;
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
        case OPT_TOKENIZER:
            cfg->tokenizer_path = optarg;
            break;
        case OPT_TOKENIZER_CONFIG:
            cfg->tokenizer_config_path = optarg;
            break;
        case OPT_CHAT_TEMPLATE:
            cfg->chat_template_path = optarg;
            break;
        case OPT_HASH_ALGO: {
            sim_vllm_algo algo;
            if (sim_vllm_algo_parse(optarg, &algo) < 0)
                rc = bad_flag(name, optarg, "expected sha256_cbor or xxhash_cbor");
            else
                cfg->hash_algo = (int)algo;
            c->exact_flag = "--hash-algo";
            break;
        }
        case OPT_HASH_SEED:
            cfg->hash_seed = optarg;
            c->exact_flag = "--hash-seed";
            break;
        case OPT_KV_EVENTS_ENDPOINT:
            rc = check_endpoint(name, optarg);
            cfg->kv_events_endpoint = optarg;
            c->events_flag = "--kv-events-endpoint";
            break;
        case OPT_KV_EVENTS_REPLAY:
            rc = check_endpoint(name, optarg);
            cfg->kv_events_replay_endpoint = optarg;
            c->events_flag = "--kv-events-replay-endpoint";
            break;
        case OPT_KV_EVENTS_TOPIC:
            if (strlen(optarg) > 256)
                rc = bad_flag(name, optarg, "longer than 256 bytes");
            cfg->kv_events_topic = optarg;
            c->events_flag = "--kv-events-topic";
            break;
        case OPT_KV_EVENTS_BUFFER:
            rc = parse_u32(name, optarg, 1, 1u << 22, &cfg->kv_events_buffer);
            c->events_flag = "--kv-events-buffer";
            break;
        case OPT_KV_EVENTS_PORT_FILE:
            cfg->kv_events_port_file = optarg;
            c->events_flag = "--kv-events-port-file";
            break;
        case OPT_KV_EVENTS_DROP:
            rc = parse_double(name, optarg, 0, 1, &cfg->kv_events_drop_rate);
            c->events_flag = "--kv-events-drop-rate";
            break;
        case OPT_KV_EVENTS_DELAY:
            rc = parse_u32(name, optarg, 0, 3600000, &cfg->kv_events_delay_ms);
            c->events_flag = "--kv-events-delay-ms";
            break;
        case OPT_KV_EVENTS_FORMAT: {
            sim_kvev_format f;
            if (sim_kvev_format_parse(optarg, &f) < 0)
                rc = bad_flag(name, optarg, "expected array or map");
            else
                cfg->kv_events_format = (int)f;
            c->events_flag = "--kv-events-format";
            break;
        }
        case OPT_KV_EVENTS_HEARTBEAT:
            rc = parse_u32(name, optarg, 0, 3600000, &cfg->kv_events_heartbeat_ms);
            c->events_flag = "--kv-events-heartbeat-ms";
            break;
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
    if (!cfg->tokenizer_path && (cfg->tokenizer_config_path || cfg->chat_template_path)) {
        fprintf(stderr, "kvgate-simworker: %s needs --tokenizer (token-exact mode)\n",
                cfg->chat_template_path ? "--chat-template" : "--tokenizer-config");
        return KVG_ECONFIG;
    }
    if (!cfg->tokenizer_path && c->exact_flag) {
        fprintf(stderr, "kvgate-simworker: %s needs --tokenizer (token-exact mode)\n",
                c->exact_flag);
        return KVG_ECONFIG;
    }
    if (!cfg->tokenizer_path && c->events_flag) {
        /* The events carry vLLM's block hashes, which only token-exact mode computes. */
        fprintf(stderr, "kvgate-simworker: %s needs --tokenizer (token-exact mode)\n",
                c->events_flag);
        return KVG_ECONFIG;
    }
    if (c->events_flag && !cfg->kv_events_endpoint) {
        fprintf(stderr, "kvgate-simworker: %s needs --kv-events-endpoint\n", c->events_flag);
        return KVG_ECONFIG;
    }
    if (cfg->tokenizer_path && !cfg->hash_seed) {
        fprintf(stderr,
                "kvgate-simworker: --tokenizer %s needs --hash-seed S, the engine's "
                "PYTHONHASHSEED (without a fixed seed vLLM's block hashes are random)\n",
                cfg->tokenizer_path);
        return KVG_ECONFIG;
    }
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
    sim_exact *exact = NULL;
    if (c.cfg.tokenizer_path) {
        /* Start-up errors of the mode are command-line errors: status 2, naming the file. */
        char err[1024];
        rc = sim_exact_load(&c.cfg, &exact, err, sizeof(err));
        if (rc < 0) {
            fprintf(stderr, "kvgate-simworker: %s\n", err);
            return 2;
        }
        c.cfg.exact = exact;
    }
    const sim_config *cfg = &c.cfg;

    /* A client that vanishes mid-write must be an error return, not a fatal signal. */
    struct sigaction sa = {.sa_handler = SIG_IGN};
    sigaction(SIGPIPE, &sa, NULL);
    raise_fd_limit();

    int status = 1;
    sim_engine *eng = NULL;
    sim_server *srv = NULL;
    sim_kvev_pub *events = NULL;
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
        sim_exact_free(exact);
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
    if (cfg->kv_events_endpoint) {
        /* Before the HTTP listener: once --port-file exists, so do the event endpoints. */
        rc = sim_kvev_pub_new(base, cfg, &events);
        if (rc < 0) {
            kvg_log_error("simworker: cannot start kv events: %s", kvg_strerror(rc));
            goto fail_engine;
        }
        sim_engine_set_events(eng, events);
    }
    rc = sim_server_new(base, cfg, eng, &srv);
    if (rc < 0) {
        kvg_log_error("simworker: cannot listen on %s:%u: %s", cfg->listen_host,
                      (unsigned)cfg->listen_port, kvg_strerror(rc));
        goto fail_engine;
    }
    sim_server_set_events(srv, events); /* POST /kv_events/pause and /resume */
    bool v6 = strchr(cfg->listen_host, ':') != NULL;
    kvg_log_info("kvgate-simworker %s: %s listening on http://%s%s%s:%u model=%s kv_blocks=%u "
                 "block_tokens=%u max_model_len=%u max_running=%u prefill_us=%g decode_us=%g "
                 "time_scale=%g",
                 KVG_VERSION, cfg->name, v6 ? "[" : "", cfg->listen_host, v6 ? "]" : "",
                 (unsigned)sim_server_port(srv), cfg->models[0], cfg->kv_blocks, cfg->block_tokens,
                 cfg->max_model_len, cfg->max_running, cfg->prefill_us_per_token,
                 cfg->decode_us_per_token, cfg->time_scale);
    if (exact)
        kvg_log_info("simworker: token-exact mode: tokenizer=%s hash_algo=%s hash_seed=%s "
                     "chat_template=%s",
                     cfg->tokenizer_path, sim_vllm_algo_str(sim_exact_algo(exact)), cfg->hash_seed,
                     cfg->chat_template_path ? cfg->chat_template_path : "(tokenizer config)");
    if (event_base_dispatch(base) < 0)
        kvg_log_error("simworker: event loop failed");
    else
        status = 0;

    sim_server_free(srv);
fail_engine:
    sim_engine_free(eng);
    sim_kvev_pub_free(events);
fail_signals:
    if (sigterm)
        event_free(sigterm);
    if (sigint)
        event_free(sigint);
    event_base_free(base);
    libevent_global_shutdown();
    sim_exact_free(exact);
    return status;
}
