#include "sf_cap.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int sf_cap_init(sf_cap *c, size_t cap)
{
    memset(c, 0, sizeof(*c));
    if (cap < 2)
        return -EINVAL;
    c->head_max = cap / 2;
    c->tail_max = cap - c->head_max;
    c->head = malloc(c->head_max);
    c->tail = malloc(c->tail_max);
    if (!c->head || !c->tail) {
        sf_cap_fini(c);
        return -ENOMEM;
    }
    return 0;
}

void sf_cap_fini(sf_cap *c)
{
    free(c->head);
    free(c->tail);
    memset(c, 0, sizeof(*c));
}

void sf_cap_append(sf_cap *c, const void *data, size_t n)
{
    const char *p = data;
    size_t k;

    c->total += n;
    if (c->head_len < c->head_max) {
        k = c->head_max - c->head_len;
        if (k > n)
            k = n;
        memcpy(c->head + c->head_len, p, k);
        c->head_len += k;
        p += k;
        n -= k;
    }
    if (n == 0)
        return;
    /* Only the last tail_max bytes of this chunk can survive. */
    if (n > c->tail_max) {
        p += n - c->tail_max;
        n = c->tail_max;
    }
    while (n > 0) {
        k = c->tail_max - c->tail_pos;
        if (k > n)
            k = n;
        memcpy(c->tail + c->tail_pos, p, k);
        c->tail_pos = (c->tail_pos + k) % c->tail_max;
        c->tail_len = c->tail_len + k > c->tail_max ? c->tail_max : c->tail_len + k;
        p += k;
        n -= k;
    }
}

size_t sf_cap_len(const sf_cap *c)
{
    return c->head_len + c->tail_len;
}

int sf_cap_truncated(const sf_cap *c)
{
    return c->total > (uint64_t)sf_cap_len(c);
}

size_t sf_cap_copy(const sf_cap *c, char *dst)
{
    size_t start, first;

    if (c->head_len)
        memcpy(dst, c->head, c->head_len);
    dst += c->head_len;
    if (c->tail_len < c->tail_max) {
        /* The ring has not wrapped: bytes sit at [0, tail_len). */
        if (c->tail_len)
            memcpy(dst, c->tail, c->tail_len);
    } else {
        start = c->tail_pos;
        first = c->tail_max - start;
        memcpy(dst, c->tail + start, first);
        memcpy(dst + first, c->tail, start);
    }
    return c->head_len + c->tail_len;
}
