/* libFuzzer harness for cli/sse.c: any bytes, fed whole and then in two pieces, must parse
 * without a crash, within the bound, to the same events. */
#include "sse.h"

#include <stdint.h>
#include <string.h>

static int on_event(void *arg, const char *type, const char *data, size_t len, const char *id)
{
    if (strlen(type) >= 64 || strlen(id) >= 256 || len > 4096)
        __builtin_trap();
    *(size_t *)arg += len + 1; /* what the events held: the same however the input is cut */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cli_sse a, b;
    size_t na = 0, nb = 0, cut = size / 2;
    int ra, rb;

    cli_sse_init(&a, 4096);
    cli_sse_init(&b, 4096);
    ra = cli_sse_feed(&a, (const char *)data, size, on_event, &na);
    rb = cli_sse_feed(&b, (const char *)data, cut, on_event, &nb);
    if (rb == 0)
        rb = cli_sse_feed(&b, (const char *)data + cut, size - cut, on_event, &nb);
    if (ra != rb || (ra == 0 && na != nb))
        __builtin_trap();
    cli_sse_fini(&a);
    cli_sse_fini(&b);
    return 0;
}
