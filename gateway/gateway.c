/* SPDX-License-Identifier: Apache-2.0 */
/* The gateway as a library (gateway.h): configuration taken over, state directory, secrets,
 * registry, tenants, policy, index and admin API built, listeners bound, threads run until a
 * signal or kvg_gateway_stop, then the graceful shutdown sequence and everything freed. */
#include "gateway.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/event.h>
#include <http_parser.h>

#include "gateway_int.h"
#include "handlers.h"
#include "kvg_config.h"
#include "preflight.h"
#include "probe.h"
#include "process_metrics.h"
#include "tls.h"

/* ---- state directory and admin token ------------------------------------------------------- */

static int mkdir_p(const char *path, mode_t mode)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof(tmp), "%s", path) >= (int)sizeof(tmp))
        return -ENAMETOOLONG;
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(tmp, mode) < 0 && errno != EEXIST)
            return -errno;
        *p = '/';
    }
    if (mkdir(tmp, mode) < 0 && errno != EEXIST)
        return -errno;
    return 0;
}

/* The admin token: the environment, then the config, then one kept in the state directory. */
static int admin_token(kvg_config *cfg, char **out_token, bool *generated)
{
    *generated = false;
    const char *env = getenv("KVGATE_ADMIN_TOKEN");
    if (env && *env) {
        *out_token = strdup(env);
        return *out_token ? 0 : -ENOMEM;
    }
    if (cfg->nadmin_tokens > 0) {
        *out_token = NULL;
        return 0;
    }
    return kvg_state_secret(cfg->state_dir, "admin-token", true, out_token, generated);
}

/* The tokens that grant GET /metrics only: KVGATE_METRICS_TOKEN, else admin.metrics_tokens
 * (none: only the admin token reads /metrics). */
static int metrics_tokens(kvg_gateway *gw, const kvg_config *cfg)
{
    const char *env = getenv("KVGATE_METRICS_TOKEN");
    if (env && *env)
        return kvg_admin_set_metrics_tokens(gw->admin, &env, 1);
    return kvg_admin_set_metrics_tokens(gw->admin, (const char *const *)cfg->metrics_tokens,
                                        cfg->nmetrics_tokens);
}

/* The server secret under which scope salts are computed: KVGATE_SECRET, the config, or one
 * kept in the state directory. Every replica of a fleet must share it. */
static int server_secret(kvg_gateway *gw)
{
    char *secret = NULL;
    bool generated = false;
    char err[512];
    int rc = kvg_server_secret(&gw->cfg, true, &secret, &generated, err, sizeof(err));
    if (rc < 0) {
        kvg_log_error("%s", err);
        return rc == KVG_ECONFIG ? -EINVAL : rc;
    }
    size_t n = strlen(secret);
    gw->secret_len = KVG_MIN(n, sizeof(gw->secret));
    memcpy(gw->secret, secret, gw->secret_len);
    explicit_bzero(secret, n);
    free(secret);
    if (generated)
        kvg_log_info("generated the server secret in %s/secret (replicas must share it)",
                     gw->cfg.state_dir);
    return 0;
}

static int open_access_log(const char *spec)
{
    if (strcmp(spec, "off") == 0)
        return -1;
    if (strcmp(spec, "-") == 0)
        return dup(STDOUT_FILENO);
    int fd = open(spec, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
    if (fd < 0)
        kvg_log_error("cannot open access log %s: %s", spec, strerror(errno));
    return fd;
}

/* ---- descriptors ---------------------------------------------------------------------------- */

/* Raise the soft descriptor limit to the hard one: the usual soft default (1024) caps a gateway
 * long before memory does. Returns the limit in force. */
static uint64_t raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0) {
        kvg_log_warn("cannot read the descriptor limit: %s", strerror(errno));
        return 1024;
    }
    rlim_t want = rl.rlim_max;
    if (want == RLIM_INFINITY) {
        /* The kernel refuses more than fs.nr_open whatever the hard limit says. */
        want = 1u << 20;
        FILE *f = fopen("/proc/sys/fs/nr_open", "r");
        unsigned long long n;
        if (f && fscanf(f, "%llu", &n) == 1 && n > 0)
            want = (rlim_t)n;
        if (f)
            fclose(f);
    }
    if (want > rl.rlim_cur) {
        rlim_t old = rl.rlim_cur;
        rl.rlim_cur = want;
        if (setrlimit(RLIMIT_NOFILE, &rl) == 0) {
            kvg_log_info("descriptor limit raised from %llu to %llu (the hard limit)",
                         (unsigned long long)old, (unsigned long long)want);
            return (uint64_t)want;
        }
        kvg_log_warn("cannot raise the descriptor limit from %llu to %llu: %s",
                     (unsigned long long)old, (unsigned long long)want, strerror(errno));
        return (uint64_t)old;
    }
    kvg_log_info("descriptor limit %llu", (unsigned long long)rl.rlim_cur);
    return (uint64_t)rl.rlim_cur;
}

/* ---- listeners ------------------------------------------------------------------------------- */

/* ctx: the listener's TLS context from the preflight (taken over), NULL without TLS. */
static int setup_listener(kvg_gateway *gw, kvg_listener *l, const kvg_listener_config *cfg,
                          bool is_admin, kvg_thread **threads, unsigned nthreads, SSL_CTX **ctx,
                          const kvg_tls_cert_info *info)
{
    l->cfg = *cfg; /* the strings stay owned by gw->cfg */
    l->is_admin = is_admin;
    l->handler = is_admin ? &kvg_admin_handler
                 : gw->cfg.probes.front_healthz || gw->cfg.probes.front_readyz
                     ? &kvg_front_probe_handler
                     : &kvg_proxy_handler;
    if (cfg->tls_cert && *ctx) {
        kvg_tls_slot_init(&l->tls, *ctx, info->not_after_s);
        *ctx = NULL;
        l->has_tls = true;
        kvg_gateway_tls_log_loaded(l, info);
    }
    uint16_t want = cfg->port;
    for (unsigned i = 0; i < nthreads; i++) {
        evutil_socket_t fd;
        int rc = kvg_listen_socket(cfg->host, want, nthreads > 1, &fd, &l->port);
        if (rc < 0) {
            kvg_log_error("cannot listen on %s: %s", cfg->address, kvg_strerror(rc));
            return rc;
        }
        want = l->port; /* port 0: every thread joins the port the first socket got */
        rc = kvg_thread_add_listener(threads[i], l, fd);
        if (rc < 0) {
            close(fd);
            return rc;
        }
    }
    kvg_log_info("%s listening on %s:%u%s", is_admin ? "admin" : "gateway", cfg->host, l->port,
                 l->has_tls ? (cfg->cleartext ? " (TLS and cleartext)" : " (TLS only)") : "");
    return 0;
}

static int write_port_file(const char *path, kvg_gateway *gw)
{
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return -errno;
    for (size_t i = 0; i < gw->nlisteners; i++)
        fprintf(f, "front=%s:%u\n", gw->listeners[i].cfg.host, gw->listeners[i].port);
    for (size_t i = 0; i < gw->nadmin_listeners; i++)
        fprintf(f, "admin=%s:%u\n", gw->admin_listeners[i].cfg.host, gw->admin_listeners[i].port);
    if (fclose(f) != 0 || rename(tmp, path) < 0)
        return -errno;
    return 0;
}

uint16_t kvg_gateway_port(const kvg_gateway *gw, bool admin, size_t i)
{
    if (admin)
        return i < gw->nadmin_listeners ? gw->admin_listeners[i].port : 0;
    return i < gw->nlisteners ? gw->listeners[i].port : 0;
}

/* ---- signals, reload, shutdown --------------------------------------------------------------- */

static void reload(kvg_gateway *gw)
{
    /* Reopen the access log first: log rotation sends SIGHUP too. */
    int fd = open_access_log(gw->cfg.access_log);
    if (fd >= 0 && gw->access_log_fd >= 0) {
        dup2(fd, gw->access_log_fd); /* same descriptor number: threads keep writing to it */
        close(fd);
    } else if (fd >= 0) {
        close(fd);
    }
    kvg_config next;
    char err[512];
    kvg_config_action action;
    if (kvg_config_init(&next) < 0)
        return;
    if (kvg_config_parse_args(&next, gw->argc, gw->argv, &action, err, sizeof(err)) < 0 ||
        kvg_config_validate(&next, err, sizeof(err)) < 0) {
        kvg_log_error("reload failed, keeping the running configuration: %s", err);
        kvg_config_done(&next);
        return;
    }
    kvg_gateway_tls_reload(gw, &next);
    /* Models before the workers: their files may be missing or bad (a worker definition was
     * checked with the rest), and a model that does not load refuses the reload as a worker
     * that does not parse does, before the workers change. The loads may take a while (a
     * tokenizer.json is ~10 MB); a definition that did not change keeps its loaded model. */
    char mmsg[1024] = "";
    int rc = kvg_model_registry_replace_config(gw->models, next.models, next.nmodels, mmsg,
                                               sizeof(mmsg));
    if (rc < 0) {
        kvg_log_error("reload failed, keeping the running workers and models: models: %s",
                      rc == -ENOMEM ? kvg_strerror(rc) : mmsg);
        kvg_config_done(&next);
        return;
    }
    kvg_worker_def *defs = kvg_config_worker_defs(&next);
    char msg[256] = "";
    rc = defs ? kvg_registry_replace_config(gw->registry, defs, next.nworkers, msg, sizeof(msg))
              : -ENOMEM;
    free(defs);
    if (rc < 0) {
        kvg_log_error("reload failed, keeping the running workers: %s", msg);
        kvg_config_done(&next);
        return;
    }
    kvg_log_set_level(next.log_level);
    if (next.nadmin_tokens > 0 && !getenv("KVGATE_ADMIN_TOKEN"))
        kvg_admin_set_tokens(gw->admin, (const char *const *)next.admin_tokens, next.nadmin_tokens);
    if (metrics_tokens(gw, &next) < 0)
        kvg_log_error("reload: invalid metrics token, keeping the old ones");
    if (next.nlisteners != gw->cfg.nlisteners || next.threads != gw->cfg.threads)
        kvg_log_warn("reload: listener and thread changes take effect after a restart");
    kvg_log_info("configuration reloaded: %zu workers and %zu models from the config",
                 next.nworkers, next.nmodels);
    kvg_config_done(&next);
    kvg_gateway_notify_all(gw);
}

static void signal_cb(evutil_socket_t sig, short what, void *arg)
{
    kvg_gateway *gw = arg;
    if (sig == SIGHUP)
        reload(gw);
    else
        kvg_gateway_begin_shutdown(gw, sig == SIGTERM ? "SIGTERM" : "SIGINT");
}

static bool ready_cb(void *arg)
{
    kvg_gateway *gw = arg;
    return !atomic_load(&gw->shutting_down) && !atomic_load(&gw->not_ready);
}

void kvg_gateway_stop(kvg_gateway *gw)
{
    atomic_store(&gw->stop_requested, true);
    kvg_thread_notify(&gw->control); /* kvg_gateway_control_wakeup begins the shutdown */
}

/* ---- building -------------------------------------------------------------------------------- */

static unsigned default_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (unsigned)n : 1;
}

/* The shared prefix map and state: a replica starts from Redis, so it waits for it (up to
 * redis.startup_timeout_ms) rather than serve with a state the others do not share. */
static int connect_redis(kvg_gateway *gw)
{
    const kvg_redis_settings *rs = &gw->cfg.redis;
    kvg_redis_config rcfg = {
        .url = rs->url,
        .prefix = rs->prefix,
        .connect_timeout_ms = rs->connect_timeout_ms,
        .command_timeout_ms = rs->command_timeout_ms,
        .max_inflight = rs->max_inflight,
        .reconnect_max_ms = rs->reconnect_max_ms,
        .topology_interval_ms = rs->topology_interval_ms,
        .entry_ttl_ms = (uint64_t)rs->entry_ttl_s * 1000,
    };
    char msg[512] = "";
    int rc = kvg_redis_new(&rcfg, &gw->redis, msg, sizeof(msg));
    if (rc < 0) {
        kvg_log_error("redis: %s", msg[0] ? msg : kvg_strerror(rc));
        return rc;
    }
    rc = kvg_redis_wait_topology(gw->redis, rs->startup_timeout_ms, msg, sizeof(msg));
    if (rc < 0) {
        kvg_log_error("cannot reach Redis within redis.startup_timeout_ms (%u ms): %s",
                      rs->startup_timeout_ms, msg);
        return rc;
    }
    kvg_log_info("redis: %s mode, prefix \"%s\"", kvg_redis_mode_str(kvg_redis_mode_of(gw->redis)),
                 kvg_redis_prefix(gw->redis));
    return 0;
}

/* Tenancy, policy, the secret, the prefix index and the admin API with its state file. The
 * admin token is the caller's (NULL: the config's tokens). */
static int build_state(kvg_gateway *gw, char *token)
{
    char msg[1024] = ""; /* the state file's message may name a model's file */
    const char *step = "the tenant store";
    int rc = kvg_tenants_new(&gw->tenants);
    if (rc == 0) {
        step = "the policy settings";
        rc = kvg_policy_state_new(&gw->policy);
    }
    if (rc == 0) {
        step = "the server secret";
        rc = server_secret(gw);
    }
    if (rc == 0) {
        step = "the prefix index";
        kvg_index_config icfg = {
            .max_entries = gw->cfg.index_max_entries,
            .default_capacity = gw->cfg.index_default_capacity,
            .speculative_ttl_ms = gw->cfg.index_speculative_ttl_ms,
        };
        rc = kvg_router_new(&icfg, &gw->router);
    }
    if (rc == 0 && gw->cfg.redis.url) {
        step = "Redis";
        rc = connect_redis(gw);
    }
    if (rc == 0) {
        rc = kvg_gateway_hash_setup(gw);
        if (rc < 0)
            return rc; /* logged */
    }
    if (rc < 0) {
        kvg_log_error("cannot set up %s: %s", step, kvg_strerror(rc));
        return rc;
    }
    gw->auth_open = gw->cfg.auth_open;
    char state_path[4200], audit_path[4200];
    snprintf(state_path, sizeof(state_path), "%s/state.json", gw->cfg.state_dir);
    snprintf(audit_path, sizeof(audit_path), "%s/audit.log", gw->cfg.state_dir);
    const char *audit = gw->cfg.audit_log ? gw->cfg.audit_log : audit_path;
    const char *const *tokens =
        token ? (const char *const *)&token : (const char *const *)gw->cfg.admin_tokens;
    kvg_admin_config acfg = {
        .tokens = tokens,
        .ntokens = token ? 1 : gw->cfg.nadmin_tokens,
        .tenants = gw->tenants,
        .policy = gw->policy,
        .state_path = gw->cfg.state_file ? gw->cfg.state_file : state_path,
        .audit_path = strcmp(audit, "off") == 0 ? NULL : audit,
        .tenant_label_cap = gw->cfg.tenant_metrics_max,
        .router = gw->router,
        .redis = gw->redis,
        .redis_sync_interval_ms = gw->cfg.redis.sync_interval_ms,
        .redis_timeout_ms = gw->cfg.redis.command_timeout_ms,
        .engine_load_max_age_ns = kvg_scrape_max_age_ns(gw),
        .secret = gw->secret,
        .secret_len = gw->secret_len,
        .ready_without_workers = !gw->cfg.probes.ready_requires_worker,
        .models = gw->models,
    };
    rc = kvg_admin_new(&acfg, gw->registry, &gw->admin);
    if (rc < 0) {
        kvg_log_error("cannot create the admin API: %s", kvg_strerror(rc));
        return rc;
    }
    rc = metrics_tokens(gw, &gw->cfg);
    if (rc < 0) {
        kvg_log_error("invalid KVGATE_METRICS_TOKEN or admin.metrics_tokens: %s", kvg_strerror(rc));
        return rc;
    }
    /* Tenants, keys, admin-defined workers and the policy as the admin API last left them. */
    rc = kvg_admin_load_state(gw->admin, msg, sizeof(msg));
    if (rc < 0) {
        kvg_log_error("cannot restore the state file %s: %s", acfg.state_path, msg);
        return rc;
    }
    /* With Redis the replicas share it: from there, or stored there from the file's. */
    char smsg[1024] = "";
    rc = kvg_admin_share_state(gw->admin, smsg, sizeof(smsg));
    if (rc < 0) {
        kvg_log_error("shared state: %s", smsg[0] ? smsg : kvg_strerror(rc));
        return rc;
    }
    if (gw->auth_open) {
        kvg_log_warn("auth is open: every request is served without an API key");
    } else {
        kvg_tenant_set *ts = kvg_tenants_acquire(gw->tenants);
        if (kvg_tenant_set_count(ts) == 0)
            kvg_log_warn("no tenant exists yet: every request gets 401 until one does "
                         "(kvgate admin tenants put ID; kvgate admin keys create ID)");
        kvg_tenant_set_unref(ts);
    }
    kvg_admin_add_metrics(gw->admin, kvg_front_stats_write, gw);
    kvg_admin_add_metrics(gw->admin, kvg_hash_stats_write, gw);
    /* The engines' KV events: a thread that idles until a worker names a publisher. */
    int krc = kvg_kv_consumer_start(gw->registry, gw->router, &gw->kv_events);
    if (krc < 0) {
        kvg_log_error("cannot start the KV-event consumer: %s", kvg_strerror(krc));
        return krc;
    }
    kvg_admin_add_metrics(gw->admin, kvg_kv_consumer_write_metrics, gw->kv_events);
    kvg_admin_set_worker_extra(gw->admin, kvg_kv_consumer_write_worker, gw->kv_events);
    kvg_admin_add_metrics(gw->admin, kvg_tls_stats_write, gw);
    kvg_admin_add_metrics(gw->admin, kvg_process_stats_write, NULL);
    kvg_admin_set_ready(gw->admin, ready_cb, gw);
    kvg_admin_set_live(gw->admin, kvg_gateway_live, gw);
    return 0;
}

/* Threads (not started), listeners bound on them, the access log and the signals. */
static int build_threads(kvg_gateway *gw, kvg_preflight *pf)
{
    if (kvg_thread_init(&gw->control, gw, gw->nthreads, true) < 0)
        return -ENOMEM;
    gw->control_ready = true;
    gw->threads = calloc(gw->nthreads, sizeof(kvg_thread));
    kvg_thread **tp = calloc(gw->nthreads, sizeof(kvg_thread *));
    int rc = -ENOMEM;
    if (!gw->threads || !tp)
        goto out;
    for (unsigned i = 0; i < gw->nthreads; i++) {
        if (kvg_thread_init(&gw->threads[i], gw, i, false) < 0)
            goto out;
        tp[i] = &gw->threads[i];
        gw->nthreads_ready = i + 1;
    }
    kvg_thread *control = &gw->control;
    for (size_t i = 0; i < gw->cfg.nlisteners; i++) {
        gw->nlisteners = i + 1;
        rc = setup_listener(gw, &gw->listeners[i], &gw->cfg.listeners[i], false, tp, gw->nthreads,
                            &pf->ctx[0][i], &pf->info[0][i]);
        if (rc < 0)
            goto out;
    }
    for (size_t i = 0; i < gw->cfg.nadmin_listeners; i++) {
        gw->nadmin_listeners = i + 1;
        rc = setup_listener(gw, &gw->admin_listeners[i], &gw->cfg.admin_listeners[i], true,
                            &control, 1, &pf->ctx[1][i], &pf->info[1][i]);
        if (rc < 0)
            goto out;
    }
    gw->access_log_fd = open_access_log(gw->cfg.access_log);
    rc = 0;
    if (gw->argv) { /* a command-line gateway owns the process's signals; an embedded one not */
        gw->sig_term = evsignal_new(control->base, SIGTERM, signal_cb, gw);
        gw->sig_int = evsignal_new(control->base, SIGINT, signal_cb, gw);
        gw->sig_hup = evsignal_new(control->base, SIGHUP, signal_cb, gw);
        if (!gw->sig_term || !gw->sig_int || !gw->sig_hup || evsignal_add(gw->sig_term, NULL) < 0 ||
            evsignal_add(gw->sig_int, NULL) < 0 || evsignal_add(gw->sig_hup, NULL) < 0)
            rc = -ENOMEM;
    }
out:
    free(tp);
    return rc;
}

int kvg_gateway_new(kvg_config *cfg, int argc, char **argv, kvg_gateway **out)
{
    kvg_gateway *gw = calloc(1, sizeof(*gw));
    if (!gw) {
        kvg_config_done(cfg);
        return -ENOMEM;
    }
    gw->cfg = *cfg; /* taken over: the caller's copy must not be freed again */
    memset(cfg, 0, sizeof(*cfg));
    gw->argc = argc;
    gw->argv = argv;
    gw->access_log_fd = -1;
    kvg_log_set_level(gw->cfg.log_level);
    signal(SIGPIPE, SIG_IGN);
    /* http-parser now reads only the health probes' answers (probe.c); the fronts and the
     * worker client use h1_parse.c. The same ceiling as the fronts' head limit. */
    http_parser_set_max_header_size((uint32_t)gw->cfg.limits.header_bytes + 4096);

    char *token = NULL;
    bool generated;
    /* The checks --check-config makes too: TLS files and settings, the state directory, the
     * secrets and the files the gateway writes. */
    kvg_preflight pf;
    char perr[1024];
    int rc = kvg_preflight_run(&gw->cfg, false, &pf, perr, sizeof(perr));
    if (rc < 0) {
        kvg_log_error("%s", perr);
        goto fail;
    }
    rc = mkdir_p(gw->cfg.state_dir, 0700);
    if (rc < 0) {
        kvg_log_error("cannot create state directory %s: %s", gw->cfg.state_dir, kvg_strerror(rc));
        goto fail;
    }
    rc = admin_token(&gw->cfg, &token, &generated);
    if (rc < 0) {
        kvg_log_error("cannot set up the admin token in %s: %s", gw->cfg.state_dir,
                      kvg_strerror(rc));
        goto fail;
    }
    if (generated)
        kvg_log_info("generated an admin token in %s/admin-token", gw->cfg.state_dir);

    gw->nthreads = gw->cfg.threads ? gw->cfg.threads : default_threads();
    kvg_gateway_init_limits(gw, raise_nofile());
    kvg_registry_config rcfg = {
        .nthreads = gw->nthreads + 2, /* + the control thread's slots (health, scrapes) */
        .default_max_inflight = gw->cfg.upstream.max_inflight,
        .health_fall = gw->cfg.health.fall,
        .health_rise = gw->cfg.health.rise,
    };
    rc = kvg_registry_new(&rcfg, &gw->registry);
    if (rc < 0) {
        kvg_log_error("cannot create the worker registry: %s", kvg_strerror(rc));
        goto fail;
    }
    kvg_worker_def *defs = kvg_config_worker_defs(&gw->cfg);
    char msg[256] = "";
    rc = defs ? kvg_registry_replace_config(gw->registry, defs, gw->cfg.nworkers, msg, sizeof(msg))
              : -ENOMEM;
    free(defs);
    if (rc < 0) {
        kvg_log_error("workers: %s", msg);
        goto fail;
    }
    /* The config's models, loaded now: a file that does not load stops the start, naming the
     * model, the field and the file. */
    char mmsg[1024] = "";
    rc = kvg_model_registry_new(&gw->models);
    if (rc == 0)
        rc = kvg_model_registry_replace_config(gw->models, gw->cfg.models, gw->cfg.nmodels, mmsg,
                                               sizeof(mmsg));
    if (rc < 0) {
        kvg_log_error("models: %s", mmsg[0] ? mmsg : kvg_strerror(rc));
        goto fail;
    }
    if (gw->cfg.nmodels)
        kvg_log_info("%zu models loaded from the config", gw->cfg.nmodels);
    rc = build_state(gw, token);
    if (rc < 0)
        goto fail;
    rc = build_threads(gw, &pf);
    if (rc < 0) {
        kvg_log_error("cannot start the gateway's threads and listeners: %s", kvg_strerror(rc));
        goto fail;
    }
    free(token);
    kvg_preflight_done(&pf);
    *out = gw;
    return 0;
fail:
    free(token);
    kvg_preflight_done(&pf);
    kvg_gateway_free(gw);
    return rc;
}

int kvg_gateway_run(kvg_gateway *gw)
{
    if (kvg_health_start(gw) < 0 || kvg_scrape_start(gw) < 0)
        return -ENOMEM;
    for (unsigned i = 0; i < gw->nthreads; i++) {
        int rc = kvg_thread_spawn(&gw->threads[i]);
        if (rc < 0) {
            kvg_log_error("cannot start thread %u: %s", i, kvg_strerror(rc));
            atomic_store(&gw->force_stop, true);
            atomic_store(&gw->shutting_down, true);
            kvg_health_stop(gw);
            kvg_scrape_stop(gw);
            for (unsigned j = 0; j < i; j++)
                kvg_thread_notify(&gw->threads[j]);
            for (unsigned j = 0; j < i; j++)
                pthread_join(gw->threads[j].tid, NULL);
            return rc;
        }
    }
    if (gw->cfg.port_file && write_port_file(gw->cfg.port_file, gw) < 0)
        kvg_log_error("cannot write port file %s", gw->cfg.port_file);
    kvg_log_info("kvgate %s running with %u threads, %zu workers", KVG_VERSION, gw->nthreads,
                 gw->cfg.nworkers);
    event_base_dispatch(gw->control.base);
    for (unsigned i = 0; i < gw->nthreads; i++)
        pthread_join(gw->threads[i].tid, NULL);
    kvg_log_info("stopped");
    return 0;
}

void kvg_gateway_free(kvg_gateway *gw)
{
    if (!gw)
        return;
    kvg_health_stop(gw);
    kvg_scrape_stop(gw);
    kvg_kv_consumer_stop(gw->kv_events); /* it writes the router's index */
    gw->kv_events = NULL;
    kvg_offload_free(gw->offload); /* before the threads: its jobs complete into their sinks */
    gw->offload = NULL;
    for (unsigned i = 0; i < gw->nthreads_ready; i++) {
        kvg_thread_close_listeners(&gw->threads[i]);
        kvg_thread_done(&gw->threads[i]);
    }
    if (gw->control_ready) {
        kvg_thread_close_listeners(&gw->control);
        /* Admin connections left at exit are freed by their deferred close events. */
        event_base_loop(gw->control.base, EVLOOP_NONBLOCK);
    }
    if (gw->sig_term)
        event_free(gw->sig_term);
    if (gw->sig_int)
        event_free(gw->sig_int);
    if (gw->sig_hup)
        event_free(gw->sig_hup);
    if (gw->shutdown_timer)
        event_free(gw->shutdown_timer);
    if (gw->ready_delay_timer)
        event_free(gw->ready_delay_timer);
    if (gw->control_ready)
        kvg_thread_done(&gw->control);
    free(gw->threads);
    for (size_t i = 0; i < gw->nlisteners; i++)
        if (gw->listeners[i].has_tls)
            kvg_tls_slot_done(&gw->listeners[i].tls);
    for (size_t i = 0; i < gw->nadmin_listeners; i++)
        if (gw->admin_listeners[i].has_tls)
            kvg_tls_slot_done(&gw->admin_listeners[i].tls);
    if (gw->access_log_fd >= 0)
        close(gw->access_log_fd);
    kvg_admin_free(gw->admin);
    kvg_redis_free(gw->redis); /* after the admin (its state sync) and the threads (clients) */
    kvg_hash_batcher_free(gw->hasher); /* after the threads (their sinks) */
    kvg_router_free(gw->router);
    kvg_policy_state_free(gw->policy);
    kvg_tenants_free(gw->tenants);
    kvg_registry_free(gw->registry);
    kvg_model_registry_free(gw->models); /* after the threads and the admin API, its readers */
    explicit_bzero(gw->secret, sizeof(gw->secret));
    kvg_config_done(&gw->cfg);
    free(gw);
}
