/* sf_cap: head + tail capture of command output. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sf_cap.h"

/* The kept bytes as one string (test helper). */
static char *kept(const sf_cap *c, size_t *len)
{
    char *p = malloc(sf_cap_len(c) + 1);
    assert_non_null(p);
    *len = sf_cap_copy(c, p);
    p[*len] = '\0';
    return p;
}

static void test_rejects_tiny_cap(void **state)
{
    sf_cap c;
    assert_int_equal(sf_cap_init(&c, 0), -EINVAL);
    assert_int_equal(sf_cap_init(&c, 1), -EINVAL);
    assert_int_equal(sf_cap_init(&c, 2), 0);
    sf_cap_fini(&c);
}

static void test_empty(void **state)
{
    sf_cap c;
    size_t n;
    char *p;

    assert_int_equal(sf_cap_init(&c, 16), 0);
    p = kept(&c, &n);
    assert_int_equal(n, 0);
    assert_int_equal(c.total, 0);
    assert_false(sf_cap_truncated(&c));
    free(p);
    sf_cap_fini(&c);
}

static void test_under_cap_keeps_everything(void **state)
{
    sf_cap c;
    size_t n;
    char *p;

    assert_int_equal(sf_cap_init(&c, 16), 0);
    sf_cap_append(&c, "hello\n", 6);
    p = kept(&c, &n);
    assert_int_equal(n, 6);
    assert_string_equal(p, "hello\n");
    assert_false(sf_cap_truncated(&c));
    free(p);
    sf_cap_fini(&c);
}

static void test_exactly_cap_is_not_truncated(void **state)
{
    sf_cap c;
    size_t n;
    char *p;

    assert_int_equal(sf_cap_init(&c, 10), 0);
    sf_cap_append(&c, "0123456789", 10);
    p = kept(&c, &n);
    assert_int_equal(n, 10);
    assert_string_equal(p, "0123456789");
    assert_false(sf_cap_truncated(&c));
    assert_int_equal(c.total, 10);
    free(p);
    sf_cap_fini(&c);
}

static void test_one_over_cap_drops_one_middle_byte(void **state)
{
    sf_cap c;
    size_t n;
    char *p;

    assert_int_equal(sf_cap_init(&c, 10), 0);
    sf_cap_append(&c, "0123456789X", 11);
    p = kept(&c, &n);
    assert_int_equal(n, 10);
    assert_string_equal(p, "01234" "6789X");
    assert_true(sf_cap_truncated(&c));
    assert_int_equal(c.total, 11);
    free(p);
    sf_cap_fini(&c);
}

static void test_byte_by_byte_equals_one_chunk(void **state)
{
    char data[1000];
    sf_cap a, b;
    size_t na, nb;
    char *pa, *pb;

    for (size_t i = 0; i < sizeof(data); i++)
        data[i] = (char)('a' + i % 26);
    assert_int_equal(sf_cap_init(&a, 64), 0);
    assert_int_equal(sf_cap_init(&b, 64), 0);
    sf_cap_append(&a, data, sizeof(data));
    for (size_t i = 0; i < sizeof(data); i++)
        sf_cap_append(&b, data + i, 1);
    pa = kept(&a, &na);
    pb = kept(&b, &nb);
    assert_int_equal(na, 64);
    assert_int_equal(nb, 64);
    assert_memory_equal(pa, pb, 64);
    assert_memory_equal(pa, data, 32);                     /* head */
    assert_memory_equal(pa + 32, data + 1000 - 32, 32);    /* tail */
    assert_int_equal(a.total, 1000);
    assert_int_equal(b.total, 1000);
    free(pa);
    free(pb);
    sf_cap_fini(&a);
    sf_cap_fini(&b);
}

static void test_odd_cap_splits_head_down(void **state)
{
    sf_cap c;
    size_t n;
    char *p;

    assert_int_equal(sf_cap_init(&c, 5), 0); /* head 2, tail 3 */
    sf_cap_append(&c, "abcdefghij", 10);
    p = kept(&c, &n);
    assert_int_equal(n, 5);
    assert_string_equal(p, "ab" "hij");
    free(p);
    sf_cap_fini(&c);
}

static void test_ring_wraps_in_order(void **state)
{
    sf_cap c;
    size_t n;
    char *p;

    assert_int_equal(sf_cap_init(&c, 8), 0); /* head 4, tail 4 */
    sf_cap_append(&c, "HEAD", 4);
    sf_cap_append(&c, "abc", 3);
    sf_cap_append(&c, "def", 3);   /* ring wraps: keeps cdef */
    sf_cap_append(&c, "g", 1);     /* defg */
    p = kept(&c, &n);
    assert_string_equal(p, "HEADdefg");
    assert_int_equal(c.total, 11);
    assert_true(sf_cap_truncated(&c));
    free(p);
    sf_cap_fini(&c);
}

static void test_one_mebibyte_keeps_32k(void **state)
{
    char chunk[4096];
    sf_cap c;
    size_t n;
    char *p;

    memset(chunk, 'a', sizeof(chunk));
    assert_int_equal(sf_cap_init(&c, 32768), 0);
    for (int i = 0; i < 256; i++) {
        chunk[0] = (char)('A' + i % 26); /* mark each chunk start */
        sf_cap_append(&c, chunk, sizeof(chunk));
    }
    p = kept(&c, &n);
    assert_int_equal(n, 32768);
    assert_int_equal(c.total, 1048576);
    assert_true(sf_cap_truncated(&c));
    assert_int_equal(p[0], 'A');                 /* chunk 0 */
    assert_int_equal(p[4096], 'B');              /* chunk 1, still in the head */
    assert_int_equal(p[16384], 'A' + (252 % 26)); /* tail = chunks 252..255 */
    free(p);
    sf_cap_fini(&c);
}

static void test_zero_length_append(void **state)
{
    sf_cap c;

    assert_int_equal(sf_cap_init(&c, 4), 0);
    sf_cap_append(&c, "", 0);
    assert_int_equal(sf_cap_len(&c), 0);
    assert_int_equal(c.total, 0);
    sf_cap_fini(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rejects_tiny_cap),
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_under_cap_keeps_everything),
        cmocka_unit_test(test_exactly_cap_is_not_truncated),
        cmocka_unit_test(test_one_over_cap_drops_one_middle_byte),
        cmocka_unit_test(test_byte_by_byte_equals_one_chunk),
        cmocka_unit_test(test_odd_cap_splits_head_down),
        cmocka_unit_test(test_ring_wraps_in_order),
        cmocka_unit_test(test_one_mebibyte_keeps_32k),
        cmocka_unit_test(test_zero_length_append),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
