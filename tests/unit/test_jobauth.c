/* Producer signatures on the job queue (common/sf_jobauth.c): the test vector of
 * schemas/envelope.md (computed with Python's hmac/hashlib, an implementation of its own),
 * the sealed credential, and what a wrong key, id or message gets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "sf_jobauth.h"

#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>

#define KEY "sf_live_0123456789abcdefghijABCDEFGHIJKL"
#define PID "p3adeda03bcaa6a3fb88b"
#define PSK "b3aaca37033031f122ff04f6956d13d2764e25ba81d6577628f6e5eda463e89b"
#define DIGEST "48da60cb929ddb1569879aeb7a5ed73fbb3741dbea03d91a8239dd2f3b470923"
#define MAC "7e62102c3f95d4a0dae7ae38515f187d4cc4f4c1dcd66a24384d1ba108bc7fd7"
static const uint8_t value[] = {0x81, 0xa1, 0x76, 0x01}; /* msgpack {"v": 1} */

static void hex(const uint8_t *p, size_t n, char *out)
{
    sodium_bin2hex(out, n * 2 + 1, p, n);
}

static void vector(void **state)
{
    char pid[SF_PRODUCER_ID_LEN + 1], h[65];
    uint8_t psk[32], digest[32], mac[32];
    sf_job_auth a;

    (void)state;
    assert_int_equal(sf_producer_derive(KEY, pid, psk), 0);
    assert_string_equal(pid, PID);
    hex(psk, 32, h);
    assert_string_equal(h, PSK);
    crypto_hash_sha256(digest, value, sizeof(value));
    hex(digest, 32, h);
    assert_string_equal(h, DIGEST);
    sf_jobauth_mac(psk, pid, 1764576000000LL, digest, mac);
    hex(mac, 32, h);
    assert_string_equal(h, MAC);

    memset(&a, 0, sizeof(a));
    a.state = 1;
    snprintf(a.key, sizeof(a.key), "%s", pid);
    a.iat = 1764576000000LL;
    memcpy(a.digest, digest, 32);
    memcpy(a.mac, mac, 32);
    assert_int_equal(sf_jobauth_check(&a, psk), 0);
    a.iat++; /* the time is signed */
    assert_int_equal(sf_jobauth_check(&a, psk), -EPERM);
    a.iat--;
    a.digest[0] ^= 1; /* so is every byte of the message */
    assert_int_equal(sf_jobauth_check(&a, psk), -EPERM);
    a.digest[0] ^= 1;
    psk[31] ^= 1;
    assert_int_equal(sf_jobauth_check(&a, psk), -EPERM);
    a.state = -1; /* unreadable headers never pass */
    psk[31] ^= 1;
    assert_int_equal(sf_jobauth_check(&a, psk), -EPERM);
}

static void not_a_key(void **state)
{
    char pid[SF_PRODUCER_ID_LEN + 1];
    uint8_t psk[32];

    (void)state;
    assert_int_equal(sf_producer_derive("sf_live_short", pid, psk), -EINVAL);
    assert_int_equal(sf_producer_derive("xx_live_0123456789abcdefghijABCDEFGHIJKL", pid, psk),
                     -EINVAL);
    assert_int_equal(sf_producer_derive(NULL, pid, psk), -EINVAL);
}

static void sealed(void **state)
{
    uint8_t secret[32], other[32], psk[32], back[32], gw1[32], gw2[32];
    char box[SF_PSK_SEALED_HEX], box2[SF_PSK_SEALED_HEX];

    (void)state;
    memset(secret, 7, sizeof(secret));
    memset(other, 8, sizeof(other));
    memset(psk, 0x5a, sizeof(psk));
    assert_int_equal(sf_psk_seal(secret, PID, psk, box), 0);
    assert_int_equal(strlen(box), SF_PSK_SEALED_HEX - 1);
    assert_int_equal(sf_psk_seal(secret, PID, psk, box2), 0);
    assert_string_not_equal(box, box2); /* a fresh nonce each time */
    assert_int_equal(sf_psk_unseal(secret, PID, box, back), 0);
    assert_memory_equal(back, psk, 32);
    assert_int_equal(sf_psk_unseal(other, PID, box, back), -EINVAL);       /* another secret */
    assert_int_equal(sf_psk_unseal(secret, "p000", box, back), -EINVAL);   /* moved to another id */
    box[10] = box[10] == 'a' ? 'b' : 'a';
    assert_int_equal(sf_psk_unseal(secret, PID, box, back), -EINVAL);      /* altered */
    assert_int_equal(sf_psk_unseal(secret, PID, "abc", back), -EINVAL);
    assert_int_equal(sf_psk_unseal(secret, PID, NULL, back), -EINVAL);
    sf_gateway_job_key(secret, gw1);
    sf_gateway_job_key(other, gw2);
    assert_memory_not_equal(gw1, gw2, 32);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(vector),
        cmocka_unit_test(not_a_key),
        cmocka_unit_test(sealed),
    };
    if (sodium_init() < 0)
        return 1;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
