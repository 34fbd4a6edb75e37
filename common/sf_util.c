#include "sf_util.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

int sf_random(void *buf, size_t n)
{
    char *p = buf;
    while (n > 0) {
        ssize_t r = getrandom(p, n, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -EIO;
        }
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

int sf_id_new(char out[SF_ID_MAX], const char *prefix)
{
    static const char alpha[] = "abcdefghijklmnopqrstuvwxyz234567";
    unsigned char rnd[20];
    size_t plen = strlen(prefix);

    if (plen > SF_ID_MAX - 21 || sf_random(rnd, sizeof(rnd)) < 0)
        return -EIO;
    memcpy(out, prefix, plen);
    for (size_t i = 0; i < sizeof(rnd); i++)
        out[plen + i] = alpha[rnd[i] & 31];
    out[plen + sizeof(rnd)] = '\0';
    return 0;
}

int sf_id_valid(const char *s)
{
    size_t n = 0;
    if (!s)
        return 0;
    for (; s[n]; n++) {
        char c = s[n];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return 0;
        if (n >= 63)
            return 0;
    }
    return n > 0;
}

int64_t sf_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t sf_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

uint64_t sf_mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

int sf_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out)
{
    char *end;
    long long v;

    if (!s || !*s)
        return -EINVAL;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (*end != '\0')
        return -EINVAL;
    if (errno == ERANGE || v < min || v > max)
        return -ERANGE;
    *out = v;
    return 0;
}

void sf_boot_id(char *out, size_t n)
{
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");

    out[0] = '\0';
    if (f && fgets(out, (int)n, f))
        out[strcspn(out, "\n")] = '\0';
    if (f)
        fclose(f);
}
