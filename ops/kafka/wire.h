/* kb_wire: the Kafka protocol's primitive types, bounds-checked. A reader never reads past
 * its buffer and never trusts a count before checking the bytes behind it: the first
 * failure sticks (r->err = -EBADMSG) and every later read returns zeros, so a handler
 * decodes a whole request and checks err once. A writer grows up to its maximum; a write
 * past it sticks -E2BIG (or -ENOMEM). */
#ifndef KB_WIRE_H
#define KB_WIRE_H

#include <stddef.h>
#include <stdint.h>

typedef struct kb_rbuf {
    const uint8_t *p;
    size_t len, off;
    int err;
} kb_rbuf;

void kb_r_init(kb_rbuf *r, const void *p, size_t len);
int8_t kb_r_i8(kb_rbuf *r);
int16_t kb_r_i16(kb_rbuf *r);
int32_t kb_r_i32(kb_rbuf *r);
int64_t kb_r_i64(kb_rbuf *r);
/* Unsigned varint (flexible versions' compact lengths and tagged fields). */
uint32_t kb_r_uvarint(kb_rbuf *r);
/* A string (int16 length). *s points into the buffer (not NUL-terminated); a null string
 * gives s NULL and n 0 (an error unless nullable). */
void kb_r_str(kb_rbuf *r, int nullable, const char **s, size_t *n);
/* Bytes (int32 length), the same way. */
void kb_r_bytes(kb_rbuf *r, int nullable, const uint8_t **b, size_t *n);
/* An array's count (int32): -1 for a null array when nullable; an error when it exceeds
 * max or when count * min_elem bytes are not left in the buffer. */
int32_t kb_r_array(kb_rbuf *r, int nullable, int32_t max, size_t min_elem);
/* Skips n bytes; skips flexible tagged fields. */
void kb_r_skip(kb_rbuf *r, size_t n);
void kb_r_tags(kb_rbuf *r);

/* A request's topics and their partitions, decoded in one validating pass: every count is
 * checked against the bytes behind it before anything is kept, so the arrays are bounded
 * by the request's size (an entry of part_size bytes per part_min bytes read). Names and
 * bytes point into the request. */
typedef struct kb_rtopic {
    const char *name;
    size_t len;
    size_t first;  /* its partitions: entries first .. first + n - 1 of parts */
    int32_t n;
} kb_rtopic;

/* Reads one partition entry (its fields for version ver) into part. */
typedef void (*kb_rpart_fn)(kb_rbuf *r, int16_t ver, void *part);

typedef struct kb_rtopics_spec {
    int nullable;        /* a null array (-1: every topic) is allowed */
    int32_t max_topics;
    size_t topic_min;    /* a topic entry's smallest size on the wire */
    kb_rpart_fn part;    /* NULL: topics are names only */
    size_t part_size;    /* sizeof the entry part fills */
    int32_t max_parts;   /* per topic */
    size_t part_min;     /* a partition entry's smallest size on the wire */
} kb_rtopics_spec;

typedef struct kb_rtopics {
    kb_rtopic *t;
    int32_t nt;          /* -1: a null array */
    void *parts;
    size_t nparts;
    size_t tcap, pcap;   /* the arrays' room (entries of t, bytes of parts), kept for reuse */
} kb_rtopics;

/* Decodes into out (zeroed once by its owner), reusing its arrays when they have room: 0,
 * or the reader's error (-EBADMSG) or -ENOMEM. */
int kb_r_topics(kb_rbuf *r, const kb_rtopics_spec *spec, int16_t ver, kb_rtopics *out);
/* The request is answered: its arrays stay for the next one unless they hold more than
 * KB_RTOPICS_KEEP bytes (a large request's are freed). */
#define KB_RTOPICS_KEEP (64u << 10)
void kb_rtopics_done(kb_rtopics *rt);
void kb_rtopics_fini(kb_rtopics *rt);
/* The topic names, made to point into a copy (at new_) of the request's len bytes at old
 * (for a request kept past its buffer; partition entries must hold no pointers). */
void kb_rtopics_rebase(kb_rtopics *rt, const uint8_t *old, const uint8_t *new_, size_t len);

typedef struct kb_wbuf {
    uint8_t *p;
    size_t len, cap, max;
    int err;
} kb_wbuf;

void kb_w_init(kb_wbuf *w, size_t max);
void kb_w_fini(kb_wbuf *w);
/* Makes room for n more bytes and returns where they go (NULL after an error). */
uint8_t *kb_w_reserve(kb_wbuf *w, size_t n);
void kb_w_i8(kb_wbuf *w, int8_t v);
void kb_w_i16(kb_wbuf *w, int16_t v);
void kb_w_i32(kb_wbuf *w, int32_t v);
void kb_w_i64(kb_wbuf *w, int64_t v);
void kb_w_uvarint(kb_wbuf *w, uint32_t v);
/* s NULL writes a null string (length -1). */
void kb_w_str(kb_wbuf *w, const char *s, size_t n);
void kb_w_cstr(kb_wbuf *w, const char *s);
void kb_w_bytes(kb_wbuf *w, const void *b, size_t n);
void kb_w_raw(kb_wbuf *w, const void *b, size_t n);
/* A topic's answer header: its name and partition count, as its request named them. */
void kb_w_rtopic(kb_wbuf *w, const kb_rtopic *t);
/* Overwrites 4 bytes at offset at (a length or count written before it was known). */
void kb_w_put_i32_at(kb_wbuf *w, size_t at, int32_t v);

void kb_put_be64(uint8_t *p, int64_t v);
int64_t kb_get_be64(const uint8_t *p);
int32_t kb_get_be32(const uint8_t *p);

#endif
