/* SPDX-License-Identifier: Apache-2.0 */
/* TLS contexts for listeners: certificate, modern protocol floor, ALPN h2 / http/1.1. */
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <string.h>

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
    snprintf(err, err_len, "%s %s: %s", what, path ? path : "", buf);
    ERR_clear_error();
}

int kvg_tls_ctx_new(const kvg_listener_config *cfg, SSL_CTX **out, char *err, size_t err_len)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx) {
        tls_error(err, err_len, "cannot create TLS context", NULL);
        return KVG_ETLS;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION |
                                 SSL_OP_CIPHER_SERVER_PREFERENCE | SSL_OP_NO_TICKET |
                                 SSL_OP_IGNORE_UNEXPECTED_EOF);
    /* TLS 1.2 suites that RFC 9113 (HTTP/2) accepts: AEAD with ephemeral keys only. */
    if (SSL_CTX_set_cipher_list(ctx, "ECDHE+AESGCM:ECDHE+CHACHA20:DHE+AESGCM:DHE+CHACHA20") != 1) {
        tls_error(err, err_len, "cannot set ciphers", NULL);
        goto fail_ctx;
    }
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
