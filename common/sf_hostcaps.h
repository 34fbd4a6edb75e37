/* sf_hostcaps: what a worker host's driver can do beyond the operations every driver has,
 * as bits (the worker's driver table, worker/driver/driver.h WK_CAP_*) and as the words of
 * the heartbeat's `caps` field (space-separated, in the order of sf_hostcaps_words). The
 * worker formats them, the scheduler parses them: nobody decides by a driver's name. */
#ifndef SF_HOSTCAPS_H
#define SF_HOSTCAPS_H

#include <stddef.h>

#define SF_HOSTCAP_LAYERS (1u << 0)     /* "layers": runs team templates' root filesystem
                                           layers (a create's `layers`) */
#define SF_HOSTCAP_BUILDS (1u << 1)     /* "builds": builds team templates (`build_from`) */
#define SF_HOSTCAP_SNAP_PROCS (1u << 2) /* "snapshot_processes": a snapshot keeps the
                                           processes (memory, devices), not only files */
#define SF_HOSTCAP_DEBIAN (1u << 3)     /* "debian": runs the built-in 'debian' template
                                           (its layers as they are, or its own image) */
#define SF_HOSTCAP_DESKTOP (1u << 4)    /* "desktop": runs the built-in 'desktop' template */
#define SF_HOSTCAP_ALL 0x1fu

/* The longest `caps` value sf_hostcaps_format writes, with its NUL. */
#define SF_HOSTCAPS_MAX 48

/* caps as words ("layers builds debian"; "" for none) into buf; the length written, or
 * -ENOSPC when buf is too small (buf then holds ""). */
int sf_hostcaps_format(unsigned caps, char *buf, size_t n);

/* The bits of a heartbeat's `caps` words. Words it does not know (a newer worker's) are
 * skipped; NULL or "" is 0. Reads at most SF_HOSTCAPS_MAX * 4 bytes of words. */
unsigned sf_hostcaps_parse(const char *words);

/* The word of one bit (SF_HOSTCAP_*), or NULL for a bit that has none. */
const char *sf_hostcaps_word(unsigned bit);

#endif
