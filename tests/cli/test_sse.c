/* cli/sse.c: the text/event-stream parser the mcp-stdio bridge reads gateway answers with. */
#include "sse.h"

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

typedef struct seen {
    char log[4096]; /* "type|id|data\n" per event */
    int n;
} seen;

static int on_event(void *arg, const char *type, const char *data, size_t len, const char *id)
{
    seen *s = arg;
    size_t used = strlen(s->log);

    assert_int_equal(strlen(data), len); /* NUL-terminated, no embedded NUL here */
    snprintf(s->log + used, sizeof(s->log) - used, "%s|%s|%.*s\n", type, id, (int)len, data);
    s->n++;
    return 0;
}

static void parse_whole(const char *in, size_t max, seen *out, int expect_rc)
{
    cli_sse p;

    memset(out, 0, sizeof(*out));
    cli_sse_init(&p, max);
    assert_int_equal(cli_sse_feed(&p, in, strlen(in), on_event, out), expect_rc);
    cli_sse_fini(&p);
}

/* The same events whatever the chunking: byte by byte, and split at every position. */
static void check_chunkings(const char *in, const char *want)
{
    size_t n = strlen(in);
    seen s;
    cli_sse p;

    parse_whole(in, 1 << 20, &s, 0);
    assert_string_equal(s.log, want);
    memset(&s, 0, sizeof(s));
    cli_sse_init(&p, 1 << 20);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(cli_sse_feed(&p, in + i, 1, on_event, &s), 0);
    cli_sse_fini(&p);
    assert_string_equal(s.log, want);
    for (size_t cut = 1; cut < n; cut++) {
        memset(&s, 0, sizeof(s));
        cli_sse_init(&p, 1 << 20);
        assert_int_equal(cli_sse_feed(&p, in, cut, on_event, &s), 0);
        assert_int_equal(cli_sse_feed(&p, in + cut, n - cut, on_event, &s), 0);
        cli_sse_fini(&p);
        assert_string_equal(s.log, want);
    }
}

static void test_events(void **state)
{
    check_chunkings("data: {\"a\":1}\n\n", "message||{\"a\":1}\n");
    check_chunkings("event: message\nid: 7\ndata: one\ndata:two\n\ndata: three\n\n",
                    "message|7|one\ntwo\nmessage|7|three\n");
    check_chunkings("data: x\r\n\r\ndata: y\r\rdata: z\n\n", "message||x\nmessage||y\nmessage||z\n");
    check_chunkings(": a comment\nretry: 100\nid: e1\ndata: \n\n", "message|e1|\n");
    check_chunkings("\xEF\xBB\xBF" "data: bom\n\n", "message||bom\n");
    check_chunkings("event: ping\ndata\n\n", "ping||\n");
}

static void test_fields(void **state)
{
    seen s;
    cli_sse p;
    const char *in = "retry: 2500\nid: abc\n\nfoo: bar\nid\nretry: x1\n\n";

    memset(&s, 0, sizeof(s));
    cli_sse_init(&p, 1024);
    assert_int_equal(cli_sse_feed(&p, in, strlen(in), on_event, &s), 0);
    assert_int_equal(s.n, 0);            /* no data: nothing dispatched */
    assert_int_equal(p.retry_ms, 2500);  /* "x1" is not a number: ignored */
    assert_string_equal(p.id, "");       /* a bare "id" resets it */
    cli_sse_fini(&p);
    parse_whole("data: no end yet", 1024, &s, 0);
    assert_int_equal(s.n, 0);            /* an event is only complete at its blank line */
}

static void test_limits(void **state)
{
    char big[300];
    seen s;

    memset(big, 'a', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    memcpy(big, "data: ", 6);
    parse_whole(big, 256, &s, -E2BIG); /* one line over the maximum */
    parse_whole("data: 0123456789\ndata: 0123456789\ndata: 0123456789\n\n", 30, &s, -E2BIG);
    parse_whole("data: 0123456789\n\n", 30, &s, 0);
}

static int stop_cb(void *arg, const char *type, const char *data, size_t len, const char *id)
{
    (*(int *)arg)++;
    return -ECANCELED;
}

static void test_callback_stops(void **state)
{
    cli_sse p;
    int calls = 0;
    const char *in = "data: 1\n\ndata: 2\n\n";

    cli_sse_init(&p, 1024);
    assert_int_equal(cli_sse_feed(&p, in, strlen(in), stop_cb, &calls), -ECANCELED);
    assert_int_equal(calls, 1);
    cli_sse_fini(&p);
    cli_sse_fini(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_events),
        cmocka_unit_test(test_fields),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_callback_stops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
