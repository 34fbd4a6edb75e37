/* The egress files of a jail: its trust store with the egress proxy's CA and its
 * resolver, written into the sandbox's writable layer before the jail starts (the layer
 * is on the sandbox's fresh disk: nothing of the sandbox is in it yet, and the overlay is
 * not mounted, so writing under it is allowed).
 *
 *   upper/etc/resolv.conf                          nameserver 127.0.0.1 (the proxy's
 *                                                  resolver listens in the namespace)
 *   upper/etc/ssl/certs/ca-certificates.crt        the template's own CAs + the egress CA
 *   upper/etc/ssl/certs/sandfleet-ca-bundle.pem    the same bundle (SSL_CERT_FILE & co.)
 *
 * Directories take the mode of the template's (0755 where it has none); they and the
 * files (0644) belong to the sandbox's root (an overlay in a user namespace refuses
 * upper-layer entries of ids the namespace does not map), so it may change them like any
 * file of its own: what the proxy enforces does not depend on them. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jail_int.h"

#define TRUST_TEMPLATE_MAX (8u << 20) /* the template's own bundle: ~220 KiB on Debian */
#define TRUST_PEM_MAX (64u << 10)

static const char resolv_conf[] = "# sandfleet: the secret-proxy answers DNS inside this sandbox\n"
                                  "nameserver 127.0.0.1\noptions timeout:2 attempts:2\n";

/* Opens (creating it with the mode of the template's directory at lower_path) dir under
 * parent, owned by uid. */
static int subdir(int parent, const char *name, const char *lower_path, uid_t uid)
{
    struct stat st;
    mode_t mode = 0755;
    gid_t gid = uid;
    int fd;

    if (stat(lower_path, &st) == 0 && S_ISDIR(st.st_mode))
        mode = st.st_mode & 07777;
    if (mkdirat(parent, name, 0700) < 0 && errno != EEXIST)
        return -errno;
    if ((fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0)
        return -errno;
    if (fchown(fd, uid, gid) < 0 || fchmod(fd, mode) < 0) {
        int rc = -errno;
        close(fd);
        return rc;
    }
    return fd;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w < 0 ? -errno : -EIO;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Writes name under dir (a new file of uid, 0644): a, then b. */
static int put_file(int dir, const char *name, uid_t uid, const char *a, size_t alen,
                    const char *b, size_t blen)
{
    int fd, rc;

    if (unlinkat(dir, name, 0) < 0 && errno != ENOENT)
        return -errno;
    if ((fd = openat(dir, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644)) < 0)
        return -errno;
    rc = write_all(fd, a, alen);
    if (rc == 0 && blen)
        rc = write_all(fd, b, blen);
    if (rc == 0 && (fchown(fd, uid, uid) < 0 || fchmod(fd, 0644) < 0))
        rc = -errno;
    if (close(fd) < 0 && rc == 0)
        rc = -errno;
    return rc;
}

/* The template's own bundle (malloc'd, possibly empty): at most TRUST_TEMPLATE_MAX. */
static int read_template_bundle(const char *lower, char **out, size_t *len)
{
    char path[WK_PATH_MAX];
    char *buf = NULL;
    size_t n = 0, cap = 0;
    int fd;

    *out = NULL;
    *len = 0;
    if (snprintf(path, sizeof(path), "%s/etc/ssl/certs/ca-certificates.crt", lower) >=
        (int)sizeof(path))
        return -ENAMETOOLONG;
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return errno == ENOENT ? 0 : -errno;
    for (;;) {
        ssize_t r;
        if (n == cap) {
            char *nb;
            if (cap >= TRUST_TEMPLATE_MAX) {
                free(buf);
                close(fd);
                return -EFBIG;
            }
            cap = cap ? cap * 2 : 64 * 1024;
            if (!(nb = realloc(buf, cap))) {
                free(buf);
                close(fd);
                return -ENOMEM;
            }
            buf = nb;
        }
        r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int rc = -errno;
            free(buf);
            close(fd);
            return rc;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    /* each bundle ends its last certificate with a newline before the next one starts */
    if (n > 0 && buf[n - 1] != '\n') {
        if (n == cap) {
            char *nb = realloc(buf, cap + 1);
            if (!nb) {
                free(buf);
                return -ENOMEM;
            }
            buf = nb;
        }
        buf[n++] = '\n';
    }
    *out = buf;
    *len = n;
    return 0;
}

int wk_trust_write(const char *lower, const char *upper, uint32_t uid, const char *pem,
                   const char **why)
{
    char lp[WK_PATH_MAX];
    char *tpl = NULL;
    size_t tpl_len = 0, pem_len = pem ? strlen(pem) : 0;
    int up = -1, etc = -1, ssl = -1, certs = -1, rc;

    *why = "Cannot write the sandbox's trust store and resolver into its disk; check the "
           "worker's state_dir.";
    if (!pem || pem_len == 0 || pem_len > TRUST_PEM_MAX) {
        *why = "The egress CA certificate is empty or larger than 64 KiB; check the "
               "secret-proxy's proxy_ca_cert_file.";
        return -EINVAL;
    }
    if ((rc = read_template_bundle(lower, &tpl, &tpl_len)) < 0) {
        *why = "Cannot read the template's CA bundle (etc/ssl/certs/ca-certificates.crt).";
        return rc;
    }
    if ((up = open(upper, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0) {
        rc = -errno;
        goto out;
    }
    snprintf(lp, sizeof(lp), "%s/etc", lower);
    if ((rc = etc = subdir(up, "etc", lp, uid)) < 0)
        goto out;
    snprintf(lp, sizeof(lp), "%s/etc/ssl", lower);
    if ((rc = ssl = subdir(etc, "ssl", lp, uid)) < 0)
        goto out;
    snprintf(lp, sizeof(lp), "%s/etc/ssl/certs", lower);
    if ((rc = certs = subdir(ssl, "certs", lp, uid)) < 0)
        goto out;
    if ((rc = put_file(etc, "resolv.conf", uid, resolv_conf, sizeof(resolv_conf) - 1, NULL,
                       0)) < 0 ||
        (rc = put_file(certs, "ca-certificates.crt", uid, tpl ? tpl : "", tpl_len, pem,
                       pem_len)) < 0 ||
        (rc = put_file(certs, WK_TRUST_BUNDLE, uid, tpl ? tpl : "", tpl_len, pem, pem_len)) < 0)
        goto out;
    rc = 0;
    *why = NULL;
out:
    free(tpl);
    if (certs >= 0)
        close(certs);
    if (ssl >= 0)
        close(ssl);
    if (etc >= 0)
        close(etc);
    if (up >= 0)
        close(up);
    return rc;
}
