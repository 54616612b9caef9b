/* SPDX-License-Identifier: Apache-2.0 */
/* TLS contexts of listeners, their settings and the slot through which a reload swaps them
 * (tls.c). */
#ifndef KVG_GATEWAY_TLS_H
#define KVG_GATEWAY_TLS_H

#include <openssl/ssl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

/* What a loaded certificate says, for the log and the expiry metric. */
typedef struct kvg_tls_cert_info {
    char subject[256];   /* one-line distinguished name */
    char not_after[64];  /* as OpenSSL prints it ("Dec  2 01:02:03 2027 GMT") */
    int64_t not_after_s; /* Unix time of the expiry */
} kvg_tls_cert_info;

/** Check the TLS settings against OpenSSL: a cipher list that matches no cipher, an unknown
 *  TLS 1.3 suite, no TLS 1.3 suite left with min_version 1.3. 0, or KVG_ECONFIG with err
 *  ("tls.ciphers: ..."). Builds and frees a context; touches no file. */
int kvg_tls_settings_check(const kvg_tls_settings *ts, char *err, size_t err_len);

/** Build the TLS context of a listener (ALPN h2, http/1.1) from its certificate chain and key
 *  files under the settings ts. On success *out holds one reference (SSL_CTX_free) and info,
 *  when given, what the certificate says. 0 or KVG_ETLS with err naming the file and
 *  OpenSSL's reason. */
int kvg_tls_ctx_new(const kvg_listener_config *cfg, const kvg_tls_settings *ts, SSL_CTX **out,
                    kvg_tls_cert_info *info, char *err, size_t err_len);

/** Selected ALPN protocol of a finished handshake is "h2". */
bool kvg_tls_is_h2(SSL *ssl);

/* The context a TLS listener gives new connections, shared by the threads that accept on it
 * and swapped by a reload. A connection's SSL holds its own reference to the context it was
 * made from (OpenSSL counts them), so a swap never disturbs connections already open: the old
 * context goes when the last of them does. */
typedef struct kvg_tls_slot {
    pthread_mutex_t lock;
    SSL_CTX *ctx;                /* guarded by lock */
    _Atomic int64_t not_after_s; /* expiry of ctx's certificate, for the metric */
} kvg_tls_slot;

/** Set up slot with ctx (taken over). */
void kvg_tls_slot_init(kvg_tls_slot *slot, SSL_CTX *ctx, int64_t not_after_s);
/** Free the slot's reference; no connection may be accepted on it any more. */
void kvg_tls_slot_done(kvg_tls_slot *slot);
/** A new SSL for an accepted connection from the context in force; NULL on no memory. Any
 *  thread. */
SSL *kvg_tls_slot_ssl_new(kvg_tls_slot *slot);
/** Put ctx (taken over) in force for new connections; the old context's reference is dropped.
 *  Any thread. */
void kvg_tls_slot_replace(kvg_tls_slot *slot, SSL_CTX *ctx, int64_t not_after_s);

#endif
