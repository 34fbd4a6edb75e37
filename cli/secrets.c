/* sandfleet secrets create|list|rotate|delete: values come from standard input, are sealed
 * with the master key (SF_SECRETS_KEY_FILE) and never printed. */
#include "secrets.h"
#include "sf_redis.h"
#include "sf_secrets.h"
#include "sf_util.h"

#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage[] =
    "usage: sandfleet secrets create --team TEAM --name NAME --allowed-host HOST\n"
    "                                [--allowed-host HOST...] [--header NAME [--format 'Bearer {}']\n"
    "                                | --any-header] [--allow-http]\n"
    "       sandfleet secrets rotate --team TEAM --name NAME [--allowed-host HOST...]\n"
    "       sandfleet secrets list [--team TEAM]\n"
    "       sandfleet secrets delete --team TEAM --name NAME\n"
    "create and rotate read the value from standard input (one trailing newline is dropped).\n"
    "HOST: api.example.com, *.example.com (subdomains) or an IPv4 address.\n"
    "The value is swapped into the Authorization header (or --header NAME; --any-header: any\n"
    "header) of HTTPS requests only (--allow-http: plain HTTP too).\n"
    "environment: SF_REDIS_URL, SF_SECRETS_KEY_FILE (default /var/lib/sandfleet/secrets.key)\n";

static const char *env_or(const char *name, const char *def)
{
    const char *v = getenv(name);
    return v && *v ? v : def;
}

typedef struct opts {
    const char *team, *name, *header, *format;
    int any_header, allow_http;
    const char *hosts[SF_SECRET_HOSTS_MAX];
    size_t hosts_n;
} opts;

static int parse(int argc, char **argv, opts *o)
{
    memset(o, 0, sizeof(*o));
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--any-header")) {
            o->any_header = 1;
            continue;
        }
        if (!strcmp(a, "--allow-http")) {
            o->allow_http = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "sandfleet: %s needs a value.\n%s", a, usage);
            return -EINVAL;
        }
        if (!strcmp(a, "--team"))
            o->team = v;
        else if (!strcmp(a, "--name"))
            o->name = v;
        else if (!strcmp(a, "--header"))
            o->header = v;
        else if (!strcmp(a, "--format"))
            o->format = v;
        else if (!strcmp(a, "--allowed-host")) {
            if (o->hosts_n == SF_SECRET_HOSTS_MAX) {
                fprintf(stderr, "sandfleet: at most %d --allowed-host per secret.\n",
                        SF_SECRET_HOSTS_MAX);
                return -EINVAL;
            }
            o->hosts[o->hosts_n++] = v;
        } else {
            fprintf(stderr, "sandfleet: unknown option %s.\n%s", a, usage);
            return -EINVAL;
        }
        i++;
    }
    return 0;
}

static int need_team_name(const opts *o)
{
    if (!o->team || !sf_id_valid(o->team) || !o->name || !sf_secret_name_valid(o->name)) {
        fprintf(stderr, "sandfleet: --team TEAM ([a-z0-9_-]) and --name NAME ([A-Za-z0-9_-]), "
                        "at most 63 characters each, are required.\n");
        return -EINVAL;
    }
    return 0;
}

/* Reads the value from stdin into sodium-locked memory; drops one trailing newline. */
static int read_value(uint8_t **out, size_t *n)
{
    size_t cap = SF_SECRET_VALUE_MAX + 2, len = 0;
    uint8_t *buf = sodium_malloc(cap);
    ssize_t r;
    char why[256];

    if (!buf)
        return -ENOMEM;
    if (isatty(STDIN_FILENO))
        fprintf(stderr, "secret value (then Ctrl-D): ");
    while (len < cap && (r = read(STDIN_FILENO, buf + len, cap - len)) != 0) {
        if (r < 0) {
            if (errno == EINTR)
                continue;
            sodium_free(buf);
            fprintf(stderr, "sandfleet: cannot read the value from standard input.\n");
            return -EIO;
        }
        len += (size_t)r;
    }
    if (len && buf[len - 1] == '\n')
        len--;
    if (len && buf[len - 1] == '\r')
        len--;
    if (sf_secret_value_check(buf, len, why, sizeof(why)) < 0) {
        sodium_free(buf);
        fprintf(stderr, "sandfleet: %s\n", why);
        return -EINVAL;
    }
    *out = buf;
    *n = len;
    return 0;
}

static int build_meta(const opts *o, sf_secret *m)
{
    char norm[SF_SECRET_HOST_MAX + 1], why[256];

    sf_secret_init(m);
    snprintf(m->team, sizeof(m->team), "%s", o->team);
    snprintf(m->name, sizeof(m->name), "%s", o->name);
    snprintf(m->header, sizeof(m->header), "%s", o->header ? o->header : "");
    snprintf(m->format, sizeof(m->format), "%s", o->format ? o->format : "");
    m->any_header = o->any_header;
    m->allow_http = o->allow_http;
    for (size_t i = 0; i < o->hosts_n; i++) {
        if (sf_secret_host_norm(o->hosts[i], norm, why, sizeof(why)) < 0) {
            fprintf(stderr, "sandfleet: %s\n", why);
            sf_secret_fini(m);
            return -EINVAL;
        }
        if (!(m->hosts[m->hosts_n] = strdup(norm))) {
            sf_secret_fini(m);
            return -ENOMEM;
        }
        m->hosts_n++;
    }
    return 0;
}

static int create_or_rotate(redisContext *rc, const opts *o, int create)
{
    uint8_t key[SF_SECRET_KEY_BYTES], *value = NULL;
    size_t n = 0;
    char why[512];
    sf_secret m;
    int ret;

    if (need_team_name(o) < 0 || build_meta(o, &m) < 0)
        return 2;
    if (sf_secrets_key_load(env_or("SF_SECRETS_KEY_FILE", "/var/lib/sandfleet/secrets.key"),
                            key, why, sizeof(why)) < 0) {
        fprintf(stderr, "sandfleet: %s\n", why);
        sf_secret_fini(&m);
        return 1;
    }
    if (read_value(&value, &n) < 0) {
        sodium_memzero(key, sizeof(key));
        sf_secret_fini(&m);
        return 1;
    }
    ret = create ? sf_secrets_create(rc, key, &m, value, n, why, sizeof(why))
                 : sf_secrets_rotate(rc, key, &m, value, n, why, sizeof(why));
    sodium_memzero(key, sizeof(key));
    sodium_free(value);
    if (ret < 0)
        fprintf(stderr, "sandfleet: %s\n", why);
    else
        printf("%s secret %s for team %s\n", create ? "created" : "rotated", m.name, m.team);
    sf_secret_fini(&m);
    return ret < 0 ? 1 : 0;
}

static void print_team(const char *team, json_t *arr)
{
    size_t i;
    json_t *s;

    json_array_foreach(arr, i, s) {
        char *hosts = json_dumps(json_object_get(s, "allowed_hosts"), JSON_COMPACT);
        const char *h = json_string_value(json_object_get(s, "header"));
        printf("%-16s %-24s %-8lld %-16s %s\n", team,
               json_string_value(json_object_get(s, "name")),
               (long long)json_integer_value(json_object_get(s, "version")),
               h && *h ? h : json_is_true(json_object_get(s, "any_header")) ? "(any)"
                                                                            : "Authorization",
               hosts ? hosts : "[]");
        free(hosts);
    }
}

static int list(redisContext *rc, const opts *o)
{
    char why[512];
    json_t *teams = NULL, *arr, *t;
    size_t i;

    if (o->team) {
        teams = json_array();
        json_array_append_new(teams, json_string(o->team));
    } else if (sf_secrets_teams(rc, &teams, why, sizeof(why)) < 0) {
        fprintf(stderr, "sandfleet: %s\n", why);
        return 1;
    }
    printf("%-16s %-24s %-8s %-16s %s\n", "TEAM", "NAME", "VERSION", "HEADER", "ALLOWED_HOSTS");
    json_array_foreach(teams, i, t) {
        if (sf_secrets_list(rc, json_string_value(t), &arr, why, sizeof(why)) < 0) {
            fprintf(stderr, "sandfleet: %s\n", why);
            json_decref(teams);
            return 1;
        }
        print_team(json_string_value(t), arr);
        json_decref(arr);
    }
    json_decref(teams);
    return 0;
}

int cli_secrets(int argc, char **argv)
{
    char why[512];
    redisContext *rc;
    opts o;
    int ret;

    if (argc < 2 || parse(argc - 2, argv + 2, &o) < 0) {
        fputs(usage, stderr);
        return 2;
    }
    if (strcmp(argv[1], "create") && strcmp(argv[1], "rotate") && strcmp(argv[1], "list") &&
        strcmp(argv[1], "delete")) {
        fputs(usage, stderr);
        return 2;
    }
    if (!(rc = sf_redis_connect_sync(env_or("SF_REDIS_URL", "redis://127.0.0.1:6379"), why,
                                     sizeof(why)))) {
        fprintf(stderr, "sandfleet: %s\n", why);
        return 1;
    }
    if (!strcmp(argv[1], "create") || !strcmp(argv[1], "rotate")) {
        ret = create_or_rotate(rc, &o, !strcmp(argv[1], "create"));
    } else if (!strcmp(argv[1], "list")) {
        ret = list(rc, &o);
    } else if (need_team_name(&o) < 0) {
        ret = 2;
    } else if (sf_secrets_delete(rc, o.team, o.name, why, sizeof(why)) < 0) {
        fprintf(stderr, "sandfleet: %s\n", why);
        ret = 1;
    } else {
        printf("deleted secret %s of team %s\n", o.name, o.team);
        ret = 0;
    }
    sf_redis_sync_free(rc);
    return ret;
}
