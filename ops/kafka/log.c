#include "log.h"
#include "wire.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* A batch's span is bounded so offsets cannot be pushed towards overflow by one request. */
#define KB_SPAN_MAX (1 << 24)

kb_log *kb_log_new(size_t max_topics, size_t part_cap)
{
    kb_log *l = calloc(1, sizeof(*l));

    if (!l)
        return NULL;
    if (!(l->topics = calloc(max_topics ? max_topics : 1, sizeof(*l->topics)))) {
        free(l);
        return NULL;
    }
    l->max = max_topics;
    l->part_cap = part_cap;
    return l;
}

static void part_fini(kb_part *p)
{
    for (size_t i = p->head; i < p->n; i++)
        free(p->b[i].data);
    free(p->b);
}

static void topic_free(kb_topic *t)
{
    if (!t)
        return;
    for (int32_t i = 0; i < t->nparts; i++)
        part_fini(&t->parts[i]);
    free(t->parts);
    free(t);
}

void kb_log_free(kb_log *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->n; i++)
        topic_free(l->topics[i]);
    free(l->topics);
    free(l);
}

int kb_topic_name_check(const char *name, size_t n)
{
    if (!name || n == 0 || n > KB_TOPIC_NAME_MAX)
        return -EINVAL;
    if ((n == 1 && name[0] == '.') || (n == 2 && name[0] == '.' && name[1] == '.'))
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return -EINVAL;
    }
    return 0;
}

kb_topic *kb_log_find(const kb_log *l, const char *name, size_t n)
{
    if (n > KB_TOPIC_NAME_MAX)
        return NULL;
    for (size_t i = 0; i < l->n; i++) {
        kb_topic *t = l->topics[i];
        if (!strncmp(t->name, name, n) && t->name[n] == '\0')
            return t;
    }
    return NULL;
}

int kb_log_create(kb_log *l, const char *name, size_t n, int32_t nparts, kb_topic **out)
{
    kb_topic *t;

    if (kb_topic_name_check(name, n) < 0 || nparts < 1 || nparts > 1024)
        return -EINVAL;
    if ((t = kb_log_find(l, name, n))) {
        if (out)
            *out = t;
        return -EEXIST;
    }
    if (l->n >= l->max)
        return -ENOSPC;
    if (!(t = calloc(1, sizeof(*t))) || !(t->parts = calloc((size_t)nparts, sizeof(kb_part)))) {
        free(t);
        return -ENOMEM;
    }
    memcpy(t->name, name, n);
    t->name[n] = '\0';
    t->nparts = nparts;
    l->topics[l->n++] = t;
    if (out)
        *out = t;
    return 0;
}

int kb_log_delete(kb_log *l, const char *name, size_t n)
{
    kb_topic *t = kb_log_find(l, name, n);

    if (!t)
        return -ENOENT;
    for (size_t i = 0; i < l->n; i++) {
        if (l->topics[i] == t) {
            l->topics[i] = l->topics[--l->n];
            break;
        }
    }
    topic_free(t);
    return 0;
}

/* Checks one batch at recs (len bytes left); its total size, or -EBADMSG. */
static long batch_check(const uint8_t *recs, size_t len)
{
    int32_t blen, delta, count;

    if (len < KB_BATCH_HEADER)
        return -EBADMSG;
    blen = kb_get_be32(recs + 8);
    if (blen < KB_BATCH_HEADER - 12 || (size_t)blen > len - 12)
        return -EBADMSG;
    if (recs[16] != 2) /* magic: record batch v2 only */
        return -EBADMSG;
    delta = kb_get_be32(recs + 23);
    count = kb_get_be32(recs + 57);
    if (delta < 0 || delta >= KB_SPAN_MAX || count < 0 || count > delta + 1)
        return -EBADMSG;
    return (long)blen + 12;
}

/* Drops the oldest batches while more than cap bytes are kept (the newest always stays). */
static void part_trim(kb_part *p, size_t cap)
{
    while (p->bytes > cap && p->n - p->head > 1) {
        kb_batch *b = &p->b[p->head++];
        p->bytes -= b->len;
        free(b->data);
        p->start = p->b[p->head].base;
    }
}

static int part_reserve(kb_part *p, size_t more)
{
    size_t live = p->n - p->head;
    kb_batch *nb;

    if (p->n + more <= p->cap)
        return 0;
    if (p->head > 0 && live + more <= p->cap && p->head >= p->cap / 2) {
        memmove(p->b, p->b + p->head, live * sizeof(*p->b));
        p->head = 0;
        p->n = live;
        return 0;
    }
    {
        size_t cap = p->cap ? p->cap * 2 : 64;
        while (cap < p->n + more)
            cap *= 2;
        if (!(nb = realloc(p->b, cap * sizeof(*nb))))
            return -ENOMEM;
        p->b = nb;
        p->cap = cap;
    }
    return 0;
}

int kb_part_append(kb_part *p, const uint8_t *recs, size_t n, size_t cap, int64_t *base)
{
    size_t off = 0, count = 0;
    int64_t next = p->end;

    if (n == 0)
        return -EBADMSG;
    while (off < n) { /* the whole request is checked before anything is kept */
        long sz = batch_check(recs + off, n - off);
        if (sz < 0)
            return (int)sz;
        off += (size_t)sz;
        count++;
    }
    if (part_reserve(p, count) < 0)
        return -ENOMEM;
    for (size_t i = 0, o = 0; i < count; i++) { /* copies first: all are kept or none */
        size_t sz = (size_t)batch_check(recs + o, n - o);
        if (!(p->b[p->n + i].data = malloc(sz))) {
            while (i-- > 0)
                free(p->b[p->n + i].data);
            return -ENOMEM;
        }
        memcpy(p->b[p->n + i].data, recs + o, sz);
        p->b[p->n + i].len = (uint32_t)sz;
        o += sz;
    }
    *base = p->end;
    for (size_t i = 0; i < count; i++) {
        kb_batch *b = &p->b[p->n++];
        kb_put_be64(b->data, next); /* baseOffset: outside the CRC */
        b->base = next;
        b->span = kb_get_be32(b->data + 23) + 1;
        b->max_ts = kb_get_be64(b->data + 35);
        next += b->span;
        p->bytes += b->len;
    }
    p->end = next;
    part_trim(p, cap);
    return 0;
}

long kb_part_locate(const kb_part *p, int64_t offset)
{
    size_t lo = p->head, hi = p->n;

    if (offset < p->start || offset >= p->end || lo == hi)
        return -1;
    while (hi - lo > 1) { /* the last batch whose base is <= offset */
        size_t mid = lo + (hi - lo) / 2;
        if (p->b[mid].base <= offset)
            lo = mid;
        else
            hi = mid;
    }
    return p->b[lo].base <= offset ? (long)lo : -1;
}

int64_t kb_part_offset_for_time(const kb_part *p, int64_t ts)
{
    for (size_t i = p->head; i < p->n; i++)
        if (p->b[i].max_ts >= ts)
            return p->b[i].base;
    return p->end;
}
