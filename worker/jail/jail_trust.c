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
 * file of its own: what the proxy enforces does not depend on them.
 *
 * The template's layers and the sandbox's disk are trees a tenant writes (a team build, a
 * snapshot restored into upper/): every access below goes through safefs (safefs.h),
 * rooted at the layer or at upper/, so a link to /proc/self/environ, a ../.. link, a
 * directory link in etc/ssl or a FIFO in place of the bundle never reach the host. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jail_int.h"
#include "safefs.h"

#define TRUST_TEMPLATE_MAX (8u << 20) /* the template's own bundle: ~220 KiB on Debian */
#define TRUST_PEM_MAX (64u << 10)
#define TRUST_BUNDLE_REL "etc/ssl/certs/ca-certificates.crt"

static const char resolv_conf[] = "# sandfleet: the secret-proxy answers DNS inside this sandbox\n"
                                  "nameserver 127.0.0.1\noptions timeout:2 attempts:2\n";

/* The mode of the template's directory rel (0755 where it has none or it is not a
 * directory: a link there is not followed). */
static mode_t lower_mode(int lower, const char *rel)
{
    struct stat st;
    if (lower >= 0 && wk_sfs_stat(lower, rel, &st, WK_SFS_AUTO) == 0 && S_ISDIR(st.st_mode))
        return st.st_mode & 07777;
    return 0755;
}

/* Opens (creating it with mode) the directory rel of the upper root, owned by uid. A link
 * or a file there (a restored snapshot's) is refused, never followed. */
static int subdir(int up, const char *rel, mode_t mode, uid_t uid)
{
    int fd, rc;

    if ((rc = wk_sfs_mkdir(up, rel, 0700, WK_SFS_AUTO)) < 0 && rc != -EEXIST)
        return rc;
    if ((fd = wk_sfs_open(up, rel, O_RDONLY | O_DIRECTORY | O_NOFOLLOW, WK_SFS_AUTO)) < 0)
        return fd;
    if (fchown(fd, uid, uid) < 0 || fchmod(fd, mode) < 0) {
        rc = -errno;
        close(fd);
        return rc;
    }
    return fd;
}

/* Writes name under the directory fd dir (a new file of uid, 0644): a, then b. */
static int put_file(int dir, const char *name, uid_t uid, const char *a, size_t alen,
                    const char *b, size_t blen)
{
    int fd, rc;

    if ((rc = wk_sfs_unlink(dir, name, 0, WK_SFS_AUTO)) < 0 && rc != -ENOENT)
        return rc;
    if ((fd = wk_sfs_create(dir, name, 0644, 1, WK_SFS_AUTO)) < 0)
        return fd;
    rc = wk_sfs_write_all(fd, a, alen);
    if (rc == 0 && blen)
        rc = wk_sfs_write_all(fd, b, blen);
    if (rc == 0 && (fchown(fd, uid, uid) < 0 || fchmod(fd, 0644) < 0))
        rc = -errno;
    if (close(fd) < 0 && rc == 0)
        rc = -errno;
    return rc;
}

int wk_trust_has_bundle(const char *layer)
{
    struct stat st;
    int root = wk_sfs_root(layer), rc;

    if (root < 0)
        return 0;
    rc = wk_sfs_stat(root, TRUST_BUNDLE_REL, &st, WK_SFS_AUTO) == 0;
    close(root);
    return rc;
}

/* The template's own bundle (malloc'd, possibly empty): at most TRUST_TEMPLATE_MAX, read
 * inside the layer's root; absent, a link out of it, a FIFO or a device reads as none. */
static int read_template_bundle(int lower, char **out, size_t *len)
{
    char *buf = NULL, *nb;
    size_t n = 0;
    int rc;

    *out = NULL;
    *len = 0;
    if (lower < 0)
        return 0;
    rc = wk_sfs_read_file(lower, TRUST_BUNDLE_REL, TRUST_TEMPLATE_MAX, &buf, &n, WK_SFS_AUTO);
    if (rc == -EFBIG)
        return rc;
    if (rc < 0) /* absent, not a regular file, or it resolved nowhere inside the layer */
        return 0;
    /* each bundle ends its last certificate with a newline before the next one starts */
    if (n > 0 && buf[n - 1] != '\n') {
        if (!(nb = realloc(buf, n + 2))) {
            free(buf);
            return -ENOMEM;
        }
        buf = nb;
        buf[n++] = '\n';
    }
    *out = buf;
    *len = n;
    return 0;
}

int wk_trust_write(const char *lower, const char *upper, uint32_t uid, const char *pem,
                   const char **why)
{
    char *tpl = NULL;
    size_t tpl_len = 0, pem_len = pem ? strlen(pem) : 0;
    int lo = -1, up = -1, etc = -1, ssl = -1, certs = -1, rc;

    *why = "Cannot write the sandbox's trust store and resolver into its disk; check the "
           "worker's state_dir.";
    if (!pem || pem_len == 0 || pem_len > TRUST_PEM_MAX) {
        *why = "The egress CA certificate is empty or larger than 64 KiB; check the "
               "secret-proxy's proxy_ca_cert_file.";
        return -EINVAL;
    }
    lo = wk_sfs_root(lower); /* a template without a root reads as one without CAs */
    if ((rc = read_template_bundle(lo, &tpl, &tpl_len)) < 0) {
        *why = "The template's CA bundle (etc/ssl/certs/ca-certificates.crt) is larger than "
               "8 MiB; rebuild the template with a smaller one.";
        goto out;
    }
    if ((rc = up = wk_sfs_root(upper)) < 0)
        goto out;
    if ((rc = etc = subdir(up, "etc", lower_mode(lo, "etc"), uid)) < 0)
        goto out;
    if ((rc = ssl = subdir(up, "etc/ssl", lower_mode(lo, "etc/ssl"), uid)) < 0)
        goto out;
    if ((rc = certs = subdir(up, "etc/ssl/certs", lower_mode(lo, "etc/ssl/certs"), uid)) < 0)
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
    if (lo >= 0)
        close(lo);
    return rc;
}
