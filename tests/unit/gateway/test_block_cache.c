/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the per-thread block cache under libevent and nghttp2: reuse on the caching
 * thread only, the bound per class, realloc across classes, calloc, frees from other threads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <string.h>

#include "block_cache.h"

typedef void (*body_fn)(void);

static void *run_body(void *arg)
{
    body_fn *fn = arg;
    (*fn)();
    return NULL;
}

/* Each case runs on a thread of its own, so that its cache is drained (and checked by
 * LeakSanitizer) when the thread exits. */
static void on_thread(body_fn fn)
{
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, run_body, &fn), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
}

static void reuse_body(void)
{
    kvg_block_cache_thread();
    assert_int_equal(kvg_block_cache_kept(), 0);
    unsigned char *p = kvg_block_malloc(1000);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % 16, 0);
    memset(p, 0xab, 1000);
    kvg_block_free(p);
    assert_int_equal(kvg_block_cache_kept(), 1024);
    unsigned char *q = kvg_block_malloc(513); /* the same class: the kept block */
    assert_ptr_equal(q, p);
    assert_int_equal(kvg_block_cache_kept(), 0);
    unsigned char *r = kvg_block_malloc(512); /* the class below: a new block */
    assert_ptr_not_equal(r, p);
    kvg_block_free(q);
    kvg_block_free(r);
    assert_int_equal(kvg_block_cache_kept(), 1024 + 512);
    /* Above the largest class: never kept. */
    void *big = kvg_block_malloc(16 * 1024 + 1);
    assert_non_null(big);
    kvg_block_free(big);
    assert_int_equal(kvg_block_cache_kept(), 1024 + 512);
    kvg_block_free(NULL);
}

static void test_reuse_on_caching_thread(void **state)
{
    on_thread(reuse_body);
}

static void plain_body(void)
{
    void *p = kvg_block_malloc(1000);
    assert_non_null(p);
    kvg_block_free(p);
    assert_int_equal(kvg_block_cache_kept(), 0);
}

static void test_no_cache_elsewhere(void **state)
{
    on_thread(plain_body);
}

static void bound_body(void)
{
    kvg_block_cache_thread();
    enum { N = 300 };
    void *p[N];
    for (int i = 0; i < N; i++)
        assert_non_null(p[i] = kvg_block_malloc(4096));
    for (int i = 0; i < N; i++)
        kvg_block_free(p[i]);
    assert_int_equal(kvg_block_cache_kept(), 256 * 1024); /* 64 blocks of 4 KiB */
}

static void test_bound_per_class(void **state)
{
    on_thread(bound_body);
}

static void fill(unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(i * 7 + 1);
}

static void check(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        assert_int_equal(p[i], (unsigned char)(i * 7 + 1));
}

static void realloc_body(void)
{
    kvg_block_cache_thread();
    unsigned char *p = kvg_block_realloc(NULL, 300);
    assert_non_null(p);
    fill(p, 300);
    assert_ptr_equal(kvg_block_realloc(p, 512), p); /* still its class */
    unsigned char *q = kvg_block_realloc(p, 3000);  /* a larger class: moved, kept */
    assert_non_null(q);
    check(q, 300);
    fill(q, 3000);
    unsigned char *big = kvg_block_realloc(q, 40000); /* out of the classes */
    assert_non_null(big);
    check(big, 3000);
    fill(big, 40000);
    unsigned char *bigger = kvg_block_realloc(big, 100000);
    assert_non_null(bigger);
    check(bigger, 40000);
    unsigned char *small = kvg_block_realloc(bigger, 200); /* back into a class */
    assert_non_null(small);
    check(small, 200);
    kvg_block_free(small);
}

static void test_realloc_across_classes(void **state)
{
    on_thread(realloc_body);
}

static void test_nghttp2_calloc(void **state)
{
    nghttp2_mem *mem = kvg_block_cache_nghttp2_mem();
    unsigned char *p = mem->malloc(100, NULL);
    assert_non_null(p);
    memset(p, 0xff, 100);
    mem->free(p, NULL);
    unsigned char *z = mem->calloc(10, 10, NULL);
    assert_non_null(z);
    for (int i = 0; i < 100; i++)
        assert_int_equal(z[i], 0);
    mem->free(z, NULL);
    assert_null(mem->calloc(SIZE_MAX / 2, 3, NULL));
    assert_null(kvg_block_malloc(SIZE_MAX - 8));
}

static void *made;

static void make_body(void)
{
    made = kvg_block_malloc(2000);
    assert_non_null(made);
}

static void free_body(void)
{
    kvg_block_cache_thread();
    kvg_block_free(made); /* made on another thread: joins this one's cache */
    assert_int_equal(kvg_block_cache_kept(), 2048);
    assert_ptr_equal(kvg_block_malloc(2048), made);
    kvg_block_free(made);
}

static void test_free_from_other_thread(void **state)
{
    on_thread(make_body);
    on_thread(free_body);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reuse_on_caching_thread),
        cmocka_unit_test(test_no_cache_elsewhere),
        cmocka_unit_test(test_bound_per_class),
        cmocka_unit_test(test_realloc_across_classes),
        cmocka_unit_test(test_nghttp2_calloc),
        cmocka_unit_test(test_free_from_other_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
