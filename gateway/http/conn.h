/* conn.h: what every connection of the server shares, whatever its protocol: the client
 * address's counts, the request-byte budget, the server's refusal counts, and the
 * hand-over of a connection to another protocol. The leaves (http1.c, http2.c, tls.c) and
 * server.c call it; it calls none of them (the hand-over goes through s->serve[]). */
#ifndef GW_CONN_H
#define GW_CONN_H

#include "server-t.h"

/* Takes one connection's hold on the address peer (created when new). NULL when the
 * address already holds max connections (*full 1, or 2 when it holds more) or on ENOMEM
 * (*full 0). */
gw_addr *gw_addr_take(gw_http_server *s, const char *peer, unsigned max, int *full);
/* gw_addr_take without a limit. NULL on ENOMEM. */
gw_addr *gw_addr_get(gw_http_server *s, const char *peer);
/* Releases one hold (the address is freed when no connection is left). Accepts NULL. */
void gw_addr_release(gw_http_server *s, gw_addr *a);

/* Moves n request bytes in (+) or out (-) of the server's and the address's counts (per
 * read and per request: inline). */
static inline void gw_budget_add(gw_http_server *s, gw_addr *a, size_t n)
{
    s->buffered += n;
    if (a && n)
        __atomic_fetch_add(&a->buffered, n, __ATOMIC_RELAXED);
}

static inline void gw_budget_sub(gw_http_server *s, gw_addr *a, size_t n)
{
    s->buffered -= n < s->buffered ? n : s->buffered;
    if (a && n)
        __atomic_fetch_sub(&a->buffered, n, __ATOMIC_RELAXED);
}

/* Counts a request the server refused by itself (400, 408, 413, 429, 431, 503). */
void gw_http_count_refusal(gw_http_server *s, int status);

/* Hands a connection to protocol proto (GW_PROTO_*; see gw_handover for who owns what).
 * 0 or a negative errno. */
static inline int gw_conn_serve(gw_http_server *s, int proto, const gw_handover *h)
{
    return s->serve[proto](s, h);
}

#endif
