/* preview.h: preview URLs, the gateway's half (issue 22; the contract between gateway and
 * worker: docs/internals/preview.md). A request whose Host is `{port}-{label}.{domain}` (or
 * that carries `X-Sandfleet-Preview: {port}-{label}`) never reaches the gateway's own
 * routes: its HTTP/1 connection is diverted from the HTTP server (server.h) to preview.c,
 * which finds the sandbox in Redis, checks a private port's link, opens a hop to the
 * worker's ingress and then relays the connection.
 *
 *   preview.c          the connections: lookup, hop, relay (calls the three below)
 *   preview_token.c    names and signatures: host names, link tokens, the hop line (no I/O)
 *   preview_page.c     the HTML pages the gateway answers itself
 *   preview_team.c     per-team counts shared by every thread: caps, bandwidth, metrics */
#ifndef GW_PREVIEW_H
#define GW_PREVIEW_H

#include "sf_buf.h"

#include <stddef.h>
#include <stdint.h>

typedef struct gw_ctx gw_ctx;

/* ---- preview.c (used by main.c, metrics.c) ---- */
/* Installs the divert hook on ctx->http (HTTP/1 heads and HTTP/2 streams alike: a preview
 * request never reaches the router or the MCP head check). 0 or -1 with why. */
int gw_preview_start(gw_ctx *ctx, char *why, size_t n);
/* Closes every preview connection of the instance. */
void gw_preview_stop(gw_ctx *ctx);

/* ---- preview_token.c ---- */
#define GW_PV_ID_MAX 64
typedef struct gw_pv_target {
    char sandbox[GW_PV_ID_MAX]; /* "sb_..." */
    unsigned port;
} gw_pv_target;
/* "{port}-{label}" (label "sb-" + [a-z0-9]+, case-insensitive) -> t. 0 or -EINVAL (why). */
int gw_pv_parse_label(const char *s, size_t n, gw_pv_target *t, const char **why);
/* The host part of a preview_domain setting ("preview.localhost:8080" -> "preview.localhost"),
 * lower case, into out. 0 or -EINVAL. */
int gw_pv_domain_host(const char *domain, char *out, size_t n);
/* Is host (a Host header or :authority, any port) dom_host or under it? 0: no. 1: yes, and
 * *ok says whether it named a preview ({port}-{label}. directly below dom_host: t filled)
 * or not (why). */
int gw_pv_match_host(const char *host, const char *dom_host, gw_pv_target *t, int *ok,
                     const char **why);

/* Private link tokens (contract 4). Verdicts, in the order they are checked: */
enum {
    GW_PV_TOK_OK = 0,
    GW_PV_TOK_MALFORMED, /* not v1.<id>.<port>.<epoch>.<exp>.<nonce>.<mac> */
    GW_PV_TOK_OTHER,     /* made for another sandbox or port */
    GW_PV_TOK_BADMAC,    /* altered (or not made by this sandbox's host) */
    GW_PV_TOK_EXPIRED,
    GW_PV_TOK_EPOCH,     /* the port was published again (or closed) since */
};
/* Checks token tok (n bytes) for sandbox/port, published at epoch, under the host key.
 * *exp gets its expiry (unix s) when the verdict is OK. */
int gw_pv_token_check(const char *tok, size_t n, const uint8_t key[32], const char *sandbox,
                      unsigned port, uint64_t epoch, int64_t now_s, int64_t *exp);
/* The sentence a refused token's page shows. */
const char *gw_pv_token_why(int verdict);
/* Finds "name=value" among the cookies of a Cookie header: the i-th sf_preview value
 * (i from 0), or NULL; *len its length. */
const char *gw_pv_cookie_at(const char *cookie, size_t i, size_t *len);
/* Finds sf_token=... in a query string; NULL or the value (*len). */
const char *gw_pv_query_token(const char *query, size_t *len);
/* Copies the target without its sf_token parameter(s) into out (bounded). 0, -ENOSPC. */
int gw_pv_strip_token(const char *target, sf_buf *out);
/* Copies a Cookie header's value without its sf_preview pairs into out ("" when nothing
 * is left). 0, -ENOSPC. */
int gw_pv_strip_cookie(const char *cookie, size_t n, sf_buf *out);

/* ---- preview_page.c ---- */
/* A whole HTTP/1.1 answer (status, a small HTML page, Connection: close) into out. title and
 * text are escaped here. extra: more header lines ("Name: value\r\n..."), or NULL. */
int gw_pv_page(sf_buf *out, int status, const char *title, const char *text,
               const char *extra);

/* ---- preview_team.c: per-team counts, one table for the process (thread-safe) ---- */
typedef struct gw_pv_teams gw_pv_teams;
typedef struct gw_pv_team gw_pv_team;
gw_pv_teams *gw_pv_teams_new(void);
void gw_pv_teams_free(gw_pv_teams *t);
/* The team's entry (created when new; entries live as long as the table). NULL when the
 * table is full (4096 teams) or out of memory. */
gw_pv_team *gw_pv_team_get(gw_pv_teams *t, const char *team);
/* Takes one connection of the team's max. 0 or -EBUSY. */
int gw_pv_team_conn_take(gw_pv_team *e, unsigned max);
void gw_pv_team_conn_put(gw_pv_team *e);
void gw_pv_team_count(gw_pv_team *e, uint64_t requests, uint64_t up, uint64_t down);
/* Bandwidth: how many of `want` bytes may move now under `rate` bytes/s for the team
 * (0 = unlimited: want); when 0, *wait_ms says when to ask again. */
size_t gw_pv_team_bytes(gw_pv_team *e, size_t want, uint64_t rate, uint64_t now_ms,
                        unsigned *wait_ms);
/* Prometheus lines for every team into b. */
void gw_pv_teams_metrics(gw_pv_teams *t, sf_buf *b);

#endif
