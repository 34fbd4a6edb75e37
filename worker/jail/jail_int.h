/* Internal interfaces of the jail driver's modules (not for the rest of the
 * worker: it uses the operations table of driver.h, `wk_jail_driver`). What the
 * drivers share is in worker/driver/ (cgroup.h, template.h, fs.h, agent_link.h ...).
 *   jail_fs.c     uid slots, per-sandbox directories
 *   jail_seccomp.c the seccomp deny-list, compiled once to BPF
 *   jail_spawn.c  clone3 into new namespaces, the child's setup, exec of the agent
 *   jail_agent.c  the worker's side of the agent protocol (libevent)
 *   jail.c        the driver's operations (driver.h) tying them together */
#ifndef WK_JAIL_INT_H
#define WK_JAIL_INT_H

#include <linux/filter.h>
#include <stdint.h>
#include <sys/types.h>

#include "adopt.h"
#include "cgroup.h"
#include "driver.h"
#include "fs.h"
#include "jail.h"
#include "template.h"

#define WK_UID_RANGE 65536u           /* uids/gids per sandbox */
#define WK_SLOTS_MAX 4096             /* sandboxes per host (uid ranges) */
#define WK_UID_BASE_DEFAULT 200000u
#define WK_MEMORY_DEFAULT (512ull << 20)
#define WK_PIDS_DEFAULT 256
#define WK_CAP_DEFAULT 32768u
#define WK_TIMEOUT_DEFAULT 60000u
#define WK_EXECS_MAX 64               /* concurrent execs per sandbox (agent too) */
#define WK_PING_TIMEOUT_MS 5000       /* agent start-up */
#define WK_EXEC_GRACE_MS 5000         /* worker-side deadline = timeout + grace */
#define WK_UID_LOCK_DIR "/run/sandfleet/uid-slots"
#define SF_ID_MAX_JAIL 64

/* ---- jail_fs.c ---- */
/* Claims a free uid range: flock on WK_UID_LOCK_DIR/<first uid>.lock, kept
 * while the sandbox lives (the kernel drops it if the worker dies). */
int wk_slot_acquire(uint32_t uid_base, uint32_t *host_uid, int *lock_fd);
/* Creates state_dir/sandboxes/<id>/ (owned by host_uid, the sandbox's root) with its
 * mount points fs/ and rootfs/. -EEXIST when the id is in use. */
int wk_sbdir_create(const char *sbdir, uint32_t host_uid, const char **why);

/* Creates the writable layer's directories (upper/{root,tmp,home,run}, work) on the
 * sandbox's disk open at fsfd, owned by host_uid. */
int wk_layer_dirs(int fsfd, uint32_t host_uid);

/* ---- jail_disk.c ---- */
#define WK_DISK_IMAGE "disk.img"      /* in the sandbox's directory */
#define WK_DISK_MOUNT "fs"            /* its mount point there */
/* Checks mkfs.ext4 and /dev/loop-control; empties state_dir/images (an earlier run's
 * images may be half written). */
int wk_disk_host_init(const char *state_dir, const char **why);
/* Formats images of this shape into state_dir/images until `want` are ready. Blocking. */
int wk_disk_pool_fill(const char *state_dir, uint32_t disk_mib, uint64_t inodes, unsigned want);
/* Puts an image of the shape at sbdir/disk.img (from the pool, else formatted now),
 * mounts it at sbdir/fs and creates the layer's directories. Blocking. On failure
 * nothing of it is left. */
int wk_disk_attach(const char *state_dir, const char *sbdir, uint32_t disk_mib, uint64_t inodes,
                   uint32_t host_uid, const char **why);

/* ---- jail_teardown.c ---- */
/* The teardown steps (cgroups, unmount, files), in the calling process: 0 or the
 * number of the first step that failed. */
int wk_teardown_run(wk_cgroup *cg, const char *sbdir, int stop_halfway);
/* The same in a child process `sf-teardown`; *pidfd (close-on-exec) reports its exit,
 * whose status is wk_teardown_run's result. */
int wk_teardown_spawn(wk_cgroup *cg, const char *sbdir, int stop_halfway, int *pidfd);

/* ---- jail_lxcfs.c ---- */
#define WK_LXCFS_FILES 7
/* The /proc files lxcfs serves per sandbox: meminfo, cpuinfo, stat, loadavg, uptime,
 * diskstats, swaps. */
extern const char *const wk_lxcfs_files[WK_LXCFS_FILES];
typedef struct wk_lxcfs {
    pid_t pid;                /* -1: not running */
    int adopted;              /* started by an earlier worker run (not our child) */
    char dir[1100];           /* its mount point, state_dir/lxcfs */
} wk_lxcfs;
/* Starts the worker's lxcfs at state_dir/lxcfs (call before any thread starts) and
 * waits until it serves; -ENOENT when lxcfs is not installed. */
int wk_lxcfs_start(const char *state_dir, wk_lxcfs *lx, const char **why);
int wk_lxcfs_alive(const wk_lxcfs *lx);
/* The lxcfs an earlier worker run started for state_dir (it outlives a worker that died:
 * the jails it kept bind its files), or -1: its pid file names a living lxcfs serving
 * state_dir/lxcfs. The new worker joins its mount namespace (the kept jails' disks are
 * mounted there too) and takes it with wk_lxcfs_adopt (0, or -ENOENT: not mounted). */
pid_t wk_lxcfs_find(const char *state_dir);
int wk_lxcfs_adopt(const char *state_dir, pid_t pid, wk_lxcfs *lx);
void wk_lxcfs_stop(wk_lxcfs *lx);
/* ---- jail_trust.c ---- */
#define WK_TRUST_BUNDLE "sandfleet-ca-bundle.pem" /* = SP_NETNS_BUNDLE (secret-proxy/netns.h) */
/* Writes the sandbox's trust store (the template's CAs at lower + pem) and its resolver
 * (127.0.0.1) into the overlay's upper directory, owned by uid (the sandbox's root), before
 * the jail starts. 0 or -errno with why. */
int wk_trust_write(const char *lower, const char *upper, uint32_t uid, const char *pem,
                   const char **why);
/* 1 when the layer has an entry etc/ssl/certs/ca-certificates.crt (looked up inside the
 * layer, safefs.h: a link there is not followed). */
int wk_trust_has_bundle(const char *layer);

/* ---- jail_adopt.c: what a restarted worker needs to take a jail back ---- */
typedef struct wk_adopt_handle {
    pid_t pid;                /* the jail's init */
    int pidfd;                /* ...verified to be that process (close-on-exec) */
    uint32_t host_uid;
    wk_limits lim;
} wk_adopt_handle;
/* Makes state_dir/adopt/<id>/ (root's, 0700) and the agent's socket agent.sock there:
 * the listening fd (close-on-exec), or -errno with why. */
int wk_adopt_listen(const char *state_dir, const char *id, const char **why);
/* Records the running jail (atomically): its init's pid and start time, uid, limits. */
int wk_adopt_write(const char *state_dir, const char *id, pid_t pid, uint32_t host_uid,
                   const wk_limits *lim);
/* The handle of sandbox id, believed only when it is root's and names the living init
 * of sandfleet/<host>/<id> (same pid and start time). 0 (h filled), or -ENOENT (none),
 * -EINVAL (damaged), -ESRCH (dead) with why. */
int wk_adopt_check(const char *state_dir, const char *host, const char *id, wk_adopt_handle *h,
                   const char **why);
/* A new connection to the agent of sandbox id: fd, or -errno. */
int wk_adopt_connect(const char *state_dir, const char *id);
void wk_adopt_remove(const char *state_dir, const char *id);
/* Claims the uid range of host_uid again (its lock went with the old worker). -EBUSY when
 * another holds it. */
int wk_slot_take(uint32_t host_uid, int *lock_fd);
/* 1 when fd is the lock file of host_uid's range. */
int wk_slot_is(int fd, uint32_t host_uid);
/* Mounts the sandbox's disk (still attached to its loop device, held by the jail's own
 * mount namespace) at sbdir/fs again, in this worker's namespace. 0 or -errno. */
int wk_disk_remount(const char *sbdir);

/* ---- jail_seccomp.c ---- */
/* The deny-list as a BPF program, compiled on first use and kept. */
int wk_seccomp_prog(const struct sock_fprog **prog, const char **why);

/* ---- jail_spawn.c ---- */
typedef struct wk_spawn_args {
    const char *const *lowers; /* the template's layers, top first, NULL-terminated (1 to
                                  WK_LAYERS_MAX) */
    int rw_root;              /* a template build: lowers[0] itself is the root, writable */
    const char *sbdir;        /* state_dir/sandboxes/<id> */
    const char *agent_path;
    const char *hostname;
    uint32_t host_uid;        /* host uid/gid of sandbox root */
    const wk_cgroup *cg;
    const struct sock_fprog *seccomp;
    int sock;                 /* the agent's end, becomes its fd 3 */
    int listen;               /* 0 (none), or a listening unix socket: its fd 5, where a
                                 restarted worker reaches the agent (jail_adopt.c) */
    int slot_lock;            /* with listen: the uid range's lock, its fd 6 (the jail holds
                                 the range while it lives, whatever becomes of its worker) */
    uint64_t shm_bytes;       /* size of /dev/shm */
    const char *lxcfs_dir;    /* NULL, or the lxcfs mount whose proc/ files cover /proc's */
    uint32_t nofile;          /* RLIMIT_NOFILE (soft = hard) of the agent and its commands */
} wk_spawn_args;

/* Starts the jail: returns once its init exec'd the agent (or failed).
 * *pidfd is a pidfd of the init (close-on-exec). */
int wk_spawn(const wk_spawn_args *a, pid_t *pid, int *pidfd, const char **why);
/* SIGKILL the init through its pidfd and reap it (the kernel has ended every
 * process of the pid namespace when this returns). Closes *pidfd. */
void wk_spawn_kill(int *pidfd);

/* ---- jail.c ---- */
/* The jail driver's host-wide state. */
struct wk_driver {
    struct event_base *base;
    wk_pool *pool;
    char host_id[SF_ID_MAX_JAIL];
    char state_dir[1025];     /* at most 1024 bytes (checked) */
    char agent_path[WK_PATH_MAX];
    wk_limits defaults;
    uint32_t uid_base;
    uint32_t nofile;
    uint32_t pool_images;
    int pool_filling;         /* a pool refill is queued or running */
    int teardown_stop;
    wk_lxcfs lxcfs;
    wk_host_res res;
    wk_sandbox *all;          /* every sandbox from create until its teardown ended */
    int adopting;             /* host_init left living jails for adopt / adopt_end */
    int n_all;
};

/* ---- jail_agent.c ---- */
typedef struct wk_alink wk_alink;

struct wk_sandbox {
    char id[64];
    wk_driver *drv;
    wk_sandbox *next, *prev;  /* drv->all */
    struct event_base *base;
    wk_limits lim;            /* applied */
    pid_t pid;
    int pidfd;
    struct event *ev_exit;    /* the init's pidfd, while a kill waits for it */
    int td_pidfd;             /* the teardown child's pidfd */
    struct event *ev_td;
    int slot_fd;
    int netns_fd;             /* its network namespace (driver.h `netns`), from the create */
    char *trust_pem;          /* the create's trust_pem until the create ran */
    char *build_from;         /* a template build's `from` tree (driver.h), else NULL */
    char *layers[WK_LAYERS_MAX + 1]; /* the create's template layers (NULL-terminated; none
                                  = base) until the create ran */
    char *snapshot;           /* the create's snapshot directory (driver.h), until it ran */
    int snapping;             /* a snapshot is being taken (frozen for it) */
    int snap_thaw;            /* ...and the sandbox runs again when it is done */
    uint32_t host_uid;
    wk_cgroup cg;
    char sbdir[WK_PATH_MAX];
    int sock;                 /* the worker's end of the agent socket until attached */
    wk_alink *link;           /* the agent link (agent_link.h), once attached */
    int oom_fd;               /* the box's OOM counter file, open while the link is (-1) */
    int paused;               /* 0 running, 1 freezing, 2 frozen (the cgroup freezer) */
    struct wk_jail_waiter *pause_w; /* pause calls waiting for "frozen" */
    struct event *ev_freeze;  /* polls the freezer while freezing */
    int64_t freeze_deadline;  /* monotonic ms */
    int depth;                /* > 0 while this sandbox runs callbacks or tears down */
    int killed;               /* kill ran; freed when depth drops to 0 */
    int kept;                 /* keep(): host_fini leaves it running for the next worker */
    int adopted;              /* taken back from an earlier worker run (not our child) */
    /* create, on the pool */
    wk_create_cb create_cb;
    void *create_arg;
    int create_rc;
    const char *create_why;
    /* kill */
    wk_kill_cb kill_cb;
    void *kill_arg;
    int teardown_rc;
};

/* Hands the socket to the agent link (agent_link.h); -ENOMEM (fd closed). */
int wk_agent_attach(wk_sandbox *sb, int fd);
/* Fails every pending request with `error` (callbacks run now), closes and frees the
 * link. */
void wk_agent_detach(wk_sandbox *sb, const char *error);
/* Frees sb when it was killed and no callback or teardown of it is running. */
void wk_sandbox_release(wk_sandbox *sb);
/* The driver's exec, exec_cancel and file operations (driver.h). */
int wk_jail_exec(wk_sandbox *sb, const wk_exec_req *req, wk_exec_cb cb, void *arg);
int wk_jail_exec_cancel(wk_sandbox *sb, void *arg);
int wk_jail_exec_input(wk_sandbox *sb, void *arg, const char *data, size_t len, int eof);
int wk_jail_file(wk_sandbox *sb, const wk_file_req *req, wk_file_cb cb, void *arg);

#endif
