/* tls.c: the TLS leaf of the server (OpenSSL through libevent's filter bufferevent). A
 * connection whose first byte is a TLS handshake record (server.c sniffs it) is wrapped
 * here; when the handshake is done, ALPN decides: "h2" goes to HTTP/2, anything else
 * (http/1.1, or no ALPN) back to the sniffer, which serves HTTP/1 (or HTTP/2 with prior
 * knowledge) on it, both through gw_conn_serve: this file names no other leaf.
 * Handshakes have a 10 s deadline; those still running when the server is freed are
 * dropped with it. */
#include "proto.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include "conn.h"
#include "sf_bev.h"
#include "sf_log.h"

#define TLS_HANDSHAKE_S 10

struct tls_pending {
    gw_http_server *srv;
    struct tls_pending *prev, *next;
    struct bufferevent *bev;
    int peer_port;
    gw_addr *addr;
    char peer[64];
};

static void pending_unlink(tls_pending *p)
{
    if (p->prev)
        p->prev->next = p->next;
    else
        p->srv->tls_pending = p->next;
    if (p->next)
        p->next->prev = p->prev;
}

static int alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                       const unsigned char *in, unsigned int inlen, void *arg)
{
    gw_http_server *s = arg;
    static const unsigned char h2[] = "\x02h2", h11[] = "\x08http/1.1";
    unsigned char *o;

    /* (preview hosts too: their HTTP/2 streams are relayed as HTTP/1.1, http2.c) */
    if (s->h2 && SSL_select_next_proto(&o, outlen, h2, sizeof(h2) - 1, in, inlen) ==
                     OPENSSL_NPN_NEGOTIATED) {
        *out = o;
        return SSL_TLSEXT_ERR_OK;
    }
    if (SSL_select_next_proto(&o, outlen, h11, sizeof(h11) - 1, in, inlen) ==
        OPENSSL_NPN_NEGOTIATED) {
        *out = o;
        return SSL_TLSEXT_ERR_OK;
    }
    return SSL_TLSEXT_ERR_NOACK; /* no ALPN match: HTTP/1.1 */
}

int gw_tls_ctx_new(gw_http_server *s, const char *cert, const char *key, char *why, size_t n)
{
    SSL_CTX *ctx;

    if (!cert || !*cert || !key || !*key) {
        snprintf(why, n, "TLS needs both a certificate file and a key file");
        return -EINVAL;
    }
    if (!(ctx = SSL_CTX_new(TLS_server_method()))) {
        snprintf(why, n, "cannot create the TLS context");
        return -EINVAL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
        snprintf(why, n, "cannot load the TLS certificate %s (PEM expected)", cert);
        SSL_CTX_free(ctx);
        return -EINVAL;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(ctx) != 1) {
        snprintf(why, n, "cannot load the TLS key %s, or it does not match the certificate", key);
        SSL_CTX_free(ctx);
        return -EINVAL;
    }
    SSL_CTX_set_alpn_select_cb(ctx, alpn_select, s);
    ERR_clear_error();
    if (s->tls)
        SSL_CTX_free(s->tls);
    s->tls = ctx;
    return 0;
}

void gw_tls_ctx_free(gw_http_server *s)
{
    while (s->tls_pending) {
        tls_pending *p = s->tls_pending;
        s->tls_pending = p->next;
        bufferevent_free(p->bev);
        gw_addr_release(s, p->addr);
        free(p);
    }
    if (s->tls)
        SSL_CTX_free(s->tls);
    s->tls = NULL;
}

static void tls_event_cb(struct bufferevent *bev, short what, void *arg)
{
    tls_pending *p = arg;
    gw_http_server *s = p->srv;
    const unsigned char *alpn = NULL;
    unsigned alen = 0;

    pending_unlink(p);
    if (!(what & BEV_EVENT_CONNECTED)) {
        unsigned long e = bufferevent_get_openssl_error(bev);
        sf_debug("msg=\"TLS handshake failed\" peer=%s err=\"%s\"", p->peer,
                 e ? ERR_reason_error_string(e) : ((what & BEV_EVENT_TIMEOUT) ? "timeout" : "eof"));
        bufferevent_free(bev);
        gw_addr_release(s, p->addr);
        free(p);
        return;
    }
    SSL_get0_alpn_selected(bufferevent_openssl_get_ssl(bev), &alpn, &alen);
    bufferevent_setcb(bev, NULL, NULL, NULL, NULL);
    sf_bev_no_timeouts(bev);
    {
        char peer[sizeof(p->peer)];
        gw_handover h = {.bev = bev, .peer = peer, .peer_port = p->peer_port, .tls = 1,
                         .addr = p->addr};

        memcpy(peer, p->peer, sizeof(peer));
        free(p);
        gw_conn_serve(s, alen == 2 && !memcmp(alpn, "h2", 2) && s->h2 ? GW_PROTO_H2
                                                                        : GW_PROTO_SNIFF, &h);
    }
}

int gw_tls_serve(gw_http_server *s, const gw_handover *h)
{
    struct bufferevent *bev = h->bev;
    gw_addr *addr = h->addr;
    tls_pending *p = calloc(1, sizeof(*p));
    SSL *ssl = s->tls ? SSL_new(s->tls) : NULL;
    struct bufferevent *tb = NULL;
    struct timeval hs = {TLS_HANDSHAKE_S, 0};

    if (!p || !ssl)
        goto fail;
    tb = bufferevent_openssl_filter_new(s->base, bev, ssl, BUFFEREVENT_SSL_ACCEPTING,
                                        BEV_OPT_CLOSE_ON_FREE);
    if (!tb) {
        ssl = NULL; /* freed with the failed filter */
        goto fail;
    }
    bev = NULL; /* owned by the filter now */
    p->srv = s;
    p->bev = tb;
    p->addr = addr;
    p->peer_port = h->peer_port;
    snprintf(p->peer, sizeof(p->peer), "%s", h->peer ? h->peer : "unknown");
    p->next = s->tls_pending;
    if (s->tls_pending)
        s->tls_pending->prev = p;
    s->tls_pending = p;
    bufferevent_setcb(tb, NULL, NULL, tls_event_cb, p);
    bufferevent_set_timeouts(tb, &hs, &hs);
    bufferevent_enable(tb, EV_READ | EV_WRITE);
    /* The ClientHello is already in the socket's input buffer: run the handshake on it. */
    bufferevent_trigger(bufferevent_get_underlying(tb), EV_READ, BEV_TRIG_IGNORE_WATERMARKS);
    return 0;

fail:
    if (ssl)
        SSL_free(ssl);
    free(p);
    if (bev)
        bufferevent_free(bev);
    gw_addr_release(s, addr);
    return -ENOMEM;
}
