/* sf_util: ids, clocks and small checked helpers. */
#ifndef SF_UTIL_H
#define SF_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define SF_ID_MAX 64

/* Writes prefix + 20 random base32 characters ("sb_k3j..."); 0 or -EIO. */
int sf_id_new(char out[SF_ID_MAX], const char *prefix);
/* True for [a-z0-9_-]{1,63}: ids we hand out and accept as topic/key parts (NULL: false). */
int sf_id_valid(const char *s);
/* Fills buf with n random bytes from getrandom(); 0 or -EIO. */
int sf_random(void *buf, size_t n);
/* This machine's boot id (/proc/sys/kernel/random/boot_id) into out, "" when unreadable:
 * daemons with the same one run on the same boot of the same machine. */
void sf_boot_id(char *out, size_t n);

int64_t sf_now_ms(void);   /* wall clock, ms since epoch */
int64_t sf_mono_ms(void);  /* monotonic, ms */
uint64_t sf_mono_us(void); /* monotonic, us */

/* strtoll with full-string and range checks; 0 or -EINVAL / -ERANGE. */
int sf_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out);

/* Free-and-null (haproxy ha_free). */
#define sf_free(pp)                                                            \
    do {                                                                       \
        free(*(pp));                                                           \
        *(pp) = NULL;                                                          \
    } while (0)

#define SF_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif
