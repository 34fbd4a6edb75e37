/* sf_buf: a growable byte buffer with a hard maximum (curl dynbuf style).
 * Appending past the maximum fails with -E2BIG and leaves the buffer as it was.
 * The content is always NUL-terminated (not counted in len). */
#ifndef SF_BUF_H
#define SF_BUF_H

#include <stddef.h>

typedef struct sf_buf {
    char *p;
    size_t len;
    size_t cap;
    size_t max;
} sf_buf;

void sf_buf_init(sf_buf *b, size_t max);
void sf_buf_fini(sf_buf *b);
void sf_buf_reset(sf_buf *b);
/* 0, -E2BIG (over max) or -ENOMEM. */
int sf_buf_append(sf_buf *b, const void *data, size_t n);
int sf_buf_appendf(sf_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Drops the first n bytes. */
void sf_buf_consume(sf_buf *b, size_t n);

#endif
