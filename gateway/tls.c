/* SPDX-License-Identifier: Apache-2.0 */
/* TLS contexts for listeners: certificate, protocol floor and ciphers from the settings, ALPN
 * h2 / http/1.1, and the slot a reload swaps a listener's context in. */
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "tls.h"

static const unsigned char alpn_protos[] = "\x02h2\x08http/1.1";

/* Prefer h2 when the client offers it; fall back to http/1.1; refuse anything else. */
static int alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                       const unsigned char *in, unsigned int inlen, void *arg)
{
    unsigned char *sel;
    unsigned char sel_len;
    if (SSL_select_next_proto(&sel, &sel_len, alpn_protos, sizeof(alpn_protos) - 1, in, inlen) !=
        OPENSSL_NPN_NEGOTIATED)
        return SSL_TLSEXT_ERR_ALERT_FATAL;
    *out = sel;
    *outlen = sel_len;
    return SSL_TLSEXT_ERR_OK;
}

/* The OpenSSL error queue, once, into err. */
static void tls_error(char *err, size_t err_len, const char *what, const char *path)
{
    unsigned long e = ERR_get_error();
    char buf[256] = "unknown error";
    if (e)
        ERR_error_string_n(e, buf, sizeof(buf));
    snprintf(err, err_len, "%s%s%s: %s", what, path ? " " : "", path ? path : "", buf);
    ERR_clear_error();
}

static bool is_tls13(const SSL_CIPHER *c)
{
    return strcmp(SSL_CIPHER_get_version(c), "TLSv1.3") == 0;
}

/* A TLS 1.3 suite of ctx named name (OpenSSL ignores names it does not know, so a typo would
 * otherwise pass silently and leave fewer suites than the operator thinks). */
static bool has_tls13_suite(SSL_CTX *ctx, const char *name, size_t len)
{
    STACK_OF(SSL_CIPHER) *sk = SSL_CTX_get_ciphers(ctx);
    for (int i = 0; sk && i < sk_SSL_CIPHER_num(sk); i++) {
        const SSL_CIPHER *c = sk_SSL_CIPHER_value(sk, i);
        const char *std = SSL_CIPHER_standard_name(c);
        if (is_tls13(c) && std && strlen(std) == len && memcmp(std, name, len) == 0)
            return true;
    }
    return false;
}

static bool has_cipher_below_13(SSL_CTX *ctx)
{
    STACK_OF(SSL_CIPHER) *sk = SSL_CTX_get_ciphers(ctx);
    for (int i = 0; sk && i < sk_SSL_CIPHER_num(sk); i++)
        if (!is_tls13(sk_SSL_CIPHER_value(sk, i)))
            return true;
    return false;
}

/* Protocol floor, options and ciphers of ts on ctx: the one place settings reach OpenSSL, for
 * the check and for the listeners alike. */
static int apply_settings(SSL_CTX *ctx, const kvg_tls_settings *ts, char *err, size_t err_len)
{
    int floor = ts->min_version == KVG_TLS_MIN_1_3 ? TLS1_3_VERSION : TLS1_2_VERSION;
    if (SSL_CTX_set_min_proto_version(ctx, floor) != 1) {
        tls_error(err, err_len, "tls.min_version: not supported by this OpenSSL", NULL);
        return KVG_ECONFIG;
    }
    SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION |
                                 SSL_OP_CIPHER_SERVER_PREFERENCE | SSL_OP_NO_TICKET |
                                 SSL_OP_IGNORE_UNEXPECTED_EOF);
    if (SSL_CTX_set_cipher_list(ctx, ts->ciphers) != 1) {
        ERR_clear_error();
        snprintf(err, err_len, "tls.ciphers: \"%.200s\" matches no TLS 1.2 cipher", ts->ciphers);
        return KVG_ECONFIG;
    }
    if (ts->min_version == KVG_TLS_MIN_1_2 && !has_cipher_below_13(ctx)) {
        snprintf(err, err_len, "tls.ciphers: \"%.200s\" leaves no TLS 1.2 cipher", ts->ciphers);
        return KVG_ECONFIG;
    }
    if (SSL_CTX_set_ciphersuites(ctx, ts->ciphersuites) != 1) {
        ERR_clear_error();
        snprintf(err, err_len, "tls.ciphersuites: \"%.200s\" is not a TLS 1.3 suite list",
                 ts->ciphersuites);
        return KVG_ECONFIG;
    }
    for (const char *p = ts->ciphersuites; *p;) {
        size_t n = strcspn(p, ":");
        if (n && !has_tls13_suite(ctx, p, n)) {
            snprintf(err, err_len,
                     "tls.ciphersuites: unknown TLS 1.3 suite \"%.*s\" (known: "
                     "TLS_AES_256_GCM_SHA384, TLS_CHACHA20_POLY1305_SHA256, "
                     "TLS_AES_128_GCM_SHA256, TLS_AES_128_CCM_SHA256, TLS_AES_128_CCM_8_SHA256)",
                     (int)KVG_MIN(n, 64), p);
            return KVG_ECONFIG;
        }
        p += n;
        if (*p == ':')
            p++;
    }
    return 0;
}

int kvg_tls_settings_check(const kvg_tls_settings *ts, char *err, size_t err_len)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx) {
        tls_error(err, err_len, "cannot create a TLS context", NULL);
        return KVG_ECONFIG;
    }
    int rc = apply_settings(ctx, ts, err, err_len);
    SSL_CTX_free(ctx);
    return rc;
}

static void cert_info(SSL_CTX *ctx, kvg_tls_cert_info *info)
{
    memset(info, 0, sizeof(*info));
    X509 *x = SSL_CTX_get0_certificate(ctx);
    if (!x)
        return;
    X509_NAME_oneline(X509_get_subject_name(x), info->subject, sizeof(info->subject));
    const ASN1_TIME *na = X509_get0_notAfter(x);
    struct tm tm;
    if (na && ASN1_TIME_to_tm(na, &tm) == 1)
        info->not_after_s = (int64_t)timegm(&tm);
    BIO *b = BIO_new(BIO_s_mem());
    if (b && na && ASN1_TIME_print(b, na) == 1) {
        int n = BIO_read(b, info->not_after, (int)sizeof(info->not_after) - 1);
        info->not_after[n > 0 ? n : 0] = '\0';
    }
    BIO_free(b);
}

int kvg_tls_ctx_new(const kvg_listener_config *cfg, const kvg_tls_settings *ts, SSL_CTX **out,
                    kvg_tls_cert_info *info, char *err, size_t err_len)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx) {
        tls_error(err, err_len, "cannot create TLS context", NULL);
        return KVG_ETLS;
    }
    if (apply_settings(ctx, ts, err, err_len) < 0)
        goto fail_ctx;
    if (SSL_CTX_use_certificate_chain_file(ctx, cfg->tls_cert) != 1) {
        tls_error(err, err_len, "cannot load certificate", cfg->tls_cert);
        goto fail_ctx;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, cfg->tls_key, SSL_FILETYPE_PEM) != 1) {
        tls_error(err, err_len, "cannot load private key", cfg->tls_key);
        goto fail_ctx;
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
        tls_error(err, err_len, "private key does not match certificate", cfg->tls_key);
        goto fail_ctx;
    }
    SSL_CTX_set_alpn_select_cb(ctx, alpn_select, NULL);
    if (info)
        cert_info(ctx, info);
    *out = ctx;
    return 0;
fail_ctx:
    SSL_CTX_free(ctx);
    return KVG_ETLS;
}

bool kvg_tls_is_h2(SSL *ssl)
{
    const unsigned char *proto = NULL;
    unsigned int len = 0;
    SSL_get0_alpn_selected(ssl, &proto, &len);
    return proto && len == 2 && memcmp(proto, "h2", 2) == 0;
}

/* ---- the slot ------------------------------------------------------------------------------ */

/* A mutex rather than an atomic pointer: a reader must take its reference before a reload can
 * drop the slot's, and SSL_new does that inside OpenSSL. It is held for one up_ref, once per
 * TLS connection, next to a handshake that costs a thousand times more. */

void kvg_tls_slot_init(kvg_tls_slot *slot, SSL_CTX *ctx, int64_t not_after_s)
{
    pthread_mutex_init(&slot->lock, NULL);
    slot->ctx = ctx;
    atomic_store(&slot->not_after_s, not_after_s);
}

void kvg_tls_slot_done(kvg_tls_slot *slot)
{
    SSL_CTX_free(slot->ctx);
    slot->ctx = NULL;
    pthread_mutex_destroy(&slot->lock);
}

SSL *kvg_tls_slot_ssl_new(kvg_tls_slot *slot)
{
    pthread_mutex_lock(&slot->lock);
    SSL_CTX *ctx = slot->ctx;
    SSL_CTX_up_ref(ctx);
    pthread_mutex_unlock(&slot->lock);
    SSL *ssl = SSL_new(ctx); /* holds a reference of its own */
    SSL_CTX_free(ctx);
    return ssl;
}

void kvg_tls_slot_replace(kvg_tls_slot *slot, SSL_CTX *ctx, int64_t not_after_s)
{
    pthread_mutex_lock(&slot->lock);
    SSL_CTX *old = slot->ctx;
    slot->ctx = ctx;
    atomic_store(&slot->not_after_s, not_after_s);
    pthread_mutex_unlock(&slot->lock);
    SSL_CTX_free(old);
}
