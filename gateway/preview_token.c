/* preview_token.c: what names a preview and what proves a right to it (contract:
 * docs/internals/preview.md): host names and labels, private link tokens, the hop line,
 * and the gateway's own parameters (sf_token, the sf_preview cookie) found and removed.
 * Pure functions: no I/O, no state. */
#include "preview.h"
#include "sf_pvtoken.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define TOKEN_MAX 256

int gw_pv_parse_label(const char *s, size_t n, gw_pv_target *t, const char **why)
{
    size_t i = 0, id;
    unsigned port = 0;

    while (i < n && i < 6 && s[i] >= '0' && s[i] <= '9')
        port = port * 10 + (unsigned)(s[i++] - '0');
    if (i == 0 || i > 5 || port == 0 || port > 65535 || s[0] == '0' || i >= n || s[i] != '-') {
        *why = "the address does not start with a port number and a dash "
               "({port}-{label}, e.g. 8000-sb-abc)";
        return -EINVAL;
    }
    i++;
    if (n - i < 4 || strncasecmp(s + i, "sb-", 3) != 0) {
        *why = "the label after the port is not a sandbox id (sb-...)";
        return -EINVAL;
    }
    if (n - i >= sizeof(t->sandbox)) {
        *why = "the sandbox id in the address is too long";
        return -EINVAL;
    }
    memcpy(t->sandbox, "sb_", 3);
    id = 3;
    for (i += 3; i < n; i++) {
        char c = (char)tolower((unsigned char)s[i]);

        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))) {
            *why = "the sandbox id in the address has a character ids never have";
            return -EINVAL;
        }
        t->sandbox[id++] = c;
    }
    t->sandbox[id] = 0;
    t->port = port;
    return 0;
}

int gw_pv_domain_host(const char *domain, char *out, size_t n)
{
    size_t len = strlen(domain), i;
    const char *colon = strrchr(domain, ':');

    if (colon)
        len = (size_t)(colon - domain);
    if (len == 0 || len >= n)
        return -EINVAL;
    for (i = 0; i < len; i++) {
        char c = (char)tolower((unsigned char)domain[i]);

        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.'))
            return -EINVAL;
    }
    for (i = 0; i < len; i++) /* (out only on success) */
        out[i] = (char)tolower((unsigned char)domain[i]);
    out[len] = 0;
    return 0;
}

int gw_pv_match_host(const char *host, const char *dom_host, gw_pv_target *t, int *ok,
                     const char **why)
{
    size_t n, m = strlen(dom_host);
    const char *colon;

    if (!host || !*host || host[0] == '[' || m == 0)
        return 0;
    n = strlen(host);
    if ((colon = strrchr(host, ':'))) { /* a port: any */
        for (const char *p = colon + 1; *p; p++)
            if (*p < '0' || *p > '9')
                return 0;
        n = (size_t)(colon - host);
    }
    if (n > 0 && host[n - 1] == '.') /* a fully qualified name */
        n--;
    if (n == m && !strncasecmp(host, dom_host, m)) {
        *ok = 0;
        *why = "this is the preview domain itself; a preview's address is "
               "{port}-{label}.<this domain>";
        return 1;
    }
    if (n <= m + 1 || host[n - m - 1] != '.' || strncasecmp(host + n - m, dom_host, m) != 0)
        return 0;
    n -= m + 1;
    if (memchr(host, '.', n)) {
        *ok = 0;
        *why = "a preview's address has one label before the preview domain";
        return 1;
    }
    *ok = gw_pv_parse_label(host, n, t, why) == 0;
    return 1;
}

static int all_of(const char *s, const char *set, size_t min, size_t max)
{
    size_t n = strlen(s);

    return n >= min && n <= max && strspn(s, set) == n;
}

#define DIGITS "0123456789"
#define HEXLOW "0123456789abcdef"

int gw_pv_token_check(const char *tok, size_t n, const uint8_t key[32], const char *sandbox,
                      unsigned port, uint64_t epoch, int64_t now_s, int64_t *exp)
{
    char buf[TOKEN_MAX + 1], *f[6], *save, hex[SF_PV_MAC_HEX + 1], canon[48], given[48];
    char portstr[8];
    uint64_t tep;
    int64_t texp;

    if (n == 0 || n > TOKEN_MAX)
        return GW_PV_TOK_MALFORMED;
    memcpy(buf, tok, n);
    buf[n] = 0;
    if (strncmp(buf, "v1.", 3) != 0)
        return GW_PV_TOK_MALFORMED;
    save = buf + 3;
    for (int i = 0; i < 6; i++) { /* id, port, epoch, exp, nonce, mac */
        char *dot = strchr(save, '.');

        f[i] = save;
        if ((i < 5) != (dot != NULL))
            return GW_PV_TOK_MALFORMED;
        if (dot) {
            *dot = 0;
            save = dot + 1;
        }
    }
    /* f: id, port, epoch, exp, nonce, mac */
    if (!all_of(f[0], "sb_" "abcdefghijklmnopqrstuvwxyz" DIGITS, 4, GW_PV_ID_MAX - 1) ||
        !all_of(f[1], DIGITS, 1, 5) || !all_of(f[2], DIGITS, 1, 20) ||
        !all_of(f[3], DIGITS, 1, 19) || !all_of(f[4], HEXLOW, 16, 16) ||
        !all_of(f[5], HEXLOW, 64, 64))
        return GW_PV_TOK_MALFORMED;
    snprintf(portstr, sizeof(portstr), "%u", port);
    if (strcmp(f[0], sandbox) != 0 || strcmp(f[1], portstr) != 0)
        return GW_PV_TOK_OTHER;
    errno = 0;
    tep = strtoull(f[2], NULL, 10);
    texp = strtoll(f[3], NULL, 10);
    snprintf(canon, sizeof(canon), "%" PRIu64 ".%" PRId64, tep, texp);
    snprintf(given, sizeof(given), "%s.%s", f[2], f[3]);
    if (errno || strcmp(canon, given) != 0) /* (the numbers as the worker writes them) */
        return GW_PV_TOK_MALFORMED;
    sf_pv_link_mac(key, f[0], port, tep, texp, f[4], hex);
    if (sf_pv_hex_equal(hex, f[5], SF_PV_MAC_HEX) != 0)
        return GW_PV_TOK_BADMAC;
    if (texp <= now_s)
        return GW_PV_TOK_EXPIRED;
    if (tep != epoch)
        return GW_PV_TOK_EPOCH;
    *exp = texp;
    return GW_PV_TOK_OK;
}

const char *gw_pv_token_why(int verdict)
{
    switch (verdict) {
    case GW_PV_TOK_OTHER:
        return "The link you opened was made for another port or sandbox; ask for this "
               "port's link with sandbox_preview_url.";
    case GW_PV_TOK_BADMAC:
    case GW_PV_TOK_MALFORMED:
        return "The link's token was altered or is not one of this platform's; open the "
               "whole link as sandbox_preview_url gave it, or ask for a new one.";
    case GW_PV_TOK_EXPIRED:
        return "The link has expired; ask for a new one with sandbox_preview_url.";
    case GW_PV_TOK_EPOCH:
        return "The port was published again (or closed) since this link was made; ask for "
               "a new link with sandbox_preview_url.";
    default:
        return "This preview is private: open it with the link sandbox_preview_url gives "
               "(it ends in ?sf_token=...).";
    }
}

const char *gw_pv_cookie_at(const char *cookie, size_t i, size_t *len)
{
    const char *p = cookie;

    while (p && *p) {
        const char *end = strchr(p, ';'), *eq;
        size_t n;

        while (*p == ' ' || *p == '\t')
            p++;
        n = end ? (size_t)(end - p) : strlen(p);
        eq = memchr(p, '=', n);
        if (eq && (size_t)(eq - p) == 10 && !memcmp(p, "sf_preview", 10)) {
            if (i-- == 0) {
                *len = n - 11;
                while (*len && (eq[*len] == ' ' || eq[*len] == '\t'))
                    (*len)--;
                return eq + 1;
            }
        }
        p = end ? end + 1 : NULL;
    }
    return NULL;
}

const char *gw_pv_query_token(const char *q, size_t *len)
{
    const char *p = q;

    while (p && *p) {
        const char *end = strchr(p, '&');
        size_t n = end ? (size_t)(end - p) : strlen(p);

        if (n >= 9 && !memcmp(p, "sf_token=", 9)) {
            *len = n - 9;
            return p + 9;
        }
        p = end ? end + 1 : NULL;
    }
    return NULL;
}

int gw_pv_strip_token(const char *target, sf_buf *out)
{
    const char *q = strchr(target, '?'), *p;
    int first = 1;

    if (!q)
        return sf_buf_append(out, target, strlen(target)) < 0 ? -ENOSPC : 0;
    if (sf_buf_append(out, target, (size_t)(q - target)) < 0)
        return -ENOSPC;
    for (p = q + 1; p && *p;) {
        const char *end = strpbrk(p, "&#");
        size_t n = end ? (size_t)(end - p) : strlen(p);

        if (!(n >= 9 && !memcmp(p, "sf_token=", 9)) && !(n == 8 && !memcmp(p, "sf_token", 8)) &&
            n > 0) {
            if (sf_buf_append(out, first ? "?" : "&", 1) < 0 || sf_buf_append(out, p, n) < 0)
                return -ENOSPC;
            first = 0;
        }
        if (end && *end == '#')
            break; /* (browsers never send a fragment) */
        p = end ? end + 1 : NULL;
    }
    return 0;
}

int gw_pv_strip_cookie(const char *cookie, size_t len, sf_buf *out)
{
    size_t i = 0;
    int first = 1;

    while (i < len) {
        size_t j = i, s;

        while (j < len && cookie[j] != ';')
            j++;
        s = i;
        while (s < j && (cookie[s] == ' ' || cookie[s] == '\t'))
            s++;
        if (j > s && !(j - s >= 11 && !memcmp(cookie + s, "sf_preview=", 11))) {
            if ((!first && sf_buf_append(out, "; ", 2) < 0) ||
                sf_buf_append(out, cookie + s, j - s) < 0)
                return -ENOSPC;
            first = 0;
        }
        i = j + 1;
    }
    return 0;
}
