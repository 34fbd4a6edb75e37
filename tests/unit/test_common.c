/* Small common modules: bounded buffers, the map, config overrides, UTF-8 cleaning,
 * API key hashing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "sf_auth.h"
#include "sf_buf.h"
#include "sf_config.h"
#include "sf_jobio.h"
#include "sf_map.h"
#include "sf_util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void buf_limit(void **state)
{
    sf_buf b;

    sf_buf_init(&b, 10);
    assert_int_equal(sf_buf_append(&b, "12345", 5), 0);
    assert_int_equal(sf_buf_append(&b, "123456", 6), -E2BIG);
    assert_int_equal(b.len, 5); /* unchanged by the failed append */
    assert_int_equal(sf_buf_appendf(&b, "%d", 12345), 0);
    assert_string_equal(b.p, "1234512345");
    assert_int_equal(sf_buf_append(&b, "x", 1), -E2BIG);
    sf_buf_consume(&b, 3);
    assert_string_equal(b.p, "4512345");
    sf_buf_fini(&b);
}

static void map_basics(void **state)
{
    sf_map *m = sf_map_new(3);
    int a, b, c, d;

    assert_int_equal(sf_map_put(m, "a", &a), 0);
    assert_int_equal(sf_map_put(m, "b", &b), 0);
    assert_int_equal(sf_map_put(m, "a", &c), -EEXIST);
    assert_int_equal(sf_map_put(m, "c", &c), 0);
    assert_int_equal(sf_map_put(m, "d", &d), -E2BIG);
    assert_ptr_equal(sf_map_get(m, "b"), &b);
    assert_ptr_equal(sf_map_del(m, "b"), &b);
    assert_null(sf_map_get(m, "b"));
    assert_int_equal(sf_map_len(m), 2);
    sf_map_free(m);
}

typedef struct tcfg {
    char *name;
    int64_t n;
    int flag;
} tcfg;

static void config_env_and_bounds(void **state)
{
    static const sf_cfg_entry tbl[] = {
        SF_CFG_S(tcfg, name, "x", "a name"),
        SF_CFG_I(tcfg, n, "5", 1, 10, "a number"),
        SF_CFG_B(tcfg, flag, "no", "a flag"),
    };
    tcfg c = {0};
    char why[256];

    setenv("SF_N", "7", 1);
    setenv("SF_FLAG", "yes", 1);
    assert_int_equal(sf_config_load(tbl, 3, &c, NULL, why, sizeof(why)), 0);
    assert_string_equal(c.name, "x");
    assert_int_equal(c.n, 7);
    assert_int_equal(c.flag, 1);
    setenv("SF_N", "11", 1);
    assert_int_equal(sf_config_load(tbl, 3, &c, NULL, why, sizeof(why)), -EINVAL);
    assert_non_null(strstr(why, "'n'"));
    assert_non_null(strstr(why, "SF_N"));
    unsetenv("SF_N");
    unsetenv("SF_FLAG");
    sf_config_free(tbl, 3, &c);
}

static void utf8_clean(void **state)
{
    size_t n;
    char *s = sf_utf8_clean("ok \xc3\xa9 \xff\xfe end\x00x", 14, &n);

    assert_string_equal(s, "ok \xc3\xa9 \xef\xbf\xbd\xef\xbf\xbd end\xef\xbf\xbdx");
    free(s);
    s = sf_utf8_clean("\xe2\x82", 2, &n); /* truncated sequence */
    assert_string_equal(s, "\xef\xbf\xbd\xef\xbf\xbd");
    free(s);
}

static void apikey_hash(void **state)
{
    uint8_t s1[32] = {1}, s2[32] = {2};
    char key[SF_APIKEY_LEN + 1], h1[SF_APIKEY_HASH_HEX], h2[SF_APIKEY_HASH_HEX];

    assert_int_equal(sf_apikey_new(key), 0);
    assert_int_equal(strncmp(key, "sf_live_", 8), 0);
    assert_int_equal(sf_apikey_hash(s1, key, h1), 0);
    assert_int_equal(sf_apikey_hash(s2, key, h2), 0);
    assert_string_not_equal(h1, h2); /* keyed: another deployment's secret gives another hash */
    assert_int_equal(sf_apikey_hash(s1, "sf_live_short", h1), -EINVAL);
    assert_int_equal(sf_apikey_hash(s1, "xx_live_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", h1), -EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(buf_limit),        cmocka_unit_test(map_basics),
        cmocka_unit_test(config_env_and_bounds), cmocka_unit_test(utf8_clean),
        cmocka_unit_test(apikey_hash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
