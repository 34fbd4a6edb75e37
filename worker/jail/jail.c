/* The jail driver's operations (driver.h, `wk_jail_driver`): host set-up and
 * clean-up, create (on the thread pool), kill (signal on the loop, the rest off
 * it). The pieces live in template.c, cgroup.c, jail_fs.c, jail_seccomp.c,
 * jail_spawn.c and jail_agent.c (see jail_int.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent_link.h"
#include "jail_int.h"
#include "snapfs.h"
#include "sf_log.h"
#include "sf_util.h"
#include "sf_msg.h"

#define ERR_KILLED SF_MSG_KILLED_DURING_EXEC
#define FINI_WAIT_MS 20000 /* host_fini waits this long for teardowns */
#define ADOPT_PING_MS 5000 /* a kept sandbox's agent answers a new worker within this */

static int sb_path(char *buf, size_t n, const char *state_dir, const char *id)
{
    int r = snprintf(buf, n, "%s/sandboxes%s%s", state_dir, id ? "/" : "", id ? id : "");
    return r < 0 || (size_t)r >= n ? -ENAMETOOLONG : 0;
}

/* ---- host ----------------------------------------------------------------- */

static int copy_str(char *dst, size_t n, const char *src)
{
    size_t len = src ? strlen(src) : 0;
    if (len >= n)
        return -ENAMETOOLONG;
    memcpy(dst, src ? src : "", len + 1);
    return 0;
}

static int check_limits(const wk_limits *l, const char **why)
{
    if (l->memory_mib < 64 || l->memory_mib > (1u << 22)) {
        *why = "memory_mib must be from 64 to 4194304.";
        return -EINVAL;
    }
    if (l->pids_max < 8 || l->pids_max > 4000000) {
        *why = "pids_max must be from 8 to 4000000.";
        return -EINVAL;
    }
    if (l->vcpu_milli < 10 || l->vcpu_milli > 1000000) {
        *why = "vcpu_milli must be from 10 to 1000000.";
        return -EINVAL;
    }
    if (l->disk_mib < 16 || l->disk_mib > (1u << 24) || l->inodes < 1024 ||
        l->inodes > (1ull << 32)) {
        *why = "disk_mib must be from 16 to 16777216 and inodes from 1024 to 2^32.";
        return -EINVAL;
    }
    return 0;
}

/* What the host offers (the daemon measured it: cfg->host) and the caps of the worker's
 * parent cgroups. On v1 TCP buffers are limited apart from memory (memory/8 per sandbox):
 * the memory offered is cut so that both together fit. */
static void host_offer(const wk_host_cfg *c, wk_host_res *res, wk_cg_caps *caps)
{
    uint64_t mem_mib = c->host.mem_mib;

    caps->tcp_bytes = 0;
    if (wk_cgroup_tcp_apart()) {
        mem_mib = mem_mib * WK_TCP_SHARE / (WK_TCP_SHARE + 1);
        caps->tcp_bytes = (mem_mib << 20) / WK_TCP_SHARE;
    }
    caps->mem_bytes = mem_mib << 20;
    res->mem_mib = mem_mib;
    caps->vcpu_milli = c->host.vcpu_cap_milli < 10 ? 10 : c->host.vcpu_cap_milli;
    res->vcpu_milli = c->host.vcpu_milli;
    res->disk_mib = c->host.disk_mib;
    res->slots = WK_SLOTS_MAX;
}

static void sb_unlink(wk_driver *d, wk_sandbox *sb);

static int adopted_here(const wk_driver *d, const char *id)
{
    for (const wk_sandbox *sb = d->all; sb; sb = sb->next)
        if (!strcmp(sb->id, id))
            return 1;
    return 0;
}

/* Kills what a previous worker run left under state_dir: every sandboxes/<id>/ (its
 * cgroups' processes, the cgroups, its disk, the directory, its adopt/<id>) and
 * unfinished template builds. With keep_alive (host_init of a worker that adopts), a
 * sandbox whose init provably still runs stays for adopt; with d (adopt_end), those
 * adopted stay and the rest go, each with a log line saying why. */
static void host_cleanup(const char *state_dir, const char *host, int keep_alive,
                         const wk_driver *drv)
{
    char dir[WK_PATH_MAX], path[WK_PATH_MAX];
    struct dirent *e;
    DIR *d;

    if (!drv)
        wk_template_cleanup(state_dir);
    if (sb_path(dir, sizeof(dir), state_dir, NULL) < 0 || !(d = opendir(dir)))
        return;
    while ((e = readdir(d))) {
        const char *why = NULL;
        wk_adopt_handle h;
        wk_cgroup cg;
        int rc, alive = 0;

        if (!sf_id_valid(e->d_name) || sb_path(path, sizeof(path), state_dir, e->d_name) < 0)
            continue;
        if (drv && adopted_here(drv, e->d_name))
            continue;
        if ((rc = wk_adopt_check(state_dir, host, e->d_name, &h, &why)) == 0) {
            alive = 1;
            if (keep_alive) {
                close(h.pidfd);
                continue;
            }
            /* not taken back: its init (and with it the pid namespace) ends now */
            syscall(SYS_pidfd_send_signal, h.pidfd, SIGKILL, NULL, 0);
            close(h.pidfd);
            why = "The worker has no record of it (a template build, or a create cut short).";
        } else if (keep_alive && rc != -ENOENT) {
            continue; /* dead or damaged: adopt says why, adopt_end removes it */
        }
        /* Without a listener its agent exited when the old worker's socket end closed,
         * which ended the pid namespace; the cgroup sweep catches anything still there. */
        wk_cgroup_lookup(&cg, host, e->d_name);
        if ((rc = wk_teardown_run(&cg, path, 0)) != 0 && (rc = wk_rmtree(path)) < 0)
            sf_error("msg=\"cannot remove a leftover sandbox\" dir=%s err=%d", path, rc);
        else
            sf_info("msg=\"removed a leftover sandbox\" sandbox=%s alive=%d why=\"%s\"",
                    e->d_name, alive, why ? why : "");
        wk_adopt_remove(state_dir, e->d_name);
    }
    closedir(d);
}

/* The worker's own mount namespace (once per process, before any thread starts):
 * the sandboxes' disks are mounted there, out of the host's sight. Host mounts still
 * propagate in. It outlives a worker that dies while its lxcfs runs (lxcfs is in it): a
 * restarted worker joins that one (join: the lxcfs's pid), so the disks of the jails it
 * takes back are mounted for it already. */
static int private_mounts(pid_t join, const char **why)
{
    static int done;

    if (done)
        return 0;
    if (join > 0) {
        char ns[64];
        int fd;
        snprintf(ns, sizeof(ns), "/proc/%d/ns/mnt", (int)join);
        if ((fd = open(ns, O_RDONLY | O_CLOEXEC)) >= 0 && setns(fd, CLONE_NEWNS) == 0) {
            close(fd);
            done = 1;
            return 0;
        }
        sf_warn("msg=\"cannot join the mount namespace of the previous worker run; making a "
                "new one\" lxcfs_pid=%d err=%d", (int)join, errno);
        if (fd >= 0)
            close(fd);
    }
    if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0) {
        int rc = -errno;
        *why = rc == -EINVAL ? "The jail driver must start before the worker's threads (it "
                               "enters a mount namespace of its own)."
                             : "The jail driver cannot create its mount namespace; run the "
                               "worker as root.";
        return rc;
    }
    done = 1;
    return 0;
}

static void fill_work(void *arg)
{
    wk_driver *d = arg;
    int rc = wk_disk_pool_fill(d->state_dir, d->defaults.disk_mib, d->defaults.inodes,
                               d->pool_images);
    if (rc < 0)
        sf_warn("msg=\"cannot format spare sandbox disks; creates will format their own\" "
                "err=%d", rc);
}

static void fill_done(void *arg)
{
    wk_driver *d = arg;
    d->pool_filling = 0;
}

/* Tops the pool of formatted default disks up, on the thread pool. */
static void pool_refill(wk_driver *d)
{
    if (d->pool_images == 0 || d->pool_filling)
        return;
    if (wk_pool_run(d->pool, fill_work, fill_done, d) == 0)
        d->pool_filling = 1;
}

static int jail_host_init(const wk_host_cfg *c, wk_driver **out, const char **why)
{
    const struct sock_fprog *prog;
    char path[WK_PATH_MAX];
    wk_cg_caps caps;
    struct stat st;
    wk_driver *d;
    int rc;

    *why = NULL;
    if (!c || !c->base || !c->pool) {
        *why = "The jail driver needs the worker's event loop and thread pool.";
        return -EINVAL;
    }
    if (!c->state_dir || c->state_dir[0] != '/' || strlen(c->state_dir) > 1024) {
        *why = SF_MSG_STATE_DIR_BAD;
        return -EINVAL;
    }
    if (!c->agent_path || stat(c->agent_path, &st) < 0 || !S_ISREG(st.st_mode) ||
        !(st.st_mode & S_IXOTH)) {
        *why = "agent_path must name the built sandfleet-agent binary (a regular file executable by all).";
        return -EINVAL;
    }
    if (!sf_id_valid(c->host_id)) {
        *why = SF_MSG_HOST_ID_BAD;
        return -EINVAL;
    }
    if ((rc = check_limits(&c->defaults, why)) < 0)
        return rc;
    if (c->uid_base < WK_UID_RANGE || c->uid_base > UINT32_MAX - 2 * WK_UID_RANGE) {
        *why = "uid_base must be at least 65536 and leave room for one 65536-id range below 2^32.";
        return -EINVAL;
    }
    if (geteuid() != 0) {
        *why = "The jail driver needs root (namespaces, cgroups, uid maps); run the worker as root.";
        return -EPERM;
    }
    if (!(d = calloc(1, sizeof(*d)))) {
        *why = SF_MSG_HOST_NOMEM;
        return -ENOMEM;
    }
    d->base = c->base;
    d->pool = c->pool;
    d->defaults = c->defaults;
    d->uid_base = c->uid_base;
    d->nofile = c->nofile;
    d->pool_images = c->pool_images;
    d->teardown_stop = c->teardown_stop;
    copy_str(d->host_id, sizeof(d->host_id), c->host_id);
    copy_str(d->state_dir, sizeof(d->state_dir), c->state_dir);
    if (copy_str(d->agent_path, sizeof(d->agent_path), c->agent_path) < 0) {
        *why = "agent_path is too long.";
        rc = -ENAMETOOLONG;
        goto fail;
    }
    {
        /* the lxcfs of a worker run before us (it died): its mount namespace, and it */
        pid_t old = wk_lxcfs_find(d->state_dir);
        const char *lwhy = NULL;
        if ((rc = private_mounts(old, why)) < 0)
            goto fail;
        if (old > 0 && wk_lxcfs_adopt(d->state_dir, old, &d->lxcfs) == 0)
            sf_info("msg=\"lxcfs of the previous worker run taken back\" pid=%d", (int)old);
        else if (wk_lxcfs_start(d->state_dir, &d->lxcfs, &lwhy) < 0)
            sf_warn("msg=\"%s\"", lwhy);
    }
    if ((rc = wk_cgroup_host_init(d->host_id, NULL, why)) < 0)
        goto fail;
    host_cleanup(d->state_dir, d->host_id, 1, NULL);
    d->adopting = 1;
    sb_path(path, sizeof(path), d->state_dir, NULL);
    if ((rc = wk_mkdir_p(path, 0700)) < 0) {
        *why = "Cannot create state_dir/sandboxes; check that state_dir is writable by root.";
        goto fail;
    }
    host_offer(c, &d->res, &caps);
    if ((rc = wk_template_ensure(d->state_dir, why)) < 0 ||
        (rc = wk_cgroup_host_init(d->host_id, &caps, why)) < 0 ||
        (rc = wk_seccomp_prog(&prog, why)) < 0 || (rc = wk_disk_host_init(d->state_dir, why)) < 0)
        goto fail;
    pool_refill(d);
    sf_info("msg=\"jail driver ready\" state_dir=%s cgroup=%s uid_base=%u mem_mib=%llu "
            "vcpu_milli=%llu disk_mib=%llu", d->state_dir, wk_cgroup_is_v2() ? "v2" : "v1",
            d->uid_base, (unsigned long long)d->res.mem_mib,
            (unsigned long long)d->res.vcpu_milli, (unsigned long long)d->res.disk_mib);
    *out = d;
    return 0;
fail:
    wk_lxcfs_stop(&d->lxcfs);
    free(d);
    return rc;
}

static void jail_host_res(const wk_driver *d, wk_host_res *res)
{
    *res = d->res;
}

static void on_fini_tick(evutil_socket_t fd, short what, void *arg)
{
}

static void jail_host_fini(wk_driver *d)
{
    struct timeval tick = {0, 100 * 1000};
    struct event *ev;
    int64_t deadline = sf_mono_ms() + FINI_WAIT_MS;
    int kept = 0;

    if (!d)
        return;
    for (wk_sandbox *sb = d->all, *next; sb; sb = next) {
        next = sb->next;
        if (sb->kept && !sb->killed) {
            kept++; /* runs on for the next worker (its agent waits) */
            wk_agent_detach(sb, SF_MSG_WORKER_STOPPING);
            if (sb->ev_freeze)
                event_free(sb->ev_freeze);
            if (sb->ev_exit)
                event_free(sb->ev_exit);
            if (sb->pidfd >= 0)
                close(sb->pidfd);
            if (sb->slot_fd >= 0) /* (the next worker claims the range again) */
                close(sb->slot_fd);
            if (sb->netns_fd >= 0)
                close(sb->netns_fd);
            sf_info("msg=\"sandbox left running for the next worker\" sandbox=%s", sb->id);
            sb_unlink(d, sb);
            free(sb);
        }
    }
    for (wk_sandbox *sb = d->all; sb; sb = sb->next)
        if (!sb->killed && sb->link)
            wk_jail_driver.kill(sb, NULL, NULL);
    /* Creates under way end on the pool and are killed by their callbacks' owners
     * or here on the next pass; teardowns finish on the loop. */
    ev = event_new(d->base, -1, EV_PERSIST, on_fini_tick, NULL);
    if (ev)
        event_add(ev, &tick);
    while ((d->n_all > 0 || d->pool_filling) && sf_mono_ms() < deadline && ev) {
        event_base_loop(d->base, EVLOOP_ONCE);
        for (wk_sandbox *sb = d->all; sb; sb = sb->next)
            if (!sb->killed && sb->link)
                wk_jail_driver.kill(sb, NULL, NULL);
    }
    if (ev)
        event_free(ev);
    if (kept > 0) /* the jails left running bind its files: the next worker takes it back */
        sf_info("msg=\"lxcfs left running for the next worker\" pid=%d", (int)d->lxcfs.pid);
    else
        wk_lxcfs_stop(&d->lxcfs);
    if (d->n_all > 0 || d->pool_filling) {
        /* d stays allocated: their late callbacks still reach it */
        sf_warn("msg=\"sandboxes still tearing down at exit; the next start removes them\" "
                "count=%d", d->n_all);
        return;
    }
    free(d);
}

/* ---- create (pool thread) -------------------------------------------------- */

static void sb_link(wk_driver *d, wk_sandbox *sb)
{
    sb->prev = NULL;
    sb->next = d->all;
    if (d->all)
        d->all->prev = sb;
    d->all = sb;
    d->n_all++;
}

static void sb_unlink(wk_driver *d, wk_sandbox *sb)
{
    if (sb->prev)
        sb->prev->next = sb->next;
    else
        d->all = sb->next;
    if (sb->next)
        sb->next->prev = sb->prev;
    d->n_all--;
}

/* A create from a snapshot (blocking, on the pool): the captured sandbox's own files
 * become this sandbox's writable layer, given to its ids. */
static int snap_restore(wk_sandbox *sb, const char **why)
{
    char words[64], from[WK_PATH_MAX], upper[WK_PATH_MAX];
    unsigned long uid;
    char *end;
    int rc;

    if ((rc = wk_snap_meta_read(sb->snapshot, "jail", words, sizeof(words))) < 0) {
        *why = rc == -ESTALE ? "The snapshot was not taken by this host's jail driver."
                             : SF_MSG_SNAPSHOT_FILES_MISSING;
        return rc == -ESTALE ? rc : -ENOENT;
    }
    uid = strtoul(words, &end, 10);
    if (*end || uid > UINT32_MAX - WK_UID_RANGE ||
        snprintf(from, sizeof(from), "%s/upper/.", sb->snapshot) >= (int)sizeof(from) ||
        snprintf(upper, sizeof(upper), "%s/" WK_DISK_MOUNT "/upper", sb->sbdir) >=
            (int)sizeof(upper)) {
        *why = "The snapshot's description is damaged; delete it and take a new one.";
        return -EINVAL;
    }
    if ((rc = wk_snap_copy(from, upper)) < 0) {
        *why = "The snapshot's files could not be copied into the new sandbox (its disk is "
               "too small?).";
        return rc;
    }
    if ((rc = wk_tree_shift(upper, (uint32_t)uid, sb->host_uid)) < 0) {
        *why = "The snapshot's files could not be given to the new sandbox.";
        return rc;
    }
    return 0;
}

static void layers_free(wk_sandbox *sb)
{
    for (int i = 0; i < WK_LAYERS_MAX && sb->layers[i]; i++) {
        free(sb->layers[i]);
        sb->layers[i] = NULL;
    }
}

/* A template build's disk: the `from` tree's size (and files) on top of the build's own
 * disk_mib (and inodes), with room for the file system's own blocks and inode tables, so
 * that the build's writes, not its template, are what disk_mib bounds. */
static int build_disk(wk_sandbox *sb, uint32_t *disk_mib, uint64_t *inodes, const char **why)
{
    uint64_t files = 0, bytes = wk_snap_measure(sb->build_from, &files), add;

    add = (bytes >> 20) + (bytes >> 24) + ((files * 256) >> 20) + 8;
    if (add + *disk_mib > (1u << 24) || files + *inodes > (1ull << 32)) {
        *why = "The template named in 'from' is too large to build on; build from a smaller one.";
        return -EFBIG;
    }
    /* (the build's own files: one per 16 KiB of its disk at most, mkfs's own ratio, so a
     * small disk_mib still formats) */
    if (*inodes > (uint64_t)*disk_mib * 64)
        *inodes = (uint64_t)*disk_mib * 64 < 4096 ? 4096 : (uint64_t)*disk_mib * 64;
    *disk_mib += (uint32_t)add;
    *inodes += files + files / 8 + 64;
    return 0;
}

/* A template build's root: a copy of `from` on its own disk (its upper directory, which
 * the jail mounts as its root, writable, and `snapshot` takes), given to its ids. */
static int build_root(wk_sandbox *sb, const char **why)
{
    char from[WK_PATH_MAX], upper[WK_PATH_MAX];
    int rc;

    if (snprintf(from, sizeof(from), "%s/.", sb->build_from) >= (int)sizeof(from) ||
        snprintf(upper, sizeof(upper), "%s/" WK_DISK_MOUNT "/upper", sb->sbdir) >=
            (int)sizeof(upper)) {
        *why = SF_MSG_STATE_DIR_LONG;
        return -ENAMETOOLONG;
    }
    if ((rc = wk_snap_copy(from, upper)) < 0) {
        *why = "The template named in 'from' could not be copied onto the build's disk; "
               "check free space under state_dir and build it again.";
        return rc;
    }
    if ((rc = wk_tree_shift(upper, 0, sb->host_uid)) < 0) {
        *why = "Cannot give the template build's files to its sandbox; check state_dir.";
        return rc;
    }
    layers_free(sb);
    if (!(sb->layers[0] = strdup(upper))) {
        *why = SF_MSG_HOST_NOMEM;
        return -ENOMEM;
    }
    return 0;
}

/* Blocking: everything a sandbox needs, up to the agent's first answer. On failure
 * whatever was made is removed again. */
static void create_work(void *arg)
{
    wk_sandbox *sb = arg;
    wk_driver *d = sb->drv;
    const struct sock_fprog *prog;
    char lower[WK_PATH_MAX];
    const char *base_layers[2] = {lower, NULL}, *trust_lower = lower;
    uint64_t t0 = sf_mono_us();
    const char *why = NULL;
    wk_spawn_args sa;
    uint32_t disk_mib = sb->lim.disk_mib;
    uint64_t inodes = sb->lim.inodes;
    int sv[2] = {-1, -1}, dir_made = 0, lfd = -1, rc;

    if ((rc = wk_seccomp_prog(&prog, &why)) < 0)
        goto fail;
    if (sb->layers[0]) {
        /* the CA bundle of the template: the topmost layer that has one */
        trust_lower = sb->layers[0];
        for (int i = 0; sb->layers[i]; i++) {
            if (wk_trust_has_bundle(sb->layers[i])) {
                trust_lower = sb->layers[i];
                break;
            }
        }
    }
    if (wk_template_path(d->state_dir, lower, sizeof(lower)) < 0 ||
        sb_path(sb->sbdir, sizeof(sb->sbdir), d->state_dir, sb->id) < 0) {
        why = SF_MSG_STATE_DIR_LONG;
        rc = -ENAMETOOLONG;
        goto fail;
    }
    if ((rc = wk_slot_acquire(d->uid_base, &sb->host_uid, &sb->slot_fd)) < 0) {
        why = rc == -EAGAIN ? "Every uid range of this host is in use; kill a sandbox and retry."
                            : "Cannot lock a uid range under " WK_UID_LOCK_DIR "; run the worker as root.";
        goto fail;
    }
    if ((rc = wk_sbdir_create(sb->sbdir, sb->host_uid, &why)) < 0)
        goto fail;
    dir_made = 1;
    if (sb->build_from && (rc = build_disk(sb, &disk_mib, &inodes, &why)) < 0)
        goto fail;
    if ((rc = wk_disk_attach(d->state_dir, sb->sbdir, disk_mib, inodes, sb->host_uid, &why)) < 0)
        goto fail;
    if (sb->build_from && (rc = build_root(sb, &why)) < 0)
        goto fail;
    if (sb->snapshot && (rc = snap_restore(sb, &why)) < 0)
        goto fail;
    if (sb->trust_pem) {
        char upper[WK_PATH_MAX];
        if (snprintf(upper, sizeof(upper), "%s/" WK_DISK_MOUNT "/upper", sb->sbdir) >=
            (int)sizeof(upper)) {
            rc = -ENAMETOOLONG;
            why = SF_MSG_STATE_DIR_LONG;
            goto fail;
        }
        if ((rc = wk_trust_write(trust_lower, upper, sb->host_uid, sb->trust_pem, &why)) < 0)
            goto fail;
    }
    if ((rc = wk_cgroup_create(&sb->cg, d->host_id, sb->id, &sb->lim, &why)) < 0)
        goto fail;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
        rc = -errno;
        why = SF_MSG_WORKER_NOFD;
        goto fail;
    }
    /* where a restarted worker reaches the agent again (not for template builds: a
     * build never outlives its worker) */
    if (!sb->build_from && (lfd = wk_adopt_listen(d->state_dir, sb->id, &why)) < 0) {
        rc = lfd;
        goto fail;
    }
    sa = (wk_spawn_args){
        .lowers = sb->layers[0] ? (const char *const *)sb->layers : base_layers,
        .rw_root = sb->build_from != NULL,
        .sbdir = sb->sbdir,
        .agent_path = d->agent_path,
        .hostname = sb->id,
        .host_uid = sb->host_uid,
        .cg = &sb->cg,
        .seccomp = prog,
        .sock = sv[1],
        .listen = lfd > 0 ? lfd : 0,
        .slot_lock = sb->slot_fd > 0 ? sb->slot_fd : 0,
        /* half the box: its pages outlive their writers, and a /dev/shm that could
         * fill the box would leave no room for a process to empty it */
        .shm_bytes = (((uint64_t)sb->lim.memory_mib << 20) -
                      wk_agent_reserve((uint64_t)sb->lim.memory_mib << 20)) / 2,
        .nofile = d->nofile,
        .lxcfs_dir = wk_lxcfs_alive(&d->lxcfs) ? d->lxcfs.dir : NULL,
    };
    rc = wk_spawn(&sa, &sb->pid, &sb->pidfd, &why);
    close(sv[1]);
    sv[1] = -1;
    if (lfd >= 0)
        close(lfd); /* the agent's now */
    lfd = -1;
    if (rc < 0)
        goto fail;
    {
        /* the init is our unreaped child: its pid cannot name another process */
        char ns[64];
        snprintf(ns, sizeof(ns), "/proc/%d/ns/net", (int)sb->pid);
        if ((sb->netns_fd = open(ns, O_RDONLY | O_CLOEXEC)) < 0) {
            rc = -errno;
            why = "Cannot open the jail's network namespace.";
            goto fail;
        }
    }
    if ((rc = wk_agent_ping(sv[0], WK_PING_TIMEOUT_MS, &why)) < 0)
        goto fail;
    if (!sb->build_from && (rc = wk_adopt_write(d->state_dir, sb->id, sb->pid, sb->host_uid,
                                                &sb->lim)) < 0)
        sf_warn("msg=\"cannot record the sandbox for a worker restart; a restart will lose "
                "it\" sandbox=%s err=%d", sb->id, rc);
    sb->sock = sv[0];
    sf_info("msg=\"sandbox started\" sandbox=%s pid=%d uid=%u create_us=%llu", sb->id,
            (int)sb->pid, sb->host_uid, (unsigned long long)(sf_mono_us() - t0));
    sb->create_rc = 0;
    return;
fail:
    sf_error("msg=\"sandbox create failed\" sandbox=%s err=%d why=\"%s\"", sb->id, rc,
             why ? why : "");
    if (sv[0] >= 0)
        close(sv[0]);
    if (lfd >= 0)
        close(lfd);
    wk_adopt_remove(d->state_dir, sb->id);
    if (sb->netns_fd >= 0) {
        close(sb->netns_fd);
        sb->netns_fd = -1;
    }
    wk_spawn_kill(&sb->pidfd);
    if (dir_made)
        wk_teardown_run(&sb->cg, sb->sbdir, 0);
    else
        wk_cgroup_destroy(&sb->cg);
    if (sb->slot_fd >= 0) {
        close(sb->slot_fd);
        sb->slot_fd = -1;
    }
    sb->create_rc = rc;
    sb->create_why = why ? why : "The sandbox could not be started.";
}

static void teardown_start(wk_sandbox *sb);

static void create_done(void *arg)
{
    wk_sandbox *sb = arg;
    wk_driver *d = sb->drv;
    wk_create_cb cb = sb->create_cb;
    void *cb_arg = sb->create_arg;

    free(sb->trust_pem);
    sb->trust_pem = NULL;
    layers_free(sb);
    free(sb->build_from);
    sb->build_from = NULL;
    free(sb->snapshot);
    sb->snapshot = NULL;
    if (sb->create_rc == 0 && wk_agent_attach(sb, sb->sock) < 0) {
        /* Out of memory on the loop: the sandbox runs but cannot be driven. */
        sf_error("msg=\"cannot attach to the agent; killing the new sandbox\" sandbox=%s", sb->id);
        sb->sock = -1; /* closed by the attach */
        sb->killed = 1;
        sb->depth++;
        syscall(SYS_pidfd_send_signal, sb->pidfd, SIGKILL, NULL, 0);
        teardown_start(sb);
        cb(cb_arg, NULL, -ENOMEM, "The worker is out of memory; retry sandbox_create later.");
        return;
    }
    sb->sock = -1;
    pool_refill(d);
    if (sb->create_rc < 0) {
        int rc = sb->create_rc;
        const char *why = sb->create_why;
        sb_unlink(d, sb);
        free(sb);
        cb(cb_arg, NULL, rc, why);
        return;
    }
    cb(cb_arg, sb, 0, NULL);
}

static int jail_create(wk_driver *d, const wk_create_req *req, wk_create_cb cb, void *arg)
{
    wk_sandbox *sb;
    const char *why;
    wk_limits lim;
    int rc;

    if (!d || !req || !cb || !sf_id_valid(req->id))
        return -EINVAL;
    lim = req->limits;
    if (!lim.memory_mib)
        lim.memory_mib = d->defaults.memory_mib;
    if (!lim.vcpu_milli)
        lim.vcpu_milli = d->defaults.vcpu_milli;
    if (!lim.disk_mib)
        lim.disk_mib = d->defaults.disk_mib;
    if (!lim.pids_max)
        lim.pids_max = d->defaults.pids_max;
    if (!lim.inodes)
        lim.inodes = d->defaults.inodes;
    if (check_limits(&lim, &why) < 0)
        return -EINVAL;
    for (wk_sandbox *o = d->all; o; o = o->next)
        if (!strcmp(o->id, req->id))
            return -EEXIST;
    if (!(sb = calloc(1, sizeof(*sb))))
        return -ENOMEM;
    memcpy(sb->id, req->id, strlen(req->id) + 1);
    sb->drv = d;
    sb->base = d->base;
    sb->lim = lim;
    sb->pidfd = sb->slot_fd = sb->sock = sb->td_pidfd = sb->netns_fd = -1;
    sb->cg.fd = sb->oom_fd = -1;
    sb->create_cb = cb;
    sb->create_arg = arg;
    if (req->trust_pem && !(sb->trust_pem = strdup(req->trust_pem))) {
        free(sb);
        return -ENOMEM;
    }
    for (int i = 0; req->layers && req->layers[i]; i++)
        if (i == WK_LAYERS_MAX || !(sb->layers[i] = strdup(req->layers[i]))) {
            layers_free(sb);
            free(sb->trust_pem);
            free(sb);
            return i == WK_LAYERS_MAX ? -EINVAL : -ENOMEM;
        }
    if (req->build_from && !(sb->build_from = strdup(req->build_from))) {
        layers_free(sb);
        free(sb->trust_pem);
        free(sb);
        return -ENOMEM;
    }
    if (req->snapshot && !(sb->snapshot = strdup(req->snapshot))) {
        layers_free(sb);
        free(sb->build_from);
        free(sb->trust_pem);
        free(sb);
        return -ENOMEM;
    }
    if ((rc = wk_pool_run(d->pool, create_work, create_done, sb)) < 0) {
        layers_free(sb);
        free(sb->snapshot);
        free(sb->build_from);
        free(sb->trust_pem);
        free(sb);
        return rc;
    }
    sb_link(d, sb);
    return 0;
}

static void jail_limits(const wk_sandbox *sb, wk_limits *out)
{
    *out = sb->lim;
}

static int jail_netns(const wk_sandbox *sb)
{
    return sb->netns_fd >= 0 ? sb->netns_fd : -ENOENT;
}

/* ---- kill ----------------------------------------------------------------- */

/* Fallback when no teardown child can start: the same steps on the thread pool. */
static void teardown_work(void *arg)
{
    wk_sandbox *sb = arg;
    sb->teardown_rc = wk_teardown_run(&sb->cg, sb->sbdir, 0);
}

static void teardown_done(void *arg)
{
    wk_sandbox *sb = arg;
    wk_kill_cb cb = sb->kill_cb;
    void *cb_arg = sb->kill_arg;
    int rc = sb->teardown_rc;

    if (rc != 0)
        sf_error("msg=\"sandbox teardown incomplete; the next start removes the rest\" "
                 "sandbox=%s step=%d", sb->id, rc);
    if (sb->slot_fd >= 0) {
        close(sb->slot_fd); /* the uid range is free again: nothing of it is left */
        sb->slot_fd = -1;
    }
    if (sb->netns_fd >= 0) {
        close(sb->netns_fd);
        sb->netns_fd = -1;
    }
    sf_info("msg=\"sandbox torn down\" sandbox=%s rc=%d", sb->id, rc);
    wk_adopt_remove(sb->drv->state_dir, sb->id);
    sb_unlink(sb->drv, sb);
    sb->depth--;
    if (cb)
        cb(cb_arg, rc == 0 ? 0 : -EIO);
    wk_sandbox_release(sb);
}

/* The teardown child ended. */
static void on_teardown_exit(evutil_socket_t fd, short what, void *arg)
{
    wk_sandbox *sb = arg;
    siginfo_t si;

    memset(&si, 0, sizeof(si));
    if (waitid(P_PIDFD, (id_t)sb->td_pidfd, &si, WEXITED | WNOHANG) < 0) {
        if (errno == EINTR)
            return;
        si.si_code = 0; /* ECHILD: reaped elsewhere; its result is unknown */
    } else if (si.si_pid == 0) {
        return; /* not yet (a spurious wake-up) */
    }
    event_free(sb->ev_td);
    sb->ev_td = NULL;
    close(sb->td_pidfd);
    sb->td_pidfd = -1;
    sb->teardown_rc = si.si_code == CLD_EXITED ? si.si_status : 4;
    teardown_done(sb);
}

/* The init is gone: the kernel has ended every process of the pid namespace. */
static void on_init_exit(evutil_socket_t fd, short what, void *arg)
{
    wk_sandbox *sb = arg;
    siginfo_t si;

    memset(&si, 0, sizeof(si));
    if (waitid(P_PIDFD, (id_t)sb->pidfd, &si, WEXITED | WNOHANG) == 0 && si.si_pid == 0)
        return; /* not yet (spurious wake-up) */
    event_free(sb->ev_exit);
    sb->ev_exit = NULL;
    close(sb->pidfd);
    sb->pidfd = -1;
    teardown_start(sb);
}

static void teardown_start(wk_sandbox *sb)
{
    if (sb->pidfd >= 0) {
        if (!(sb->ev_exit = event_new(sb->base, sb->pidfd, EV_READ | EV_PERSIST, on_init_exit, sb)) ||
            event_add(sb->ev_exit, NULL) < 0) {
            /* cannot watch: wait here (the init was SIGKILLed; this is short) */
            if (sb->ev_exit)
                event_free(sb->ev_exit);
            sb->ev_exit = NULL;
            wk_spawn_kill(&sb->pidfd);
        } else {
            return;
        }
    }
    if (wk_teardown_spawn(&sb->cg, sb->sbdir, sb->drv->teardown_stop, &sb->td_pidfd) == 0) {
        if ((sb->ev_td = event_new(sb->base, sb->td_pidfd, EV_READ | EV_PERSIST, on_teardown_exit,
                                   sb)) && event_add(sb->ev_td, NULL) == 0)
            return;
        /* cannot watch it: let it finish, wait for it here */
        if (sb->ev_td)
            event_free(sb->ev_td);
        sb->ev_td = NULL;
        {
            siginfo_t si;
            memset(&si, 0, sizeof(si));
            while (waitid(P_PIDFD, (id_t)sb->td_pidfd, &si, WEXITED) < 0 && errno == EINTR)
                ;
            close(sb->td_pidfd);
            sb->td_pidfd = -1;
            sb->teardown_rc = si.si_code == CLD_EXITED ? si.si_status : 4;
            teardown_done(sb);
            return;
        }
    }
    sf_warn("msg=\"no teardown child; tearing down on a pool thread\" sandbox=%s", sb->id);
    if (wk_pool_run(sb->drv->pool, teardown_work, teardown_done, sb) < 0) {
        teardown_work(sb);
        teardown_done(sb);
    }
}

/* ---- pause / resume: the cgroup freezer ----------------------------------- */

#define FREEZE_POLL_MS 2
#define FREEZE_WAIT_MS 5000

typedef struct wk_jail_waiter {
    struct wk_jail_waiter *next;
    wk_op_cb cb;
    void *arg;
} wk_jail_waiter;

static void pause_answer(wk_sandbox *sb, int rc, const char *why)
{
    sb->depth++;
    while (sb->pause_w) {
        wk_jail_waiter *w = sb->pause_w;
        sb->pause_w = w->next;
        w->cb(w->arg, rc, why);
        free(w);
    }
    sb->depth--;
}

/* An answer that is ready at once still comes from the loop, never inside the call. */
typedef struct answer {
    wk_sandbox *sb;
    wk_op_cb cb;
    void *arg;
    int rc;
    const char *why;
} answer;

static void on_answer(evutil_socket_t fd, short what, void *p)
{
    answer *a = p;
    wk_sandbox *sb = a->sb;

    (void)fd;
    (void)what;
    if (sb->killed && a->rc == 0)
        a->cb(a->arg, -ESRCH, "The sandbox was killed.");
    else
        a->cb(a->arg, a->rc, a->why);
    free(a);
    sb->depth--;
    wk_sandbox_release(sb);
}

static int answer_later(wk_sandbox *sb, wk_op_cb cb, void *arg, int rc, const char *why)
{
    struct timeval now = {0, 0};
    answer *a = calloc(1, sizeof(*a));

    if (!a)
        return -ENOMEM;
    *a = (answer){.sb = sb, .cb = cb, .arg = arg, .rc = rc, .why = why};
    sb->depth++;
    if (event_base_once(sb->base, -1, EV_TIMEOUT, on_answer, a, &now) < 0) {
        sb->depth--;
        free(a);
        return -ENOMEM;
    }
    return 0;
}

static void thaw(wk_sandbox *sb)
{
    wk_cgroup_thaw(&sb->cg);
    sb->paused = 0;
    if (sb->ev_freeze)
        evtimer_del(sb->ev_freeze);
    if (sb->link)
        wk_alink_hold(sb->link, 0);
}

static void on_freeze_poll(evutil_socket_t fd, short what, void *arg)
{
    wk_sandbox *sb = arg;
    int fz = wk_cgroup_frozen(&sb->cg);

    if (fz == 1) {
        sb->paused = 2;
        pause_answer(sb, 0, NULL);
    } else if (fz < 0 || sf_mono_ms() >= sb->freeze_deadline) {
        sf_warn("msg=\"sandbox did not freeze; thawed again\" sandbox=%s rc=%d", sb->id, fz);
        thaw(sb);
        pause_answer(sb, -ETIMEDOUT, "The sandbox's processes did not all stop within 5 "
                                     "seconds (one may be stuck in the kernel); retry the pause.");
    } else {
        struct timeval tv = {0, FREEZE_POLL_MS * 1000};
        evtimer_add(sb->ev_freeze, &tv);
        return;
    }
    wk_sandbox_release(sb);
}

static void snap_frozen(void *arg, int rc, const char *why);

static int jail_pause(wk_sandbox *sb, wk_op_cb cb, void *arg)
{
    wk_jail_waiter *w;
    int rc;

    if (!sb || !cb)
        return -EINVAL;
    if (sb->killed)
        return -ESRCH;
    if (!sb->link)
        return -EAGAIN;
    if (sb->snapping && cb != snap_frozen)
        sb->snap_thaw = 0; /* paused by its owner meanwhile: it stays frozen after */
    if (sb->paused == 2)
        return answer_later(sb, cb, arg, 0, NULL);
    if (!(w = calloc(1, sizeof(*w))))
        return -ENOMEM;
    if (!sb->ev_freeze && !(sb->ev_freeze = evtimer_new(sb->base, on_freeze_poll, sb))) {
        free(w);
        return -ENOMEM;
    }
    if (sb->paused == 0) {
        if ((rc = wk_cgroup_freeze(&sb->cg)) < 0) {
            free(w);
            return rc;
        }
        sb->paused = 1;
        sb->freeze_deadline = sf_mono_ms() + FREEZE_WAIT_MS;
        /* a stopped agent cannot answer: its requests' deadlines wait with it */
        wk_alink_hold(sb->link, 1);
        on_freeze_poll(-1, 0, sb); /* usually frozen at once; never answers w (not linked) */
    }
    w->cb = cb;
    w->arg = arg;
    if (sb->paused == 2) { /* frozen by the poll above */
        free(w);
        return answer_later(sb, cb, arg, 0, NULL);
    }
    if (sb->paused == 0) { /* the poll gave up (freezer error) */
        free(w);
        return -EIO;
    }
    w->next = sb->pause_w;
    sb->pause_w = w;
    return 0;
}

static int jail_resume(wk_sandbox *sb, wk_op_cb cb, void *arg)
{
    if (!sb || !cb)
        return -EINVAL;
    if (sb->killed)
        return -ESRCH;
    if (sb->snapping) { /* frozen for a copy: it runs again once the copy is done */
        sb->snap_thaw = 1;
        return answer_later(sb, cb, arg, 0, NULL);
    }
    if (sb->paused) {
        thaw(sb);
        pause_answer(sb, -ECANCELED, "The sandbox was resumed before its pause completed.");
        sf_debug("msg=\"sandbox resumed\" sandbox=%s", sb->id);
    }
    return answer_later(sb, cb, arg, 0, NULL);
}

/* ---- snapshot: the sandbox's own files, copied while it is frozen -------------- */

typedef struct jsnap {
    wk_sandbox *sb;
    char dir[WK_PATH_MAX];
    wk_snap_cb cb;
    void *arg;
    int rc;
    uint64_t bytes;
    const char *why;
} jsnap;

static void snap_work(void *arg)
{
    jsnap *s = arg;
    char upper[WK_PATH_MAX], to[WK_PATH_MAX], words[24];

    if (snprintf(upper, sizeof(upper), "%s/" WK_DISK_MOUNT "/upper", s->sb->sbdir) >=
            (int)sizeof(upper) ||
        snprintf(to, sizeof(to), "%s/upper", s->dir) >= (int)sizeof(to)) {
        s->rc = -ENAMETOOLONG;
        s->why = SF_MSG_STATE_DIR_LONG;
        return;
    }
    if (mkdir(s->dir, 0700) < 0) {
        s->rc = -errno;
        s->why = "The snapshot's directory could not be made under the worker's state_dir.";
        return;
    }
    snprintf(words, sizeof(words), "%u", s->sb->host_uid);
    if ((s->rc = wk_snap_copy(upper, to)) < 0 ||
        (s->rc = wk_snap_meta_write(s->dir, "jail", words)) < 0) {
        s->why = "The sandbox's files could not be copied (is the host's disk full?); retry "
                 "later.";
        return;
    }
    s->bytes = wk_snap_bytes(s->dir);
}

static void snap_done(void *arg)
{
    jsnap *s = arg;
    wk_sandbox *sb = s->sb;

    sb->snapping = 0;
    if (sb->killed) {
        s->rc = -ESRCH;
        s->why = SF_MSG_KILLED_DURING_SNAPSHOT;
    } else if (sb->snap_thaw) {
        thaw(sb);
    }
    sf_info("msg=\"snapshot taken\" sandbox=%s rc=%d bytes=%llu", sb->id, s->rc,
            (unsigned long long)s->bytes);
    s->cb(s->arg, s->rc, s->rc < 0 ? 0 : s->bytes, s->rc < 0 ? s->why : NULL);
    free(s);
    sb->depth--;
    wk_sandbox_release(sb);
}

static void snap_frozen(void *arg, int rc, const char *why)
{
    jsnap *s = arg;

    if (rc == 0 && s->sb->killed) {
        rc = -ESRCH;
        why = SF_MSG_KILLED_DURING_SNAPSHOT;
    }
    if (rc == 0 && (rc = wk_pool_run(s->sb->drv->pool, snap_work, snap_done, s)) == 0)
        return;
    s->rc = rc;
    s->why = why ? why : SF_MSG_HOST_NOMEM;
    snap_done(s);
}

static int jail_snapshot(wk_sandbox *sb, const char *dir, wk_snap_cb cb, void *arg)
{
    jsnap *s;
    int rc;

    if (!sb || !dir || !cb || strlen(dir) >= WK_PATH_MAX)
        return -EINVAL;
    if (sb->killed)
        return -ESRCH;
    if (!sb->link)
        return -EAGAIN;
    if (sb->snapping)
        return -EBUSY;
    if (!(s = calloc(1, sizeof(*s))))
        return -ENOMEM;
    s->sb = sb;
    memcpy(s->dir, dir, strlen(dir) + 1);
    s->cb = cb;
    s->arg = arg;
    sb->snapping = 1;
    sb->snap_thaw = sb->paused == 0; /* a paused one stays paused */
    sb->depth++;
    if ((rc = jail_pause(sb, snap_frozen, s)) < 0) {
        sb->snapping = 0;
        sb->depth--;
        free(s);
        return rc;
    }
    return 0;
}

static void jail_kill(wk_sandbox *sb, wk_kill_cb cb, void *arg)
{
    if (!sb || sb->killed)
        return;
    if (sb->ev_freeze) {
        event_free(sb->ev_freeze);
        sb->ev_freeze = NULL;
    }
    pause_answer(sb, -ESRCH, "The sandbox was killed while it paused.");
    sb->killed = 1;
    sb->kill_cb = cb;
    sb->kill_arg = arg;
    sb->depth++; /* held by the teardown */
    wk_agent_detach(sb, ERR_KILLED);
    wk_cgroup_thaw(&sb->cg);
    if (sb->pidfd >= 0)
        syscall(SYS_pidfd_send_signal, sb->pidfd, SIGKILL, NULL, 0);
    teardown_start(sb);
}

static int64_t jail_disk_free(const wk_sandbox *sb)
{
    char mnt[WK_PATH_MAX];
    struct statvfs v;

    if (!sb->sbdir[0] ||
        snprintf(mnt, sizeof(mnt), "%s/" WK_DISK_MOUNT, sb->sbdir) >= (int)sizeof(mnt))
        return -ENAMETOOLONG;
    if (statvfs(mnt, &v) < 0)
        return -errno;
    return (int64_t)v.f_bavail * (int64_t)v.f_frsize;
}

/* The jail's netns is the sandbox's own: its loopback is the sandbox's. */
static int jail_preview_addr(const wk_sandbox *sb, uint16_t port, struct sockaddr_in *addr,
                             int *relay)
{
    (void)sb;
    memset(addr, 0, sizeof(*addr));
    addr->sin_family = AF_INET;
    addr->sin_port = htons(port);
    addr->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    *relay = 0;
    return 0;
}

/* ---- a worker restart: taking the jails of an earlier run back ---------------- */

static int jail_adopt(wk_driver *d, const char *id, wk_sandbox **out, int *paused,
                      const char **why)
{
    wk_adopt_handle h;
    wk_sandbox *sb;
    char ns[64];
    int rc, fd, frozen;

    *why = SF_MSG_ADOPT_BAD_ID;
    if (!d || !d->adopting || !sf_id_valid(id))
        return -EINVAL;
    if (adopted_here(d, id)) {
        *why = SF_MSG_ADOPT_TWICE;
        return -EEXIST;
    }
    if ((rc = wk_adopt_check(d->state_dir, d->host_id, id, &h, why)) < 0)
        return rc;
    if (!(sb = calloc(1, sizeof(*sb)))) {
        close(h.pidfd);
        *why = SF_MSG_HOST_NOMEM;
        return -ENOMEM;
    }
    memcpy(sb->id, id, strlen(id) + 1);
    sb->drv = d;
    sb->base = d->base;
    sb->lim = h.lim;
    sb->pid = h.pid;
    sb->pidfd = h.pidfd;
    sb->host_uid = h.host_uid;
    sb->adopted = 1;
    sb->slot_fd = sb->sock = sb->td_pidfd = sb->netns_fd = -1;
    sb->cg.fd = sb->oom_fd = -1;
    wk_cgroup_lookup(&sb->cg, d->host_id, id);
    sb->cg.fd = -1;
    rc = -ENAMETOOLONG;
    *why = SF_MSG_STATE_DIR_LONG;
    if (sb_path(sb->sbdir, sizeof(sb->sbdir), d->state_dir, id) < 0)
        goto fail;
    /* the lock on its uid range: the jail holds it (fd 6), so no sandbox of any worker took
     * the range meanwhile; this worker holds it too from now on (the same lock) */
    *why = "Its uid range is held by another sandbox of this host.";
    if ((sb->slot_fd = (int)syscall(SYS_pidfd_getfd, sb->pidfd, SF_AP_SLOT_FD, 0)) >= 0 &&
        !wk_slot_is(sb->slot_fd, sb->host_uid)) {
        close(sb->slot_fd);
        sb->slot_fd = -1;
    }
    if (sb->slot_fd < 0 && (rc = wk_slot_take(sb->host_uid, &sb->slot_fd)) < 0)
        goto fail;
    /* the namespace of the verified init: alive still after the open, so it is its own */
    snprintf(ns, sizeof(ns), "/proc/%d/ns/net", (int)sb->pid);
    *why = "Its processes died while it was taken back.";
    if ((sb->netns_fd = open(ns, O_RDONLY | O_CLOEXEC)) < 0 ||
        syscall(SYS_pidfd_send_signal, sb->pidfd, 0, NULL, 0) < 0) {
        rc = -ESRCH;
        goto fail;
    }
    if ((rc = wk_disk_remount(sb->sbdir)) < 0)
        sf_warn("msg=\"cannot mount a kept sandbox's disk again; its snapshots and disk "
                "figures fail\" sandbox=%s err=%d", id, rc);
    frozen = wk_cgroup_frozen(&sb->cg) == 1;
    *why = "Its agent does not take a new worker's connection (it died, or is too old to "
           "outlive its worker).";
    if ((fd = wk_adopt_connect(d->state_dir, id)) < 0) {
        rc = fd;
        goto fail;
    }
    /* a paused sandbox's agent is frozen too: it accepts once resumed */
    if (!frozen && (rc = wk_agent_ping(fd, ADOPT_PING_MS, why)) < 0) {
        close(fd);
        goto fail;
    }
    if ((rc = wk_agent_attach(sb, fd)) < 0) { /* (fd closed) */
        *why = SF_MSG_HOST_NOMEM;
        goto fail;
    }
    sb->paused = frozen ? 2 : 0;
    sb_link(d, sb);
    sf_info("msg=\"sandbox taken back from the previous worker run\" sandbox=%s pid=%d "
            "uid=%u paused=%d", id, (int)sb->pid, sb->host_uid, frozen);
    *paused = frozen;
    *out = sb;
    return 0;
fail:
    if (sb->netns_fd >= 0)
        close(sb->netns_fd);
    if (sb->slot_fd >= 0)
        close(sb->slot_fd);
    close(sb->pidfd);
    free(sb);
    return rc < 0 ? rc : -EIO;
}

static void jail_adopt_end(wk_driver *d)
{
    if (!d || !d->adopting)
        return;
    host_cleanup(d->state_dir, d->host_id, 0, d);
    d->adopting = 0;
}

/* The calls still waiting on its agent answer now (on the loop, while replies can still
 * go out): their commands run on, with nobody to tell their end to. */
static void jail_keep(wk_sandbox *sb)
{
    if (!sb || sb->killed)
        return;
    sb->kept = 1;
    wk_agent_detach(sb, SF_MSG_WORKER_STOPPING);
}

const wk_driver_ops wk_jail_driver = {
    .name = "jail",
    .caps = WK_CAP_LAYERS | WK_CAP_BUILDS | WK_CAP_DEBIAN | WK_CAP_DESKTOP,
    .host_init = jail_host_init,
    .host_res = jail_host_res,
    .host_fini = jail_host_fini,
    .create = jail_create,
    .limits = jail_limits,
    .exec = wk_jail_exec,
    .kill = jail_kill,
    .netns = jail_netns,
    .exec_cancel = wk_jail_exec_cancel,
    .exec_input = wk_jail_exec_input,
    .file = wk_jail_file,
    .pause = jail_pause,
    .resume = jail_resume,
    .snapshot = jail_snapshot,
    .disk_free = jail_disk_free,
    .preview_addr = jail_preview_addr,
    .adopt = jail_adopt,
    .adopt_end = jail_adopt_end,
    .keep = jail_keep,
};
