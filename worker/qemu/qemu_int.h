/* Internal interfaces of the qemu driver's modules (the rest of the worker uses
 * driver.h, through wk_qemu_driver in qemu.h).
 *   qemu_qmp.c       asynchronous QMP client (libevent)
 *   qemu_spawn.c     starting a QEMU process: its network namespace and tap, its
 *                    disk, its fds; the argv (shared by template boot and restore)
 *   qemu_template.c  the guest (worker/vm/build-guest) and the template snapshot
 *   qemu_vm.c        one microVM: restore, pause, resume, save to disk, load, kill
 *   qemu_pool.c      VMs restored ahead of time for the next creates
 *   qemu.c           the driver's operations table (driver.h)
 * Loop thread only, except where said otherwise. */
#ifndef WK_QEMU_INT_H
#define WK_QEMU_INT_H

#include <event2/event.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "agent_link.h"
#include "cgroup.h"
#include "driver.h"
#include "pool.h"

#define WK_QEMU_PATH_MAX 4096
#define WK_QMP_LINE_MAX (1u << 20)     /* longest monitor line QEMU may send */
#define WK_QEMU_AGENT_FD 3             /* fds of the QEMU process */
#define WK_QEMU_QMP_FD 4
#define WK_QEMU_TAP_FD 5
#define WK_QEMU_INCOMING_FD 6
#define WK_QEMU_INCOMING_URI "fd:6"    /* = WK_QEMU_INCOMING_FD */
#define WK_QEMU_AGENT_SOCK "agent.sock" /* in the VM's folder: QEMU listens (qemu_vm.c) */
#define WK_QEMU_QMP_SOCK "qmp.sock"
#define WK_QEMU_TAP_NAME "tap0"        /* in the sandbox's network namespace */
/* The VM's link: tap0 in the namespace is 169.254.78.1/30, the guest's eth0 169.254.78.2
 * with its default route and resolver via .1 (worker/vm/init, build-guest). */
#define WK_QEMU_NET_HOST 0xa9fe4e01u   /* 169.254.78.1 */
#define WK_QEMU_NET_GUEST 0xa9fe4e02u  /* 169.254.78.2 (vm/init sets it) */

/* ---- qemu_qmp.c ----------------------------------------------------------- */
typedef struct wk_qmp wk_qmp;
/* ret: the command's "return" (borrowed; JSON null when it had none), or NULL and err
 * (QEMU's error text, or the connection's) */
typedef void (*wk_qmp_cb)(void *arg, json_t *ret, const char *err);
/* An event (data may be NULL); event == NULL: the connection closed. */
typedef void (*wk_qmp_event_cb)(void *arg, const char *event, json_t *data);

/* Takes fd (a connected stream socket to QEMU's monitor); negotiates capabilities
 * by itself. NULL when out of memory (fd not closed then). */
wk_qmp *wk_qmp_new(struct event_base *base, int fd, wk_qmp_event_cb on_event, void *arg);
/* Queues a command; args (stolen, may be NULL) become "arguments"; pass_fd >= 0 is
 * duplicated and passed along (SCM_RIGHTS, for getfd). cb may be NULL. -EPIPE when
 * the connection closed, -ENOMEM. */
int wk_qmp_cmd(wk_qmp *q, const char *cmd, json_t *args, int pass_fd, wk_qmp_cb cb, void *arg);
/* Closes; pending callbacks are dropped unanswered. NULL-safe, also from a callback. */
void wk_qmp_free(wk_qmp *q);
/* Arguments of migrate-set-capabilities for every migration here: RAM blocks that
 * are shared files are not copied (x-ignore-shared: the template's RAM file is the
 * memory), and MIGRATION events report the end. */
json_t *wk_qmp_caps(void);

/* ---- qemu_spawn.c --------------------------------------------------------- */
typedef struct wk_qemu_host wk_qemu_host; /* the driver's host-wide state (qemu.c) */

/* What a QEMU process needs beside its argv. */
typedef struct wk_qspawn {
    const char *const *argv;   /* argv[0]: the QEMU binary; fds as WK_QEMU_*_FD */
    int agent_fd, qmp_fd;      /* become fds 3 and 4 */
    int incoming_fd;           /* becomes fd 6, or -1 */
    int netns_fd;              /* join this network namespace; -1 = a new one */
    int tap;                   /* create WK_QEMU_TAP_NAME there, as fd 5 */
    const char *log_path;      /* QEMU's stderr (appended) */
    const char *copy_from;     /* if set: copy it to copy_to (created, O_EXCL) first */
    const char *copy_to;
    int cg_fd;                 /* v2: the cgroup to be born in (CLONE_INTO_CGROUP), or -1 */
    const int *tasks;          /* v1: WK_CG_N `tasks` fds (-1 = none) the child writes "0"
                                  to, or NULL */
    int outlive;               /* a sandbox's VM: its own session, no PDEATHSIG (it outlives
                                  the worker; agent_fd and qmp_fd are listening sockets) */
} wk_qspawn;

/* Clones the child (new network namespace unless netns_fd), which sets itself up
 * and execs QEMU; returns at once. *report: read end of a pipe (non-blocking) that
 * gives EOF when QEMU was exec'd, or the failure (wk_qspawn_report). The child dies
 * with the worker (PDEATHSIG) unless a->outlive. 0 or -errno + *why. */
int wk_qspawn_start(const wk_qspawn *a, pid_t *pid, int *pidfd, int *report, const char **why);
/* After *report is readable: 0 exec'd, -EAGAIN not yet, else the child's -errno + *why. */
int wk_qspawn_report(int report, const char **why);
/* A saved VM's network namespace holder (it has no QEMU then, and the namespace must
 * outlive the worker): `agent --hold-netns` in the VM's cgroup (cg_fd, v2, or tasks, v1)
 * and network namespace, its own session, no PDEATHSIG. 0 or -errno. */
int wk_qspawn_holder(const char *agent, int netns_fd, int cg_fd, const int *tasks, pid_t *pid,
                     int *pidfd);
/* SIGKILL through the pidfd and reap (QEMU ends at once: a few ms); closes it. */
void wk_qspawn_kill(int *pidfd);
/* Reaps an exited child (non-blocking); its exit status or -1 (still running). A process
 * that is not our child (a VM taken back from an earlier worker run) that exited gives
 * WK_QSPAWN_STATUS_UNKNOWN. */
int wk_qspawn_reap(int pidfd);
#define WK_QSPAWN_STATUS_UNKNOWN 255

/* ---- the template (qemu_template.c) ---------------------------------------- */
typedef struct wk_qtpl {
    char guest[WK_QEMU_PATH_MAX];   /* vm_dir/guest/<id>: vmlinuz, initrd.img, rootfs.img */
    char dir[WK_QEMU_PATH_MAX];     /* vm_dir/templates/<key> */
    char key[40];
    char append[512];               /* kernel command line */
    uint32_t memory_mib, vcpus, pids_max;
    uint32_t disk_mib;
} wk_qtpl;

/* How every QEMU of this host is started (qemu.c fills it at host init). */
typedef struct wk_qemu_cfg {
    char qemu[WK_QEMU_PATH_MAX];    /* qemu-system-x86_64 */
    char qemu_img[WK_QEMU_PATH_MAX];
    char vm_dir[WK_QEMU_PATH_MAX];  /* guests and template snapshots (shared by workers) */
    char sb_dir[WK_QEMU_PATH_MAX];  /* state_dir/qemu: one directory per sandbox */
    char builder[WK_QEMU_PATH_MAX]; /* worker/vm/build-guest */
    int kvm;                        /* /dev/kvm usable with hardware virtualization */
    uint32_t tsc_khz;               /* the host's TSC rate (TCG guests calibrate nothing) */
} wk_qemu_cfg;

enum { WK_QARGS_BOOT, WK_QARGS_RESTORE, WK_QARGS_LOAD };

/* The argv of one QEMU (NULL-terminated; free with wk_qargs_free). mode BOOT boots
 * the template (its RAM file shared, so the file is the snapshot's memory); RESTORE
 * maps the template's RAM privately (copy-on-write) and waits for the device state
 * (-incoming defer); LOAD the same, for a sandbox saved to disk. disk: the VM's
 * qcow2; console: the serial log or NULL. */
char **wk_qargs(const wk_qemu_cfg *c, const wk_qtpl *t, int mode, const char *disk,
                const char *console);
void wk_qargs_free(char **argv);

/* A build off the loop (the 'debian' image): stop set makes it give up soon (-ECANCELED;
 * the builder's process group, in pid, is sent SIGTERM by whoever sets stop). */
typedef struct wk_qtpl_ctl {
    atomic_int stop;
    atomic_int pid;
} wk_qtpl_ctl;

/* Builds (blocking: tens of seconds under TCG; minutes for 'debian') or finds the
 * template snapshot of the root filesystem rootfs for the given shape; fills *t. Runs
 * worker/vm/build-guest for the guest (its disk: the tree plus disk_mib free). tree_key:
 * NULL (the tree is hashed: small trees) or a string naming the tree's content (the
 * 'debian' template's version stamp), which keys its guest instead. ctl: NULL (host
 * init) or the stop of a build on its own thread. Serialized between workers of one host
 * by a lock file. 0 or -errno + *why. */
int wk_qtpl_ensure(const wk_qemu_cfg *c, const char *rootfs, const char *agent,
                   uint32_t memory_mib, uint32_t vcpus, uint32_t pids_max, uint32_t disk_mib,
                   const char *tree_key, wk_qtpl_ctl *ctl, wk_qtpl *t, const char **why);
/* Marks the template and its guest as in use now (host init does; then hourly). */
void wk_qtpl_touch(const wk_qtpl *t);
#define WK_QTPL_KEEP_S (24 * 3600) /* a template or guest no worker marked this long goes
                                      (when a new one is built) */
/* Files of a template snapshot. */
#define WK_QTPL_RAM "ram"        /* guest memory (the RAM file, holes where zero) */
#define WK_QTPL_STATE "state"    /* device state (migration stream, RAM excluded) */
#define WK_QTPL_DISK "disk.qcow2" /* the disk as the template left it (backing: rootfs.img) */
#define WK_QTPL_BLANK "blank.qcow2" /* an empty overlay of disk.qcow2: each sandbox's copy */

/* ---- the driver's host-wide state (qemu.c) --------------------------------- */
struct wk_driver {
    struct event_base *base;
    char host_id[64];            /* names the worker's parent cgroups */
    wk_pool *pool;
    wk_qemu_cfg cfg;
    char state_dir[WK_QEMU_PATH_MAX]; /* its adopt/<id>/handle: the VMs a restart keeps */
    int adopting;                /* from host_init to adopt_end */
    json_t *keep_dirs;           /* host_init: {folder: id} of the VMs a live handle names */
    wk_qtpl tpl;                 /* 'base' (the pool's) */
    char agent[WK_QEMU_PATH_MAX];
    /* 'debian' (driver.h tpl_image): its guest and template snapshot, made on a thread of
     * its own from templates_dir/debian/rootfs. deb_mu guards the deb_* fields but deb_tpl,
     * which the thread fills before deb_ready is set and which is read-only after. */
    pthread_mutex_t deb_mu;
    pthread_t deb_th;
    int deb_th_started;
    int deb_state;               /* WK_QDEB_* */
    int64_t deb_failed_at;       /* s */
    const char *deb_why;         /* FAILED: why (a static sentence) */
    char deb_rootfs[WK_QEMU_PATH_MAX];
    wk_qtpl_ctl deb_ctl;
    atomic_int deb_ready;        /* the loop's look: deb_tpl is usable */
    wk_qtpl deb_tpl;
    wk_limits defaults;          /* every field set */
    wk_host_res res;
    uint32_t create_timeout_ms;  /* restore until the agent answered */
    uint32_t move_timeout_ms;    /* pause, resume, save to disk, load */
    uint32_t save_after_ms;      /* a VM paused this long is saved to disk (0 = never) */
    uint32_t save_below_mib;     /* ... and sooner while MemAvailable is under this */
    struct event *ev_pressure;   /* memory-pressure tick (and the hourly template touch) */
    int64_t touched_ms;
    wk_sandbox *vms;             /* every VM not yet freed (sandboxes and the pool's) */
    int n_vms;
    uint32_t pool_target;        /* VMs kept restored and warmed up for the next creates */
    uint32_t pool_seq;
    struct event *ev_pool;
};

enum { WK_QDEB_NONE, WK_QDEB_BUILDING, WK_QDEB_READY, WK_QDEB_FAILED };

#define WK_QPOOL_RETRY_MS 10000  /* after a pool VM failed to come up */
#define WK_QEMU_OVERHEAD_MIB 128 /* a VM's cgroup: its RAM + this for QEMU itself (TCG:
                                    ~45 MiB seen) */
#define WK_QEMU_TCG_ACCEL "tcg,tb-size=64" /* its translation cache (MiB), within the overhead */
#define WK_QEMU_PIDS 256         /* a VM's cgroup: QEMU's threads (its I/O pool grows to 64) */

/* ---- qemu_vm.c: one microVM ------------------------------------------------ */
typedef wk_op_cb wk_qvm_cb;

/* driver.h's create, exec, limits and kill for one VM. */
int wk_qvm_create(wk_driver *d, const wk_create_req *req, wk_create_cb cb, void *arg);
int wk_qvm_exec(wk_sandbox *sb, const wk_exec_req *req, wk_exec_cb cb, void *arg);
int wk_qvm_exec_cancel(wk_sandbox *sb, void *arg);
int wk_qvm_exec_input(wk_sandbox *sb, void *arg, const char *data, size_t len, int eof);
/* driver.h's file: on a paused or saved VM the request waits for it to run again (and
 * asks for that), like an exec. */
int wk_qvm_file(wk_sandbox *sb, const wk_file_req *req, wk_file_cb cb, void *arg);
void wk_qvm_limits(const wk_sandbox *sb, wk_limits *out);
/* driver.h's netns: the VM's network namespace (its tap's), kept while saved to disk. */
int wk_qvm_netns(const wk_sandbox *sb);
/* The guest's part of a create's trust_pem (in SF_TRUST_PEM): its template's CAs plus
 * the egress CA in /etc/ssl/certs (ca-certificates.crt and sandfleet-ca-bundle.pem),
 * /etc made writable for the moment (the guest's resolver names its tap already). */
#define WK_QEMU_TRUST_CMD                                                                   \
    "{ mount -o remount,bind,rw /etc 2>/dev/null; true; } && c=/etc/ssl/certs && "           \
    "mkdir -p $c && { cat $c/ca-certificates.crt 2>/dev/null; "                              \
    "printf '%s\\n' \"$SF_TRUST_PEM\"; } >$c/sandfleet-ca-bundle.pem && "                     \
    "cp $c/sandfleet-ca-bundle.pem $c/ca-certificates.crt && "                               \
    "{ mount -o remount,bind,ro /etc 2>/dev/null; true; }"
void wk_qvm_kill(wk_sandbox *sb, wk_kill_cb cb, void *arg);
/* Pause (QMP stop: memory stays, the guest's clock stands still), resume (cont, then a
 * ping sets the guest's clock), save (pause, then the whole VM state to the sandbox's
 * mem.state and QEMU quits: no memory held); pause and resume are driver.h's. An exec on
 * a paused or saved VM resumes it first. cb(arg, 0, NULL) once the state is reached
 * (from the loop, also when it already is), or an error. -ESRCH (killed), -EIO (the VM died), -EAGAIN (still starting),
 * -EBUSY (save: commands are running), -ENOMEM. */
int wk_qvm_pause(wk_sandbox *sb, wk_qvm_cb cb, void *arg);
int wk_qvm_resume(wk_sandbox *sb, wk_qvm_cb cb, void *arg);
int wk_qvm_save(wk_sandbox *sb, wk_qvm_cb cb, void *arg);
/* driver.h's snapshot: a waiter like a pause; from PAUSED the VM's state migrates to
 * dir/mem.state and its disk is copied, from SAVED both files are copied; it then goes
 * back (a VM that ran runs again). */
int wk_qvm_snapshot(wk_sandbox *sb, const char *dir, wk_snap_cb cb, void *arg);
/* "starting", "running", "paused", "saved", ... */
const char *wk_qvm_state(const wk_sandbox *sb);
/* How long it has been paused in memory (ms), or -1. */
int64_t wk_qvm_paused_ms(const wk_sandbox *sb);
/* Its QEMU process, or 0 when none runs (saved to disk). */
pid_t wk_qvm_pid(const wk_sandbox *sb);
const char *wk_qvm_id(const wk_sandbox *sb);
/* Its directory: sb_dir/<id>, or sb_dir/.pool-<pid>-<n> when it came from the pool. */
const char *wk_qvm_dir(const wk_sandbox *sb);
/* The pool: VMs restored ahead of time (under sb_dir/.pool-<pid>-<n>) so that a create only
 * pings one. start: arms the refill (host init); set: a new target (0
 * kills the idle ones: tests); ready: how many wait; stop: no more refills (fini). */
int wk_qpool_start(wk_driver *d);
void wk_qpool_set(wk_driver *d, uint32_t target);
int wk_qpool_ready(const wk_driver *d);
void wk_qpool_stop(wk_driver *d);
/* Looks at the pool again in ms (0: now; a later kick does not push back a sooner one). */
void wk_qpool_kick(wk_driver *d, uint32_t ms);
/* qemu_vm.c's side of the pool: 0 not the pool's, 1 warming up, 2 ready; a new pool VM
 * (restoring, -errno + *why); one taken out of the pool and killed. */
int wk_qvm_pool_state(const wk_sandbox *sb);
int wk_qvm_start_pooled(wk_driver *d, const char *name, const char **why);
void wk_qvm_unpool(wk_sandbox *sb);
/* A worker restart (docs/internals/restart.md). adopt: driver.h's, for the VM of sandbox id
 * whose handle (state_dir/adopt/<id>/handle) names a living QEMU of this host; check: that
 * handle, believed only when root's, no link on the way, and its pid still that QEMU
 * (start time, cgroup): 0 with *dir_name (its folder under sb_dir), -ENOENT none, else
 * -errno with why (nothing opened). keep: driver.h's (a VM in the middle of a move is not
 * kept: host_fini kills it); kept: 1 when kept; forget: frees a kept VM's record, leaving
 * its QEMU running (host_fini). handle_remove: the VM's handle and folder go (kill). */
int wk_qvm_adopt(wk_driver *d, const char *id, wk_sandbox **out, int *paused, const char **why);
int wk_qvm_handle_check(const wk_driver *d, const char *id, char *dir_name, size_t n,
                        const char **why);
void wk_qvm_keep(wk_sandbox *sb);
int wk_qvm_kept(const wk_sandbox *sb);
void wk_qvm_forget(wk_sandbox *sb);
void wk_qvm_handle_remove(const wk_driver *d, const char *id);
/* The next VM in the driver's list (d->vms). */
wk_sandbox *wk_qvm_next(const wk_sandbox *sb);

#endif
