#include "sf_jobauth.h"
#include "sf_auth.h"
#include "sf_kafka.h"
#include "sf_util.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define MAC_CONTEXT "sandfleet-job-v1\n"

static void hmac(const void *key, size_t keylen, const void *msg, size_t n, uint8_t out[32])
{
    crypto_auth_hmacsha256_state st;

    crypto_auth_hmacsha256_init(&st, key, keylen);
    crypto_auth_hmacsha256_update(&st, msg, n);
    crypto_auth_hmacsha256_final(&st, out);
    sodium_memzero(&st, sizeof(st));
}

int sf_producer_derive(const char *api_key, char id[SF_PRODUCER_ID_LEN + 1], uint8_t psk[32])
{
    static const char id_ctx[] = "sandfleet producer id v1", key_ctx[] = "sandfleet producer key v1";
    char hex[65];
    uint8_t h[32];
    size_t n = api_key ? strlen(api_key) : 0;

    if (n != SF_APIKEY_LEN || strncmp(api_key, SF_APIKEY_PREFIX, strlen(SF_APIKEY_PREFIX)) != 0)
        return -EINVAL;
    hmac(api_key, n, id_ctx, strlen(id_ctx), h);
    sodium_bin2hex(hex, sizeof(hex), h, sizeof(h));
    id[0] = 'p';
    memcpy(id + 1, hex, SF_PRODUCER_ID_LEN - 1);
    id[SF_PRODUCER_ID_LEN] = '\0';
    hmac(api_key, n, key_ctx, strlen(key_ctx), psk);
    return 0;
}

void sf_gateway_job_key(const uint8_t auth_secret[32], uint8_t key[32])
{
    static const char ctx[] = "sandfleet gateway job key v1";
    hmac(auth_secret, 32, ctx, strlen(ctx), key);
}

static void seal_key(const uint8_t auth_secret[32], uint8_t k[32])
{
    static const char ctx[] = "sandfleet producer seal v1";
    hmac(auth_secret, 32, ctx, strlen(ctx), k);
}

int sf_psk_seal(const uint8_t auth_secret[32], const char *id, const uint8_t psk[32],
                char out[SF_PSK_SEALED_HEX])
{
    uint8_t k[32], box[24 + 32 + 16];
    unsigned long long clen = 0;

    if (sf_random(box, 24) < 0)
        return -EIO;
    seal_key(auth_secret, k);
    crypto_aead_xchacha20poly1305_ietf_encrypt(box + 24, &clen, psk, 32, (const uint8_t *)id,
                                               strlen(id), NULL, box, k);
    sodium_memzero(k, sizeof(k));
    sodium_bin2hex(out, SF_PSK_SEALED_HEX, box, sizeof(box));
    return 0;
}

int sf_psk_unseal(const uint8_t auth_secret[32], const char *id, const char *sealed,
                  uint8_t psk[32])
{
    uint8_t k[32], box[24 + 32 + 16];
    unsigned long long mlen = 0;
    size_t n = 0;
    int rc;

    if (!sealed || strlen(sealed) != SF_PSK_SEALED_HEX - 1 ||
        sodium_hex2bin(box, sizeof(box), sealed, SF_PSK_SEALED_HEX - 1, NULL, &n, NULL) != 0 ||
        n != sizeof(box))
        return -EINVAL;
    seal_key(auth_secret, k);
    rc = crypto_aead_xchacha20poly1305_ietf_decrypt(psk, &mlen, NULL, box + 24, 32 + 16,
                                                    (const uint8_t *)id, strlen(id), box, k);
    sodium_memzero(k, sizeof(k));
    return rc == 0 && mlen == 32 ? 0 : -EINVAL;
}

void sf_jobauth_mac(const uint8_t psk[32], const char *id, int64_t iat, const uint8_t digest[32],
                    uint8_t mac[32])
{
    char text[sizeof(MAC_CONTEXT) + SF_ID_MAX + 24 + 66];
    char hex[65];
    int n;

    sodium_bin2hex(hex, sizeof(hex), digest, 32);
    n = snprintf(text, sizeof(text), MAC_CONTEXT "%s\n%" PRId64 "\n%s", id, iat, hex);
    hmac(psk, 32, text, (size_t)n, mac);
}

/* The last header `name` as a NUL-terminated string of at most cap-1 bytes: 1, 0 absent,
 * -1 too long or holding a NUL. */
static int header_str(rd_kafka_headers_t *h, const char *name, char *out, size_t cap)
{
    const void *v = NULL;
    size_t n = 0;

    if (!h || rd_kafka_header_get_last(h, name, &v, &n) != RD_KAFKA_RESP_ERR_NO_ERROR)
        return 0;
    if (!v || n >= cap || memchr(v, '\0', n))
        return -1;
    memcpy(out, v, n);
    out[n] = '\0';
    return 1;
}

void sf_jobauth_read(const rd_kafka_message_t *msg, sf_job_auth *a)
{
    rd_kafka_headers_t *h = NULL;
    char iat[24], mac[80];
    size_t n = 0;
    int k, i, m;

    memset(a, 0, sizeof(*a));
    if (rd_kafka_message_headers(msg, &h) != RD_KAFKA_RESP_ERR_NO_ERROR)
        h = NULL;
    k = header_str(h, SF_JOBAUTH_HDR_KEY, a->key, sizeof(a->key));
    i = header_str(h, SF_JOBAUTH_HDR_IAT, iat, sizeof(iat));
    m = header_str(h, SF_JOBAUTH_HDR_MAC, mac, sizeof(mac));
    if (k == 0 && i == 0 && m == 0)
        return;
    a->state = -1;
    if (k != 1 || !a->key[0]) {
        a->why = "its sf-key header (the producer id) is missing or malformed";
        return;
    }
    if (m != 1) {
        a->why = "its sf-mac header (the HMAC) is missing or malformed";
        return;
    }
    if (i != 1 || sf_parse_i64(iat, 0, INT64_MAX, &a->iat) < 0) {
        a->why = "its sf-iat header (when it was signed, ms) is missing or not a number";
        return;
    }
    if (strlen(mac) != 64 || sodium_hex2bin(a->mac, 32, mac, 64, NULL, &n, NULL) != 0 || n != 32) {
        a->why = "its sf-mac header is not 64 hex characters (HMAC-SHA256)";
        return;
    }
    crypto_hash_sha256(a->digest, msg->payload, msg->len);
    a->state = 1;
}

int sf_jobauth_check(const sf_job_auth *a, const uint8_t psk[32])
{
    uint8_t want[32];

    if (a->state != 1)
        return -EPERM;
    sf_jobauth_mac(psk, a->key, a->iat, a->digest, want);
    return sodium_memcmp(want, a->mac, 32) == 0 ? 0 : -EPERM;
}

rd_kafka_headers_t *sf_jobauth_headers(const void *p, size_t n, const char *id,
                                       const uint8_t psk[32], int64_t iat)
{
    uint8_t digest[32], mac[32];
    char iats[24], hex[65];
    rd_kafka_headers_t *h = rd_kafka_headers_new(3);

    if (!h)
        return NULL;
    crypto_hash_sha256(digest, p, n);
    sf_jobauth_mac(psk, id, iat, digest, mac);
    snprintf(iats, sizeof(iats), "%" PRId64, iat);
    sodium_bin2hex(hex, sizeof(hex), mac, sizeof(mac));
    rd_kafka_header_add(h, SF_JOBAUTH_HDR_KEY, -1, id, -1);
    rd_kafka_header_add(h, SF_JOBAUTH_HDR_IAT, -1, iats, -1);
    rd_kafka_header_add(h, SF_JOBAUTH_HDR_MAC, -1, hex, -1);
    return h;
}

int sf_jobauth_produce(rd_kafka_t *producer, const char *topic, const char *key, const void *p,
                       size_t n, const char *id, const uint8_t psk[32])
{
    rd_kafka_headers_t *h = sf_jobauth_headers(p, n, id, psk, sf_now_ms());
    int rc;

    if (!h)
        return -ENOMEM;
    if ((rc = sf_kafka_produce_h(producer, topic, key, p, n, h, NULL, NULL)) < 0)
        rd_kafka_headers_destroy(h);
    return rc;
}

void sf_host_job_key(const uint8_t auth_secret[32], const char *host, uint8_t key[32])
{
    static const char ctx[] = "sandfleet host job key v1\n";
    char text[sizeof(ctx) + SF_ID_MAX];
    int n = snprintf(text, sizeof(text), "%s%s", ctx, host);

    hmac(auth_secret, 32, text, (size_t)n, key);
    sodium_memzero(text, sizeof(text));
}

int sf_key_file_read(const char *path, uint8_t key[32], char *why, size_t whylen)
{
    char hex[80];
    size_t bin_len = 0;
    ssize_t n;
    int fd;

    if ((fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)) < 0) {
        snprintf(why, whylen, "Cannot read the key file %s: %s.", path, strerror(errno));
        return -errno;
    }
    n = read(fd, hex, sizeof(hex) - 1);
    close(fd);
    if (n < 64 || sodium_hex2bin(key, 32, hex, 64, NULL, &bin_len, NULL) != 0 || bin_len != 32) {
        sodium_memzero(hex, sizeof(hex));
        snprintf(why, whylen, "The key file %s must hold 64 hex characters.", path);
        return -EINVAL;
    }
    sodium_memzero(hex, sizeof(hex));
    return 0;
}
