#include "sf_hostcaps.h"

#include <errno.h>
#include <string.h>

static const struct {
    unsigned bit;
    const char *word;
} words[] = {
    {SF_HOSTCAP_LAYERS, "layers"},
    {SF_HOSTCAP_BUILDS, "builds"},
    {SF_HOSTCAP_SNAP_PROCS, "snapshot_processes"},
    {SF_HOSTCAP_DEBIAN, "debian"},
    {SF_HOSTCAP_DESKTOP, "desktop"},
};

const char *sf_hostcaps_word(unsigned bit)
{
    for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++)
        if (words[i].bit == bit)
            return words[i].word;
    return NULL;
}

int sf_hostcaps_format(unsigned caps, char *buf, size_t n)
{
    size_t len = 0, w;

    if (!n)
        return -ENOSPC;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++) {
        if (!(caps & words[i].bit))
            continue;
        w = strlen(words[i].word);
        if (len + (len > 0) + w + 1 > n) {
            buf[0] = '\0';
            return -ENOSPC;
        }
        if (len)
            buf[len++] = ' ';
        memcpy(buf + len, words[i].word, w + 1);
        len += w;
    }
    return (int)len;
}

unsigned sf_hostcaps_parse(const char *s)
{
    unsigned caps = 0;
    size_t left = SF_HOSTCAPS_MAX * 4, w;

    if (!s)
        return 0;
    while (left && *s) {
        while (left && *s == ' ')
            s++, left--;
        for (w = 0; w < left && s[w] && s[w] != ' '; w++)
            ;
        if (w == left && s[w])
            break; /* a word cut at the bound: not read */
        for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++)
            if (strlen(words[i].word) == w && !memcmp(s, words[i].word, w))
                caps |= words[i].bit;
        s += w;
        left -= w;
    }
    return caps;
}
