/* Egress decisions. Precedence: reserved addresses and the platform's own (this host's
 * addresses, proxy_platform_addrs) never, whatever the rules say; private ranges only when
 * an allow_out IP/CIDR covers the address; then a matching allow_out name wins; then the
 * longest matching IP/CIDR of allow_out and deny_out (a tie goes to deny); then the
 * platform default. An allow_out entry lying wholly inside a never-reachable range is
 * refused when the rules are parsed (one that merely covers one is accepted: the range
 * inside stays blocked). */
#include "proxy.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <ifaddrs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Ranges every decision checks first, as numbers (no parsing per request). */
#define IP4(a, b, c, d) (((uint32_t)(a) << 24) | ((uint32_t)(b) << 16) | ((c) << 8) | (d))
static const struct {
    uint32_t net;
    int prefix;
    int reserved; /* 1: never reachable; 0: only when an allow_out IP/CIDR covers it */
    const char *what;
} special[] = {
    {IP4(0, 0, 0, 0), 8, 1, "'this network' addresses"},
    {IP4(127, 0, 0, 0), 8, 1, "loopback addresses"},
    {IP4(169, 254, 0, 0), 16, 1, "link-local addresses (cloud metadata, the proxy's own)"},
    {IP4(192, 0, 0, 0), 24, 1, "IETF protocol assignments (192.0.0.0/24)"},
    {IP4(100, 100, 100, 200), 32, 1, "a cloud metadata address"},
    {IP4(224, 0, 0, 0), 4, 1, "multicast addresses"},
    {IP4(240, 0, 0, 0), 4, 1, "reserved addresses"},
    {IP4(10, 0, 0, 0), 8, 0, NULL},    {IP4(172, 16, 0, 0), 12, 0, NULL},
    {IP4(192, 168, 0, 0), 16, 0, NULL}, {IP4(100, 64, 0, 0), 10, 0, NULL},
};

static uint32_t prefix_mask(int prefix)
{
    return prefix ? 0xffffffffu << (32 - prefix) : 0;
}

/* The never-reachable range that holds all of c, described for a sentence; NULL if none. */
static const char *never_holds(const sp_policy *p, const sp_cidr *c, char *buf, size_t len)
{
    for (size_t i = 0; i < SF_ARRAY_LEN(special); i++)
        if (special[i].reserved && c->prefix >= special[i].prefix &&
            (c->net & prefix_mask(special[i].prefix)) == special[i].net)
            return special[i].what;
    for (size_t i = 0; p && i < p->platform_n; i++)
        if (c->prefix >= p->platform[i].prefix &&
            (c->net & p->platform[i].mask) == p->platform[i].net) {
            struct in_addr a = {htonl(p->platform[i].net)};
            char ip[16];
            inet_ntop(AF_INET, &a, ip, sizeof(ip));
            snprintf(buf, len, "the platform's own addresses (%s/%d: this host or "
                     "proxy_platform_addrs)", ip, p->platform[i].prefix);
            return buf;
        }
    return NULL;
}

int sp_cidr_parse(const char *s, sp_cidr *out)
{
    char buf[32];
    const char *slash = strchr(s, '/');
    int64_t prefix = 32;
    struct in_addr a;
    size_t n = slash ? (size_t)(slash - s) : strlen(s);

    if (n == 0 || n >= sizeof(buf))
        return -EINVAL;
    memcpy(buf, s, n);
    buf[n] = '\0';
    if (inet_pton(AF_INET, buf, &a) != 1)
        return -EINVAL;
    if (slash && sf_parse_i64(slash + 1, 0, 32, &prefix) < 0)
        return -EINVAL;
    out->prefix = (int)prefix;
    out->mask = prefix ? 0xffffffffu << (32 - prefix) : 0;
    out->net = ntohl(a.s_addr) & out->mask;
    return 0;
}

static int cidr_has(const sp_cidr *c, uint32_t ip)
{
    return (ip & c->mask) == c->net;
}

sp_rules *sp_rules_ref(sp_rules *r)
{
    if (r)
        r->refs++;
    return r;
}

void sp_rules_unref(sp_rules *r)
{
    if (!r || --r->refs > 0)
        return;
    for (size_t i = 0; i < r->names_n; i++)
        free(r->names[i]);
    free(r->names);
    free(r->allow);
    free(r->deny);
    free(r);
}

static int is_name(const char *s)
{
    if (!*s || strlen(s) > 253)
        return 0;
    for (const char *p = s; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '-' && *p != '.' && *p != '_')
            return 0;
    return s[0] != '.' && s[strlen(s) - 1] != '.' && !strstr(s, "..");
}

int sp_rules_parse(const sp_policy *p, const json_t *allow, const json_t *deny, sp_rules **out,
                   char *why, size_t whylen)
{
    size_t na = json_array_size(allow), nd = json_array_size(deny), i;
    sp_rules *r;
    json_t *v;

    if ((allow && !json_is_array(allow)) || (deny && !json_is_array(deny))) {
        snprintf(why, whylen, "allow_out and deny_out must be arrays of strings.");
        return -EINVAL;
    }
    if (na + nd > SP_RULES_MAX) {
        snprintf(why, whylen, "allow_out and deny_out hold at most %d entries together.",
                 SP_RULES_MAX);
        return -EINVAL;
    }
    if (!(r = calloc(1, sizeof(*r))) || !(r->names = calloc(na + 1, sizeof(char *))) ||
        !(r->allow = calloc(na + 1, sizeof(sp_cidr))) ||
        !(r->deny = calloc(nd + 1, sizeof(sp_cidr)))) {
        r->refs = 1;
        sp_rules_unref(r);
        return -ENOMEM;
    }
    r->refs = 1;
    json_array_foreach(allow, i, v) {
        const char *s = json_string_value(v);
        char low[SP_NAME_MAX];
        size_t k;
        if (!s || strlen(s) >= sizeof(low))
            goto bad_allow;
        for (k = 0; s[k]; k++)
            low[k] = (char)tolower((unsigned char)s[k]);
        low[k] = '\0';
        if (sp_cidr_parse(low, &r->allow[r->allow_n]) == 0) {
            char buf[128];
            const char *what = never_holds(p, &r->allow[r->allow_n], buf, sizeof(buf));
            if (what) {
                snprintf(why, whylen, "allow_out[%zu] '%s' lies inside %s, which no sandbox "
                         "may reach whatever its rules say; remove it from allow_out.", i, s,
                         what);
                sp_rules_unref(r);
                return -EINVAL;
            }
            r->allow_n++;
        } else if (is_name(low[0] == '*' && low[1] == '.' ? low + 2 : low) &&
                   (low[0] != '*' || low[1] == '.') && strchr(low, '.')) {
            if (!(r->names[r->names_n] = strdup(low)))
                goto nomem;
            r->names_n++;
        } else {
            goto bad_allow;
        }
        continue;
    bad_allow:
        snprintf(why, whylen, "allow_out[%zu] must be a domain (api.example.com), a '*.' "
                 "wildcard (*.example.com), an IPv4 address or an IPv4 CIDR (10.0.0.0/8).", i);
        sp_rules_unref(r);
        return -EINVAL;
    }
    json_array_foreach(deny, i, v) {
        const char *s = json_string_value(v);
        if (!s || sp_cidr_parse(s, &r->deny[r->deny_n]) < 0) {
            snprintf(why, whylen, "deny_out[%zu] must be an IPv4 address or CIDR (e.g. "
                     "0.0.0.0/0); deny_out takes no domain names.", i);
            sp_rules_unref(r);
            return -EINVAL;
        }
        r->deny_n++;
    }
    *out = r;
    return 0;
nomem:
    sp_rules_unref(r);
    return -ENOMEM;
}

int sp_policy_add_platform(sp_policy *p, const char *list, char *why, size_t whylen)
{
    const char *at = list ? list : "";

    while (*at) {
        size_t n = strcspn(at, ", ");
        char tok[64];
        sp_cidr c, *grown;
        if (n == 0) {
            at++;
            continue;
        }
        if (n >= sizeof(tok) || (memcpy(tok, at, n), tok[n] = '\0', sp_cidr_parse(tok, &c) < 0)) {
            snprintf(why, whylen, "platform_addrs entry '%.*s' is not an IPv4 address or CIDR.",
                     (int)(n < 60 ? n : 60), at);
            return -EINVAL;
        }
        if (!(grown = realloc(p->platform, (p->platform_n + 1) * sizeof(*grown))))
            return -ENOMEM;
        p->platform = grown;
        p->platform[p->platform_n++] = c;
        at += n;
    }
    return 0;
}

int sp_policy_add_host_addrs(sp_policy *p)
{
    struct ifaddrs *ifa, *i;
    char buf[64], why[128];

    if (getifaddrs(&ifa) < 0)
        return -errno;
    for (i = ifa; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET)
            continue;
        inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, buf, sizeof(buf));
        sp_policy_add_platform(p, buf, why, sizeof(why));
    }
    freeifaddrs(ifa);
    return 0;
}

void sp_policy_fini(sp_policy *p)
{
    free(p->platform);
    p->platform = NULL;
    p->platform_n = 0;
}

static int allow_ip_covers(const sp_rules *r, uint32_t ip)
{
    for (size_t i = 0; r && i < r->allow_n; i++)
        if (cidr_has(&r->allow[i], ip))
            return 1;
    return 0;
}

int sp_decide(const sp_policy *p, const sp_rules *r, const char *name, uint32_t ip,
              const char **reason)
{
    int best_allow = -1, best_deny = -1;

    for (size_t i = 0; i < SF_ARRAY_LEN(special); i++) {
        if ((ip & prefix_mask(special[i].prefix)) != special[i].net)
            continue;
        if (special[i].reserved) {
            *reason = "reserved, link-local, metadata or loopback address (never reachable)";
            return 0;
        }
        if (!allow_ip_covers(r, ip)) {
            *reason = "private address (allow it with an IP or CIDR in allow_out)";
            return 0;
        }
    }
    for (size_t i = 0; i < p->platform_n; i++)
        if (cidr_has(&p->platform[i], ip)) {
            *reason = "address of the platform itself (never reachable)";
            return 0;
        }
    if (name && r)
        for (size_t i = 0; i < r->names_n; i++)
            if (sf_secret_host_match(r->names[i], name)) {
                *reason = "allow_out name";
                return 1;
            }
    for (size_t i = 0; r && i < r->allow_n; i++)
        if (cidr_has(&r->allow[i], ip) && r->allow[i].prefix > best_allow)
            best_allow = r->allow[i].prefix;
    for (size_t i = 0; r && i < r->deny_n; i++)
        if (cidr_has(&r->deny[i], ip) && r->deny[i].prefix > best_deny)
            best_deny = r->deny[i].prefix;
    if (best_allow >= 0 || best_deny >= 0) {
        *reason = best_allow > best_deny ? "allow_out address" : "deny_out";
        return best_allow > best_deny;
    }
    *reason = p->default_allow ? "default allow" : "not in allow_out (default deny)";
    return p->default_allow;
}

int sp_name_lookup_allowed(const sp_policy *p, const sp_rules *r, const char *name)
{
    struct in_addr lit;
    int allow0 = 0, deny0 = 0;

    if (inet_pton(AF_INET, name, &lit) == 1)
        return 1; /* no lookup: the address is judged as it is */
    for (size_t i = 0; r && i < r->names_n; i++)
        if (sf_secret_host_match(r->names[i], name))
            return 1;
    for (size_t i = 0; r && i < r->allow_n; i++)
        allow0 |= r->allow[i].prefix == 0;
    for (size_t i = 0; r && i < r->deny_n; i++)
        deny0 |= r->deny[i].prefix == 0;
    /* the decision for an address only a /0 rule (or none) covers; a tie denies */
    return allow0 || deny0 ? allow0 && !deny0 : p->default_allow;
}
