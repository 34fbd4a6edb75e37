#include "alloc_track.h"

#include <stdatomic.h>

static _Atomic size_t largest;

static void note(size_t n)
{
    size_t cur = atomic_load_explicit(&largest, memory_order_relaxed);

    while (n > cur &&
           !atomic_compare_exchange_weak_explicit(&largest, &cur, n, memory_order_relaxed,
                                                  memory_order_relaxed))
        ;
}

#if defined(__SANITIZE_ADDRESS__)
/* From the sanitizer runtime (gcc ships no header for it). */
int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void *, size_t),
                                              void (*free_hook)(const volatile void *));

static void on_malloc(const volatile void *p, size_t n)
{
    note(n);
}

static void on_free(const volatile void *p)
{
}

__attribute__((constructor)) static void install(void)
{
    __sanitizer_install_malloc_and_free_hooks(on_malloc, on_free);
}
#else
/* glibc's own entry points: memory from them is released by its free(). */
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t n);

void *malloc(size_t n)
{
    note(n);
    return __libc_malloc(n);
}

void *calloc(size_t n, size_t size)
{
    note(size && n > (size_t)-1 / size ? (size_t)-1 : n * size);
    return __libc_calloc(n, size);
}

void *realloc(void *p, size_t n)
{
    note(n);
    return __libc_realloc(p, n);
}
#endif

void alloc_track_reset(void)
{
    atomic_store(&largest, 0);
}

size_t alloc_track_largest(void)
{
    return atomic_load(&largest);
}
