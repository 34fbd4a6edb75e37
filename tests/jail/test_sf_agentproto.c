/* sf_agentproto: the worker <-> agent frame codec. Round trips, and strict
 * rejection of everything else (the agent and the worker both feed it
 * untrusted bytes). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <msgpack.h>

#include "sf_agentproto.h"
#include "sf_buf.h"

/* ---- helpers ------------------------------------------------------------- */

/* Encodes m, checks the header, decodes the payload into *out. */
static void round_trip(const sf_ap_msg *m, sf_ap_msg *out)
{
    const char *why = NULL;
    size_t flen = 0;
    sf_buf b;

    sf_buf_init(&b, SF_AP_HDR_LEN + SF_AP_FRAME_MAX);
    assert_int_equal(sf_ap_encode(&b, m, &why), 0);
    assert_int_equal(sf_ap_frame_check(b.p, b.len, &flen, &why), 0);
    assert_int_equal(flen, b.len);
    /* One byte short is "need more". */
    assert_int_equal(sf_ap_frame_check(b.p, b.len - 1, &flen, &why), 0);
    assert_int_equal(flen, 0);
    assert_int_equal(sf_ap_decode(b.p + SF_AP_HDR_LEN, b.len - SF_AP_HDR_LEN, out, &why), 0);
    sf_buf_fini(&b);
}

/* A msgpack map built by the test, to feed the decoder directly. */
typedef struct mp {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} mp;

static void mp_init(mp *m)
{
    msgpack_sbuffer_init(&m->sb);
    msgpack_packer_init(&m->pk, &m->sb, msgpack_sbuffer_write);
}

static void mp_str(mp *m, const char *s)
{
    msgpack_pack_str_with_body(&m->pk, s, strlen(s));
}

static void mp_kv_str(mp *m, const char *k, const char *v)
{
    mp_str(m, k);
    mp_str(m, v);
}

static void mp_kv_uint(mp *m, const char *k, uint64_t v)
{
    mp_str(m, k);
    msgpack_pack_uint64(&m->pk, v);
}

/* Decodes what the test built; returns the rc and fills *why. */
static int mp_decode(mp *m, const char **why)
{
    sf_ap_msg out;
    int rc;

    *why = NULL;
    rc = sf_ap_decode(m->sb.data, m->sb.size, &out, why);
    if (rc == 0)
        sf_ap_msg_fini(&out);
    msgpack_sbuffer_destroy(&m->sb);
    return rc;
}

static int decode_raw(const void *p, size_t n, const char **why)
{
    sf_ap_msg out;
    int rc;

    *why = NULL;
    rc = sf_ap_decode(p, n, &out, why);
    if (rc == 0)
        sf_ap_msg_fini(&out);
    return rc;
}

/* The exec request map minus the key named `skip`, with `extra` appended. */
static void mp_exec(mp *m, const char *skip, int extra)
{
    int n = 5 - (skip != NULL) + extra;
    msgpack_pack_map(&m->pk, (size_t)n);
    if (!skip || strcmp(skip, "op"))
        mp_kv_str(m, "op", "exec");
    if (!skip || strcmp(skip, "id"))
        mp_kv_uint(m, "id", 7);
    if (!skip || strcmp(skip, "cmd"))
        mp_kv_str(m, "cmd", "true");
    if (!skip || strcmp(skip, "timeout_ms"))
        mp_kv_uint(m, "timeout_ms", 1000);
    if (!skip || strcmp(skip, "cap"))
        mp_kv_uint(m, "cap", 32768);
}

/* ---- round trips ---------------------------------------------------------- */

static void test_ping_pong(void **state)
{
    sf_ap_msg ping = {.op = SF_AP_PING, .id = 42}, pong = {.op = SF_AP_PONG, .id = 42, .version = SF_AP_VERSION};
    sf_ap_msg out;

    round_trip(&ping, &out);
    assert_int_equal(out.op, SF_AP_PING);
    assert_int_equal(out.id, 42);
    sf_ap_msg_fini(&out);
    round_trip(&pong, &out);
    assert_int_equal(out.op, SF_AP_PONG);
    assert_int_equal(out.version, SF_AP_VERSION);
    sf_ap_msg_fini(&out);
}

static void test_exec_full(void **state)
{
    const char *env[] = {"FOO=bar", "EMPTY=", "X=a=b"};
    sf_ap_msg m = {.op = SF_AP_EXEC, .id = UINT32_MAX, .cmd = "echo hi; exit 3", .cwd = "/tmp",
                   .env = env, .env_n = 3, .timeout_ms = 600000, .cap = 32768};
    sf_ap_msg out;

    round_trip(&m, &out);
    assert_int_equal(out.op, SF_AP_EXEC);
    assert_int_equal(out.id, UINT32_MAX);
    assert_string_equal(out.cmd, "echo hi; exit 3");
    assert_string_equal(out.cwd, "/tmp");
    assert_int_equal(out.env_n, 3);
    assert_string_equal(out.env[0], "FOO=bar");
    assert_string_equal(out.env[1], "EMPTY=");
    assert_string_equal(out.env[2], "X=a=b");
    assert_null(out.env[3]);
    assert_int_equal(out.timeout_ms, 600000);
    assert_int_equal(out.cap, 32768);
    sf_ap_msg_fini(&out);
}

static void test_exec_minimal(void **state)
{
    sf_ap_msg m = {.op = SF_AP_EXEC, .id = 1, .cmd = "x", .timeout_ms = 1, .cap = SF_AP_CAP_MIN};
    sf_ap_msg out;

    round_trip(&m, &out);
    assert_null(out.cwd);
    assert_null(out.env);
    assert_int_equal(out.env_n, 0);
    assert_int_equal(out.cap, SF_AP_CAP_MIN);
    sf_ap_msg_fini(&out);
}

static void test_result_binary(void **state)
{
    static const char bin[] = {'a', 0, (char)0xff, '\n'};
    sf_ap_msg m = {.op = SF_AP_RESULT, .id = 9, .exit_code = -1, .timed_out = 1, .truncated = 1,
                   .duration_ms = 501, .out = bin, .out_len = sizeof(bin), .out_total = 1048576,
                   .err = "", .err_len = 0, .err_total = 0};
    sf_ap_msg out;

    round_trip(&m, &out);
    assert_int_equal(out.op, SF_AP_RESULT);
    assert_int_equal(out.exit_code, -1);
    assert_true(out.timed_out);
    assert_true(out.truncated);
    assert_int_equal(out.duration_ms, 501);
    assert_int_equal(out.out_len, sizeof(bin));
    assert_memory_equal(out.out, bin, sizeof(bin));
    assert_int_equal(out.out_total, 1048576);
    assert_int_equal(out.err_len, 0);
    assert_int_equal(out.err_total, 0);
    sf_ap_msg_fini(&out);

    m.exit_code = 137;
    m.timed_out = 0;
    round_trip(&m, &out);
    assert_int_equal(out.exit_code, 137);
    assert_false(out.timed_out);
    sf_ap_msg_fini(&out);

    m.exit_code = INT32_MIN;
    round_trip(&m, &out);
    assert_int_equal(out.exit_code, INT32_MIN);
    assert_false(out.oom_killed); /* absent: false */
    sf_ap_msg_fini(&out);

    m.oom_killed = 1; /* a VM agent's: the guest's OOM killer struck */
    round_trip(&m, &out);
    assert_true(out.oom_killed);
    sf_ap_msg_fini(&out);
}

static void test_error_msg(void **state)
{
    sf_ap_msg m = {.op = SF_AP_ERROR, .id = 3, .msg = "The working directory /x does not exist."};
    sf_ap_msg out;

    round_trip(&m, &out);
    assert_int_equal(out.op, SF_AP_ERROR);
    assert_string_equal(out.msg, m.msg);
    sf_ap_msg_fini(&out);
}

static void test_several_frames_in_one_buffer(void **state)
{
    sf_ap_msg a = {.op = SF_AP_PING, .id = 1}, b2 = {.op = SF_AP_PING, .id = 2}, out;
    const char *why;
    size_t flen;
    sf_buf b;

    sf_buf_init(&b, 1024);
    assert_int_equal(sf_ap_encode(&b, &a, &why), 0);
    assert_int_equal(sf_ap_encode(&b, &b2, &why), 0);
    assert_int_equal(sf_ap_frame_check(b.p, b.len, &flen, &why), 0);
    assert_true(flen < b.len);
    assert_int_equal(sf_ap_decode(b.p + 4, flen - 4, &out, &why), 0);
    assert_int_equal(out.id, 1);
    sf_ap_msg_fini(&out);
    assert_int_equal(sf_ap_frame_check(b.p + flen, b.len - flen, &flen, &why), 0);
    assert_int_equal(sf_ap_decode(b.p + b.len - flen + 4, flen - 4, &out, &why), 0);
    assert_int_equal(out.id, 2);
    sf_ap_msg_fini(&out);
    sf_buf_fini(&b);
}

/* ---- encoder refusals ----------------------------------------------------- */

static void test_encode_rejects_invalid(void **state)
{
    const char *bad_env[] = {"NOEQUALS"}, *empty_key[] = {"=v"};
    sf_ap_msg m = {.op = SF_AP_EXEC, .id = 1, .cmd = "", .timeout_ms = 1, .cap = 100};
    const char *why = NULL;
    sf_buf b;

    sf_buf_init(&b, 4096);
    assert_int_equal(sf_ap_encode(&b, &m, &why), -EINVAL);
    assert_non_null(why);
    m.cmd = NULL;
    assert_int_equal(sf_ap_encode(&b, &m, &why), -EINVAL);
    m.cmd = "true";
    m.timeout_ms = 0;
    assert_int_equal(sf_ap_encode(&b, &m, &why), -EINVAL);
    m.timeout_ms = 1;
    m.cap = 1;
    assert_int_equal(sf_ap_encode(&b, &m, &why), -EINVAL);
    m.cap = SF_AP_CAP_MAX + 1;
    assert_int_equal(sf_ap_encode(&b, &m, &why), -EINVAL);
    m.cap = 100;
    m.env = bad_env;
    m.env_n = 1;
    assert_int_equal(sf_ap_encode(&b, &m, &why), -EINVAL);
    m.env = empty_key;
    assert_int_equal(sf_ap_encode(&b, &m, &why), -EINVAL);
    m.env_n = SF_AP_ENV_MAX + 1;
    assert_int_equal(sf_ap_encode(&b, &m, &why), -EINVAL);
    m = (sf_ap_msg){.op = (sf_ap_op)99, .id = 1};
    assert_int_equal(sf_ap_encode(&b, &m, &why), -EINVAL);
    m = (sf_ap_msg){.op = SF_AP_ERROR, .id = 1, .msg = ""};
    assert_int_equal(sf_ap_encode(&b, &m, &why), -EINVAL);
    m = (sf_ap_msg){.op = SF_AP_RESULT, .id = 1, .out = "abc", .out_len = 3, .out_total = 2};
    assert_int_equal(sf_ap_encode(&b, &m, &why), -EINVAL);
    assert_int_equal(b.len, 0); /* nothing written on refusal */
    sf_buf_fini(&b);
}

static void test_encode_oversize_leaves_buffer(void **state)
{
    size_t big = SF_AP_FRAME_MAX;
    char *cmd = malloc(big + 1);
    sf_ap_msg ping = {.op = SF_AP_PING, .id = 5};
    sf_ap_msg m = {.op = SF_AP_EXEC, .id = 1, .cmd = cmd, .timeout_ms = 1, .cap = 100};
    const char *why = NULL;
    sf_buf b;

    assert_non_null(cmd);
    memset(cmd, 'x', big);
    cmd[big] = '\0';
    sf_buf_init(&b, 4 * SF_AP_FRAME_MAX);
    assert_int_equal(sf_ap_encode(&b, &ping, &why), 0);
    size_t before = b.len;
    assert_int_equal(sf_ap_encode(&b, &m, &why), -EMSGSIZE);
    assert_non_null(why);
    assert_int_equal(b.len, before);
    free(cmd);
    sf_buf_fini(&b);
}

static void test_encode_buffer_full(void **state)
{
    sf_ap_msg m = {.op = SF_AP_ERROR, .id = 1, .msg = "a fairly long message that does not fit"};
    const char *why;
    sf_buf b;

    sf_buf_init(&b, 16);
    assert_int_equal(sf_ap_encode(&b, &m, &why), -E2BIG);
    assert_int_equal(b.len, 0);
    sf_buf_fini(&b);
}

/* ---- framing -------------------------------------------------------------- */

static void test_frame_check(void **state)
{
    const unsigned char zero[4] = {0, 0, 0, 0}, over[4] = {0, 0x10, 0, 1},
                        max[4] = {0, 0x10, 0, 0}, huge[4] = {0xff, 0xff, 0xff, 0xff};
    const char *why;
    size_t flen = 99;

    for (size_t n = 0; n < 4; n++) {
        assert_int_equal(sf_ap_frame_check(zero, n, &flen, &why), 0);
        assert_int_equal(flen, 0);
    }
    why = NULL;
    assert_int_equal(sf_ap_frame_check(zero, 4, &flen, &why), -EMSGSIZE);
    assert_non_null(why);
    assert_int_equal(sf_ap_frame_check(over, 4, &flen, &why), -EMSGSIZE);
    assert_int_equal(sf_ap_frame_check(huge, 4, &flen, &why), -EMSGSIZE);
    assert_int_equal(sf_ap_frame_check(max, 4, &flen, &why), 0); /* 1 MiB exactly: fine */
    assert_int_equal(flen, 0);
}

/* ---- decoder refusals ----------------------------------------------------- */

static void test_decode_empty_and_oversize(void **state)
{
    const char *why;
    char *big = calloc(1, SF_AP_FRAME_MAX + 1);

    assert_non_null(big);
    assert_int_equal(decode_raw("", 0, &why), -EBADMSG);
    assert_non_null(why);
    assert_int_equal(decode_raw(big, SF_AP_FRAME_MAX + 1, &why), -EMSGSIZE);
    assert_non_null(why);
    free(big);
}

static void test_decode_not_a_map(void **state)
{
    const char *why;
    mp m;

    mp_init(&m);
    msgpack_pack_array(&m.pk, 1);
    mp_str(&m, "ping");
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);
    assert_string_equal(why, "the frame is not a msgpack map");
    mp_init(&m);
    msgpack_pack_uint32(&m.pk, 5);
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);
    mp_init(&m);
    mp_str(&m, "ping");
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);
    mp_init(&m);
    msgpack_pack_nil(&m.pk);
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);
}

static void test_decode_every_truncation_fails(void **state)
{
    const char *env[] = {"A=1"};
    sf_ap_msg m = {.op = SF_AP_EXEC, .id = 77, .cmd = "echo hi", .cwd = "/root", .env = env,
                   .env_n = 1, .timeout_ms = 5, .cap = 64};
    const char *why;
    sf_buf b;

    sf_buf_init(&b, 4096);
    assert_int_equal(sf_ap_encode(&b, &m, &why), 0);
    for (size_t n = 1; n < b.len - SF_AP_HDR_LEN; n++)
        assert_int_equal(decode_raw(b.p + SF_AP_HDR_LEN, n, &why), -EBADMSG);
    assert_int_equal(decode_raw(b.p + SF_AP_HDR_LEN, b.len - SF_AP_HDR_LEN, &why), 0);
    sf_buf_fini(&b);
}

static void test_decode_trailing_bytes(void **state)
{
    sf_ap_msg m = {.op = SF_AP_PING, .id = 1};
    const char *why;
    sf_buf b;

    sf_buf_init(&b, 4096);
    assert_int_equal(sf_ap_encode(&b, &m, &why), 0);
    assert_int_equal(sf_buf_append(&b, "\xc0", 1), 0);
    assert_int_equal(decode_raw(b.p + 4, b.len - 4, &why), -EBADMSG);
    assert_string_equal(why, "trailing bytes after the msgpack map");
    sf_buf_fini(&b);
}

static void test_decode_op_errors(void **state)
{
    const char *why;
    mp m;

    mp_init(&m); /* unknown op */
    msgpack_pack_map(&m.pk, 2);
    mp_kv_str(&m, "op", "reboot");
    mp_kv_uint(&m, "id", 1);
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);
    assert_non_null(strstr(why, "unknown op"));

    mp_init(&m); /* op is not a string */
    msgpack_pack_map(&m.pk, 2);
    mp_str(&m, "op");
    msgpack_pack_uint8(&m.pk, 1);
    mp_kv_uint(&m, "id", 1);
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);

    mp_init(&m); /* op missing */
    msgpack_pack_map(&m.pk, 1);
    mp_kv_uint(&m, "id", 1);
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);
    assert_string_equal(why, "missing key 'op'");

    mp_init(&m); /* empty map */
    msgpack_pack_map(&m.pk, 0);
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);
}

static void test_decode_id_errors(void **state)
{
    const char *why;
    sf_ap_msg out;
    mp m;

    mp_init(&m);
    msgpack_pack_map(&m.pk, 1);
    mp_kv_str(&m, "op", "ping");
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);
    assert_string_equal(why, "missing key 'id'");

    mp_init(&m);
    msgpack_pack_map(&m.pk, 2);
    mp_kv_str(&m, "op", "ping");
    mp_kv_uint(&m, "id", (uint64_t)UINT32_MAX + 1);
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);

    mp_init(&m);
    msgpack_pack_map(&m.pk, 2);
    mp_kv_str(&m, "op", "ping");
    mp_str(&m, "id");
    msgpack_pack_int8(&m.pk, -1);
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);

    mp_init(&m);
    msgpack_pack_map(&m.pk, 2);
    mp_kv_str(&m, "op", "ping");
    mp_kv_str(&m, "id", "1");
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);

    /* A valid id is reported even when the rest is wrong. */
    mp_init(&m);
    msgpack_pack_map(&m.pk, 2);
    mp_kv_str(&m, "op", "exec");
    mp_kv_uint(&m, "id", 31);
    assert_int_equal(sf_ap_decode(m.sb.data, m.sb.size, &out, &why), -EBADMSG);
    assert_int_equal(out.id, 31);
    msgpack_sbuffer_destroy(&m.sb);
}

static void test_decode_key_errors(void **state)
{
    const char *why;
    mp m;

    mp_init(&m); /* unknown key */
    mp_exec(&m, NULL, 1);
    mp_kv_str(&m, "shell", "/bin/bash");
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);
    assert_string_equal(why, "unknown key in map");

    mp_init(&m); /* duplicate key */
    mp_exec(&m, NULL, 1);
    mp_kv_str(&m, "cmd", "false");
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);
    assert_string_equal(why, "duplicate key in map");

    mp_init(&m); /* non-string key */
    mp_exec(&m, NULL, 1);
    msgpack_pack_uint8(&m.pk, 1);
    msgpack_pack_uint8(&m.pk, 2);
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);
    assert_string_equal(why, "map keys must be strings");

    mp_init(&m); /* key of another op */
    mp_exec(&m, NULL, 1);
    mp_kv_str(&m, "msg", "hi");
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);
    assert_string_equal(why, "key not allowed for this op");

    mp_init(&m); /* ping carrying a cmd */
    msgpack_pack_map(&m.pk, 3);
    mp_kv_str(&m, "op", "ping");
    mp_kv_uint(&m, "id", 1);
    mp_kv_str(&m, "cmd", "true");
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);

    static const char *const required[] = {"cmd", "timeout_ms", "cap"};
    for (size_t i = 0; i < 3; i++) {
        mp_init(&m);
        mp_exec(&m, required[i], 0);
        assert_int_equal(mp_decode(&m, &why), -EBADMSG);
        assert_non_null(strstr(why, "missing key"));
        assert_non_null(strstr(why, required[i]));
    }
}

static void test_decode_exec_value_errors(void **state)
{
    const char *why;
    mp m;

    /* cmd: empty, not a string, embedded NUL, binary */
    mp_init(&m);
    mp_exec(&m, "cmd", 1);
    mp_kv_str(&m, "cmd", "");
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);
    assert_non_null(strstr(why, "'cmd'"));
    mp_init(&m);
    mp_exec(&m, "cmd", 1);
    mp_kv_uint(&m, "cmd", 1);
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);
    mp_init(&m);
    mp_exec(&m, "cmd", 1);
    mp_str(&m, "cmd");
    msgpack_pack_str_with_body(&m.pk, "a\0b", 3);
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);
    mp_init(&m);
    mp_exec(&m, "cmd", 1);
    mp_str(&m, "cmd");
    msgpack_pack_bin_with_body(&m.pk, "ls", 2);
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);

    /* timeout 0, timeout negative, cap too small / too big, cap as float */
    mp_init(&m);
    mp_exec(&m, "timeout_ms", 1);
    mp_kv_uint(&m, "timeout_ms", 0);
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);
    assert_non_null(strstr(why, "'timeout_ms'"));
    mp_init(&m);
    mp_exec(&m, "timeout_ms", 1);
    mp_str(&m, "timeout_ms");
    msgpack_pack_int32(&m.pk, -5);
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);
    mp_init(&m);
    mp_exec(&m, "cap", 1);
    mp_kv_uint(&m, "cap", 1);
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);
    mp_init(&m);
    mp_exec(&m, "cap", 1);
    mp_kv_uint(&m, "cap", SF_AP_CAP_MAX + 1);
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);
    mp_init(&m);
    mp_exec(&m, "cap", 1);
    mp_str(&m, "cap");
    msgpack_pack_double(&m.pk, 100.0);
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);

    /* cwd: empty, too long, not a string */
    mp_init(&m);
    mp_exec(&m, NULL, 1);
    mp_kv_str(&m, "cwd", "");
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);
    {
        char longpath[5000];
        memset(longpath, 'a', sizeof(longpath) - 1);
        longpath[sizeof(longpath) - 1] = '\0';
        mp_init(&m);
        mp_exec(&m, NULL, 1);
        mp_kv_str(&m, "cwd", longpath);
        assert_int_equal(mp_decode(&m, &why), -EBADMSG);
    }
    mp_init(&m);
    mp_exec(&m, NULL, 1);
    mp_str(&m, "cwd");
    msgpack_pack_nil(&m.pk);
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);
}

static void test_decode_env_errors(void **state)
{
    static const char *const bad[] = {"NOEQ", "=value"};
    const char *why;
    mp m;

    mp_init(&m); /* env not an array */
    mp_exec(&m, NULL, 1);
    mp_kv_str(&m, "env", "A=1");
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);
    assert_non_null(strstr(why, "'env'"));

    for (size_t i = 0; i < 2; i++) {
        mp_init(&m);
        mp_exec(&m, NULL, 1);
        mp_str(&m, "env");
        msgpack_pack_array(&m.pk, 2);
        mp_str(&m, "OK=1");
        mp_str(&m, bad[i]);
        assert_int_equal(mp_decode(&m, &why), -EBADMSG);
    }

    mp_init(&m); /* element not a string */
    mp_exec(&m, NULL, 1);
    mp_str(&m, "env");
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_uint8(&m.pk, 1);
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);

    mp_init(&m); /* too many entries */
    mp_exec(&m, NULL, 1);
    mp_str(&m, "env");
    msgpack_pack_array(&m.pk, SF_AP_ENV_MAX + 1);
    for (int i = 0; i <= SF_AP_ENV_MAX; i++)
        mp_str(&m, "A=1");
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);

    mp_init(&m); /* exactly the maximum is fine */
    mp_exec(&m, NULL, 1);
    mp_str(&m, "env");
    msgpack_pack_array(&m.pk, SF_AP_ENV_MAX);
    for (int i = 0; i < SF_AP_ENV_MAX; i++)
        mp_str(&m, "A=1");
    assert_int_equal(mp_decode(&m, &why), 0);

    mp_init(&m); /* nested array */
    mp_exec(&m, NULL, 1);
    mp_str(&m, "env");
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_array(&m.pk, 1);
    mp_str(&m, "A=1");
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);
}

/* A result map with one field replaced by the callback's packing; with_oom: an
 * oom_killed field (true) too. */
static void mp_result_oom(mp *m, const char *replace, void (*pack)(mp *), int with_oom)
{
    static const char *const keys[] = {"op", "id", "exit", "timed_out", "truncated", "ms",
                                       "out", "out_total", "err", "err_total", "oom_killed"};
    size_t n = with_oom ? 11 : 10;
    msgpack_pack_map(&m->pk, n);
    for (size_t i = 0; i < n; i++) {
        mp_str(m, keys[i]);
        if (replace && !strcmp(replace, keys[i])) {
            pack(m);
            continue;
        }
        switch (i) {
        case 0: mp_str(m, "result"); break;
        case 1: msgpack_pack_uint8(&m->pk, 4); break;
        case 2: msgpack_pack_int8(&m->pk, 3); break;
        case 3: case 4: msgpack_pack_false(&m->pk); break;
        case 10: msgpack_pack_true(&m->pk); break;
        case 5: msgpack_pack_uint8(&m->pk, 10); break;
        case 6: case 8: msgpack_pack_bin_with_body(&m->pk, "hello\n", 6); break;
        default: msgpack_pack_uint8(&m->pk, 6); break;
        }
    }
}

static void mp_result(mp *m, const char *replace, void (*pack)(mp *))
{
    mp_result_oom(m, replace, pack, 0);
}

static void pack_str_hi(mp *m) { mp_str(m, "hi"); }
static void pack_uint_1(mp *m) { msgpack_pack_uint8(&m->pk, 1); }
static void pack_uint_5(mp *m) { msgpack_pack_uint8(&m->pk, 5); }
static void pack_big_exit(mp *m) { msgpack_pack_uint64(&m->pk, (uint64_t)INT32_MAX + 1); }
static void pack_low_exit(mp *m) { msgpack_pack_int64(&m->pk, (int64_t)INT32_MIN - 1); }
static void pack_nil(mp *m) { msgpack_pack_nil(&m->pk); }

static void test_decode_result_errors(void **state)
{
    static const struct {
        const char *key;
        void (*pack)(mp *);
    } cases[] = {
        {"out", pack_str_hi},       /* text where binary is required */
        {"err", pack_uint_1},
        {"out_total", pack_uint_5}, /* total below the kept length */
        {"err_total", pack_str_hi},
        {"exit", pack_big_exit},
        {"exit", pack_low_exit},
        {"exit", pack_str_hi},
        {"timed_out", pack_uint_1}, /* integer where a boolean is required */
        {"truncated", pack_nil},
        {"ms", pack_str_hi},
    };
    const char *why;
    mp m;

    mp_init(&m);
    mp_result(&m, NULL, NULL);
    assert_int_equal(mp_decode(&m, &why), 0);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        mp_init(&m);
        mp_result(&m, cases[i].key, cases[i].pack);
        assert_int_equal(mp_decode(&m, &why), -EBADMSG);
        assert_non_null(strstr(why, cases[i].key));
    }
    mp_init(&m); /* oom_killed: optional, a boolean */
    mp_result_oom(&m, NULL, NULL, 1);
    assert_int_equal(mp_decode(&m, &why), 0);
    mp_init(&m);
    mp_result_oom(&m, "oom_killed", pack_uint_1, 1);
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);
    assert_non_null(strstr(why, "oom_killed"));
}

static void test_decode_error_msg_limits(void **state)
{
    char *big = malloc(SF_AP_MSG_MAX + 2);
    const char *why;
    mp m;

    assert_non_null(big);
    memset(big, 'e', SF_AP_MSG_MAX + 1);
    big[SF_AP_MSG_MAX + 1] = '\0';
    mp_init(&m);
    msgpack_pack_map(&m.pk, 3);
    mp_kv_str(&m, "op", "error");
    mp_kv_uint(&m, "id", 1);
    mp_kv_str(&m, "msg", big);
    assert_int_equal(mp_decode(&m, &why), -EBADMSG);
    big[SF_AP_MSG_MAX] = '\0';
    mp_init(&m);
    msgpack_pack_map(&m.pk, 3);
    mp_kv_str(&m, "op", "error");
    mp_kv_uint(&m, "id", 1);
    mp_kv_str(&m, "msg", big);
    assert_int_equal(mp_decode(&m, &why), 0);
    free(big);
}

static void test_decode_hostile_headers(void **state)
{
    /* Container counts far beyond the bytes present must not allocate. */
    static const unsigned char array32[] = {0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0};
    static const unsigned char map32[] = {0xdf, 0x7f, 0xff, 0xff, 0xff, 0xa2, 'o', 'p'};
    static const unsigned char map16_in_map[] = {0x81, 0xa3, 'e', 'n', 'v', 0xde, 0xff, 0xff};
    static const unsigned char str32[] = {0xdb, 0xff, 0xff, 0xff, 0xff, 'a'};
    static const unsigned char bin32[] = {0xc6, 0x00, 0x10, 0x00, 0x00, 'a'};
    static const unsigned char ext32[] = {0xc9, 0xff, 0xff, 0xff, 0xff, 0x01};
    static const unsigned char reserved[] = {0x81, 0xa2, 'o', 'p', 0xc1};
    static const unsigned char fixmap_short[] = {0x8f, 0xa2, 'o', 'p'};
    static const struct {
        const unsigned char *p;
        size_t n;
    } cases[] = {
        {array32, sizeof(array32)}, {map32, sizeof(map32)}, {map16_in_map, sizeof(map16_in_map)},
        {str32, sizeof(str32)},     {bin32, sizeof(bin32)}, {ext32, sizeof(ext32)},
        {reserved, sizeof(reserved)}, {fixmap_short, sizeof(fixmap_short)},
    };
    const char *why;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        assert_int_equal(decode_raw(cases[i].p, cases[i].n, &why), -EBADMSG);
        assert_non_null(why);
    }
}

static void test_decode_deep_nesting(void **state)
{
    unsigned char deep[64];
    const char *why;

    /* {"op": [[[[[[...]]]]]]} */
    deep[0] = 0x81;
    deep[1] = 0xa2;
    deep[2] = 'o';
    deep[3] = 'p';
    for (size_t i = 4; i < sizeof(deep) - 1; i++)
        deep[i] = 0x91;
    deep[sizeof(deep) - 1] = 0xc0;
    assert_int_equal(decode_raw(deep, sizeof(deep), &why), -EBADMSG);
}

static void test_decode_random_bytes_never_crash(void **state)
{
    unsigned char buf[256];
    uint32_t x = 12345;
    const char *why;

    for (int iter = 0; iter < 20000; iter++) {
        size_t n = 1 + (x % sizeof(buf));
        for (size_t i = 0; i < n; i++) {
            x = x * 1103515245u + 12345u;
            buf[i] = (unsigned char)(x >> 16);
        }
        if (iter % 2)
            buf[0] = (unsigned char)(0x80 | (buf[0] & 0x0f)); /* often a fixmap */
        int rc = decode_raw(buf, n, &why);
        assert_true(rc == 0 || rc == -EBADMSG);
        if (rc < 0)
            assert_non_null(why);
    }
}

static void test_decode_bit_flips_never_crash(void **state)
{
    const char *env[] = {"A=1", "B=2"};
    sf_ap_msg m = {.op = SF_AP_EXEC, .id = 77, .cmd = "echo hi", .cwd = "/root", .env = env,
                   .env_n = 2, .timeout_ms = 5, .cap = 64};
    const char *why;
    sf_buf b;

    sf_buf_init(&b, 4096);
    assert_int_equal(sf_ap_encode(&b, &m, &why), 0);
    char *p = b.p + SF_AP_HDR_LEN;
    size_t n = b.len - SF_AP_HDR_LEN;
    for (size_t i = 0; i < n; i++)
        for (int bit = 0; bit < 8; bit++) {
            p[i] ^= (char)(1 << bit);
            int rc = decode_raw(p, n, &why);
            assert_true(rc == 0 || rc == -EBADMSG);
            p[i] ^= (char)(1 << bit);
        }
    sf_buf_fini(&b);
}

/* ---- files, cancel and streamed output ---------------------------------------- */

static void test_file_ops_round_trip(void **state)
{
    static char chunk[SF_AP_DATA_MAX];
    sf_ap_entry ents[3] = {{"a.txt", 'f', 11, 1700000000}, {"dir", 'd', 0, -5},
                           {"link", 'l', 0, 0}};
    sf_ap_msg m = {.op = SF_AP_FREAD, .id = 3, .path = "/root/x", .off = 42, .len = 100,
                   .flags = SF_AP_F_NOFOLLOW}, out;

    round_trip(&m, &out);
    assert_int_equal(out.op, SF_AP_FREAD);
    assert_string_equal(out.path, "/root/x");
    assert_int_equal(out.off, 42);
    assert_int_equal(out.len, 100);
    assert_int_equal(out.flags, SF_AP_F_NOFOLLOW);
    sf_ap_msg_fini(&out);

    memset(chunk, 0xab, sizeof(chunk));
    m = (sf_ap_msg){.op = SF_AP_FWRITE, .id = 4, .path = "/tmp/y", .off = 7, .data = chunk,
                    .data_len = sizeof(chunk), .flags = SF_AP_F_CREATE | SF_AP_F_MKDIRS};
    round_trip(&m, &out);
    assert_int_equal(out.data_len, sizeof(chunk));
    assert_memory_equal(out.data, chunk, sizeof(chunk));
    assert_int_equal(out.flags, SF_AP_F_CREATE | SF_AP_F_MKDIRS);
    sf_ap_msg_fini(&out);

    m = (sf_ap_msg){.op = SF_AP_DATA, .id = 3, .data = "abc", .data_len = 3, .size = 9,
                    .mtime = -1};
    round_trip(&m, &out);
    assert_int_equal(out.size, 9);
    assert_int_equal(out.mtime, -1);
    assert_memory_equal(out.data, "abc", 3);
    sf_ap_msg_fini(&out);

    m = (sf_ap_msg){.op = SF_AP_ENTRIES, .id = 5, .entries = ents, .n_entries = 3, .more = 1};
    round_trip(&m, &out);
    assert_int_equal(out.n_entries, 3);
    assert_true(out.more);
    assert_string_equal(out.entries[1].name, "dir");
    assert_int_equal(out.entries[1].type, 'd');
    assert_int_equal(out.entries[1].mtime, -5);
    assert_int_equal(out.entries[0].size, 11);
    sf_ap_msg_fini(&out);

    m = (sf_ap_msg){.op = SF_AP_FMOVE, .id = 6, .path = "/a", .to = "/b"};
    round_trip(&m, &out);
    assert_string_equal(out.to, "/b");
    sf_ap_msg_fini(&out);

    m = (sf_ap_msg){.op = SF_AP_OK, .id = 6, .size = 12};
    round_trip(&m, &out);
    assert_int_equal(out.size, 12);
    sf_ap_msg_fini(&out);

    m = (sf_ap_msg){.op = SF_AP_ERROR, .id = 6, .msg = "gone", .errnum = ENOENT};
    round_trip(&m, &out);
    assert_int_equal(out.errnum, ENOENT);
    sf_ap_msg_fini(&out);

    m = (sf_ap_msg){.op = SF_AP_CANCEL, .id = 8, .target = 7};
    round_trip(&m, &out);
    assert_int_equal(out.target, 7);
    sf_ap_msg_fini(&out);

    m = (sf_ap_msg){.op = SF_AP_OUTPUT, .id = 7, .s = 1, .data = "ready\n", .data_len = 6};
    round_trip(&m, &out);
    assert_int_equal(out.s, 1);
    assert_memory_equal(out.data, "ready\n", 6);
    sf_ap_msg_fini(&out);

    m = (sf_ap_msg){.op = SF_AP_EXEC, .id = 7, .cmd = "true", .timeout_ms = 1, .cap = 2,
                    .stream = 1};
    round_trip(&m, &out);
    assert_true(out.stream);
    sf_ap_msg_fini(&out);
}

static void test_file_ops_rejected(void **state)
{
    static char big[SF_AP_DATA_MAX + 1];
    sf_ap_entry dots[1] = {{"..", 'd', 0, 0}}, slash[1] = {{"a/b", 'f', 0, 0}},
                kind[1] = {{"a", 'x', 0, 0}};
    const sf_ap_msg bad[] = {
        {.op = SF_AP_FREAD, .path = "", .len = 1},
        {.op = SF_AP_FREAD, .path = "/x", .len = 0},
        {.op = SF_AP_FREAD, .path = "/x", .len = SF_AP_DATA_MAX + 1},
        {.op = SF_AP_FREAD, .path = "/x", .len = 1, .flags = 64},
        {.op = SF_AP_FWRITE, .path = "/x", .data = big, .data_len = sizeof(big)},
        {.op = SF_AP_FLIST, .path = "/x", .len = SF_AP_ENTRIES_MAX + 1},
        {.op = SF_AP_ENTRIES, .entries = dots, .n_entries = 1},
        {.op = SF_AP_ENTRIES, .entries = slash, .n_entries = 1},
        {.op = SF_AP_ENTRIES, .entries = kind, .n_entries = 1},
        {.op = SF_AP_FMOVE, .path = "/a"},
        {.op = SF_AP_OUTPUT, .s = 2, .data = "x", .data_len = 1},
        {.op = SF_AP_OUTPUT, .s = 0, .data = "", .data_len = 0},
        {.op = SF_AP_ERROR, .msg = "x", .errnum = 5000},
    };
    const char *why;
    sf_buf b;

    sf_buf_init(&b, 2 * SF_AP_FRAME_MAX);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        why = NULL;
        if (sf_ap_encode(&b, &bad[i], &why) != -EINVAL)
            fail_msg("case %zu was encoded", i);
        assert_non_null(why);
        assert_int_equal(b.len, 0);
    }
    sf_buf_fini(&b);
}

/* Decoding what the encoder refuses: an entry array of the wrong shape, an fread with
 * keys of exec. */
static void test_file_ops_decode_errors(void **state)
{
    const char *why = NULL;
    sf_ap_msg out;
    mp m;

    mp_init(&m);
    msgpack_pack_map(&m.pk, 4);
    mp_kv_str(&m, "op", "entries");
    mp_kv_uint(&m, "id", 1);
    mp_str(&m, "entries");
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_array(&m.pk, 3); /* [name, type, size]: mtime missing */
    mp_str(&m, "a");
    mp_str(&m, "f");
    msgpack_pack_uint8(&m.pk, 1);
    mp_str(&m, "more");
    msgpack_pack_false(&m.pk);
    assert_int_equal(sf_ap_decode(m.sb.data, m.sb.size, &out, &why), -EBADMSG);
    assert_non_null(strstr(why, "entries"));
    msgpack_sbuffer_destroy(&m.sb);

    mp_init(&m);
    msgpack_pack_map(&m.pk, 5);
    mp_kv_str(&m, "op", "fread");
    mp_kv_uint(&m, "id", 1);
    mp_kv_str(&m, "path", "/x");
    mp_kv_uint(&m, "off", 0);
    mp_kv_str(&m, "cmd", "true");
    assert_int_equal(sf_ap_decode(m.sb.data, m.sb.size, &out, &why), -EBADMSG);
    assert_string_equal(why, "key not allowed for this op");
    msgpack_sbuffer_destroy(&m.sb);
}

/* Background, stdin and the process requests (issue 20). */
static void test_proc_ops_round_trip(void **state)
{
    static char chunk[SF_AP_DATA_MAX];
    sf_ap_proc procs[2] = {{1, "/sbin/sandfleet-agent", 1700000000123ull, 5, 900, 'S'},
                           {42, "python3 -m http.server", 1, 2, 3, 'R'}};
    sf_ap_msg m = {.op = SF_AP_EXEC, .id = 9, .cmd = "wc -c", .timeout_ms = 1, .cap = 2,
                   .in = 1, .bg = 1}, out;

    (void)state;
    round_trip(&m, &out);
    assert_true(out.in);
    assert_true(out.bg);
    assert_false(out.stream);
    sf_ap_msg_fini(&out);

    memset(chunk, 'x', sizeof(chunk));
    m = (sf_ap_msg){.op = SF_AP_INPUT, .id = 9, .data = chunk, .data_len = sizeof(chunk),
                    .more = 1};
    round_trip(&m, &out);
    assert_int_equal(out.data_len, sizeof(chunk));
    assert_true(out.more);
    sf_ap_msg_fini(&out);
    m = (sf_ap_msg){.op = SF_AP_INPUT, .id = 9}; /* EOF, nothing more */
    round_trip(&m, &out);
    assert_int_equal(out.data_len, 0);
    assert_false(out.more);
    sf_ap_msg_fini(&out);

    m = (sf_ap_msg){.op = SF_AP_PLIST, .id = 10};
    round_trip(&m, &out);
    assert_int_equal(out.op, SF_AP_PLIST);
    sf_ap_msg_fini(&out);

    m = (sf_ap_msg){.op = SF_AP_PROCS, .id = 10, .procs = procs, .n_procs = 2, .more = 1};
    round_trip(&m, &out);
    assert_int_equal(out.n_procs, 2);
    assert_true(out.more);
    assert_int_equal(out.procs[0].start_ms, 1700000000123ull);
    assert_string_equal(out.procs[1].cmd, "python3 -m http.server");
    assert_int_equal(out.procs[1].pid, 42);
    assert_int_equal(out.procs[1].state, 'R');
    assert_int_equal(out.procs[0].rss_kib, 900);
    sf_ap_msg_fini(&out);

    m = (sf_ap_msg){.op = SF_AP_PKILL, .id = 11, .pid = 42, .sig = 15, .grace_ms = 5000};
    round_trip(&m, &out);
    assert_int_equal(out.pid, 42);
    assert_int_equal(out.sig, 15);
    assert_int_equal(out.grace_ms, 5000);
    sf_ap_msg_fini(&out);

    m = (sf_ap_msg){.op = SF_AP_PLOGS, .id = 12, .pid = 42, .has_off = 1, .off = 0};
    round_trip(&m, &out);
    assert_true(out.has_off);
    assert_int_equal(out.tail, 0);
    sf_ap_msg_fini(&out);
    m = (sf_ap_msg){.op = SF_AP_PLOGS, .id = 12, .pid = 42, .tail = 9};
    round_trip(&m, &out);
    assert_false(out.has_off);
    assert_int_equal(out.tail, 9);
    sf_ap_msg_fini(&out);

    m = (sf_ap_msg){.op = SF_AP_LOG, .id = 12, .data = "end\n", .data_len = 4, .size = 100,
                    .off = 104, .exited = 1, .exit_code = 143};
    round_trip(&m, &out);
    assert_true(out.exited);
    assert_int_equal(out.exit_code, 143);
    assert_int_equal(out.size, 100);
    assert_int_equal(out.off, 104);
    sf_ap_msg_fini(&out);
    m = (sf_ap_msg){.op = SF_AP_LOG, .id = 12, .size = 3, .off = 3};
    round_trip(&m, &out);
    assert_false(out.exited);
    sf_ap_msg_fini(&out);

    /* detach (issue 27): the exec's detach_ms, the result's pid, the log's timed_out */
    m = (sf_ap_msg){.op = SF_AP_EXEC, .id = 13, .cmd = "sleep 90", .timeout_ms = 120000,
                    .cap = 2, .detach_ms = 50000};
    round_trip(&m, &out);
    assert_int_equal(out.detach_ms, 50000);
    sf_ap_msg_fini(&out);
    m = (sf_ap_msg){.op = SF_AP_RESULT, .id = 13, .out = "so far", .out_len = 6,
                    .out_total = 6, .pid = 77};
    round_trip(&m, &out);
    assert_int_equal(out.pid, 77);
    assert_int_equal(out.out_len, 6);
    sf_ap_msg_fini(&out);
    m = (sf_ap_msg){.op = SF_AP_RESULT, .id = 13};
    round_trip(&m, &out);
    assert_int_equal(out.pid, 0); /* the command's end */
    sf_ap_msg_fini(&out);
    m = (sf_ap_msg){.op = SF_AP_LOG, .id = 13, .size = 0, .off = 0, .exited = 1,
                    .exit_code = 137, .timed_out = 1};
    round_trip(&m, &out);
    assert_true(out.timed_out);
    assert_int_equal(out.exit_code, 137);
    sf_ap_msg_fini(&out);
}

static void test_proc_ops_rejected(void **state)
{
    static char big[SF_AP_DATA_MAX + 1], longcmd[SF_AP_CMDLINE_MAX + 2];
    sf_ap_proc nopid[1] = {{0, "x", 0, 0, 0, 'S'}}, empty[1] = {{1, "", 0, 0, 0, 'S'}},
               badstate[1] = {{1, "x", 0, 0, 0, ' '}}, toolong[1] = {{1, longcmd, 0, 0, 0, 'S'}};
    const sf_ap_msg bad[] = {
        {.op = SF_AP_INPUT, .data = big, .data_len = sizeof(big)},
        {.op = SF_AP_PKILL, .pid = 0, .sig = 15},
        {.op = SF_AP_PKILL, .pid = 2, .sig = 0},
        {.op = SF_AP_PKILL, .pid = 2, .sig = 65},
        {.op = SF_AP_PKILL, .pid = 2, .sig = 9, .grace_ms = SF_AP_GRACE_MAX + 1},
        {.op = SF_AP_PLOGS, .pid = 0},
        {.op = SF_AP_PLOGS, .pid = 2, .tail = SF_AP_DATA_MAX + 1},
        {.op = SF_AP_LOG, .size = 5, .off = 4}, /* starts after its end */
        {.op = SF_AP_LOG, .data = big, .data_len = sizeof(big), .off = sizeof(big)},
        {.op = SF_AP_PROCS, .procs = nopid, .n_procs = 1},
        {.op = SF_AP_PROCS, .procs = empty, .n_procs = 1},
        {.op = SF_AP_PROCS, .procs = badstate, .n_procs = 1},
        {.op = SF_AP_PROCS, .procs = toolong, .n_procs = 1},
        {.op = SF_AP_PROCS, .n_procs = 1},
    };
    const char *why;
    sf_buf b;

    (void)state;
    memset(longcmd, 'a', sizeof(longcmd) - 1);
    sf_buf_init(&b, 2 * SF_AP_FRAME_MAX);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        why = NULL;
        if (sf_ap_encode(&b, &bad[i], &why) != -EINVAL)
            fail_msg("case %zu was encoded", i);
        assert_non_null(why);
        assert_int_equal(b.len, 0);
    }
    sf_buf_fini(&b);
}

/* procs of the wrong shape, a pkill without its signal, input keys on exec. */
static void test_proc_ops_decode_errors(void **state)
{
    const char *why = NULL;
    sf_ap_msg out;
    mp m;

    (void)state;
    mp_init(&m);
    msgpack_pack_map(&m.pk, 4);
    mp_kv_str(&m, "op", "procs");
    mp_kv_uint(&m, "id", 1);
    mp_str(&m, "procs");
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_array(&m.pk, 5); /* state missing */
    msgpack_pack_uint8(&m.pk, 7);
    mp_str(&m, "sleep 1");
    msgpack_pack_uint8(&m.pk, 1);
    msgpack_pack_uint8(&m.pk, 1);
    msgpack_pack_uint8(&m.pk, 1);
    mp_str(&m, "more");
    msgpack_pack_false(&m.pk);
    assert_int_equal(sf_ap_decode(m.sb.data, m.sb.size, &out, &why), -EBADMSG);
    assert_non_null(strstr(why, "procs"));
    msgpack_sbuffer_destroy(&m.sb);

    mp_init(&m);
    msgpack_pack_map(&m.pk, 3);
    mp_kv_str(&m, "op", "pkill");
    mp_kv_uint(&m, "id", 1);
    mp_kv_uint(&m, "pid", 5);
    assert_int_equal(sf_ap_decode(m.sb.data, m.sb.size, &out, &why), -EBADMSG);
    assert_string_equal(why, "missing key 'sig'");
    msgpack_sbuffer_destroy(&m.sb);

    mp_init(&m);
    msgpack_pack_map(&m.pk, 4);
    mp_kv_str(&m, "op", "pkill");
    mp_kv_uint(&m, "id", 1);
    mp_kv_uint(&m, "pid", 5);
    mp_kv_uint(&m, "sig", 99);
    assert_int_equal(sf_ap_decode(m.sb.data, m.sb.size, &out, &why), -EBADMSG);
    assert_non_null(strstr(why, "'sig'"));
    msgpack_sbuffer_destroy(&m.sb);

    mp_init(&m);
    msgpack_pack_map(&m.pk, 4);
    mp_kv_str(&m, "op", "input");
    mp_kv_uint(&m, "id", 1);
    mp_kv_str(&m, "cmd", "x");
    mp_str(&m, "more");
    msgpack_pack_false(&m.pk);
    assert_int_equal(sf_ap_decode(m.sb.data, m.sb.size, &out, &why), -EBADMSG);
    msgpack_sbuffer_destroy(&m.sb);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ping_pong),
        cmocka_unit_test(test_proc_ops_round_trip),
        cmocka_unit_test(test_proc_ops_rejected),
        cmocka_unit_test(test_proc_ops_decode_errors),
        cmocka_unit_test(test_file_ops_round_trip),
        cmocka_unit_test(test_file_ops_rejected),
        cmocka_unit_test(test_file_ops_decode_errors),
        cmocka_unit_test(test_exec_full),
        cmocka_unit_test(test_exec_minimal),
        cmocka_unit_test(test_result_binary),
        cmocka_unit_test(test_error_msg),
        cmocka_unit_test(test_several_frames_in_one_buffer),
        cmocka_unit_test(test_encode_rejects_invalid),
        cmocka_unit_test(test_encode_oversize_leaves_buffer),
        cmocka_unit_test(test_encode_buffer_full),
        cmocka_unit_test(test_frame_check),
        cmocka_unit_test(test_decode_empty_and_oversize),
        cmocka_unit_test(test_decode_not_a_map),
        cmocka_unit_test(test_decode_every_truncation_fails),
        cmocka_unit_test(test_decode_trailing_bytes),
        cmocka_unit_test(test_decode_op_errors),
        cmocka_unit_test(test_decode_id_errors),
        cmocka_unit_test(test_decode_key_errors),
        cmocka_unit_test(test_decode_exec_value_errors),
        cmocka_unit_test(test_decode_env_errors),
        cmocka_unit_test(test_decode_result_errors),
        cmocka_unit_test(test_decode_error_msg_limits),
        cmocka_unit_test(test_decode_hostile_headers),
        cmocka_unit_test(test_decode_deep_nesting),
        cmocka_unit_test(test_decode_random_bytes_never_crash),
        cmocka_unit_test(test_decode_bit_flips_never_crash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
