/* SPDX-License-Identifier: Apache-2.0 */
/* The checks start-up makes before binding its ports, in one place so that --check-config
 * runs the very same ones (a config that passes it starts, unless a port, Redis or the GPU
 * says otherwise). */
#include "preflight.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model.h"
#include "tenancy.h"

int kvg_state_secret(const char *state_dir, const char *name, bool create, char **out,
                     bool *generated)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/%s", state_dir, name);
    *generated = false;
    kvg_buf b;
    kvg_buf_init(&b);
    int rc = kvg_state_read_file(path, 4096, &b);
    if (rc == 0) {
        size_t n = b.len;
        while (n && (b.data[n - 1] == '\n' || b.data[n - 1] == '\r'))
            n--;
        if (n >= 16 || !create) {
            *out = strndup(b.data ? b.data : "", n);
            kvg_buf_done(&b);
            return *out ? 0 : -ENOMEM;
        }
    }
    kvg_buf_done(&b);
    if (rc < 0 && rc != -ENOENT)
        return rc;
    if (!create)
        return -ENOENT;
    unsigned char raw[32];
    rc = kvg_random_bytes(raw, sizeof(raw));
    if (rc < 0)
        return rc;
    char hex[66];
    kvg_hex_encode(raw, sizeof(raw), hex);
    hex[64] = '\n';
    hex[65] = '\0';
    rc = kvg_state_write_file(path, hex, 65, 0600);
    if (rc < 0)
        return rc;
    *generated = true;
    hex[64] = '\0';
    *out = strdup(hex);
    return *out ? 0 : -ENOMEM;
}

int kvg_server_secret(const kvg_config *cfg, bool create, char **out, bool *generated, char *err,
                      size_t err_len)
{
    const char *env = getenv("KVGATE_SECRET");
    const char *from = "KVGATE_SECRET";
    char *secret = NULL;
    *generated = false;
    *out = NULL;
    int rc = 0;
    if (env && *env) {
        secret = strdup(env);
    } else if (cfg->secret) {
        from = "secret (config)";
        secret = strdup(cfg->secret);
    } else {
        from = "the state directory's secret file";
        rc = kvg_state_secret(cfg->state_dir, "secret", create, &secret, generated);
        if (rc == -ENOENT && !create)
            return 0; /* start-up would generate one */
    }
    if (rc < 0) {
        snprintf(err, err_len, "cannot read or create %s/secret: %s", cfg->state_dir,
                 kvg_strerror(rc));
        return rc;
    }
    if (!secret) {
        snprintf(err, err_len, "out of memory");
        return -ENOMEM;
    }
    size_t n = strlen(secret);
    if (n < 32) {
        snprintf(err, err_len,
                 "the server secret from %s is %zu characters: it must be at least 32", from, n);
        explicit_bzero(secret, n);
        free(secret);
        return KVG_ECONFIG;
    }
    *out = secret;
    return 0;
}

/* A file the gateway will open for writing (created when missing): it is writable, or its
 * folder exists and is writable, or that folder is inside the state directory (made at start,
 * whose own check comes first). */
static int writable_file(const char *what, const char *path, const char *state_dir, char *err,
                         size_t err_len)
{
    if (access(path, F_OK) == 0) {
        if (access(path, W_OK) == 0)
            return 0;
        snprintf(err, err_len, "%s %s: %s", what, path, strerror(errno));
        return KVG_ECONFIG;
    }
    char dir[4200];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        dir[1] = '\0';
    else if (slash)
        *slash = '\0';
    else
        snprintf(dir, sizeof(dir), ".");
    if (access(dir, W_OK | X_OK) == 0)
        return 0;
    size_t n = strlen(state_dir);
    if (errno == ENOENT && strncmp(dir, state_dir, n) == 0 && (dir[n] == '\0' || dir[n] == '/'))
        return 0;
    snprintf(err, err_len, "%s %s: cannot create it in %s: %s", what, path, dir, strerror(errno));
    return KVG_ECONFIG;
}

/* The state directory is a writable directory, or the nearest existing folder above it lets
 * it be made (mkdir -p at start). */
static int state_dir_usable(const char *dir, char *err, size_t err_len)
{
    char p[4200];
    snprintf(p, sizeof(p), "%s", dir);
    struct stat st;
    while (stat(p, &st) < 0) {
        if (errno != ENOENT) {
            snprintf(err, err_len, "state directory %s: %s: %s", dir, p, strerror(errno));
            return KVG_ECONFIG;
        }
        char *slash = strrchr(p, '/');
        if (!slash)
            snprintf(p, sizeof(p), ".");
        else if (slash == p)
            p[1] = '\0';
        else
            *slash = '\0';
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(err, err_len, "state directory %s: %s is not a directory", dir, p);
        return KVG_ECONFIG;
    }
    if (access(p, W_OK | X_OK) < 0) {
        snprintf(err, err_len, "state directory %s: %s%s: %s", dir,
                 strcmp(p, dir) == 0 ? "" : "cannot create it in ", p, strerror(errno));
        return KVG_ECONFIG;
    }
    return 0;
}

static int check_files(const kvg_config *cfg, char *err, size_t err_len)
{
    int rc = state_dir_usable(cfg->state_dir, err, err_len);
    if (rc < 0)
        return rc;
    char path[4200];
    if (strcmp(cfg->access_log, "-") != 0 && strcmp(cfg->access_log, "off") != 0 &&
        (rc = writable_file("access log", cfg->access_log, cfg->state_dir, err, err_len)) < 0)
        return rc;
    snprintf(path, sizeof(path), "%s/audit.log", cfg->state_dir);
    const char *audit = cfg->audit_log ? cfg->audit_log : path;
    if (strcmp(audit, "off") != 0 &&
        (rc = writable_file("audit log", audit, cfg->state_dir, err, err_len)) < 0)
        return rc;
    snprintf(path, sizeof(path), "%s/state.json", cfg->state_dir);
    const char *state = cfg->state_file ? cfg->state_file : path;
    if (access(state, F_OK) == 0 && access(state, R_OK | W_OK) < 0) {
        snprintf(err, err_len, "state file %s: %s", state, strerror(errno));
        return KVG_ECONFIG;
    }
    if (access(state, F_OK) < 0 &&
        (rc = writable_file("state file", state, cfg->state_dir, err, err_len)) < 0)
        return rc;
    return 0;
}

static int check_admin_token(const kvg_config *cfg, char *err, size_t err_len)
{
    const char *env = getenv("KVGATE_ADMIN_TOKEN");
    if (env && *env) {
        for (const char *p = env; *p; p++) {
            if ((unsigned char)*p <= ' ' || *p == 0x7f) {
                snprintf(err, err_len,
                         "KVGATE_ADMIN_TOKEN: must not contain spaces or control characters");
                return KVG_ECONFIG;
            }
        }
        return 0;
    }
    if (cfg->nadmin_tokens > 0)
        return 0; /* checked by the field table */
    char *token = NULL;
    bool generated;
    int rc = kvg_state_secret(cfg->state_dir, "admin-token", false, &token, &generated);
    if (token)
        explicit_bzero(token, strlen(token));
    free(token);
    if (rc < 0 && rc != -ENOENT) {
        snprintf(err, err_len, "cannot read %s/admin-token: %s", cfg->state_dir, kvg_strerror(rc));
        return KVG_ECONFIG;
    }
    return 0;
}

int kvg_preflight_run(const kvg_config *cfg, bool dry_run, kvg_preflight *pf, char *err,
                      size_t err_len)
{
    memset(pf, 0, sizeof(*pf));
    int rc = kvg_config_validate(cfg, err, err_len);
    if (rc == 0)
        rc = kvg_tls_settings_check(&cfg->tls, err, err_len);
    const kvg_listener_config *groups[2] = {cfg->listeners, cfg->admin_listeners};
    size_t counts[2] = {cfg->nlisteners, cfg->nadmin_listeners};
    for (int g = 0; rc == 0 && g < 2; g++) {
        for (size_t i = 0; rc == 0 && i < counts[g]; i++) {
            const kvg_listener_config *l = &groups[g][i];
            if (!l->tls_cert)
                continue;
            char why[512];
            rc = kvg_tls_ctx_new(l, &cfg->tls, &pf->ctx[g][i], &pf->info[g][i], why, sizeof(why));
            if (rc < 0)
                snprintf(err, err_len, "%slistener %s: %s", g ? "admin " : "", l->address, why);
        }
    }
    if (rc == 0)
        rc = check_files(cfg, err, err_len);
    if (rc == 0)
        rc = check_admin_token(cfg, err, err_len);
    /* --check-config reads the models' files as start-up will (start-up loads them into the
     * registry itself, so it does not read them twice). */
    for (size_t i = 0; rc == 0 && dry_run && i < cfg->nmodels; i++) {
        kvg_model *m = NULL;
        char why[512];
        rc = kvg_model_load(&cfg->models[i], &m, why, sizeof(why));
        if (rc < 0) {
            snprintf(err, err_len, "models: model \"%s\": %s", cfg->models[i].name, why);
            rc = KVG_ECONFIG;
        }
        kvg_model_free(m);
    }
    if (rc == 0 && dry_run) {
        /* Start-up reads (or makes) it later, once the state directory exists. */
        char *secret = NULL;
        bool generated;
        rc = kvg_server_secret(cfg, false, &secret, &generated, err, err_len);
        if (secret) {
            explicit_bzero(secret, strlen(secret));
            free(secret);
        }
        rc = rc < 0 ? KVG_ECONFIG : 0;
    }
    if (rc < 0)
        kvg_preflight_done(pf);
    return rc;
}

void kvg_preflight_done(kvg_preflight *pf)
{
    for (int g = 0; g < 2; g++) {
        for (size_t i = 0; i < KVG_MAX_LISTENERS; i++) {
            SSL_CTX_free(pf->ctx[g][i]);
            pf->ctx[g][i] = NULL;
        }
    }
}
