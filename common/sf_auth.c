#include "sf_auth.h"
#include "sf_util.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char b62[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/* Made whole under a temporary name, then linked in place: daemons started together all
 * create it when it is missing, and one that found the name before the bytes were written
 * read an empty file ("must hold 64 hex characters"). 0 when it exists (ours or another's). */
static int secret_create(const char *path)
{
    uint8_t s[32];
    char hex[65], tmp[4096];
    int fd, rc = 0;

    if (access(path, F_OK) == 0)
        return 0;
    if (snprintf(tmp, sizeof(tmp), "%s.%d.tmp", path, (int)getpid()) >= (int)sizeof(tmp))
        return -ENAMETOOLONG;
    if ((fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)) < 0)
        return -errno;
    if (sf_random(s, sizeof(s)) < 0) {
        rc = -EIO;
        goto out;
    }
    sodium_bin2hex(hex, sizeof(hex), s, sizeof(s));
    hex[64] = '\n';
    if (write(fd, hex, 65) != 65 || fsync(fd) < 0)
        rc = -EIO;
    else if (link(tmp, path) < 0 && errno != EEXIST)
        rc = -errno;
out:
    close(fd);
    unlink(tmp);
    return rc;
}

int sf_auth_secret_load(const char *path, uint8_t secret[32], char *why, size_t whylen)
{
    char hex[80];
    size_t bin_len = 0;
    ssize_t n;
    int fd, rc;

    if (sodium_init() < 0) {
        snprintf(why, whylen, "libsodium failed to initialise.");
        return -EIO;
    }
    if ((rc = secret_create(path)) < 0) {
        snprintf(why, whylen, "Cannot create the key-hash secret %s: %s.", path, strerror(-rc));
        return rc;
    }
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
        snprintf(why, whylen, "Cannot read the key-hash secret %s: %s.", path, strerror(errno));
        return -errno;
    }
    n = read(fd, hex, sizeof(hex) - 1);
    close(fd);
    if (n < 64 || sodium_hex2bin(secret, 32, hex, 64, NULL, &bin_len, NULL) != 0 ||
        bin_len != 32) {
        snprintf(why, whylen, "The key-hash secret %s must hold 64 hex characters.", path);
        return -EINVAL;
    }
    return 0;
}

int sf_apikey_new(char out[SF_APIKEY_LEN + 1])
{
    uint8_t r[32];
    size_t plen = strlen(SF_APIKEY_PREFIX);

    if (sf_random(r, sizeof(r)) < 0)
        return -EIO;
    memcpy(out, SF_APIKEY_PREFIX, plen);
    for (size_t i = 0; i < 32; i++)
        out[plen + i] = b62[r[i] % 62]; /* bias of 256 % 62 is irrelevant at 190 bits */
    out[SF_APIKEY_LEN] = '\0';
    return 0;
}

int sf_apikey_hash(const uint8_t secret[32], const char *key, char out[SF_APIKEY_HASH_HEX])
{
    size_t plen = strlen(SF_APIKEY_PREFIX);
    uint8_t h[32];

    if (strlen(key) != SF_APIKEY_LEN || strncmp(key, SF_APIKEY_PREFIX, plen) != 0)
        return -EINVAL;
    for (size_t i = plen; i < SF_APIKEY_LEN; i++)
        if (!strchr(b62, key[i]))
            return -EINVAL;
    crypto_generichash(h, sizeof(h), (const unsigned char *)key, SF_APIKEY_LEN, secret, 32);
    sodium_bin2hex(out, SF_APIKEY_HASH_HEX, h, sizeof(h));
    return 0;
}
