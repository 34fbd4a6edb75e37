/* sf_pvtoken: preview URLs (issue 22) as every daemon spells them, and the two MACs that
 * guard them under a host's key (sf_host_job_key): the private link token a worker issues
 * and any gateway checks, and the hop line a gateway sends to a worker's ingress
 * (docs/internals/ingress.md has the protocol). Pure functions; nothing here logs. */
#ifndef SF_PVTOKEN_H
#define SF_PVTOKEN_H

#include <stddef.h>
#include <stdint.h>

#define SF_PV_PORT_MIN 1024
#define SF_PV_PORT_MAX 65535
#define SF_PV_EXPIRES_MAX 604800     /* a private link lives at most a week... */
#define SF_PV_EXPIRES_DEFAULT 3600   /* ...and an hour unless asked */
#define SF_PV_HOP_WINDOW_MS 30000    /* a hop line is taken this long around its iat */
#define SF_PV_HOP_LINE_MAX 512       /* bytes of a hop line, its newline included */
#define SF_PV_NONCE_HEX 16
#define SF_PV_MAC_HEX 64
#define SF_PV_URL_MAX 512
#define SF_PV_TOKEN_MAX 256
#define SF_PV_DEFAULT_DOMAIN "preview.localhost:8080"
#define SF_PV_DEFAULT_SCHEME "http"

/* NULL when port may be published, else one sentence saying why not (a reserved port: the
 * secret-proxy's in-namespace listeners 3128 and 3129, the agent's 49983; or out of range). */
const char *sf_pv_port_refusal(int64_t port, char *buf, size_t n);
/* "{scheme}://{port}-{label}.{domain}/" (label: id with '_' as '-'), with "?sf_token=" +
 * token when token is not NULL. 0, or -ENAMETOOLONG. */
int sf_pv_url(const char *scheme, const char *domain, const char *id, unsigned port,
              const char *token, char *out, size_t n);
/* A private link token for id:port published at epoch, good until exp (unix s):
 * v1.<id>.<port>.<epoch>.<exp>.<nonce16hex>.<mac64hex>. 0, or -ENAMETOOLONG. */
int sf_pv_link_token(const uint8_t host_key[32], const char *id, unsigned port, uint64_t epoch,
                     int64_t exp, char *out, size_t n);
/* The link token's MAC (hex, 64 characters + NUL) over id, port, epoch, exp, nonce: what a
 * gateway recomputes to check a token. */
void sf_pv_link_mac(const uint8_t host_key[32], const char *id, unsigned port, uint64_t epoch,
                    int64_t exp, const char *nonce, char mac[SF_PV_MAC_HEX + 1]);
/* The hop line's MAC (hex, 64 characters + NUL) over id, port, epoch, iat_ms, nonce. */
void sf_pv_hop_mac(const uint8_t host_key[32], const char *id, unsigned port, uint64_t epoch,
                   int64_t iat_ms, const char *nonce, char mac[SF_PV_MAC_HEX + 1]);
/* A whole hop line (with its newline) as a gateway sends it, nonce drawn at random. 0 or
 * -ENAMETOOLONG. */
int sf_pv_hop_line(const uint8_t host_key[32], const char *id, unsigned port, uint64_t epoch,
                   int64_t iat_ms, char *out, size_t n);
/* 0 when the hex strings a and b (equal lengths) are equal, in constant time; else -1. */
int sf_pv_hex_equal(const char *a, const char *b, size_t len);

#endif
