/* sf_pvtoken: preview URLs and the MACs that guard them (sf_pvtoken.h). */
#include "sf_pvtoken.h"
#include "sf_util.h"

#include <errno.h>
#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>

#define LINK_CTX "sandfleet-preview-link-v1\n"
#define HOP_CTX "sandfleet-preview-hop-v1\n"

const char *sf_pv_port_refusal(int64_t port, char *buf, size_t n)
{
    if (port == 3128 || port == 3129) {
        snprintf(buf, n, "Port %lld is reserved: the sandbox's egress proxy listens there; "
                 "serve your app on another port (1024-65535).", (long long)port);
        return buf;
    }
    if (port == 49983) {
        snprintf(buf, n, "Port 49983 is reserved for sandbox control traffic; serve your app "
                 "on another port (1024-65535).");
        return buf;
    }
    if (port < SF_PV_PORT_MIN || port > SF_PV_PORT_MAX) {
        snprintf(buf, n, "Port %lld cannot be published: preview ports are 1024-65535; serve "
                 "your app on such a port.", (long long)port);
        return buf;
    }
    return NULL;
}

int sf_pv_url(const char *scheme, const char *domain, const char *id, unsigned port,
              const char *token, char *out, size_t n)
{
    char label[80];
    size_t i;
    int w;

    for (i = 0; id[i] && i < sizeof(label) - 1; i++)
        label[i] = id[i] == '_' ? '-' : id[i];
    label[i] = '\0';
    w = snprintf(out, n, "%s://%u-%s.%s/%s%s", scheme, port, label, domain,
                 token ? "?sf_token=" : "", token ? token : "");
    return w < 0 || (size_t)w >= n ? -ENAMETOOLONG : 0;
}

static void mac_hex(const uint8_t key[32], const char *msg, size_t len, char out[65])
{
    uint8_t mac[crypto_auth_hmacsha256_BYTES];

    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, key, 32);
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)msg, len);
    crypto_auth_hmacsha256_final(&st, mac);
    sodium_bin2hex(out, 65, mac, sizeof(mac));
}

static void nonce_hex(char out[SF_PV_NONCE_HEX + 1])
{
    uint8_t nonce[SF_PV_NONCE_HEX / 2];

    randombytes_buf(nonce, sizeof(nonce));
    sodium_bin2hex(out, SF_PV_NONCE_HEX + 1, nonce, sizeof(nonce));
}

/* Both MACs: HMAC-SHA256 over the context line, then id, port, epoch, a time (the link's
 * expiry in s, the hop's iat in ms) and the nonce, one a line. */
static void fields_mac(const uint8_t key[32], const char *ctx, const char *id, unsigned port,
                       uint64_t epoch, int64_t t, const char *nonce, char mac[SF_PV_MAC_HEX + 1])
{
    char msg[256];
    int m = snprintf(msg, sizeof(msg), "%s%s\n%u\n%" PRIu64 "\n%lld\n%s", ctx, id, port, epoch,
                     (long long)t, nonce);

    if (m < 0 || (size_t)m >= sizeof(msg))
        m = (int)sizeof(msg) - 1; /* ids are bounded: cannot happen */
    mac_hex(key, msg, (size_t)m, mac);
}

void sf_pv_link_mac(const uint8_t host_key[32], const char *id, unsigned port, uint64_t epoch,
                    int64_t exp, const char *nonce, char mac[SF_PV_MAC_HEX + 1])
{
    fields_mac(host_key, LINK_CTX, id, port, epoch, exp, nonce, mac);
}

int sf_pv_link_token(const uint8_t host_key[32], const char *id, unsigned port, uint64_t epoch,
                     int64_t exp, char *out, size_t n)
{
    char nonce[SF_PV_NONCE_HEX + 1], mac[SF_PV_MAC_HEX + 1];
    int w;

    nonce_hex(nonce);
    sf_pv_link_mac(host_key, id, port, epoch, exp, nonce, mac);
    w = snprintf(out, n, "v1.%s.%u.%" PRIu64 ".%lld.%s.%s", id, port, epoch, (long long)exp,
                 nonce, mac);
    return w < 0 || (size_t)w >= n ? -ENAMETOOLONG : 0;
}

void sf_pv_hop_mac(const uint8_t host_key[32], const char *id, unsigned port, uint64_t epoch,
                   int64_t iat_ms, const char *nonce, char mac[SF_PV_MAC_HEX + 1])
{
    fields_mac(host_key, HOP_CTX, id, port, epoch, iat_ms, nonce, mac);
}

int sf_pv_hop_line(const uint8_t host_key[32], const char *id, unsigned port, uint64_t epoch,
                   int64_t iat_ms, char *out, size_t n)
{
    char nonce[SF_PV_NONCE_HEX + 1], mac[SF_PV_MAC_HEX + 1];
    int w;

    nonce_hex(nonce);
    sf_pv_hop_mac(host_key, id, port, epoch, iat_ms, nonce, mac);
    w = snprintf(out, n, "SFHOP1 %s %u %" PRIu64 " %lld %s %s\n", id, port, epoch,
                 (long long)iat_ms, nonce, mac);
    return w < 0 || (size_t)w >= n || (size_t)w > SF_PV_HOP_LINE_MAX ? -ENAMETOOLONG : 0;
}

int sf_pv_hex_equal(const char *a, const char *b, size_t len)
{
    return sodium_memcmp(a, b, len) == 0 ? 0 : -1;
}
