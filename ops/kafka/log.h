/* kb_log: the broker's topics in memory. A partition keeps record batches (magic v2) as the
 * producers sent them, each with its base offset rewritten; a fetch finds its batch by
 * binary search. Each partition keeps at most its byte cap: the oldest batches go and the
 * log start offset moves past them. */
#ifndef KB_LOG_H
#define KB_LOG_H

#include <stddef.h>
#include <stdint.h>

#define KB_TOPIC_NAME_MAX 249
#define KB_BATCH_HEADER 61 /* a v2 record batch's fixed header */

typedef struct kb_batch {
    int64_t base;     /* first offset */
    int64_t max_ts;   /* the batch's maxTimestamp (ListOffsets by time) */
    int32_t span;     /* lastOffsetDelta + 1 */
    uint32_t len;     /* bytes at data */
    uint8_t *data;
} kb_batch;

typedef struct kb_part {
    kb_batch *b;            /* live batches are b[head .. n) */
    size_t head, n, cap;
    int64_t start, end;     /* log start offset; high watermark (the next offset) */
    size_t bytes;           /* bytes kept */
} kb_part;

typedef struct kb_topic {
    char name[KB_TOPIC_NAME_MAX + 1];
    int32_t nparts;
    kb_part *parts;
} kb_topic;

typedef struct kb_log {
    kb_topic **topics;
    size_t n, max;
    size_t part_cap;        /* bytes kept per partition */
} kb_log;

/* max_topics bounds the topic table; part_cap the bytes kept per partition. */
kb_log *kb_log_new(size_t max_topics, size_t part_cap);
void kb_log_free(kb_log *l);
/* 0 when name is a valid topic name (1-249 of [A-Za-z0-9._-], not "." or ".."), else -EINVAL. */
int kb_topic_name_check(const char *name, size_t n);
kb_topic *kb_log_find(const kb_log *l, const char *name, size_t n);
/* 0 and *out, or -EINVAL (name, partitions), -EEXIST (*out is the topic), -ENOSPC (the
 * topic table is full), -ENOMEM. */
int kb_log_create(kb_log *l, const char *name, size_t n, int32_t nparts, kb_topic **out);
/* 0 or -ENOENT. */
int kb_log_delete(kb_log *l, const char *name, size_t n);
/* Appends the record batches in recs (one or more, magic v2, checked whole before any is
 * kept) and sets *base to the first one's offset. 0, -EBADMSG (malformed or not v2) or
 * -ENOMEM. */
int kb_part_append(kb_part *p, const uint8_t *recs, size_t n, size_t cap, int64_t *base);
/* Index of the batch holding offset (start <= offset < end), else -1. */
long kb_part_locate(const kb_part *p, int64_t offset);
/* Offset of the first batch whose max timestamp is >= ts, else end. */
int64_t kb_part_offset_for_time(const kb_part *p, int64_t ts);

#endif
