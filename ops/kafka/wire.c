#include "wire.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void kb_r_init(kb_rbuf *r, const void *p, size_t len)
{
    r->p = p;
    r->len = len;
    r->off = 0;
    r->err = 0;
}

/* The next n bytes, or NULL (and the error set) when they are not there. */
static const uint8_t *take(kb_rbuf *r, size_t n)
{
    const uint8_t *q;

    if (r->err || n > r->len - r->off) {
        r->err = -EBADMSG;
        return NULL;
    }
    q = r->p + r->off;
    r->off += n;
    return q;
}

int8_t kb_r_i8(kb_rbuf *r)
{
    const uint8_t *q = take(r, 1);
    return q ? (int8_t)q[0] : 0;
}

int16_t kb_r_i16(kb_rbuf *r)
{
    const uint8_t *q = take(r, 2);
    return q ? (int16_t)(uint16_t)((q[0] << 8) | q[1]) : 0;
}

int32_t kb_get_be32(const uint8_t *q)
{
    return (int32_t)(((uint32_t)q[0] << 24) | ((uint32_t)q[1] << 16) | ((uint32_t)q[2] << 8) |
                     (uint32_t)q[3]);
}

int64_t kb_get_be64(const uint8_t *q)
{
    return (int64_t)(((uint64_t)(uint32_t)kb_get_be32(q) << 32) | (uint32_t)kb_get_be32(q + 4));
}

void kb_put_be64(uint8_t *p, int64_t v)
{
    for (int i = 7; i >= 0; i--, v = (int64_t)((uint64_t)v >> 8))
        p[i] = (uint8_t)v;
}

int32_t kb_r_i32(kb_rbuf *r)
{
    const uint8_t *q = take(r, 4);
    return q ? kb_get_be32(q) : 0;
}

int64_t kb_r_i64(kb_rbuf *r)
{
    const uint8_t *q = take(r, 8);
    return q ? kb_get_be64(q) : 0;
}

uint32_t kb_r_uvarint(kb_rbuf *r)
{
    uint32_t v = 0;

    for (int shift = 0; shift < 35; shift += 7) {
        const uint8_t *q = take(r, 1);
        if (!q)
            return 0;
        if (shift == 28 && (q[0] & 0xf0)) /* more than 32 bits */
            break;
        v |= (uint32_t)(q[0] & 0x7f) << shift;
        if (!(q[0] & 0x80))
            return v;
    }
    r->err = -EBADMSG;
    return 0;
}

/* A string's or bytes' body of len (read before it): NULL with *n 0 for null (-1, when
 * nullable) or on error. */
static const uint8_t *take_len(kb_rbuf *r, int64_t len, int nullable, size_t *n)
{
    const uint8_t *q;

    *n = 0;
    if (r->err)
        return NULL;
    if (len < 0) {
        if (len != -1 || !nullable)
            r->err = -EBADMSG;
        return NULL;
    }
    if ((q = take(r, (size_t)len)))
        *n = (size_t)len;
    return q;
}

void kb_r_str(kb_rbuf *r, int nullable, const char **s, size_t *n)
{
    int16_t len = kb_r_i16(r);

    *s = (const char *)take_len(r, len, nullable, n);
}

void kb_r_bytes(kb_rbuf *r, int nullable, const uint8_t **b, size_t *n)
{
    int32_t len = kb_r_i32(r);

    *b = take_len(r, len, nullable, n);
}

int32_t kb_r_array(kb_rbuf *r, int nullable, int32_t max, size_t min_elem)
{
    int32_t n = kb_r_i32(r);

    if (r->err)
        return 0;
    if (n == -1 && nullable)
        return -1;
    if (n < 0 || n > max || (size_t)n * min_elem > r->len - r->off) {
        r->err = -EBADMSG;
        return 0;
    }
    return n;
}

void kb_r_skip(kb_rbuf *r, size_t n)
{
    take(r, n);
}

void kb_r_tags(kb_rbuf *r)
{
    uint32_t n = kb_r_uvarint(r);

    for (uint32_t i = 0; i < n && !r->err; i++) {
        kb_r_uvarint(r); /* tag */
        kb_r_skip(r, kb_r_uvarint(r));
    }
}

void kb_w_init(kb_wbuf *w, size_t max)
{
    memset(w, 0, sizeof(*w));
    w->max = max;
}

void kb_w_fini(kb_wbuf *w)
{
    free(w->p);
    memset(w, 0, sizeof(*w));
}

uint8_t *kb_w_reserve(kb_wbuf *w, size_t n)
{
    uint8_t *q;

    if (w->err)
        return NULL;
    if (n > w->max || w->len > w->max - n) {
        w->err = -E2BIG;
        return NULL;
    }
    if (w->len + n > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->len + n)
            cap *= 2;
        if (cap > w->max)
            cap = w->max;
        if (!(q = realloc(w->p, cap))) {
            w->err = -ENOMEM;
            return NULL;
        }
        w->p = q;
        w->cap = cap;
    }
    q = w->p + w->len;
    w->len += n;
    return q;
}

void kb_w_raw(kb_wbuf *w, const void *b, size_t n)
{
    uint8_t *q = kb_w_reserve(w, n);
    if (q && n)
        memcpy(q, b, n);
}

void kb_w_i8(kb_wbuf *w, int8_t v)
{
    uint8_t *q = kb_w_reserve(w, 1);
    if (q)
        q[0] = (uint8_t)v;
}

void kb_w_i16(kb_wbuf *w, int16_t v)
{
    uint8_t *q = kb_w_reserve(w, 2);
    if (q) {
        q[0] = (uint8_t)((uint16_t)v >> 8);
        q[1] = (uint8_t)v;
    }
}

void kb_w_i32(kb_wbuf *w, int32_t v)
{
    uint8_t *q = kb_w_reserve(w, 4);
    if (q) {
        q[0] = (uint8_t)((uint32_t)v >> 24);
        q[1] = (uint8_t)((uint32_t)v >> 16);
        q[2] = (uint8_t)((uint32_t)v >> 8);
        q[3] = (uint8_t)v;
    }
}

void kb_w_i64(kb_wbuf *w, int64_t v)
{
    uint8_t *q = kb_w_reserve(w, 8);
    if (q)
        kb_put_be64(q, v);
}

void kb_w_uvarint(kb_wbuf *w, uint32_t v)
{
    while (v >= 0x80) {
        kb_w_i8(w, (int8_t)(uint8_t)((v & 0x7f) | 0x80));
        v >>= 7;
    }
    kb_w_i8(w, (int8_t)(uint8_t)v);
}

void kb_w_str(kb_wbuf *w, const char *s, size_t n)
{
    if (!s) {
        kb_w_i16(w, -1);
        return;
    }
    if (n > INT16_MAX) {
        w->err = w->err ? w->err : -E2BIG;
        return;
    }
    kb_w_i16(w, (int16_t)n);
    kb_w_raw(w, s, n);
}

void kb_w_cstr(kb_wbuf *w, const char *s)
{
    kb_w_str(w, s, s ? strlen(s) : 0);
}

void kb_w_bytes(kb_wbuf *w, const void *b, size_t n)
{
    if (!b) {
        kb_w_i32(w, -1);
        return;
    }
    if (n > INT32_MAX) {
        w->err = w->err ? w->err : -E2BIG;
        return;
    }
    kb_w_i32(w, (int32_t)n);
    kb_w_raw(w, b, n);
}

void kb_w_rtopic(kb_wbuf *w, const kb_rtopic *t)
{
    kb_w_str(w, t->name, t->len);
    kb_w_i32(w, t->n);
}

void kb_w_put_i32_at(kb_wbuf *w, size_t at, int32_t v)
{
    if (w->err || at + 4 > w->len)
        return;
    w->p[at] = (uint8_t)((uint32_t)v >> 24);
    w->p[at + 1] = (uint8_t)((uint32_t)v >> 16);
    w->p[at + 2] = (uint8_t)((uint32_t)v >> 8);
    w->p[at + 3] = (uint8_t)v;
}

int kb_r_topics(kb_rbuf *r, const kb_rtopics_spec *spec, int16_t ver, kb_rtopics *out)
{
    int32_t nt = kb_r_array(r, spec->nullable, spec->max_topics, spec->topic_min);

    out->nt = nt;
    out->nparts = 0;
    if (nt <= 0)
        return r->err;
    if ((size_t)nt > out->tcap) {
        kb_rtopic *t = realloc(out->t, (size_t)nt * sizeof(*t));
        if (!t) {
            out->nt = 0;
            return -ENOMEM;
        }
        out->t = t;
        out->tcap = (size_t)nt;
    }
    for (int32_t i = 0; i < nt; i++) {
        kb_rtopic *t = &out->t[i];
        int32_t np;

        if (r->err) {
            out->nt = i; /* (what was read) */
            break;
        }
        kb_r_str(r, 0, &t->name, &t->len);
        t->first = out->nparts;
        t->n = 0;
        if (!spec->part)
            continue;
        np = kb_r_array(r, 0, spec->max_parts, spec->part_min);
        if (np > 0 && (out->nparts + (size_t)np) * spec->part_size > out->pcap) {
            /* (exactly what is needed: the bytes read bound it) */
            size_t need = (out->nparts + (size_t)np) * spec->part_size;
            void *n = realloc(out->parts, need);
            if (!n) {
                out->nt = i;
                return -ENOMEM;
            }
            out->parts = n;
            out->pcap = need;
        }
        for (int32_t p = 0; p < np && !r->err; p++)
            spec->part(r, ver, (uint8_t *)out->parts + (out->nparts + (size_t)p) * spec->part_size);
        t->n = np;
        out->nparts += (size_t)np;
    }
    return r->err;
}

void kb_rtopics_done(kb_rtopics *rt)
{
    if (rt->tcap * sizeof(kb_rtopic) + rt->pcap > KB_RTOPICS_KEEP) {
        kb_rtopics_fini(rt);
        return;
    }
    rt->nt = 0;
    rt->nparts = 0;
}

void kb_rtopics_fini(kb_rtopics *rt)
{
    free(rt->t);
    free(rt->parts);
    memset(rt, 0, sizeof(*rt));
}

void kb_rtopics_rebase(kb_rtopics *rt, const uint8_t *old, const uint8_t *new_, size_t len)
{
    for (int32_t i = 0; i < rt->nt; i++) {
        size_t at = (size_t)((const uint8_t *)rt->t[i].name - old);
        if (at <= len)
            rt->t[i].name = (const char *)new_ + at;
    }
}
