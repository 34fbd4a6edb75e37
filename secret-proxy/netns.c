#include "netns.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static const char script[] =
    "set -e\n"
    "ip link set lo up\n"
    "ip link add sf0 type veth peer name sf1\n"
    "ip addr add 169.254.77.2/30 dev sf0\n"
    "ip link set sf1 up\n"
    "ip link set sf0 up\n"
    "ip route add default dev sf0\n"
    "nft -f - <<'NFT'\n"
    "table ip sandfleet {\n"
    "  chain out_nat {\n"
    "    type nat hook output priority -100; policy accept;\n"
    "    oifname \"lo\" return\n"
    "    meta mark " SP_NETNS_PREVIEW_MARK " ip daddr " SP_NETNS_PREVIEW_GUEST
    " tcp dport " SP_NETNS_PREVIEW_PORT " return\n"
    "    fib daddr type local return\n"
    "    udp dport 53 redirect to :%d\n"
    "    meta l4proto tcp redirect to :%d\n"
    "  }\n"
    "  chain pre_nat {\n"
    "    type nat hook prerouting priority -100; policy accept;\n"
    "    iifname \"lo\" return\n"
    "    fib daddr type local tcp dport %d return\n"
    "    udp dport 53 redirect to :%d\n"
    "    meta l4proto tcp redirect to :%d\n"
    "  }\n"
    "  chain out_filter {\n"
    "    type filter hook output priority 0; policy drop;\n"
    "    oifname \"lo\" accept\n"
    "    meta mark " SP_NETNS_PREVIEW_MARK " ip daddr " SP_NETNS_PREVIEW_GUEST
    " tcp dport " SP_NETNS_PREVIEW_PORT " accept\n"
    "    ct status dnat accept\n"
    "    ct state established,related accept\n"
    "  }\n"
    "  chain in_filter {\n"
    "    type filter hook input priority 0; policy drop;\n"
    "    iifname \"lo\" accept\n"
    "    ct status dnat accept\n"
    "    ct state established,related accept\n"
    "    tcp dport %d accept\n"
    "    udp dport %d accept\n"
    "  }\n"
    "  chain fw_drop {\n"
    "    type filter hook forward priority 0; policy drop;\n"
    "  }\n"
    "}\n"
    "table ip6 sandfleet6 {\n"
    "  chain out6 { type filter hook output priority 0; policy drop; oifname \"lo\" accept; }\n"
    "  chain in6 { type filter hook input priority 0; policy drop; iifname \"lo\" accept; }\n"
    "  chain fw6 { type filter hook forward priority 0; policy drop; }\n"
    "}\n"
    "NFT\n";

int sp_netns_setup(int netns_fd, const sp_netns_opts *o, char *why, size_t whylen)
{
    char sh[4096], err[512];
    int errp[2], status = 0;
    ssize_t n = 0, r;
    pid_t pid;
    int http = o->http_port > 0 ? o->http_port : 3128;

    if (snprintf(sh, sizeof(sh), script, o->dns_port, o->transparent_port, http, o->dns_port,
                 o->transparent_port, http, o->dns_port) >= (int)sizeof(sh))
        return -E2BIG;
    if (pipe2(errp, O_CLOEXEC) < 0)
        return -errno;
    if ((pid = fork()) < 0) {
        close(errp[0]);
        close(errp[1]);
        return -errno;
    }
    if (pid == 0) {
        int fd;
        dup2(errp[1], 2);
        if (setns(netns_fd, CLONE_NEWNET) < 0) {
            static const char m[] = "cannot enter the network namespace\n";
            (void)!write(2, m, sizeof(m) - 1);
            _exit(1);
        }
        /* /proc/sys/net belongs to the namespace of whoever opens it: this one now */
        if ((fd = open("/proc/sys/net/ipv6/conf/all/disable_ipv6", O_WRONLY)) >= 0) {
            (void)!write(fd, "1\n", 2);
            close(fd);
        }
        if ((fd = open("/proc/sys/net/ipv6/conf/default/disable_ipv6", O_WRONLY)) >= 0) {
            (void)!write(fd, "1\n", 2);
            close(fd);
        }
        execl("/bin/sh", "sh", "-c", sh, (char *)NULL);
        _exit(127);
    }
    close(errp[1]);
    while (n < (ssize_t)sizeof(err) - 1 && (r = read(errp[0], err + n, sizeof(err) - 1 - n)) > 0)
        n += r;
    err[n > 0 ? n : 0] = '\0';
    close(errp[0]);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        while (n > 0 && (err[n - 1] == '\n' || err[n - 1] == ' '))
            err[--n] = '\0';
        snprintf(why, whylen, "Setting up the sandbox's network namespace failed (%s); the "
                 "host needs iproute2, nftables and the veth and nf_tables kernel modules.",
                 n ? err : "no message");
        return -EIO;
    }
    return 0;
}

static int mkdirs(const char *path)
{
    char p[4096];
    size_t n = strlen(path);

    if (n >= sizeof(p))
        return -ENAMETOOLONG;
    memcpy(p, path, n + 1);
    for (size_t i = 1; i <= n; i++)
        if (p[i] == '/' || p[i] == '\0') {
            char c = p[i];
            p[i] = '\0';
            if (mkdir(p, 0755) < 0 && errno != EEXIST)
                return -errno;
            p[i] = c;
        }
    return 0;
}

static int copy_into(FILE *out, const char *path)
{
    char buf[8192];
    size_t n;
    FILE *in = fopen(path, "r");

    if (!in)
        return -errno;
    while ((n = fread(buf, 1, sizeof(buf), in)) > 0)
        if (fwrite(buf, 1, n, out) != n) {
            fclose(in);
            return -EIO;
        }
    fclose(in);
    return 0;
}

int sp_netns_write_files(const char *etc_dir, const char *ca_file, char *why, size_t whylen)
{
    char path[4096];
    FILE *f;
    int rc;

    snprintf(path, sizeof(path), "%s/ssl/certs", etc_dir);
    if ((rc = mkdirs(path)) < 0)
        goto fail;
    snprintf(path, sizeof(path), "%s/resolv.conf", etc_dir);
    if (!(f = fopen(path, "w"))) {
        rc = -errno;
        goto fail;
    }
    fputs("# sandfleet: the secret-proxy answers DNS inside this sandbox\n"
          "nameserver 127.0.0.1\noptions timeout:2 attempts:2\n", f);
    if (fclose(f) != 0) {
        rc = -EIO;
        goto fail;
    }
    snprintf(path, sizeof(path), "%s/ssl/certs/%s", etc_dir, SP_NETNS_BUNDLE);
    if (!(f = fopen(path, "w"))) {
        rc = -errno;
        goto fail;
    }
    copy_into(f, "/etc/ssl/certs/ca-certificates.crt"); /* absent on minimal hosts: fine */
    rc = copy_into(f, ca_file);
    if (fclose(f) != 0 && rc == 0)
        rc = -EIO;
    if (rc < 0)
        goto fail;
    return 0;
fail:
    snprintf(why, whylen, "Cannot write the sandbox's resolver and CA files under %s: %s.",
             etc_dir, strerror(-rc));
    return rc;
}

json_t *sp_netns_ca_env(void)
{
    const char *p = "/etc/ssl/certs/" SP_NETNS_BUNDLE;

    return json_pack("{s:s, s:s, s:s, s:s, s:s}", "SSL_CERT_FILE", p, "REQUESTS_CA_BUNDLE", p,
                     "CURL_CA_BUNDLE", p, "NODE_EXTRA_CA_CERTS", p, "GIT_SSL_CAINFO", p);
}
