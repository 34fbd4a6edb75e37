/* proto.h: the protocol leaves' entry points, for server.c alone (a leaf reaches another
 * only through gw_conn_serve, conn.h). Each serve function owns h->bev from the call on. */
#ifndef GW_PROTO_H
#define GW_PROTO_H

#include "server-t.h"

/* http1.c: HTTP/1.1 on a connected bufferevent (plain socket or TLS filter). */
int gw_h1_serve(gw_http_server *s, const gw_handover *h);
void gw_h1_free_all(gw_http_server *s);
/* http2.c: HTTP/2 (the client preface not yet read; for an upgrade, h->upgrade becomes
 * stream 1 and h->settings is its HTTP2-Settings). */
int gw_h2_serve(gw_http_server *s, const gw_handover *h);
void gw_h2_free_all(gw_http_server *s);
/* tls.c: the first byte was a TLS handshake record: terminate TLS, then hand the
 * connection on (ALPN h2 to HTTP/2, anything else to the sniffer). */
int gw_tls_serve(gw_http_server *s, const gw_handover *h);
int gw_tls_ctx_new(gw_http_server *s, const char *cert, const char *key, char *why, size_t n);
void gw_tls_ctx_free(gw_http_server *s);

#endif
