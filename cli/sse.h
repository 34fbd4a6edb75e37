/* sse.h: an incremental text/event-stream parser (the WHATWG rules: CR, LF or CRLF line
 * ends, split anywhere between chunks; "data:" lines joined with LF; "id:" kept across
 * events; "retry:"; comments; a leading BOM). Bounded: a line or an event's data past
 * `max` bytes is an error. */
#ifndef CLI_SSE_H
#define CLI_SSE_H

#include "sf_buf.h"

#include <stddef.h>

typedef struct cli_sse {
    sf_buf line;     /* the line being read */
    sf_buf data;     /* the event being read: its data lines, each followed by LF */
    char event[64];  /* its type ("" = message) */
    char id[256];    /* the last event id seen (kept across events, as the spec says) */
    long retry_ms;   /* the last retry: field, -1 if none */
    int cr;          /* the previous byte was a CR: a following LF ends nothing */
    int bom_done;    /* the stream's first bytes were checked for a BOM */
    int has_data;    /* the event has at least one data line */
} cli_sse;

/* One event: type ("message" when the server sent none), data (NUL-terminated, len bytes,
 * no trailing LF), the last event id ("" if none). Return 0 to go on, negative to stop
 * (cli_sse_feed returns it). */
typedef int (*cli_sse_cb)(void *arg, const char *type, const char *data, size_t len,
                          const char *id);

void cli_sse_init(cli_sse *s, size_t max);
void cli_sse_fini(cli_sse *s);
/* Parses n more bytes, calling cb for each event they complete.
 * 0, -E2BIG (a line or an event over max), -ENOMEM, or cb's negative value. */
int cli_sse_feed(cli_sse *s, const char *p, size_t n, cli_sse_cb cb, void *arg);

#endif
