/* SPDX-License-Identifier: Apache-2.0 */
/* The checks start-up makes before it binds a port, shared by kvg_gateway_new and
 * `kvgate --check-config` (preflight.c), so that the check says what a start would say. */
#ifndef KVG_GATEWAY_PREFLIGHT_H
#define KVG_GATEWAY_PREFLIGHT_H

#include <stdbool.h>
#include <stddef.h>

#include "config.h"
#include "tls.h"

/* The TLS contexts start-up built, per listener: [0] front, [1] admin; NULL without TLS. */
typedef struct kvg_preflight {
    SSL_CTX *ctx[2][KVG_MAX_LISTENERS];
    kvg_tls_cert_info info[2][KVG_MAX_LISTENERS];
} kvg_preflight;

/** Every check of cfg that start-up makes short of binding the ports, contacting Redis or
 *  opening a GPU: the cross-field rules (kvg_config_validate), the TLS settings, each TLS
 *  listener's certificate and key (loaded, matched), the state directory (usable, or can be
 *  made), the server secret (KVGATE_SECRET, `secret` or STATE/secret: at least 32
 *  characters), the admin token, and that the access log, audit log and state file can be
 *  opened. dry_run (--check-config) creates nothing; otherwise a missing state directory is
 *  made. On success pf holds the contexts (kvg_preflight_done frees those not taken). 0, or
 *  KVG_ECONFIG / KVG_ETLS with err saying what and where. */
int kvg_preflight_run(const kvg_config *cfg, bool dry_run, kvg_preflight *pf, char *err,
                      size_t err_len);
void kvg_preflight_done(kvg_preflight *pf);

/** A secret kept in the state directory (STATE/name): read it, or, when create, make 32
 *  random bytes (hex, mode 0600) on first start. *generated says which. A file of fewer than
 *  16 characters is replaced when create. 0, -ENOENT (absent, !create), -ENOMEM or -errno. */
int kvg_state_secret(const char *state_dir, const char *name, bool create, char **out,
                     bool *generated);

/** The server secret: KVGATE_SECRET, the config's `secret`, else STATE/secret (made when
 *  create). *out is NULL when it would be generated (!create). 0, or KVG_ECONFIG (shorter
 *  than 32 characters: err names where it came from), -ENOMEM or -errno (err says). */
int kvg_server_secret(const kvg_config *cfg, bool create, char **out, bool *generated, char *err,
                      size_t err_len);

#endif
