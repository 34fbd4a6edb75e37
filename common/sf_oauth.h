/* sf_oauth: what the gateway's OAuth 2.1 authorization server and the CLI share: how
 * secrets are made and stored (only keyed BLAKE2b-256
 * hashes of codes and tokens reach Redis, under the same deployment secret as API keys;
 * their keys there: the state module, state/sf_store.h). */
#ifndef SF_OAUTH_H
#define SF_OAUTH_H

#include <stddef.h>
#include <stdint.h>

#define SF_OAUTH_SECRET_MAX 64  /* a token, code or CSRF value, with its prefix and NUL */
#define SF_OAUTH_HASH_HEX 65

#define SF_OAUTH_AT_PREFIX "sf_at_" /* access token */
#define SF_OAUTH_RT_PREFIX "sf_rt_" /* refresh token */
#define SF_OAUTH_CODE_PREFIX "sf_ac_" /* authorization code */

/* A new secret: prefix + 43 base64url characters (256 random bits). 0 or -EIO. */
int sf_oauth_secret_new(const char *prefix, char out[SF_OAUTH_SECRET_MAX]);
/* The keyed hash stored for a secret (hex). 0, or -EINVAL for an empty or over-long one. */
int sf_oauth_hash(const uint8_t key[32], const char *secret, char out[SF_OAUTH_HASH_HEX]);
/* BASE64URL(SHA-256(verifier)) without padding, as PKCE S256 compares it. 0 or -EINVAL
 * (a verifier that is not 43-128 characters of [A-Za-z0-9-._~]). */
int sf_oauth_s256(const char *verifier, char out[44]);

#endif
