/* libFuzzer harness for the secret-proxy's parsers of sandbox-controlled input. The first
 * byte picks the parser, the rest is its input:
 *   0  TLS ClientHello (sp_tls_sni)
 *   1  DNS query (sp_dns_parse_query, then sp_dns_answer)
 *   2  HTTP request head: sp_head_prescan, llhttp into sp_head, then the Host and
 *      URL splitting the proxy does (sp_hostport, sp_url_split)
 *   3  rules: JSON {"allow_out": [...], "deny_out": [...]} (sp_rules_parse, sp_decide)
 * Its corpus (tests/proxy/corpus) replays as the ctest case fuzz_proxy_corpus. */
#include "proxy.h"

#include <llhttp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int on_url(llhttp_t *p, const char *at, size_t n)
{
    sf_buf_append(&((sp_head *)p->data)->url, at, n);
    return 0;
}

static int on_field(llhttp_t *p, const char *at, size_t n)
{
    sp_head_field(p->data, at, n);
    return 0;
}

static int on_value(llhttp_t *p, const char *at, size_t n)
{
    sp_head_value(p->data, at, n);
    return 0;
}

static int on_done(llhttp_t *p)
{
    sp_head_end(p->data);
    return 0;
}

static void head(const uint8_t *d, size_t n)
{
    llhttp_settings_t s;
    llhttp_t p;
    sp_head h;
    const char *why, *host, *path;
    char name[SP_NAME_MAX];
    int port;

    if (sp_head_prescan((const char *)d, n, &why) < 0)
        return;
    sp_head_init(&h);
    llhttp_settings_init(&s);
    s.on_url = on_url;
    s.on_header_field = on_field;
    s.on_header_value = on_value;
    s.on_headers_complete = on_done;
    llhttp_init(&p, HTTP_REQUEST, &s);
    p.data = &h;
    llhttp_execute(&p, (const char *)d, n);
    if ((host = sp_head_get(&h, "host")))
        sp_hostport(host, strlen(host), name, &port, 80);
    if (h.url.p) {
        sp_url_split(h.url.p, name, &port, &path);
        sp_hostport(h.url.p, h.url.len, name, &port, 443);
    }
    sp_head_fini(&h);
}

static void rules(const uint8_t *d, size_t n)
{
    json_t *j = json_loadb((const char *)d, n, 0, NULL);
    sp_rules *r = NULL;
    sp_policy pol = {.default_allow = n & 1};
    char why[256];
    const char *reason;

    if (!j)
        return;
    if (sp_rules_parse(&pol, json_object_get(j, "allow_out"), json_object_get(j, "deny_out"), &r, why,
                       sizeof(why)) == 0) {
        sp_decide(&pol, r, "api.example.com", 0x5db8d822, &reason);
        sp_decide(&pol, r, NULL, 0x0a000001, &reason);
        sp_rules_unref(r);
    }
    json_decref(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char name[SP_NAME_MAX];
    uint8_t out[600];
    uint16_t qt;
    size_t ql;

    if (size < 1)
        return 0;
    switch (data[0] % 4) {
    case 0:
        sp_tls_sni(data + 1, size - 1, name);
        break;
    case 1:
        if (sp_dns_parse_query(data + 1, size - 1, name, &qt, &ql) == 0) {
            uint32_t ips[2] = {0x01020304, 0x05060708};
            sp_dns_answer(data + 1, ql, qt, 0, ips, 2, 30, out, sizeof(out));
        }
        break;
    case 2:
        head(data + 1, size - 1);
        break;
    default:
        rules(data + 1, size - 1);
    }
    return 0;
}
