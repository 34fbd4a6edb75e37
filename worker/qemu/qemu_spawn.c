/* Starting a QEMU process, and its command line.
 *
 * Parent (worker loop)                     Child
 *   clone3(CLONE_PIDFD [+ CLONE_NEWNET]) -->  a sandbox's VM: its own session, outliving
 *                                             the worker (a restart takes it back:
 *                                             docs/internals/restart.md); a template
 *                                             boot dies with the worker (PDEATHSIG); no
 *   returns at once with the pidfd and        transparent huge pages (they would
 *   the report pipe                           inflate the VM's memory 512-fold), in
 *                                             the VM's cgroups (v1: joins them; v2:
 *                                             born there), the
 *                                             OOM killer's first choice before the
 *                                             platform's daemons (score +500), joins
 *                                             the sandbox's network namespace (or has
 *                                             a new one), lo up, creates tap0 there
 *                                             (the VM's NIC: no vhost, nothing on the
 *                                             host's network), copies the sandbox's
 *                                             disk overlay, puts its fds in place,
 *                                             execs QEMU
 *   reads the report pipe from the loop <--  EOF = exec'd, or {step, errno}
 *
 * The child runs in a copy of a multi-threaded process: raw syscalls only, every
 * string prepared before the clone (as in jail_spawn.c). */
#include <errno.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <linux/if_tun.h>
#include <linux/sched.h>
#include <arpa/inet.h>
#include <net/if.h>
#include <poll.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "qemu_int.h"
#include "sf_agentproto.h"
#include "sf_msg.h"

enum { ST_PARENT, ST_CGROUP, ST_NETNS, ST_LO, ST_TAP, ST_DISK, ST_FDS, ST_LOG, ST_EXEC,
       ST_COUNT };

static const char *const step_why[ST_COUNT] = {
    [ST_PARENT] = "The worker ended while the VM was starting.",
    [ST_CGROUP] = "The VM could not join its cgroups; check /sys/fs/cgroup.",
    [ST_NETNS] = "The VM could not join its network namespace.",
    [ST_LO] = "Bringing up the loopback interface of the VM's network namespace failed.",
    [ST_TAP] = "Creating the VM's tap device failed; the host needs /dev/net/tun (module tun).",
    [ST_DISK] = "Creating the sandbox's disk overlay failed; check that the worker's state_dir has free space.",
    [ST_FDS] = "Setting up the QEMU process's file descriptors failed.",
    [ST_LOG] = "Opening the VM's log file failed; check the worker's state_dir.",
    [ST_EXEC] = "Starting QEMU failed; install qemu-system-x86 (qemu-system-x86_64).",
};

typedef struct report {
    int err;
    int step;
} report;

static __attribute__((noreturn)) void child_fail(int fd, int step)
{
    report r = {errno, step};
    if (write(fd, &r, sizeof(r)) < 0) {
        /* the parent then sees EOF without QEMU: still a failure (no monitor greeting) */
    }
    _exit(1);
}

static int if_up(int s, const char *name)
{
    struct ifreq ifr;

    memset(&ifr, 0, sizeof(ifr));
    memcpy(ifr.ifr_name, name, strlen(name) + 1);
    if (ioctl(s, SIOCGIFFLAGS, &ifr) < 0)
        return -1;
    ifr.ifr_flags |= IFF_UP;
    return ioctl(s, SIOCSIFFLAGS, &ifr);
}

/* The netns side of the VM's link (the guest is .2 with its default route via .1; see
 * WK_QEMU_NET_*): the egress proxy's listeners answer the guest there. */
static int set_addr(int s, const char *name)
{
    struct ifreq ifr;
    struct sockaddr_in *sin = (struct sockaddr_in *)(void *)&ifr.ifr_addr;

    memset(&ifr, 0, sizeof(ifr));
    memcpy(ifr.ifr_name, name, strlen(name) + 1);
    sin->sin_family = AF_INET;
    sin->sin_addr.s_addr = htonl(WK_QEMU_NET_HOST);
    if (ioctl(s, SIOCSIFADDR, &ifr) < 0)
        return -1;
    sin->sin_addr.s_addr = htonl(0xfffffffcu); /* /30 */
    return ioctl(s, SIOCSIFNETMASK, &ifr);
}

static int make_tap(void)
{
    struct ifreq ifr;
    int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);

    if (fd < 0)
        return -1;
    memset(&ifr, 0, sizeof(ifr));
    memcpy(ifr.ifr_name, WK_QEMU_TAP_NAME, sizeof(WK_QEMU_TAP_NAME));
    ifr.ifr_flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR;
    if (ioctl(fd, TUNSETIFF, &ifr) < 0)
        return -1;
    return fd;
}

static int copy_disk(const char *from, const char *to)
{
    char buf[65536];
    int in = open(from, O_RDONLY | O_CLOEXEC), out;
    ssize_t n;

    if (in < 0)
        return -1;
    if ((out = open(to, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600)) < 0)
        return -1;
    for (;;) {
        n = copy_file_range(in, NULL, out, NULL, 1 << 30, 0);
        if (n == 0)
            break;
        if (n > 0)
            continue;
        if (errno == EINTR)
            continue;
        if (errno != EXDEV && errno != ENOSYS && errno != EINVAL)
            return -1;
        while ((n = read(in, buf, sizeof(buf))) > 0)
            if (write(out, buf, (size_t)n) != n)
                return -1;
        if (n < 0)
            return -1;
        break;
    }
    close(in);
    return close(out);
}

/* Moves fd to target (not close-on-exec), from a copy above every target. */
static int place(int fd, int target)
{
    if (fd < 0)
        return 0;
    return dup3(fd, target, 0) < 0 ? -1 : 0;
}

static __attribute__((noreturn)) void child_main(const wk_qspawn *a, int err_w, pid_t parent,
                                                 char *const *envp)
{
    int fds[4] = {a->agent_fd, a->qmp_fd, -1, a->incoming_fd};
    int s, nul, log;

    if (a->outlive) {
        /* no signal of the worker's session or terminal reaches it */
        if (setsid() < 0 || getppid() != parent)
            child_fail(err_w, ST_PARENT);
    } else if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0 || getppid() != parent) {
        child_fail(err_w, ST_PARENT);
    }
    /* v1: into the VM's groups (this thread; QEMU's threads are born there) */
    for (int i = 0; a->tasks && i < WK_CG_N; i++)
        if (a->tasks[i] >= 0 && write(a->tasks[i], "0", 1) != 1)
            child_fail(err_w, ST_CGROUP);
    prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0);
    /* When the host runs out of memory, a VM goes before the platform's daemons. */
    if ((s = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC)) >= 0) {
        if (write(s, "500", 3) != 3) {
            /* not fatal: the VM only loses its place in the OOM killer's order */
        }
        close(s);
    }
    if (a->netns_fd >= 0 && setns(a->netns_fd, CLONE_NEWNET) < 0)
        child_fail(err_w, ST_NETNS);
    if ((s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0)) < 0 || if_up(s, "lo") < 0)
        child_fail(err_w, ST_LO);
    if (a->tap) {
        if ((fds[2] = make_tap()) < 0 || set_addr(s, WK_QEMU_TAP_NAME) < 0 ||
            if_up(s, WK_QEMU_TAP_NAME) < 0)
            child_fail(err_w, ST_TAP);
    }
    close(s);
    if (a->copy_from && copy_disk(a->copy_from, a->copy_to) < 0)
        child_fail(err_w, ST_DISK);
    if ((log = open(a->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600)) < 0)
        child_fail(err_w, ST_LOG);
    if ((nul = open("/dev/null", O_RDWR | O_CLOEXEC)) < 0)
        child_fail(err_w, ST_FDS);
    /* Lift every fd above the targets first, so no placement clobbers another. */
    for (int i = 0; i < 4; i++)
        if (fds[i] >= 0 && (fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 100)) < 0)
            child_fail(err_w, ST_FDS);
    if ((log = fcntl(log, F_DUPFD_CLOEXEC, 100)) < 0 || (nul = fcntl(nul, F_DUPFD_CLOEXEC, 100)) < 0 ||
        (err_w = fcntl(err_w, F_DUPFD_CLOEXEC, 100)) < 0)
        child_fail(err_w, ST_FDS);
    if (dup3(nul, 0, 0) < 0 || dup3(nul, 1, 0) < 0 || dup3(log, 2, 0) < 0 ||
        place(fds[0], WK_QEMU_AGENT_FD) < 0 || place(fds[1], WK_QEMU_QMP_FD) < 0 ||
        place(fds[2], WK_QEMU_TAP_FD) < 0 || place(fds[3], WK_QEMU_INCOMING_FD) < 0 ||
        syscall(SYS_close_range, WK_QEMU_INCOMING_FD + 1, ~0U, CLOSE_RANGE_CLOEXEC) < 0)
        child_fail(err_w, ST_FDS);
    execve(a->argv[0], (char *const *)a->argv, envp);
    child_fail(err_w, ST_EXEC);
}

int wk_qspawn_start(const wk_qspawn *a, pid_t *pid_out, int *pidfd_out, int *report_out,
                    const char **why)
{
    static char *const envp[] = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C", NULL};
    struct clone_args ca;
    int errp[2], pidfd = -1;
    pid_t parent = getpid();
    long pid;

    if (pipe2(errp, O_CLOEXEC | O_NONBLOCK) < 0) {
        *why = SF_MSG_WORKER_NOFD;
        return -errno;
    }
    memset(&ca, 0, sizeof(ca));
    ca.flags = CLONE_PIDFD | (a->netns_fd < 0 ? CLONE_NEWNET : 0);
    ca.pidfd = (uint64_t)(uintptr_t)&pidfd;
    ca.exit_signal = SIGCHLD;
    if (a->cg_fd >= 0) {
        ca.flags |= CLONE_INTO_CGROUP;
        ca.cgroup = (uint64_t)a->cg_fd;
    }
    pid = syscall(SYS_clone3, &ca, sizeof(ca));
    if (pid == 0)
        child_main(a, errp[1], parent, envp);
    close(errp[1]);
    if (pid < 0) {
        int rc = -errno;
        close(errp[0]);
        *why = "Cannot start the QEMU process; the kernel needs clone3 (Linux 5.7+) and the "
               "worker must run as root.";
        return rc;
    }
    *pid_out = (pid_t)pid;
    *pidfd_out = pidfd;
    *report_out = errp[0];
    return 0;
}

static __attribute__((noreturn)) void holder_main(const char *const *argv, char *const *envp,
                                                   int netns_fd, const int *tasks)
{
    int nul;

    if (setsid() < 0)
        _exit(1);
    for (int i = 0; tasks && i < WK_CG_N; i++)
        if (tasks[i] >= 0 && write(tasks[i], "0", 1) != 1)
            _exit(1);
    if (setns(netns_fd, CLONE_NEWNET) < 0 || (nul = open("/dev/null", O_RDWR)) < 0 ||
        dup3(nul, 0, 0) < 0 || dup3(nul, 1, 0) < 0 || dup3(nul, 2, 0) < 0 ||
        syscall(SYS_close_range, 3, ~0U, 0) < 0)
        _exit(1);
    execve(argv[0], (char *const *)argv, envp);
    _exit(127);
}

int wk_qspawn_holder(const char *agent, int netns_fd, int cg_fd, const int *tasks, pid_t *pid,
                     int *pidfd_out)
{
    static char *const envp[] = {"LC_ALL=C", NULL};
    const char *argv[] = {agent, "--hold-netns", NULL};
    struct clone_args ca;
    int pidfd = -1;
    long p;

    memset(&ca, 0, sizeof(ca));
    ca.flags = CLONE_PIDFD | (cg_fd >= 0 ? CLONE_INTO_CGROUP : 0);
    ca.pidfd = (uint64_t)(uintptr_t)&pidfd;
    ca.exit_signal = SIGCHLD;
    ca.cgroup = cg_fd >= 0 ? (uint64_t)cg_fd : 0;
    p = syscall(SYS_clone3, &ca, sizeof(ca));
    if (p == 0)
        holder_main(argv, envp, netns_fd, tasks);
    if (p < 0)
        return -errno;
    *pid = (pid_t)p;
    *pidfd_out = pidfd;
    return 0;
}

int wk_qspawn_report(int fd, const char **why)
{
    report r;
    ssize_t n;

    do
        n = read(fd, &r, sizeof(r));
    while (n < 0 && errno == EINTR);
    if (n < 0 && errno == EAGAIN)
        return -EAGAIN;
    if (n == 0)
        return 0;
    if (n == (ssize_t)sizeof(r) && r.step >= 0 && r.step < ST_COUNT) {
        *why = step_why[r.step];
        return r.err > 0 ? -r.err : -EIO;
    }
    *why = "The QEMU process failed while starting; see the VM's log.";
    return -EIO;
}

void wk_qspawn_kill(int *pidfd)
{
    siginfo_t si;

    if (*pidfd < 0)
        return;
    syscall(SYS_pidfd_send_signal, *pidfd, SIGKILL, NULL, 0);
    while (waitid(P_PIDFD, (id_t)*pidfd, &si, WEXITED) < 0 && errno == EINTR)
        ;
    close(*pidfd);
    *pidfd = -1;
}

int wk_qspawn_reap(int pidfd)
{
    siginfo_t si;

    memset(&si, 0, sizeof(si));
    if (waitid(P_PIDFD, (id_t)pidfd, &si, WEXITED | WNOHANG) < 0 && errno == ECHILD) {
        /* a VM taken back from an earlier worker run is not our child: its pidfd turns
         * readable once it exited (its status went to its parent) */
        struct pollfd p = {.fd = pidfd, .events = POLLIN};
        return poll(&p, 1, 0) == 1 ? WK_QSPAWN_STATUS_UNKNOWN : -1;
    }
    if (si.si_pid == 0)
        return -1;
    return si.si_code == CLD_EXITED ? si.si_status : 128 + si.si_status;
}

/* ---- the command line ------------------------------------------------------ */

typedef struct argv_b {
    char **v;
    size_t n, cap;
    int oom;
} argv_b;

static void add(argv_b *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(argv_b *b, const char *fmt, ...)
{
    va_list ap;
    char *s;

    if (b->oom)
        return;
    if (b->n + 2 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        char **v = realloc(b->v, cap * sizeof(*v));
        if (!v) {
            b->oom = 1;
            return;
        }
        b->v = v;
        b->cap = cap;
    }
    va_start(ap, fmt);
    if (vasprintf(&s, fmt, ap) < 0)
        b->oom = 1;
    else
        b->v[b->n++] = s;
    va_end(ap);
    b->v[b->n] = NULL;
}

void wk_qargs_free(char **argv)
{
    for (size_t i = 0; argv && argv[i]; i++)
        free(argv[i]);
    free(argv);
}

/* The device list is identical in every mode: a restored VM must have exactly the
 * devices (and order) its snapshot was taken with. */
char **wk_qargs(const wk_qemu_cfg *c, const wk_qtpl *t, int mode, const char *disk,
                const char *console)
{
    argv_b b = {0};

    add(&b, "%s", c->qemu);
    add(&b, "-M");
    add(&b, "microvm,pit=on,pic=on,rtc=on,isa-serial=on,memory-backend=ram0");
    add(&b, "-accel");
    /* TCG's translation cache is 1 GiB by default, filled as the guest runs new code
     * (python, node, gcc in 'debian'): bounded, so QEMU stays within the VM cgroup's
     * WK_QEMU_OVERHEAD_MIB beside the guest's RAM (it was OOM-killed there). */
    add(&b, "%s", c->kvm ? "kvm" : WK_QEMU_TCG_ACCEL);
    if (c->kvm) {
        add(&b, "-cpu");
        add(&b, "host,-arch-capabilities");
    }
    add(&b, "-smp");
    add(&b, "%u", t->vcpus);
    add(&b, "-m");
    add(&b, "%uM", t->memory_mib);
    add(&b, "-object");
    add(&b, "memory-backend-file,id=ram0,size=%uM,mem-path=%s/" WK_QTPL_RAM ",share=%s",
        t->memory_mib, t->dir, mode == WK_QARGS_BOOT ? "on" : "off");
    add(&b, "-nodefaults");
    add(&b, "-no-user-config");
    add(&b, "-display");
    add(&b, "none");
    add(&b, "-no-reboot");
    add(&b, "-sandbox");
    add(&b, "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny");
    add(&b, "-chardev");
    if (console)
        add(&b, "file,id=con,path=%s", console);
    else
        add(&b, "null,id=con");
    add(&b, "-serial");
    add(&b, "chardev:con");
    add(&b, "-chardev");
    /* A sandbox's VM: listening sockets (wk_qspawn.outlive), so that a restarted worker
     * connects to the monitor and the agent again; a template boot: connected ones. (A
     * chardev's backend is no part of the device state a snapshot carries.) */
    add(&b, "socket,id=agent,fd=%d,%s", WK_QEMU_AGENT_FD,
        mode == WK_QARGS_BOOT ? "server=off" : "server=on,wait=off");
    add(&b, "-device");
    add(&b, "virtio-serial-device,max_ports=2");
    add(&b, "-device");
    add(&b, "virtserialport,chardev=agent,name=%s", SF_AP_VIRTIO_PORT);
    add(&b, "-chardev");
    add(&b, "socket,id=qmp,fd=%d,%s", WK_QEMU_QMP_FD,
        mode == WK_QARGS_BOOT ? "server=off" : "server=on,wait=off");
    add(&b, "-mon");
    add(&b, "chardev=qmp,mode=control");
    add(&b, "-drive");
    add(&b, "if=none,id=root,file=%s,format=qcow2,cache=unsafe,discard=unmap", disk);
    add(&b, "-device");
    add(&b, "virtio-blk-device,drive=root");
    add(&b, "-netdev");
    add(&b, "tap,id=net0,fd=%d,vhost=off", WK_QEMU_TAP_FD);
    add(&b, "-device");
    add(&b, "virtio-net-device,netdev=net0,mac=02:5f:00:00:00:01");
    if (mode == WK_QARGS_BOOT) {
        add(&b, "-kernel");
        add(&b, "%s/vmlinuz", t->guest);
        add(&b, "-initrd");
        add(&b, "%s/initrd.img", t->guest);
        add(&b, "-append");
        add(&b, "%s", t->append);
    } else {
        add(&b, "-incoming");
        add(&b, "defer");
    }
    if (b.oom) {
        wk_qargs_free(b.v);
        return NULL;
    }
    return b.v;
}
