/* sandfleet-secret-proxy: shared types and the functions modules call on each other.
 * Modules: main.c (config, start, stop), ctl.c (control socket), sandbox.c (registry,
 * listeners inside each sandbox's netns, bindings and secrets), rules.c (allow/deny
 * decisions), resolve.c (names, cache), dns.c (the sandbox's resolver), conn.c
 * (connections: sniffing, HTTP, tunnels), http.c (request heads, token swap), tls.c
 * (CA, minted certificates, ClientHello), netlog.c (network log writes). */
#ifndef SP_PROXY_H
#define SP_PROXY_H

#include "sf_buf.h"
#include "sf_daemon.h"
#include "sf_map.h"
#include "sf_netlog.h"
#include "sf_redis.h"
#include "sf_secrets.h"
#include "sf_util.h"

#include <event2/dns.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <jansson.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <stdint.h>

#define SP_NAME_MAX 256          /* host names, NUL included */
#define SP_BINDINGS_MAX 32       /* secrets bound to one sandbox */
#define SP_RULES_MAX 256         /* entries in allow_out + deny_out */
#define SP_IPS_MAX 8             /* addresses kept per resolved name */
#define SP_CACHE_PER_SANDBOX 256 /* names one sandbox's resolver cache holds */
#define SP_LOOKUPS_PER_SANDBOX 32 /* lookups one sandbox may have upstream at once */

typedef struct sp_cfg {
    sf_common_cfg common;
    char *proxy_control_socket;
    char *secrets_key_file;
    char *proxy_ca_cert_file;
    char *proxy_ca_key_file;
    char *proxy_upstream_ca_file;
    char *proxy_resolv_conf;
    char *proxy_hosts_file;
    char *egress_default;           /* "deny" | "allow" */
    char *proxy_platform_addrs;     /* extra CIDRs of the platform's own services */
    int proxy_refuse_unmatched;
    int64_t proxy_http_port, proxy_transparent_port, proxy_dns_port;
    int64_t proxy_max_sandboxes, proxy_max_conns, netlog_cap, secret_refresh_ms;
    int64_t proxy_idle_timeout_ms, proxy_connect_timeout_ms, proxy_sniff_timeout_ms;
} sp_cfg;

/* ---- rules.c ---- */
typedef struct sp_cidr {
    uint32_t net, mask; /* host byte order */
    int prefix;
} sp_cidr;

typedef struct sp_rules {
    char **names;      /* allow_out names: "api.x.com" or "*.x.com" (lower-case) */
    size_t names_n;
    sp_cidr *allow;    /* allow_out IPs / CIDRs */
    size_t allow_n;
    sp_cidr *deny;     /* deny_out */
    size_t deny_n;
    int refs;
} sp_rules;

typedef struct sp_policy {
    int default_allow;
    sp_cidr *platform;  /* the platform's own addresses: never reachable */
    size_t platform_n;
} sp_policy;

/* Parses allow_out / deny_out (JSON arrays or NULL). 0 or -EINVAL with why; an allow_out
 * entry wholly inside a never-reachable range (loopback, link-local, 192.0.0.0/24, the
 * metadata addresses, p's platform addresses; p may be NULL) is refused naming both. */
int sp_rules_parse(const sp_policy *p, const json_t *allow, const json_t *deny, sp_rules **out,
                   char *why, size_t whylen);
sp_rules *sp_rules_ref(sp_rules *r);
void sp_rules_unref(sp_rules *r);
/* Parses "a.b.c.d" or "a.b.c.d/n". 0 or -EINVAL. */
int sp_cidr_parse(const char *s, sp_cidr *out);
/* Adds comma/space-separated CIDRs to p->platform. 0 or -EINVAL with why. */
int sp_policy_add_platform(sp_policy *p, const char *list, char *why, size_t whylen);
/* Adds every IPv4 address of this host's interfaces. */
int sp_policy_add_host_addrs(sp_policy *p);
void sp_policy_fini(sp_policy *p);
/* 1 allowed, 0 blocked (*reason says why). name: the host name asked for (lower-case),
 * or NULL when the sandbox named an address. ip: host byte order. */
int sp_decide(const sp_policy *p, const sp_rules *r, const char *name, uint32_t ip,
              const char **reason);
/* 1 when the proxy may ask its resolver for name on the sandbox's behalf: an IPv4
 * literal, a name an allow_out name or wildcard matches, or any name when the sandbox's
 * effective default for addresses no narrower rule covers is allow (egress_default allow
 * with no deny_out 0.0.0.0/0, or an allow_out 0.0.0.0/0 with none). 0 otherwise: the
 * name is refused without a lookup, so names outside the rules never leave the host. */
int sp_name_lookup_allowed(const sp_policy *p, const sp_rules *r, const char *name);
#define SP_REASON_NAME "the name is not in allow_out (no lookup was made)"

/* ---- resolve.c ---- */
typedef struct sp_addrs {
    uint32_t ip[SP_IPS_MAX]; /* host byte order */
    int n;
    int ttl;
    int err;                 /* 0, or -ENOENT (no such name) / -EAGAIN (resolver failed) */
} sp_addrs;
typedef void (*sp_resolve_cb)(void *arg, const sp_addrs *a);
typedef struct sp_resolver sp_resolver;
typedef struct sp_rq sp_rq;
/* One sandbox's cache of answers (at most SP_CACHE_PER_SANDBOX names; full, it drops its
 * own expired entries, or all of its own) and count of lookups upstream. Refcounted: a
 * lookup in flight holds it past its sandbox. */
typedef struct sp_rcache sp_rcache;
sp_rcache *sp_rcache_new(void);
void sp_rcache_unref(sp_rcache *c);
size_t sp_rcache_len(const sp_rcache *c);
int sp_rcache_inflight(const sp_rcache *c);
sp_resolver *sp_resolver_new(struct event_base *base, const char *resolv_conf,
                             const char *hosts_file, char *why, size_t whylen);
void sp_resolver_free(sp_resolver *r);
/* Calls cb once, always later from the event loop (never from inside this call), with
 * the addresses (c's cache, literal or looked up; -EAGAIN when c has
 * SP_LOOKUPS_PER_SANDBOX lookups upstream already). Returns a handle that
 * sp_resolve_cancel() can stop, or NULL when out of memory (cb is then never called).
 * name is lower-case; callers ask sp_name_lookup_allowed() first. */
sp_rq *sp_resolve(sp_resolver *r, sp_rcache *c, const char *name, sp_resolve_cb cb, void *arg);
void sp_resolve_cancel(sp_rq *rq);
/* The answer without waiting when it is known (IPv4 literal, fresh entry of c with
 * addresses): 0 and *a, else -ENOENT. */
int sp_resolve_peek(sp_rcache *c, const char *name, sp_addrs *a);
int sp_addrs_has(const sp_addrs *a, uint32_t ip);

/* ---- sandboxes (sandbox.c) ---- */
typedef struct sp_binding {
    char env[64];
    char secret[SF_SECRET_NAME_MAX];
    char placeholder[SF_PLACEHOLDER_LEN + 1];
    sf_secret sec;        /* metadata + opened value; value NULL when the secret is gone */
} sp_binding;

typedef struct sp_conn sp_conn;
typedef struct sp_ctx sp_ctx;

typedef struct sp_sandbox {
    sp_ctx *ctx;
    char id[64];
    char team[64];
    char owner[64];       /* who registered it (a worker's host id), "" = not said */
    sp_rules *rules;
    json_t *allow_json, *deny_json; /* the rules as given (for partial updates) */
    sp_binding *bind;     /* bind_n entries */
    size_t bind_n;
    struct evconnlistener *l_http, *l_transparent;
    struct event *ev_dns;
    int dns_fd;
    sp_conn *conns;       /* live connections (list) */
    int conns_n;
    int dns_pending;
    sp_rcache *rcache;    /* this sandbox's answers and lookups upstream */
    int refs;
    int dead;             /* unregistered: no new work */
    uint64_t gen;         /* bumped on every update of bindings */
} sp_sandbox;

sp_sandbox *sp_sandbox_ref(sp_sandbox *sb);
void sp_sandbox_unref(sp_sandbox *sb);
/* The binding whose placeholder is at p (SF_PLACEHOLDER_LEN bytes), or NULL. */
const sp_binding *sp_sandbox_binding(const sp_sandbox *sb, const char *p);
/* 1 when some bound secret may be injected on requests to host (TLS must be terminated). */
int sp_sandbox_has_secret_for(const sp_sandbox *sb, const char *host);

/* ---- the daemon ---- */
struct sp_ctx {
    sp_cfg cfg;
    sf_daemon d;
    sf_redis *redis;
    sp_resolver *resolver;
    sp_policy policy;
    sf_map *sandboxes;             /* id -> sp_sandbox */
    uint8_t master_key[SF_SECRET_KEY_BYTES];
    int host_netns;                /* fd of the daemon's own network namespace */
    struct evconnlistener *ctl;    /* control socket */
    struct event *ev_refresh;
    struct sp_tls *tls;
    uint64_t netlog_dropped;
    char instance[SF_ID_MAX];      /* random per start: the worker sees a restart by it */
};

/* ctl.c */
int sp_ctl_start(sp_ctx *ctx, char *why, size_t whylen);
void sp_ctl_stop(sp_ctx *ctx);

/* sandbox.c: the control operations. done(arg, reply) gets the JSON reply (borrowed). */
typedef void (*sp_done_cb)(void *arg, json_t *reply);
void sp_sandbox_register(sp_ctx *ctx, const json_t *req, int netns_fd, sp_done_cb done,
                         void *arg);
void sp_sandbox_update(sp_ctx *ctx, const json_t *req, sp_done_cb done, void *arg);
void sp_sandbox_unregister(sp_ctx *ctx, const json_t *req, sp_done_cb done, void *arg);
void sp_sandboxes_free_all(sp_ctx *ctx);
int sp_refresh_start(sp_ctx *ctx);

/* dns.c */
void sp_dns_on_read(evutil_socket_t fd, short what, void *arg); /* arg: sp_sandbox */
/* Parses one query: 0 and the lower-case name, type and the question's length, or
 * -EINVAL. Exposed for tests and the fuzzer. */
int sp_dns_parse_query(const uint8_t *q, size_t n, char name[SP_NAME_MAX], uint16_t *qtype,
                       size_t *qlen);
/* Builds the answer to query q (qlen bytes of header + question) into out (cap bytes):
 * rcode 0 with the addresses (A queries only), 2 (SERVFAIL), 3 (NXDOMAIN) or 5 (REFUSED).
 * Returns the length. */
size_t sp_dns_answer(const uint8_t *q, size_t qlen, uint16_t qtype, int rcode,
                     const uint32_t *ips, int n, int ttl, uint8_t *out, size_t cap);

/* conn.c */
void sp_conn_accept(sp_sandbox *sb, evutil_socket_t fd, int explicit_proxy);
void sp_conn_close_all(sp_sandbox *sb);

/* tls.c */
typedef struct sp_tls sp_tls;
sp_tls *sp_tls_new(const sp_cfg *cfg, char *why, size_t whylen);
void sp_tls_free(sp_tls *t);
/* A server SSL for name, with a certificate minted by the deployment CA (cached). */
SSL *sp_tls_server(sp_tls *t, const char *name);
/* A client SSL towards name that verifies the upstream certificate and host name. */
SSL *sp_tls_client(sp_tls *t, const char *name);
/* Finds the SNI in a buffered TLS ClientHello: 0 (name "" when absent), -EAGAIN (need
 * more bytes), -EINVAL (not a TLS ClientHello). */
int sp_tls_sni(const uint8_t *p, size_t n, char name[SP_NAME_MAX]);

/* http.c: request heads */
#define SP_HDRS_MAX 100
#define SP_HEAD_MAX (32 * 1024)
typedef struct sp_hdr {
    char *name, *value;
} sp_hdr;
typedef struct sp_head {
    sf_buf url;
    sp_hdr hdrs[SP_HDRS_MAX]; /* point into arena */
    size_t off[SP_HDRS_MAX][2]; /* where each name and value start in arena */
    sf_buf arena;             /* kept across requests: no allocation per header */
    int n;
    int in_value;       /* parser state: last callback was a value */
    sf_buf field, value;
    int too_big;
} sp_head;
void sp_head_init(sp_head *h);
void sp_head_reset(sp_head *h);
void sp_head_fini(sp_head *h);
int sp_head_field(sp_head *h, const char *at, size_t n);
int sp_head_value(sp_head *h, const char *at, size_t n);
int sp_head_end(sp_head *h);         /* flush the last header */
const char *sp_head_get(const sp_head *h, const char *name); /* first, case-insensitive */
/* Pre-scan of a raw head (up to and including the blank line): -EINVAL with why for bare
 * LF line ends, folded (obs-fold) lines or control bytes. */
int sp_head_prescan(const char *p, size_t n, const char **why);
/* Splits "host[:port]" (or "[v6]:port"); lower-cases host. 0 or -EINVAL. */
int sp_hostport(const char *s, size_t n, char host[SP_NAME_MAX], int *port, int def_port);
/* Splits an absolute http:// URL into host, port and origin-form path. 0 or -EINVAL. */
int sp_url_split(const char *url, char host[SP_NAME_MAX], int *port, const char **path);
/* Writes the request head to out: method, path, headers (Proxy-* dropped) with every
 * placeholder of sb swapped when host matches its secret's allowed hosts, the header is
 * the secret's (its --header; else Authorization unless --any-header) and the request
 * goes over TLS (tls 1) or the secret allows plain HTTP (--allow-http). *injected counts
 * swaps, *foreign placeholders left unchanged. */
int sp_head_write(sf_buf *out, const char *method, const char *path, int http_minor,
                  const sp_head *h, const sp_sandbox *sb, const char *host, int tls,
                  int *injected, int *foreign);

/* netlog.c */
void sp_netlog(sp_ctx *ctx, const char *sandbox, const sf_netlog_entry *e);

#endif
