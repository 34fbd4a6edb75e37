#include "sf_agentproto.h"
#include "sf_mpscan.h"

#include <errno.h>
#include <limits.h>
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

/* ---- keys ---------------------------------------------------------------- */

enum {
    K_OP, K_ID, K_V, K_CMD, K_CWD, K_ENV, K_TIMEOUT, K_CAP, K_EXIT, K_TIMED_OUT,
    K_TRUNCATED, K_MS, K_OUT, K_OUT_TOTAL, K_ERR, K_ERR_TOTAL, K_MSG,
    K_NOW, K_SEED, K_NAME, /* ping, for a VM agent (restored from a snapshot) */
    K_OOM,                 /* result, from a VM agent: the guest's OOM killer struck */
    K_ERRNO, K_STREAM, K_PATH, K_TO, K_OFF, K_LEN, K_FLAGS, K_DATA, K_SIZE, K_MTIME,
    K_ENTRIES, K_MORE, K_S, K_TARGET,
    K_IN, K_BG, K_PID, K_SIG, K_GRACE, K_TAIL, K_PROCS, /* stdin, background, processes */
    K_DETACH,              /* exec: still running then, it goes on in the background */
    K_PIPE,                /* exec: a duplex stdio session (hosted MCP servers) */
    K_COUNT
};

#define BIT(k) ((uint64_t)1 << (k))

static const struct {
    const char *name;
    const char *missing;   /* reason when required and absent */
    const char *bad;       /* reason when present with a wrong type or value */
} keys[K_COUNT] = {
    [K_OP] = {"op", "missing key 'op'", "'op' must be one of ping, pong, exec, result, error"},
    [K_ID] = {"id", "missing key 'id'", "'id' must be an unsigned 32-bit integer"},
    [K_V] = {"v", "missing key 'v'", "'v' must be an unsigned 32-bit integer"},
    [K_CMD] = {"cmd", "missing key 'cmd'", "'cmd' must be a non-empty string without NUL bytes"},
    [K_CWD] = {"cwd", "missing key 'cwd'", "'cwd' must be a non-empty string without NUL bytes, at most 4096 bytes"},
    [K_ENV] = {"env", "missing key 'env'", "'env' must be an array of at most 256 \"KEY=VALUE\" strings"},
    [K_TIMEOUT] = {"timeout_ms", "missing key 'timeout_ms'", "'timeout_ms' must be an integer from 1 to 4294967295"},
    [K_CAP] = {"cap", "missing key 'cap'", "'cap' must be an integer from 2 to 262144"},
    [K_EXIT] = {"exit", "missing key 'exit'", "'exit' must be a signed 32-bit integer"},
    [K_TIMED_OUT] = {"timed_out", "missing key 'timed_out'", "'timed_out' must be a boolean"},
    [K_TRUNCATED] = {"truncated", "missing key 'truncated'", "'truncated' must be a boolean"},
    [K_MS] = {"ms", "missing key 'ms'", "'ms' must be an unsigned 32-bit integer"},
    [K_OUT] = {"out", "missing key 'out'", "'out' must be binary of at most 262144 bytes"},
    [K_OUT_TOTAL] = {"out_total", "missing key 'out_total'", "'out_total' must be an unsigned integer not below the length of 'out'"},
    [K_ERR] = {"err", "missing key 'err'", "'err' must be binary of at most 262144 bytes"},
    [K_ERR_TOTAL] = {"err_total", "missing key 'err_total'", "'err_total' must be an unsigned integer not below the length of 'err'"},
    [K_MSG] = {"msg", "missing key 'msg'", "'msg' must be a non-empty string without NUL bytes, at most 4096 bytes"},
    [K_NOW] = {"now", "missing key 'now'", "'now' must be an unsigned integer (Unix time in nanoseconds)"},
    [K_SEED] = {"seed", "missing key 'seed'", "'seed' must be binary of 16 to 256 bytes"},
    [K_NAME] = {"name", "missing key 'name'", "'name' must be a hostname of 1 to 63 bytes ([a-z0-9_-])"},
    [K_OOM] = {"oom_killed", "missing key 'oom_killed'", "'oom_killed' must be a boolean"},
    [K_ERRNO] = {"errno", "missing key 'errno'", "'errno' must be an integer from 1 to 4095"},
    [K_STREAM] = {"stream", "missing key 'stream'", "'stream' must be a boolean"},
    [K_PATH] = {"path", "missing key 'path'", "'path' must be a non-empty string without NUL bytes, at most 4096 bytes"},
    [K_TO] = {"to", "missing key 'to'", "'to' must be a non-empty string without NUL bytes, at most 4096 bytes"},
    [K_OFF] = {"off", "missing key 'off'", "'off' must be an unsigned integer below 2^62"},
    [K_LEN] = {"len", "missing key 'len'", "'len' must be an integer from 1 to 786432"},
    [K_FLAGS] = {"flags", "missing key 'flags'", "'flags' must be an unsigned integer made of the known flag bits"},
    [K_DATA] = {"data", "missing key 'data'", "'data' must be binary of at most 786432 bytes (output: 1 to 65536)"},
    [K_SIZE] = {"size", "missing key 'size'", "'size' must be an unsigned integer below 2^62"},
    [K_MTIME] = {"mtime", "missing key 'mtime'", "'mtime' must be a signed 64-bit integer"},
    [K_ENTRIES] = {"entries", "missing key 'entries'", "'entries' must be an array of at most 4096 [name, type, size, mtime] arrays (name 1-255 bytes without '/', type one of f d l o)"},
    [K_MORE] = {"more", "missing key 'more'", "'more' must be a boolean"},
    [K_S] = {"s", "missing key 's'", "'s' must be 0 (stdout) or 1 (stderr)"},
    [K_TARGET] = {"target", "missing key 'target'", "'target' must be an unsigned 32-bit integer"},
    [K_IN] = {"in", "missing key 'in'", "'in' must be a boolean"},
    [K_BG] = {"bg", "missing key 'bg'", "'bg' must be a boolean"},
    [K_PIPE] = {"pipe", "missing key 'pipe'", "'pipe' must be a boolean"},
    [K_PID] = {"pid", "missing key 'pid'", "'pid' must be an integer from 1 to 4294967295"},
    [K_SIG] = {"sig", "missing key 'sig'", "'sig' must be a signal number from 1 to 64"},
    [K_GRACE] = {"grace_ms", "missing key 'grace_ms'", "'grace_ms' must be an integer from 0 to 600000"},
    [K_TAIL] = {"tail", "missing key 'tail'", "'tail' must be an integer from 1 to 786432"},
    [K_DETACH] = {"detach_ms", "missing key 'detach_ms'", "'detach_ms' must be an integer from 1 to 4294967295"},
    [K_PROCS] = {"procs", "missing key 'procs'", "'procs' must be an array of at most 4096 [pid, cmd, start_ms, cpu_ms, rss_kib, state] arrays (cmd 1-1024 bytes, state one letter)"},
};

static const struct {
    const char *name;
    uint64_t required;
    uint64_t allowed;
} ops[] = {
    [SF_AP_PING] = {"ping", BIT(K_OP) | BIT(K_ID),
                    BIT(K_OP) | BIT(K_ID) | BIT(K_NOW) | BIT(K_SEED) | BIT(K_NAME)},
    [SF_AP_PONG] = {"pong", BIT(K_OP) | BIT(K_ID) | BIT(K_V), BIT(K_OP) | BIT(K_ID) | BIT(K_V)},
    [SF_AP_EXEC] = {"exec",
                    BIT(K_OP) | BIT(K_ID) | BIT(K_CMD) | BIT(K_TIMEOUT) | BIT(K_CAP),
                    BIT(K_OP) | BIT(K_ID) | BIT(K_CMD) | BIT(K_TIMEOUT) | BIT(K_CAP) |
                        BIT(K_CWD) | BIT(K_ENV) | BIT(K_STREAM) | BIT(K_IN) | BIT(K_BG) |
                        BIT(K_DETACH) | BIT(K_PIPE)},
    [SF_AP_RESULT] = {"result",
                      BIT(K_OP) | BIT(K_ID) | BIT(K_EXIT) | BIT(K_TIMED_OUT) |
                          BIT(K_TRUNCATED) | BIT(K_MS) | BIT(K_OUT) | BIT(K_OUT_TOTAL) |
                          BIT(K_ERR) | BIT(K_ERR_TOTAL),
                      BIT(K_OP) | BIT(K_ID) | BIT(K_EXIT) | BIT(K_TIMED_OUT) |
                          BIT(K_TRUNCATED) | BIT(K_MS) | BIT(K_OUT) | BIT(K_OUT_TOTAL) |
                          BIT(K_ERR) | BIT(K_ERR_TOTAL) | BIT(K_OOM) | BIT(K_PID)},
    [SF_AP_ERROR] = {"error", BIT(K_OP) | BIT(K_ID) | BIT(K_MSG),
                     BIT(K_OP) | BIT(K_ID) | BIT(K_MSG) | BIT(K_ERRNO)},
    [SF_AP_FREAD] = {"fread", BIT(K_OP) | BIT(K_ID) | BIT(K_PATH) | BIT(K_OFF) | BIT(K_LEN),
                     BIT(K_OP) | BIT(K_ID) | BIT(K_PATH) | BIT(K_OFF) | BIT(K_LEN) | BIT(K_FLAGS)},
    [SF_AP_DATA] = {"data", BIT(K_OP) | BIT(K_ID) | BIT(K_DATA) | BIT(K_SIZE) | BIT(K_MTIME),
                    BIT(K_OP) | BIT(K_ID) | BIT(K_DATA) | BIT(K_SIZE) | BIT(K_MTIME)},
    [SF_AP_FWRITE] = {"fwrite", BIT(K_OP) | BIT(K_ID) | BIT(K_PATH) | BIT(K_OFF) | BIT(K_DATA),
                      BIT(K_OP) | BIT(K_ID) | BIT(K_PATH) | BIT(K_OFF) | BIT(K_DATA) |
                          BIT(K_FLAGS)},
    [SF_AP_FLIST] = {"flist", BIT(K_OP) | BIT(K_ID) | BIT(K_PATH) | BIT(K_OFF) | BIT(K_LEN),
                     BIT(K_OP) | BIT(K_ID) | BIT(K_PATH) | BIT(K_OFF) | BIT(K_LEN)},
    [SF_AP_ENTRIES] = {"entries", BIT(K_OP) | BIT(K_ID) | BIT(K_ENTRIES) | BIT(K_MORE),
                       BIT(K_OP) | BIT(K_ID) | BIT(K_ENTRIES) | BIT(K_MORE)},
    [SF_AP_FMOVE] = {"fmove", BIT(K_OP) | BIT(K_ID) | BIT(K_PATH) | BIT(K_TO),
                     BIT(K_OP) | BIT(K_ID) | BIT(K_PATH) | BIT(K_TO)},
    [SF_AP_FDEL] = {"fdel", BIT(K_OP) | BIT(K_ID) | BIT(K_PATH), BIT(K_OP) | BIT(K_ID) | BIT(K_PATH)},
    [SF_AP_OK] = {"ok", BIT(K_OP) | BIT(K_ID) | BIT(K_SIZE), BIT(K_OP) | BIT(K_ID) | BIT(K_SIZE)},
    [SF_AP_CANCEL] = {"cancel", BIT(K_OP) | BIT(K_ID) | BIT(K_TARGET),
                      BIT(K_OP) | BIT(K_ID) | BIT(K_TARGET)},
    [SF_AP_OUTPUT] = {"output", BIT(K_OP) | BIT(K_ID) | BIT(K_S) | BIT(K_DATA),
                      BIT(K_OP) | BIT(K_ID) | BIT(K_S) | BIT(K_DATA)},
    [SF_AP_INPUT] = {"input", BIT(K_OP) | BIT(K_ID) | BIT(K_DATA) | BIT(K_MORE),
                     BIT(K_OP) | BIT(K_ID) | BIT(K_DATA) | BIT(K_MORE)},
    [SF_AP_PLIST] = {"plist", BIT(K_OP) | BIT(K_ID), BIT(K_OP) | BIT(K_ID)},
    [SF_AP_PROCS] = {"procs", BIT(K_OP) | BIT(K_ID) | BIT(K_PROCS) | BIT(K_MORE),
                     BIT(K_OP) | BIT(K_ID) | BIT(K_PROCS) | BIT(K_MORE)},
    [SF_AP_PKILL] = {"pkill", BIT(K_OP) | BIT(K_ID) | BIT(K_PID) | BIT(K_SIG),
                     BIT(K_OP) | BIT(K_ID) | BIT(K_PID) | BIT(K_SIG) | BIT(K_GRACE)},
    [SF_AP_PLOGS] = {"plogs", BIT(K_OP) | BIT(K_ID) | BIT(K_PID),
                     BIT(K_OP) | BIT(K_ID) | BIT(K_PID) | BIT(K_OFF) | BIT(K_TAIL)},
    [SF_AP_LOG] = {"log", BIT(K_OP) | BIT(K_ID) | BIT(K_DATA) | BIT(K_SIZE) | BIT(K_OFF),
                   BIT(K_OP) | BIT(K_ID) | BIT(K_DATA) | BIT(K_SIZE) | BIT(K_OFF) | BIT(K_EXIT) |
                       BIT(K_TIMED_OUT)},
};

#define OP_FIRST SF_AP_PING
#define OP_LAST SF_AP_LOG
#define SIZE_MAX_FILE ((uint64_t)1 << 62)
#define FLAGS_ALL (SF_AP_F_NOFOLLOW | SF_AP_F_CREATE | SF_AP_F_MKDIRS | SF_AP_F_EXCL)
#define CWD_MAX 4096

const char *sf_ap_op_name(sf_ap_op op)
{
    if (op < OP_FIRST || op > OP_LAST)
        return "?";
    return ops[op].name;
}

static int set_why(const char **why, const char *reason, int rc)
{
    if (why)
        *why = reason;
    return rc;
}

/* ---- shared value checks (encoder and decoder) ----------------------------- */

static int env_entry_ok(const char *s, size_t n)
{
    const char *eq = memchr(s, '=', n);
    return eq && eq != s && !memchr(s, '\0', n);
}

/* A hostname the agent may set: what sandbox ids are. */
static int name_ok(const char *s, size_t n)
{
    if (n == 0 || n > SF_AP_NAME_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_' ||
              s[i] == '-'))
            return 0;
    return 1;
}

static int path_ok(const char *p)
{
    size_t n = p ? strlen(p) : 0;
    return n > 0 && n <= SF_AP_PATH_MAX;
}

static int entry_name_ok(const char *s, size_t n)
{
    return n > 0 && n <= SF_AP_ENTRY_NAME_MAX && !memchr(s, '/', n) && !memchr(s, '\0', n) &&
           !(n == 1 && s[0] == '.') && !(n == 2 && s[0] == '.' && s[1] == '.');
}

static int entry_type_ok(char t)
{
    return t == 'f' || t == 'd' || t == 'l' || t == 'o';
}

static int proc_ok(uint64_t pid, const char *cmd, size_t n, char state)
{
    return pid > 0 && pid <= UINT32_MAX && n > 0 && n <= SF_AP_CMDLINE_MAX &&
           !memchr(cmd, '\0', n) && state > ' ' && state <= '~';
}

static int validate(const sf_ap_msg *m, const char **why)
{
    size_t n;

    switch (m->op) {
    case SF_AP_PING:
        if (m->seed_len && (m->seed_len < SF_AP_SEED_MIN || m->seed_len > SF_AP_SEED_MAX || !m->seed))
            return set_why(why, keys[K_SEED].bad, -EINVAL);
        if (m->name && !name_ok(m->name, strlen(m->name)))
            return set_why(why, keys[K_NAME].bad, -EINVAL);
        return 0;
    case SF_AP_PONG:
        return 0;
    case SF_AP_EXEC:
        if (!m->cmd || !m->cmd[0])
            return set_why(why, keys[K_CMD].bad, -EINVAL);
        if (m->cwd && (!m->cwd[0] || strlen(m->cwd) > CWD_MAX))
            return set_why(why, keys[K_CWD].bad, -EINVAL);
        if (m->env_n > SF_AP_ENV_MAX || (m->env_n && !m->env))
            return set_why(why, keys[K_ENV].bad, -EINVAL);
        for (size_t i = 0; i < m->env_n; i++)
            if (!m->env[i] || !env_entry_ok(m->env[i], strlen(m->env[i])))
                return set_why(why, keys[K_ENV].bad, -EINVAL);
        if (m->timeout_ms == 0)
            return set_why(why, keys[K_TIMEOUT].bad, -EINVAL);
        if (m->cap < SF_AP_CAP_MIN || m->cap > SF_AP_CAP_MAX)
            return set_why(why, keys[K_CAP].bad, -EINVAL);
        return 0;
    case SF_AP_RESULT:
        if (m->out_len > SF_AP_CAP_MAX || (m->out_len && !m->out))
            return set_why(why, keys[K_OUT].bad, -EINVAL);
        if (m->err_len > SF_AP_CAP_MAX || (m->err_len && !m->err))
            return set_why(why, keys[K_ERR].bad, -EINVAL);
        if (m->out_total < m->out_len)
            return set_why(why, keys[K_OUT_TOTAL].bad, -EINVAL);
        if (m->err_total < m->err_len)
            return set_why(why, keys[K_ERR_TOTAL].bad, -EINVAL);
        return 0;
    case SF_AP_ERROR:
        n = m->msg ? strlen(m->msg) : 0;
        if (n == 0 || n > SF_AP_MSG_MAX)
            return set_why(why, keys[K_MSG].bad, -EINVAL);
        if (m->errnum > 4095)
            return set_why(why, keys[K_ERRNO].bad, -EINVAL);
        return 0;
    case SF_AP_FREAD:
    case SF_AP_FLIST:
        if (!path_ok(m->path))
            return set_why(why, keys[K_PATH].bad, -EINVAL);
        if (m->off >= SIZE_MAX_FILE)
            return set_why(why, keys[K_OFF].bad, -EINVAL);
        if (m->len == 0 || m->len > (m->op == SF_AP_FREAD ? SF_AP_DATA_MAX : SF_AP_ENTRIES_MAX))
            return set_why(why, keys[K_LEN].bad, -EINVAL);
        if (m->flags & ~FLAGS_ALL)
            return set_why(why, keys[K_FLAGS].bad, -EINVAL);
        return 0;
    case SF_AP_FWRITE:
        if (!path_ok(m->path))
            return set_why(why, keys[K_PATH].bad, -EINVAL);
        if (m->off >= SIZE_MAX_FILE)
            return set_why(why, keys[K_OFF].bad, -EINVAL);
        if (m->data_len > SF_AP_DATA_MAX || (m->data_len && !m->data))
            return set_why(why, keys[K_DATA].bad, -EINVAL);
        if (m->flags & ~FLAGS_ALL)
            return set_why(why, keys[K_FLAGS].bad, -EINVAL);
        return 0;
    case SF_AP_DATA:
        if (m->data_len > SF_AP_DATA_MAX || (m->data_len && !m->data))
            return set_why(why, keys[K_DATA].bad, -EINVAL);
        if (m->size >= SIZE_MAX_FILE)
            return set_why(why, keys[K_SIZE].bad, -EINVAL);
        return 0;
    case SF_AP_ENTRIES:
        if (m->n_entries > SF_AP_ENTRIES_MAX || (m->n_entries && !m->entries))
            return set_why(why, keys[K_ENTRIES].bad, -EINVAL);
        for (size_t i = 0; i < m->n_entries; i++)
            if (!m->entries[i].name || !entry_name_ok(m->entries[i].name, strlen(m->entries[i].name)) ||
                !entry_type_ok(m->entries[i].type) || m->entries[i].size >= SIZE_MAX_FILE)
                return set_why(why, keys[K_ENTRIES].bad, -EINVAL);
        return 0;
    case SF_AP_FMOVE:
        if (!path_ok(m->path))
            return set_why(why, keys[K_PATH].bad, -EINVAL);
        if (!path_ok(m->to))
            return set_why(why, keys[K_TO].bad, -EINVAL);
        return 0;
    case SF_AP_FDEL:
        if (!path_ok(m->path))
            return set_why(why, keys[K_PATH].bad, -EINVAL);
        return 0;
    case SF_AP_OK:
        if (m->size >= SIZE_MAX_FILE)
            return set_why(why, keys[K_SIZE].bad, -EINVAL);
        return 0;
    case SF_AP_CANCEL:
        return 0;
    case SF_AP_OUTPUT:
        if (m->s > 1)
            return set_why(why, keys[K_S].bad, -EINVAL);
        if (m->data_len == 0 || m->data_len > SF_AP_OUTPUT_MAX || !m->data)
            return set_why(why, keys[K_DATA].bad, -EINVAL);
        return 0;
    case SF_AP_INPUT:
    case SF_AP_LOG:
        if (m->data_len > SF_AP_DATA_MAX || (m->data_len && !m->data))
            return set_why(why, keys[K_DATA].bad, -EINVAL);
        if (m->op == SF_AP_LOG && (m->off >= SIZE_MAX_FILE || m->size > m->off))
            return set_why(why, keys[K_OFF].bad, -EINVAL);
        return 0;
    case SF_AP_PLIST:
        return 0;
    case SF_AP_PROCS:
        if (m->n_procs > SF_AP_PROCS_MAX || (m->n_procs && !m->procs))
            return set_why(why, keys[K_PROCS].bad, -EINVAL);
        for (size_t i = 0; i < m->n_procs; i++)
            if (!m->procs[i].cmd || !proc_ok(m->procs[i].pid, m->procs[i].cmd,
                                             strlen(m->procs[i].cmd), m->procs[i].state))
                return set_why(why, keys[K_PROCS].bad, -EINVAL);
        return 0;
    case SF_AP_PKILL:
    case SF_AP_PLOGS:
        if (m->pid == 0)
            return set_why(why, keys[K_PID].bad, -EINVAL);
        if (m->op == SF_AP_PKILL && (m->sig == 0 || m->sig > 64))
            return set_why(why, keys[K_SIG].bad, -EINVAL);
        if (m->grace_ms > SF_AP_GRACE_MAX)
            return set_why(why, keys[K_GRACE].bad, -EINVAL);
        if (m->tail > SF_AP_DATA_MAX)
            return set_why(why, keys[K_TAIL].bad, -EINVAL);
        if (m->off >= SIZE_MAX_FILE)
            return set_why(why, keys[K_OFF].bad, -EINVAL);
        return 0;
    }
    return set_why(why, keys[K_OP].bad, -EINVAL);
}

/* ---- encoder ------------------------------------------------------------- */

typedef struct enc {
    sf_buf *b;
    int rc;
} enc;

static int enc_write(void *data, const char *p, size_t n)
{
    enc *e = data;
    int rc = sf_buf_append(e->b, p, n);
    if (rc < 0 && e->rc == 0)
        e->rc = rc;
    return rc < 0 ? -1 : 0;
}

static void pack_key(msgpack_packer *pk, int k)
{
    msgpack_pack_str_with_body(pk, keys[k].name, strlen(keys[k].name));
}

static void pack_cstr(msgpack_packer *pk, int k, const char *s)
{
    pack_key(pk, k);
    msgpack_pack_str_with_body(pk, s, strlen(s));
}

static void pack_u64(msgpack_packer *pk, int k, uint64_t v)
{
    pack_key(pk, k);
    msgpack_pack_uint64(pk, v);
}

static void pack_bool(msgpack_packer *pk, int k, int v)
{
    pack_key(pk, k);
    if (v)
        msgpack_pack_true(pk);
    else
        msgpack_pack_false(pk);
}

static void pack_bin(msgpack_packer *pk, int k, const char *p, size_t n)
{
    pack_key(pk, k);
    msgpack_pack_bin(pk, n);
    if (n)
        msgpack_pack_bin_body(pk, p, n);
}

static void pack_body(msgpack_packer *pk, const sf_ap_msg *m)
{
    size_t n = 2;

    switch (m->op) {
    case SF_AP_PING:
        n += (m->now_ns != 0) + (m->seed_len > 0) + (m->name != NULL);
        break;
    case SF_AP_PONG:
        n += 1;
        break;
    case SF_AP_EXEC:
        n += 3 + (m->cwd != NULL) + (m->env_n > 0);
        break;
    case SF_AP_RESULT:
        n += 8 + (m->oom_killed != 0);
        break;
    case SF_AP_ERROR:
        n += 1 + (m->errnum != 0);
        break;
    case SF_AP_FREAD:
        n += 3 + (m->flags != 0);
        break;
    case SF_AP_DATA:
        n += 3;
        break;
    case SF_AP_FWRITE:
        n += 3 + (m->flags != 0);
        break;
    case SF_AP_FLIST:
        n += 3;
        break;
    case SF_AP_ENTRIES:
    case SF_AP_FMOVE:
    case SF_AP_OUTPUT:
        n += 2;
        break;
    case SF_AP_FDEL:
    case SF_AP_OK:
    case SF_AP_CANCEL:
        n += 1;
        break;
    case SF_AP_INPUT:
    case SF_AP_PROCS:
        n += 2;
        break;
    case SF_AP_PLIST:
        break;
    case SF_AP_PKILL:
        n += 2 + (m->grace_ms != 0);
        break;
    case SF_AP_PLOGS:
        n += 1 + (m->has_off != 0) + (m->tail != 0);
        break;
    case SF_AP_LOG:
        n += 3 + (m->exited != 0) + (m->exited && m->timed_out);
        break;
    }
    if (m->op == SF_AP_EXEC)
        n += (m->stream != 0) + (m->in != 0) + (m->bg != 0) + (m->detach_ms != 0) +
             (m->pipe != 0);
    if (m->op == SF_AP_RESULT)
        n += m->pid != 0;
    msgpack_pack_map(pk, n);
    pack_cstr(pk, K_OP, ops[m->op].name);
    pack_u64(pk, K_ID, m->id);
    switch (m->op) {
    case SF_AP_PING:
        if (m->now_ns)
            pack_u64(pk, K_NOW, m->now_ns);
        if (m->seed_len)
            pack_bin(pk, K_SEED, m->seed, m->seed_len);
        if (m->name)
            pack_cstr(pk, K_NAME, m->name);
        break;
    case SF_AP_PONG:
        pack_u64(pk, K_V, m->version);
        break;
    case SF_AP_EXEC:
        pack_cstr(pk, K_CMD, m->cmd);
        pack_u64(pk, K_TIMEOUT, m->timeout_ms);
        pack_u64(pk, K_CAP, m->cap);
        if (m->cwd)
            pack_cstr(pk, K_CWD, m->cwd);
        if (m->env_n > 0) {
            pack_key(pk, K_ENV);
            msgpack_pack_array(pk, m->env_n);
            for (size_t i = 0; i < m->env_n; i++)
                msgpack_pack_str_with_body(pk, m->env[i], strlen(m->env[i]));
        }
        if (m->stream)
            pack_bool(pk, K_STREAM, 1);
        if (m->in)
            pack_bool(pk, K_IN, 1);
        if (m->bg)
            pack_bool(pk, K_BG, 1);
        if (m->detach_ms)
            pack_u64(pk, K_DETACH, m->detach_ms);
        if (m->pipe)
            pack_bool(pk, K_PIPE, 1);
        break;
    case SF_AP_RESULT:
        pack_key(pk, K_EXIT);
        msgpack_pack_int32(pk, m->exit_code);
        pack_bool(pk, K_TIMED_OUT, m->timed_out);
        pack_bool(pk, K_TRUNCATED, m->truncated);
        pack_u64(pk, K_MS, m->duration_ms);
        pack_bin(pk, K_OUT, m->out, m->out_len);
        pack_u64(pk, K_OUT_TOTAL, m->out_total);
        pack_bin(pk, K_ERR, m->err, m->err_len);
        pack_u64(pk, K_ERR_TOTAL, m->err_total);
        if (m->oom_killed)
            pack_bool(pk, K_OOM, 1);
        if (m->pid)
            pack_u64(pk, K_PID, m->pid);
        break;
    case SF_AP_ERROR:
        pack_cstr(pk, K_MSG, m->msg);
        if (m->errnum)
            pack_u64(pk, K_ERRNO, m->errnum);
        break;
    case SF_AP_FREAD:
    case SF_AP_FLIST:
        pack_cstr(pk, K_PATH, m->path);
        pack_u64(pk, K_OFF, m->off);
        pack_u64(pk, K_LEN, m->len);
        if (m->op == SF_AP_FREAD && m->flags)
            pack_u64(pk, K_FLAGS, m->flags);
        break;
    case SF_AP_DATA:
        pack_bin(pk, K_DATA, m->data, m->data_len);
        pack_u64(pk, K_SIZE, m->size);
        pack_key(pk, K_MTIME);
        msgpack_pack_int64(pk, m->mtime);
        break;
    case SF_AP_FWRITE:
        pack_cstr(pk, K_PATH, m->path);
        pack_u64(pk, K_OFF, m->off);
        pack_bin(pk, K_DATA, m->data, m->data_len);
        if (m->flags)
            pack_u64(pk, K_FLAGS, m->flags);
        break;
    case SF_AP_ENTRIES:
        pack_key(pk, K_ENTRIES);
        msgpack_pack_array(pk, m->n_entries);
        for (size_t i = 0; i < m->n_entries; i++) {
            const sf_ap_entry *e = &m->entries[i];
            msgpack_pack_array(pk, 4);
            msgpack_pack_str_with_body(pk, e->name, strlen(e->name));
            msgpack_pack_str_with_body(pk, &e->type, 1);
            msgpack_pack_uint64(pk, e->size);
            msgpack_pack_int64(pk, e->mtime);
        }
        pack_bool(pk, K_MORE, m->more);
        break;
    case SF_AP_FMOVE:
        pack_cstr(pk, K_PATH, m->path);
        pack_cstr(pk, K_TO, m->to);
        break;
    case SF_AP_FDEL:
        pack_cstr(pk, K_PATH, m->path);
        break;
    case SF_AP_OK:
        pack_u64(pk, K_SIZE, m->size);
        break;
    case SF_AP_CANCEL:
        pack_u64(pk, K_TARGET, m->target);
        break;
    case SF_AP_OUTPUT:
        pack_u64(pk, K_S, m->s);
        pack_bin(pk, K_DATA, m->data, m->data_len);
        break;
    case SF_AP_INPUT:
        pack_bin(pk, K_DATA, m->data, m->data_len);
        pack_bool(pk, K_MORE, m->more);
        break;
    case SF_AP_PLIST:
        break;
    case SF_AP_PROCS:
        pack_key(pk, K_PROCS);
        msgpack_pack_array(pk, m->n_procs);
        for (size_t i = 0; i < m->n_procs; i++) {
            const sf_ap_proc *p = &m->procs[i];
            msgpack_pack_array(pk, 6);
            msgpack_pack_uint32(pk, p->pid);
            msgpack_pack_str_with_body(pk, p->cmd, strlen(p->cmd));
            msgpack_pack_uint64(pk, p->start_ms);
            msgpack_pack_uint64(pk, p->cpu_ms);
            msgpack_pack_uint64(pk, p->rss_kib);
            msgpack_pack_str_with_body(pk, &p->state, 1);
        }
        pack_bool(pk, K_MORE, m->more);
        break;
    case SF_AP_PKILL:
        pack_u64(pk, K_PID, m->pid);
        pack_u64(pk, K_SIG, m->sig);
        if (m->grace_ms)
            pack_u64(pk, K_GRACE, m->grace_ms);
        break;
    case SF_AP_PLOGS:
        pack_u64(pk, K_PID, m->pid);
        if (m->has_off)
            pack_u64(pk, K_OFF, m->off);
        if (m->tail)
            pack_u64(pk, K_TAIL, m->tail);
        break;
    case SF_AP_LOG:
        pack_bin(pk, K_DATA, m->data, m->data_len);
        pack_u64(pk, K_SIZE, m->size);
        pack_u64(pk, K_OFF, m->off);
        if (m->exited) {
            pack_key(pk, K_EXIT);
            msgpack_pack_int32(pk, m->exit_code);
        }
        if (m->exited && m->timed_out)
            pack_bool(pk, K_TIMED_OUT, 1);
        break;
    }
}

int sf_ap_encode(sf_buf *out, const sf_ap_msg *m, const char **why)
{
    static const char zero[SF_AP_HDR_LEN];
    size_t start = out->len, plen;
    msgpack_packer pk;
    enc e = {out, 0};
    int rc;

    if ((rc = validate(m, why)) < 0)
        return rc;
    if ((rc = sf_buf_append(out, zero, sizeof(zero))) < 0)
        return rc;
    msgpack_packer_init(&pk, &e, enc_write);
    pack_body(&pk, m);
    rc = e.rc;
    plen = out->len - start - SF_AP_HDR_LEN;
    if (rc == 0 && plen > SF_AP_FRAME_MAX)
        rc = set_why(why, "the message is larger than the 1 MiB frame limit", -EMSGSIZE);
    if (rc < 0) {
        out->len = start;
        if (out->p)
            out->p[start] = '\0';
        return rc;
    }
    out->p[start] = (char)(plen >> 24);
    out->p[start + 1] = (char)(plen >> 16);
    out->p[start + 2] = (char)(plen >> 8);
    out->p[start + 3] = (char)plen;
    return 0;
}

/* ---- framing ------------------------------------------------------------- */

int sf_ap_frame_check(const void *buf, size_t len, size_t *frame_len, const char **why)
{
    const unsigned char *p = buf;
    uint32_t n;

    *frame_len = 0;
    if (len < SF_AP_HDR_LEN)
        return 0;
    n = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
    if (n == 0)
        return set_why(why, "frame with an empty payload", -EMSGSIZE);
    if (n > SF_AP_FRAME_MAX)
        return set_why(why, "frame larger than the 1 MiB limit", -EMSGSIZE);
    if (len - SF_AP_HDR_LEN >= n)
        *frame_len = SF_AP_HDR_LEN + (size_t)n;
    return 0;
}

/* ---- decoder ------------------------------------------------------------- */

/* Nesting allowed below the frame's map (env is an array inside it); values in one
 * frame. Checked on the raw bytes before msgpack-c allocates (sf_mpscan.h). */
#define MP_DEPTH_MAX 4
#define MP_VALUES_MAX 65536

static int key_index(const msgpack_object *k)
{
    if (k->type != MSGPACK_OBJECT_STR)
        return -1;
    for (int i = 0; i < K_COUNT; i++)
        if (strlen(keys[i].name) == k->via.str.size &&
            memcmp(keys[i].name, k->via.str.ptr, k->via.str.size) == 0)
            return i;
    return -2;
}

static int get_uint(const msgpack_object *o, uint64_t max, uint64_t *out)
{
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > max)
        return -1;
    *out = o->via.u64;
    return 0;
}

static int get_int(const msgpack_object *o, int64_t *out)
{
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= INT64_MAX)
        *out = (int64_t)o->via.u64;
    else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        *out = o->via.i64;
    else
        return -1;
    return 0;
}

static int str_ok(const msgpack_object *o, size_t max)
{
    return o->type == MSGPACK_OBJECT_STR && o->via.str.size > 0 && o->via.str.size <= max &&
           !memchr(o->via.str.ptr, '\0', o->via.str.size);
}

/* Bump allocator over one block sized exactly for the message. */
typedef struct arena {
    char *p;
    size_t used;
} arena;

static const char *arena_str(arena *a, const char *s, size_t n)
{
    char *d = a->p + a->used;
    if (n)
        memcpy(d, s, n);
    d[n] = '\0';
    a->used += n + 1;
    return d;
}

static int decode_map(const msgpack_object *root, sf_ap_msg *m, const char **why)
{
    const msgpack_object *v[K_COUNT] = {0};
    uint64_t seen = 0;
    uint64_t u;
    size_t need, nenv = 0, nent = 0, nproc = 0;
    arena a;
    int op = 0;

    if (root->type != MSGPACK_OBJECT_MAP)
        return set_why(why, "the frame is not a msgpack map", -EBADMSG);
    for (uint32_t i = 0; i < root->via.map.size; i++) {
        const msgpack_object_kv *kv = &root->via.map.ptr[i];
        int k = key_index(&kv->key);
        if (k == -1)
            return set_why(why, "map keys must be strings", -EBADMSG);
        if (k == -2)
            return set_why(why, "unknown key in map", -EBADMSG);
        if (seen & BIT(k))
            return set_why(why, "duplicate key in map", -EBADMSG);
        seen |= BIT(k);
        v[k] = &kv->val;
    }
    if (v[K_ID] && get_uint(v[K_ID], UINT32_MAX, &u) == 0)
        m->id = (uint32_t)u;
    if (!v[K_OP])
        return set_why(why, keys[K_OP].missing, -EBADMSG);
    if (v[K_OP]->type == MSGPACK_OBJECT_STR)
        for (int o = OP_FIRST; o <= OP_LAST; o++)
            if (strlen(ops[o].name) == v[K_OP]->via.str.size &&
                memcmp(ops[o].name, v[K_OP]->via.str.ptr, v[K_OP]->via.str.size) == 0)
                op = o;
    if (!op)
        return set_why(why, "unknown op (see schemas/agent-protocol.md)", -EBADMSG);
    m->op = (sf_ap_op)op;
    if (seen & ~ops[op].allowed)
        return set_why(why, "key not allowed for this op", -EBADMSG);
    for (int k = 0; k < K_COUNT; k++)
        if ((ops[op].required & BIT(k)) && !v[k])
            return set_why(why, keys[k].missing, -EBADMSG);

    /* Types and ranges; sum the storage the strings need. */
    need = 0;
    if (get_uint(v[K_ID], UINT32_MAX, &u) < 0)
        return set_why(why, keys[K_ID].bad, -EBADMSG);
    if (v[K_V]) {
        if (get_uint(v[K_V], UINT32_MAX, &u) < 0)
            return set_why(why, keys[K_V].bad, -EBADMSG);
        m->version = (uint32_t)u;
    }
    if (v[K_CMD]) {
        if (!str_ok(v[K_CMD], SF_AP_FRAME_MAX))
            return set_why(why, keys[K_CMD].bad, -EBADMSG);
        need += v[K_CMD]->via.str.size + 1;
    }
    if (v[K_CWD]) {
        if (!str_ok(v[K_CWD], CWD_MAX))
            return set_why(why, keys[K_CWD].bad, -EBADMSG);
        need += v[K_CWD]->via.str.size + 1;
    }
    if (v[K_ENV]) {
        const msgpack_object_array *arr = &v[K_ENV]->via.array;
        if (v[K_ENV]->type != MSGPACK_OBJECT_ARRAY || arr->size > SF_AP_ENV_MAX)
            return set_why(why, keys[K_ENV].bad, -EBADMSG);
        for (uint32_t i = 0; i < arr->size; i++) {
            const msgpack_object *e = &arr->ptr[i];
            if (e->type != MSGPACK_OBJECT_STR || !env_entry_ok(e->via.str.ptr, e->via.str.size))
                return set_why(why, keys[K_ENV].bad, -EBADMSG);
            need += e->via.str.size + 1;
        }
        nenv = arr->size;
        need += (nenv + 1) * sizeof(char *);
    }
    if (v[K_TIMEOUT]) {
        if (get_uint(v[K_TIMEOUT], UINT32_MAX, &u) < 0 || u == 0)
            return set_why(why, keys[K_TIMEOUT].bad, -EBADMSG);
        m->timeout_ms = (uint32_t)u;
    }
    if (v[K_CAP]) {
        if (get_uint(v[K_CAP], SF_AP_CAP_MAX, &u) < 0 || u < SF_AP_CAP_MIN)
            return set_why(why, keys[K_CAP].bad, -EBADMSG);
        m->cap = (uint32_t)u;
    }
    if (v[K_EXIT]) {
        const msgpack_object *o = v[K_EXIT];
        if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= INT32_MAX)
            m->exit_code = (int32_t)o->via.u64;
        else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER && o->via.i64 >= INT32_MIN)
            m->exit_code = (int32_t)o->via.i64;
        else
            return set_why(why, keys[K_EXIT].bad, -EBADMSG);
    }
    if (v[K_TIMED_OUT]) {
        if (v[K_TIMED_OUT]->type != MSGPACK_OBJECT_BOOLEAN)
            return set_why(why, keys[K_TIMED_OUT].bad, -EBADMSG);
        m->timed_out = v[K_TIMED_OUT]->via.boolean;
    }
    if (v[K_TRUNCATED]) {
        if (v[K_TRUNCATED]->type != MSGPACK_OBJECT_BOOLEAN)
            return set_why(why, keys[K_TRUNCATED].bad, -EBADMSG);
        m->truncated = v[K_TRUNCATED]->via.boolean;
    }
    if (v[K_OOM]) {
        if (v[K_OOM]->type != MSGPACK_OBJECT_BOOLEAN)
            return set_why(why, keys[K_OOM].bad, -EBADMSG);
        m->oom_killed = v[K_OOM]->via.boolean;
    }
    if (v[K_MS]) {
        if (get_uint(v[K_MS], UINT32_MAX, &u) < 0)
            return set_why(why, keys[K_MS].bad, -EBADMSG);
        m->duration_ms = (uint32_t)u;
    }
    if (v[K_OUT]) {
        if (v[K_OUT]->type != MSGPACK_OBJECT_BIN || v[K_OUT]->via.bin.size > SF_AP_CAP_MAX)
            return set_why(why, keys[K_OUT].bad, -EBADMSG);
        if (get_uint(v[K_OUT_TOTAL], UINT64_MAX, &m->out_total) < 0 ||
            m->out_total < v[K_OUT]->via.bin.size)
            return set_why(why, keys[K_OUT_TOTAL].bad, -EBADMSG);
        need += v[K_OUT]->via.bin.size + 1;
    }
    if (v[K_ERR]) {
        if (v[K_ERR]->type != MSGPACK_OBJECT_BIN || v[K_ERR]->via.bin.size > SF_AP_CAP_MAX)
            return set_why(why, keys[K_ERR].bad, -EBADMSG);
        if (get_uint(v[K_ERR_TOTAL], UINT64_MAX, &m->err_total) < 0 ||
            m->err_total < v[K_ERR]->via.bin.size)
            return set_why(why, keys[K_ERR_TOTAL].bad, -EBADMSG);
        need += v[K_ERR]->via.bin.size + 1;
    }
    if (v[K_MSG]) {
        if (!str_ok(v[K_MSG], SF_AP_MSG_MAX))
            return set_why(why, keys[K_MSG].bad, -EBADMSG);
        need += v[K_MSG]->via.str.size + 1;
    }
    if (v[K_NOW] && (get_uint(v[K_NOW], UINT64_MAX, &m->now_ns) < 0 || m->now_ns == 0))
        return set_why(why, keys[K_NOW].bad, -EBADMSG);
    if (v[K_SEED]) {
        if (v[K_SEED]->type != MSGPACK_OBJECT_BIN || v[K_SEED]->via.bin.size < SF_AP_SEED_MIN ||
            v[K_SEED]->via.bin.size > SF_AP_SEED_MAX)
            return set_why(why, keys[K_SEED].bad, -EBADMSG);
        need += v[K_SEED]->via.bin.size + 1;
    }
    if (v[K_NAME]) {
        if (v[K_NAME]->type != MSGPACK_OBJECT_STR ||
            !name_ok(v[K_NAME]->via.str.ptr, v[K_NAME]->via.str.size))
            return set_why(why, keys[K_NAME].bad, -EBADMSG);
        need += v[K_NAME]->via.str.size + 1;
    }

    if (v[K_ERRNO]) {
        if (get_uint(v[K_ERRNO], 4095, &u) < 0 || u == 0)
            return set_why(why, keys[K_ERRNO].bad, -EBADMSG);
        m->errnum = (uint32_t)u;
    }
    if (v[K_STREAM]) {
        if (v[K_STREAM]->type != MSGPACK_OBJECT_BOOLEAN)
            return set_why(why, keys[K_STREAM].bad, -EBADMSG);
        m->stream = v[K_STREAM]->via.boolean;
    }
    if (v[K_MORE]) {
        if (v[K_MORE]->type != MSGPACK_OBJECT_BOOLEAN)
            return set_why(why, keys[K_MORE].bad, -EBADMSG);
        m->more = v[K_MORE]->via.boolean;
    }
    if (v[K_PATH]) {
        if (!str_ok(v[K_PATH], SF_AP_PATH_MAX))
            return set_why(why, keys[K_PATH].bad, -EBADMSG);
        need += v[K_PATH]->via.str.size + 1;
    }
    if (v[K_TO]) {
        if (!str_ok(v[K_TO], SF_AP_PATH_MAX))
            return set_why(why, keys[K_TO].bad, -EBADMSG);
        need += v[K_TO]->via.str.size + 1;
    }
    if (v[K_OFF]) {
        if (get_uint(v[K_OFF], SIZE_MAX_FILE - 1, &m->off) < 0)
            return set_why(why, keys[K_OFF].bad, -EBADMSG);
    }
    if (v[K_LEN]) {
        uint64_t max = op == SF_AP_FREAD ? SF_AP_DATA_MAX : SF_AP_ENTRIES_MAX;
        if (get_uint(v[K_LEN], max, &u) < 0 || u == 0)
            return set_why(why, keys[K_LEN].bad, -EBADMSG);
        m->len = (uint32_t)u;
    }
    if (v[K_FLAGS]) {
        if (get_uint(v[K_FLAGS], UINT32_MAX, &u) < 0 || (u & ~(uint64_t)FLAGS_ALL))
            return set_why(why, keys[K_FLAGS].bad, -EBADMSG);
        m->flags = (uint32_t)u;
    }
    if (v[K_DATA]) {
        size_t max = op == SF_AP_OUTPUT ? SF_AP_OUTPUT_MAX : SF_AP_DATA_MAX;
        if (v[K_DATA]->type != MSGPACK_OBJECT_BIN || v[K_DATA]->via.bin.size > max ||
            (op == SF_AP_OUTPUT && v[K_DATA]->via.bin.size == 0))
            return set_why(why, keys[K_DATA].bad, -EBADMSG);
        need += v[K_DATA]->via.bin.size + 1;
    }
    if (v[K_SIZE] && get_uint(v[K_SIZE], SIZE_MAX_FILE - 1, &m->size) < 0)
        return set_why(why, keys[K_SIZE].bad, -EBADMSG);
    if (v[K_MTIME] && get_int(v[K_MTIME], &m->mtime) < 0)
        return set_why(why, keys[K_MTIME].bad, -EBADMSG);
    if (v[K_S]) {
        if (get_uint(v[K_S], 1, &u) < 0)
            return set_why(why, keys[K_S].bad, -EBADMSG);
        m->s = (uint32_t)u;
    }
    if (v[K_TARGET]) {
        if (get_uint(v[K_TARGET], UINT32_MAX, &u) < 0)
            return set_why(why, keys[K_TARGET].bad, -EBADMSG);
        m->target = (uint32_t)u;
    }
    if (v[K_IN]) {
        if (v[K_IN]->type != MSGPACK_OBJECT_BOOLEAN)
            return set_why(why, keys[K_IN].bad, -EBADMSG);
        m->in = v[K_IN]->via.boolean;
    }
    if (v[K_BG]) {
        if (v[K_BG]->type != MSGPACK_OBJECT_BOOLEAN)
            return set_why(why, keys[K_BG].bad, -EBADMSG);
        m->bg = v[K_BG]->via.boolean;
    }
    if (v[K_PIPE]) {
        if (v[K_PIPE]->type != MSGPACK_OBJECT_BOOLEAN)
            return set_why(why, keys[K_PIPE].bad, -EBADMSG);
        m->pipe = v[K_PIPE]->via.boolean;
    }
    if (v[K_PID]) {
        if (get_uint(v[K_PID], UINT32_MAX, &u) < 0 || u == 0)
            return set_why(why, keys[K_PID].bad, -EBADMSG);
        m->pid = (uint32_t)u;
    }
    if (v[K_SIG]) {
        if (get_uint(v[K_SIG], 64, &u) < 0 || u == 0)
            return set_why(why, keys[K_SIG].bad, -EBADMSG);
        m->sig = (uint32_t)u;
    }
    if (v[K_GRACE]) {
        if (get_uint(v[K_GRACE], SF_AP_GRACE_MAX, &u) < 0)
            return set_why(why, keys[K_GRACE].bad, -EBADMSG);
        m->grace_ms = (uint32_t)u;
    }
    if (v[K_DETACH]) {
        if (get_uint(v[K_DETACH], UINT32_MAX, &u) < 0 || u == 0)
            return set_why(why, keys[K_DETACH].bad, -EBADMSG);
        m->detach_ms = (uint32_t)u;
    }
    if (v[K_TAIL]) {
        if (get_uint(v[K_TAIL], SF_AP_DATA_MAX, &u) < 0 || u == 0)
            return set_why(why, keys[K_TAIL].bad, -EBADMSG);
        m->tail = (uint32_t)u;
    }
    m->has_off = v[K_OFF] != NULL;
    if (op == SF_AP_LOG) {
        if (m->size > m->off)
            return set_why(why, keys[K_OFF].bad, -EBADMSG);
        m->exited = v[K_EXIT] != NULL;
    }
    if (v[K_PROCS]) {
        const msgpack_object_array *arr = &v[K_PROCS]->via.array;
        if (v[K_PROCS]->type != MSGPACK_OBJECT_ARRAY || arr->size > SF_AP_PROCS_MAX)
            return set_why(why, keys[K_PROCS].bad, -EBADMSG);
        for (uint32_t i = 0; i < arr->size; i++) {
            const msgpack_object *e = &arr->ptr[i], *f;
            uint64_t x;
            if (e->type != MSGPACK_OBJECT_ARRAY || e->via.array.size != 6)
                return set_why(why, keys[K_PROCS].bad, -EBADMSG);
            f = e->via.array.ptr;
            if (get_uint(&f[0], UINT32_MAX, &x) < 0 || f[1].type != MSGPACK_OBJECT_STR ||
                f[5].type != MSGPACK_OBJECT_STR || f[5].via.str.size != 1 ||
                !proc_ok(x, f[1].via.str.ptr, f[1].via.str.size, f[5].via.str.ptr[0]) ||
                get_uint(&f[2], UINT64_MAX, &x) < 0 || get_uint(&f[3], UINT64_MAX, &x) < 0 ||
                get_uint(&f[4], UINT64_MAX, &x) < 0)
                return set_why(why, keys[K_PROCS].bad, -EBADMSG);
            need += f[1].via.str.size + 1;
        }
        nproc = arr->size;
        need += nproc * sizeof(sf_ap_proc);
    }
    if (v[K_ENTRIES]) {
        const msgpack_object_array *arr = &v[K_ENTRIES]->via.array;
        if (v[K_ENTRIES]->type != MSGPACK_OBJECT_ARRAY || arr->size > SF_AP_ENTRIES_MAX)
            return set_why(why, keys[K_ENTRIES].bad, -EBADMSG);
        for (uint32_t i = 0; i < arr->size; i++) {
            const msgpack_object *e = &arr->ptr[i], *f;
            uint64_t sz;
            int64_t mt;
            if (e->type != MSGPACK_OBJECT_ARRAY || e->via.array.size != 4)
                return set_why(why, keys[K_ENTRIES].bad, -EBADMSG);
            f = e->via.array.ptr;
            if (f[0].type != MSGPACK_OBJECT_STR ||
                !entry_name_ok(f[0].via.str.ptr, f[0].via.str.size) ||
                f[1].type != MSGPACK_OBJECT_STR || f[1].via.str.size != 1 ||
                !entry_type_ok(f[1].via.str.ptr[0]) ||
                get_uint(&f[2], SIZE_MAX_FILE - 1, &sz) < 0 || get_int(&f[3], &mt) < 0)
                return set_why(why, keys[K_ENTRIES].bad, -EBADMSG);
            need += f[0].via.str.size + 1;
        }
        nent = arr->size;
        need += nent * sizeof(sf_ap_entry);
    }

    /* Copy the strings out of the msgpack zone: the arrays first (aligned). */
    a.p = malloc(need ? need : 1);
    a.used = 0;
    if (!a.p)
        return set_why(why, "out of memory", -ENOMEM);
    m->mem_ = a.p;
    if (v[K_ENTRIES]) {
        sf_ap_entry *ents = (sf_ap_entry *)(void *)a.p;
        a.used = nent * sizeof(sf_ap_entry);
        for (size_t i = 0; i < nent; i++) {
            const msgpack_object *f = v[K_ENTRIES]->via.array.ptr[i].via.array.ptr;
            uint64_t sz = 0;
            int64_t mt = 0;
            get_uint(&f[2], SIZE_MAX_FILE - 1, &sz);
            get_int(&f[3], &mt);
            ents[i].name = arena_str(&a, f[0].via.str.ptr, f[0].via.str.size);
            ents[i].type = f[1].via.str.ptr[0];
            ents[i].size = sz;
            ents[i].mtime = mt;
        }
        m->entries = ents;
        m->n_entries = nent;
    }
    if (v[K_PROCS]) { /* procs only: the block's start is free */
        sf_ap_proc *procs = (sf_ap_proc *)(void *)a.p;
        a.used = nproc * sizeof(sf_ap_proc);
        for (size_t i = 0; i < nproc; i++) {
            const msgpack_object *f = v[K_PROCS]->via.array.ptr[i].via.array.ptr;
            procs[i].pid = (uint32_t)f[0].via.u64;
            procs[i].cmd = arena_str(&a, f[1].via.str.ptr, f[1].via.str.size);
            procs[i].start_ms = f[2].via.u64;
            procs[i].cpu_ms = f[3].via.u64;
            procs[i].rss_kib = f[4].via.u64;
            procs[i].state = f[5].via.str.ptr[0];
        }
        m->procs = procs;
        m->n_procs = nproc;
    }
    if (v[K_ENV]) { /* never with entries (exec only): the block's start is free */
        const char **env = (const char **)(void *)a.p;
        a.used = (nenv + 1) * sizeof(char *);
        for (size_t i = 0; i < nenv; i++) {
            const msgpack_object *e = &v[K_ENV]->via.array.ptr[i];
            env[i] = arena_str(&a, e->via.str.ptr, e->via.str.size);
        }
        env[nenv] = NULL;
        m->env = env;
        m->env_n = nenv;
    }
    if (v[K_CMD])
        m->cmd = arena_str(&a, v[K_CMD]->via.str.ptr, v[K_CMD]->via.str.size);
    if (v[K_CWD])
        m->cwd = arena_str(&a, v[K_CWD]->via.str.ptr, v[K_CWD]->via.str.size);
    if (v[K_OUT]) {
        m->out_len = v[K_OUT]->via.bin.size;
        m->out = arena_str(&a, v[K_OUT]->via.bin.ptr, m->out_len);
    }
    if (v[K_ERR]) {
        m->err_len = v[K_ERR]->via.bin.size;
        m->err = arena_str(&a, v[K_ERR]->via.bin.ptr, m->err_len);
    }
    if (v[K_MSG])
        m->msg = arena_str(&a, v[K_MSG]->via.str.ptr, v[K_MSG]->via.str.size);
    if (v[K_SEED]) {
        m->seed_len = v[K_SEED]->via.bin.size;
        m->seed = arena_str(&a, v[K_SEED]->via.bin.ptr, m->seed_len);
    }
    if (v[K_NAME])
        m->name = arena_str(&a, v[K_NAME]->via.str.ptr, v[K_NAME]->via.str.size);
    if (v[K_PATH])
        m->path = arena_str(&a, v[K_PATH]->via.str.ptr, v[K_PATH]->via.str.size);
    if (v[K_TO])
        m->to = arena_str(&a, v[K_TO]->via.str.ptr, v[K_TO]->via.str.size);
    if (v[K_DATA]) {
        m->data_len = v[K_DATA]->via.bin.size;
        m->data = arena_str(&a, v[K_DATA]->via.bin.ptr, m->data_len);
    }
    return 0;
}

int sf_ap_decode(const void *payload, size_t len, sf_ap_msg *m, const char **why)
{
    msgpack_unpacked u;
    size_t off = 0;
    int rc;

    memset(m, 0, sizeof(*m));
    if (len == 0)
        return set_why(why, "empty payload", -EBADMSG);
    if (len > SF_AP_FRAME_MAX)
        return set_why(why, "frame larger than the 1 MiB limit", -EMSGSIZE);
    if (sf_mpscan_value(payload, len, MP_DEPTH_MAX, MP_VALUES_MAX, &off, NULL) < 0)
        return set_why(why, "malformed or truncated msgpack", -EBADMSG);
    if (off != len)
        return set_why(why, "trailing bytes after the msgpack map", -EBADMSG);
    msgpack_unpacked_init(&u);
    off = 0;
    if (msgpack_unpack_next(&u, payload, len, &off) != MSGPACK_UNPACK_SUCCESS || off != len) {
        msgpack_unpacked_destroy(&u);
        return set_why(why, "malformed or truncated msgpack", -EBADMSG);
    }
    rc = decode_map(&u.data, m, why);
    msgpack_unpacked_destroy(&u);
    if (rc < 0) {
        uint32_t id = m->id;
        free(m->mem_);
        memset(m, 0, sizeof(*m));
        m->id = id;
    }
    return rc;
}

void sf_ap_msg_fini(sf_ap_msg *m)
{
    if (!m)
        return;
    free(m->mem_);
    memset(m, 0, sizeof(*m));
}
