/* The embedded broker's codec (kb_wire) and log (kb_log): bounds, malformed input,
 * offsets, binary search, the per-partition cap. */
#include "log.h"
#include "wire.h"

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static void test_reader_bounds(void **state)
{
    static const uint8_t buf[] = {0x00, 0x05, 'h', 'e', 'l', 'l', 'o', 0xff, 0xff, 0x00, 0x02, 'x'};
    kb_rbuf r;
    const char *s;
    size_t n;

    kb_r_init(&r, buf, sizeof(buf));
    kb_r_str(&r, 0, &s, &n);
    assert_int_equal(r.err, 0);
    assert_int_equal(n, 5);
    assert_memory_equal(s, "hello", 5);
    kb_r_str(&r, 1, &s, &n); /* null string, allowed */
    assert_int_equal(r.err, 0);
    assert_null(s);
    kb_r_str(&r, 0, &s, &n); /* claims 2 bytes, 1 left */
    assert_int_equal(r.err, -EBADMSG);
    assert_int_equal(kb_r_i32(&r), 0); /* sticky: later reads give zeros */
    assert_int_equal(r.err, -EBADMSG);

    kb_r_init(&r, buf + 7, 2); /* -1 where a null is not allowed */
    kb_r_str(&r, 0, &s, &n);
    assert_int_equal(r.err, -EBADMSG);
}

static void test_reader_arrays(void **state)
{
    static const uint8_t huge[] = {0x7f, 0xff, 0xff, 0xff, 0, 0};
    static const uint8_t neg[] = {0xff, 0xff, 0xff, 0xfe};
    static const uint8_t null[] = {0xff, 0xff, 0xff, 0xff};
    static const uint8_t two[] = {0, 0, 0, 2, 0, 1, 0, 2};
    kb_rbuf r;

    kb_r_init(&r, huge, sizeof(huge)); /* a count the bytes behind it cannot hold */
    assert_int_equal(kb_r_array(&r, 0, INT32_MAX, 1), 0);
    assert_int_equal(r.err, -EBADMSG);
    kb_r_init(&r, neg, sizeof(neg));
    kb_r_array(&r, 1, 10, 1);
    assert_int_equal(r.err, -EBADMSG);
    kb_r_init(&r, null, sizeof(null));
    assert_int_equal(kb_r_array(&r, 1, 10, 1), -1);
    assert_int_equal(r.err, 0);
    kb_r_init(&r, null, sizeof(null));
    kb_r_array(&r, 0, 10, 1);
    assert_int_equal(r.err, -EBADMSG);
    kb_r_init(&r, two, sizeof(two));
    assert_int_equal(kb_r_array(&r, 0, 1, 2), 0); /* above max */
    assert_int_equal(r.err, -EBADMSG);
    kb_r_init(&r, two, sizeof(two));
    assert_int_equal(kb_r_array(&r, 0, 2, 2), 2);
    assert_int_equal(kb_r_i16(&r), 1);
    assert_int_equal(kb_r_i16(&r), 2);
    assert_int_equal(r.err, 0);
}

static void test_varint_and_tags(void **state)
{
    kb_wbuf w;
    kb_rbuf r;
    static const uint8_t overlong[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    static const uint8_t tags[] = {0x01, 0x00, 0x05, 'a'}; /* a tag claiming 5 bytes, 1 left */

    kb_w_init(&w, 64);
    kb_w_uvarint(&w, 300);
    kb_w_uvarint(&w, 0);
    kb_r_init(&r, w.p, w.len);
    assert_int_equal(kb_r_uvarint(&r), 300);
    assert_int_equal(kb_r_uvarint(&r), 0);
    assert_int_equal(r.err, 0);
    kb_w_fini(&w);
    kb_r_init(&r, overlong, sizeof(overlong));
    kb_r_uvarint(&r);
    assert_int_equal(r.err, -EBADMSG);
    kb_r_init(&r, tags, sizeof(tags));
    kb_r_tags(&r);
    assert_int_equal(r.err, -EBADMSG);
}

static void test_writer_cap(void **state)
{
    kb_wbuf w;

    kb_w_init(&w, 10);
    kb_w_i64(&w, -2);
    assert_int_equal(w.err, 0);
    kb_w_i32(&w, 7); /* 12 > 10 */
    assert_int_equal(w.err, -E2BIG);
    assert_int_equal(w.len, 8);
    kb_w_fini(&w);
    kb_w_init(&w, 1024);
    kb_w_cstr(&w, "ab");
    kb_w_str(&w, NULL, 0);
    kb_w_i32(&w, 0);
    kb_w_put_i32_at(&w, 6, 0x01020304);
    assert_int_equal(w.len, 10);
    assert_memory_equal(w.p, "\x00\x02" "ab" "\xff\xff" "\x01\x02\x03\x04", 10);
    kb_w_fini(&w);
}

/* A record batch v2 of `count` records (their bytes are opaque to the broker). */
static size_t make_batch(uint8_t *b, int count, int payload, int64_t ts)
{
    size_t len = KB_BATCH_HEADER + (size_t)payload;
    memset(b, 0, len);
    kb_put_be64(b, 12345); /* the producer's base offset: the broker rewrites it */
    b[8] = (uint8_t)((len - 12) >> 24);
    b[9] = (uint8_t)((len - 12) >> 16);
    b[10] = (uint8_t)((len - 12) >> 8);
    b[11] = (uint8_t)(len - 12);
    b[16] = 2;
    b[26] = (uint8_t)(count - 1); /* lastOffsetDelta (low byte) */
    kb_put_be64(b + 35, ts);
    b[60] = (uint8_t)count;
    return len;
}

static void test_log_append_locate(void **state)
{
    kb_log *l = kb_log_new(4, 1 << 20);
    kb_topic *t;
    uint8_t two[2 * (KB_BATCH_HEADER + 10)], one[KB_BATCH_HEADER + 10];
    size_t n1, n2;
    int64_t base;

    assert_int_equal(kb_log_create(l, "t", 1, 2, &t), 0);
    assert_int_equal(kb_log_create(l, "t", 1, 2, NULL), -EEXIST);
    assert_int_equal(kb_log_create(l, "bad/name", 8, 2, NULL), -EINVAL);
    assert_int_equal(kb_log_create(l, "..", 2, 2, NULL), -EINVAL);
    assert_int_equal(kb_log_create(l, "z", 1, 0, NULL), -EINVAL);
    n1 = make_batch(two, 3, 10, 100);
    n2 = make_batch(two + n1, 2, 10, 200);
    assert_int_equal(kb_part_append(&t->parts[0], two, n1 + n2, 1 << 20, &base), 0);
    assert_int_equal(base, 0);
    assert_int_equal(t->parts[0].end, 5);
    assert_int_equal(kb_get_be64(t->parts[0].b[1].data), 3); /* base offset rewritten */
    make_batch(one, 4, 10, 300);
    assert_int_equal(kb_part_append(&t->parts[0], one, sizeof(one), 1 << 20, &base), 0);
    assert_int_equal(base, 5);
    assert_int_equal(t->parts[0].end, 9);
    assert_int_equal(kb_part_locate(&t->parts[0], 0), 0);
    assert_int_equal(kb_part_locate(&t->parts[0], 2), 0);
    assert_int_equal(kb_part_locate(&t->parts[0], 3), 1);
    assert_int_equal(kb_part_locate(&t->parts[0], 8), 2);
    assert_int_equal(kb_part_locate(&t->parts[0], 9), -1);
    assert_int_equal(kb_part_locate(&t->parts[0], -1), -1);
    assert_int_equal(kb_part_offset_for_time(&t->parts[0], 150), 3);
    assert_int_equal(kb_part_offset_for_time(&t->parts[0], 999), 9);
    assert_int_equal(kb_log_delete(l, "t", 1), 0);
    assert_int_equal(kb_log_delete(l, "t", 1), -ENOENT);
    assert_null(kb_log_find(l, "t", 1));
    kb_log_free(l);
}

static void test_log_malformed(void **state)
{
    kb_log *l = kb_log_new(4, 1 << 20);
    kb_topic *t;
    uint8_t b[2 * (KB_BATCH_HEADER + 10)];
    size_t n = make_batch(b, 2, 10, 0), n2;
    int64_t base;

    assert_int_equal(kb_log_create(l, "t", 1, 1, &t), 0);
    assert_int_equal(kb_part_append(&t->parts[0], b, n - 1, 1 << 20, &base), -EBADMSG);
    assert_int_equal(kb_part_append(&t->parts[0], b, 30, 1 << 20, &base), -EBADMSG);
    assert_int_equal(kb_part_append(&t->parts[0], b, 0, 1 << 20, &base), -EBADMSG);
    b[16] = 1; /* magic v1 */
    assert_int_equal(kb_part_append(&t->parts[0], b, n, 1 << 20, &base), -EBADMSG);
    b[16] = 2;
    b[8] = 0x7f; /* batchLength past the end */
    assert_int_equal(kb_part_append(&t->parts[0], b, n, 1 << 20, &base), -EBADMSG);
    b[8] = 0;
    b[23] = 0x80; /* negative lastOffsetDelta */
    assert_int_equal(kb_part_append(&t->parts[0], b, n, 1 << 20, &base), -EBADMSG);
    b[23] = 0;
    /* a good batch followed by a bad one: neither is kept */
    n2 = make_batch(b + n, 1, 10, 0);
    b[n + 16] = 0;
    assert_int_equal(kb_part_append(&t->parts[0], b, n + n2, 1 << 20, &base), -EBADMSG);
    assert_int_equal(t->parts[0].end, 0);
    assert_int_equal(t->parts[0].n, 0);
    kb_log_free(l);
}

static void test_log_cap(void **state)
{
    size_t one = KB_BATCH_HEADER + 100, cap = 10 * one;
    kb_log *l = kb_log_new(4, cap);
    kb_topic *t;
    uint8_t b[KB_BATCH_HEADER + 100];
    int64_t base;

    assert_int_equal(kb_log_create(l, "t", 1, 1, &t), 0);
    make_batch(b, 2, 100, 0);
    for (int i = 0; i < 1000; i++)
        assert_int_equal(kb_part_append(&t->parts[0], b, sizeof(b), cap, &base), 0);
    assert_int_equal(t->parts[0].end, 2000);
    assert_true(t->parts[0].bytes <= cap);
    assert_int_equal(t->parts[0].start, 2000 - 2 * 10);
    assert_int_equal(kb_part_locate(&t->parts[0], t->parts[0].start - 1), -1);
    assert_int_equal(kb_part_locate(&t->parts[0], t->parts[0].start), (long)t->parts[0].head);
    assert_true(t->parts[0].cap < 1000); /* the array is compacted, not grown without end */
    kb_log_free(l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reader_bounds),     cmocka_unit_test(test_reader_arrays),
        cmocka_unit_test(test_varint_and_tags),   cmocka_unit_test(test_writer_cap),
        cmocka_unit_test(test_log_append_locate), cmocka_unit_test(test_log_malformed),
        cmocka_unit_test(test_log_cap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
