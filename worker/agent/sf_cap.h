/* sf_cap: bounded capture of a byte stream, keeping its head and its tail.
 *
 * A capture of size `cap` keeps the first cap/2 bytes and the last cap - cap/2
 * bytes of everything appended, and counts the total. While the total is at most
 * `cap` nothing is lost and the kept bytes are the stream itself. Used for the
 * stdout/stderr of sandbox commands (32 KiB per stream). */
#ifndef SF_CAP_H
#define SF_CAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct sf_cap {
    char *head;        /* first head_max bytes */
    size_t head_len;
    size_t head_max;
    char *tail;        /* ring of the last tail_max bytes after the head */
    size_t tail_pos;   /* next write index in the ring */
    size_t tail_len;   /* bytes in the ring (<= tail_max) */
    size_t tail_max;
    uint64_t total;    /* every byte ever appended */
} sf_cap;

/* cap >= 2 (one byte each side at least). 0, -EINVAL or -ENOMEM. */
int sf_cap_init(sf_cap *c, size_t cap);
void sf_cap_fini(sf_cap *c);
void sf_cap_append(sf_cap *c, const void *data, size_t n);
/* Number of kept bytes (head + tail). */
size_t sf_cap_len(const sf_cap *c);
/* 1 when bytes between head and tail were dropped. */
int sf_cap_truncated(const sf_cap *c);
/* Copies the kept bytes, head then tail in stream order, into dst (room for
 * sf_cap_len() bytes); returns the count. */
size_t sf_cap_copy(const sf_cap *c, char *dst);

#endif
