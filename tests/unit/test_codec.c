/* Job/reply codec: round trips, and strict rejection of malformed msgpack. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "alloc_track.h"
#include "sf_codec.h"
#include "sf_mpjson.h"

#include <msgpack.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int w(void *data, const char *p, size_t n)
{
    return sf_buf_append(data, p, n) < 0 ? -1 : 0;
}

static void fill_job(sf_job *j)
{
    sf_job_init(j);
    strcpy(j->id, "job_abc");
    strcpy(j->team, "team-a");
    strcpy(j->tool, "sandbox_exec");
    strcpy(j->sandbox, "sb_xyz");
    strcpy(j->reply, "sf.reply.gw_1");
    strcpy(j->trace, "req_1");
    j->deadline_ms = 1700000000123;
    j->progress = 1;
    j->args = json_pack("{s:s, s:i, s:{s:s}, s:[i,b,n,f]}", "command", "echo \xc3\xa9", "timeout_ms",
                        500, "env", "A", "b", "list", 1, 1, 2.5);
}

static void job_round_trip(void **state)
{
    sf_job a, b;
    sf_buf buf;
    const char *why = NULL;

    fill_job(&a);
    sf_buf_init(&buf, SF_MSG_MAX);
    assert_int_equal(sf_job_encode(&a, &buf), 0);
    assert_int_equal(sf_job_decode(buf.p, buf.len, &b, &why), 0);
    assert_string_equal(b.id, "job_abc");
    assert_string_equal(b.team, "team-a");
    assert_string_equal(b.tool, "sandbox_exec");
    assert_string_equal(b.sandbox, "sb_xyz");
    assert_string_equal(b.reply, "sf.reply.gw_1");
    assert_string_equal(b.trace, "req_1");
    assert_true(b.deadline_ms == 1700000000123);
    assert_int_equal(b.progress, 1);
    assert_true(json_equal(a.args, b.args));
    sf_job_fini(&a);
    sf_job_fini(&b);
    sf_buf_fini(&buf);
}

static void reply_round_trip(void **state)
{
    sf_reply r;
    sf_buf buf;
    const char *why = NULL;
    json_t *res = json_pack("{s:s, s:i, s:b}", "stdout", "hi\n", "exit_code", 3, "truncated", 0);

    sf_buf_init(&buf, SF_MSG_MAX);
    assert_int_equal(sf_reply_encode_result("job_1", res, &buf), 0);
    assert_int_equal(sf_reply_decode(buf.p, buf.len, &r, &why), 0);
    assert_int_equal(r.kind, SF_REPLY_RESULT);
    assert_string_equal(r.id, "job_1");
    assert_true(json_equal(r.result, res));
    sf_reply_fini(&r);
    sf_buf_reset(&buf);
    assert_int_equal(sf_reply_encode_error("job_2", SF_ERR_NOT_FOUND, "No sandbox.", &buf), 0);
    assert_int_equal(sf_reply_decode(buf.p, buf.len, &r, &why), 0);
    assert_int_equal(r.kind, SF_REPLY_ERROR);
    assert_string_equal(r.code, "not_found");
    assert_string_equal(r.message, "No sandbox.");
    sf_reply_fini(&r);
    json_decref(res);
    sf_buf_fini(&buf);
}

/* Packs a job map with one field replaced (or removed when val_fn is NULL). */
typedef void (*pack_fn)(msgpack_packer *pk);
static void pack_job_with(sf_buf *out, const char *field, pack_fn fn)
{
    static const char *keys[] = {"v", "id", "team", "tool", "reply", "deadline", "args"};
    msgpack_packer pk;
    int n = 0;

    for (size_t i = 0; i < 7; i++)
        n += strcmp(keys[i], field) != 0 || fn != NULL;
    msgpack_packer_init(&pk, out, w);
    msgpack_pack_map(&pk, (size_t)n);
    for (size_t i = 0; i < 7; i++) {
        if (!strcmp(keys[i], field)) {
            if (!fn)
                continue;
            sf_mp_pack_str(&pk, keys[i]);
            fn(&pk);
            continue;
        }
        sf_mp_pack_str(&pk, keys[i]);
        switch (i) {
        case 0: msgpack_pack_int(&pk, 1); break;
        case 1: sf_mp_pack_str(&pk, "job_1"); break;
        case 2: sf_mp_pack_str(&pk, "t"); break;
        case 3: sf_mp_pack_str(&pk, "sandbox_list"); break;
        case 4: sf_mp_pack_str(&pk, "sf.reply.g"); break;
        case 5: msgpack_pack_int64(&pk, 5); break;
        case 6: msgpack_pack_map(&pk, 0); break;
        }
    }
}

static void p_v2(msgpack_packer *pk) { msgpack_pack_int(pk, 2); }
static void p_str(msgpack_packer *pk) { sf_mp_pack_str(pk, "x"); }
static void p_int(msgpack_packer *pk) { msgpack_pack_int(pk, 7); }
static void p_long(msgpack_packer *pk)
{
    char s[200];
    memset(s, 'a', sizeof(s) - 1);
    s[sizeof(s) - 1] = 0;
    sf_mp_pack_str(pk, s);
}
static void p_bad_id(msgpack_packer *pk) { sf_mp_pack_str(pk, "../etc"); }
static void p_bad_topic(msgpack_packer *pk) { sf_mp_pack_str(pk, "sf.jobs"); }
static void p_bin_args(msgpack_packer *pk)
{
    msgpack_pack_map(pk, 1);
    sf_mp_pack_str(pk, "k");
    msgpack_pack_bin(pk, 2);
    msgpack_pack_bin_body(pk, "ab", 2);
}
static void p_intkey_args(msgpack_packer *pk)
{
    msgpack_pack_map(pk, 1);
    msgpack_pack_int(pk, 1);
    sf_mp_pack_str(pk, "v");
}
static void p_deep_args(msgpack_packer *pk)
{
    msgpack_pack_map(pk, 1);
    sf_mp_pack_str(pk, "a");
    for (int i = 0; i < 100; i++)
        msgpack_pack_array(pk, 1);
    msgpack_pack_nil(pk);
}
static void p_nul_str(msgpack_packer *pk)
{
    msgpack_pack_str(pk, 3);
    msgpack_pack_str_body(pk, "a\0b", 3);
}

static void expect_reject(const char *field, pack_fn fn, const char *why_part)
{
    sf_buf buf;
    sf_job j;
    const char *why = NULL;

    sf_buf_init(&buf, SF_MSG_MAX * 2);
    pack_job_with(&buf, field, fn);
    assert_int_not_equal(sf_job_decode(buf.p, buf.len, &j, &why), 0);
    assert_non_null(why);
    if (!strstr(why, why_part))
        fail_msg("field %s: reason '%s' does not mention '%s'", field, why, why_part);
    assert_null(j.args);
    sf_buf_fini(&buf);
}

static void job_rejects_bad_fields(void **state)
{
    sf_buf buf;
    sf_job j;
    const char *why = NULL;

    /* the baseline must pass, or the rejections below prove nothing */
    sf_buf_init(&buf, SF_MSG_MAX);
    pack_job_with(&buf, "none", NULL);
    assert_int_equal(sf_job_decode(buf.p, buf.len, &j, &why), 0);
    sf_job_fini(&j);
    sf_buf_fini(&buf);

    expect_reject("v", p_v2, "version");
    expect_reject("v", NULL, "'v'");
    expect_reject("v", p_str, "'v'");
    expect_reject("id", NULL, "'id' is missing");
    expect_reject("id", p_int, "'id' must be a string");
    expect_reject("id", p_long, "'id' is too long");
    expect_reject("id", p_bad_id, "[a-z0-9_-]");
    expect_reject("team", p_nul_str, "'team'");
    expect_reject("tool", NULL, "'tool' is missing");
    expect_reject("reply", p_bad_topic, "reply topic");
    expect_reject("deadline", p_str, "'deadline'");
    expect_reject("args", p_str, "'args' must be a map");
    expect_reject("args", p_bin_args, "binary");
    expect_reject("args", p_intkey_args, "key");
    expect_reject("args", p_deep_args, ""); /* msgpack-c or our depth limit, either way */
}

static void job_rejects_garbage(void **state)
{
    static const unsigned char cases[][8] = {
        {0xc1},                   /* never-used byte */
        {0x93, 0x01},             /* array of 3, truncated */
        {0x81, 0xa1, 'v'},        /* map, value missing */
        {0x01},                   /* not a map */
        {0xdf, 0xff, 0xff, 0xff}, /* map of 4G entries, no data */
    };
    static const size_t lens[] = {1, 2, 3, 1, 4};
    sf_job j;
    const char *why;

    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        why = NULL;
        assert_int_not_equal(sf_job_decode(cases[i], lens[i], &j, &why), 0);
        assert_non_null(why);
    }
    why = NULL;
    assert_int_not_equal(sf_job_decode("", 0, &j, &why), 0);
    assert_non_null(why);
}

static void job_rejects_trailing_and_oversize(void **state)
{
    sf_job a, b;
    sf_buf buf;
    const char *why = NULL;
    char *big;

    fill_job(&a);
    sf_buf_init(&buf, SF_MSG_MAX * 2);
    assert_int_equal(sf_job_encode(&a, &buf), 0);
    sf_buf_append(&buf, "\x00", 1);
    assert_int_not_equal(sf_job_decode(buf.p, buf.len, &b, &why), 0);
    assert_non_null(strstr(why, "trailing"));
    /* an encoder refuses to build an envelope over the limit, whether the buffer could
     * hold it or not (a full buffer must not yield a truncated message) */
    big = calloc(1, SF_MSG_MAX + 10);
    memset(big, 'x', SF_MSG_MAX + 9);
    json_object_set_new(a.args, "command", json_string(big));
    sf_buf_reset(&buf);
    assert_int_equal(sf_job_encode(&a, &buf), -E2BIG);
    assert_int_equal(buf.len, 0);
    {
        sf_buf small;
        sf_buf_init(&small, SF_MSG_MAX);
        assert_int_equal(sf_job_encode(&a, &small), -E2BIG);
        assert_int_equal(small.len, 0);
        json_object_set_new(a.args, "command", json_stringn(big, SF_MSG_MAX - 100));
        assert_int_equal(sf_job_encode(&a, &small), -E2BIG); /* just over, with the envelope */
        sf_buf_fini(&small);
    }
    assert_int_not_equal(sf_job_decode(big, SF_MSG_MAX + 9, &b, &why), 0);
    assert_non_null(strstr(why, "1 MiB"));
    free(big);
    sf_job_fini(&a);
    sf_buf_fini(&buf);
}

static void peek_reply_of_broken_job(void **state)
{
    sf_buf buf;
    char id[SF_ID_MAX], reply[SF_TOPIC_MAX];

    sf_buf_init(&buf, SF_MSG_MAX);
    pack_job_with(&buf, "args", p_str); /* undecodable as a job */
    assert_int_equal(sf_job_peek_reply(buf.p, buf.len, id, reply), 0);
    assert_string_equal(id, "job_1");
    assert_string_equal(reply, "sf.reply.g");
    sf_buf_reset(&buf);
    pack_job_with(&buf, "reply", p_bad_topic);
    assert_int_not_equal(sf_job_peek_reply(buf.p, buf.len, id, reply), 0);
    sf_buf_fini(&buf);
}

static void reply_rejects(void **state)
{
    sf_buf buf;
    sf_reply r;
    msgpack_packer pk;
    const char *why = NULL;

    sf_buf_init(&buf, SF_MSG_MAX);
    msgpack_packer_init(&pk, &buf, w);
    msgpack_pack_map(&pk, 3);
    sf_mp_pack_str(&pk, "v");
    msgpack_pack_int(&pk, 1);
    sf_mp_pack_kv_str(&pk, "id", "job_1");
    sf_mp_pack_kv_str(&pk, "kind", "surprise");
    assert_int_not_equal(sf_reply_decode(buf.p, buf.len, &r, &why), 0);
    assert_non_null(strstr(why, "kind"));
    sf_buf_reset(&buf);
    msgpack_pack_map(&pk, 3);
    sf_mp_pack_str(&pk, "v");
    msgpack_pack_int(&pk, 1);
    sf_mp_pack_kv_str(&pk, "id", "job_1");
    sf_mp_pack_kv_str(&pk, "kind", "error");
    assert_int_not_equal(sf_reply_decode(buf.p, buf.len, &r, &why), 0);
    assert_non_null(strstr(why, "error"));
    sf_buf_fini(&buf);
}

/* Headers that claim more elements or bytes than follow them: each must be refused by the
 * pre-scan, before msgpack-c reserves memory for the claim (issue #5: an 11-byte job made
 * a daemon reserve 1 GiB). Each claim is about 1 GiB of msgpack objects. */
static void count_bombs_refused_before_allocating(void **state)
{
    static const struct {
        const char *name;
        const char *bytes;
        size_t len;
    } bombs[] = {
#define B(n, s) {n, s, sizeof(s) - 1}
        B("array32 in args", "\x81\xa4" "args" "\xdd\x02\xaa\xaa\xab"),
        B("map32 at the top", "\xdf\x01\x55\x55\x56"),
        B("map32 in args", "\x83\xa1v\x01\xa2id\xa1x\xa4" "args" "\xdf\x01\x55\x55\x56"),
        B("nested array32", "\x91\x91\x91\xdd\x02\xaa\xaa\xab"),
        B("str32 length", "\x81\xa4" "args" "\x81\xa1" "a" "\xdb\x7f\xff\xff\xff"),
        B("bin32 length", "\x81\xa4" "args" "\x81\xa1" "a" "\xc6\x7f\xff\xff\xff"),
        B("ext32 length", "\x81\xa4" "args" "\x81\xa1" "a" "\xc9\x7f\xff\xff\xff\x01"),
        B("map32 in result", "\x84\xa1v\x01\xa2id\xa1x\xa4kind\xa6result\xa6result"
                             "\xdf\x01\x55\x55\x56"),
#undef B
    };
    char id[SF_ID_MAX], reply[SF_TOPIC_MAX];
    void *volatile probe;

    alloc_track_reset(); /* the tracker sees what is allocated (this test can fail) */
    probe = malloc(1 << 20);
    free(probe);
    assert_true(alloc_track_largest() >= 1 << 20);
    for (size_t i = 0; i < sizeof(bombs) / sizeof(bombs[0]); i++) {
        const char *why = NULL;
        sf_job j;
        sf_reply r;

        alloc_track_reset();
        assert_int_not_equal(sf_job_decode(bombs[i].bytes, bombs[i].len, &j, &why), 0);
        if (!why || !strstr(why, "runs past the end"))
            fail_msg("%s: job refused for '%s', not by the pre-scan", bombs[i].name, why);
        why = NULL;
        assert_int_not_equal(sf_reply_decode(bombs[i].bytes, bombs[i].len, &r, &why), 0);
        assert_non_null(strstr(why, "runs past the end"));
        assert_int_not_equal(sf_job_peek_reply(bombs[i].bytes, bombs[i].len, id, reply), 0);
        if (alloc_track_largest() > 64 * 1024)
            fail_msg("%s: one allocation of %zu bytes while refusing %zu bytes", bombs[i].name,
                     alloc_track_largest(), bombs[i].len);
    }
}

/* args = {"a": [nil x n]} in a job: n values and the envelope's. */
static void pack_job_with_nils(sf_buf *b, size_t n)
{
    msgpack_packer pk;

    msgpack_packer_init(&pk, b, w);
    msgpack_pack_map(&pk, 7);
    sf_mp_pack_str(&pk, "v");
    msgpack_pack_int(&pk, 1);
    sf_mp_pack_kv_str(&pk, "id", "job_1");
    sf_mp_pack_kv_str(&pk, "team", "t");
    sf_mp_pack_kv_str(&pk, "tool", "sandbox_exec");
    sf_mp_pack_kv_str(&pk, "reply", "sf.reply.g");
    sf_mp_pack_str(&pk, "deadline");
    msgpack_pack_int(&pk, 1);
    sf_mp_pack_str(&pk, "args");
    msgpack_pack_map(&pk, 1);
    sf_mp_pack_str(&pk, "a");
    msgpack_pack_array(&pk, n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_nil(&pk);
}

/* Real bytes behind every count, but more values than one message may carry, or nested
 * deeper than an envelope may be: refused on the raw bytes too. */
static void value_count_and_depth_bounded(void **state)
{
    sf_buf buf;
    sf_job j;
    const char *why = NULL;

    sf_buf_init(&buf, SF_MSG_MAX);
    pack_job_with_nils(&buf, SF_MSG_MAX_VALUES + 1);
    alloc_track_reset();
    assert_int_equal(sf_job_decode(buf.p, buf.len, &j, &why), -E2BIG);
    assert_non_null(strstr(why, "too many msgpack values"));
    assert_true(alloc_track_largest() < 64 * 1024);
    sf_buf_reset(&buf);
    pack_job_with_nils(&buf, SF_MSG_MAX_VALUES - 64); /* within the bound: decodes */
    assert_int_equal(sf_job_decode(buf.p, buf.len, &j, &why), 0);
    assert_int_equal(json_array_size(json_object_get(j.args, "a")), SF_MSG_MAX_VALUES - 64);
    sf_job_fini(&j);

    sf_buf_reset(&buf);
    {
        msgpack_packer pk;
        msgpack_packer_init(&pk, &buf, w);
        for (int d = 0; d < SF_MSG_MAX_DEPTH + 2; d++)
            msgpack_pack_array(&pk, 1);
        msgpack_pack_nil(&pk);
    }
    why = NULL;
    assert_int_not_equal(sf_job_decode(buf.p, buf.len, &j, &why), 0);
    assert_non_null(strstr(why, "nested too deeply"));
    sf_buf_fini(&buf);
}

/* Claims (claim checks): names of string arguments / result fields, round trips, and the
 * refusals that keep a message from pointing at anything but its own strings. */
static void claims_round_trip_and_rules(void **state)
{
    sf_job a, b;
    sf_reply r, r2;
    sf_buf buf;
    const char *why = NULL;

    fill_job(&a);
    json_object_set_new(a.args, "content", json_string(""));
    assert_int_equal(sf_claims_add(&a.claims, "content"), 0);
    assert_int_equal(sf_claims_add(&a.claims, "content"), -EEXIST);
    assert_int_equal(sf_claims_add(&a.claims, "Bad-Name"), -EINVAL);
    sf_buf_init(&buf, SF_MSG_MAX);
    assert_int_equal(sf_job_encode(&a, &buf), 0);
    assert_int_equal(sf_job_decode(buf.p, buf.len, &b, &why), 0);
    assert_int_equal(b.claims.n, 1);
    assert_true(sf_claims_has(&b.claims, "content"));
    sf_job_fini(&b);
    /* a claim for an argument that is not a string */
    sf_buf_reset(&buf);
    strcpy(a.claims.name[0], "timeout_ms");
    assert_int_equal(sf_job_encode(&a, &buf), 0);
    assert_int_equal(sf_job_decode(buf.p, buf.len, &b, &why), -EINVAL);
    assert_non_null(strstr(why, "claims"));
    sf_job_fini(&a);

    sf_reply_init(&r);
    strcpy(r.id, "job_1");
    r.kind = SF_REPLY_RESULT;
    r.result = json_pack("{s:s, s:i}", "content", "", "bytes", 5);
    sf_claims_add(&r.claims, "content");
    sf_buf_reset(&buf);
    assert_int_equal(sf_reply_encode(&r, &buf), 0);
    assert_int_equal(sf_reply_decode(buf.p, buf.len, &r2, &why), 0);
    assert_true(sf_claims_has(&r2.claims, "content"));
    sf_reply_fini(&r2);
    strcpy(r.claims.name[0], "bytes");
    sf_buf_reset(&buf);
    assert_int_equal(sf_reply_encode(&r, &buf), 0);
    assert_int_equal(sf_reply_decode(buf.p, buf.len, &r2, &why), -EINVAL);
    sf_reply_fini(&r);
    sf_buf_fini(&buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(job_round_trip),
        cmocka_unit_test(claims_round_trip_and_rules),
        cmocka_unit_test(reply_round_trip),
        cmocka_unit_test(job_rejects_bad_fields),
        cmocka_unit_test(job_rejects_garbage),
        cmocka_unit_test(job_rejects_trailing_and_oversize),
        cmocka_unit_test(peek_reply_of_broken_job),
        cmocka_unit_test(reply_rejects),
        cmocka_unit_test(count_bombs_refused_before_allocating),
        cmocka_unit_test(value_count_and_depth_bounded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
