/* The guest agent as a process, outside any jail: the worker's socket is a
 * socketpair handed over as fd 3, exactly as in a sandbox. Checks the
 * protocol behaviour (ping, exec, errors, timeouts, concurrency, caps,
 * malformed frames) without needing root. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "sf_agentproto.h"
#include "sf_buf.h"
#include "sf_util.h"

typedef struct agent {
    pid_t pid;
    int fd;
    sf_buf in;
} agent;

static int agent_start(void **state)
{
    agent *a = calloc(1, sizeof(*a));
    int sv[2];

    assert_non_null(a);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    a->pid = fork();
    assert_true(a->pid >= 0);
    if (a->pid == 0) {
        char *argv[] = {"sandfleet-agent", NULL};
        if (dup2(sv[1], SF_AP_AGENT_FD) < 0)
            _exit(99);
        execv(SF_AGENT_PATH, argv);
        _exit(98);
    }
    close(sv[1]);
    a->fd = sv[0];
    sf_buf_init(&a->in, 4 * SF_AP_FRAME_MAX);
    *state = a;
    return 0;
}

static int agent_stop(void **state)
{
    agent *a = *state;
    int status;

    close(a->fd);
    /* The agent exits on EOF from the worker. */
    assert_int_equal(waitpid(a->pid, &status, 0), a->pid);
    assert_true(WIFEXITED(status));
    sf_buf_fini(&a->in);
    free(a);
    return 0;
}

static void send_raw(agent *a, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = write(a->fd, c, n);
        assert_true(w > 0);
        c += w;
        n -= (size_t)w;
    }
}

static void send_msg(agent *a, const sf_ap_msg *m)
{
    const char *why = NULL;
    sf_buf b;

    sf_buf_init(&b, SF_AP_HDR_LEN + SF_AP_FRAME_MAX);
    assert_int_equal(sf_ap_encode(&b, m, &why), 0);
    send_raw(a, b.p, b.len);
    sf_buf_fini(&b);
}

static void send_exec(agent *a, uint32_t id, const char *cmd, uint32_t timeout_ms, uint32_t cap)
{
    sf_ap_msg m = {.op = SF_AP_EXEC, .id = id, .cmd = cmd, .timeout_ms = timeout_ms, .cap = cap};
    send_msg(a, &m);
}

/* Next frame from the agent; returns -1 on EOF. Fails the test after 10 s. */
static int recv_msg(agent *a, sf_ap_msg *m)
{
    int64_t deadline = sf_mono_ms() + 10000;
    const char *why = NULL;
    size_t flen;

    for (;;) {
        assert_int_equal(sf_ap_frame_check(a->in.p ? a->in.p : "", a->in.len, &flen, &why), 0);
        if (flen) {
            assert_int_equal(sf_ap_decode(a->in.p + SF_AP_HDR_LEN, flen - SF_AP_HDR_LEN, m, &why), 0);
            sf_buf_consume(&a->in, flen);
            return 0;
        }
        struct pollfd p = {.fd = a->fd, .events = POLLIN};
        int64_t left = deadline - sf_mono_ms();
        assert_true(left > 0);
        assert_true(poll(&p, 1, (int)left) == 1);
        char buf[65536];
        ssize_t n = read(a->fd, buf, sizeof(buf));
        if (n == 0)
            return -1;
        assert_true(n > 0);
        assert_int_equal(sf_buf_append(&a->in, buf, (size_t)n), 0);
    }
}

static void test_ping(void **state)
{
    agent *a = *state;
    sf_ap_msg ping = {.op = SF_AP_PING, .id = 11}, m;

    send_msg(a, &ping);
    assert_int_equal(recv_msg(a, &m), 0);
    assert_int_equal(m.op, SF_AP_PONG);
    assert_int_equal(m.id, 11);
    assert_int_equal(m.version, SF_AP_VERSION);
    sf_ap_msg_fini(&m);
}

static void test_exec_streams_and_exit(void **state)
{
    agent *a = *state;
    sf_ap_msg m;

    send_exec(a, 5, "echo hello; echo oops >&2; exit 3", 5000, 32768);
    assert_int_equal(recv_msg(a, &m), 0);
    assert_int_equal(m.op, SF_AP_RESULT);
    assert_int_equal(m.id, 5);
    assert_int_equal(m.exit_code, 3);
    assert_false(m.timed_out);
    assert_false(m.truncated);
    assert_int_equal(m.out_len, 6);
    assert_memory_equal(m.out, "hello\n", 6);
    assert_int_equal(m.out_total, 6);
    assert_int_equal(m.err_len, 5);
    assert_memory_equal(m.err, "oops\n", 5);
    sf_ap_msg_fini(&m);
}

static void test_exec_signal_exit_code(void **state)
{
    agent *a = *state;
    sf_ap_msg m;

    send_exec(a, 6, "kill -TERM $$", 5000, 100);
    assert_int_equal(recv_msg(a, &m), 0);
    assert_int_equal(m.exit_code, 128 + SIGTERM);
    sf_ap_msg_fini(&m);
}

static void test_exec_env_and_cwd(void **state)
{
    agent *a = *state;
    const char *env[] = {"FOO=bar baz", "HOME=/tmp"};
    sf_ap_msg ex = {.op = SF_AP_EXEC, .id = 7, .cmd = "echo \"$FOO|$HOME|$TERM\"; pwd",
                    .cwd = "/", .env = env, .env_n = 2, .timeout_ms = 5000, .cap = 1000};
    sf_ap_msg m;

    send_msg(a, &ex);
    assert_int_equal(recv_msg(a, &m), 0);
    assert_int_equal(m.op, SF_AP_RESULT);
    assert_int_equal(m.exit_code, 0);
    assert_string_equal(m.out, "bar baz|/tmp|xterm\n/\n");
    sf_ap_msg_fini(&m);
}

static void test_exec_missing_cwd_is_an_error(void **state)
{
    agent *a = *state;
    sf_ap_msg ex = {.op = SF_AP_EXEC, .id = 8, .cmd = "true", .cwd = "/no/such/dir",
                    .timeout_ms = 5000, .cap = 100};
    sf_ap_msg m;

    send_msg(a, &ex);
    assert_int_equal(recv_msg(a, &m), 0);
    assert_int_equal(m.op, SF_AP_ERROR);
    assert_int_equal(m.id, 8);
    assert_non_null(strstr(m.msg, "/no/such/dir"));
    assert_non_null(strstr(m.msg, "does not exist"));
    sf_ap_msg_fini(&m);
    test_ping(state); /* still serving */
}

static void test_exec_stdin_is_dev_null(void **state)
{
    agent *a = *state;
    sf_ap_msg m;

    send_exec(a, 9, "cat; echo done", 5000, 100);
    assert_int_equal(recv_msg(a, &m), 0);
    assert_int_equal(m.exit_code, 0);
    assert_string_equal(m.out, "done\n");
    sf_ap_msg_fini(&m);
}

static void test_exec_truncates_head_and_tail(void **state)
{
    agent *a = *state;
    sf_ap_msg m;

    /* 100000 bytes: "S" + 99998 x "." + "E" */
    send_exec(a, 10, "printf S; head -c 99998 /dev/zero | tr '\\0' .; printf E", 5000, 1000);
    assert_int_equal(recv_msg(a, &m), 0);
    assert_int_equal(m.op, SF_AP_RESULT);
    assert_true(m.truncated);
    assert_int_equal(m.out_len, 1000);
    assert_int_equal(m.out_total, 100000);
    assert_int_equal(m.out[0], 'S');
    assert_int_equal(m.out[999], 'E');
    assert_int_equal(m.out[500], '.');
    sf_ap_msg_fini(&m);
}

static void test_exec_timeout_kills_group(void **state)
{
    agent *a = *state;
    int64_t t0 = sf_mono_ms();
    sf_ap_msg m;

    /* A child in the group writes its pid; after the kill it must be gone. */
    send_exec(a, 12, "sleep 30 & echo $! > /tmp/sf-agent-test-pid.$PPID; wait", 300, 100);
    assert_int_equal(recv_msg(a, &m), 0);
    assert_int_equal(m.op, SF_AP_RESULT);
    assert_true(m.timed_out);
    assert_int_equal(m.exit_code, -1);
    assert_true(sf_mono_ms() - t0 < 5000);
    assert_true(m.duration_ms >= 300);
    sf_ap_msg_fini(&m);
    {
        char path[64], buf[32] = {0};
        int64_t pid;
        FILE *f;
        snprintf(path, sizeof(path), "/tmp/sf-agent-test-pid.%d", (int)a->pid);
        f = fopen(path, "r");
        assert_non_null(f);
        assert_non_null(fgets(buf, sizeof(buf), f));
        fclose(f);
        unlink(path);
        buf[strcspn(buf, "\n")] = '\0';
        assert_int_equal(sf_parse_i64(buf, 1, INT32_MAX, &pid), 0);
        /* The agent reaps its children; give the reap one loop turn. */
        for (int i = 0; i < 200 && kill((pid_t)pid, 0) == 0; i++)
            usleep(10000);
        assert_int_equal(kill((pid_t)pid, 0), -1);
        assert_int_equal(errno, ESRCH);
    }
}

static void test_concurrent_execs(void **state)
{
    agent *a = *state;
    int64_t t0 = sf_mono_ms();
    int seen[4] = {0};
    sf_ap_msg m;

    for (uint32_t i = 0; i < 4; i++) {
        char cmd[64];
        snprintf(cmd, sizeof(cmd), "sleep 0.5; echo %u", 100 + i);
        send_exec(a, 100 + i, cmd, 5000, 100);
    }
    for (int i = 0; i < 4; i++) {
        char want[8];
        assert_int_equal(recv_msg(a, &m), 0);
        assert_int_equal(m.op, SF_AP_RESULT);
        assert_true(m.id >= 100 && m.id < 104);
        seen[m.id - 100]++;
        snprintf(want, sizeof(want), "%u\n", m.id);
        assert_string_equal(m.out, want);
        sf_ap_msg_fini(&m);
    }
    for (int i = 0; i < 4; i++)
        assert_int_equal(seen[i], 1);
    assert_true(sf_mono_ms() - t0 < 1800); /* in parallel, not 4 x 0.5 s */
}

static void test_duplicate_running_id_is_refused(void **state)
{
    agent *a = *state;
    sf_ap_msg m;

    send_exec(a, 200, "sleep 0.3; echo first", 5000, 100);
    send_exec(a, 200, "echo second", 5000, 100);
    assert_int_equal(recv_msg(a, &m), 0);
    assert_int_equal(m.op, SF_AP_ERROR);
    assert_int_equal(m.id, 200);
    sf_ap_msg_fini(&m);
    assert_int_equal(recv_msg(a, &m), 0);
    assert_int_equal(m.op, SF_AP_RESULT);
    assert_string_equal(m.out, "first\n");
    sf_ap_msg_fini(&m);
}

static void test_background_process_does_not_hold_the_result(void **state)
{
    agent *a = *state;
    int64_t t0 = sf_mono_ms();
    sf_ap_msg m;

    send_exec(a, 300, "(sleep 2; echo late) & echo now", 5000, 100);
    assert_int_equal(recv_msg(a, &m), 0);
    assert_int_equal(m.exit_code, 0);
    assert_string_equal(m.out, "now\n");
    assert_true(sf_mono_ms() - t0 < 1500);
    sf_ap_msg_fini(&m);
}

static void test_malformed_request_gets_error_reply(void **state)
{
    agent *a = *state;
    const unsigned char garbage[] = {0, 0, 0, 3, 0x93, 0x01, 0x02};
    const unsigned char no_map[] = {0, 0, 0, 1, 0xc0};
    sf_ap_msg result = {.op = SF_AP_RESULT, .id = 77, .out = "", .err = ""};
    sf_ap_msg m;

    send_raw(a, garbage, sizeof(garbage));
    assert_int_equal(recv_msg(a, &m), 0);
    assert_int_equal(m.op, SF_AP_ERROR);
    assert_int_equal(m.id, 0);
    assert_non_null(strstr(m.msg, "malformed"));
    sf_ap_msg_fini(&m);

    send_raw(a, no_map, sizeof(no_map));
    assert_int_equal(recv_msg(a, &m), 0);
    assert_int_equal(m.op, SF_AP_ERROR);
    sf_ap_msg_fini(&m);

    /* Well-formed but not a request the agent serves. */
    send_msg(a, &result);
    assert_int_equal(recv_msg(a, &m), 0);
    assert_int_equal(m.op, SF_AP_ERROR);
    assert_int_equal(m.id, 77);
    sf_ap_msg_fini(&m);
    test_ping(state);
}

static void test_frame_split_across_writes(void **state)
{
    agent *a = *state;
    sf_ap_msg ping = {.op = SF_AP_PING, .id = 400}, m;
    const char *why;
    sf_buf b;

    sf_buf_init(&b, 256);
    assert_int_equal(sf_ap_encode(&b, &ping, &why), 0);
    for (size_t i = 0; i < b.len; i++) {
        send_raw(a, b.p + i, 1);
        usleep(1000);
    }
    sf_buf_fini(&b);
    assert_int_equal(recv_msg(a, &m), 0);
    assert_int_equal(m.op, SF_AP_PONG);
    assert_int_equal(m.id, 400);
    sf_ap_msg_fini(&m);
}

static void test_oversized_frame_ends_the_agent(void **state)
{
    agent *a = *state;
    const unsigned char huge[] = {0x00, 0x10, 0x00, 0x01}; /* 1 MiB + 1 */
    sf_ap_msg m;

    send_raw(a, huge, sizeof(huge));
    assert_int_equal(recv_msg(a, &m), -1); /* EOF: the stream cannot be resynchronised */
}

/* Files: the agent outside a jail sees the host's root, so the test works in a
 * temporary directory. A FIFO is refused at once, not waited on. */
static void test_files(void **state)
{
    agent *a = *state;
    char dir[] = "/tmp/sf-agent-files-XXXXXX", path[256], to[256], fifo[256];
    static char chunk[SF_AP_DATA_MAX];
    sf_ap_msg m, r;

    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/new/deeper/f.bin", dir);
    memset(chunk, 'z', sizeof(chunk));
    m = (sf_ap_msg){.op = SF_AP_FWRITE, .id = 1, .path = path, .data = chunk,
                    .data_len = sizeof(chunk), .flags = SF_AP_F_CREATE | SF_AP_F_MKDIRS};
    send_msg(a, &m);
    assert_int_equal(recv_msg(a, &r), 0);
    assert_int_equal(r.op, SF_AP_OK);
    assert_int_equal(r.size, sizeof(chunk));
    sf_ap_msg_fini(&r);
    m = (sf_ap_msg){.op = SF_AP_FWRITE, .id = 2, .path = path, .off = sizeof(chunk),
                    .data = "tail", .data_len = 4};
    send_msg(a, &m);
    assert_int_equal(recv_msg(a, &r), 0);
    assert_int_equal(r.size, sizeof(chunk) + 4);
    sf_ap_msg_fini(&r);

    m = (sf_ap_msg){.op = SF_AP_FREAD, .id = 3, .path = path, .off = sizeof(chunk) - 2, .len = 100};
    send_msg(a, &m);
    assert_int_equal(recv_msg(a, &r), 0);
    assert_int_equal(r.op, SF_AP_DATA);
    assert_int_equal(r.size, sizeof(chunk) + 4);
    assert_int_equal(r.data_len, 6);
    assert_memory_equal(r.data, "zztail", 6);
    sf_ap_msg_fini(&r);

    snprintf(to, sizeof(to), "%s/new/moved.bin", dir);
    m = (sf_ap_msg){.op = SF_AP_FMOVE, .id = 4, .path = path, .to = to};
    send_msg(a, &m);
    assert_int_equal(recv_msg(a, &r), 0);
    assert_int_equal(r.op, SF_AP_OK);
    sf_ap_msg_fini(&r);

    snprintf(path, sizeof(path), "%s/new", dir);
    m = (sf_ap_msg){.op = SF_AP_FLIST, .id = 5, .path = path, .len = 10};
    send_msg(a, &m);
    assert_int_equal(recv_msg(a, &r), 0);
    assert_int_equal(r.op, SF_AP_ENTRIES);
    assert_int_equal(r.n_entries, 2);
    assert_false(r.more);
    for (size_t i = 0; i < r.n_entries; i++) {
        if (r.entries[i].type == 'f') {
            assert_string_equal(r.entries[i].name, "moved.bin");
            assert_int_equal(r.entries[i].size, sizeof(chunk) + 4);
        } else {
            assert_string_equal(r.entries[i].name, "deeper");
            assert_int_equal(r.entries[i].type, 'd');
        }
    }
    sf_ap_msg_fini(&r);
    m = (sf_ap_msg){.op = SF_AP_FLIST, .id = 6, .path = path, .len = 1};
    send_msg(a, &m);
    assert_int_equal(recv_msg(a, &r), 0);
    assert_int_equal(r.n_entries, 1);
    assert_true(r.more);
    sf_ap_msg_fini(&r);

    snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    m = (sf_ap_msg){.op = SF_AP_FREAD, .id = 7, .path = fifo, .len = 10};
    send_msg(a, &m);
    assert_int_equal(recv_msg(a, &r), 0);
    assert_int_equal(r.op, SF_AP_ERROR);
    assert_int_equal(r.errnum, EINVAL);
    sf_ap_msg_fini(&r);
    m = (sf_ap_msg){.op = SF_AP_FREAD, .id = 8, .path = path, .len = 10};
    send_msg(a, &m);
    assert_int_equal(recv_msg(a, &r), 0);
    assert_int_equal(r.errnum, EISDIR);
    sf_ap_msg_fini(&r);
    snprintf(path, sizeof(path), "%s/none", dir);
    m = (sf_ap_msg){.op = SF_AP_FDEL, .id = 9, .path = path};
    send_msg(a, &m);
    assert_int_equal(recv_msg(a, &r), 0);
    assert_int_equal(r.errnum, ENOENT);
    sf_ap_msg_fini(&r);

    m = (sf_ap_msg){.op = SF_AP_FDEL, .id = 10, .path = to};
    send_msg(a, &m);
    assert_int_equal(recv_msg(a, &r), 0);
    assert_int_equal(r.op, SF_AP_OK);
    sf_ap_msg_fini(&r);
    unlink(fifo);
    snprintf(path, sizeof(path), "%s/new/deeper", dir);
    rmdir(path);
    snprintf(path, sizeof(path), "%s/new", dir);
    rmdir(path);
    assert_int_equal(rmdir(dir), 0);
}

/* A streamed exec: output frames first (the first one before the command ends), then the
 * result with the capped output as usual; a cancel kills a running command. */
static void test_stream_and_cancel(void **state)
{
    agent *a = *state;
    sf_ap_msg m = {.op = SF_AP_EXEC, .id = 1, .cmd = "echo ready; sleep 0.5; echo done >&2",
                   .timeout_ms = 10000, .cap = 4096, .stream = 1}, r;
    char got[2][64] = {"", ""};
    int outputs = 0;

    send_msg(a, &m);
    for (;;) {
        assert_int_equal(recv_msg(a, &r), 0);
        if (r.op == SF_AP_RESULT)
            break;
        assert_int_equal(r.op, SF_AP_OUTPUT);
        assert_int_equal(r.id, 1);
        strncat(got[r.s], r.data, r.data_len);
        outputs++;
        sf_ap_msg_fini(&r);
    }
    assert_string_equal(got[0], "ready\n");
    assert_string_equal(got[1], "done\n");
    assert_true(outputs >= 2);
    assert_int_equal(r.exit_code, 0);
    assert_int_equal(r.out_len, 6);
    sf_ap_msg_fini(&r);

    send_exec(a, 2, "sleep 600", 60000, 64);
    m = (sf_ap_msg){.op = SF_AP_CANCEL, .id = 3, .target = 2};
    send_msg(a, &m);
    for (int seen = 0; seen < 2;) {
        assert_int_equal(recv_msg(a, &r), 0);
        if (r.op == SF_AP_OK) {
            assert_int_equal(r.id, 3);
            assert_int_equal(r.size, 1);
        } else {
            assert_int_equal(r.op, SF_AP_RESULT);
            assert_int_equal(r.id, 2);
            assert_int_equal(r.exit_code, 128 + SIGKILL);
        }
        seen++;
        sf_ap_msg_fini(&r);
    }
    m = (sf_ap_msg){.op = SF_AP_CANCEL, .id = 4, .target = 2};
    send_msg(a, &m);
    assert_int_equal(recv_msg(a, &r), 0);
    assert_int_equal(r.size, 0);
    sf_ap_msg_fini(&r);
}

/* Background commands, their logs, the process list, kill and stdin (issue 20). */
static void test_background_logs_kill_stdin(void **state)
{
    agent *a = *state;
    sf_ap_msg m = {.op = SF_AP_EXEC, .id = 1, .cmd = "echo hi; echo err >&2; exec sleep 600",
                   .timeout_ms = 1, .cap = 64, .bg = 1}, r;
    uint32_t pid;
    int found = 0;

    send_msg(a, &m);
    assert_int_equal(recv_msg(a, &r), 0);
    assert_int_equal(r.op, SF_AP_OK);
    assert_int_equal(r.id, 1);
    pid = (uint32_t)r.size;
    assert_true(pid > 1);
    sf_ap_msg_fini(&r);
    /* its merged output, in its log (timeout_ms 1 does not apply) */
    for (int got = 0; !got;) {
        m = (sf_ap_msg){.op = SF_AP_PLOGS, .id = 2, .pid = pid};
        send_msg(a, &m);
        assert_int_equal(recv_msg(a, &r), 0);
        assert_int_equal(r.op, SF_AP_LOG);
        assert_false(r.exited);
        got = r.data_len == 7;
        if (got) {
            assert_memory_equal(r.data, "hi\nerr\n", 7);
            assert_int_equal(r.size, 0);
            assert_int_equal(r.off, 7);
        }
        sf_ap_msg_fini(&r);
    }
    m = (sf_ap_msg){.op = SF_AP_PLOGS, .id = 2, .pid = pid, .tail = 4};
    send_msg(a, &m);
    assert_int_equal(recv_msg(a, &r), 0);
    assert_memory_equal(r.data, "err\n", 4);
    assert_int_equal(r.size, 3);
    sf_ap_msg_fini(&r);
    /* listed (outside a jail the list is the host's: it is among them) */
    m = (sf_ap_msg){.op = SF_AP_PLIST, .id = 3};
    send_msg(a, &m);
    assert_int_equal(recv_msg(a, &r), 0);
    assert_int_equal(r.op, SF_AP_PROCS);
    for (size_t i = 0; i < r.n_procs; i++)
        if (r.procs[i].pid == pid) {
            assert_string_equal(r.procs[i].cmd, "sleep 600");
            assert_true(r.procs[i].start_ms > 1700000000000ull);
            found = 1;
        }
    assert_true(found || r.more);
    sf_ap_msg_fini(&r);
    /* TERM ends it; the answer comes once it is gone, and its log says how */
    m = (sf_ap_msg){.op = SF_AP_PKILL, .id = 4, .pid = pid, .sig = SIGTERM, .grace_ms = 5000};
    send_msg(a, &m);
    assert_int_equal(recv_msg(a, &r), 0);
    assert_int_equal(r.op, SF_AP_OK);
    assert_int_equal(r.size, 0);
    sf_ap_msg_fini(&r);
    m = (sf_ap_msg){.op = SF_AP_PLOGS, .id = 5, .pid = pid};
    send_msg(a, &m);
    assert_int_equal(recv_msg(a, &r), 0);
    assert_true(r.exited);
    assert_int_equal(r.exit_code, 128 + SIGTERM);
    sf_ap_msg_fini(&r);
    m = (sf_ap_msg){.op = SF_AP_PKILL, .id = 6, .pid = pid, .sig = SIGKILL};
    send_msg(a, &m);
    assert_int_equal(recv_msg(a, &r), 0);
    assert_int_equal(r.op, SF_AP_ERROR);
    assert_int_equal(r.errnum, ESRCH);
    sf_ap_msg_fini(&r);
    m = (sf_ap_msg){.op = SF_AP_PLOGS, .id = 7, .pid = 1};
    send_msg(a, &m);
    assert_int_equal(recv_msg(a, &r), 0);
    assert_int_equal(r.op, SF_AP_ERROR);
    assert_int_equal(r.errnum, ENOENT);
    sf_ap_msg_fini(&r);
    /* stdin in two input frames */
    m = (sf_ap_msg){.op = SF_AP_EXEC, .id = 8, .cmd = "wc -c", .timeout_ms = 10000, .cap = 64,
                    .in = 1};
    send_msg(a, &m);
    m = (sf_ap_msg){.op = SF_AP_INPUT, .id = 8, .data = "123", .data_len = 3, .more = 1};
    send_msg(a, &m);
    m = (sf_ap_msg){.op = SF_AP_INPUT, .id = 8, .data = "45", .data_len = 2};
    send_msg(a, &m);
    assert_int_equal(recv_msg(a, &r), 0);
    assert_int_equal(r.op, SF_AP_RESULT);
    assert_int_equal(r.exit_code, 0);
    assert_int_equal(r.out_len, 2);
    assert_memory_equal(r.out, "5\n", 2);
    sf_ap_msg_fini(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_ping, agent_start, agent_stop),
        cmocka_unit_test_setup_teardown(test_background_logs_kill_stdin, agent_start, agent_stop),
        cmocka_unit_test_setup_teardown(test_files, agent_start, agent_stop),
        cmocka_unit_test_setup_teardown(test_stream_and_cancel, agent_start, agent_stop),
        cmocka_unit_test_setup_teardown(test_exec_streams_and_exit, agent_start, agent_stop),
        cmocka_unit_test_setup_teardown(test_exec_signal_exit_code, agent_start, agent_stop),
        cmocka_unit_test_setup_teardown(test_exec_env_and_cwd, agent_start, agent_stop),
        cmocka_unit_test_setup_teardown(test_exec_missing_cwd_is_an_error, agent_start, agent_stop),
        cmocka_unit_test_setup_teardown(test_exec_stdin_is_dev_null, agent_start, agent_stop),
        cmocka_unit_test_setup_teardown(test_exec_truncates_head_and_tail, agent_start, agent_stop),
        cmocka_unit_test_setup_teardown(test_exec_timeout_kills_group, agent_start, agent_stop),
        cmocka_unit_test_setup_teardown(test_concurrent_execs, agent_start, agent_stop),
        cmocka_unit_test_setup_teardown(test_duplicate_running_id_is_refused, agent_start, agent_stop),
        cmocka_unit_test_setup_teardown(test_background_process_does_not_hold_the_result, agent_start, agent_stop),
        cmocka_unit_test_setup_teardown(test_malformed_request_gets_error_reply, agent_start, agent_stop),
        cmocka_unit_test_setup_teardown(test_frame_split_across_writes, agent_start, agent_stop),
        cmocka_unit_test_setup_teardown(test_oversized_frame_ends_the_agent, agent_start, agent_stop),
    };
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
