/* SPDX-License-Identifier: Apache-2.0 */
/* Link-time wrappers of the allocator that fail one chosen allocation (see fail_alloc.h). */
#include "fail_alloc.h"

#include <stdatomic.h>
#include <stddef.h>

void *__real_malloc(size_t size);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t size);
void *__wrap_malloc(size_t size);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t size);

/* Allocations left before the failing one; negative when disarmed. */
static _Atomic long countdown = -1;
static _Atomic bool injected;

static bool should_fail(void)
{
    long c = atomic_load(&countdown);
    while (c >= 0) {
        if (atomic_compare_exchange_weak(&countdown, &c, c - 1)) {
            if (c == 0) {
                atomic_store(&injected, true);
                return true;
            }
            return false;
        }
    }
    return false;
}

void fail_alloc_nth(long n)
{
    atomic_store(&injected, false);
    atomic_store(&countdown, n);
}

bool fail_alloc_off(void)
{
    atomic_store(&countdown, -1);
    return atomic_load(&injected);
}

void *__wrap_malloc(size_t size)
{
    return should_fail() ? NULL : __real_malloc(size);
}

void *__wrap_calloc(size_t n, size_t size)
{
    return should_fail() ? NULL : __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t size)
{
    return should_fail() ? NULL : __real_realloc(p, size);
}
