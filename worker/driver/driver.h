/* The worker's driver interface: a table of operations that worker/dispatch.c and the handlers call
 * without knowing which isolation driver (jail, qemu, ...) runs the sandboxes.
 * A driver is one `wk_driver_ops` table (worker/driver.c lists them by name); its
 * host-wide state is an opaque `wk_driver`, each sandbox an opaque `wk_sandbox`.
 *
 * Threading and blocking: every operation is called on the worker's event-loop
 * thread and returns at once. Nothing a driver does may block that loop: slow or
 * blocking work (mounts, clone and the agent's first answer, QMP, teardown) runs on
 * the shared thread pool (worker/pool.h) or in child processes, and the completion
 * callbacks come back on the loop thread, never from inside the call that started
 * the operation (except where said so below).
 *
 * Errors: functions return 0 or a negative errno; `why` is one actionable sentence
 * for the caller (valid during the call or callback only).
 *
 * The process must ignore SIGPIPE (sf_daemon does) and leave SIGCHLD at its default:
 * drivers reap what they start through pidfds. */
#ifndef WK_DRIVER_H
#define WK_DRIVER_H

#include <event2/event.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>

#include "pool.h"
#include "sf_agentproto.h"
#include "sf_hostcaps.h"

typedef struct wk_driver wk_driver;   /* a driver's host-wide state */
typedef struct wk_sandbox wk_sandbox; /* one sandbox of a driver */

/* A sandbox's shape (schemas/envelope.md `args.limits`); 0 in a field = the driver's
 * default for it. */
typedef struct wk_limits {
    uint32_t memory_mib;  /* memory, kernel memory and (where the kernel can) TCP buffers */
    uint32_t vcpu_milli;  /* CPU: 1000 = one core's worth of time */
    uint32_t disk_mib;    /* bytes of the sandbox's own filesystem */
    uint32_t pids_max;    /* processes and threads */
    uint64_t inodes;      /* files of the sandbox's own filesystem */
} wk_limits;

/* What the host offers sandboxes (published in the heartbeat, schemas/redis-keys.md). */
typedef struct wk_host_res {
    uint64_t mem_mib;     /* memory allocatable to sandboxes: the sum of their memory_mib may
                             reach it and no further */
    uint64_t vcpu_milli;  /* CPU allocatable to sandboxes, after the configured overcommit */
    uint64_t disk_mib;    /* disk allocatable to sandboxes (sum of disk_mib) */
    uint32_t slots;       /* most sandboxes the driver itself can hold (0 = no own limit) */
} wk_host_res;

/* The host's resources for this worker, with the host policy applied (reserve, share,
 * overcommit): measured once, by the daemon, before host_init (wk_host_measure). A driver
 * takes only its own costs off (the jail's TCP buffers on cgroup v1, QEMU's memory). */
typedef struct wk_host_measured {
    uint64_t mem_mib;        /* (MemTotal - reserve_mem_mib) x host_share_pct */
    uint64_t vcpu_cap_milli; /* (CPUs x 1000 - reserve_vcpu_milli, at least 100) x share:
                                what the worker's parent cgroup may use */
    uint64_t vcpu_milli;     /* vcpu_cap_milli x cpu_overcommit_pct: what sandboxes may sum */
    uint64_t disk_mib;       /* free disk under state_dir (or its nearest existing
                                folder, before host_init makes it) x share x
                                disk_overcommit_pct */
} wk_host_measured;

/* Settings a driver gets at host init. Fields a driver has no use for are ignored. */
typedef struct wk_host_cfg {
    struct event_base *base;   /* the worker's loop */
    wk_pool *pool;             /* shared thread pool for blocking work */
    const char *host_id;       /* this worker's id ([a-z0-9_-]): names its cgroup parent */
    const char *state_dir;     /* absolute; the driver's files live under it */
    const char *agent_path;    /* host path of the static sandfleet-agent */
    wk_limits defaults;        /* used for fields a create leaves 0 (all must be set) */
    uint32_t host_share_pct;   /* share (1-100) of this host's memory, CPU and disk for this
                                  worker, when several run on one box */
    uint64_t reserve_mem_mib;  /* host memory kept for the platform's own daemons */
    uint32_t reserve_vcpu_milli; /* host CPU kept for the platform's own daemons */
    uint32_t cpu_overcommit_pct; /* sum of vcpu_milli allowed, in % of the real CPU (>= 100) */
    uint32_t disk_overcommit_pct; /* sum of disk_mib allowed, in % of the free disk (>= 100;
                                     0 = 100) */
    uint32_t nofile;           /* open files per sandbox process (RLIMIT_NOFILE) */
    /* qemu */
    const char *vm_dir;        /* guests and template snapshots (shared by the workers of a
                                  host); NULL or "" = state_dir/vm */
    uint32_t vm_save_after_ms; /* a VM paused this long is saved to disk (0 = never) */
    uint32_t vm_pool;          /* VMs kept restored ahead of time for the next creates */
    /* jail */
    uint32_t uid_base;         /* first host uid mapped into sandboxes (65536 each) */
    uint32_t pool_images;      /* formatted disk images kept ready */
    int teardown_stop;         /* tests only: a teardown stops itself (SIGSTOP) half-way */
    wk_host_measured host;     /* wk_host_measure's numbers (all 0: not measured) */
} wk_host_cfg;

/* Fills cfg->host from this host (/proc/meminfo, the online CPUs, statvfs of state_dir)
 * and cfg's policy fields (host_share_pct, reserve_*, cpu_overcommit_pct,
 * disk_overcommit_pct). The daemon
 * calls it once before host_init (driver/hostres.c). */
void wk_host_measure(wk_host_cfg *cfg);
/* A /proc/meminfo field in KiB (key without its colon, e.g. "MemAvailable"); 0 if absent. */
uint64_t wk_meminfo_kib(const char *key);

#define WK_LAYERS_MAX 8        /* root filesystem layers of one template (tstore.h) */

typedef struct wk_create_req {
    const char *id;            /* [a-z0-9_-]{1,63}, unique on this host */
    const char *template;      /* the template's name (NULL = "base") */
    const char *const *layers; /* NULL = the driver's own 'base'; else the template's root
                                  filesystem layers (directories), top first, NULL-terminated,
                                  at most WK_LAYERS_MAX (drivers that cannot use them refuse
                                  the create with -ENOTSUP) */
    const char *build_from;    /* NULL, or a template build (jail only; others -ENOTSUP):
                                  this directory's tree is copied onto the sandbox's own
                                  disk (a loop image of the template's size + disk_mib, so
                                  what the build writes is bounded by disk_mib as any
                                  sandbox's writes are), given to the sandbox's ids (+ its
                                  host uid) and is its root, writable. The builder takes
                                  the tree with `snapshot` (its upper: the whole root) and
                                  gives it back to host ids with wk_tree_shift (fs.h) */
    wk_limits limits;          /* 0 fields = the defaults */
    const char *trust_pem;     /* NULL, or the egress proxy's CA certificate (PEM, at most
                                  64 KiB): before the sandbox's first command the driver puts
                                  its template's own CAs plus this one in
                                  /etc/ssl/certs/ca-certificates.crt and
                                  /etc/ssl/certs/sandfleet-ca-bundle.pem, and points its
                                  resolver at its network namespace (a jail's /etc/resolv.conf
                                  names 127.0.0.1; a VM's names its tap already) */
    const char *snapshot;      /* NULL, or a directory this driver's `snapshot` filled on this
                                  host: the sandbox starts from it (jail: the captured
                                  sandbox's own files over the same template layers, given to
                                  the new sandbox's ids; qemu: its memory, devices and disk, so
                                  its processes go on). The limits must be the captured
                                  sandbox's. -ESTALE when it no longer fits this host's
                                  driver (a template snapshot rebuilt since), -ENOENT when it
                                  is gone */
} wk_create_req;

typedef struct wk_exec_req {
    const char *command;       /* run as /bin/sh -c command (any length the agent frame takes) */
    const char *cwd;           /* NULL or "" = /root; a missing cwd gives an error result */
    const char *const *env;    /* NULL or NULL-terminated "K=V" array (<= 256), added to
                                  PATH, HOME=/root, TERM=xterm (same key overrides) */
    uint32_t timeout_ms;       /* 0 = 60000; the caller clamps (max 600000) */
    uint32_t cap_bytes;        /* per-stream cap, 0 = 32768 (2..262144): head cap/2 +
                                  tail cap - cap/2 are kept */
    /* Non-NULL: the output is also streamed as it comes, in chunks (the agent holds a
     * chunk at most 100 ms or 8 KiB and streams at most 1 MiB per command; the rest is
     * counted in a marker chunk). Called with exec's arg, before the result. */
    void (*on_output)(void *arg, int stream, const char *data, size_t len);
    /* has_stdin: stdin_len bytes (<= WK_EXEC_STDIN_MAX) are the command's stdin, then EOF
     * (else stdin is /dev/null). */
    int has_stdin;
    const char *stdin_data;
    size_t stdin_len;
    /* 1: the command runs in the background: the result comes at once with its pid (no
     * timeout; stdout and stderr merged into a log the agent keeps: WK_PROC_LOGS). */
    int background;
    /* > 0 (and below timeout_ms): a command still running this long after it started
     * goes on as a background command (its timeout kept, its later output in its log)
     * and the result comes then: still_running, pid and the output so far. */
    uint32_t detach_ms;
    /* 1: a duplex session (a hosted MCP server's stdio): no timeout, stdin stays open and
     * takes bytes through exec_input until its eof, on_output (required) gets the output
     * as it is written (no 100 ms hold, no 1 MiB budget; the agent stops reading the
     * command's pipes while the worker is behind). */
    int pipe;
} wk_exec_req;
#define WK_EXEC_STDIN_MAX (8u << 20)

typedef struct wk_exec_result {
    int exit_code;             /* exit status, 128+signal when killed by a signal, -1 on timeout */
    int timed_out;             /* 1: killed (the whole process group) after timeout_ms */
    int oom_killed;            /* 1: the sandbox hit its memory limit while the command ran
                                  and the kernel killed a process of it */
    const char *out;           /* kept stdout bytes: head then tail, raw join, no marker */
    size_t out_len;
    uint64_t out_total;        /* bytes the command wrote to stdout */
    const char *err;
    size_t err_len;
    uint64_t err_total;
    int truncated;             /* 1 if either stream was cut */
    uint32_t duration_ms;
    const char *error;         /* non-NULL when the command could not run at all (bad cwd,
                                  agent gone, sandbox killed...): one actionable sentence;
                                  the other fields are then unset */
    uint32_t pid;              /* background: the process's pid in the sandbox (the rest unset) */
    int still_running;         /* detached (detach_ms): pid set, out/err and their totals,
                                  truncated and duration_ms hold what came so far */
} wk_exec_result;

/* One file request, done by the sandbox's agent inside the sandbox (its mount namespace
 * and root: nothing of the host is reachable through a path). Large files take several
 * requests (chunks of at most WK_FILE_CHUNK bytes). */
typedef enum wk_file_op {
    WK_FILE_READ,     /* path, off, len (1..WK_FILE_CHUNK), flags NOFOLLOW -> data, size, mtime */
    WK_FILE_WRITE,    /* path, off, data, flags CREATE/MKDIRS/EXCL -> size (off + data_len) */
    WK_FILE_LIST,     /* path, off (entries to skip), len (1..4096) -> entries, more */
    WK_FILE_MOVE,     /* path -> to (rename) */
    WK_FILE_DELETE,   /* path (not a directory) */
    /* The sandbox's processes (through the same path: the agent answers) */
    WK_PROC_LIST,     /* -> procs, n_procs, more */
    WK_PROC_KILL,     /* pid, sig, grace_ms -> size 1 when SIGKILL followed after grace_ms */
    WK_PROC_LOGS,     /* pid, off (has_off) or tail -> data, size (first byte's offset), off
                         (next offset), exited, exit_code */
} wk_file_op;
#define WK_FILE_CHUNK SF_AP_DATA_MAX
#define WK_FILE_NOFOLLOW SF_AP_F_NOFOLLOW
#define WK_FILE_CREATE SF_AP_F_CREATE
#define WK_FILE_MKDIRS SF_AP_F_MKDIRS
#define WK_FILE_EXCL SF_AP_F_EXCL
typedef sf_ap_entry wk_file_entry; /* name, type ('f', 'd', 'l', 'o'), size, mtime */

typedef struct wk_file_req {
    wk_file_op op;
    const char *path;
    const char *to;
    uint64_t off;
    uint32_t len;
    const void *data;
    size_t data_len;
    uint32_t flags;
    uint32_t pid, sig, grace_ms, tail; /* WK_PROC_KILL, WK_PROC_LOGS */
    int has_off;                       /* WK_PROC_LOGS: off given */
} wk_file_req;

typedef struct wk_file_result {
    const char *error;         /* non-NULL: it failed (one sentence); the rest is unset */
    int err;                   /* the errno inside the sandbox behind error, 0 if none */
    const char *data;          /* READ: the bytes read (data_len <= len; fewer at the end) */
    size_t data_len;
    uint64_t size;             /* READ: the file's size; WRITE: off + bytes written */
    int64_t mtime;             /* READ: seconds since the epoch */
    const wk_file_entry *entries; /* LIST: one page, in directory order */
    size_t n_entries;
    int more;                  /* LIST: entries follow past off + n_entries */
    const sf_ap_proc *procs;   /* PROC_LIST */
    size_t n_procs;
    uint64_t off;              /* PROC_LOGS: the offset after data */
    int exited, exit_code;     /* PROC_LOGS */
    int timed_out;             /* PROC_LOGS: a detached command killed at its timeout */
} wk_file_result;

/* sb is NULL and rc < 0 (why set) when the create failed. */
typedef void (*wk_create_cb)(void *arg, wk_sandbox *sb, int rc, const char *why);
typedef void (*wk_exec_cb)(void *arg, const wk_exec_result *res); /* res valid during the call */
typedef void (*wk_kill_cb)(void *arg, int rc);
/* A move (pause, resume): rc 0, or rc < 0 with why (one actionable sentence). */
typedef void (*wk_op_cb)(void *arg, int rc, const char *why);
typedef void (*wk_file_cb)(void *arg, const wk_file_result *res); /* res valid during the call */
typedef void (*wk_snap_cb)(void *arg, int rc, uint64_t bytes, const char *why);

/* What a driver can do beyond the operations every driver has (wk_driver_ops.caps). The
 * worker decides by these, never by the driver's name, and publishes them in its heartbeat
 * (`caps`: words, common/sf_hostcaps.h) for the scheduler. */
#define WK_CAP_LAYERS SF_HOSTCAP_LAYERS         /* runs team templates' layers */
#define WK_CAP_BUILDS SF_HOSTCAP_BUILDS         /* builds team templates (build_from) */
#define WK_CAP_SNAP_PROCS SF_HOSTCAP_SNAP_PROCS /* a snapshot keeps the processes */
#define WK_CAP_DEBIAN SF_HOSTCAP_DEBIAN         /* runs the built-in 'debian' (its layers as
                                                   they are, or tpl_image) */
#define WK_CAP_DESKTOP SF_HOSTCAP_DESKTOP       /* runs the built-in 'desktop' (a GUI desktop:
                                                   sandbox_computer; the jail) */

typedef struct wk_driver_ops {
    const char *name;               /* for messages, logs and the heartbeat's `driver` */
    unsigned caps;                  /* WK_CAP_* */

    /* One-time host set-up (needs what the driver needs: root, /dev/kvm...): removes
     * what an earlier run of this worker left (its sandboxes are lost, unless the driver
     * has adopt: then the living ones wait for adopt / adopt_end), prepares
     * templates, checks the kernel, creates the per-worker resource parents that cap
     * the total. Blocking; called once at start-up before the worker takes jobs. */
    int (*host_init)(const wk_host_cfg *cfg, wk_driver **out, const char **why);
    /* The resources this host offers sandboxes (fixed after host_init). */
    void (*host_res)(const wk_driver *d, wk_host_res *res);
    /* Waits for teardowns under way (bounded), kills what is left, frees. Blocking;
     * at shutdown only. NULL-safe. */
    void (*host_fini)(wk_driver *d);

    /* Creates and starts a sandbox; cb(arg, sb, 0, NULL) once its agent answered, or
     * cb(arg, NULL, rc, why) (-EINVAL bad id or limits, -EEXIST id in use, -EAGAIN no
     * room, or the failed step's errno). The sandbox uses exactly the limits it was
     * given (defaults filled in): see limits(). */
    int (*create)(wk_driver *d, const wk_create_req *req, wk_create_cb cb, void *arg);
    /* The limits a sandbox runs with. */
    void (*limits)(const wk_sandbox *sb, wk_limits *out);
    /* Runs a command; cb exactly once, never from inside this call (an agent that is
     * gone or a kill give res->error). -EINVAL (no command/cb, bad env entry), -E2BIG
     * (over the 1 MiB agent frame, or more than 256 env entries), -EBUSY (64 commands
     * already running), -ESRCH (the sandbox is being killed), -ESHUTDOWN (kept for the
     * next worker: this one is stopping), -ENOMEM. */
    int (*exec)(wk_sandbox *sb, const wk_exec_req *req, wk_exec_cb cb, void *arg);
    /* Kills the sandbox: pending exec callbacks fire first, inside this call, with
     * "killed" errors; its processes are stopped at once; the rest of the teardown
     * runs off the loop and cb(arg, rc) (NULL allowed) reports the end: 0 when
     * nothing of the sandbox is left on the host. sb must not be used after this
     * call. Also allowed from inside an exec callback. */
    void (*kill)(wk_sandbox *sb, wk_kill_cb cb, void *arg);
    /* The sandbox's network namespace, for the worker's egress set-up (worker/egress.c):
     * an fd the driver keeps open from the create's callback until kill (dup it to keep
     * it longer), or -ENOENT. Nothing links that namespace to the host; the worker's
     * egress set-up gives it its only way out, through the secret-proxy. */
    int (*netns)(const wk_sandbox *sb);

    /* Kills the processes of the running exec whose callback argument is arg (the
     * command's process group); its callback still runs once, with the result of a
     * killed command. -ENOENT when no such exec runs. */
    int (*exec_cancel)(wk_sandbox *sb, void *arg);
    /* Optional (NULL = none). More stdin for the running pipe exec whose callback
     * argument is arg (eof: then its stdin closes). -ENOENT when no such exec runs,
     * -EAGAIN while too much waits for the agent already (retry after output came). */
    int (*exec_input)(wk_sandbox *sb, void *arg, const char *data, size_t len, int eof);

    /* One file request (wk_file_req); cb exactly once, never from inside this call.
     * -EINVAL (bad request), -EBUSY (too many requests in flight), -ESRCH (killed),
     * -ENOMEM. On a paused sandbox the agent is stopped too: callers resume it first
     * (the worker does, for tools that declare `resume`); a VM driver resumes by itself. */
    int (*file)(wk_sandbox *sb, const wk_file_req *req, wk_file_cb cb, void *arg);

    /* Optional (NULL = the driver does not have it yet). pause: every process of the
     * sandbox stops where it is (a driver may later move it out of memory: a VM goes to
     * disk); resume: it goes on where it stopped. An exec on a paused sandbox resumes it
     * first. cb exactly once, never inside the call: cb(arg, 0, NULL) once the state is
     * reached, else an error (a kill answers it). Returns 0, or -ESRCH (being killed),
     * -EAGAIN (still starting), -EIO (the sandbox died), -ENOMEM. */
    int (*pause)(wk_sandbox *sb, wk_op_cb cb, void *arg);
    int (*resume)(wk_sandbox *sb, wk_op_cb cb, void *arg);

    /* Optional (NULL = the driver has none). Captures the sandbox into dir (absolute, not
     * there yet: the driver creates it, mode 0700, and fills it; the caller removes it
     * when the snapshot failed or is deleted), for a later create's `snapshot`. The
     * sandbox is stopped while its state is read (jail: its cgroup frozen while its own
     * files are copied; qemu: the VM stopped, its memory and device state migrated to a
     * file and its disk copied) and ends as it was: a running one runs on, a paused one
     * stays paused (a VM saved to disk stays there: its files are copied). A jail keeps
     * no processes: only files. cb exactly once, never inside the call: cb(arg, 0, bytes,
     * NULL) with the bytes the snapshot holds on disk, or an error (a kill answers it).
     * Returns 0, or -ESRCH (being killed), -EAGAIN (still starting), -EBUSY (a snapshot of
     * it is under way), -EIO (the sandbox died), -ENOMEM. */
    int (*snapshot)(wk_sandbox *sb, const char *dir, wk_snap_cb cb, void *arg);

    /* Optional (NULL = unknown). Bytes still free on the sandbox's own disk (what its
     * writes may still use), or -errno. Blocking only as long as a statvfs. */
    int64_t (*disk_free)(const wk_sandbox *sb);

    /* Optional (NULL = the driver runs a built-in template's layers as they are: the
     * jail). The driver's own image of built-in template `name` (today 'debian'), made
     * from its root filesystem, the directory rootfs (qemu: a guest disk and a template
     * snapshot), built in the background: the first call for a rootfs starts the build.
     * Any thread (the heartbeat's too); never blocks. 1: ready, creates with that
     * template (its layers = {rootfs}) work; 0: being built; -errno + why (one sentence)
     * when the build failed (a call WK_TPL_RETRY_S later starts it again) or name is not
     * a template the driver makes. */
    int (*tpl_image)(wk_driver *d, const char *name, const char *rootfs, const char **why);

    /* Optional (NULL = previews cannot reach this driver's sandboxes). Where a TCP socket
     * made in netns() reaches the sandbox's own 127.0.0.1:port (the preview ingress,
     * docs/internals/ingress.md): *addr, with *relay 0 when that is the port itself (the
     * jail: netns() is the sandbox's namespace, loopback included), or 1 when it is the
     * guest agent's relay (WK_PREVIEW_RELAY_PORT on the guest's side of the VM link),
     * which takes "<port>\n" first and answers "OK\n" (connected to the guest's
     * 127.0.0.1:port) or "ERR\n" (nothing listens). Such a socket must carry
     * SO_MARK WK_PREVIEW_MARK: the namespace's rules let only marked sockets reach the relay
     * (secret-proxy/netns.c). Any thread; never blocks. 0 or -errno. */
    int (*preview_addr)(const wk_sandbox *sb, uint16_t port, struct sockaddr_in *addr,
                        int *relay);

    /* Optional, all three or none (NULL = a worker restart loses its sandboxes). A
     * sandbox outlives its worker (docs/internals/restart.md): host_init then leaves each
     * sandbox of an earlier run whose processes provably still live (pid and start time,
     * from a host-only record the driver wrote at create); the worker takes back those it
     * has its own record of with adopt (blocking; at start-up only, before any job): 0 and
     * *out (its agent answered, or it is paused: *paused 1), or -errno with why (one
     * sentence: what died), and then removes the others with adopt_end (each logged). */
    int (*adopt)(wk_driver *d, const char *id, wk_sandbox **out, int *paused, const char **why);
    void (*adopt_end)(wk_driver *d);
    /* host_fini leaves sb running (its agent link closed) for the next worker to adopt. */
    void (*keep)(wk_sandbox *sb);
} wk_driver_ops;
#define WK_PREVIEW_RELAY_PORT 49983 /* reserved: no preview may publish it */
#define WK_PREVIEW_MARK 0x53465056u /* "SFPV" */
#define WK_TPL_RETRY_S 600

#endif
