#include "sf_oauth.h"
#include "sf_util.h"

#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>

int sf_oauth_secret_new(const char *prefix, char out[SF_OAUTH_SECRET_MAX])
{
    uint8_t raw[32];
    size_t plen = strlen(prefix);

    if (plen + 44 > SF_OAUTH_SECRET_MAX || sf_random(raw, sizeof(raw)) < 0)
        return -EIO;
    memcpy(out, prefix, plen);
    sodium_bin2base64(out + plen, SF_OAUTH_SECRET_MAX - plen, raw, sizeof(raw),
                      sodium_base64_VARIANT_URLSAFE_NO_PADDING);
    sodium_memzero(raw, sizeof(raw));
    return 0;
}

int sf_oauth_hash(const uint8_t key[32], const char *secret, char out[SF_OAUTH_HASH_HEX])
{
    uint8_t h[32];
    size_t n = secret ? strlen(secret) : 0;

    if (n == 0 || n >= SF_OAUTH_SECRET_MAX)
        return -EINVAL;
    if (crypto_generichash(h, sizeof(h), (const uint8_t *)secret, n, key, 32) != 0)
        return -EINVAL;
    sodium_bin2hex(out, SF_OAUTH_HASH_HEX, h, sizeof(h));
    return 0;
}

int sf_oauth_s256(const char *verifier, char out[44])
{
    uint8_t h[crypto_hash_sha256_BYTES];
    size_t n = verifier ? strlen(verifier) : 0;

    if (n < 43 || n > 128 ||
        strspn(verifier, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~") != n)
        return -EINVAL;
    crypto_hash_sha256(h, (const uint8_t *)verifier, n);
    sodium_bin2base64(out, 44, h, sizeof(h), sodium_base64_VARIANT_URLSAFE_NO_PADDING);
    return 0;
}
