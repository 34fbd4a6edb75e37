/* check: the fatal assertion of the plain-C test programs (those not on cmocka): CHECK(cond,
 * fmt, ...) prints "FAIL file:line: " and the message, runs CHECK_CLEANUP() (define it
 * before including this header to stop what the test started, e.g. a broker), and exits 1. */
#ifndef SF_TEST_CHECK_H
#define SF_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#ifndef CHECK_CLEANUP
#define CHECK_CLEANUP() ((void)0)
#endif

#define CHECK(cond, ...)                                                                       \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                               \
            fprintf(stderr, __VA_ARGS__);                                                      \
            fprintf(stderr, "\n");                                                             \
            CHECK_CLEANUP();                                                                   \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

#endif
