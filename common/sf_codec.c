#include "sf_codec.h"
#include "sf_mpjson.h"
#include "sf_mpscan.h"

#include <errno.h>
#include <msgpack.h>
#include <string.h>

/* The packer's sink: remembers a failed append (buffer at its maximum), so an envelope
 * that does not fit is an error and never a silently truncated message. */
typedef struct pack_sink {
    sf_buf *b;
    int failed;
} pack_sink;

static int buf_write(void *data, const char *p, size_t n)
{
    pack_sink *w = data;
    if (sf_buf_append(w->b, p, n) < 0) {
        w->failed = 1;
        return -1;
    }
    return 0;
}

void sf_job_init(sf_job *j)
{
    memset(j, 0, sizeof(*j));
}

void sf_job_fini(sf_job *j)
{
    json_decref(j->args);
    j->args = NULL;
}

static void pack_opt_str(msgpack_packer *pk, const char *k, const char *v)
{
    if (v[0])
        sf_mp_pack_kv_str(pk, k, v);
}

static int claim_name_ok(const char *s, size_t n)
{
    if (n == 0 || n >= SF_CLAIM_NAME_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
            return 0;
    return 1;
}

int sf_claims_has(const sf_claims *c, const char *name)
{
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->name[i], name))
            return 1;
    return 0;
}

int sf_claims_add(sf_claims *c, const char *name)
{
    if (!claim_name_ok(name, strlen(name)))
        return -EINVAL;
    if (sf_claims_has(c, name))
        return -EEXIST;
    if (c->n >= SF_CLAIMS_MAX)
        return -E2BIG;
    snprintf(c->name[c->n++], SF_CLAIM_NAME_MAX, "%s", name);
    return 0;
}

static void pack_claims(msgpack_packer *pk, const sf_claims *c)
{
    sf_mp_pack_str(pk, "claims");
    msgpack_pack_array(pk, (size_t)c->n);
    for (int i = 0; i < c->n; i++)
        sf_mp_pack_str(pk, c->name[i]);
}

/* The optional `claims` field: an array of up to SF_CLAIMS_MAX distinct names. */
static int get_claims(const msgpack_object *m, sf_claims *c, const char **why)
{
    const msgpack_object *v = sf_mp_map_get(m, "claims");

    memset(c, 0, sizeof(*c));
    if (!v)
        return 0;
    if (v->type != MSGPACK_OBJECT_ARRAY || v->via.array.size > SF_CLAIMS_MAX) {
        *why = "field 'claims' must be an array of at most 4 names";
        return -EINVAL;
    }
    for (uint32_t i = 0; i < v->via.array.size; i++) {
        const msgpack_object *e = &v->via.array.ptr[i];
        char name[SF_CLAIM_NAME_MAX];
        if (e->type != MSGPACK_OBJECT_STR || !claim_name_ok(e->via.str.ptr, e->via.str.size)) {
            *why = "field 'claims' must hold names matching [a-z0-9_]{1,31}";
            return -EINVAL;
        }
        memcpy(name, e->via.str.ptr, e->via.str.size);
        name[e->via.str.size] = '\0';
        if (sf_claims_add(c, name) < 0) {
            *why = "field 'claims' names a field twice";
            return -EINVAL;
        }
    }
    return 0;
}

int sf_job_encode(const sf_job *j, sf_buf *out)
{
    msgpack_packer pk;
    pack_sink w = {out, 0};
    size_t start = out->len;
    int n = 7;

    if (!j->id[0] || !j->team[0] || !j->tool[0] || !j->reply[0] || !json_is_object(j->args))
        return -EINVAL;
    n += !!j->sandbox[0] + !!j->host[0] + !!j->trace[0] + !!j->progress + (j->claims.n > 0);
    msgpack_packer_init(&pk, &w, buf_write);
    msgpack_pack_map(&pk, (size_t)n);
    sf_mp_pack_str(&pk, "v");
    msgpack_pack_int(&pk, SF_ENVELOPE_VERSION);
    sf_mp_pack_kv_str(&pk, "id", j->id);
    sf_mp_pack_kv_str(&pk, "team", j->team);
    sf_mp_pack_kv_str(&pk, "tool", j->tool);
    sf_mp_pack_kv_str(&pk, "reply", j->reply);
    sf_mp_pack_str(&pk, "deadline");
    msgpack_pack_int64(&pk, j->deadline_ms);
    pack_opt_str(&pk, "sandbox", j->sandbox);
    pack_opt_str(&pk, "host", j->host);
    pack_opt_str(&pk, "trace", j->trace);
    if (j->progress) {
        sf_mp_pack_str(&pk, "progress");
        msgpack_pack_true(&pk);
    }
    if (j->claims.n > 0)
        pack_claims(&pk, &j->claims);
    sf_mp_pack_str(&pk, "args");
    if (sf_mpjson_pack(&pk, j->args) < 0 && !w.failed) {
        out->len = start;
        return -EINVAL;
    }
    if (w.failed || out->len - start > SF_MSG_MAX) {
        out->len = start;
        return -E2BIG;
    }
    return 0;
}

/* Scans the first value of p/n within its bytes (sf_mpscan.h) and only then lets
 * msgpack-c unpack it: 0 and its length in *used, or -EINVAL / -E2BIG with *why. */
static int unpack_bounded(const void *p, size_t n, msgpack_unpacked *res, size_t *used,
                          const char **why)
{
    size_t len = 0, off = 0;
    int rc;

    if (n > SF_MSG_MAX) {
        *why = "message larger than 1 MiB";
        return -E2BIG;
    }
    if ((rc = sf_mpscan_value(p, n, SF_MSG_MAX_DEPTH, SF_MSG_MAX_VALUES, &len, why)) < 0)
        return rc == -E2BIG ? -E2BIG : -EINVAL;
    if (msgpack_unpack_next(res, p, len, &off) != MSGPACK_UNPACK_SUCCESS || off != len) {
        *why = "not a complete msgpack value";
        return -EINVAL;
    }
    *used = len;
    return 0;
}

/* Unpacks exactly one map from p/n into *res; rejects trailing bytes. */
static int unpack_map(const void *p, size_t n, msgpack_unpacked *res, const char **why)
{
    size_t used = 0;
    int rc;

    if ((rc = unpack_bounded(p, n, res, &used, why)) < 0)
        return rc;
    if (used != n) {
        *why = "trailing bytes after the msgpack value";
        return -EINVAL;
    }
    if (res->data.type != MSGPACK_OBJECT_MAP) {
        *why = "envelope is not a msgpack map";
        return -EINVAL;
    }
    return 0;
}

static int check_version(const msgpack_object *m, const char **why)
{
    int64_t v;
    int rc = sf_mp_get_i64(m, "v", &v);

    if (rc == -ENOENT) {
        *why = "field 'v' (envelope version) is missing";
        return -EINVAL;
    }
    if (rc < 0) {
        *why = "field 'v' must be an integer";
        return -EINVAL;
    }
    if (v != SF_ENVELOPE_VERSION) {
        *why = "unsupported envelope version (this build speaks v=1)";
        return -EINVAL;
    }
    return 0;
}

/* Reads a string field; required fields must be present. */
static int get_str(const msgpack_object *m, const char *key, char *dst, size_t n, int required,
                   const char **why)
{
    static __thread char msg[96];
    int rc = sf_mp_get_str(m, key, dst, n);

    if (rc == 0 || (rc == -ENOENT && !required)) {
        if (rc)
            dst[0] = '\0';
        return 0;
    }
    snprintf(msg, sizeof(msg), "field '%s' %s", key,
             rc == -ENOENT ? "is missing" : rc == -E2BIG ? "is too long" : "must be a string");
    *why = msg;
    return -EINVAL;
}

/* Reads a map field as a JSON object. */
static int get_map(const msgpack_object *m, const char *key, json_t **out, const char **why)
{
    static __thread char msg[64];
    const msgpack_object *v = sf_mp_map_get(m, key);

    if (!v || v->type != MSGPACK_OBJECT_MAP) {
        snprintf(msg, sizeof(msg), "field '%s' must be a map", key);
        *why = msg;
        return -EINVAL;
    }
    return sf_mpjson_unpack(v, out, why);
}

int sf_job_decode(const void *p, size_t n, sf_job *j, const char **why)
{
    msgpack_unpacked res;
    const msgpack_object *m;
    int rc;

    sf_job_init(j);
    msgpack_unpacked_init(&res);
    if ((rc = unpack_map(p, n, &res, why)) < 0)
        goto out;
    m = &res.data;
    rc = -EINVAL;
    if (check_version(m, why) < 0 || get_str(m, "id", j->id, sizeof(j->id), 1, why) < 0 ||
        get_str(m, "team", j->team, sizeof(j->team), 1, why) < 0 ||
        get_str(m, "tool", j->tool, sizeof(j->tool), 1, why) < 0 ||
        get_str(m, "reply", j->reply, sizeof(j->reply), 1, why) < 0 ||
        get_str(m, "sandbox", j->sandbox, sizeof(j->sandbox), 0, why) < 0 ||
        get_str(m, "host", j->host, sizeof(j->host), 0, why) < 0 ||
        get_str(m, "trace", j->trace, sizeof(j->trace), 0, why) < 0)
        goto out;
    if (!sf_id_valid(j->id) || !sf_id_valid(j->team) ||
        (j->sandbox[0] && !sf_id_valid(j->sandbox)) || (j->host[0] && !sf_id_valid(j->host))) {
        *why = "fields 'id', 'team', 'sandbox' and 'host' must match [a-z0-9_-]{1,63}";
        goto out;
    }
    if (!sf_reply_topic_valid(j->reply)) {
        *why = "field 'reply' must name a reply topic (sf.reply.<id>)";
        goto out;
    }
    if (sf_mp_get_i64(m, "deadline", &j->deadline_ms) < 0) {
        *why = "field 'deadline' must be an integer (ms since the epoch)";
        goto out;
    }
    if (sf_mp_get_bool(m, "progress", &j->progress) == -EINVAL) {
        *why = "field 'progress' must be a boolean";
        goto out;
    }
    if (get_map(m, "args", &j->args, why) < 0 || get_claims(m, &j->claims, why) < 0)
        goto out;
    for (int i = 0; i < j->claims.n; i++)
        if (!json_is_string(json_object_get(j->args, j->claims.name[i]))) {
            *why = "field 'claims' names an argument that is not a string in 'args'";
            goto out;
        }
    rc = 0;
out:
    msgpack_unpacked_destroy(&res);
    if (rc < 0)
        sf_job_fini(j);
    return rc;
}

void sf_reply_init(sf_reply *r)
{
    memset(r, 0, sizeof(*r));
}

void sf_reply_fini(sf_reply *r)
{
    json_decref(r->result);
    r->result = NULL;
    sf_free(&r->message);
}

static const char *const kind_names[] = {"result", "error", "progress"};

int sf_reply_encode(const sf_reply *r, sf_buf *out)
{
    msgpack_packer pk;
    pack_sink w = {out, 0};
    size_t start = out->len;

    if (!r->id[0] || r->kind < 0 || r->kind > SF_REPLY_PROGRESS)
        return -EINVAL;
    msgpack_packer_init(&pk, &w, buf_write);
    msgpack_pack_map(&pk, 4 + (r->kind == SF_REPLY_RESULT && r->claims.n > 0));
    sf_mp_pack_str(&pk, "v");
    msgpack_pack_int(&pk, SF_ENVELOPE_VERSION);
    sf_mp_pack_kv_str(&pk, "id", r->id);
    sf_mp_pack_kv_str(&pk, "kind", kind_names[r->kind]);
    if (r->kind == SF_REPLY_ERROR) {
        sf_mp_pack_str(&pk, "error");
        msgpack_pack_map(&pk, 2);
        sf_mp_pack_kv_str(&pk, "code", r->code[0] ? r->code : SF_ERR_INTERNAL);
        {
            const char *msg = r->message ? r->message : "The call failed.";
            size_t n = strlen(msg);
            if (n > SF_MESSAGE_MAX) { /* cut at a UTF-8 character boundary */
                n = SF_MESSAGE_MAX;
                while (n > 0 && ((unsigned char)msg[n] & 0xc0) == 0x80)
                    n--;
            }
            sf_mp_pack_str(&pk, "message");
            msgpack_pack_str(&pk, n);
            msgpack_pack_str_body(&pk, msg, n);
        }
    } else {
        sf_mp_pack_str(&pk, "result");
        if (!json_is_object(r->result) || (sf_mpjson_pack(&pk, r->result) < 0 && !w.failed)) {
            out->len = start;
            return -EINVAL;
        }
        if (r->kind == SF_REPLY_RESULT && r->claims.n > 0)
            pack_claims(&pk, &r->claims);
    }
    if (w.failed || out->len - start > SF_MSG_MAX) {
        out->len = start;
        return -E2BIG;
    }
    return 0;
}

int sf_reply_decode(const void *p, size_t n, sf_reply *r, const char **why)
{
    msgpack_unpacked res;
    const msgpack_object *m, *v;
    char kind[16];
    int rc;

    sf_reply_init(r);
    msgpack_unpacked_init(&res);
    if ((rc = unpack_map(p, n, &res, why)) < 0)
        goto out;
    m = &res.data;
    rc = -EINVAL;
    if (check_version(m, why) < 0 || get_str(m, "id", r->id, sizeof(r->id), 1, why) < 0 ||
        get_str(m, "kind", kind, sizeof(kind), 1, why) < 0)
        goto out;
    for (r->kind = 0; r->kind <= SF_REPLY_PROGRESS; r->kind++)
        if (!strcmp(kind, kind_names[r->kind]))
            break;
    if (r->kind > SF_REPLY_PROGRESS) {
        *why = "field 'kind' must be result, error or progress";
        goto out;
    }
    if (r->kind == SF_REPLY_ERROR) {
        char msg[SF_MESSAGE_MAX + 1];
        v = sf_mp_map_get(m, "error");
        if (!v || v->type != MSGPACK_OBJECT_MAP ||
            get_str(v, "code", r->code, sizeof(r->code), 1, why) < 0 ||
            get_str(v, "message", msg, sizeof(msg), 1, why) < 0) {
            if (!v || v->type != MSGPACK_OBJECT_MAP)
                *why = "field 'error' must be a map with code and message";
            goto out;
        }
        if (!(r->message = strdup(msg))) {
            rc = -ENOMEM;
            goto out;
        }
    } else if (get_map(m, "result", &r->result, why) < 0 ||
               (r->kind == SF_REPLY_RESULT && get_claims(m, &r->claims, why) < 0)) {
        goto out;
    }
    for (int i = 0; i < r->claims.n; i++)
        if (!json_is_string(json_object_get(r->result, r->claims.name[i]))) {
            *why = "field 'claims' names a result field that is not a string";
            goto out;
        }
    rc = 0;
out:
    msgpack_unpacked_destroy(&res);
    if (rc < 0)
        sf_reply_fini(r);
    return rc;
}

int sf_reply_encode_error(const char *id, const char *code, const char *message, sf_buf *out)
{
    sf_reply r;

    sf_reply_init(&r);
    snprintf(r.id, sizeof(r.id), "%s", id);
    snprintf(r.code, sizeof(r.code), "%s", code);
    r.kind = SF_REPLY_ERROR;
    r.message = (char *)message;
    return sf_reply_encode(&r, out);
}

int sf_reply_encode_result(const char *id, const json_t *result, sf_buf *out)
{
    sf_reply r;

    sf_reply_init(&r);
    snprintf(r.id, sizeof(r.id), "%s", id);
    r.kind = SF_REPLY_RESULT;
    r.result = (json_t *)result;
    return sf_reply_encode(&r, out);
}

/* Reads what it can of an envelope that failed to decode: its job id and, when reply is
 * not NULL, its reply topic. Trailing bytes and other fields do not matter here. */
static int peek(const void *p, size_t n, char id[SF_ID_MAX], char *reply)
{
    msgpack_unpacked res;
    size_t used = 0;
    const char *why = NULL;
    int rc = -EINVAL;

    msgpack_unpacked_init(&res);
    if (unpack_bounded(p, n, &res, &used, &why) == 0 && res.data.type == MSGPACK_OBJECT_MAP &&
        sf_mp_get_str(&res.data, "id", id, SF_ID_MAX) == 0 && sf_id_valid(id) &&
        (!reply || (sf_mp_get_str(&res.data, "reply", reply, SF_TOPIC_MAX) == 0 &&
                    sf_reply_topic_valid(reply))))
        rc = 0;
    msgpack_unpacked_destroy(&res);
    return rc;
}

int sf_job_peek_reply(const void *p, size_t n, char id[SF_ID_MAX], char reply[SF_TOPIC_MAX])
{
    return peek(p, n, id, reply);
}

int sf_reply_peek_id(const void *p, size_t n, char id[SF_ID_MAX])
{
    return peek(p, n, id, NULL);
}

int sf_reply_topic_valid(const char *topic)
{
    size_t plen = strlen("sf.reply.");
    return strncmp(topic, "sf.reply.", plen) == 0 && sf_id_valid(topic + plen);
}
