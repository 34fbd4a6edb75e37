/* sf_auth: API keys. A key is "sf_live_" + 32 random base62 characters; only a
 * keyed BLAKE2b-256 hash of it is stored (in Redis), under a deployment secret
 * (32 bytes) that the gateway and the admin CLI read from a file. */
#ifndef SF_AUTH_H
#define SF_AUTH_H

#include <stddef.h>
#include <stdint.h>

#define SF_APIKEY_PREFIX "sf_live_"
#define SF_APIKEY_LEN 40     /* prefix + 32 */
#define SF_APIKEY_HASH_HEX 65

/* Loads the 32-byte secret (64 hex chars) from path, creating it (0600) when absent.
 * 0 or negative errno with why. */
int sf_auth_secret_load(const char *path, uint8_t secret[32], char *why, size_t whylen);
/* New random key, NUL-terminated. */
int sf_apikey_new(char out[SF_APIKEY_LEN + 1]);
/* 0, or -EINVAL if the key does not look like one of ours (wrong prefix/length/charset). */
int sf_apikey_hash(const uint8_t secret[32], const char *key, char out[SF_APIKEY_HASH_HEX]);

#endif
