/* Starting a jail: clone3 into new user, pid, mount, net, ipc and uts
 * namespaces (cgroup namespace right after the move into the sandbox's
 * cgroups), set the jail up from inside, exec the agent as pid 1.
 *
 * Parent (worker)                         Child (future pid 1)
 *   clone3(CLONE_NEW*, CLONE_PIDFD)  ---->  waits on the go pipe
 *   writes uid_map/gid_map (0 -> host_uid, 65536 ids), writes the go byte
 *                                    ---->  moves itself into the v1 cgroups;
 *                                           setsid; private mounts; opens the
 *                                           layers; becomes root of its userns;
 *                                           unshare(CLONE_NEWCGROUP); overlay
 *                                           (lower = the template's layers,
 *                                           upper/work = the sandbox's disk) on rootfs;
 *                                           /proc, /dev (tmpfs + bound device
 *                                           nodes, devpts, shm), agent bound
 *                                           read-only; hostname; lo up;
 *                                           pivot_root, old root detached; caps
 *                                           bounded; fds: 0-2 /dev/null, 3 the
 *                                           socket, 4 the box's cgroup file,
 *                                           5 the agent's listener and 6 the uid
 *                                           range's lock (if any);
 *                                           nofile and core limits; no_new_privs;
 *                                           seccomp; exec
 *   reads the error pipe: EOF = exec'd <----  or {errno, step} on failure
 *
 * The child runs in a copy of a possibly multi-threaded process, so it makes
 * only raw syscalls (no malloc, no stdio, no glibc set*id broadcasts); every
 * string it needs is prepared before clone3. The child opens the layers and
 * the agent binary as O_PATH descriptors while it still has the worker's ids
 * and mounts them through /proc/self/fd/N after switching to the sandbox's
 * root, so state_dir may stay 0700: the sandbox's ids need no path to it. */
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/close_range.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "jail_int.h"
#include "sf_agentproto.h"
#include "sf_msg.h"

#define SPAWN_TIMEOUT_MS 10000
#define AGENT_IN_JAIL "/sbin/sandfleet-agent"

/* Setup steps, reported by the child on failure; each reason is the sentence
 * the worker hands back. */
enum {
    ST_CGROUP, ST_IDS, ST_CGNS, ST_PRIVATE, ST_TEMPLATE, ST_SBDIR, ST_OVERLAY, ST_PROC,
    ST_DEV, ST_DEVNODE, ST_SHM, ST_AGENT, ST_HOSTNAME, ST_LO, ST_PIVOT, ST_CAPS, ST_FDS,
    ST_SECCOMP, ST_EXEC, ST_LIMITS, ST_LXCFS, ST_COUNT
};

static const char *const step_why[ST_COUNT] = {
    [ST_CGROUP] = "The jail could not move into its cgroups; check /sys/fs/cgroup.",
    [ST_IDS] = "The jail could not become root of its user namespace; check that user namespaces are enabled (user.max_user_namespaces > 0).",
    [ST_CGNS] = "The jail could not create its cgroup namespace; the kernel needs cgroup namespaces (Linux 4.6+).",
    [ST_PRIVATE] = "The jail could not make its mounts private; check that the worker runs as root.",
    [ST_TEMPLATE] = "The template root filesystem is missing; run wk_jail_host_init (the worker does at start-up) first.",
    [ST_SBDIR] = "The jail could not enter its sandbox directory; check state_dir.",
    [ST_OVERLAY] = "Mounting the sandbox's overlay root filesystem failed; the kernel needs overlayfs mountable in user namespaces (Linux 5.11+) and state_dir on ext4/xfs/btrfs.",
    [ST_PROC] = "Mounting /proc in the jail failed; the host's /proc must not be partly covered by other mounts.",
    [ST_DEV] = "Mounting the jail's /dev failed.",
    [ST_DEVNODE] = "Binding the host's /dev/null, zero, full, random, urandom or tty into the jail failed.",
    [ST_SHM] = "Mounting the jail's /dev/shm failed.",
    [ST_AGENT] = "Bind-mounting the agent into the jail failed; check agent_path.",
    [ST_HOSTNAME] = "Setting the jail's hostname failed.",
    [ST_LO] = "Bringing up the jail's loopback interface failed.",
    [ST_PIVOT] = "pivot_root into the sandbox's root filesystem failed.",
    [ST_CAPS] = "Dropping capabilities in the jail failed.",
    [ST_FDS] = "Setting up the jail's file descriptors failed.",
    [ST_SECCOMP] = "Installing the jail's seccomp filter failed; the kernel needs seccomp filters.",
    [ST_EXEC] = "The jail could not start the agent; check that agent_path is a static sandfleet-agent binary.",
    [ST_LXCFS] = "The jail could not bind lxcfs's /proc files; check that the worker's lxcfs runs (state_dir/lxcfs).",
    [ST_LIMITS] = "The jail could not set its open-file limit; lower the worker's nofile setting to at most the host's fs.nr_open.",
};

/* Capabilities the sandbox keeps (inside its user namespace): the usual
 * container set minus MKNOD. Notably gone: SYS_ADMIN, NET_ADMIN (the egress
 * rules in its netns must stay), SYS_PTRACE, SYS_MODULE, SYS_TIME, SYS_BOOT. */
static const int caps_kept[] = {
    CAP_CHOWN,  CAP_DAC_OVERRIDE, CAP_FOWNER,      CAP_FSETID,  CAP_KILL,          CAP_SETGID,
    CAP_SETUID, CAP_SETPCAP,      CAP_SETFCAP,     CAP_NET_RAW, CAP_NET_BIND_SERVICE,
    CAP_SYS_CHROOT, CAP_AUDIT_WRITE,
};

/* Host device nodes bound into the jail's /dev (no strings built after clone). */
static const char *const dev_src[] = {"/dev/null", "/dev/zero", "/dev/full",
                                      "/dev/random", "/dev/urandom", "/dev/tty"};
static const char *const dev_dst[] = {"dev/null", "dev/zero", "dev/full",
                                      "dev/random", "dev/urandom", "dev/tty"};

typedef struct child_ctx {
    int go_r, go_w, err_w, sock, box, listen, slot; /* listen, slot: 0 = none */
    char lxcfs[WK_LXCFS_FILES][WK_PATH_MAX / 4]; /* lxcfs files ("" = none) */
    char lxcfs_dst[WK_LXCFS_FILES][32];          /* proc/<name> */
    int tasks[WK_CG_N];
    char shm_opts[96];
    uint32_t nofile;
    char lower[WK_LAYERS_MAX][WK_PATH_MAX], upper[WK_PATH_MAX], work[WK_PATH_MAX];
    int n_lower, rw_root;
    const char *sbdir, *agent;
    const char *hostname;
    const struct sock_fprog *seccomp;
    uint64_t caps_keep;
} child_ctx;

typedef struct report {
    int err;
    int step;
} report;

static __attribute__((noreturn)) void child_fail(const child_ctx *c, int step)
{
    report r = {errno, step};
    if (write(c->err_w, &r, sizeof(r)) < 0) {
        /* the worker sees EOF without a report: still a failure (no pong) */
    }
    _exit(1);
}

/* Appends s to buf (size WK_PATH_MAX); async-signal-safe. */
static void cat_str(char *buf, size_t *len, const char *s)
{
    while (*s && *len < WK_PATH_MAX - 1)
        buf[(*len)++] = *s++;
    buf[*len] = '\0';
}

static void cat_fd(char *buf, size_t *len, int fd)
{
    char d[12];
    int n = 0;

    do
        d[n++] = (char)('0' + fd % 10);
    while ((fd /= 10) > 0 && n < 11);
    while (n > 0 && *len < WK_PATH_MAX - 1)
        buf[(*len)++] = d[--n];
    buf[*len] = '\0';
}

static int child_devices(void)
{
    for (size_t i = 0; i < sizeof(dev_src) / sizeof(dev_src[0]); i++) {
        int fd = open(dev_dst[i], O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
        if (fd < 0)
            return -1;
        close(fd);
        if (mount(dev_src[i], dev_dst[i], NULL, MS_BIND, NULL) < 0)
            return -1;
    }
    return 0;
}

static int child_lo_up(void)
{
    struct ifreq ifr;
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), rc = -1;

    if (s < 0)
        return -1;
    memset(&ifr, 0, sizeof(ifr));
    memcpy(ifr.ifr_name, "lo", 3);
    if (ioctl(s, SIOCGIFFLAGS, &ifr) == 0) {
        ifr.ifr_flags |= IFF_UP;
        rc = ioctl(s, SIOCSIFFLAGS, &ifr);
    }
    close(s);
    return rc;
}

/* 0-2 -> /dev/null, 3 -> the agent socket, 4 -> the box's cgroup file (the agent's
 * commands join the box through it), 5 -> the listener a restarted worker connects to
 * (when given), everything else close-on-exec (the error pipe closes at exec, which is
 * how the worker learns it worked). */
static int child_fds(const child_ctx *c)
{
    int sock = fcntl(c->sock, F_DUPFD_CLOEXEC, 100), box = fcntl(c->box, F_DUPFD_CLOEXEC, 100), nul;
    int lst = c->listen > 0 ? fcntl(c->listen, F_DUPFD_CLOEXEC, 100) : -1;
    int slot = c->listen > 0 && c->slot > 0 ? fcntl(c->slot, F_DUPFD_CLOEXEC, 100) : -1;

    if (sock < 0 || box < 0 || (c->listen > 0 && lst < 0) || (c->slot > 0 && lst >= 0 && slot < 0) ||
        (nul = open("/dev/null", O_RDWR | O_CLOEXEC)) < 0)
        return -1;
    for (int i = 0; i < 3; i++) {
        if (nul == i) {
            if (fcntl(i, F_SETFD, 0) < 0)
                return -1;
        } else if (dup2(nul, i) < 0) {
            return -1;
        }
    }
    if (dup3(sock, SF_AP_AGENT_FD, 0) < 0 || dup3(box, SF_AP_BOX_FD, 0) < 0 ||
        (lst >= 0 && dup3(lst, SF_AP_LISTEN_FD, 0) < 0) ||
        (slot >= 0 && dup3(slot, SF_AP_SLOT_FD, 0) < 0))
        return -1;
    return (int)syscall(SYS_close_range, slot >= 0 ? SF_AP_SLOT_FD + 1
                                         : lst >= 0 ? SF_AP_LISTEN_FD + 1 : SF_AP_BOX_FD + 1,
                        ~0U, CLOSE_RANGE_CLOEXEC);
}

static __attribute__((noreturn)) void child_main(child_ctx *c)
{
    char *argv[] = {AGENT_IN_JAIL, NULL};
    char *envp[] = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", NULL};
    char opts[WK_PATH_MAX], src[64];
    int lower[WK_LAYERS_MAX], upper, work, sb, agent, lx[WK_LXCFS_FILES];
    size_t n = 0;
    char go;

    close(c->go_w); /* so that a worker dying before the go byte ends the read */
    if (read(c->go_r, &go, 1) != 1)
        _exit(1); /* the worker gave up */
    /* Keep the error pipe clear of fds 0-3, which child_fds() takes over. */
    if ((c->err_w = fcntl(c->err_w, F_DUPFD_CLOEXEC, 100)) < 0)
        _exit(1);
    for (int i = 0; i < WK_CG_N; i++)
        if (c->tasks[i] >= 0 && (write(c->tasks[i], "0", 1) != 1 || close(c->tasks[i]) < 0))
            child_fail(c, ST_CGROUP);
    /* No controlling terminal: /dev/tty inside must not reach the worker's. */
    setsid();
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
        child_fail(c, ST_PRIVATE);
    /* Open the layers while still holding the worker's (host root) ids, which
     * own state_dir: after the switch to the sandbox's root no path to them is
     * needed. Opened here, not in the worker, because overlayfs and bind
     * mounts only take paths of this mount namespace. */
    for (int i = 0; i < c->n_lower; i++)
        if ((lower[i] = open(c->lower[i], O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0)
            child_fail(c, ST_TEMPLATE);
    if ((upper = open(c->upper, O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0 ||
        (work = open(c->work, O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0 ||
        (sb = open(c->sbdir, O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0)
        child_fail(c, ST_SBDIR);
    if ((agent = open(c->agent, O_PATH | O_CLOEXEC)) < 0)
        child_fail(c, ST_AGENT);
    for (int i = 0; i < WK_LXCFS_FILES; i++)
        if ((lx[i] = c->lxcfs[i][0] ? open(c->lxcfs[i], O_PATH | O_CLOEXEC) : -1) < 0 &&
            c->lxcfs[i][0])
            child_fail(c, ST_LXCFS);
    if (syscall(SYS_setresgid, 0, 0, 0) < 0 || syscall(SYS_setgroups, 0, NULL) < 0 ||
        syscall(SYS_setresuid, 0, 0, 0) < 0)
        child_fail(c, ST_IDS);
    if (unshare(CLONE_NEWCGROUP) < 0)
        child_fail(c, ST_CGNS);
    if (fchdir(sb) < 0)
        child_fail(c, ST_SBDIR);
    cat_str(opts, &n, "lowerdir=");
    for (int i = 0; i < c->n_lower; i++) { /* top layer first */
        cat_str(opts, &n, i ? ":/proc/self/fd/" : "/proc/self/fd/");
        cat_fd(opts, &n, lower[i]);
    }
    cat_str(opts, &n, ",upperdir=/proc/self/fd/");
    cat_fd(opts, &n, upper);
    cat_str(opts, &n, ",workdir=/proc/self/fd/");
    cat_fd(opts, &n, work);
    cat_str(opts, &n, ",userxattr");
    if (c->rw_root) { /* a template build: the tree itself */
        n = 0;
        cat_str(opts, &n, "/proc/self/fd/");
        cat_fd(opts, &n, lower[0]);
        if (mount(opts, "rootfs", NULL, MS_BIND | MS_REC, NULL) < 0)
            child_fail(c, ST_OVERLAY);
    } else if (mount("overlay", "rootfs", "overlay", MS_NODEV, opts) < 0) {
        child_fail(c, ST_OVERLAY);
    }
    if (chdir("rootfs") < 0)
        child_fail(c, ST_OVERLAY);
    if (mount("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
        child_fail(c, ST_PROC);
    /* The sandbox's own figures (lxcfs) over the host's. */
    for (int i = 0; i < WK_LXCFS_FILES; i++) {
        if (lx[i] < 0)
            continue;
        n = 0;
        src[0] = '\0';
        cat_str(src, &n, "/proc/self/fd/");
        cat_fd(src, &n, lx[i]);
        if (mount(src, c->lxcfs_dst[i], NULL, MS_BIND, NULL) < 0)
            child_fail(c, ST_LXCFS);
        close(lx[i]);
    }
    if (mount("tmpfs", "dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=256k,nr_inodes=64") < 0)
        child_fail(c, ST_DEV);
    if (child_devices() < 0)
        child_fail(c, ST_DEVNODE);
    /* sized to the box: its pages are charged to the box's memory anyway */
    if (mkdir("dev/shm", 01777) < 0 ||
        mount("tmpfs", "dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, c->shm_opts) < 0)
        child_fail(c, ST_SHM);
    /* A private devpts for ptys is a convenience: skip it if the kernel refuses. */
    if (mkdir("dev/pts", 0755) == 0 &&
        mount("devpts", "dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620") == 0)
        symlink("pts/ptmx", "dev/ptmx");
    if (symlink("/proc/self/fd", "dev/fd") < 0 || symlink("/proc/self/fd/0", "dev/stdin") < 0 ||
        symlink("/proc/self/fd/1", "dev/stdout") < 0 || symlink("/proc/self/fd/2", "dev/stderr") < 0)
        child_fail(c, ST_DEV);
    if (sethostname(c->hostname, strlen(c->hostname)) < 0)
        child_fail(c, ST_HOSTNAME);
    if (child_lo_up() < 0)
        child_fail(c, ST_LO);
    if (syscall(SYS_pivot_root, ".", ".") < 0 || umount2(".", MNT_DETACH) < 0 || chdir("/") < 0)
        child_fail(c, ST_PIVOT);
    for (int cap = 0; cap < 64; cap++) {
        if (c->caps_keep & (1ull << cap))
            continue;
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0) {
            if (errno == EINVAL)
                break; /* past the kernel's last capability */
            child_fail(c, ST_CAPS);
        }
    }
    if (child_fds(c) < 0)
        child_fail(c, ST_FDS);
    {
        struct rlimit nofile = {c->nofile, c->nofile}, none = {0, 0};
        if (setrlimit(RLIMIT_NOFILE, &nofile) < 0 || setrlimit(RLIMIT_CORE, &none) < 0)
            child_fail(c, ST_LIMITS);
    }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 ||
        syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, c->seccomp) < 0)
        child_fail(c, ST_SECCOMP);
    /* Straight from the host's file: nothing of the agent is mounted in the sandbox, so
     * no host path shows in its mount table. */
    syscall(SYS_execveat, agent, "", argv, envp, AT_EMPTY_PATH);
    child_fail(c, ST_EXEC);
}

/* ---- parent -------------------------------------------------------------- */

static int write_map(pid_t pid, const char *file, uint32_t host_id)
{
    char path[64], map[64];
    int fd, n, rc = 0;

    snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, file);
    n = snprintf(map, sizeof(map), "0 %u %u\n", host_id, WK_UID_RANGE);
    if ((fd = open(path, O_WRONLY | O_CLOEXEC)) < 0)
        return -errno;
    if (write(fd, map, (size_t)n) != n)
        rc = -errno;
    close(fd);
    return rc;
}

void wk_spawn_kill(int *pidfd)
{
    siginfo_t si;

    if (*pidfd < 0)
        return;
    syscall(SYS_pidfd_send_signal, *pidfd, SIGKILL, NULL, 0);
    /* Returns once the pid namespace is empty: the kernel kills and reaps
     * every other process of it before the init's exit is reported. ECHILD:
     * someone else reaped it (SIGCHLD ignored), which also means it is gone. */
    while (waitid(P_PIDFD, (id_t)*pidfd, &si, WEXITED) < 0 && errno == EINTR)
        ;
    close(*pidfd);
    *pidfd = -1;
}

static int path_join(char out[WK_PATH_MAX], const char *base, const char *sub)
{
    int n = snprintf(out, WK_PATH_MAX, "%s%s%s", base, sub ? "/" : "", sub ? sub : "");
    return n < 0 || n >= WK_PATH_MAX ? -ENAMETOOLONG : 0;
}

int wk_spawn(const wk_spawn_args *a, pid_t *pid_out, int *pidfd_out, const char **why)
{
    int agent = -1, go[2] = {-1, -1}, errp[2] = {-1, -1};
    int pidfd = -1, rc;
    struct clone_args ca;
    child_ctx c;
    report r;
    long pid;
    ssize_t n;

    memset(&c, 0, sizeof(c));
    c.box = -1;
    for (int i = 0; i < WK_CG_N; i++)
        c.tasks[i] = -1;
    snprintf(c.shm_opts, sizeof(c.shm_opts), "mode=1777,size=%llu,nr_inodes=16384",
             (unsigned long long)a->shm_bytes);
    c.nofile = a->nofile ? a->nofile : 1024;
    for (int i = 0; i < WK_LXCFS_FILES; i++) {
        c.lxcfs[i][0] = '\0';
        snprintf(c.lxcfs_dst[i], sizeof(c.lxcfs_dst[i]), "proc/%s", wk_lxcfs_files[i]);
        if (a->lxcfs_dir &&
            snprintf(c.lxcfs[i], sizeof(c.lxcfs[i]), "%s/proc/%s", a->lxcfs_dir,
                     wk_lxcfs_files[i]) >= (int)sizeof(c.lxcfs[i]))
            c.lxcfs[i][0] = '\0';
    }
    {
        struct rlimit cur; /* raising the hard limit needs CAP_SYS_RESOURCE on the host */
        if (getrlimit(RLIMIT_NOFILE, &cur) == 0 && cur.rlim_max != RLIM_INFINITY &&
            c.nofile > cur.rlim_max)
            c.nofile = (uint32_t)cur.rlim_max;
    }
    for (c.n_lower = 0; a->lowers[c.n_lower]; c.n_lower++)
        if (c.n_lower == WK_LAYERS_MAX || path_join(c.lower[c.n_lower], a->lowers[c.n_lower], NULL) < 0) {
            rc = -ENAMETOOLONG;
            *why = "The template has too many layers or too long a path; rebuild it from a shallower one.";
            goto out;
        }
    if (path_join(c.upper, a->sbdir, WK_DISK_MOUNT "/upper") < 0 ||
        path_join(c.work, a->sbdir, WK_DISK_MOUNT "/work") < 0) {
        rc = -ENAMETOOLONG;
        *why = SF_MSG_STATE_DIR_LONG;
        goto out;
    }
    c.rw_root = a->rw_root;
    c.sbdir = a->sbdir;
    c.agent = a->agent_path;
    if ((agent = open(a->agent_path, O_PATH | O_CLOEXEC)) < 0) {
        rc = -errno;
        *why = "Cannot open agent_path; point it at the built sandfleet-agent binary.";
        goto out;
    }
    c.hostname = a->hostname;
    c.seccomp = a->seccomp;
    c.sock = a->sock;
    c.listen = a->listen;
    c.slot = a->slot_lock;
    for (size_t i = 0; i < sizeof(caps_kept) / sizeof(caps_kept[0]); i++)
        c.caps_keep |= 1ull << caps_kept[i];
    if ((rc = wk_cgroup_open_tasks(a->cg, c.tasks, &c.box)) < 0) {
        *why = "Cannot open the sandbox's cgroups; check /sys/fs/cgroup.";
        goto out;
    }
    if (pipe2(go, O_CLOEXEC) < 0 || pipe2(errp, O_CLOEXEC) < 0) {
        rc = -errno;
        *why = SF_MSG_WORKER_NOFD;
        goto out;
    }
    c.go_r = go[0];
    c.go_w = go[1];
    c.err_w = errp[1];

    memset(&ca, 0, sizeof(ca));
    ca.flags = CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC |
               CLONE_NEWUTS | CLONE_PIDFD;
    ca.pidfd = (uint64_t)(uintptr_t)&pidfd;
    ca.exit_signal = SIGCHLD;
    if (a->cg->v2) {
        ca.flags |= CLONE_INTO_CGROUP;
        ca.cgroup = (uint64_t)a->cg->fd;
    }
    pid = syscall(SYS_clone3, &ca, sizeof(ca));
    if (pid == 0)
        child_main(&c);
    if (pid < 0) {
        rc = -errno;
        *why = rc == -ENOSPC || rc == -EUSERS
                   ? "The host ran out of namespaces; raise user.max_user_namespaces or kill sandboxes."
                   : "Cannot clone the jail process; the kernel needs clone3 and user namespaces (Linux 5.7+).";
        goto out;
    }
    /* go[0] stays open here until the go byte is written: no EPIPE/SIGPIPE
     * if the child is already gone. */
    close(errp[1]);
    errp[1] = -1;
    if ((rc = write_map((pid_t)pid, "uid_map", a->host_uid)) < 0 ||
        (rc = write_map((pid_t)pid, "gid_map", a->host_uid)) < 0) {
        *why = "Cannot write the jail's uid/gid map; run the worker as root.";
        goto kill;
    }
    if (write(go[1], "g", 1) != 1) {
        rc = -EPIPE;
        *why = step_why[ST_IDS];
        goto kill;
    }
    close(go[0]);
    go[0] = -1;
    {
        struct pollfd p = {.fd = errp[0], .events = POLLIN};
        int ready;

        do
            ready = poll(&p, 1, SPAWN_TIMEOUT_MS);
        while (ready < 0 && errno == EINTR);
        if (ready <= 0) {
            rc = -ETIMEDOUT;
            *why = "The jail did not start within 10 seconds; the host may be overloaded.";
            goto kill;
        }
    }
    do
        n = read(errp[0], &r, sizeof(r));
    while (n < 0 && errno == EINTR);
    if (n != 0) {
        if (n == (ssize_t)sizeof(r) && r.step >= 0 && r.step < ST_COUNT) {
            rc = r.err > 0 ? -r.err : -EIO;
            *why = step_why[r.step];
        } else {
            rc = -EIO;
            *why = "The jail failed while starting; see the worker log.";
        }
        goto kill;
    }
    *pid_out = (pid_t)pid;
    *pidfd_out = pidfd;
    pidfd = -1;
    rc = 0;
    goto out;
kill:
    wk_spawn_kill(&pidfd);
out:
    for (int i = 0; i < 2; i++) {
        if (go[i] >= 0)
            close(go[i]);
        if (errp[i] >= 0)
            close(errp[i]);
    }
    for (int i = 0; i < WK_CG_N; i++)
        if (c.tasks[i] >= 0)
            close(c.tasks[i]);
    if (c.box >= 0)
        close(c.box);
    if (agent >= 0)
        close(agent);
    return rc;
}
