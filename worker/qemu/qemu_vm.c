/* One microVM sandbox: its QEMU process, monitor (QMP) and agent link, and the
 * moves between its states, all driven by events on the worker's loop (nothing
 * here waits: QEMU and the guest answer through sockets and the pidfd).
 *
 *   STARTING --pong--> RUNNING --stop--> PAUSED --migrate+quit--> SAVED
 *                         ^                 |                       |
 *                         +--cont+ping------+                       |
 *                         +--spawn+incoming+cont+ping---------------+
 *   any --QEMU exits / guest hangs--> DEAD (execs fail; kill cleans up)
 *
 * Callers ask for a state (pause, resume, save, or an exec that needs RUNNING):
 * each request is a waiter; the VM moves one step at a time towards the oldest
 * waiter's state and answers each waiter when its state is reached. A kill
 * answers every waiter at once and tears down off the loop. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "adopt.h"
#include "qemu_int.h"
#include "sf_log.h"
#include "snapfs.h"
#include "sf_util.h"
#include "sf_msg.h"

#define ERR_KILLED SF_MSG_KILLED_DURING_EXEC
#define ERR_DEAD                                                                                  \
    "The sandbox's VM stopped (its QEMU process ended); kill this sandbox and create a new one."
#define ERR_HUNG                                                                                  \
    "The sandbox's VM stopped answering and was stopped at the command's deadline; kill this "    \
    "sandbox and create a new one."
#define ERR_NOMEM SF_MSG_HOST_NOMEM
#define PING_TIMEOUT_MS 30000 /* a resumed or loaded guest answers in well under a second */

enum { VM_STARTING, VM_RUNNING, VM_PAUSING, VM_PAUSED, VM_RESUMING, VM_SAVING, VM_SAVED,
       VM_LOADING, VM_DEAD, VM_POOLED, VM_SNAPPING };

static const char *const state_name[] = {
    [VM_STARTING] = "starting", [VM_RUNNING] = "running", [VM_PAUSING] = "pausing",
    [VM_PAUSED] = "paused",     [VM_RESUMING] = "resuming", [VM_SAVING] = "saving",
    [VM_SAVED] = "saved",       [VM_LOADING] = "loading",  [VM_DEAD] = "dead",      [VM_POOLED] = "pooled",
    [VM_SNAPPING] = "snapshotting",
};

/* What a waiter wants: a stable state, or a snapshot (taken from PAUSED or SAVED; the VM
 * then goes back to the state it was in). */
enum { WANT_RUNNING, WANT_PAUSED, WANT_SAVED, WANT_SNAPSHOT };

typedef struct waiter {
    struct waiter *next;
    int want;
    wk_qvm_cb cb;           /* pause/resume/save */
    void *arg;
    /* an exec waiting for RUNNING: its request, copied */
    wk_exec_cb exec_cb;
    void (*on_output)(void *arg, int stream, const char *data, size_t len);
    char *command, *cwd;
    char **env;
    uint32_t timeout_ms, cap_bytes;
    int has_stdin, background, pipe;
    uint32_t detach_ms;
    char *stdin_data;
    size_t stdin_len;
    /* a file request waiting for RUNNING: its request, copied */
    wk_file_cb file_cb;
    wk_file_req freq;
    char *fpath, *fto;
    void *fdata;
    /* a snapshot: its directory; run again after it (it was running when asked) */
    wk_snap_cb snap_cb;
    char *snap_dir;
    int snap_resume;
} waiter;

struct wk_sandbox {
    wk_driver *d;
    const wk_qtpl *tpl;         /* its template snapshot: d->tpl (base) or d->deb_tpl */
    wk_sandbox *next, *prev;    /* d->vms */
    char id[64];
    char dir[WK_QEMU_PATH_MAX];
    wk_cgroup cg;               /* QEMU's groups: the VM's RAM + overhead, its vcpu_milli */
    int cg_made;
    wk_limits lim;
    int st;
    pid_t pid;
    int pidfd;
    struct event *ev_exit;
    int report;                 /* the spawn's report pipe, until QEMU is known to run */
    int netns;                  /* its network namespace (kept while saved to disk) */
    wk_qmp *qmp;
    wk_alink *link;
    struct event *ev_timer;     /* create deadline; then the save-to-disk delay */
    struct event *ev_kick;      /* runs advance() from the loop */
    int save_fd;                /* the state file while saving (or taking a snapshot) */
    char *from_snap;            /* create: the snapshot it starts from (driver.h) */
    waiter *snap_w;             /* the snapshot being taken (out of the waiters' list) */
    int snap_saved;             /* ...of a VM saved to disk (it stays there) */
    int snap_copying;           /* ...its files are being copied on the pool */
    int quitting;               /* SAVING: QEMU was told to quit */
    waiter *w_head, *w_tail;
    char *setup_cmd;            /* limits that differ from the template's, and the trust
                                   store, applied at create */
    char *trust_pem;            /* the create's trust_pem (the setup command's input) */
    wk_create_cb create_cb;
    void *create_arg;
    wk_kill_cb kill_cb;
    void *kill_arg;
    int killed;
    int pooled;                 /* restored ahead of time for the next create (not a sandbox
                                   yet): VM_STARTING while it warms up, then VM_POOLED */
    const char *dead_why;       /* DEAD: what every later call is told */
    int depth;                  /* > 0 while callbacks run or the teardown is under way */
    uint64_t t0_us;
    uint64_t spawned_us, loaded_us; /* create: QEMU started, device state loaded */
    int64_t paused_at_ms;
    int kept;                   /* left running for the next worker (host_fini frees only) */
    int adopted;                /* taken back from an earlier worker run (not our child) */
    int holder;                 /* SAVED: pidfd of the process holding its network namespace
                                   (qemu_spawn.c wk_qspawn_holder), or -1 */
    pid_t holder_pid;
    wk_qtpl *own_tpl;           /* adopted: its template, when not this run's base one */
};

static void advance(wk_sandbox *sb);
static void on_kick(evutil_socket_t fd, short what, void *arg);
static void fail_vm(wk_sandbox *sb, const char *why, const char *detail);
static void snap_answer(wk_sandbox *sb, int rc, uint64_t bytes, const char *why);
static void snap_finish(wk_sandbox *sb, int rc, uint64_t bytes, const char *why);
static void snap_copy(wk_sandbox *sb);
static void kick(wk_sandbox *sb);
#define ERR_SNAP_KILLED SF_MSG_KILLED_DURING_SNAPSHOT
#define ERR_SNAP_DEAD "The sandbox's VM stopped while its snapshot was taken."

/* ---- small things ---------------------------------------------------------- */

const char *wk_qvm_state(const wk_sandbox *sb)
{
    return sb ? state_name[sb->st] : "?";
}

pid_t wk_qvm_pid(const wk_sandbox *sb)
{
    return sb && sb->pidfd >= 0 ? sb->pid : 0;
}

wk_sandbox *wk_qvm_next(const wk_sandbox *sb)
{
    return sb->next;
}

const char *wk_qvm_dir(const wk_sandbox *sb)
{
    return sb ? sb->dir : NULL;
}

const char *wk_qvm_id(const wk_sandbox *sb)
{
    return sb ? sb->id : NULL;
}

void wk_qvm_limits(const wk_sandbox *sb, wk_limits *out)
{
    *out = sb->lim;
}

int wk_qvm_netns(const wk_sandbox *sb)
{
    return sb->netns >= 0 ? sb->netns : -ENOENT;
}

static int path_in(const wk_sandbox *sb, char *buf, size_t n, const char *name)
{
    int r = snprintf(buf, n, "%s/%s", sb->dir, name);
    return r < 0 || (size_t)r >= n ? -ENAMETOOLONG : 0;
}

static void vm_release(wk_sandbox *sb)
{
    if (!sb->killed || sb->depth > 0)
        return;
    if (sb->prev)
        sb->prev->next = sb->next;
    else
        sb->d->vms = sb->next;
    if (sb->next)
        sb->next->prev = sb->prev;
    sb->d->n_vms--;
    if (sb->ev_kick)
        event_free(sb->ev_kick);
    free(sb->setup_cmd);
    free(sb->trust_pem);
    free(sb->from_snap);
    free(sb->own_tpl);
    free(sb);
}

static void waiter_free(waiter *w)
{
    for (size_t i = 0; w->env && w->env[i]; i++)
        free(w->env[i]);
    free(w->env);
    free(w->command);
    free(w->cwd);
    free(w->fpath);
    free(w->fto);
    free(w->fdata);
    free(w->snap_dir);
    free(w->stdin_data);
    free(w);
}

/* Answers waiter w with rc/why (an exec waiter gets an error result or runs). */
static void waiter_fire(wk_sandbox *sb, waiter *w, int rc, const char *why)
{
    if (w->exec_cb) {
        if (rc < 0) {
            wk_exec_result res = {.exit_code = -1, .error = why};
            w->exec_cb(w->arg, &res);
        } else {
            const wk_exec_req req = {.command = w->command, .cwd = w->cwd,
                                     .env = (const char *const *)w->env,
                                     .timeout_ms = w->timeout_ms, .cap_bytes = w->cap_bytes,
                                     .on_output = w->on_output, .has_stdin = w->has_stdin,
                                     .stdin_data = w->stdin_data, .stdin_len = w->stdin_len,
                                     .background = w->background,
                                     .detach_ms = w->detach_ms, .pipe = w->pipe};
            if (wk_alink_exec(sb->link, &req, w->exec_cb, w->arg) < 0) {
                wk_exec_result res = {.exit_code = -1, .error = ERR_NOMEM};
                w->exec_cb(w->arg, &res);
            }
        }
    } else if (w->file_cb) {
        int frc = rc < 0 ? rc : wk_alink_file(sb->link, &w->freq, w->file_cb, w->arg);
        if (frc < 0) {
            wk_file_result res = {.error = rc < 0 ? why : ERR_NOMEM};
            w->file_cb(w->arg, &res);
        }
    } else if (w->snap_cb) { /* answered here only when it failed (snap_finish otherwise) */
        w->snap_cb(w->arg, rc < 0 ? rc : -EIO, 0,
                   sb->killed ? SF_MSG_KILLED_DURING_SNAPSHOT : why);
    } else if (w->cb) {
        w->cb(w->arg, rc, why);
    }
    waiter_free(w);
}

/* Answers, in order, the leading waiters that state st satisfies. */
static void fire_reached(wk_sandbox *sb)
{
    int want = sb->st == VM_RUNNING ? WANT_RUNNING
               : sb->st == VM_PAUSED ? WANT_PAUSED
               : sb->st == VM_SAVED  ? WANT_SAVED
                                     : -1;

    sb->depth++;
    while (sb->w_head && !sb->killed) {
        waiter *w = sb->w_head;
        /* a saved VM is paused too */
        if (!(w->want == want || (w->want == WANT_PAUSED && want == WANT_SAVED)))
            break;
        sb->w_head = w->next;
        if (!sb->w_head)
            sb->w_tail = NULL;
        waiter_fire(sb, w, 0, NULL);
    }
    sb->depth--;
}

static void fail_waiters(wk_sandbox *sb, const char *why)
{
    sb->depth++;
    while (sb->w_head) {
        waiter *w = sb->w_head;
        sb->w_head = w->next;
        if (!sb->w_head)
            sb->w_tail = NULL;
        waiter_fire(sb, w, -EIO, why);
    }
    sb->depth--;
}

static void add_waiter(wk_sandbox *sb, waiter *w)
{
    if (sb->w_tail)
        sb->w_tail->next = w;
    else
        sb->w_head = w;
    sb->w_tail = w;
}

static int set_timer(wk_sandbox *sb, uint64_t ms, event_callback_fn fn)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};

    if (sb->ev_timer)
        event_free(sb->ev_timer);
    if (!(sb->ev_timer = evtimer_new(sb->d->base, fn, sb)))
        return -ENOMEM;
    return evtimer_add(sb->ev_timer, &tv) < 0 ? -ENOMEM : 0;
}

static void clear_timer(wk_sandbox *sb)
{
    if (sb->ev_timer) {
        event_free(sb->ev_timer);
        sb->ev_timer = NULL;
    }
}

/* Drops the process's monitor and agent connections and events (not the pidfd). */
static void drop_conns(wk_sandbox *sb)
{
    wk_qmp_free(sb->qmp);
    sb->qmp = NULL;
    wk_alink_free(sb->link);
    sb->link = NULL;
    if (sb->save_fd >= 0) {
        close(sb->save_fd);
        sb->save_fd = -1;
    }
}

/* ---- the QEMU process -------------------------------------------------------- */

/* A unix socket `name` in the folder dfd (reached through /proc/self/fd: no path walked
 * again, and short enough whatever state_dir is): listening (made anew) or connected. */
static int sock_at(int dfd, const char *name, int listening)
{
    struct sockaddr_un a;
    int fd, rc;

    memset(&a, 0, sizeof(a));
    a.sun_family = AF_UNIX;
    if (snprintf(a.sun_path, sizeof(a.sun_path), "/proc/self/fd/%d/%s", dfd, name) >=
        (int)sizeof(a.sun_path))
        return -ENAMETOOLONG;
    if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
        return -errno;
    if (listening)
        unlinkat(dfd, name, 0);
    if (listening ? bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 4) < 0
                  : connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        rc = -errno;
        close(fd);
        return rc;
    }
    return fd;
}

/* QEMU's monitor and agent channels: sockets it listens on in the VM's folder (so that a
 * restarted worker connects again), and this worker's connections to them (QEMU accepts
 * them once it runs). ag/mon: [0] ours, [1] QEMU's. */
static int vm_socks(const wk_sandbox *sb, int ag[2], int mon[2])
{
    int dfd = wk_root_dir_open(AT_FDCWD, sb->dir, 0), rc = 0;

    if (dfd < 0)
        return dfd;
    if ((ag[1] = sock_at(dfd, WK_QEMU_AGENT_SOCK, 1)) < 0 ||
        (mon[1] = sock_at(dfd, WK_QEMU_QMP_SOCK, 1)) < 0 ||
        (ag[0] = sock_at(dfd, WK_QEMU_AGENT_SOCK, 0)) < 0 ||
        (mon[0] = sock_at(dfd, WK_QEMU_QMP_SOCK, 0)) < 0)
        rc = ag[1] < 0 ? ag[1] : mon[1] < 0 ? mon[1] : ag[0] < 0 ? ag[0] : mon[0];
    for (int i = 0; i < 2; i++) { /* (-errno values are not fds) */
        if (ag[i] < 0)
            ag[i] = -1;
        if (mon[i] < 0)
            mon[i] = -1;
    }
    close(dfd);
    return rc;
}

/* The handle a restarted worker takes the VM back by (state_dir/adopt/<id>/handle, root's,
 * 0700 folder; written whole, then renamed into place), one line:
 *   v1 <pid> <its start time (/proc/PID/stat field 22)> <folder name under sb_dir>
 *      <template key> <template memory_mib> <vcpus> <disk_mib>
 *      <memory_mib> <vcpu_milli> <disk_mib> <pids_max> <inodes> run|saved
 * run: the pid is QEMU's; saved (to disk, no QEMU): the holder's of its network namespace.
 * Written once the VM answered (create, load from disk) and when it went to disk. */
#define HANDLE_MAX 512
static void handle_write(const wk_sandbox *sb)
{
    const char *name = strrchr(sb->dir, '/');
    unsigned long long start = 0;
    char line[HANDLE_MAX], st;
    int n, dfd, fd = -1, ok = 0;

    if (sb->pooled || !sf_id_valid(sb->id) || !name)
        return;
    pid_t pid = sb->pidfd >= 0 ? sb->pid : sb->holder >= 0 ? sb->holder_pid : 0;

    if (pid && wk_proc_stat(pid, &start, &st) < 0)
        return; /* it died: on_exit_ev says so */
    n = snprintf(line, sizeof(line), "v1 %d %llu %s %s %u %u %u %u %u %u %u %llu %s\n",
                 (int)pid, start, name + 1, sb->tpl->key,
                 sb->tpl->memory_mib, sb->tpl->vcpus, sb->tpl->disk_mib, sb->lim.memory_mib,
                 sb->lim.vcpu_milli, sb->lim.disk_mib, sb->lim.pids_max,
                 (unsigned long long)sb->lim.inodes, sb->pidfd >= 0 ? "run" : "saved");
    if (n > 0 && n < (int)sizeof(line) && (dfd = wk_adopt_dir(sb->d->state_dir, sb->id, 1)) >= 0) {
        fd = openat(dfd, "handle.tmp", O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC,
                    0600);
        ok = fd >= 0 && write(fd, line, (size_t)n) == n && close(fd) == 0 &&
             renameat(dfd, "handle.tmp", dfd, "handle") == 0;
        if (!ok && fd >= 0)
            unlinkat(dfd, "handle.tmp", 0);
        close(dfd);
    }
    if (!ok)
        sf_warn("msg=\"cannot record the VM for a worker restart; a restart will lose it\" "
                "sandbox=%s errno=%d", sb->id, errno);
}

void wk_qvm_handle_remove(const wk_driver *d, const char *id)
{
    int dfd = wk_adopt_dir(d->state_dir, id, 0), root;

    if (dfd < 0)
        return;
    unlinkat(dfd, "handle", 0);
    unlinkat(dfd, "handle.tmp", 0);
    close(dfd);
    if ((root = wk_adopt_root(d->state_dir, 0)) >= 0) {
        unlinkat(root, id, AT_REMOVEDIR);
        close(root);
    }
}

static void on_exit_ev(evutil_socket_t fd, short what, void *arg);
static void on_qmp_event(void *arg, const char *event, json_t *data);
static void on_link_down(void *arg, const char *why);

/* Starts QEMU in mode (RESTORE or LOAD) with the given incoming state file; sets up
 * the monitor and agent connections. */
static int start_qemu(wk_sandbox *sb, int mode, const char *state_path, const char *disk_from,
                      const char **why)
{
    char disk[WK_QEMU_PATH_MAX], log[WK_QEMU_PATH_MAX], blank[WK_QEMU_PATH_MAX];
    int ag[2] = {-1, -1}, mon[2] = {-1, -1}, in = -1, tasks[WK_CG_N], box = -1, rc;
    const wk_driver *d = sb->d;
    char **argv = NULL;
    wk_qspawn sp;

    if (path_in(sb, disk, sizeof(disk), "disk.qcow2") < 0 ||
        path_in(sb, log, sizeof(log), "qemu.log") < 0 ||
        snprintf(blank, sizeof(blank), "%s/%s", sb->tpl->dir, WK_QTPL_BLANK) >= (int)sizeof(blank)) {
        *why = SF_MSG_STATE_DIR_LONG;
        return -ENAMETOOLONG;
    }
    if (!(argv = wk_qargs(&d->cfg, sb->tpl, mode, disk, NULL))) {
        *why = ERR_NOMEM;
        return -ENOMEM;
    }
    if ((in = open(state_path, O_RDONLY | O_CLOEXEC)) < 0) {
        rc = -errno;
        *why = mode == WK_QARGS_RESTORE
                   ? "The template snapshot is missing; restart the worker to rebuild it."
                   : "The sandbox's saved state is missing; kill it and create a new one.";
        goto out;
    }
    for (int i = 0; i < WK_CG_N; i++)
        tasks[i] = -1;
    if ((rc = wk_cgroup_open_tasks(&sb->cg, tasks, &box)) < 0) {
        *why = "Cannot open the VM's cgroups; check /sys/fs/cgroup.";
        goto out;
    }
    if ((rc = vm_socks(sb, ag, mon)) < 0) {
        *why = "Cannot make the VM's monitor and agent sockets in its folder under "
               "state_dir/qemu; check state_dir.";
        goto out;
    }
    sp = (wk_qspawn){.argv = (const char *const *)argv, .agent_fd = ag[1], .qmp_fd = mon[1],
                     .incoming_fd = in, .netns_fd = sb->netns, .tap = 1, .log_path = log,
                     .copy_from = mode == WK_QARGS_RESTORE ? blank : disk_from,
                     .copy_to = mode == WK_QARGS_RESTORE || disk_from ? disk : NULL,
                     .cg_fd = sb->cg.v2 ? sb->cg.fd : -1, .tasks = sb->cg.v2 ? NULL : tasks,
                     .outlive = 1};
    if ((rc = wk_qspawn_start(&sp, &sb->pid, &sb->pidfd, &sb->report, why)) < 0)
        goto out;
    if (!(sb->ev_exit = event_new(d->base, sb->pidfd, EV_READ | EV_PERSIST, on_exit_ev, sb)) ||
        event_add(sb->ev_exit, NULL) < 0 ||
        !(sb->qmp = wk_qmp_new(d->base, mon[0], on_qmp_event, sb))) {
        rc = -ENOMEM;
        *why = ERR_NOMEM;
        goto out; /* the caller kills the process */
    }
    mon[0] = -1;
    sb->link = wk_alink_new(d->base, ag[0], sb->id);
    ag[0] = -1;
    if (!sb->link) {
        rc = -ENOMEM;
        *why = ERR_NOMEM;
        goto out;
    }
    wk_alink_on_down(sb->link, on_link_down, sb);
    rc = 0;
out:
    for (int i = 0; i < 2; i++) {
        if (ag[i] >= 0)
            close(ag[i]);
        if (mon[i] >= 0)
            close(mon[i]);
    }
    if (in >= 0)
        close(in);
    for (int i = 0; i < WK_CG_N; i++)
        if (tasks[i] >= 0)
            close(tasks[i]);
    if (box >= 0)
        close(box);
    wk_qargs_free(argv);
    return rc;
}

/* The process is gone (reaped): its connections go with it. */
static void process_gone(wk_sandbox *sb)
{
    if (sb->ev_exit) {
        event_free(sb->ev_exit);
        sb->ev_exit = NULL;
    }
    if (sb->pidfd >= 0) {
        close(sb->pidfd);
        sb->pidfd = -1;
    }
    if (sb->report >= 0) {
        close(sb->report);
        sb->report = -1;
    }
    drop_conns(sb);
}

/* A saved VM has no QEMU: a small process of its own keeps its network namespace (with
 * the egress proxy's listeners) for its load, also across a worker restart. */
static void holder_start(wk_sandbox *sb)
{
    int tasks[WK_CG_N], box = -1, rc = -ENOENT;

    for (int i = 0; i < WK_CG_N; i++)
        tasks[i] = -1;
    if (sb->netns >= 0 && sb->holder < 0 &&
        (sb->cg.v2 || (rc = wk_cgroup_open_tasks(&sb->cg, tasks, &box)) == 0))
        rc = wk_qspawn_holder(sb->d->agent, sb->netns, sb->cg.v2 ? sb->cg.fd : -1,
                              sb->cg.v2 ? NULL : tasks, &sb->holder_pid, &sb->holder);
    for (int i = 0; i < WK_CG_N; i++)
        if (tasks[i] >= 0)
            close(tasks[i]);
    if (box >= 0)
        close(box);
    if (rc < 0)
        sf_warn("msg=\"no holder for a saved VM's network namespace; a worker restart will "
                "lose it\" sandbox=%s rc=%d", sb->id, rc);
}

static void holder_stop(wk_sandbox *sb)
{
    wk_qspawn_kill(&sb->holder); /* (reaped if ours; its namespace is QEMU's again) */
}

static void on_exit_ev(evutil_socket_t fd, short what, void *arg)
{
    wk_sandbox *sb = arg;
    const char *why = NULL;
    char detail[160];
    int status = wk_qspawn_reap(sb->pidfd), spawn_rc = -EAGAIN;

    if (status < 0)
        return; /* not exited yet (spurious) */
    if (sb->report >= 0)
        spawn_rc = wk_qspawn_report(sb->report, &why);
    sb->depth++;
    process_gone(sb);
    if (sb->st == VM_SAVING && sb->quitting) { /* saved to disk and told to quit */
        sb->quitting = 0;
        clear_timer(sb);
        sb->st = VM_SAVED;
        holder_start(sb);
        handle_write(sb); /* no QEMU now: the holder's */
        sf_info("msg=\"sandbox saved to disk\" sandbox=%s ms=%llu", sb->id,
                (unsigned long long)((sf_mono_us() - sb->t0_us) / 1000));
        fire_reached(sb);
        advance(sb);
    } else if (!sb->killed) {
        snprintf(detail, sizeof(detail), "QEMU exited (status %d) while %s%s%s", status,
                 state_name[sb->st], spawn_rc < 0 && spawn_rc != -EAGAIN ? ": " : "",
                 spawn_rc < 0 && spawn_rc != -EAGAIN && why ? why : "");
        fail_vm(sb, spawn_rc < 0 && spawn_rc != -EAGAIN && why ? why : ERR_DEAD, detail);
    }
    sb->depth--;
    vm_release(sb);
}

/* The last line QEMU wrote to its log (its own account of a failure), or "". */
static void qemu_said(const wk_sandbox *sb, char *buf, size_t n)
{
    char path[WK_QEMU_PATH_MAX], tail[512];
    ssize_t got = 0;
    int fd;

    buf[0] = '\0';
    if (path_in(sb, path, sizeof(path), "qemu.log") < 0 ||
        (fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return;
    if (lseek(fd, -(off_t)(sizeof(tail) - 1), SEEK_END) < 0)
        lseek(fd, 0, SEEK_SET);
    got = read(fd, tail, sizeof(tail) - 1);
    close(fd);
    if (got <= 0)
        return;
    tail[got] = '\0';
    while (got > 0 && (tail[got - 1] == '\n' || tail[got - 1] == '\r'))
        tail[--got] = '\0';
    {
        char *line = strrchr(tail, '\n');
        line = line ? line + 1 : tail;
        for (char *c = line; *c; c++)
            if (*c == '"' || (unsigned char)*c < 0x20)
                *c = '\'';
        snprintf(buf, n, "%.200s", line);
    }
}

/* The VM cannot go on: its process is killed, every waiter and exec fails with why. */
static void fail_vm(wk_sandbox *sb, const char *why, const char *detail)
{
    int was = sb->st;
    char said[256];

    if (sb->st == VM_DEAD)
        return;
    qemu_said(sb, said, sizeof(said));
    sf_warn("msg=\"sandbox VM failed\" sandbox=%s state=%s why=\"%s\" qemu_log=\"%s\"", sb->id,
            state_name[was], detail ? detail : why, said);
    sb->st = VM_DEAD;
    sb->dead_why = why;
    clear_timer(sb);
    sb->depth++;
    if (sb->pidfd >= 0)
        syscall(SYS_pidfd_send_signal, sb->pidfd, SIGKILL, NULL, 0); /* reaped by on_exit_ev */
    if (sb->link)
        wk_alink_close(sb->link, why);
    if (was == VM_STARTING && sb->create_cb) {
        wk_create_cb cb = sb->create_cb;
        sb->create_cb = NULL;
        cb(sb->create_arg, NULL, -EIO, why);
        /* the create failed: nobody else holds sb; tear it down */
        wk_qvm_kill(sb, NULL, NULL);
    } else if (sb->pooled) { /* nobody's sandbox yet: it just goes, and the pool waits */
        sb->pooled = 0;
        wk_qpool_kick(sb->d, WK_QPOOL_RETRY_MS);
        wk_qvm_kill(sb, NULL, NULL);
    }
    fail_waiters(sb, why);
    if (!sb->snap_copying)
        snap_answer(sb, -EIO, 0, ERR_SNAP_DEAD);
    sb->depth--;
}

static void on_link_down(void *arg, const char *why)
{
    wk_sandbox *sb = arg;

    /* A request missed its deadline (the guest hangs) or the agent's connection broke:
     * this VM is of no further use. */
    sb->depth++;
    fail_vm(sb, sb->st == VM_STARTING ? SF_MSG_VM_SLOW_START
                                      : ERR_HUNG,
            why);
    sb->depth--;
    vm_release(sb);
}

/* ---- create (restore from the template) -------------------------------------- */

static void on_created_ping(void *arg, int rc, const char *why);

static void on_setup_done(void *arg, const wk_exec_result *res)
{
    wk_sandbox *sb = arg;
    wk_create_cb cb;

    if (sb->st != VM_STARTING || sb->killed)
        return;
    if (res->error || res->exit_code != 0) {
        fail_vm(sb, "The sandbox's limits or trust store could not be set up inside its VM; "
                    "retry sandbox_create.",
                res->error ? res->error : "the setup command failed");
        return;
    }
    clear_timer(sb);
    if (sb->pooled) { /* warmed up: it waits for a create */
        sb->st = VM_POOLED;
        sf_debug("msg=\"VM ready in the pool\" dir=%s us=%llu", sb->dir,
                 (unsigned long long)(sf_mono_us() - sb->t0_us));
        wk_qpool_kick(sb->d, 0);
        return;
    }
    sb->st = VM_RUNNING;
    handle_write(sb);
    sf_info("msg=\"sandbox created\" sandbox=%s driver=qemu pid=%d create_us=%llu spawn_us=%llu "
            "loaded_us=%llu", sb->id, (int)sb->pid, (unsigned long long)(sf_mono_us() - sb->t0_us),
            (unsigned long long)(sb->spawned_us - sb->t0_us),
            (unsigned long long)(sb->loaded_us ? sb->loaded_us - sb->t0_us : 0));
    cb = sb->create_cb;
    sb->create_cb = NULL;
    sb->depth++;
    cb(sb->create_arg, sb, 0, NULL);
    sb->depth--;
    if (!sb->killed) {
        fire_reached(sb);
        advance(sb);
    }
    vm_release(sb);
}

static void on_created_ping(void *arg, int rc, const char *why)
{
    wk_sandbox *sb = arg;
    char ns[64];
    wk_exec_result ok = {0};

    if (sb->st != VM_STARTING || sb->killed)
        return;
    if (rc < 0) {
        fail_vm(sb, rc == -ETIMEDOUT ? SF_MSG_VM_SLOW_START
                                     : why,
                why);
        return;
    }
    /* QEMU runs (the guest answered): its network namespace is the sandbox's. */
    if (sb->report >= 0) {
        close(sb->report);
        sb->report = -1;
    }
    snprintf(ns, sizeof(ns), "/proc/%d/ns/net", (int)sb->pid);
    if (sb->netns < 0 && (sb->netns = open(ns, O_RDONLY | O_CLOEXEC)) < 0) {
        fail_vm(sb, "The sandbox's network namespace vanished while it started; retry "
                    "sandbox_create.", "cannot open the QEMU process's netns");
        return;
    }
    if (sb->setup_cmd) {
        char *pem_env = NULL;
        const char *env[2] = {NULL, NULL};
        wk_exec_req req = {.command = sb->setup_cmd,
                           .timeout_ms = sb->d->create_timeout_ms, /* the create deadline bounds it */
                           .env = env};
        int rc2;
        if (sb->trust_pem && asprintf(&pem_env, "SF_TRUST_PEM=%s", sb->trust_pem) < 0) {
            fail_vm(sb, ERR_NOMEM, SF_MSG_VM_SETUP_QUEUE_WHY);
            return;
        }
        env[0] = pem_env;
        rc2 = wk_alink_exec(sb->link, &req, on_setup_done, sb);
        free(pem_env);
        if (rc2 < 0)
            fail_vm(sb, ERR_NOMEM, SF_MSG_VM_SETUP_QUEUE_WHY);
        return;
    }
    on_setup_done(sb, &ok);
}

static void on_qmp_failed_step(void *arg, json_t *ret, const char *err)
{
    wk_sandbox *sb = arg;

    if (!err || sb->killed || sb->st == VM_DEAD)
        return;
    sb->depth++;
    fail_vm(sb, sb->st == VM_STARTING ? "QEMU could not restore the template snapshot; the "
                                        "template may be damaged: restart the worker to rebuild it."
                                      : "QEMU refused to change the VM's state; kill this sandbox "
                                        "and create a new one.",
            err);
    sb->depth--;
    vm_release(sb);
}

static void on_create_deadline(evutil_socket_t fd, short what, void *arg)
{
    wk_sandbox *sb = arg;

    sb->depth++;
    fail_vm(sb, SF_MSG_VM_SLOW_START, "create deadline passed");
    sb->depth--;
    vm_release(sb);
}

/* The incoming side: take the device state from fd 6 (RAM: the template's file). */
static int incoming(wk_sandbox *sb)
{
    json_t *caps = wk_qmp_caps();

    if (wk_qmp_cmd(sb->qmp, "migrate-set-capabilities", caps, -1, on_qmp_failed_step, sb) < 0 ||
        wk_qmp_cmd(sb->qmp, "migrate-incoming",
                   json_pack("{s:s}", "uri", WK_QEMU_INCOMING_URI), -1,
                   on_qmp_failed_step, sb) < 0)
        return -ENOMEM;
    return 0;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* What the template does not have already, as one command in the guest: the limits,
 * and the egress CA in its trust store (SF_TRUST_PEM in the command's environment; /etc
 * is read-only in the guest but for this). */
static int make_setup(wk_sandbox *sb, const char *trust_pem)
{
    const wk_qtpl *t = sb->tpl;
    char limits[256] = "";

    free(sb->setup_cmd);
    sb->setup_cmd = NULL;
    free(sb->trust_pem);
    sb->trust_pem = NULL;
    if (trust_pem && !(sb->trust_pem = strdup(trust_pem)))
        return -ENOMEM;
    if (sb->lim.memory_mib < t->memory_mib || sb->lim.pids_max != t->pids_max)
        snprintf(limits, sizeof(limits),
                 "echo %u > /sys/fs/cgroup/sandbox/pids.max && echo %llu > "
                 "/sys/fs/cgroup/sandbox/memory.max",
                 sb->lim.pids_max, (unsigned long long)sb->lim.memory_mib << 20);
    if (!limits[0] && !trust_pem)
        return 0;
    return asprintf(&sb->setup_cmd, "%s%s%s", limits, limits[0] && trust_pem ? " && " : "",
                    trust_pem ? WK_QEMU_TRUST_CMD : "") < 0
               ? -ENOMEM
               : 0;
}

/* A VM record under sb_dir/<name> (its directory made), in d's list. */
static int vm_new(wk_driver *d, const char *name, wk_sandbox **out)
{
    wk_sandbox *sb = calloc(1, sizeof(*sb));
    int rc;

    if (!sb)
        return -ENOMEM;
    sb->d = d;
    sb->tpl = &d->tpl;
    sb->pidfd = sb->report = sb->netns = sb->save_fd = sb->holder = -1;
    sb->st = VM_STARTING;
    sb->t0_us = sf_mono_us();
    snprintf(sb->id, sizeof(sb->id), "%s", name);
    if (!(sb->ev_kick = evtimer_new(d->base, on_kick, sb))) {
        free(sb);
        return -ENOMEM;
    }
    if (snprintf(sb->dir, sizeof(sb->dir), "%s/%s", d->cfg.sb_dir, name) >= (int)sizeof(sb->dir)) {
        event_free(sb->ev_kick);
        free(sb);
        return -ENAMETOOLONG;
    }
    if (mkdir(sb->dir, 0700) < 0) {
        rc = errno == EEXIST ? -EEXIST : -errno;
        event_free(sb->ev_kick);
        free(sb);
        return rc;
    }
    sb->cg.fd = -1;
    sb->next = d->vms;
    if (d->vms)
        d->vms->prev = sb;
    d->vms = sb;
    d->n_vms++;
    *out = sb;
    return 0;
}

/* The VM's cgroups (named like its directory, without a leading dot): its RAM and
 * QEMU's own memory, sb->lim's CPU, QEMU's threads. */
static int vm_cgroup(wk_sandbox *sb, const char **why)
{
    const char *name = strrchr(sb->dir, '/');
    wk_limits l = {.memory_mib = sb->tpl->memory_mib + WK_QEMU_OVERHEAD_MIB,
                   .vcpu_milli = sb->lim.vcpu_milli, .pids_max = WK_QEMU_PIDS};
    int rc;

    name = name ? name + 1 : sb->dir;
    if (*name == '.')
        name++;
    if ((rc = wk_cgroup_create(&sb->cg, sb->d->host_id, name, &l, why)) < 0)
        return rc;
    sb->cg_made = 1;
    return 0;
}

/* Restores the template into sb; the ping (clock, entropy, name) ends it. */
static int vm_restore(wk_sandbox *sb, const char **why)
{
    wk_driver *d = sb->d;
    unsigned char seed[32];
    char state[WK_QEMU_PATH_MAX];
    int rc;

    if ((rc = vm_cgroup(sb, why)) < 0)
        return rc;
    if (snprintf(state, sizeof(state), "%s/%s", sb->tpl->dir, WK_QTPL_STATE) >= (int)sizeof(state)) {
        *why = SF_MSG_VM_DIR_LONG;
        return -ENAMETOOLONG;
    }
    if (getrandom(seed, sizeof(seed), GRND_NONBLOCK) != (ssize_t)sizeof(seed)) {
        *why = SF_MSG_HOST_RANDOM_NOT_READY;
        return -EIO;
    }
    rc = start_qemu(sb, WK_QARGS_RESTORE, state, NULL, why);
    sb->spawned_us = sf_mono_us();
    if (rc < 0 || (rc = incoming(sb)) < 0 ||
        (rc = wk_alink_ping(sb->link, now_ns(), seed, sizeof(seed), sb->pooled ? "pool" : sb->id,
                            d->create_timeout_ms, on_created_ping, sb)) < 0 ||
        (rc = set_timer(sb, d->create_timeout_ms, on_create_deadline)) < 0) {
        if (!*why)
            *why = ERR_NOMEM;
        return rc;
    }
    return 0;
}

/* Starts sb from a snapshot (driver.h): its memory and devices load from the snapshot's
 * mem.state, its disk is a copy of the snapshot's (backed by the template's disk, as
 * every VM's). The guest was stopped when it was captured: `cont` runs it once loaded,
 * and the ping gives it the clock, fresh entropy and its new name. Its limits and trust
 * store are the captured sandbox's (the same shape: the scheduler sees to it). */
static int vm_restore_snap(wk_sandbox *sb, const char **why)
{
    wk_driver *d = sb->d;
    unsigned char seed[32];
    char words[64], state[WK_QEMU_PATH_MAX], disk[WK_QEMU_PATH_MAX];
    int rc;

    if ((rc = wk_snap_meta_read(sb->from_snap, "qemu", words, sizeof(words))) < 0) {
        *why = rc == -ESTALE ? "The snapshot was not taken by this host's qemu driver."
                             : SF_MSG_SNAPSHOT_FILES_MISSING;
        return rc == -ESTALE ? rc : -ENOENT;
    }
    if (atomic_load(&d->deb_ready) && !strcmp(words, d->deb_tpl.key))
        sb->tpl = &d->deb_tpl; /* a debian sandbox's */
    else if (strcmp(words, d->tpl.key) != 0) {
        *why = "The snapshot was taken from an older template snapshot of this host (it was "
               "rebuilt since); delete it and take a new one.";
        return -ESTALE;
    }
    if ((rc = vm_cgroup(sb, why)) < 0)
        return rc;
    if (snprintf(state, sizeof(state), "%s/mem.state", sb->from_snap) >= (int)sizeof(state) ||
        snprintf(disk, sizeof(disk), "%s/disk.qcow2", sb->from_snap) >= (int)sizeof(disk)) {
        *why = SF_MSG_STATE_DIR_LONG;
        return -ENAMETOOLONG;
    }
    if (getrandom(seed, sizeof(seed), GRND_NONBLOCK) != (ssize_t)sizeof(seed)) {
        *why = SF_MSG_HOST_RANDOM_NOT_READY;
        return -EIO;
    }
    rc = start_qemu(sb, WK_QARGS_LOAD, state, disk, why);
    sb->spawned_us = sf_mono_us();
    if (rc < 0 || (rc = incoming(sb)) < 0)
        goto fail;
    wk_alink_hold(sb->link, 1); /* until cont: the guest cannot answer before */
    if ((rc = wk_alink_ping(sb->link, now_ns(), seed, sizeof(seed), sb->id, d->create_timeout_ms,
                            on_created_ping, sb)) < 0 ||
        (rc = set_timer(sb, d->create_timeout_ms, on_create_deadline)) < 0)
        goto fail;
    return 0;
fail:
    if (!*why)
        *why = ERR_NOMEM;
    return rc;
}

static void on_snap_continued(void *arg, json_t *ret, const char *err)
{
    wk_sandbox *sb = arg;

    if (sb->st != VM_STARTING || sb->killed)
        return;
    if (err) {
        on_qmp_failed_step(sb, NULL, err);
        return;
    }
    wk_alink_hold(sb->link, 0);
}

/* Hands a warmed-up pool VM to a create: a ping gives it the clock, fresh entropy and
 * the sandbox's name (the pool's own ping ran the same code in the guest, so this one is
 * quick). Its directory keeps its pool name: QEMU reopens its disk by path (when it
 * saves the VM to disk, for one). */
static int vm_take(wk_sandbox *sb, const wk_create_req *req, wk_create_cb cb, void *arg)
{
    unsigned char seed[32];
    int rc;

    if (getrandom(seed, sizeof(seed), GRND_NONBLOCK) != (ssize_t)sizeof(seed))
        return -EIO;
    sf_info("msg=\"pool VM becomes a sandbox\" sandbox=%s dir=%s", req->id, sb->dir);
    snprintf(sb->id, sizeof(sb->id), "%s", req->id);
    wk_alink_set_name(sb->link, sb->id);
    sb->lim = req->limits;
    sb->pooled = 0;
    sb->st = VM_STARTING;
    sb->t0_us = sb->spawned_us = sf_mono_us();
    sb->loaded_us = 0;
    sb->create_cb = cb;
    sb->create_arg = arg;
    if ((rc = make_setup(sb, req->trust_pem)) < 0 ||
        (rc = wk_alink_ping(sb->link, now_ns(), seed, sizeof(seed), sb->id,
                            sb->d->create_timeout_ms, on_created_ping, sb)) < 0 ||
        (rc = set_timer(sb, sb->d->create_timeout_ms, on_create_deadline)) < 0) {
        /* answered by the caller: this VM is of no use now */
        sb->create_cb = NULL;
        fail_vm(sb, ERR_NOMEM, "cannot hand out a pool VM");
        return rc;
    }
    wk_qpool_kick(sb->d, 0);
    return 0;
}

int wk_qvm_create(wk_driver *d, const wk_create_req *req, wk_create_cb cb, void *arg)
{
    const char *why = NULL;
    wk_sandbox *sb;
    int rc;

    /* A pool VM's cgroup has the default CPU share: a create asking another restores.
     * The pool holds base VMs; 'debian' (layers: its tree, qemu.c) restores its own. */
    for (sb = d->vms; sb && !req->snapshot && !req->layers &&
                      req->limits.vcpu_milli == d->defaults.vcpu_milli;
         sb = sb->next)
        if (sb->pooled && sb->st == VM_POOLED && !sb->killed)
            return vm_take(sb, req, cb, arg);
    if ((rc = vm_new(d, req->id, &sb)) < 0)
        return rc;
    sb->lim = req->limits;
    if (req->layers)
        sb->tpl = &d->deb_tpl;
    sb->create_cb = cb;
    sb->create_arg = arg;
    if (req->snapshot) /* it has its limits and trust store already */
        rc = (sb->from_snap = strdup(req->snapshot)) ? vm_restore_snap(sb, &why) : -ENOMEM;
    else if ((rc = make_setup(sb, req->trust_pem)) == 0)
        rc = vm_restore(sb, &why);
    if (rc < 0) {
        sf_error("msg=\"sandbox create failed\" sandbox=%s rc=%d why=\"%s\"", sb->id, rc,
                 why ? why : ERR_NOMEM);
        /* Nothing was answered yet: the caller sees rc; tear down what exists. */
        sb->create_cb = NULL;
        sb->st = VM_DEAD;
        wk_qvm_kill(sb, NULL, NULL);
        return rc;
    }
    return 0;
}

/* ---- for the pool (qemu_pool.c) ---------------------------------------------- */

int wk_qvm_pool_state(const wk_sandbox *sb)
{
    if (!sb->pooled || sb->killed)
        return 0;
    return sb->st == VM_POOLED ? 2 : 1;
}

int wk_qvm_start_pooled(wk_driver *d, const char *name, const char **why)
{
    wk_sandbox *sb;
    int rc;

    *why = NULL;
    if ((rc = vm_new(d, name, &sb)) < 0)
        return rc;
    sb->pooled = 1;
    sb->lim = d->defaults;
    if ((rc = vm_restore(sb, why)) < 0) {
        sb->pooled = 0;
        sb->st = VM_DEAD;
        wk_qvm_kill(sb, NULL, NULL);
    }
    return rc;
}

void wk_qvm_unpool(wk_sandbox *sb)
{
    if (!sb->pooled || sb->killed)
        return;
    sb->pooled = 0;
    wk_qvm_kill(sb, NULL, NULL);
}

/* ---- pause, resume, save, load ---------------------------------------------- */

static void on_move_deadline(evutil_socket_t fd, short what, void *arg)
{
    wk_sandbox *sb = arg;

    sb->depth++;
    fail_vm(sb, "The sandbox's VM did not answer while it was paused, resumed or saved; kill "
                "this sandbox and create a new one.", "move deadline passed");
    sb->depth--;
    vm_release(sb);
}

/* Enters a move (pausing, resuming, saving, loading): it must end within
 * d->move_timeout_ms (a QEMU that stopped answering its monitor would hold every caller
 * forever). */
static void move_to(wk_sandbox *sb, int st)
{
    sb->st = st;
    if (set_timer(sb, sb->d->move_timeout_ms, on_move_deadline) < 0)
        sf_warn("msg=\"no deadline for a VM move (out of memory)\" sandbox=%s", sb->id);
}

static void on_paused(void *arg, json_t *ret, const char *err);
static void on_resumed_ping(void *arg, int rc, const char *why);

static void on_save_timer(evutil_socket_t fd, short what, void *arg)
{
    wk_sandbox *sb = arg;

    clear_timer(sb);
    if (sb->st != VM_PAUSED || sb->w_head)
        return;
    sf_info("msg=\"paused sandbox goes to disk\" sandbox=%s", sb->id);
    wk_qvm_save(sb, NULL, NULL);
}

static void on_paused(void *arg, json_t *ret, const char *err)
{
    wk_sandbox *sb = arg;

    if (sb->st != VM_PAUSING || sb->killed)
        return;
    if (err) {
        on_qmp_failed_step(sb, NULL, err);
        return;
    }
    wk_alink_hold(sb->link, 1);
    sb->st = VM_PAUSED;
    sb->paused_at_ms = sf_mono_ms();
    clear_timer(sb);
    if (sb->d->save_after_ms)
        set_timer(sb, sb->d->save_after_ms, on_save_timer);
    sb->depth++;
    fire_reached(sb);
    advance(sb);
    sb->depth--;
    vm_release(sb);
}

static void on_resumed_ping(void *arg, int rc, const char *why)
{
    wk_sandbox *sb = arg;

    if ((sb->st != VM_RESUMING && sb->st != VM_LOADING) || sb->killed)
        return;
    if (rc < 0) {
        fail_vm(sb, ERR_HUNG, why);
        return;
    }
    if (sb->st == VM_LOADING) {
        char path[WK_QEMU_PATH_MAX];
        if (path_in(sb, path, sizeof(path), "mem.state") == 0)
            unlink(path); /* a file of tens of MiB: unlinking it is quick */
        holder_stop(sb);
        handle_write(sb); /* its new QEMU */
        sf_info("msg=\"sandbox loaded from disk\" sandbox=%s ms=%llu", sb->id,
                (unsigned long long)((sf_mono_us() - sb->t0_us) / 1000));
    }
    clear_timer(sb);
    sb->st = VM_RUNNING;
    sb->depth++;
    fire_reached(sb);
    advance(sb);
    sb->depth--;
    vm_release(sb);
}

static void on_continued(void *arg, json_t *ret, const char *err);

/* `cont` again, after a VM's state was migrated out (a snapshot of a running sandbox). */
static void on_cont_retry(evutil_socket_t fd, short what, void *arg)
{
    wk_sandbox *sb = arg;

    (void)fd;
    (void)what;
    sb->depth--;
    if (sb->st == VM_RESUMING && !sb->killed &&
        wk_qmp_cmd(sb->qmp, "cont", NULL, -1, on_continued, sb) < 0)
        fail_vm(sb, ERR_NOMEM, "cannot queue cont");
    vm_release(sb);
}

/* QEMU announces a migration `completed` a moment before it leaves its finish-migrate
 * state, and refuses `cont` until then ("Migration is not finalized yet"): once the
 * snapshot of a running VM is taken, its `cont` may meet that moment. It is sent again
 * every 5 ms; the move's deadline still bounds the whole resume. 1: retried. */
static int cont_retry(wk_sandbox *sb, const char *err)
{
    struct timeval tv = {0, 5000};

    if (sb->st != VM_RESUMING || !strstr(err, "not finalized") ||
        event_base_once(sb->d->base, -1, EV_TIMEOUT, on_cont_retry, sb, &tv) < 0)
        return 0;
    sf_debug("msg=\"cont again: the migration is not finalized yet\" sandbox=%s", sb->id);
    sb->depth++;
    return 1;
}

static void on_continued(void *arg, json_t *ret, const char *err)
{
    wk_sandbox *sb = arg;

    if ((sb->st != VM_RESUMING && sb->st != VM_LOADING) || sb->killed)
        return;
    if (err) {
        if (!cont_retry(sb, err))
            on_qmp_failed_step(sb, NULL, err);
        return;
    }
    wk_alink_hold(sb->link, 0);
    /* The guest's clock stood still while it was stopped: the ping sets it. */
    if (wk_alink_ping(sb->link, now_ns(), NULL, 0, NULL, PING_TIMEOUT_MS, on_resumed_ping, sb) < 0)
        fail_vm(sb, ERR_NOMEM, "cannot queue the ping");
}

static void on_migrate_started(void *arg, json_t *ret, const char *err)
{
    on_qmp_failed_step(arg, ret, err);
}

static void on_qmp_event(void *arg, const char *event, json_t *data)
{
    wk_sandbox *sb = arg;
    const char *status;

    if (!event || sb->killed)
        return; /* the monitor closed: the pidfd tells why */
    if (strcmp(event, "MIGRATION") != 0)
        return;
    status = json_string_value(json_object_get(data, "status"));
    if (!status)
        return;
    sb->depth++;
    if (!strcmp(status, "failed") && sb->st == VM_SNAPPING) {
        snap_finish(sb, -EIO, 0, "QEMU could not write the sandbox's state (is the host's disk "
                                 "full?); retry later.");
    } else if (!strcmp(status, "failed")) {
        fail_vm(sb, sb->st == VM_SAVING ? "Saving the paused sandbox to disk failed; kill it and "
                                          "create a new one."
                                        : "QEMU could not load the sandbox's state; kill it and "
                                          "create a new one.",
                "migration failed");
    } else if (!strcmp(status, "completed") && sb->st == VM_SAVING && !sb->quitting) {
        sb->quitting = 1;
        if (sb->save_fd >= 0) {
            close(sb->save_fd);
            sb->save_fd = -1;
        }
        /* The state is on disk: QEMU may go (on_exit_ev finishes the save). */
        wk_alink_free(sb->link);
        sb->link = NULL;
        if (wk_qmp_cmd(sb->qmp, "quit", NULL, -1, NULL, NULL) < 0)
            syscall(SYS_pidfd_send_signal, sb->pidfd, SIGKILL, NULL, 0);
    } else if (!strcmp(status, "completed") && sb->st == VM_STARTING) {
        sb->loaded_us = sf_mono_us();
        if (sb->from_snap && wk_qmp_cmd(sb->qmp, "cont", NULL, -1, on_snap_continued, sb) < 0)
            fail_vm(sb, ERR_NOMEM, "cannot queue cont");
    } else if (!strcmp(status, "completed") && sb->st == VM_SNAPPING && !sb->snap_copying) {
        snap_copy(sb);
    } else if (!strcmp(status, "completed") && sb->st == VM_LOADING) {
        if (wk_qmp_cmd(sb->qmp, "cont", NULL, -1, on_continued, sb) < 0)
            fail_vm(sb, ERR_NOMEM, "cannot queue cont");
    }
    sb->depth--;
    vm_release(sb);
}

static void start_save(wk_sandbox *sb)
{
    char path[WK_QEMU_PATH_MAX];
    json_t *caps;

    clear_timer(sb);
    sb->t0_us = sf_mono_us();
    if (path_in(sb, path, sizeof(path), "mem.state") < 0 ||
        (sb->save_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)) < 0) {
        fail_vm(sb, "The paused sandbox could not be saved to disk (no room under the worker's "
                    "state_dir?); kill it and create a new one.", "cannot create mem.state");
        return;
    }
    move_to(sb, VM_SAVING);
    caps = wk_qmp_caps();
    if (wk_qmp_cmd(sb->qmp, "migrate-set-capabilities", caps, -1, on_qmp_failed_step, sb) < 0 ||
        wk_qmp_cmd(sb->qmp, "migrate-set-parameters",
                   json_pack("{s:I}", "max-bandwidth", (json_int_t)1 << 40), -1,
                   on_qmp_failed_step, sb) < 0 ||
        wk_qmp_cmd(sb->qmp, "getfd", json_pack("{s:s}", "fdname", "save"), sb->save_fd,
                   on_qmp_failed_step, sb) < 0 ||
        wk_qmp_cmd(sb->qmp, "migrate", json_pack("{s:s}", "uri", "fd:save"), -1,
                   on_migrate_started, sb) < 0)
        fail_vm(sb, ERR_NOMEM, "cannot queue the save");
}

/* ---- snapshot (driver.h): from PAUSED (migrated to the snapshot's mem.state, then
 * its disk copied) or SAVED (both files copied); the VM goes back to where it was ---- */

typedef struct qsnap {
    wk_sandbox *sb;
    char from[WK_QEMU_PATH_MAX];   /* the VM's directory */
    char dir[WK_QEMU_PATH_MAX];    /* the snapshot's */
    char key[40];                  /* the template snapshot's key (the snapshot's meta) */
    int with_state;                /* SAVED: its mem.state is copied too */
    int rc;
    uint64_t bytes;
    const char *why;
} qsnap;

/* Answers the snapshot being taken (if any). */
static void snap_answer(wk_sandbox *sb, int rc, uint64_t bytes, const char *why)
{
    waiter *w = sb->snap_w;

    if (!w)
        return;
    sb->snap_w = NULL;
    sb->depth++;
    sf_info("msg=\"snapshot %s\" sandbox=%s rc=%d bytes=%llu", rc < 0 ? "failed" : "taken",
            sb->id, rc, (unsigned long long)bytes);
    w->snap_cb(w->arg, rc, rc < 0 ? 0 : bytes, rc < 0 ? why : NULL);
    w->snap_cb = NULL;
    waiter_free(w);
    sb->depth--;
}

static void on_save_timer(evutil_socket_t fd, short what, void *arg);

/* The snapshot ended (rc): the VM is back where it was, and the waiters go on. */
static void snap_finish(wk_sandbox *sb, int rc, uint64_t bytes, const char *why)
{
    int resume = sb->snap_w && sb->snap_w->snap_resume;

    if (sb->st != VM_SNAPPING || sb->killed)
        return;
    if (sb->save_fd >= 0) {
        close(sb->save_fd);
        sb->save_fd = -1;
    }
    clear_timer(sb);
    sb->st = sb->snap_saved ? VM_SAVED : VM_PAUSED;
    if (resume && sb->st == VM_PAUSED) { /* it ran when asked: it runs again first */
        waiter *r = calloc(1, sizeof(*r));
        if (r) {
            r->want = WANT_RUNNING;
            r->next = sb->w_head;
            sb->w_head = r;
            if (!sb->w_tail)
                sb->w_tail = r;
        } else {
            sf_warn("msg=\"out of memory: the VM stays paused after its snapshot\" sandbox=%s",
                    sb->id);
        }
    } else if (sb->st == VM_PAUSED && sb->d->save_after_ms) {
        set_timer(sb, sb->d->save_after_ms, on_save_timer);
    }
    sb->depth++;
    snap_answer(sb, rc, bytes, why);
    advance(sb);
    sb->depth--;
}

static void snap_copy_work(void *arg)
{
    qsnap *q = arg;
    char from[WK_QEMU_PATH_MAX + 16], to[WK_QEMU_PATH_MAX + 16];

    q->why = "The sandbox's files could not be copied into its snapshot (is the host's disk "
             "full?); retry later.";
    snprintf(from, sizeof(from), "%s/disk.qcow2", q->from);
    snprintf(to, sizeof(to), "%s/disk.qcow2", q->dir);
    if ((q->rc = wk_snap_copy(from, to)) < 0)
        return;
    if (q->with_state) {
        snprintf(from, sizeof(from), "%s/mem.state", q->from);
        snprintf(to, sizeof(to), "%s/mem.state", q->dir);
        if ((q->rc = wk_snap_copy(from, to)) < 0)
            return;
    }
    if ((q->rc = wk_snap_meta_write(q->dir, "qemu", q->key)) < 0)
        return;
    q->bytes = wk_snap_bytes(q->dir);
}

static void snap_copy_done(void *arg)
{
    qsnap *q = arg;
    wk_sandbox *sb = q->sb;

    sb->snap_copying = 0;
    if (sb->killed)
        snap_answer(sb, -ESRCH, 0, ERR_SNAP_KILLED);
    else if (sb->st != VM_SNAPPING)
        snap_answer(sb, -EIO, 0, ERR_SNAP_DEAD);
    else
        snap_finish(sb, q->rc, q->bytes, q->why);
    free(q);
    sb->depth--;
    vm_release(sb);
}

/* The state is in the snapshot (or on disk already): its files are copied on the pool. */
static void snap_copy(wk_sandbox *sb)
{
    qsnap *q = calloc(1, sizeof(*q));

    if (sb->save_fd >= 0) {
        close(sb->save_fd);
        sb->save_fd = -1;
    }
    clear_timer(sb); /* a copy has no deadline: it ends */
    if (!q || !sb->snap_w) {
        free(q);
        snap_finish(sb, -ENOMEM, 0, ERR_NOMEM);
        return;
    }
    q->sb = sb;
    q->with_state = sb->snap_saved;
    snprintf(q->from, sizeof(q->from), "%s", sb->dir);
    snprintf(q->dir, sizeof(q->dir), "%s", sb->snap_w->snap_dir);
    snprintf(q->key, sizeof(q->key), "%s", sb->tpl->key);
    sb->snap_copying = 1;
    sb->depth++;
    if (wk_pool_run(sb->d->pool, snap_copy_work, snap_copy_done, q) < 0) {
        sb->snap_copying = 0;
        sb->depth--;
        free(q);
        snap_finish(sb, -ENOMEM, 0, ERR_NOMEM);
    }
}

static void on_snap_step(void *arg, json_t *ret, const char *err)
{
    wk_sandbox *sb = arg;

    (void)ret;
    if (!err || sb->killed || sb->st != VM_SNAPPING)
        return;
    sf_warn("msg=\"snapshot refused by QEMU\" sandbox=%s err=\"%s\"", sb->id, err);
    sb->depth++;
    snap_finish(sb, -EIO, 0, "QEMU could not capture the sandbox's state; retry later.");
    sb->depth--;
    vm_release(sb);
}

/* From PAUSED or SAVED, with the snapshot's waiter at the head. */
static void start_snap(wk_sandbox *sb)
{
    waiter *w = sb->w_head;
    char path[WK_QEMU_PATH_MAX + 16];
    json_t *caps;

    sb->w_head = w->next;
    if (!sb->w_head)
        sb->w_tail = NULL;
    w->next = NULL;
    sb->snap_w = w;
    sb->snap_saved = sb->st == VM_SAVED;
    sb->t0_us = sf_mono_us();
    if (sb->snap_saved) { /* its state is on disk already: the files are copied */
        sb->st = VM_SNAPPING;
        if (mkdir(w->snap_dir, 0700) < 0)
            snap_finish(sb, -errno, 0, "The snapshot's directory could not be made under the "
                                       "worker's state_dir; retry later.");
        else
            snap_copy(sb);
        return;
    }
    move_to(sb, VM_SNAPPING);
    snprintf(path, sizeof(path), "%s/mem.state", w->snap_dir);
    if (mkdir(w->snap_dir, 0700) < 0 ||
        (sb->save_fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600)) < 0) {
        snap_finish(sb, -EIO, 0, "The snapshot's files could not be made under the worker's "
                                 "state_dir (is the host's disk full?); retry later.");
        return;
    }
    caps = wk_qmp_caps();
    if (wk_qmp_cmd(sb->qmp, "migrate-set-capabilities", caps, -1, on_snap_step, sb) < 0 ||
        wk_qmp_cmd(sb->qmp, "migrate-set-parameters",
                   json_pack("{s:I}", "max-bandwidth", (json_int_t)1 << 40), -1, on_snap_step,
                   sb) < 0 ||
        wk_qmp_cmd(sb->qmp, "getfd", json_pack("{s:s}", "fdname", "snap"), sb->save_fd,
                   on_snap_step, sb) < 0 ||
        wk_qmp_cmd(sb->qmp, "migrate", json_pack("{s:s}", "uri", "fd:snap"), -1, on_snap_step,
                   sb) < 0)
        snap_finish(sb, -ENOMEM, 0, ERR_NOMEM);
}

int wk_qvm_snapshot(wk_sandbox *sb, const char *dir, wk_snap_cb cb, void *arg)
{
    waiter *w;

    if (!sb || !dir || !cb || strlen(dir) >= WK_QEMU_PATH_MAX - 16)
        return -EINVAL;
    if (sb->killed)
        return -ESRCH;
    if (sb->kept)
        return -ESHUTDOWN;
    if (sb->st == VM_DEAD || sb->st == VM_STARTING)
        return sb->st == VM_DEAD ? -EIO : -EAGAIN;
    if (sb->snap_w)
        return -EBUSY;
    for (w = sb->w_head; w; w = w->next)
        if (w->want == WANT_SNAPSHOT)
            return -EBUSY;
    if (!(w = calloc(1, sizeof(*w))) || !(w->snap_dir = strdup(dir))) {
        free(w);
        return -ENOMEM;
    }
    w->want = WANT_SNAPSHOT;
    w->snap_cb = cb;
    w->arg = arg;
    add_waiter(sb, w);
    kick(sb);
    return 0;
}

static void start_load(wk_sandbox *sb)
{
    char path[WK_QEMU_PATH_MAX];
    const char *why = NULL;
    int rc;

    sb->t0_us = sf_mono_us();
    move_to(sb, VM_LOADING);
    if (path_in(sb, path, sizeof(path), "mem.state") < 0 ||
        (rc = start_qemu(sb, WK_QARGS_LOAD, path, NULL, &why)) < 0 || incoming(sb) < 0) {
        fail_vm(sb, why ? why : ERR_NOMEM, "cannot start QEMU to load the sandbox");
        return;
    }
    wk_alink_hold(sb->link, 1); /* until cont: the guest cannot answer before */
    if (wk_alink_ping(sb->link, now_ns(), NULL, 0, NULL, PING_TIMEOUT_MS, on_resumed_ping, sb) < 0)
        fail_vm(sb, ERR_NOMEM, "cannot queue the ping");
}

/* Moves one step towards what the oldest waiter wants (from a stable state). */
static void advance(wk_sandbox *sb)
{
    int want;

    if (sb->killed || !sb->w_head)
        return;
    if (sb->st == VM_DEAD) {
        fail_waiters(sb, sb->dead_why ? sb->dead_why : ERR_DEAD);
        return;
    }
    if (sb->st != VM_RUNNING && sb->st != VM_PAUSED && sb->st != VM_SAVED)
        return; /* a move is under way; its end calls us again */
    fire_reached(sb);
    if (sb->killed || !sb->w_head)
        return;
    want = sb->w_head->want;
    switch (sb->st) {
    case VM_RUNNING: /* want PAUSED, SAVED or a snapshot: stop first */
        if (want == WANT_SNAPSHOT)
            sb->w_head->snap_resume = 1; /* ...and run again after it */
        move_to(sb, VM_PAUSING);
        if (wk_qmp_cmd(sb->qmp, "stop", NULL, -1, on_paused, sb) < 0)
            fail_vm(sb, ERR_NOMEM, "cannot queue stop");
        break;
    case VM_PAUSED:
        clear_timer(sb);
        if (want == WANT_SAVED) {
            start_save(sb);
        } else if (want == WANT_SNAPSHOT) {
            start_snap(sb);
        } else { /* RUNNING */
            move_to(sb, VM_RESUMING);
            if (wk_qmp_cmd(sb->qmp, "cont", NULL, -1, on_continued, sb) < 0)
                fail_vm(sb, ERR_NOMEM, "cannot queue cont");
        }
        break;
    case VM_SAVED: /* want RUNNING, or a snapshot */
        if (want == WANT_SNAPSHOT)
            start_snap(sb);
        else
            start_load(sb);
        break;
    }
}

static void on_kick(evutil_socket_t fd, short what, void *arg)
{
    wk_sandbox *sb = arg;

    sb->depth++;
    advance(sb);
    sb->depth--;
    vm_release(sb);
}

/* advance() from the loop: callers are never answered inside their call. */
static void kick(wk_sandbox *sb)
{
    static const struct timeval zero = {0, 0};
    evtimer_add(sb->ev_kick, &zero);
}

static int request(wk_sandbox *sb, int want, wk_qvm_cb cb, void *arg)
{
    waiter *w;

    if (!sb)
        return -EINVAL;
    if (sb->killed)
        return -ESRCH;
    if (sb->st == VM_DEAD || sb->st == VM_STARTING)
        return sb->st == VM_DEAD ? -EIO : -EAGAIN;
    if (!(w = calloc(1, sizeof(*w))))
        return -ENOMEM;
    w->want = want;
    w->cb = cb;
    w->arg = arg;
    add_waiter(sb, w);
    kick(sb);
    return 0;
}

int wk_qvm_pause(wk_sandbox *sb, wk_qvm_cb cb, void *arg)
{
    return request(sb, WANT_PAUSED, cb, arg);
}

int wk_qvm_resume(wk_sandbox *sb, wk_qvm_cb cb, void *arg)
{
    return request(sb, WANT_RUNNING, cb, arg);
}

int wk_qvm_save(wk_sandbox *sb, wk_qvm_cb cb, void *arg)
{
    if (sb && sb->link && wk_alink_pending(sb->link) > 0)
        return -EBUSY; /* commands run: it stays in memory */
    return request(sb, WANT_SAVED, cb, arg);
}

int64_t wk_qvm_paused_ms(const wk_sandbox *sb)
{
    return sb && sb->st == VM_PAUSED ? sf_mono_ms() - sb->paused_at_ms : -1;
}

/* ---- exec -------------------------------------------------------------------- */

int wk_qvm_exec(wk_sandbox *sb, const wk_exec_req *req, wk_exec_cb cb, void *arg)
{
    size_t env_n = 0;
    waiter *w;

    if (!sb || !req || !req->command || !req->command[0] || !cb)
        return -EINVAL;
    if (sb->killed)
        return -ESRCH;
    if (sb->kept)
        return -ESHUTDOWN; /* left for the next worker: this one is stopping */
    if (sb->st == VM_RUNNING && !sb->w_head)
        return wk_alink_exec(sb->link, req, cb, arg);
    /* Paused, saved or moving: the exec waits for RUNNING (and asks for it); dead: it
     * is told so from the loop. */
    while (req->env && req->env[env_n])
        if (++env_n > 256)
            return -E2BIG;
    if (!(w = calloc(1, sizeof(*w))) || !(w->command = strdup(req->command)) ||
        (req->cwd && !(w->cwd = strdup(req->cwd))) ||
        !(w->env = calloc(env_n + 1, sizeof(char *))) ||
        (req->has_stdin && req->stdin_len && !(w->stdin_data = malloc(req->stdin_len)))) {
        if (w)
            waiter_free(w);
        return -ENOMEM;
    }
    for (size_t i = 0; i < env_n; i++)
        if (!(w->env[i] = strdup(req->env[i]))) {
            waiter_free(w);
            return -ENOMEM;
        }
    w->want = WANT_RUNNING;
    w->exec_cb = cb;
    w->on_output = req->on_output;
    w->arg = arg;
    w->timeout_ms = req->timeout_ms;
    w->cap_bytes = req->cap_bytes;
    w->has_stdin = req->has_stdin;
    w->background = req->background;
    w->detach_ms = req->detach_ms;
    w->pipe = req->pipe;
    w->stdin_len = req->has_stdin ? req->stdin_len : 0;
    if (w->stdin_len)
        memcpy(w->stdin_data, req->stdin_data, w->stdin_len);
    add_waiter(sb, w);
    kick(sb);
    return 0;
}

int wk_qvm_exec_cancel(wk_sandbox *sb, void *arg)
{
    waiter **pw, *prev = NULL;

    if (!sb || sb->killed)
        return -ENOENT;
    /* Still waiting for the VM: it never starts. */
    for (pw = &sb->w_head; *pw; prev = *pw, pw = &(*pw)->next) {
        waiter *w = *pw;
        if (!w->exec_cb || w->arg != arg)
            continue;
        *pw = w->next;
        if (sb->w_tail == w)
            sb->w_tail = prev;
        {
            wk_exec_result res = {.exit_code = -1,
                                  .error = "The command was cancelled before it started."};
            sb->depth++;
            w->exec_cb(w->arg, &res);
            sb->depth--;
        }
        waiter_free(w);
        vm_release(sb);
        return 0;
    }
    return sb->link ? wk_alink_cancel(sb->link, arg) : -ENOENT;
}

int wk_qvm_exec_input(wk_sandbox *sb, void *arg, const char *data, size_t len, int eof)
{
    if (!sb || sb->killed || !sb->link)
        return -ENOENT;
    return wk_alink_input(sb->link, arg, data, len, eof);
}

/* ---- files ------------------------------------------------------------------- */

int wk_qvm_file(wk_sandbox *sb, const wk_file_req *req, wk_file_cb cb, void *arg)
{
    waiter *w;

    if (!sb || !req || !cb)
        return -EINVAL;
    if (sb->killed)
        return -ESRCH;
    if (sb->kept)
        return -ESHUTDOWN;
    if (sb->st == VM_RUNNING && !sb->w_head)
        return wk_alink_file(sb->link, req, cb, arg);
    /* Paused, saved or moving: the request waits for RUNNING (and asks for it). */
    if (!(w = calloc(1, sizeof(*w))) || (req->path && !(w->fpath = strdup(req->path))) ||
        (req->to && !(w->fto = strdup(req->to))) ||
        (req->data_len && !(w->fdata = malloc(req->data_len)))) {
        if (w)
            waiter_free(w);
        return -ENOMEM;
    }
    if (req->data_len)
        memcpy(w->fdata, req->data, req->data_len);
    w->freq = *req;
    w->freq.path = w->fpath;
    w->freq.to = w->fto;
    w->freq.data = w->fdata;
    w->want = WANT_RUNNING;
    w->file_cb = cb;
    w->arg = arg;
    add_waiter(sb, w);
    kick(sb);
    return 0;
}

/* ---- kill -------------------------------------------------------------------- */

typedef struct teardown {
    wk_sandbox *sb;
    char dir[WK_QEMU_PATH_MAX];
    wk_cgroup cg;
    int cg_made;
    int rc;
} teardown;

static void rm_dir_work(void *arg)
{
    teardown *t = arg;
    const char *names[] = {"disk.qcow2", "mem.state", "qemu.log", WK_QEMU_AGENT_SOCK,
                           WK_QEMU_QMP_SOCK};
    char path[WK_QEMU_PATH_MAX + 32];

    if (t->cg_made) {
        int rc = wk_cgroup_destroy(&t->cg); /* empty by now: QEMU was reaped */
        if (rc < 0)
            t->rc = rc;
    }
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", t->dir, names[i]);
        if (unlink(path) < 0 && errno != ENOENT)
            t->rc = -errno;
    }
    if (rmdir(t->dir) < 0 && errno != ENOENT)
        t->rc = -errno;
}

static void rm_dir_done(void *arg)
{
    teardown *t = arg;
    wk_sandbox *sb = t->sb;

    if (t->rc < 0)
        sf_error("msg=\"cannot remove the sandbox's files\" sandbox=%s dir=%s rc=%d", sb->id,
                 t->dir, t->rc);
    else
        sf_info("msg=\"sandbox torn down\" sandbox=%s", sb->id);
    if (sb->kill_cb)
        sb->kill_cb(sb->kill_arg, t->rc);
    free(t);
    sb->depth--;
    vm_release(sb);
}

/* The process is gone: its network namespace (and the tap in it) go now, the files on
 * the pool. */
static void teardown_files(wk_sandbox *sb)
{
    teardown *t;

    process_gone(sb);
    holder_stop(sb);
    if (sb->netns >= 0) {
        close(sb->netns);
        sb->netns = -1;
    }
    if (!(t = calloc(1, sizeof(*t)))) {
        if (sb->kill_cb)
            sb->kill_cb(sb->kill_arg, -ENOMEM);
        sb->depth--;
        vm_release(sb);
        return;
    }
    t->sb = sb;
    snprintf(t->dir, sizeof(t->dir), "%s", sb->dir);
    t->cg = sb->cg;
    t->cg_made = sb->cg_made;
    if (sb->cg.fd >= 0) {
        close(sb->cg.fd);
        sb->cg.fd = t->cg.fd = -1;
    }
    if (wk_pool_run(sb->d->pool, rm_dir_work, rm_dir_done, t) < 0) {
        rm_dir_work(t); /* out of memory: do it here, rather than leave files behind */
        rm_dir_done(t);
    }
}

static void on_killed_exit(evutil_socket_t fd, short what, void *arg)
{
    wk_sandbox *sb = arg;

    if (wk_qspawn_reap(sb->pidfd) < 0)
        return; /* not yet */
    teardown_files(sb);
}

void wk_qvm_kill(wk_sandbox *sb, wk_kill_cb cb, void *arg)
{
    if (!sb || sb->killed)
        return;
    sf_info("msg=\"sandbox kill\" sandbox=%s state=%s", sb->id, state_name[sb->st]);
    sb->killed = 1;
    if (!sb->pooled)
        wk_qvm_handle_remove(sb->d, sb->id);
    sb->kill_cb = cb;
    sb->kill_arg = arg;
    sb->depth++; /* held until the teardown ends */
    clear_timer(sb);
    if (sb->link)
        wk_alink_close(sb->link, ERR_KILLED);
    fail_waiters(sb, ERR_KILLED);
    if (!sb->snap_copying)
        snap_answer(sb, -ESRCH, 0, ERR_SNAP_KILLED);
    if (sb->create_cb) {
        wk_create_cb ccb = sb->create_cb;
        sb->create_cb = NULL;
        ccb(sb->create_arg, NULL, -ECANCELED, "The sandbox was killed while it started.");
    }
    drop_conns(sb);
    if (sb->pidfd < 0) { /* no process (saved to disk, or never started) */
        teardown_files(sb);
        return;
    }
    syscall(SYS_pidfd_send_signal, sb->pidfd, SIGKILL, NULL, 0);
    if (sb->ev_exit)
        event_free(sb->ev_exit);
    if ((sb->ev_exit = event_new(sb->d->base, sb->pidfd, EV_READ | EV_PERSIST, on_killed_exit,
                                 sb)) &&
        event_add(sb->ev_exit, NULL) == 0)
        return;
    wk_qspawn_kill(&sb->pidfd); /* out of memory: reap here (QEMU dies at once) */
    teardown_files(sb);
}

/* ---- a worker restart: the VMs of an earlier run (docs/internals/restart.md) ---- */

typedef struct vm_handle {
    int pid, saved;
    unsigned long long start;
    char dir[64], key[40];
    unsigned tmem, tvcpus, tdisk;
    wk_limits lim;
} vm_handle;

/* Reads and parses state_dir/adopt/<id>/handle (root's, not writable by others, no link
 * followed on the way). 0, -ENOENT (none), -EINVAL (damaged) with why. */
static int handle_read(const wk_driver *d, const char *id, vm_handle *h, const char **why)
{
    char buf[HANDLE_MAX];
    unsigned long long inodes;
    unsigned mem, vcpu, disk, pids;
    char word[8];
    struct stat st;
    ssize_t n;
    int dfd, fd;

    *why = SF_MSG_ADOPT_NO_HANDLE;
    if ((dfd = wk_adopt_dir(d->state_dir, id, 0)) < 0)
        return -ENOENT;
    fd = openat(dfd, "handle", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    close(dfd);
    if (fd < 0)
        return -ENOENT;
    n = -1;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == 0 && !(st.st_mode & 077) &&
        st.st_size < HANDLE_MAX)
        n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    *why = SF_MSG_ADOPT_BAD_HANDLE;
    if (n <= 0)
        return -EINVAL;
    buf[n] = '\0';
    memset(h, 0, sizeof(*h));
    if (sscanf(buf, "v1 %d %llu %63s %39s %u %u %u %u %u %u %u %llu %7s", &h->pid, &h->start,
               h->dir, h->key, &h->tmem, &h->tvcpus, &h->tdisk, &mem, &vcpu, &disk, &pids,
               &inodes, word) != 13 || h->pid < 0 || h->pid == 1 ||
        (strcmp(word, "run") != 0 && strcmp(word, "saved") != 0) ||
        /* its folder: the sandbox's id, or the pool name it was born with */
        (!sf_id_valid(h->dir) && !(h->dir[0] == '.' && sf_id_valid(h->dir + 1))) ||
        !sf_id_valid(h->key) || !h->tmem || !h->tvcpus)
        return -EINVAL;
    h->lim = (wk_limits){.memory_mib = mem, .vcpu_milli = vcpu, .disk_mib = disk,
                         .pids_max = pids, .inodes = inodes};
    h->saved = word[0] == 's';
    return 0;
}

/* The pid of h still names the VM's QEMU: start time, alive, its cgroup. -ESRCH + why. */
static int handle_alive(const wk_driver *d, const vm_handle *h, const char **why)
{
    unsigned long long now;
    char state;

    *why = "It was saved to disk and nothing held its network namespace (see the previous "
           "worker's log: no holder).";
    if (h->pid == 0)
        return -ESRCH;
    *why = h->saved ? "Its saved VM's network namespace ended while no worker ran (its holder "
                      "process is gone)."
                    : "Its VM died while no worker ran (its QEMU process is gone).";
    if (wk_proc_stat(h->pid, &now, &state) < 0 || now != h->start || state == 'Z' ||
        state == 'X')
        return -ESRCH;
    *why = h->saved ? "The process its handle names is not this sandbox's holder."
                    : "The process its handle names is not this sandbox's QEMU.";
    if (!wk_proc_in_cgroup(h->pid, d->host_id, h->dir[0] == '.' ? h->dir + 1 : h->dir))
        return -ESRCH;
    return 0;
}

int wk_qvm_handle_check(const wk_driver *d, const char *id, char *dir_name, size_t n,
                        const char **why)
{
    vm_handle h;
    int rc;

    if ((rc = handle_read(d, id, &h, why)) < 0 || (rc = handle_alive(d, &h, why)) < 0)
        return rc;
    snprintf(dir_name, n, "%s", h.dir);
    return 0;
}

/* One exchange with the VM's monitor on a connection of its own (blocking, bounded):
 * its run state ("running", "paused", ...) into buf. 0 or -errno. */
static int qmp_status(int dfd, char *buf, size_t n)
{
    static const char caps[] = "{\"execute\":\"qmp_capabilities\"}\n",
                      query[] = "{\"execute\":\"query-status\"}\n";
    char in[16384];
    size_t got = 0;
    int64_t deadline = sf_mono_ms() + WK_ADOPT_PING_MS;
    int fd = sock_at(dfd, WK_QEMU_QMP_SOCK, 0), step = 0, rc = -ETIMEDOUT;

    if (fd < 0)
        return fd;
    while (step < 3) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int64_t left = deadline - sf_mono_ms();
        char *nl;
        ssize_t r;

        if (left <= 0 || poll(&p, 1, (int)left) <= 0) {
            if (left > 0 && errno == EINTR)
                continue;
            break;
        }
        if ((r = read(fd, in + got, sizeof(in) - 1 - got)) <= 0) {
            rc = -EPIPE;
            break;
        }
        got += (size_t)r;
        in[got] = '\0';
        while (step < 3 && (nl = strchr(in, '\n'))) {
            json_t *j;
            *nl = '\0';
            j = json_loads(in, 0, NULL);
            memmove(in, nl + 1, got - (size_t)(nl + 1 - in) + 1);
            got -= (size_t)(nl + 1 - in);
            if (!j)
                continue;
            if (step == 0 && json_object_get(j, "QMP")) {
                step = write(fd, caps, sizeof(caps) - 1) == (ssize_t)sizeof(caps) - 1 ? 1 : 3;
            } else if (step == 1 && json_object_get(j, "return")) {
                step = write(fd, query, sizeof(query) - 1) == (ssize_t)sizeof(query) - 1 ? 2 : 3;
            } else if (step == 2 && json_object_get(j, "return")) {
                const char *s = json_string_value(
                    json_object_get(json_object_get(j, "return"), "status"));
                rc = s ? 0 : -EPROTO;
                snprintf(buf, n, "%s", s ? s : "");
                step = 3;
            } else if (json_object_get(j, "error")) {
                rc = -EPROTO;
                step = 3;
            }
            json_decref(j);
        }
        if (got >= sizeof(in) - 1) {
            rc = -EPROTO;
            break;
        }
    }
    close(fd);
    return rc;
}

int wk_qvm_adopt(wk_driver *d, const char *id, wk_sandbox **out, int *paused, const char **why)
{
    char ns[64], status[32] = "";
    wk_sandbox *sb = NULL;
    int rc, dfd = -1, pidfd = -1, agfd = -1, qfd = -1, netns = -1, is_paused;
    unsigned long long now;
    struct stat st;
    vm_handle h;
    char state;

    *why = SF_MSG_ADOPT_BAD_ID;
    if (!d || !d->adopting || !sf_id_valid(id))
        return -EINVAL;
    for (wk_sandbox *o = d->vms; o; o = o->next)
        if (!strcmp(o->id, id)) {
            *why = SF_MSG_ADOPT_TWICE;
            return -EEXIST;
        }
    if ((rc = handle_read(d, id, &h, why)) < 0 || (rc = handle_alive(d, &h, why)) < 0)
        return rc;
    if ((pidfd = (int)syscall(SYS_pidfd_open, h.pid, 0)) < 0)
        return -ESRCH;
    /* the pidfd names the process that had the pid when it was opened: the same one if the
     * start time still matches now */
    fcntl(pidfd, F_SETFD, FD_CLOEXEC);
    rc = -ESRCH;
    if (wk_proc_stat(h.pid, &now, &state) < 0 || now != h.start || state == 'Z')
        goto fail;
    if (!(sb = calloc(1, sizeof(*sb)))) {
        rc = -ENOMEM;
        *why = ERR_NOMEM;
        goto fail;
    }
    sb->d = d;
    sb->pidfd = sb->report = sb->netns = sb->save_fd = sb->cg.fd = sb->holder = -1;
    snprintf(sb->id, sizeof(sb->id), "%s", id);
    *why = SF_MSG_STATE_DIR_LONG;
    rc = -ENAMETOOLONG;
    if (snprintf(sb->dir, sizeof(sb->dir), "%s/%s", d->cfg.sb_dir, h.dir) >= (int)sizeof(sb->dir))
        goto fail;
    *why = "Its folder under state_dir/qemu is missing, or not root's.";
    if ((dfd = wk_root_dir_open(AT_FDCWD, sb->dir, 0)) < 0) {
        rc = dfd;
        goto fail;
    }
    if (h.saved) { /* no QEMU: its state and disk wait in its folder for a load */
        *why = "Its saved state is missing from its folder under state_dir/qemu.";
        rc = -ENOENT;
        if (fstatat(dfd, "mem.state", &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode) ||
            fstatat(dfd, "disk.qcow2", &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
            goto fail;
        snprintf(status, sizeof(status), "saved");
    } else {
        /* the monitor: the VM runs, or is paused (a VM migrated out for a snapshot is
         * paused too: postmigrate); anything else was a move cut short */
        *why = "Its QEMU does not take a new worker's monitor connection (it hangs, or was "
               "started by a worker too old to keep it).";
        if ((rc = qmp_status(dfd, status, sizeof(status))) < 0)
            goto fail;
    }
    is_paused = h.saved || !strcmp(status, "paused") || !strcmp(status, "postmigrate");
    if (!is_paused && strcmp(status, "running") != 0) {
        rc = -EIO;
        *why = "Its VM was in the middle of a move (saved to disk or loaded) when its worker "
               "stopped.";
        goto fail;
    }
    /* the namespace of the verified process: alive still after the open, so it is its own */
    snprintf(ns, sizeof(ns), "/proc/%d/ns/net", h.pid);
    *why = "Its VM died while it was taken back.";
    rc = -ESRCH;
    if ((netns = open(ns, O_RDONLY | O_CLOEXEC)) < 0 ||
        syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0) < 0)
        goto fail;
    if (!h.saved) {
        *why = "Its agent does not answer a new worker (it died, or is too old to outlive its "
               "worker).";
        if ((agfd = sock_at(dfd, WK_QEMU_AGENT_SOCK, 0)) < 0) {
            rc = agfd;
            goto fail;
        }
        /* a paused guest answers once it runs again (its resume pings it) */
        if (!is_paused && (rc = wk_agent_ping(agfd, WK_ADOPT_PING_MS, why)) < 0)
            goto fail;
        if ((qfd = sock_at(dfd, WK_QEMU_QMP_SOCK, 0)) < 0) {
            rc = qfd;
            goto fail;
        }
    }
    /* its cgroup (a load's QEMU is born there: v2 through the fd of its leaf) */
    wk_cgroup_lookup(&sb->cg, d->host_id, h.dir[0] == '.' ? h.dir + 1 : h.dir);
    *why = "Its cgroup is gone.";
    rc = -ENOENT;
    if (sb->cg.v2 && (sb->cg.fd = open(sb->cg.agent, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        goto fail;
    sb->cg_made = 1;
    /* its template: this run's base one, or what the handle says (its RAM file and shape:
     * what a save to disk and a load need) */
    if (!strcmp(h.key, d->tpl.key)) {
        sb->tpl = &d->tpl;
    } else {
        rc = -ENOMEM;
        *why = ERR_NOMEM;
        if (!(sb->own_tpl = calloc(1, sizeof(*sb->own_tpl))))
            goto fail;
        snprintf(sb->own_tpl->key, sizeof(sb->own_tpl->key), "%s", h.key);
        if (snprintf(sb->own_tpl->dir, sizeof(sb->own_tpl->dir), "%s/templates/%s",
                     d->cfg.vm_dir, h.key) >= (int)sizeof(sb->own_tpl->dir))
            goto fail;
        sb->own_tpl->memory_mib = h.tmem;
        sb->own_tpl->vcpus = h.tvcpus;
        sb->own_tpl->disk_mib = h.tdisk;
        sb->tpl = sb->own_tpl;
    }
    rc = -ENOMEM;
    *why = ERR_NOMEM;
    if (!(sb->ev_kick = evtimer_new(d->base, on_kick, sb)))
        goto fail;
    if (!h.saved) {
        if (!(sb->ev_exit = event_new(d->base, pidfd, EV_READ | EV_PERSIST, on_exit_ev, sb)) ||
            event_add(sb->ev_exit, NULL) < 0 ||
            !(sb->qmp = wk_qmp_new(d->base, qfd, on_qmp_event, sb)))
            goto fail;
        qfd = -1;
        if (!(sb->link = wk_alink_new(d->base, agfd, sb->id)))
            goto fail;
        agfd = -1;
        /* (request ids of another range than the previous worker's: a paused guest may
         * not have seen that worker go, and its old commands' results must match no new
         * request) */
        {
            uint32_t first;
            if (getrandom(&first, sizeof(first), GRND_NONBLOCK) == (ssize_t)sizeof(first))
                wk_alink_first_id(sb->link, first | 0x40000000u);
        }
        wk_alink_on_down(sb->link, on_link_down, sb);
        sb->pid = h.pid;
        sb->pidfd = pidfd;
    } else {
        sb->holder_pid = h.pid;
        sb->holder = pidfd;
    }
    pidfd = -1;
    sb->lim = h.lim;
    sb->netns = netns;
    netns = -1;
    sb->adopted = 1;
    sb->t0_us = sf_mono_us();
    if (h.saved) {
        sb->st = VM_SAVED;
    } else if (is_paused) {
        wk_alink_hold(sb->link, 1);
        sb->st = VM_PAUSED;
        sb->paused_at_ms = sf_mono_ms();
        if (d->save_after_ms)
            set_timer(sb, d->save_after_ms, on_save_timer);
    } else {
        sb->st = VM_RUNNING;
    }
    sb->next = d->vms;
    if (d->vms)
        d->vms->prev = sb;
    d->vms = sb;
    d->n_vms++;
    close(dfd);
    sf_info("msg=\"sandbox taken back from the previous worker run\" sandbox=%s pid=%d "
            "dir=%s status=%s", id, h.pid, h.dir, status);
    *paused = is_paused;
    *out = sb;
    return 0;
fail:
    if (sb) {
        if (sb->link)
            wk_alink_free(sb->link);
        wk_qmp_free(sb->qmp);
        if (sb->ev_exit)
            event_free(sb->ev_exit);
        if (sb->ev_kick)
            event_free(sb->ev_kick);
        if (sb->cg.fd >= 0)
            close(sb->cg.fd);
        free(sb->own_tpl);
        free(sb);
    }
    for (int *f = (int[]){dfd, pidfd, agfd, qfd, netns}, i = 0; i < 5; i++)
        if (f[i] >= 0)
            close(f[i]);
    return rc < 0 ? rc : -EIO;
}

void wk_qvm_keep(wk_sandbox *sb)
{
    if (!sb || sb->killed || sb->pooled)
        return;
    if (sb->st != VM_RUNNING && sb->st != VM_PAUSED && sb->st != VM_SAVED) {
        sf_warn("msg=\"a VM in the middle of a move is not kept for the next worker\" "
                "sandbox=%s state=%s", sb->id, state_name[sb->st]);
        return; /* host_fini kills it */
    }
    sb->kept = 1;
    clear_timer(sb);
    sb->depth++;
    if (sb->link)
        wk_alink_close(sb->link, SF_MSG_WORKER_STOPPING);
    fail_waiters(sb, SF_MSG_WORKER_STOPPING);
    sb->depth--;
}

int wk_qvm_kept(const wk_sandbox *sb)
{
    return sb && sb->kept && !sb->killed;
}

void wk_qvm_forget(wk_sandbox *sb)
{
    sf_info("msg=\"VM left running for the next worker\" sandbox=%s pid=%d state=%s", sb->id,
            (int)wk_qvm_pid(sb), state_name[sb->st]);
    clear_timer(sb);
    if (sb->ev_exit) {
        event_free(sb->ev_exit);
        sb->ev_exit = NULL;
    }
    drop_conns(sb); /* QEMU listens again, for the next worker */
    for (int *f = (int[]){sb->pidfd, sb->report, sb->netns, sb->cg.fd, sb->holder}, i = 0; i < 5;
         i++)
        if (f[i] >= 0)
            close(f[i]);
    sb->pidfd = sb->report = sb->netns = sb->cg.fd = sb->holder = -1;
    sb->killed = 1; /* (so that it is freed) */
    vm_release(sb);
}
