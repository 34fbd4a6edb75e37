/* sf_mpscan: a bounded structural scan of raw msgpack, run before msgpack-c builds
 * objects from untrusted bytes.
 *
 * msgpack-c allocates count * sizeof(msgpack_object) for an array or map as soon as it
 * reads the header, before it reads a single element: a 5-byte header that claims 2^32
 * elements makes it reserve tens of GiB. The scan checks every length and count against
 * the bytes that remain (each element takes at least one byte), the nesting depth and the
 * total number of values, so what msgpack-c then allocates is bounded by the message size
 * and by max_values. It reads nothing outside p[0..len) and allocates nothing.
 *
 * Header-only, so the static guest agent (which compiles a few common sources itself)
 * shares it with the daemons. Library code: no logging. */
#ifndef SF_MPSCAN_H
#define SF_MPSCAN_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

typedef struct sf_mpscan {
    const unsigned char *p;
    size_t len, off;
    size_t values, max_values;
    unsigned max_depth;
} sf_mpscan;

static inline uint64_t sf_mpscan_be(const unsigned char *p, size_t n)
{
    uint64_t v = 0;

    for (size_t i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

/* One value at s->off: 0, -EBADMSG, -ELOOP or -E2BIG (see sf_mpscan_value). */
static inline int sf_mpscan_one(sf_mpscan *s, unsigned depth)
{
    unsigned c;
    uint64_t n = 0, items = 0;
    size_t w = 0;
    int rc;

    if (depth > s->max_depth)
        return -ELOOP;
    if (++s->values > s->max_values)
        return -E2BIG;
    if (s->off >= s->len)
        return -EBADMSG;
    c = s->p[s->off++];
    if (c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3)
        return 0; /* fixint, negative fixint, nil, false, true */
    if ((c & 0xf0) == 0x80) {
        items = 2 * (uint64_t)(c & 0x0f);
        goto container;
    }
    if ((c & 0xf0) == 0x90) {
        items = c & 0x0f;
        goto container;
    }
    if ((c & 0xe0) == 0xa0) {
        n = c & 0x1f;
        goto body;
    }
    switch (c) {
    case 0xc4: case 0xd9: w = 1; goto sized;  /* bin 8, str 8 */
    case 0xc5: case 0xda: w = 2; goto sized;  /* bin 16, str 16 */
    case 0xc6: case 0xdb: w = 4; goto sized;  /* bin 32, str 32 */
    case 0xc7: w = 1; n = 1; goto sized;      /* ext 8/16/32: length, then type + data */
    case 0xc8: w = 2; n = 1; goto sized;
    case 0xc9: w = 4; n = 1; goto sized;
    case 0xca: n = 4; goto body;              /* float 32 */
    case 0xcb: n = 8; goto body;              /* float 64 */
    case 0xcc: case 0xd0: n = 1; goto body;   /* uint 8, int 8 */
    case 0xcd: case 0xd1: n = 2; goto body;
    case 0xce: case 0xd2: n = 4; goto body;
    case 0xcf: case 0xd3: n = 8; goto body;
    case 0xd4: n = 2; goto body;              /* fixext 1/2/4/8/16: type + data */
    case 0xd5: n = 3; goto body;
    case 0xd6: n = 5; goto body;
    case 0xd7: n = 9; goto body;
    case 0xd8: n = 17; goto body;
    case 0xdc: case 0xde: w = 2; goto counted; /* array 16, map 16 */
    case 0xdd: case 0xdf: w = 4; goto counted; /* array 32, map 32 */
    default:                                   /* 0xc1: never used */
        return -EBADMSG;
    }
sized:
    if (s->len - s->off < w)
        return -EBADMSG;
    n += sf_mpscan_be(s->p + s->off, w);
    s->off += w;
body:
    if (n > s->len - s->off)
        return -EBADMSG;
    s->off += (size_t)n;
    return 0;
counted:
    if (s->len - s->off < w)
        return -EBADMSG;
    items = sf_mpscan_be(s->p + s->off, w);
    if (c >= 0xde)
        items *= 2;
    s->off += w;
container:
    if (items > s->len - s->off) /* every element takes at least one byte */
        return -EBADMSG;
    for (uint64_t i = 0; i < items; i++)
        if ((rc = sf_mpscan_one(s, depth + 1)) < 0)
            return rc;
    return 0;
}

/* Scans the one msgpack value at the start of p[0..len): 0 and its length in *used
 * (bytes may follow it), or
 *   -EBADMSG  malformed or truncated: a length or count beyond the bytes that remain,
 *             or the reserved byte 0xc1;
 *   -ELOOP    containers nested more than max_depth levels below the value;
 *   -E2BIG    more than max_values values in all (each key, element and container
 *             counts one).
 * why (may be NULL) gets a reason. */
static inline int sf_mpscan_value(const void *p, size_t len, unsigned max_depth,
                                  size_t max_values, size_t *used, const char **why)
{
    sf_mpscan s = {(const unsigned char *)p, len, 0, 0, max_values, max_depth};
    int rc = sf_mpscan_one(&s, 0);

    if (rc == 0) {
        *used = s.off;
        return 0;
    }
    if (why)
        *why = rc == -ELOOP   ? "msgpack nested too deeply"
               : rc == -E2BIG ? "too many msgpack values in one message"
                              : "malformed or truncated msgpack (a length or count runs past "
                                "the end of the message)";
    return rc;
}

#endif
