/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for TLS settings, listener contexts and the slot a reload swaps (gateway/tls.c),
 * and for the start-up checks' secret rules (gateway/preflight.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "preflight.h"
#include "tls.h"

static char dir[64];
static char cert_path[128], key_path[128], other_key_path[128];

static EVP_PKEY *write_key(const char *path)
{
    EVP_PKEY *k = EVP_EC_gen("P-256");
    assert_non_null(k);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(PEM_write_PrivateKey(f, k, NULL, NULL, 0, NULL, NULL), 1);
    fclose(f);
    return k;
}

/* A self-signed certificate for CN=cn, valid for days, with its key, in dir. */
static int64_t write_cert(const char *cn, long days)
{
    EVP_PKEY *k = write_key(key_path);
    X509 *x = X509_new();
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), 0);
    X509_gmtime_adj(X509_getm_notAfter(x), days * 86400);
    X509_set_pubkey(x, k);
    X509_NAME *name = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1, 0);
    X509_set_issuer_name(x, name);
    assert_true(X509_sign(x, k, EVP_sha256()) > 0);
    FILE *f = fopen(cert_path, "w");
    assert_non_null(f);
    PEM_write_X509(f, x);
    fclose(f);
    struct tm tm;
    assert_int_equal(ASN1_TIME_to_tm(X509_get0_notAfter(x), &tm), 1);
    X509_free(x);
    EVP_PKEY_free(k);
    return (int64_t)timegm(&tm);
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/kvgate-test-tls-XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(cert_path, sizeof(cert_path), "%s/cert.pem", dir);
    snprintf(key_path, sizeof(key_path), "%s/key.pem", dir);
    snprintf(other_key_path, sizeof(other_key_path), "%s/other.pem", dir);
    EVP_PKEY_free(write_key(other_key_path));
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static kvg_tls_settings defaults(kvg_config *cfg)
{
    assert_int_equal(kvg_config_init(cfg), 0);
    return cfg->tls;
}

static void test_settings(void **state)
{
    (void)state;
    kvg_config cfg;
    kvg_tls_settings ts = defaults(&cfg);
    char err[512];
    assert_int_equal(ts.min_version, KVG_TLS_MIN_1_2);
    assert_int_equal(kvg_tls_settings_check(&ts, err, sizeof(err)), 0);
    ts.min_version = KVG_TLS_MIN_1_3;
    assert_int_equal(kvg_tls_settings_check(&ts, err, sizeof(err)), 0);

    ts = cfg.tls;
    ts.ciphers = "NO-SUCH-CIPHER";
    assert_int_equal(kvg_tls_settings_check(&ts, err, sizeof(err)), KVG_ECONFIG);
    assert_non_null(strstr(err, "tls.ciphers: \"NO-SUCH-CIPHER\" matches no TLS 1.2 cipher"));

    ts = cfg.tls;
    ts.ciphersuites = "TLS_AES_128_GCM_SHA256:TLS_TYPO";
    assert_int_equal(kvg_tls_settings_check(&ts, err, sizeof(err)), KVG_ECONFIG);
    assert_non_null(strstr(err, "unknown TLS 1.3 suite \"TLS_TYPO\""));
    ts.ciphersuites = "TLS_CHACHA20_POLY1305_SHA256";
    assert_int_equal(kvg_tls_settings_check(&ts, err, sizeof(err)), 0);
    kvg_config_done(&cfg);
}

static void test_settings_from_the_file(void **state)
{
    (void)state;
    kvg_config cfg;
    assert_int_equal(kvg_config_init(&cfg), 0);
    char cfg_path[128];
    snprintf(cfg_path, sizeof(cfg_path), "%s/cfg.json", dir);
    FILE *f = fopen(cfg_path, "w");
    fputs("{\"tls\": {\"min_version\": \"1.3\", \"ciphers\": \"ECDHE+AESGCM\"},"
          " \"shutdown_ready_delay_ms\": 5000,"
          " \"probes\": {\"ready_requires_worker\": false, \"front_readyz\": \"/rz\"}}",
          f);
    fclose(f);
    char err[512];
    assert_int_equal(kvg_config_load_file(&cfg, cfg_path, err, sizeof(err)), 0);
    assert_int_equal(cfg.tls.min_version, KVG_TLS_MIN_1_3);
    assert_string_equal(cfg.tls.ciphers, "ECDHE+AESGCM");
    assert_int_equal(cfg.shutdown_ready_delay_ms, 5000);
    assert_false(cfg.probes.ready_requires_worker);
    assert_null(cfg.probes.front_healthz);
    assert_string_equal(cfg.probes.front_readyz, "/rz");
    kvg_config_done(&cfg);
}

static void test_context_and_cert_info(void **state)
{
    (void)state;
    kvg_config cfg;
    kvg_tls_settings ts = defaults(&cfg);
    int64_t expiry = write_cert("unit-one", 10);
    kvg_listener_config l = {.address = "127.0.0.1:0", .tls_cert = cert_path, .tls_key = key_path};
    SSL_CTX *ctx = NULL;
    kvg_tls_cert_info info;
    char err[512];
    assert_int_equal(kvg_tls_ctx_new(&l, &ts, &ctx, &info, err, sizeof(err)), 0);
    assert_string_equal(info.subject, "/CN=unit-one");
    assert_true(info.not_after_s == expiry);
    assert_true(info.not_after[0] != '\0');
    SSL_CTX_free(ctx);

    /* A key of another certificate, a missing file: KVG_ETLS, named. */
    l.tls_key = other_key_path;
    assert_int_equal(kvg_tls_ctx_new(&l, &ts, &ctx, &info, err, sizeof(err)), KVG_ETLS);
    assert_non_null(strstr(err, other_key_path));
    l.tls_key = key_path;
    l.tls_cert = "/nonexistent/cert.pem";
    assert_int_equal(kvg_tls_ctx_new(&l, &ts, &ctx, &info, err, sizeof(err)), KVG_ETLS);
    assert_non_null(strstr(err, "cannot load certificate /nonexistent/cert.pem"));
    kvg_config_done(&cfg);
}

/* A connection made before a swap keeps its context alive and usable; new ones get the new. */
static void test_slot_swap(void **state)
{
    (void)state;
    kvg_config cfg;
    kvg_tls_settings ts = defaults(&cfg);
    kvg_listener_config l = {.address = "127.0.0.1:0", .tls_cert = cert_path, .tls_key = key_path};
    char err[512];
    kvg_tls_cert_info info;
    SSL_CTX *a = NULL, *b = NULL;
    int64_t ea = write_cert("unit-a", 3);
    assert_int_equal(kvg_tls_ctx_new(&l, &ts, &a, &info, err, sizeof(err)), 0);
    int64_t eb = write_cert("unit-b", 30);
    assert_int_equal(kvg_tls_ctx_new(&l, &ts, &b, &info, err, sizeof(err)), 0);

    kvg_tls_slot slot;
    kvg_tls_slot_init(&slot, a, ea);
    SSL *before = kvg_tls_slot_ssl_new(&slot);
    assert_non_null(before);
    assert_ptr_equal(SSL_get_SSL_CTX(before), a);
    kvg_tls_slot_replace(&slot, b, eb);
    assert_true(atomic_load(&slot.not_after_s) == eb);
    SSL *after = kvg_tls_slot_ssl_new(&slot);
    assert_ptr_equal(SSL_get_SSL_CTX(after), b);
    /* The old context is still whole: its certificate is readable through the old SSL. */
    X509 *x = SSL_get_certificate(before);
    assert_non_null(x);
    char subject[64];
    X509_NAME_oneline(X509_get_subject_name(x), subject, sizeof(subject));
    assert_string_equal(subject, "/CN=unit-a");
    SSL_free(before); /* the last reference to a: freed here (ASan would see a leak or reuse) */
    SSL_free(after);
    kvg_tls_slot_done(&slot);
    kvg_config_done(&cfg);
}

static void test_server_secret_rules(void **state)
{
    (void)state;
    kvg_config cfg;
    assert_int_equal(kvg_config_init(&cfg), 0);
    char state_dir[128];
    snprintf(state_dir, sizeof(state_dir), "%s/state", dir);
    cfg.state_dir = state_dir;
    char err[512];
    char *secret = NULL;
    bool generated = true;

    setenv("KVGATE_SECRET", "too-short", 1);
    assert_int_equal(kvg_server_secret(&cfg, false, &secret, &generated, err, sizeof(err)),
                     KVG_ECONFIG);
    assert_non_null(strstr(err, "KVGATE_SECRET is 9 characters: it must be at least 32"));
    assert_null(secret);
    unsetenv("KVGATE_SECRET");

    /* No state directory yet: start-up would generate one; a check creates nothing. */
    assert_int_equal(kvg_server_secret(&cfg, false, &secret, &generated, err, sizeof(err)), 0);
    assert_null(secret);
    struct stat st;
    assert_int_equal(stat(state_dir, &st), -1);

    /* A short secret file is refused, a long one read back. */
    assert_int_equal(mkdir(state_dir, 0700), 0);
    char path[200];
    snprintf(path, sizeof(path), "%s/secret", state_dir);
    FILE *f = fopen(path, "w");
    fputs("0123456789abcdef0123\n", f);
    fclose(f);
    assert_int_equal(kvg_server_secret(&cfg, false, &secret, &generated, err, sizeof(err)),
                     KVG_ECONFIG);
    assert_non_null(strstr(err, "secret file is 20 characters"));
    f = fopen(path, "w");
    fputs("0123456789abcdef0123456789abcdef\n", f);
    fclose(f);
    assert_int_equal(kvg_server_secret(&cfg, true, &secret, &generated, err, sizeof(err)), 0);
    assert_string_equal(secret, "0123456789abcdef0123456789abcdef");
    assert_false(generated);
    free(secret);
    cfg.state_dir = NULL;
    kvg_config_done(&cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_settings),
        cmocka_unit_test(test_settings_from_the_file),
        cmocka_unit_test(test_context_and_cert_info),
        cmocka_unit_test(test_slot_swap),
        cmocka_unit_test(test_server_secret_rules),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
