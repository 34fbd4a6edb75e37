#include "sf_buf.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sf_buf_init(sf_buf *b, size_t max)
{
    b->p = NULL;
    b->len = b->cap = 0;
    b->max = max;
}

void sf_buf_fini(sf_buf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

void sf_buf_reset(sf_buf *b)
{
    b->len = 0;
    if (b->p)
        b->p[0] = '\0';
}

static int buf_reserve(sf_buf *b, size_t n)
{
    size_t need, cap;
    char *p;

    if (n > b->max || b->len > b->max - n)
        return -E2BIG;
    need = b->len + n + 1;
    if (need <= b->cap)
        return 0;
    cap = b->cap ? b->cap : 256;
    while (cap < need)
        cap *= 2;
    if (cap > b->max + 1)
        cap = b->max + 1;
    p = realloc(b->p, cap);
    if (!p)
        return -ENOMEM;
    b->p = p;
    b->cap = cap;
    return 0;
}

int sf_buf_append(sf_buf *b, const void *data, size_t n)
{
    int rc = buf_reserve(b, n);
    if (rc < 0)
        return rc;
    if (n)
        memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

int sf_buf_appendf(sf_buf *b, const char *fmt, ...)
{
    va_list ap;
    int n, rc;

    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return -EINVAL;
    if ((rc = buf_reserve(b, (size_t)n)) < 0)
        return rc;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

void sf_buf_consume(sf_buf *b, size_t n)
{
    if (n >= b->len) {
        sf_buf_reset(b);
        return;
    }
    memmove(b->p, b->p + n, b->len - n);
    b->len -= n;
    b->p[b->len] = '\0';
}

