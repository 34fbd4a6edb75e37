/* The jail's seccomp filter: allow by default, EPERM for syscalls a sandbox
 * has no business making (kernel/module/key/bpf/perf/mount/namespace entry and
 * tracing interfaces), and sockets only of the families a sandbox needs: AF_UNIX,
 * AF_INET, AF_INET6 and AF_NETLINK with NETLINK_ROUTE; any other family (AF_VSOCK
 * shares the host's port space, AF_PACKET and AF_XDP see raw frames...) fails with
 * EAFNOSUPPORT, as if the kernel lacked it. Compiled once with libseccomp and exported as raw BPF,
 * so the freshly cloned jail child can install it with a bare syscall (no
 * allocation after clone in a multi-threaded worker). */
#include <errno.h>
#include <fcntl.h>
#include <linux/netlink.h>
#include <linux/sched.h>
#include <seccomp.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "jail_int.h"

static const char *const denied[] = {
    /* mounts and namespaces (setup is done before the filter is installed) */
    "mount", "umount2", "pivot_root", "setns", "fsopen", "fsconfig", "fsmount", "fspick",
    "move_mount", "open_tree", "mount_setattr",
    /* kernel, modules, boot */
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot",
    "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "syslog", "iopl", "ioperm",
    "uselib", "vhangup", "lookup_dcookie", "settimeofday", "clock_settime", "clock_adjtime",
    "adjtimex",
    /* bpf, perf, keys */
    "bpf", "perf_event_open", "keyctl", "add_key", "request_key",
    /* file handles bypass path checks */
    "open_by_handle_at", "name_to_handle_at",
    /* other processes' memory and tracing */
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    /* kernel attack surface without a sandbox use */
    "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
};

static struct sock_fprog prog;

/* socket(domain, ...) for domain outside the allowed families, and AF_NETLINK with a
 * protocol other than NETLINK_ROUTE: EAFNOSUPPORT. The domain is an int: each family
 * below AF_MAX is matched on the low 32 bits, anything at or above AF_MAX (also
 * negative values and high bits) by one comparison. The i386 socketcall multiplexer
 * passes its arguments in memory, out of the filter's sight: ENOSYS (libc then uses
 * the direct socket call, which the rules cover). */
static int add_socket_rules(scmp_filter_ctx ctx)
{
    int rc;

    for (int fam = 0; fam < AF_MAX; fam++) {
        if (fam == AF_UNIX || fam == AF_INET || fam == AF_INET6 || fam == AF_NETLINK)
            continue;
        if ((rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), SCMP_SYS(socket), 1,
                                   SCMP_A0(SCMP_CMP_MASKED_EQ, 0xffffffffu, (scmp_datum_t)fam))) < 0)
            return rc;
    }
    if ((rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), SCMP_SYS(socket), 1,
                               SCMP_A0(SCMP_CMP_GE, AF_MAX))) < 0 ||
        (rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), SCMP_SYS(socket), 2,
                               SCMP_A0(SCMP_CMP_MASKED_EQ, 0xffffffffu, AF_NETLINK),
                               SCMP_A2(SCMP_CMP_NE, NETLINK_ROUTE))) < 0)
        return rc;
    if ((rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(socketcall), 0)) < 0 &&
        rc != -EEXIST)
        return rc;
    return 0;
}

static int build(void)
{
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    struct sock_filter *f = NULL;
    off_t size;
    int fd = -1, rc;

    if (!ctx)
        return -ENOMEM;
#ifdef __x86_64__
    /* Filter the 32-bit ABIs too rather than letting them bypass the list. */
    if ((rc = seccomp_arch_add(ctx, SCMP_ARCH_X86)) < 0 && rc != -EEXIST)
        goto out;
    if ((rc = seccomp_arch_add(ctx, SCMP_ARCH_X32)) < 0 && rc != -EEXIST)
        goto out;
#endif
    for (size_t i = 0; i < sizeof(denied) / sizeof(denied[0]); i++) {
        int nr = seccomp_syscall_resolve_name(denied[i]);
        if (nr == __NR_SCMP_ERROR)
            continue; /* unknown to this libseccomp */
        if ((rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0)) < 0)
            goto out;
    }
    /* No nested user namespaces: they would hand out fresh capabilities. */
    if ((rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(unshare), 1,
                               SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER))) < 0 ||
        (rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                               SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER))) < 0 ||
        /* clone3 passes its flags in memory, out of the filter's sight: ENOSYS
         * makes libc fall back to clone. */
        (rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0)) < 0)
        goto out;
    if ((rc = add_socket_rules(ctx)) < 0)
        goto out;
    if ((fd = memfd_create("sf-seccomp", MFD_CLOEXEC)) < 0) {
        rc = -errno;
        goto out;
    }
    if ((rc = seccomp_export_bpf(ctx, fd)) < 0)
        goto out;
    size = lseek(fd, 0, SEEK_END);
    if (size <= 0 || size % (off_t)sizeof(*f) != 0 || size > 65536 * (off_t)sizeof(*f) ||
        !(f = malloc((size_t)size))) {
        rc = -EIO;
        goto out;
    }
    if (pread(fd, f, (size_t)size, 0) != (ssize_t)size) {
        free(f);
        rc = -EIO;
        goto out;
    }
    prog.filter = f;
    prog.len = (unsigned short)(size / (off_t)sizeof(*f));
    rc = 0;
out:
    if (fd >= 0)
        close(fd);
    seccomp_release(ctx);
    return rc;
}

int wk_seccomp_prog(const struct sock_fprog **out, const char **why)
{
    int rc;

    if (!prog.filter && (rc = build()) < 0) {
        *why = "Cannot compile the sandbox seccomp filter; check the libseccomp installation.";
        return rc;
    }
    *out = &prog;
    return 0;
}
