/* sf_agentproto: the frames the worker and the guest agent exchange.
 *
 * Wire format (see schemas/agent-protocol.md): a 4-byte big-endian payload
 * length, then one msgpack map of at most SF_AP_FRAME_MAX bytes. Keys are short
 * strings; "op" names the message, "id" (uint32) pairs a reply with its request,
 * so several execs can run at once. Decoding is strict: unknown ops or keys,
 * duplicate keys, wrong types, values out of range, trailing bytes and oversized
 * frames are errors with a reason, never a crash. Both sides treat the peer's
 * frames as untrusted input.
 *
 * Library code: no logging. Functions return 0 or a negative errno. */
#ifndef SF_AGENTPROTO_H
#define SF_AGENTPROTO_H

#include <stddef.h>
#include <stdint.h>

#include "sf_buf.h"

#define SF_AP_VERSION 1
#define SF_AP_HDR_LEN 4
#define SF_AP_FRAME_MAX (1u << 20)       /* payload bytes, header excluded */
#define SF_AP_AGENT_FD 3                 /* the agent's end of the socketpair */
#define SF_AP_VIRTIO_PORT "org.sandfleet.agent" /* the virtio-serial port in a microVM */
#define SF_AP_BOX_FD 4                   /* optional: the cgroup file its commands join */
#define SF_AP_LISTEN_FD 5                /* optional (jail): a listening unix socket where a
                                            restarted worker connects again (the agent then
                                            outlives a closed fd 3) */
#define SF_AP_SLOT_FD 6                  /* optional (jail, with fd 5): the lock on its uid
                                            range, held while the sandbox lives, worker or
                                            not (the agent only keeps it, close-on-exec) */
#define SF_AP_ENV_MAX 256                /* entries in exec.env */
#define SF_AP_CAP_MIN 2                  /* exec.cap bounds (bytes per stream) */
#define SF_AP_CAP_MAX (256u * 1024)
#define SF_AP_MSG_MAX 4096               /* error.msg bytes */
#define SF_AP_SEED_MIN 16                /* ping.seed bytes */
#define SF_AP_SEED_MAX 256
#define SF_AP_NAME_MAX 63                /* ping.name bytes */
#define SF_AP_PATH_MAX 4096              /* path / to bytes */
#define SF_AP_DATA_MAX (768u * 1024)     /* file bytes in one fread answer or fwrite */
#define SF_AP_OUTPUT_MAX (64u * 1024)    /* bytes in one output frame */
#define SF_AP_ENTRIES_MAX 4096           /* entries in one `entries` answer */
#define SF_AP_ENTRY_NAME_MAX 255         /* bytes of one entry name */
#define SF_AP_PROCS_MAX 4096             /* processes in one `procs` answer */
#define SF_AP_CMDLINE_MAX 1024           /* bytes of one process's command line */
#define SF_AP_GRACE_MAX 600000u          /* pkill.grace_ms */

/* fread / fwrite flags */
#define SF_AP_F_NOFOLLOW 1u              /* fread: a symlink as the last component fails */
#define SF_AP_F_CREATE 2u                /* fwrite: create the file, or empty it (O_TRUNC) */
#define SF_AP_F_MKDIRS 4u                /* fwrite: create missing parent directories first */
#define SF_AP_F_EXCL 8u                  /* fwrite: the file must not exist (with CREATE) */

typedef enum sf_ap_op {
    SF_AP_PING = 1, /* worker -> agent: {op, id, now?, seed?, name?} */
    SF_AP_PONG,     /* agent -> worker: {op, id, v} */
    SF_AP_EXEC,     /* worker -> agent: {op, id, cmd, timeout_ms, cap, cwd?, env?,
                                         detach_ms?} */
    SF_AP_RESULT,   /* agent -> worker: {op, id, exit, timed_out, truncated, ms,
                                         out, out_total, err, err_total, oom_killed?, pid?} */
    SF_AP_ERROR,    /* agent -> worker: {op, id, msg, errno?}: the request could not run */
    SF_AP_FREAD,    /* worker -> agent: {op, id, path, off, len, flags?} */
    SF_AP_DATA,     /* agent -> worker: {op, id, data, size, mtime}: fread's answer */
    SF_AP_FWRITE,   /* worker -> agent: {op, id, path, off, data, flags?} */
    SF_AP_FLIST,    /* worker -> agent: {op, id, path, off, len} */
    SF_AP_ENTRIES,  /* agent -> worker: {op, id, entries, more}: flist's answer */
    SF_AP_FMOVE,    /* worker -> agent: {op, id, path, to} */
    SF_AP_FDEL,     /* worker -> agent: {op, id, path} */
    SF_AP_OK,       /* agent -> worker: {op, id, size?}: fwrite, fmove, fdel, cancel done */
    SF_AP_CANCEL,   /* worker -> agent: {op, id, target}: kill exec `target`'s processes */
    SF_AP_OUTPUT,   /* agent -> worker: {op, id, s, data}: output of the streamed exec `id` */
    SF_AP_INPUT,    /* worker -> agent: {op, id, data, more}: stdin of exec `id` (no answer) */
    SF_AP_PLIST,    /* worker -> agent: {op, id} */
    SF_AP_PROCS,    /* agent -> worker: {op, id, procs, more}: plist's answer */
    SF_AP_PKILL,    /* worker -> agent: {op, id, pid, sig, grace_ms?} -> ok {size: 1 if KILLed} */
    SF_AP_PLOGS,    /* worker -> agent: {op, id, pid, off?, tail?} */
    SF_AP_LOG,      /* agent -> worker: {op, id, data, size, off, exit?, timed_out?}:
                       plogs' answer */
} sf_ap_op;

/* One process of a `procs` answer. */
typedef struct sf_ap_proc {
    uint32_t pid;            /* as the sandbox sees it */
    const char *cmd;         /* 1..SF_AP_CMDLINE_MAX bytes, no NUL */
    uint64_t start_ms;       /* Unix time in milliseconds */
    uint64_t cpu_ms;         /* user + system */
    uint64_t rss_kib;
    char state;              /* /proc's letter: R S D Z T t I X ... */
} sf_ap_proc;

/* One directory entry of an `entries` answer. */
typedef struct sf_ap_entry {
    const char *name;        /* 1..255 bytes, no '/' or NUL */
    char type;               /* 'f' file, 'd' directory, 'l' symlink, 'o' other */
    uint64_t size;
    int64_t mtime;           /* seconds since the epoch */
} sf_ap_entry;

/* One decoded (or to-be-encoded) message: only the fields of its op are used.
 * After sf_ap_decode() every pointer points into storage owned by the message
 * (strings are NUL-terminated); release it with sf_ap_msg_fini(). */
typedef struct sf_ap_msg {
    sf_ap_op op;
    uint32_t id;
    /* ping (optional: a VM agent restored from a snapshot sets its clock,
     * reseeds its kernel's random generator and takes the sandbox's name) */
    uint64_t now_ns;         /* 0 = absent; else Unix time in nanoseconds */
    const char *seed;        /* seed_len bytes (SF_AP_SEED_MIN..MAX), or absent (0) */
    size_t seed_len;
    const char *name;        /* hostname ([a-z0-9_-]{1,63}) or NULL */
    /* pong */
    uint32_t version;
    /* exec */
    const char *cmd;         /* non-empty */
    const char *cwd;         /* NULL: the agent's default (/root) */
    const char *const *env;  /* env_n "KEY=VALUE" entries, KEY non-empty */
    size_t env_n;
    uint32_t timeout_ms;     /* > 0 */
    uint32_t cap;            /* SF_AP_CAP_MIN..SF_AP_CAP_MAX */
    /* result */
    int32_t exit_code;       /* status, 128+signal, -1 on timeout */
    int timed_out;
    int truncated;
    int oom_killed;          /* optional (a VM agent): the OOM killer ran meanwhile */
    uint32_t duration_ms;
    const char *out;         /* kept bytes (binary) */
    size_t out_len;          /* <= out_total */
    uint64_t out_total;
    const char *err;
    size_t err_len;
    uint64_t err_total;
    /* error */
    const char *msg;         /* one sentence, <= SF_AP_MSG_MAX bytes */
    uint32_t errnum;         /* 0 = absent; else the errno behind it (files) */
    /* exec: stream the output as it comes (output frames, bounded) */
    int stream;
    /* files: fread, fwrite, flist, fmove, fdel */
    const char *path;        /* 1..4096 bytes, no NUL */
    const char *to;          /* fmove's target, same rules */
    uint64_t off;            /* fread / fwrite: byte offset; flist: entries to skip */
    uint32_t len;            /* fread: most bytes (1..SF_AP_DATA_MAX); flist: most entries */
    uint32_t flags;          /* SF_AP_F_* */
    const char *data;        /* data / fwrite: data_len bytes (<= SF_AP_DATA_MAX); output:
                                1..SF_AP_OUTPUT_MAX bytes */
    size_t data_len;
    uint64_t size;           /* data: the file's size; ok: bytes written (optional) */
    int64_t mtime;           /* data: seconds since the epoch */
    const sf_ap_entry *entries; /* entries: n_entries of them */
    size_t n_entries;
    int more;                /* entries: more follow past off + n_entries */
    /* output */
    uint32_t s;              /* 0 stdout, 1 stderr */
    /* cancel */
    uint32_t target;         /* the exec whose processes are killed */
    /* exec: stdin follows in `input` frames (in); run in the background (bg: the agent
     * answers `ok` with size = the process's pid at once, its output merged into a log) */
    int in;
    int bg;
    /* exec: still running after detach_ms (0: never; below timeout_ms), the command goes
     * on as a background command (its timeout kept, its later output in its log) and the
     * result comes then, with the output so far and pid set (exit unset) */
    uint32_t detach_ms;
    /* exec: a duplex session (with in and stream): stdin stays open for `input` frames
     * until one says more = false, output frames go out as the command writes (no hold,
     * no budget: the agent stops reading the command's pipes while the worker is slow) */
    int pipe;
    /* pkill, plogs; result: the detached command's pid (0: it ended) */
    uint32_t pid;            /* > 0 */
    uint32_t sig;            /* pkill: 1..64 */
    uint32_t grace_ms;       /* pkill: 0 = none; SIGKILL after this when still alive */
    uint32_t tail;           /* plogs: 0 = absent; else the last tail bytes (1..DATA_MAX) */
    int has_off;             /* plogs: off was given (the log from that offset) */
    int exited;              /* log: the process exited (exit_code holds its status;
                                timed_out: a detached command killed at its timeout) */
    /* procs */
    const sf_ap_proc *procs;
    size_t n_procs;
    void *mem_;              /* decoder-owned storage */
} sf_ap_msg;

/* Appends one whole frame (header + payload) for m to out.
 * -EINVAL when m is not a valid message (*why says why), -EMSGSIZE when the
 * payload would exceed SF_AP_FRAME_MAX, -E2BIG/-ENOMEM from the buffer.
 * On error out is left as it was. why may be NULL. */
int sf_ap_encode(sf_buf *out, const sf_ap_msg *m, const char **why);

/* Looks at the first len buffered bytes. Returns 0 with *frame_len = 0 when
 * more bytes are needed, 0 with *frame_len = header + payload length when a
 * whole frame is buffered, -EMSGSIZE (+ *why) when the announced length is 0
 * or over SF_AP_FRAME_MAX. */
int sf_ap_frame_check(const void *buf, size_t len, size_t *frame_len, const char **why);

/* Decodes one payload (the bytes after the 4-byte header). 0, or -EBADMSG /
 * -EMSGSIZE with *why; -ENOMEM. On error m holds nothing to free, except that
 * m->id is set when the map carried a valid id before the error was found
 * (0 otherwise), so a reply can name the request. */
int sf_ap_decode(const void *payload, size_t len, sf_ap_msg *m, const char **why);

void sf_ap_msg_fini(sf_ap_msg *m);

/* "ping", "exec", ... or "?" */
const char *sf_ap_op_name(sf_ap_op op);

#endif
