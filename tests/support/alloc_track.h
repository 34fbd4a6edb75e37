/* alloc_track: the largest single heap allocation this process asked for since the last
 * reset, whichever library asked (msgpack-c, jansson, our code). Tests use it to prove
 * that a decoder refuses hostile input before it allocates, not after.
 * Under AddressSanitizer it uses the sanitizer's allocation hooks; otherwise it wraps
 * glibc's malloc, calloc and realloc. */
#ifndef SF_TEST_ALLOC_TRACK_H
#define SF_TEST_ALLOC_TRACK_H

#include <stddef.h>

void alloc_track_reset(void);
size_t alloc_track_largest(void);

#endif
