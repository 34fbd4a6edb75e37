/* TLS for the proxy: the per-deployment CA (created on first start, key 0600), server
 * certificates minted per host name and cached, the client context that verifies
 * upstreams, and a bounded ClientHello reader for the SNI. */
#include "proxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CERTS_MAX 1024
#define LEAF_DAYS 7
#define CACHE_MS (24LL * 3600 * 1000)

struct sp_tls {
    X509 *ca;
    EVP_PKEY *ca_key;
    EVP_PKEY *leaf_key;   /* one key for every minted certificate */
    SSL_CTX *client;
    sf_map *certs;        /* name -> cert_ent */
};

typedef struct cert_ent {
    SSL_CTX *ctx;
    int64_t expires_ms;
} cert_ent;

static int add_ext(X509 *cert, X509 *issuer, int nid, const char *value)
{
    X509V3_CTX v3;
    X509_EXTENSION *ex;
    int ok;

    X509V3_set_ctx_nodb(&v3);
    X509V3_set_ctx(&v3, issuer, cert, NULL, NULL, 0);
    if (!(ex = X509V3_EXT_conf_nid(NULL, &v3, nid, value)))
        return 0;
    ok = X509_add_ext(cert, ex, -1);
    X509_EXTENSION_free(ex);
    return ok;
}

static int rand_serial(X509 *x)
{
    unsigned char b[16];
    BIGNUM *bn;
    int ok;

    if (RAND_bytes(b, sizeof(b)) != 1)
        return 0;
    b[0] &= 0x7f;
    bn = BN_bin2bn(b, sizeof(b), NULL);
    ok = bn && BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x)) != NULL;
    BN_free(bn);
    return ok;
}

static X509 *ca_create(EVP_PKEY *key)
{
    X509 *x = X509_new();
    X509_NAME *n;
    char cn[80];
    unsigned char r[6];

    if (!x || RAND_bytes(r, sizeof(r)) != 1)
        goto fail;
    snprintf(cn, sizeof(cn), "sandfleet egress CA %02x%02x%02x%02x%02x%02x", r[0], r[1], r[2],
             r[3], r[4], r[5]);
    X509_set_version(x, 2);
    if (!rand_serial(x) || !X509_gmtime_adj(X509_getm_notBefore(x), -3600) ||
        !X509_gmtime_adj(X509_getm_notAfter(x), 10L * 365 * 24 * 3600) ||
        !X509_set_pubkey(x, key))
        goto fail;
    n = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(n, "O", MBSTRING_ASC, (const unsigned char *)"sandfleet", -1, -1, 0);
    X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1, 0);
    X509_set_issuer_name(x, n);
    if (!add_ext(x, x, NID_basic_constraints, "critical,CA:TRUE,pathlen:0") ||
        !add_ext(x, x, NID_key_usage, "critical,keyCertSign,cRLSign") ||
        !add_ext(x, x, NID_subject_key_identifier, "hash") || !X509_sign(x, key, EVP_sha256()))
        goto fail;
    return x;
fail:
    X509_free(x);
    return NULL;
}

/* Writes the new CA: key first (0600, created exclusively), then the certificate. */
static int ca_write(const char *cert_path, const char *key_path, X509 *x, EVP_PKEY *key)
{
    int fd = open(key_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    FILE *f;
    int ok;

    if (fd < 0 || !(f = fdopen(fd, "w"))) {
        if (fd >= 0)
            close(fd);
        return -EIO;
    }
    ok = PEM_write_PrivateKey(f, key, NULL, NULL, 0, NULL, NULL);
    if (fclose(f) != 0 || !ok) {
        unlink(key_path);
        return -EIO;
    }
    if (!(f = fopen(cert_path, "w"))) {
        unlink(key_path);
        return -EIO;
    }
    ok = PEM_write_X509(f, x);
    if (fclose(f) != 0 || !ok) {
        unlink(key_path);
        unlink(cert_path);
        return -EIO;
    }
    return 0;
}

static int ca_load(sp_tls *t, const sp_cfg *cfg, char *why, size_t whylen)
{
    FILE *fc = fopen(cfg->proxy_ca_cert_file, "r"), *fk = fopen(cfg->proxy_ca_key_file, "r");

    if (!fc && !fk) { /* first start: a new CA for this deployment */
        if (!(t->ca_key = EVP_EC_gen("P-256")) || !(t->ca = ca_create(t->ca_key)) ||
            ca_write(cfg->proxy_ca_cert_file, cfg->proxy_ca_key_file, t->ca, t->ca_key) < 0) {
            snprintf(why, whylen, "Cannot create the egress CA in %s and %s; check that the "
                     "folder exists and is writable.", cfg->proxy_ca_cert_file, cfg->proxy_ca_key_file);
            return -EIO;
        }
        return 0;
    }
    if (fc && fk) {
        t->ca = PEM_read_X509(fc, NULL, NULL, NULL);
        t->ca_key = PEM_read_PrivateKey(fk, NULL, NULL, NULL);
    }
    if (fc)
        fclose(fc);
    if (fk)
        fclose(fk);
    if (!t->ca || !t->ca_key || X509_check_private_key(t->ca, t->ca_key) != 1) {
        snprintf(why, whylen, "The egress CA files %s and %s are missing, unreadable or do not "
                 "match; restore both, or remove both to create a new CA.", cfg->proxy_ca_cert_file,
                 cfg->proxy_ca_key_file);
        return -EINVAL;
    }
    return 0;
}

static int alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                       const unsigned char *in, unsigned int inlen, void *arg)
{
    static const unsigned char h1[] = "\x08http/1.1";
    unsigned char *sel;

    if (SSL_select_next_proto(&sel, outlen, h1, sizeof(h1) - 1, in, inlen) !=
        OPENSSL_NPN_NEGOTIATED)
        return SSL_TLSEXT_ERR_NOACK; /* no HTTP/1.1 offered: go on without ALPN */
    *out = sel;
    return SSL_TLSEXT_ERR_OK;
}

sp_tls *sp_tls_new(const sp_cfg *cfg, char *why, size_t whylen)
{
    sp_tls *t = calloc(1, sizeof(*t));

    if (!t)
        return NULL;
    if (ca_load(t, cfg, why, whylen) < 0)
        goto fail;
    if (!(t->leaf_key = EVP_EC_gen("P-256")) || !(t->certs = sf_map_new(CERTS_MAX)) ||
        !(t->client = SSL_CTX_new(TLS_client_method()))) {
        snprintf(why, whylen, "Cannot set up TLS (out of memory).");
        goto fail;
    }
    SSL_CTX_set_min_proto_version(t->client, TLS1_2_VERSION);
    SSL_CTX_set_verify(t->client, SSL_VERIFY_PEER, NULL);
    SSL_CTX_set_alpn_protos(t->client, (const unsigned char *)"\x08http/1.1", 9);
    if ((cfg->proxy_upstream_ca_file && *cfg->proxy_upstream_ca_file)
            ? SSL_CTX_load_verify_locations(t->client, cfg->proxy_upstream_ca_file, NULL) != 1
            : SSL_CTX_set_default_verify_paths(t->client) != 1) {
        snprintf(why, whylen, "Cannot load the upstream trust store %s; set upstream_ca_file "
                 "to a PEM bundle or leave it empty for the system's.", cfg->proxy_upstream_ca_file);
        goto fail;
    }
    return t;
fail:
    sp_tls_free(t);
    return NULL;
}

static void free_cert(const char *key, void *val, void *arg)
{
    cert_ent *e = val;
    SSL_CTX_free(e->ctx);
    free(e);
}

void sp_tls_free(sp_tls *t)
{
    if (!t)
        return;
    if (t->certs) {
        sf_map_foreach(t->certs, free_cert, NULL);
        sf_map_free(t->certs);
    }
    SSL_CTX_free(t->client);
    EVP_PKEY_free(t->leaf_key);
    EVP_PKEY_free(t->ca_key);
    X509_free(t->ca);
    free(t);
}

static SSL_CTX *mint(sp_tls *t, const char *name)
{
    X509 *x = X509_new();
    SSL_CTX *ctx = NULL;
    char san[SP_NAME_MAX + 8], cn[65];
    struct in_addr a;

    if (!x)
        return NULL;
    snprintf(cn, sizeof(cn), "%s", name);
    snprintf(san, sizeof(san), "%s:%s", inet_pton(AF_INET, name, &a) == 1 ? "IP" : "DNS", name);
    X509_set_version(x, 2);
    if (!rand_serial(x) || !X509_gmtime_adj(X509_getm_notBefore(x), -3600) ||
        !X509_gmtime_adj(X509_getm_notAfter(x), LEAF_DAYS * 24L * 3600) ||
        !X509_set_pubkey(x, t->leaf_key) ||
        !X509_NAME_add_entry_by_txt(X509_get_subject_name(x), "CN", MBSTRING_ASC,
                                    (const unsigned char *)cn, -1, -1, 0) ||
        !X509_set_issuer_name(x, X509_get_subject_name(t->ca)) ||
        !add_ext(x, t->ca, NID_subject_alt_name, san) ||
        !add_ext(x, t->ca, NID_basic_constraints, "critical,CA:FALSE") ||
        !add_ext(x, t->ca, NID_key_usage, "critical,digitalSignature") ||
        !add_ext(x, t->ca, NID_ext_key_usage, "serverAuth") ||
        !add_ext(x, t->ca, NID_authority_key_identifier, "keyid:always") ||
        !X509_sign(x, t->ca_key, EVP_sha256()))
        goto out;
    if (!(ctx = SSL_CTX_new(TLS_server_method())))
        goto out;
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_alpn_select_cb(ctx, alpn_select, NULL);
    if (SSL_CTX_use_certificate(ctx, x) != 1 || SSL_CTX_use_PrivateKey(ctx, t->leaf_key) != 1 ||
        SSL_CTX_add1_chain_cert(ctx, t->ca) != 1) {
        SSL_CTX_free(ctx);
        ctx = NULL;
    }
out:
    X509_free(x);
    return ctx;
}

SSL *sp_tls_server(sp_tls *t, const char *name)
{
    cert_ent *e = sf_map_get(t->certs, name);

    if (e && e->expires_ms < sf_mono_ms()) {
        sf_map_del(t->certs, name);
        free_cert(name, e, NULL);
        e = NULL;
    }
    if (!e) {
        if (sf_map_len(t->certs) >= CERTS_MAX) { /* full: start over */
            sf_map_foreach(t->certs, free_cert, NULL);
            sf_map_free(t->certs);
            if (!(t->certs = sf_map_new(CERTS_MAX)))
                abort();
        }
        if (!(e = calloc(1, sizeof(*e))) || !(e->ctx = mint(t, name)) ||
            sf_map_put(t->certs, name, e) < 0) {
            if (e)
                SSL_CTX_free(e->ctx);
            free(e);
            return NULL;
        }
        e->expires_ms = sf_mono_ms() + CACHE_MS;
    }
    return SSL_new(e->ctx);
}

SSL *sp_tls_client(sp_tls *t, const char *name)
{
    SSL *ssl = SSL_new(t->client);
    struct in_addr a;

    if (!ssl)
        return NULL;
    if (inet_pton(AF_INET, name, &a) == 1) {
        X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name);
    } else if (SSL_set_tlsext_host_name(ssl, name) != 1 || SSL_set1_host(ssl, name) != 1) {
        SSL_free(ssl);
        return NULL;
    }
    return ssl;
}

/* ClientHello: record(5) handshake(4) version(2) random(32) session_id(1+n)
 * cipher_suites(2+n) compression(1+n) extensions(2+n): type(2) len(2) data. */
int sp_tls_sni(const uint8_t *p, size_t n, char name[SP_NAME_MAX])
{
    size_t rec, hs, off, end, l;

    name[0] = '\0';
    if (n < 5)
        return -EAGAIN;
    if (p[0] != 0x16 || p[1] != 0x03)
        return -EINVAL;
    rec = (size_t)p[3] << 8 | p[4];
    if (rec < 4 || rec > 16384)
        return -EINVAL;
    if (n < 5 + rec)
        return -EAGAIN;
    if (p[5] != 0x01)
        return -EINVAL; /* not a ClientHello */
    hs = (size_t)p[6] << 16 | (size_t)p[7] << 8 | p[8];
    if (hs > rec - 4)
        return -EINVAL; /* spans records: not handled, judged by address */
    end = 9 + hs;
    off = 9 + 2 + 32;
    if (off + 1 > end)
        return -EINVAL;
    off += 1 + p[off];
    if (off + 2 > end)
        return -EINVAL;
    off += 2 + ((size_t)p[off] << 8 | p[off + 1]);
    if (off + 1 > end)
        return -EINVAL;
    off += 1 + p[off];
    if (off == end)
        return 0; /* no extensions */
    if (off + 2 > end)
        return -EINVAL;
    l = (size_t)p[off] << 8 | p[off + 1];
    off += 2;
    if (off + l > end)
        return -EINVAL;
    end = off + l;
    while (off + 4 <= end) {
        size_t type = (size_t)p[off] << 8 | p[off + 1], el = (size_t)p[off + 2] << 8 | p[off + 3];
        off += 4;
        if (off + el > end)
            return -EINVAL;
        if (type == 0) { /* server_name: list(2) type(1) len(2) name */
            size_t nl;
            if (el < 5 || p[off + 2] != 0)
                return -EINVAL;
            nl = (size_t)p[off + 3] << 8 | p[off + 4];
            if (nl == 0 || nl + 5 > el || nl >= SP_NAME_MAX)
                return -EINVAL;
            for (size_t i = 0; i < nl; i++) {
                unsigned char ch = p[off + 5 + i];
                if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                      (ch >= '0' && ch <= '9') || ch == '-' || ch == '.' || ch == '_'))
                    return -EINVAL;
                name[i] = (char)(ch >= 'A' && ch <= 'Z' ? ch + 32 : ch);
            }
            name[nl] = '\0';
            if (nl > 1 && name[nl - 1] == '.')
                name[nl - 1] = '\0';
            return 0;
        }
        off += el;
    }
    return off == end ? 0 : -EINVAL;
}
