/* Unit tests of the secret-proxy's pure parts: rules and decisions, request-head checks
 * and the token swap, the ClientHello reader, the DNS codec, and the secrets store's
 * sealing and host patterns (state/sf_secrets). */
#include "proxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <setjmp.h>
#include <sodium.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static uint32_t ip(const char *s)
{
    struct in_addr a;
    assert_int_equal(inet_pton(AF_INET, s, &a), 1);
    return ntohl(a.s_addr);
}

static sp_rules *rules(const char *allow, const char *deny)
{
    json_t *a = allow ? json_loads(allow, 0, NULL) : NULL, *d = deny ? json_loads(deny, 0, NULL) : NULL;
    sp_rules *r = NULL;
    char why[256];

    assert_int_equal(sp_rules_parse(NULL, a, d, &r, why, sizeof(why)), 0);
    json_decref(a);
    json_decref(d);
    return r;
}

static void test_decide(void **state)
{
    sp_policy deny = {.default_allow = 0}, allow = {.default_allow = 1};
    const char *why;
    sp_rules *none = rules(NULL, NULL);
    sp_rules *strict = rules("[\"api.example.com\"]", "[\"0.0.0.0/0\"]");
    sp_rules *narrow = rules("[\"10.0.0.0/8\", \"*.example.org\"]", "[\"10.1.0.0/16\"]");
    sp_rules *holes = rules("[\"1.2.3.4\"]", "[\"1.2.0.0/16\"]");

    /* default deny: nothing without rules */
    assert_int_equal(sp_decide(&deny, none, "api.example.com", ip("93.184.216.34"), &why), 0);
    /* default allow (the reference's semantics, docs/contract.md): everything not denied */
    assert_int_equal(sp_decide(&allow, none, "api.example.com", ip("93.184.216.34"), &why), 1);
    /* deny 0.0.0.0/0 + allow one name: exactly that name */
    assert_int_equal(sp_decide(&allow, strict, "api.example.com", ip("93.184.216.34"), &why), 1);
    assert_int_equal(sp_decide(&allow, strict, "other.com", ip("93.184.216.34"), &why), 0);
    assert_int_equal(sp_decide(&allow, strict, NULL, ip("93.184.216.34"), &why), 0);
    /* names match case-insensitively; wildcards cover subdomains, not the apex */
    assert_int_equal(sp_decide(&deny, narrow, "a.b.example.org", ip("93.184.216.34"), &why), 1);
    assert_int_equal(sp_decide(&deny, narrow, "example.org", ip("93.184.216.34"), &why), 0);
    assert_int_equal(sp_decide(&deny, narrow, "evilexample.org", ip("93.184.216.34"), &why), 0);
    /* longest prefix wins: deny_out narrows an allowed range */
    assert_int_equal(sp_decide(&deny, narrow, NULL, ip("10.2.3.4"), &why), 1);
    assert_int_equal(sp_decide(&deny, narrow, NULL, ip("10.1.3.4"), &why), 0);
    assert_int_equal(sp_decide(&deny, holes, NULL, ip("1.2.3.4"), &why), 1);
    assert_int_equal(sp_decide(&deny, holes, NULL, ip("1.2.3.5"), &why), 0);
    /* private and link-local: only with an address rule, never by name */
    assert_int_equal(sp_decide(&allow, none, NULL, ip("192.168.1.1"), &why), 0);
    assert_int_equal(sp_decide(&allow, none, NULL, ip("169.254.169.254"), &why), 0);
    assert_int_equal(sp_decide(&deny, strict, "api.example.com", ip("10.0.0.1"), &why), 0);
    /* loopback, link-local, metadata and 192.0.0.0/24: never, even under an allow_out that
     * covers them (an entry wholly inside one is refused by sp_rules_parse) */
    sp_rules *open = rules("[\"0.0.0.0/0\"]", NULL);
    assert_int_equal(sp_decide(&deny, open, NULL, ip("127.0.0.1"), &why), 0);
    assert_int_equal(sp_decide(&deny, open, NULL, ip("169.254.169.254"), &why), 0);
    assert_int_equal(sp_decide(&deny, open, NULL, ip("169.254.77.1"), &why), 0);
    assert_int_equal(sp_decide(&deny, open, NULL, ip("192.0.0.9"), &why), 0);
    assert_int_equal(sp_decide(&deny, open, NULL, ip("100.100.100.200"), &why), 0);
    assert_int_equal(sp_decide(&deny, open, NULL, ip("10.1.2.3"), &why), 1); /* private: covered */
    assert_int_equal(sp_decide(&deny, open, NULL, ip("93.184.216.34"), &why), 1);
    sp_rules_unref(open);
    sp_rules_unref(none);
    sp_rules_unref(strict);
    sp_rules_unref(narrow);
    sp_rules_unref(holes);
}

static void test_decide_platform(void **state)
{
    sp_policy p = {.default_allow = 1};
    char why[128];
    const char *r;
    sp_rules *a = rules("[\"203.0.0.0/8\"]", NULL), *x = NULL;
    json_t *inside = json_loads("[\"1.2.3.4\", \"203.0.113.5\"]", 0, NULL);
    char w[256];

    assert_int_equal(sp_policy_add_platform(&p, "203.0.113.0/24, 198.51.100.7", why, sizeof(why)), 0);
    assert_int_equal(sp_decide(&p, NULL, NULL, ip("203.0.113.9"), &r), 0);
    assert_int_equal(sp_decide(&p, NULL, NULL, ip("198.51.100.7"), &r), 0);
    /* an allow_out that covers a platform range leaves it blocked; one inside is refused */
    assert_int_equal(sp_decide(&p, a, NULL, ip("203.0.113.5"), &r), 0);
    assert_int_equal(sp_decide(&p, a, NULL, ip("203.0.112.5"), &r), 1);
    assert_int_equal(sp_rules_parse(&p, inside, NULL, &x, w, sizeof(w)), -EINVAL);
    assert_non_null(strstr(w, "allow_out[1] '203.0.113.5'"));
    assert_non_null(strstr(w, "203.0.113.0/24"));
    assert_int_equal(sp_policy_add_platform(&p, "nope", why, sizeof(why)), -EINVAL);
    json_decref(inside);
    sp_rules_unref(a);
    sp_policy_fini(&p);
}

static void test_rules_parse_errors(void **state)
{
    sp_rules *r;
    char why[256];
    json_t *bad = json_loads("[\"a b\"]", 0, NULL), *dn = json_loads("[\"example.com\"]", 0, NULL);

    assert_int_equal(sp_rules_parse(NULL, bad, NULL, &r, why, sizeof(why)), -EINVAL);
    assert_non_null(strstr(why, "allow_out[0]"));
    assert_int_equal(sp_rules_parse(NULL, NULL, dn, &r, why, sizeof(why)), -EINVAL);
    assert_non_null(strstr(why, "deny_out takes no domain names"));
    json_decref(bad);
    json_decref(dn);
    /* entries wholly inside a never-reachable range: refused, naming the entry */
    static const char *never[] = {"[\"169.254.169.254\"]", "[\"169.254.0.0/16\"]",
                                  "[\"127.0.0.1\"]", "[\"192.0.0.8/29\"]",
                                  "[\"100.100.100.200\"]"};
    for (size_t i = 0; i < sizeof(never) / sizeof(never[0]); i++) {
        json_t *a = json_loads(never[i], 0, NULL);
        char want[64];
        assert_int_equal(sp_rules_parse(NULL, a, NULL, &r, why, sizeof(why)), -EINVAL);
        snprintf(want, sizeof(want), "allow_out[0] '%.*s'", (int)strlen(never[i]) - 4,
                 never[i] + 2);
        assert_non_null(strstr(why, want));
        assert_non_null(strstr(why, "remove it from allow_out"));
        json_decref(a);
    }
}

static void test_name_lookup(void **state)
{
    sp_policy deny = {.default_allow = 0}, allow = {.default_allow = 1};
    sp_rules *names = rules("[\"api.example.com\", \"*.example.org\", \"10.0.0.0/8\"]", NULL);
    sp_rules *strict = rules("[\"api.example.com\"]", "[\"0.0.0.0/0\"]");
    sp_rules *open = rules("[\"0.0.0.0/0\"]", NULL);
    sp_rules *tie = rules("[\"0.0.0.0/0\"]", "[\"0.0.0.0/0\"]");

    assert_int_equal(sp_name_lookup_allowed(&deny, names, "api.example.com"), 1);
    assert_int_equal(sp_name_lookup_allowed(&deny, names, "a.example.org"), 1);
    assert_int_equal(sp_name_lookup_allowed(&deny, names, "example.org"), 0);
    assert_int_equal(sp_name_lookup_allowed(&deny, names, "leak.attacker.test"), 0);
    assert_int_equal(sp_name_lookup_allowed(&deny, names, "10.1.2.3"), 1); /* no lookup */
    assert_int_equal(sp_name_lookup_allowed(&deny, NULL, "anything.test"), 0);
    assert_int_equal(sp_name_lookup_allowed(&allow, NULL, "anything.test"), 1);
    assert_int_equal(sp_name_lookup_allowed(&allow, names, "anything.test"), 1);
    assert_int_equal(sp_name_lookup_allowed(&allow, strict, "anything.test"), 0);
    assert_int_equal(sp_name_lookup_allowed(&allow, strict, "api.example.com"), 1);
    assert_int_equal(sp_name_lookup_allowed(&deny, open, "anything.test"), 1);
    assert_int_equal(sp_name_lookup_allowed(&allow, tie, "anything.test"), 0);
    sp_rules_unref(names);
    sp_rules_unref(strict);
    sp_rules_unref(open);
    sp_rules_unref(tie);
}

static void test_prescan(void **state)
{
    const char *why;
    const char ok[] = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    const char fold[] = "GET / HTTP/1.1\r\nX: a\r\n b\r\n\r\n";
    const char lf[] = "GET / HTTP/1.1\nHost: a\r\n\r\n";
    const char cr[] = "GET / HTTP/1.1\r\nX: a\rb\r\n\r\n";

    assert_int_equal(sp_head_prescan(ok, strlen(ok), &why), 0);
    assert_int_equal(sp_head_prescan(fold, strlen(fold), &why), -EINVAL);
    assert_non_null(strstr(why, "folded"));
    assert_int_equal(sp_head_prescan(lf, strlen(lf), &why), -EINVAL);
    assert_int_equal(sp_head_prescan(cr, strlen(cr), &why), -EINVAL);
}

static void test_hostport_url(void **state)
{
    char h[SP_NAME_MAX];
    int port;
    const char *path;

    assert_int_equal(sp_hostport("API.Example.com:8080", 20, h, &port, 80), 0);
    assert_string_equal(h, "api.example.com");
    assert_int_equal(port, 8080);
    assert_int_equal(sp_hostport("example.com.", 12, h, &port, 80), 0);
    assert_string_equal(h, "example.com");
    assert_int_equal(port, 80);
    assert_int_equal(sp_hostport("[::1]:80", 8, h, &port, 80), -EINVAL);
    assert_int_equal(sp_hostport("a:99999", 7, h, &port, 80), -EINVAL);
    assert_int_equal(sp_hostport("a b", 3, h, &port, 80), -EINVAL);
    assert_int_equal(sp_url_split("http://x.test:81/p?q", h, &port, &path), 0);
    assert_string_equal(h, "x.test");
    assert_int_equal(port, 81);
    assert_string_equal(path, "/p?q");
    assert_int_equal(sp_url_split("http://x.test", h, &port, &path), 0);
    assert_string_equal(path, "/");
    assert_int_equal(sp_url_split("http://user@x.test/", h, &port, &path), -EINVAL);
    assert_int_equal(sp_url_split("https://x.test/", h, &port, &path), -EINVAL);
}

static void add_hdr(sp_head *h, const char *n, const char *v)
{
    sp_head_field(h, n, strlen(n));
    sp_head_value(h, v, strlen(v));
}

static void test_swap(void **state)
{
    sp_sandbox sb = {0};
    sp_binding b[2] = {0};
    sp_head h;
    sf_buf out;
    int inj, foreign;
    static uint8_t v1[] = "REAL1", v2[] = "REAL2";

    assert_int_equal(sodium_init() >= 0, 1);
    assert_int_equal(sf_placeholder_new(b[0].placeholder), 0);
    assert_int_equal(sf_placeholder_new(b[1].placeholder), 0);
    b[0].sec.hosts[0] = "api.example.com";
    b[0].sec.hosts_n = 1;
    b[0].sec.value = v1;
    b[0].sec.value_len = 5;
    b[0].sec.any_header = 1; /* --any-header */
    b[1].sec.hosts[0] = "*.gh.test";
    b[1].sec.hosts_n = 1;
    strcpy(b[1].sec.header, "Authorization");
    strcpy(b[1].sec.format, "Bearer {}");
    b[1].sec.value = v2;
    b[1].sec.value_len = 5;
    sb.bind = b;
    sb.bind_n = 2;
    sp_head_init(&h);
    sf_buf_init(&out, 1 << 16);
    add_hdr(&h, "X-Key", b[0].placeholder);
    add_hdr(&h, "authorization", b[1].placeholder);
    add_hdr(&h, "Proxy-Connection", "keep-alive");
    sp_head_end(&h);

    assert_int_equal(sp_head_write(&out, "GET", "/x", 1, &h, &sb, "api.example.com", 1, &inj, &foreign), 0);
    assert_int_equal(inj, 1);
    assert_int_equal(foreign, 1);
    assert_non_null(strstr(out.p, "X-Key: REAL1\r\n"));
    assert_non_null(strstr(out.p, b[1].placeholder)); /* GH not for this host */
    assert_null(strstr(out.p, "Proxy-Connection"));
    assert_non_null(strstr(out.p, "GET /x HTTP/1.1\r\n"));

    sf_buf_reset(&out);
    assert_int_equal(sp_head_write(&out, "GET", "/", 1, &h, &sb, "api.gh.test", 1, &inj, &foreign), 0);
    assert_int_equal(inj, 1);
    assert_non_null(strstr(out.p, "authorization: Bearer REAL2\r\n"));
    assert_non_null(strstr(out.p, b[0].placeholder));

    sf_buf_reset(&out); /* an IP literal never matches a name */
    assert_int_equal(sp_head_write(&out, "GET", "/", 1, &h, &sb, "93.184.216.34", 1, &inj, &foreign), 0);
    assert_int_equal(inj, 0);
    assert_int_equal(foreign, 2);

    /* plain HTTP: neither is swapped unless made --allow-http */
    sf_buf_reset(&out);
    assert_int_equal(sp_head_write(&out, "GET", "/", 1, &h, &sb, "api.example.com", 0, &inj, &foreign), 0);
    assert_int_equal(inj, 0);
    assert_non_null(strstr(out.p, b[0].placeholder));
    b[0].sec.allow_http = 1;
    sf_buf_reset(&out);
    assert_int_equal(sp_head_write(&out, "GET", "/", 1, &h, &sb, "api.example.com", 0, &inj, &foreign), 0);
    assert_int_equal(inj, 1);
    /* no --header, no --any-header: Authorization only */
    b[0].sec.any_header = 0;
    sf_buf_reset(&out);
    assert_int_equal(sp_head_write(&out, "GET", "/", 1, &h, &sb, "api.example.com", 1, &inj, &foreign), 0);
    assert_int_equal(inj, 0);
    assert_non_null(strstr(out.p, "X-Key: sfph_"));

    b[0].sec.value = NULL; /* a deleted secret: never swapped */
    sf_buf_reset(&out);
    assert_int_equal(sp_head_write(&out, "GET", "/", 1, &h, &sb, "api.example.com", 1, &inj, &foreign), 0);
    assert_int_equal(inj, 0);
    sp_head_fini(&h);
    sf_buf_fini(&out);
}

/* A minimal TLS 1.2 ClientHello with an SNI extension for name. */
static size_t hello(uint8_t *p, const char *name)
{
    size_t nl = strlen(name), ext = 9 + nl, body = 2 + 32 + 1 + 4 + 2 + 2 + ext, i = 0;

    p[i++] = 0x16, p[i++] = 3, p[i++] = 1, p[i++] = (uint8_t)((body + 4) >> 8), p[i++] = (uint8_t)(body + 4);
    p[i++] = 1, p[i++] = 0, p[i++] = (uint8_t)(body >> 8), p[i++] = (uint8_t)body;
    p[i++] = 3, p[i++] = 3;
    memset(p + i, 7, 32), i += 32;
    p[i++] = 0;                                  /* session id */
    p[i++] = 0, p[i++] = 2, p[i++] = 0x13, p[i++] = 1; /* one cipher */
    p[i++] = 1, p[i++] = 0;                      /* null compression */
    p[i++] = (uint8_t)(ext >> 8), p[i++] = (uint8_t)ext;
    p[i++] = 0, p[i++] = 0, p[i++] = (uint8_t)((nl + 5) >> 8), p[i++] = (uint8_t)(nl + 5);
    p[i++] = (uint8_t)((nl + 3) >> 8), p[i++] = (uint8_t)(nl + 3), p[i++] = 0;
    p[i++] = (uint8_t)(nl >> 8), p[i++] = (uint8_t)nl;
    memcpy(p + i, name, nl), i += nl;
    return i;
}

static void test_sni(void **state)
{
    uint8_t p[512];
    char name[SP_NAME_MAX];
    size_t n = hello(p, "API.Example.com");

    assert_int_equal(sp_tls_sni(p, n, name), 0);
    assert_string_equal(name, "api.example.com");
    for (size_t k = 0; k < n; k++) /* every truncation asks for more, never reads past */
        assert_int_equal(sp_tls_sni(p, k, name), k < 5 ? -EAGAIN : k < n ? -EAGAIN : 0);
    p[5] = 2; /* not a ClientHello */
    assert_int_equal(sp_tls_sni(p, n, name), -EINVAL);
    n = hello(p, "bad\x01name");
    assert_int_equal(sp_tls_sni(p, n, name), -EINVAL);
    assert_int_equal(sp_tls_sni((const uint8_t *)"GET / HTTP/1.1", 14, name), -EINVAL);
}

static void test_dns(void **state)
{
    uint8_t q[] = {0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 3, 'A', 'p', 'i', 4, 't',
                   'e', 's', 't', 0, 0, 1, 0, 1};
    uint8_t out[512];
    char name[SP_NAME_MAX];
    uint16_t qt;
    size_t ql, n;
    uint32_t ips[2] = {0x0a000001, 0xc6120a0a};

    assert_int_equal(sp_dns_parse_query(q, sizeof(q), name, &qt, &ql), 0);
    assert_string_equal(name, "api.test");
    assert_int_equal(qt, 1);
    assert_int_equal(ql, sizeof(q));
    n = sp_dns_answer(q, ql, qt, 0, ips, 2, 30, out, sizeof(out));
    assert_int_equal(n, sizeof(q) + 32);
    assert_int_equal(out[0], 0xab);
    assert_int_equal(out[2] & 0x80, 0x80);
    assert_int_equal(out[3] & 0x0f, 0);
    assert_int_equal(out[7], 2);
    assert_int_equal(out[sizeof(q) + 12 + 16 + 3], 0x0a);
    n = sp_dns_answer(q, ql, qt, 3, NULL, 0, 0, out, sizeof(out));
    assert_int_equal(out[3] & 0x0f, 3);
    assert_int_equal(out[7], 0);
    q[12] = 0xc0; /* a compression pointer in the question */
    assert_int_equal(sp_dns_parse_query(q, sizeof(q), name, &qt, &ql), -EINVAL);
    q[12] = 3;
    q[2] = 0x81; /* a response */
    assert_int_equal(sp_dns_parse_query(q, sizeof(q), name, &qt, &ql), -EINVAL);
    assert_int_equal(sp_dns_parse_query(q, 11, name, &qt, &ql), -EINVAL);
}

static void test_seal(void **state)
{
    uint8_t key[32], other[32], *v = NULL;
    size_t n = 0;
    char *sealed = NULL;

    randombytes_buf(key, sizeof(key));
    randombytes_buf(other, sizeof(other));
    assert_int_equal(sf_secret_seal(key, "alpha", "TOKEN", (const uint8_t *)"s3cret", 6, &sealed), 0);
    assert_null(strstr(sealed, "s3cret"));
    assert_int_equal(sf_secret_open(key, "alpha", "TOKEN", sealed, &v, &n), 0);
    assert_int_equal(n, 6);
    assert_memory_equal(v, "s3cret", 6);
    sodium_free(v);
    /* bound to its team and name, and to the key */
    assert_int_equal(sf_secret_open(key, "beta", "TOKEN", sealed, &v, &n), -EBADMSG);
    assert_int_equal(sf_secret_open(key, "alpha", "OTHER", sealed, &v, &n), -EBADMSG);
    assert_int_equal(sf_secret_open(other, "alpha", "TOKEN", sealed, &v, &n), -EBADMSG);
    sealed[10] ^= 1;
    assert_int_equal(sf_secret_open(key, "alpha", "TOKEN", sealed, &v, &n), -EBADMSG);
    free(sealed);
}

static void test_secret_checks(void **state)
{
    char out[SF_SECRET_HOST_MAX + 1], why[256];

    assert_int_equal(sf_secret_host_norm("API.Example.COM", out, why, sizeof(why)), 0);
    assert_string_equal(out, "api.example.com");
    assert_int_equal(sf_secret_host_norm("*.example.com", out, why, sizeof(why)), 0);
    assert_int_equal(sf_secret_host_norm("10.0.0.1", out, why, sizeof(why)), 0);
    assert_int_equal(sf_secret_host_norm("*example.com", out, why, sizeof(why)), -EINVAL);
    assert_int_equal(sf_secret_host_norm("a..b", out, why, sizeof(why)), -EINVAL);
    assert_int_equal(sf_secret_host_norm("http://a.b", out, why, sizeof(why)), -EINVAL);
    assert_true(sf_secret_host_match("*.example.com", "a.example.com"));
    assert_false(sf_secret_host_match("*.example.com", "example.com"));
    assert_false(sf_secret_host_match("*.example.com", "aexample.com"));
    assert_true(sf_secret_host_match("api.example.com", "API.example.com"));
    assert_int_equal(sf_secret_value_check((const uint8_t *)"a\nb", 3, why, sizeof(why)), -EINVAL);
    assert_int_equal(sf_secret_value_check((const uint8_t *)"", 0, why, sizeof(why)), -EINVAL);
    assert_int_equal(sf_secret_format_check("Authorization", "Bearer {}", why, sizeof(why)), 0);
    assert_int_equal(sf_secret_format_check("Authorization", "Bearer", why, sizeof(why)), -EINVAL);
    assert_int_equal(sf_secret_format_check("Authorization", "{} {}", why, sizeof(why)), -EINVAL);
    assert_int_equal(sf_secret_format_check("", "{}", why, sizeof(why)), -EINVAL);
    assert_int_equal(sf_secret_format_check("Bad Header", "", why, sizeof(why)), -EINVAL);
    assert_true(sf_secret_name_valid("GH_TOKEN-2"));
    assert_false(sf_secret_name_valid("a b"));
}

static void test_netlog_args(void **state)
{
    int lim;
    char why[128];

    assert_int_equal(sf_netlog_args_check(0, NULL, &lim, why, sizeof(why)), 0);
    assert_int_equal(lim, 50);
    assert_int_equal(sf_netlog_args_check(200, "blocked", &lim, why, sizeof(why)), 0);
    assert_int_equal(lim, 200);
    assert_int_equal(sf_netlog_args_check(201, NULL, &lim, why, sizeof(why)), -EINVAL);
    assert_int_equal(sf_netlog_args_check(5, "maybe", &lim, why, sizeof(why)), -EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decide),       cmocka_unit_test(test_decide_platform),
        cmocka_unit_test(test_rules_parse_errors),
        cmocka_unit_test(test_name_lookup), cmocka_unit_test(test_prescan),
        cmocka_unit_test(test_hostport_url), cmocka_unit_test(test_swap),
        cmocka_unit_test(test_sni),          cmocka_unit_test(test_dns),
        cmocka_unit_test(test_seal),         cmocka_unit_test(test_secret_checks),
        cmocka_unit_test(test_netlog_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
