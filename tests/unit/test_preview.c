/* The gateway's preview names and signatures (gateway/preview_token.c): link tokens against a
 * vector computed with Python's hmac (an implementation of its own), each refusal reason, the
 * hop line's MAC recomputed from its fields, host names and labels, and the removal of the
 * gateway's own parameters (sf_token, the sf_preview cookie) before a request reaches a
 * sandbox. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "preview.h"
#include "sf_pvtoken.h"

#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>

#define TOK_OK "v1.sb_abc123.8000.1765090000123001.1900000000.0011223344556677." \
               "31128da4615af87259d21698548047971ee17b8d92276614a19d506124c7b31e"
static uint8_t key[32];

static int check(const char *tok, unsigned port, uint64_t epoch, int64_t now)
{
    int64_t exp = 0;

    return gw_pv_token_check(tok, strlen(tok), key, "sb_abc123", port, epoch, now, &exp);
}

static void tokens(void **state)
{
    char t[300], made[300];
    int64_t exp = 0;

    (void)state;
    assert_int_equal(gw_pv_token_check(TOK_OK, strlen(TOK_OK), key, "sb_abc123", 8000,
                                       1765090000123001ull, 1800000000, &exp), GW_PV_TOK_OK);
    assert_int_equal(exp, 1900000000);
    assert_int_equal(check(TOK_OK, 8000, 1765090000123001ull, 1900000000), GW_PV_TOK_EXPIRED);
    assert_int_equal(check(TOK_OK, 8000, 1765090000123002ull, 1800000000), GW_PV_TOK_EPOCH);
    assert_int_equal(check(TOK_OK, 8001, 1765090000123001ull, 1800000000), GW_PV_TOK_OTHER);
    /* every character of the MAC and of each field matters */
    for (size_t i = 3; i < strlen(TOK_OK); i++) {
        if (TOK_OK[i] == '.')
            continue;
        snprintf(t, sizeof(t), "%s", TOK_OK);
        t[i] = t[i] == '1' ? '2' : '1';
        assert_int_not_equal(check(t, 8000, 1765090000123001ull, 1800000000), GW_PV_TOK_OK);
    }
    /* a longer expiry with the old MAC */
    snprintf(t, sizeof(t), "%s", TOK_OK);
    memcpy(strstr(t, ".1900000000.") + 1, "1999999999", 10);
    assert_int_equal(check(t, 8000, 1765090000123001ull, 1800000000), GW_PV_TOK_BADMAC);
    assert_int_equal(check("", 8000, 1, 0), GW_PV_TOK_MALFORMED);
    assert_int_equal(check("v1.sb_abc123.8000.1.2.3", 8000, 1, 0), GW_PV_TOK_MALFORMED);
    assert_int_equal(check(TOK_OK ".x", 8000, 1765090000123001ull, 1800000000), GW_PV_TOK_MALFORMED);
    snprintf(t, sizeof(t), "%s", TOK_OK);
    t[1] = '2'; /* v2 */
    assert_int_equal(check(t, 8000, 1765090000123001ull, 1800000000), GW_PV_TOK_MALFORMED);
    memset(t, 'a', 299);
    t[299] = 0;
    assert_int_equal(check(t, 8000, 1, 0), GW_PV_TOK_MALFORMED);
    /* made here, checked here */
    assert_int_equal(sf_pv_link_token(key, "sb_abc123", 8000, 42, 2000000000, made, sizeof(made)), 0);
    assert_int_equal(check(made, 8000, 42, 1999999999), GW_PV_TOK_OK);
    for (int v = GW_PV_TOK_MALFORMED; v <= GW_PV_TOK_EPOCH; v++)
        assert_non_null(strstr(gw_pv_token_why(v), "sandbox_preview_url"));
}

static void hop_line(void **state)
{
    char line[600], id[64], nonce[17], mac[65], hex[65];
    unsigned port;
    unsigned long long epoch, iat;
    crypto_auth_hmacsha256_state st;
    uint8_t m[32];
    char msg[256];
    int n;

    (void)state;
    assert_int_equal(sf_pv_hop_line(key, "sb_abc123", 8000, 1765090000123001ull, 1765090000999,
                                     line, sizeof(line)), 0);
    n = (int)strlen(line);
    assert_true(n > 0 && n <= 512 && line[n - 1] == '\n');
    assert_int_equal(sscanf(line, "SFHOP1 %63s %u %llu %llu %16s %64s\n", id, &port, &epoch, &iat,
                            nonce, mac), 6);
    assert_string_equal(id, "sb_abc123");
    assert_int_equal(port, 8000);
    assert_int_equal(iat, 1765090000999ull);
    snprintf(msg, sizeof(msg), "sandfleet-preview-hop-v1\nsb_abc123\n8000\n1765090000123001\n"
             "1765090000999\n%s", nonce);
    crypto_auth_hmacsha256_init(&st, key, 32);
    crypto_auth_hmacsha256_update(&st, (const uint8_t *)msg, strlen(msg));
    crypto_auth_hmacsha256_final(&st, m);
    sodium_bin2hex(hex, sizeof(hex), m, 32);
    assert_string_equal(mac, hex);
    /* the vector (nonce 0011223344556677), from Python */
    snprintf(msg, sizeof(msg), "sandfleet-preview-hop-v1\nsb_abc123\n8000\n1765090000123001\n"
             "1765090000999\n0011223344556677");
    crypto_auth_hmacsha256_init(&st, key, 32);
    crypto_auth_hmacsha256_update(&st, (const uint8_t *)msg, strlen(msg));
    crypto_auth_hmacsha256_final(&st, m);
    sodium_bin2hex(hex, sizeof(hex), m, 32);
    assert_string_equal(hex, "663019b90268e7b8d7262e7d8fb98e2a60b67c08425c2dfd2b69ea0888ab8541");
}

static void hosts(void **state)
{
    gw_pv_target t;
    const char *why = NULL;
    int ok = -1;
    char dom[64];

    (void)state;
    assert_int_equal(gw_pv_domain_host("Preview.Localhost:8080", dom, sizeof(dom)), 0);
    assert_string_equal(dom, "preview.localhost");
    assert_int_equal(gw_pv_domain_host("bad domain", dom, sizeof(dom)), -EINVAL);
    assert_int_equal(gw_pv_match_host("8000-sb-abc123.preview.localhost:9999", dom, &t, &ok, &why), 1);
    assert_true(ok);
    assert_string_equal(t.sandbox, "sb_abc123");
    assert_int_equal(t.port, 8000);
    assert_int_equal(gw_pv_match_host("65535-SB-ABC.Preview.Localhost.", dom, &t, &ok, &why), 1);
    assert_true(ok);
    assert_string_equal(t.sandbox, "sb_abc");
    /* under the domain but not a preview: a page, never the gateway */
    const char *bad[] = {"preview.localhost", "x.8000-sb-a.preview.localhost", "8000.preview.localhost",
                         "65536-sb-a.preview.localhost", "0-sb-a.preview.localhost",
                         "08000-sb-a.preview.localhost", "8000-sb_a.preview.localhost",
                         "8000-sb-.preview.localhost", "8000-xx-a.preview.localhost",
                         "8000-sb-a-b.preview.localhost"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        ok = -1;
        assert_int_equal(gw_pv_match_host(bad[i], dom, &t, &ok, &why), 1);
        assert_int_equal(ok, 0);
        assert_non_null(why);
    }
    /* not ours at all */
    const char *other[] = {"localhost:8080", "127.0.0.1", "[::1]:80", "evilpreview.localhost",
                           "8000-sb-a.preview.localhost.evil.com", "", "preview.localhost:80x"};
    for (size_t i = 0; i < sizeof(other) / sizeof(*other); i++)
        assert_int_equal(gw_pv_match_host(other[i], dom, &t, &ok, &why), 0);
    assert_int_equal(gw_pv_parse_label("3000-sb-q9", 10, &t, &why), 0);
    assert_string_equal(t.sandbox, "sb_q9");
}

static void strip(void **state)
{
    sf_buf b;
    size_t n;
    const char *v;

    (void)state;
    sf_buf_init(&b, 1024);
    assert_int_equal(gw_pv_strip_token("/a?x=1&sf_token=abc&y=2", &b), 0);
    sf_buf_append(&b, "", 1);
    assert_string_equal(b.p, "/a?x=1&y=2");
    sf_buf_reset(&b);
    assert_int_equal(gw_pv_strip_token("/?sf_token=abc", &b), 0);
    sf_buf_append(&b, "", 1);
    assert_string_equal(b.p, "/");
    sf_buf_reset(&b);
    assert_int_equal(gw_pv_strip_token("/p?sf_token&sf_token=1&sf_tokens=2", &b), 0);
    sf_buf_append(&b, "", 1);
    assert_string_equal(b.p, "/p?sf_tokens=2");
    sf_buf_reset(&b);
    const char *c = "a=1; sf_preview=T1;sf_preview=T2 ; b=2";
    assert_int_equal(gw_pv_strip_cookie(c, strlen(c), &b), 0);
    sf_buf_append(&b, "", 1);
    assert_string_equal(b.p, "a=1; b=2");
    v = gw_pv_cookie_at(c, 0, &n);
    assert_true(v && n == 2 && !memcmp(v, "T1", 2));
    v = gw_pv_cookie_at(c, 1, &n);
    assert_true(v && n == 2 && !memcmp(v, "T2", 2));
    assert_null(gw_pv_cookie_at(c, 2, &n));
    assert_null(gw_pv_cookie_at("xsf_preview=1", 0, &n));
    v = gw_pv_query_token("a=1&sf_token=zz&b", &n);
    assert_true(v && n == 2 && !memcmp(v, "zz", 2));
    assert_null(gw_pv_query_token("xsf_token=1", &n));
    sf_buf_fini(&b);
}

static void page(void **state)
{
    sf_buf b;

    (void)state;
    sf_buf_init(&b, 1 << 16);
    assert_int_equal(gw_pv_page(&b, 404, "<script>x</script>", "a \"b\" & 'c'", NULL), 0);
    sf_buf_append(&b, "", 1);
    assert_non_null(strstr(b.p, "HTTP/1.1 404 Not Found\r\n"));
    assert_non_null(strstr(b.p, "Connection: close\r\n"));
    assert_null(strstr(b.p, "<script>"));
    assert_non_null(strstr(b.p, "&lt;script&gt;"));
    assert_non_null(strstr(b.p, "a &quot;b&quot; &amp; &#39;c&#39;"));
    assert_null(strstr(b.p, "Set-Cookie"));
    sf_buf_fini(&b);
}

int main(void)
{
    const struct CMUnitTest t[] = {
        cmocka_unit_test(tokens), cmocka_unit_test(hop_line), cmocka_unit_test(hosts),
        cmocka_unit_test(strip), cmocka_unit_test(page),
    };

    if (sodium_init() < 0)
        return 1;
    for (int i = 0; i < 32; i++)
        key[i] = (uint8_t)(i + 1);
    return cmocka_run_group_tests(t, NULL, NULL);
}
