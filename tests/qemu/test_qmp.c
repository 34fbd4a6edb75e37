/* Unit tests of the qemu driver's QMP client (worker/qemu_qmp.c) and of the ping
 * fields a VM agent takes (worker/agent/proto/sf_agentproto.c).
 *
 * The QMP peer here is a FAKE QEMU (the test's end of a socketpair), named as such:
 * real QEMU is what tests/qemu/test_qemu.c drives; only a fake can send the broken
 * and oversized lines whose handling is checked here. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/event.h>

#include "qemu_int.h"
#include "sf_agentproto.h"

typedef struct answer {
    int done;
    char ret[256];
    char err[256];
} answer;

static void on_answer(void *arg, json_t *ret, const char *err)
{
    answer *a = arg;
    char *s = ret ? json_dumps(ret, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;

    a->done++;
    snprintf(a->ret, sizeof(a->ret), "%s", s ? s : "");
    snprintf(a->err, sizeof(a->err), "%s", err ? err : "");
    free(s);
}

typedef struct events {
    int n, closed;
    char last[64];
} events;

static void on_event(void *arg, const char *event, json_t *data)
{
    events *e = arg;
    if (!event) {
        e->closed++;
        return;
    }
    e->n++;
    snprintf(e->last, sizeof(e->last), "%s", event);
}

static struct event_base *base;

static void spin(void)
{
    for (int i = 0; i < 20; i++)
        event_base_loop(base, EVLOOP_NONBLOCK);
}

static void peer_send(int fd, const char *s)
{
    assert_int_equal(send(fd, s, strlen(s), 0), (ssize_t)strlen(s));
    spin();
}

static void test_commands_and_events(void **state)
{
    int sv[2], tmp;
    events ev = {0};
    answer a = {0}, b = {0}, c = {0};
    wk_qmp *q;
    struct msghdr mh = {0};
    char cbuf[CMSG_SPACE(sizeof(int))], dummy[4096];
    struct iovec iov = {dummy, sizeof(dummy)};

    base = event_base_new();
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    assert_non_null(q = wk_qmp_new(base, sv[0], on_event, &ev));
    tmp = open("/dev/null", O_RDONLY | O_CLOEXEC);
    assert_int_equal(wk_qmp_cmd(q, "query-status", NULL, -1, on_answer, &a), 0);
    assert_int_equal(wk_qmp_cmd(q, "getfd", json_pack("{s:s}", "fdname", "x"), tmp, on_answer, &b), 0);
    assert_int_equal(wk_qmp_cmd(q, "stop", NULL, -1, on_answer, &c), 0);
    close(tmp);
    spin();
    /* capabilities first, then the commands in order, each with its id; the fd rides
     * along with the getfd line */
    {
        char all[8192];
        size_t got = 0;
        int got_fd = 0;
        ssize_t n;

        for (;;) {
            mh.msg_iov = &iov;
            mh.msg_iovlen = 1;
            mh.msg_control = cbuf;
            mh.msg_controllen = sizeof(cbuf);
            if ((n = recvmsg(sv[1], &mh, MSG_DONTWAIT)) <= 0)
                break;
            for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
                if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
                    int fd;
                    memcpy(&fd, CMSG_DATA(cm), sizeof(fd));
                    close(fd);
                    got_fd++;
                    /* the fd rides with the getfd line */
                    assert_non_null(memmem(dummy, (size_t)n, "getfd", 5));
                }
            assert_true(got + (size_t)n < sizeof(all));
            memcpy(all + got, dummy, (size_t)n);
            got += (size_t)n;
        }
        all[got] = '\0';
        assert_int_equal(got_fd, 1);
        /* capabilities first, then the commands in order */
        assert_non_null(strstr(all, "\"execute\":\"qmp_capabilities\""));
        assert_true(strstr(all, "qmp_capabilities") < strstr(all, "query-status"));
        assert_true(strstr(all, "query-status") < strstr(all, "getfd"));
        assert_true(strstr(all, "getfd") < strstr(all, "\"stop\""));
    }
    peer_send(sv[1], "{\"QMP\": {\"version\": {}}}\r\n{\"return\": {}, \"id\": 1}\r\n");
    peer_send(sv[1], "{\"timestamp\": {}, \"event\": \"STOP\"}\r\n");
    assert_int_equal(ev.n, 1);
    assert_string_equal(ev.last, "STOP");
    /* answers out of order are matched by id */
    peer_send(sv[1], "{\"return\": {}, \"id\": 4}\r\n");
    assert_int_equal(c.done, 1);
    assert_int_equal(a.done, 0);
    peer_send(sv[1], "{\"return\": {\"status\": \"running\"}, \"id\": 2}\r\n"
                     "{\"error\": {\"class\": \"GenericError\", \"desc\": \"no such fd\"}, \"id\": 3}\r\n");
    assert_int_equal(a.done, 1);
    assert_string_equal(a.ret, "{\"status\":\"running\"}");
    assert_int_equal(b.done, 1);
    assert_string_equal(b.err, "no such fd");
    wk_qmp_free(q);
    close(sv[1]);
    event_base_free(base);
}

/* A line over the limit, or one that is not a JSON object, ends the connection:
 * every pending command is answered with an error, once. */
static void test_bad_lines_close(void **state)
{
    const char *bad[] = {"[1, 2]\n", "not json\n", NULL};

    for (int k = 0; k < 3; k++) {
        int sv[2];
        events ev = {0};
        answer a = {0};
        wk_qmp *q;

        base = event_base_new();
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        assert_non_null(q = wk_qmp_new(base, sv[0], on_event, &ev));
        assert_int_equal(wk_qmp_cmd(q, "stop", NULL, -1, on_answer, &a), 0);
        spin();
        if (bad[k]) {
            peer_send(sv[1], bad[k]);
        } else { /* no newline within WK_QMP_LINE_MAX bytes */
            size_t n = WK_QMP_LINE_MAX + 4096, off = 0;
            char *big = malloc(n);
            assert_non_null(big);
            memset(big, 'x', n);
            fcntl(sv[1], F_SETFL, O_NONBLOCK);
            while (off < n && !a.done) {
                ssize_t w = send(sv[1], big + off, n - off, MSG_DONTWAIT);
                if (w > 0)
                    off += (size_t)w;
                spin();
            }
            free(big);
        }
        spin();
        assert_int_equal(a.done, 1);
        assert_non_null(strstr(a.err, "QEMU"));
        assert_int_equal(ev.closed, 1);
        assert_int_equal(wk_qmp_cmd(q, "cont", NULL, -1, on_answer, &a), -EPIPE);
        wk_qmp_free(q);
        close(sv[1]);
        event_base_free(base);
    }
}

/* The peer going away answers what is pending. */
static void test_eof(void **state)
{
    int sv[2];
    events ev = {0};
    answer a = {0};
    wk_qmp *q;

    base = event_base_new();
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    assert_non_null(q = wk_qmp_new(base, sv[0], on_event, &ev));
    assert_int_equal(wk_qmp_cmd(q, "stop", NULL, -1, on_answer, &a), 0);
    spin();
    close(sv[1]);
    spin();
    assert_int_equal(a.done, 1);
    assert_non_null(strstr(a.err, "closed"));
    wk_qmp_free(q);
    event_base_free(base);
}

/* ping's optional fields: a restored guest's clock, entropy and name. */
static void test_ping_fields(void **state)
{
    unsigned char seed[32];
    sf_ap_msg m = {.op = SF_AP_PING, .id = 9, .now_ns = 1796075439000000001ull, .seed = (char *)seed,
                   .seed_len = sizeof(seed), .name = "sb_abc-1"}, out;
    const char *why = NULL;
    sf_buf b;

    for (size_t i = 0; i < sizeof(seed); i++)
        seed[i] = (unsigned char)(i * 7);
    sf_buf_init(&b, 4096);
    assert_int_equal(sf_ap_encode(&b, &m, &why), 0);
    assert_int_equal(sf_ap_decode(b.p + SF_AP_HDR_LEN, b.len - SF_AP_HDR_LEN, &out, &why), 0);
    assert_int_equal(out.op, SF_AP_PING);
    assert_int_equal(out.id, 9);
    assert_true(out.now_ns == m.now_ns);
    assert_int_equal(out.seed_len, sizeof(seed));
    assert_memory_equal(out.seed, seed, sizeof(seed));
    assert_string_equal(out.name, "sb_abc-1");
    sf_ap_msg_fini(&out);
    sf_buf_fini(&b);

    /* a plain ping still is {op, id} */
    sf_buf_init(&b, 4096);
    m = (sf_ap_msg){.op = SF_AP_PING, .id = 1};
    assert_int_equal(sf_ap_encode(&b, &m, &why), 0);
    assert_int_equal(sf_ap_decode(b.p + SF_AP_HDR_LEN, b.len - SF_AP_HDR_LEN, &out, &why), 0);
    assert_true(out.now_ns == 0 && out.seed_len == 0 && out.name == NULL);
    sf_ap_msg_fini(&out);
    sf_buf_fini(&b);

    /* bad values are refused with a reason */
    sf_buf_init(&b, 4096);
    m = (sf_ap_msg){.op = SF_AP_PING, .id = 1, .seed = (char *)seed, .seed_len = 8};
    assert_int_equal(sf_ap_encode(&b, &m, &why), -EINVAL);
    assert_non_null(strstr(why, "seed"));
    m = (sf_ap_msg){.op = SF_AP_PING, .id = 1, .name = "Bad Name"};
    assert_int_equal(sf_ap_encode(&b, &m, &why), -EINVAL);
    assert_non_null(strstr(why, "name"));
    /* and only a ping may carry them */
    m = (sf_ap_msg){.op = SF_AP_PONG, .id = 1, .version = 1};
    assert_int_equal(sf_ap_encode(&b, &m, &why), 0);
    {
        /* rewrite "v" into "now" is not possible in place; decode a hand-made pong
         * with a now key: fixmap 4 {op: pong, id: 1, v: 1, now: 5} */
        static const unsigned char p[] = {0x84, 0xa2, 'o', 'p', 0xa4, 'p', 'o', 'n', 'g',
                                          0xa2, 'i', 'd', 0x01, 0xa1, 'v', 0x01,
                                          0xa3, 'n', 'o', 'w', 0x05};
        assert_int_equal(sf_ap_decode(p, sizeof(p), &out, &why), -EBADMSG);
        assert_non_null(strstr(why, "not allowed"));
    }
    sf_buf_fini(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_commands_and_events),
        cmocka_unit_test(test_bad_lines_close),
        cmocka_unit_test(test_eof),
        cmocka_unit_test(test_ping_fields),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
