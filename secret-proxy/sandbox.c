/* The registry of sandboxes this proxy serves: register (listeners opened inside the
 * sandbox's netns, rules, secret bindings with fresh placeholders), update (rules and
 * bindings; a dropped binding's placeholder is worthless at once), unregister. Secret
 * values are read from Redis and opened with the master key when a binding is made, and
 * re-read every secret_refresh_ms (rotation, deletion). */
#include "netns.h"
#include "proxy.h"
#include "sf_log.h"
#include "sf_msg.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct want {
    char env[64];
    char secret[SF_SECRET_NAME_MAX];
    char placeholder[SF_PLACEHOLDER_LEN + 1];
    sf_secret sec;
    int found;
} want;

/* One register/update waiting for its secrets. */
typedef struct op {
    sp_ctx *ctx;
    int is_register;
    char sandbox[64], team[64], owner[64];
    sp_rules *rules;           /* new rules (NULL: keep) */
    json_t *allow, *deny;      /* their JSON, kept for later partial updates */
    int set_bindings;          /* bindings given */
    want *w;
    size_t w_n;
    int pending;
    int failed;                /* Redis unreachable */
    int netns_fd;
    sp_done_cb done;
    void *arg;
} op;

static json_t *err_reply(const char *fmt, const char *a)
{
    char msg[512];

    snprintf(msg, sizeof(msg), fmt, a ? a : "");
    return json_pack("{s:b, s:s}", "ok", 0, "error", msg);
}

static void answer(sp_done_cb done, void *arg, json_t *reply)
{
    done(arg, reply);
    json_decref(reply);
}

sp_sandbox *sp_sandbox_ref(sp_sandbox *sb)
{
    sb->refs++;
    return sb;
}

static void bindings_free(sp_binding *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        sf_secret_fini(&b[i].sec);
        sodium_memzero(b[i].placeholder, sizeof(b[i].placeholder));
    }
    free(b);
}

void sp_sandbox_unref(sp_sandbox *sb)
{
    if (!sb || --sb->refs > 0)
        return;
    bindings_free(sb->bind, sb->bind_n);
    sp_rules_unref(sb->rules);
    sp_rcache_unref(sb->rcache);
    json_decref(sb->allow_json);
    json_decref(sb->deny_json);
    free(sb);
}

const sp_binding *sp_sandbox_binding(const sp_sandbox *sb, const char *p)
{
    for (size_t i = 0; i < sb->bind_n; i++)
        if (!memcmp(sb->bind[i].placeholder, p, SF_PLACEHOLDER_LEN))
            return &sb->bind[i];
    return NULL;
}

int sp_sandbox_has_secret_for(const sp_sandbox *sb, const char *host)
{
    for (size_t i = 0; i < sb->bind_n; i++)
        for (size_t k = 0; sb->bind[i].sec.value && k < sb->bind[i].sec.hosts_n; k++)
            if (sf_secret_host_match(sb->bind[i].sec.hosts[k], host))
                return 1;
    return 0;
}

static int env_key_ok(const char *s)
{
    size_t n = strlen(s);

    if (n == 0 || n >= 64 || (!isalpha((unsigned char)s[0]) && s[0] != '_'))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_')
            return 0;
    return 1;
}

static void op_free(op *o)
{
    if (!o)
        return;
    for (size_t i = 0; i < o->w_n; i++)
        sf_secret_fini(&o->w[i].sec);
    free(o->w);
    sp_rules_unref(o->rules);
    json_decref(o->allow);
    json_decref(o->deny);
    if (o->netns_fd >= 0)
        close(o->netns_fd);
    free(o);
}

/* ---- listeners inside the sandbox's network namespace ---- */

static int tcp_listen(int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;

    if (fd < 0)
        return -errno;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 256) < 0) {
        int e = -errno;
        close(fd);
        return e;
    }
    return fd;
}

static int udp_bind(int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;

    if (fd < 0)
        return -errno;
    /* dns.c answers from the address each query reached */
    if (setsockopt(fd, IPPROTO_IP, IP_PKTINFO, &one, sizeof(one)) < 0 ||
        bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        int e = -errno;
        close(fd);
        return e;
    }
    return fd;
}

/* Enters netns_fd, opens the three sockets, comes back. -errno with why. */
static int open_sockets(sp_ctx *ctx, int netns_fd, int fds[3], char *why, size_t whylen)
{
    int rc = 0;

    fds[0] = fds[1] = fds[2] = -1;
    if (setns(netns_fd, CLONE_NEWNET) < 0) {
        snprintf(why, whylen, "Cannot enter the sandbox's network namespace: %s.",
                 strerror(errno));
        return -errno;
    }
    if ((fds[0] = tcp_listen((int)ctx->cfg.proxy_http_port)) < 0 ||
        (fds[1] = tcp_listen((int)ctx->cfg.proxy_transparent_port)) < 0 ||
        (fds[2] = udp_bind((int)ctx->cfg.proxy_dns_port)) < 0) {
        rc = fds[0] < 0 ? fds[0] : fds[1] < 0 ? fds[1] : fds[2];
        snprintf(why, whylen, "Cannot open the proxy's listeners in the sandbox's network "
                 "namespace: %s.", strerror(-rc));
    }
    if (setns(ctx->host_netns, CLONE_NEWNET) < 0) {
        sf_error("msg=\"cannot return to the proxy's own network namespace\" err=\"%s\"",
                 strerror(errno));
        abort(); /* every later socket would be opened in the wrong namespace */
    }
    if (rc < 0)
        for (int i = 0; i < 3; i++)
            if (fds[i] >= 0)
                close(fds[i]);
    return rc;
}

static void on_accept_http(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *a,
                           int alen, void *arg)
{
    sp_conn_accept(arg, fd, 1);
}

static void on_accept_transparent(struct evconnlistener *l, evutil_socket_t fd,
                                  struct sockaddr *a, int alen, void *arg)
{
    sp_conn_accept(arg, fd, 0);
}

static json_t *placeholders_json(const sp_sandbox *sb)
{
    json_t *o = json_object();

    for (size_t i = 0; i < sb->bind_n; i++)
        json_object_set_new(o, sb->bind[i].env, json_string(sb->bind[i].placeholder));
    return o;
}

static json_t *ok_reply(const sp_sandbox *sb)
{
    const sp_cfg *c = &sb->ctx->cfg;
    char url[64];
    json_t *env = json_object();

    snprintf(url, sizeof(url), "http://" SP_NETNS_PROXY_ADDR ":%d", (int)c->proxy_http_port);
    json_object_set_new(env, "HTTP_PROXY", json_string(url));
    json_object_set_new(env, "HTTPS_PROXY", json_string(url));
    json_object_set_new(env, "http_proxy", json_string(url));
    json_object_set_new(env, "https_proxy", json_string(url));
    json_object_set_new(env, "NO_PROXY", json_string("localhost,127.0.0.1"));
    json_object_set_new(env, "no_proxy", json_string("localhost,127.0.0.1"));
    return json_pack("{s:b, s:o, s:o, s:s, s:s}", "ok", 1, "placeholders",
                     placeholders_json(sb), "env", env, "ca_file", c->proxy_ca_cert_file,
                     "instance", sb->ctx->instance);
}

/* Moves o's wanted bindings into sb (placeholders kept for unchanged env -> secret). */
static int apply_bindings(sp_sandbox *sb, op *o)
{
    sp_binding *nb = calloc(o->w_n + 1, sizeof(*nb));

    if (!nb)
        return -ENOMEM;
    for (size_t i = 0; i < o->w_n; i++) {
        want *w = &o->w[i];
        snprintf(nb[i].env, sizeof(nb[i].env), "%s", w->env);
        snprintf(nb[i].secret, sizeof(nb[i].secret), "%s", w->secret);
        memcpy(nb[i].placeholder, w->placeholder, sizeof(nb[i].placeholder));
        for (size_t k = 0; !w->placeholder[0] && k < sb->bind_n; k++)
            if (!strcmp(sb->bind[k].env, w->env) && !strcmp(sb->bind[k].secret, w->secret))
                memcpy(nb[i].placeholder, sb->bind[k].placeholder, sizeof(nb[i].placeholder));
        if (!nb[i].placeholder[0] && sf_placeholder_new(nb[i].placeholder) < 0) {
            bindings_free(nb, i);
            return -EIO;
        }
        nb[i].sec = w->sec; /* moved */
        sf_secret_init(&w->sec);
    }
    bindings_free(sb->bind, sb->bind_n);
    sb->bind = nb;
    sb->bind_n = o->w_n;
    sb->gen++;
    return 0;
}

static void finish_register(op *o)
{
    sp_ctx *ctx = o->ctx;
    sp_sandbox *sb;
    int fds[3];
    char why[256];

    if (sf_map_get(ctx->sandboxes, o->sandbox)) {
        answer(o->done, o->arg, err_reply(SF_MSG_PROXY_SB_REGISTERED_FMT, o->sandbox));
        return;
    }
    if ((int64_t)sf_map_len(ctx->sandboxes) >= ctx->cfg.proxy_max_sandboxes) {
        answer(o->done, o->arg, err_reply("This proxy serves max_sandboxes sandboxes already; "
                                          "raise max_sandboxes or unregister one.%s", NULL));
        return;
    }
    if (open_sockets(ctx, o->netns_fd, fds, why, sizeof(why)) < 0) {
        answer(o->done, o->arg, err_reply("%s", why));
        return;
    }
    if (!(sb = calloc(1, sizeof(*sb)))) {
        for (int i = 0; i < 3; i++)
            close(fds[i]);
        answer(o->done, o->arg, err_reply(SF_MSG_PROXY_NOMEM "%s", NULL));
        return;
    }
    sb->ctx = ctx;
    sb->refs = 1;
    sb->dns_fd = fds[2];
    snprintf(sb->id, sizeof(sb->id), "%s", o->sandbox);
    snprintf(sb->team, sizeof(sb->team), "%s", o->team);
    snprintf(sb->owner, sizeof(sb->owner), "%s", o->owner);
    sb->rules = sp_rules_ref(o->rules);
    sb->allow_json = json_incref(o->allow);
    sb->deny_json = json_incref(o->deny);
    sb->l_http = evconnlistener_new(ctx->d.base, on_accept_http, sb, LEV_OPT_CLOSE_ON_FREE, -1,
                                    fds[0]);
    sb->l_transparent = evconnlistener_new(ctx->d.base, on_accept_transparent, sb,
                                           LEV_OPT_CLOSE_ON_FREE, -1, fds[1]);
    sb->ev_dns = event_new(ctx->d.base, fds[2], EV_READ | EV_PERSIST, sp_dns_on_read, sb);
    sb->rcache = sp_rcache_new();
    if (!sb->rcache || !sb->l_http || !sb->l_transparent || !sb->ev_dns || event_add(sb->ev_dns, NULL) < 0 ||
        apply_bindings(sb, o) < 0 || sf_map_put(ctx->sandboxes, sb->id, sb) < 0) {
        if (!sb->l_http)
            close(fds[0]);
        if (!sb->l_transparent)
            close(fds[1]);
        if (sb->l_http)
            evconnlistener_free(sb->l_http);
        if (sb->l_transparent)
            evconnlistener_free(sb->l_transparent);
        if (sb->ev_dns)
            event_free(sb->ev_dns);
        close(fds[2]);
        sp_sandbox_unref(sb);
        answer(o->done, o->arg, err_reply("The proxy could not set up the sandbox's "
                                          "listeners.%s", NULL));
        return;
    }
    sf_info("msg=\"sandbox registered\" sandbox=%s team=%s secrets=%zu allow=%zu deny=%zu",
            sb->id, sb->team, sb->bind_n, sb->rules->names_n + sb->rules->allow_n,
            sb->rules->deny_n);
    answer(o->done, o->arg, ok_reply(sb));
}

static void finish_update(op *o)
{
    sp_sandbox *sb = sf_map_get(o->ctx->sandboxes, o->sandbox);

    if (!sb) {
        answer(o->done, o->arg, err_reply(SF_MSG_PROXY_SB_UNKNOWN_FMT,
                                          o->sandbox));
        return;
    }
    if (o->rules) {
        sp_rules_unref(sb->rules);
        sb->rules = sp_rules_ref(o->rules);
        json_decref(sb->allow_json);
        json_decref(sb->deny_json);
        sb->allow_json = json_incref(o->allow);
        sb->deny_json = json_incref(o->deny);
    }
    if (o->set_bindings && apply_bindings(sb, o) < 0) {
        answer(o->done, o->arg, err_reply(SF_MSG_PROXY_NOMEM "%s", NULL));
        return;
    }
    sf_info("msg=\"sandbox updated\" sandbox=%s secrets=%zu rules=%s", sb->id, sb->bind_n,
            o->rules ? "replaced" : "kept");
    answer(o->done, o->arg, ok_reply(sb));
}

static void op_finish(op *o)
{
    if (o->failed) {
        answer(o->done, o->arg, err_reply("The secrets store (Redis) is unreachable; retry "
                                          "shortly.%s", NULL));
    } else {
        for (size_t i = 0; i < o->w_n; i++)
            if (!o->w[i].found) {
                answer(o->done, o->arg, err_reply("No secret named %s for this team; see "
                                                  "secret_list.", o->w[i].secret));
                op_free(o);
                return;
            }
        if (o->is_register)
            finish_register(o);
        else
            finish_update(o);
    }
    op_free(o);
}

/* Opens one secret record's reply into sec (team checked). 1 found, 0 not. */
static int open_secret(sp_ctx *ctx, const char *team, const char *name, const redisReply *r,
                       sf_secret *sec)
{
    char *sealed = NULL;
    sf_secret s;

    if (sf_secret_from_reply(r, &s, &sealed) < 0)
        return 0;
    if (strcmp(s.team, team) || strcmp(s.name, name) ||
        sf_secret_open(ctx->master_key, team, name, sealed, &s.value, &s.value_len) < 0) {
        sf_warn("msg=\"secret does not open under the master key\" team=%s secret=%s", team,
                name);
        sf_secret_fini(&s);
        free(sealed);
        return 0;
    }
    free(sealed);
    sf_secret_fini(sec);
    *sec = s;
    return 1;
}

typedef struct fetch {
    op *o;
    size_t i;
} fetch;

static void on_secret(redisAsyncContext *ac, void *reply, void *priv)
{
    fetch *f = priv;
    op *o = f->o;

    if (!reply)
        o->failed = 1;
    else
        o->w[f->i].found = open_secret(o->ctx, o->team, o->w[f->i].secret, reply, &o->w[f->i].sec);
    free(f);
    if (--o->pending == 0)
        op_finish(o);
}

/* Reads "secrets" {ENV: name} (and "placeholders" {ENV: token}) of req into o. */
static json_t *parse_bindings(op *o, const json_t *req)
{
    json_t *secrets = json_object_get(req, "secrets"), *ph = json_object_get(req, "placeholders");
    const char *env;
    json_t *v;

    if (!secrets)
        return NULL;
    if (!json_is_object(secrets) || json_object_size(secrets) > SP_BINDINGS_MAX)
        return err_reply("secrets must be an object of at most 32 {ENV_NAME: secret_name}.%s",
                         NULL);
    o->set_bindings = 1;
    if (!(o->w = calloc(json_object_size(secrets) + 1, sizeof(*o->w))))
        return err_reply(SF_MSG_PROXY_NOMEM "%s", NULL);
    json_object_foreach(secrets, env, v) {
        want *w = &o->w[o->w_n];
        const char *name = json_string_value(v), *p = json_string_value(json_object_get(ph, env));
        if (!env_key_ok(env))
            return err_reply("Secret environment name '%.64s' must match "
                             "[A-Za-z_][A-Za-z0-9_]* (at most 63 characters).", env);
        if (!name || !sf_secret_name_valid(name))
            return err_reply("Secret name for %.64s must be [A-Za-z0-9_-], at most 63 "
                             "characters.", env);
        snprintf(w->env, sizeof(w->env), "%s", env);
        snprintf(w->secret, sizeof(w->secret), "%s", name);
        if (p && strlen(p) == SF_PLACEHOLDER_LEN && sf_placeholder_at(p, strlen(p)))
            memcpy(w->placeholder, p, SF_PLACEHOLDER_LEN + 1);
        o->w_n++;
    }
    return NULL;
}

static json_t *parse_rules(op *o, const json_t *req, const sp_sandbox *sb)
{
    json_t *allow = json_object_get(req, "allow_out"), *deny = json_object_get(req, "deny_out");
    char why[256];

    if (!allow && !deny && sb)
        return NULL; /* update: rules kept */
    o->allow = json_incref(allow ? allow : sb ? sb->allow_json : NULL);
    o->deny = json_incref(deny ? deny : sb ? sb->deny_json : NULL);
    if (sp_rules_parse(&o->ctx->policy, o->allow, o->deny, &o->rules, why, sizeof(why)) < 0)
        return err_reply("%s", why);
    return NULL;
}

static void start(sp_ctx *ctx, op *o, const json_t *req, const sp_sandbox *sb)
{
    json_t *err;
    char key[200];

    if ((err = parse_rules(o, req, sb)) || (err = parse_bindings(o, req))) {
        answer(o->done, o->arg, err);
        op_free(o);
        return;
    }
    if (o->w_n == 0) {
        op_finish(o);
        return;
    }
    o->pending = (int)o->w_n;
    for (size_t i = 0; i < o->w_n; i++) {
        fetch *f = calloc(1, sizeof(*f));
        if (f) {
            f->o = o;
            f->i = i;
            snprintf(key, sizeof(key), SF_RK_SECRET, o->team, o->w[i].secret);
        }
        if (!f || sf_redis_cmd(ctx->redis, on_secret, f, "HGETALL %s", key) < 0) {
            free(f);
            o->failed = 1;
            if (--o->pending == 0)
                op_finish(o);
        }
    }
}

static op *op_new(sp_ctx *ctx, const json_t *req, sp_done_cb done, void *arg)
{
    const char *id = json_string_value(json_object_get(req, "sandbox"));
    op *o;

    if (!id || !sf_id_valid(id)) {
        answer(done, arg, err_reply("Give the sandbox id ([a-z0-9_-], at most 63 "
                                    "characters) in 'sandbox'.%s", NULL));
        return NULL;
    }
    if (!(o = calloc(1, sizeof(*o)))) {
        answer(done, arg, err_reply(SF_MSG_PROXY_NOMEM "%s", NULL));
        return NULL;
    }
    o->ctx = ctx;
    o->netns_fd = -1;
    o->done = done;
    o->arg = arg;
    snprintf(o->sandbox, sizeof(o->sandbox), "%s", id);
    return o;
}

void sp_sandbox_register(sp_ctx *ctx, const json_t *req, int netns_fd, sp_done_cb done,
                         void *arg)
{
    const char *team = json_string_value(json_object_get(req, "team"));
    const char *path = json_string_value(json_object_get(req, "netns"));
    const char *owner = json_string_value(json_object_get(req, "owner"));
    op *o = op_new(ctx, req, done, arg);

    if (!o) {
        if (netns_fd >= 0)
            close(netns_fd);
        return;
    }
    o->is_register = 1;
    o->netns_fd = netns_fd;
    if (!team || !sf_id_valid(team)) {
        answer(done, arg, err_reply("Give the sandbox's team ([a-z0-9_-]) in 'team'.%s", NULL));
        op_free(o);
        return;
    }
    snprintf(o->team, sizeof(o->team), "%s", team);
    if (owner && !sf_id_valid(owner)) {
        answer(done, arg, err_reply("'owner' must be an id ([a-z0-9_-], at most 63 "
                                    "characters).%s", NULL));
        op_free(o);
        return;
    }
    snprintf(o->owner, sizeof(o->owner), "%s", owner ? owner : "");
    if (o->netns_fd < 0 && path && (o->netns_fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
        answer(done, arg, err_reply("Cannot open the network namespace %.200s; pass its fd "
                                    "or an existing /proc/PID/ns/net or /run/netns path.", path));
        op_free(o);
        return;
    }
    if (o->netns_fd < 0) {
        answer(done, arg, err_reply("Pass the sandbox's network namespace (an fd with the "
                                    "message, or 'netns': a path).%s", NULL));
        op_free(o);
        return;
    }
    if (sf_map_get(ctx->sandboxes, o->sandbox)) {
        answer(done, arg, err_reply(SF_MSG_PROXY_SB_REGISTERED_FMT, o->sandbox));
        op_free(o);
        return;
    }
    start(ctx, o, req, NULL);
}

void sp_sandbox_update(sp_ctx *ctx, const json_t *req, sp_done_cb done, void *arg)
{
    op *o = op_new(ctx, req, done, arg);
    sp_sandbox *sb;

    if (!o)
        return;
    if (!(sb = sf_map_get(ctx->sandboxes, o->sandbox))) {
        answer(done, arg, err_reply(SF_MSG_PROXY_SB_UNKNOWN_FMT,
                                    o->sandbox));
        op_free(o);
        return;
    }
    snprintf(o->team, sizeof(o->team), "%s", sb->team);
    start(ctx, o, req, sb);
}

static void sandbox_drop(sp_ctx *ctx, sp_sandbox *sb)
{
    char key[128];

    sf_map_del(ctx->sandboxes, sb->id);
    sb->dead = 1;
    if (sb->l_http)
        evconnlistener_free(sb->l_http);
    if (sb->l_transparent)
        evconnlistener_free(sb->l_transparent);
    if (sb->ev_dns)
        event_free(sb->ev_dns);
    sb->l_http = sb->l_transparent = NULL;
    sb->ev_dns = NULL;
    close(sb->dns_fd);
    sb->dns_fd = -1;
    sp_conn_close_all(sb);
    bindings_free(sb->bind, sb->bind_n); /* placeholders worthless from here on */
    sb->bind = NULL;
    sb->bind_n = 0;
    snprintf(key, sizeof(key), SF_RK_NETLOG, sb->id);
    sf_redis_cmd(ctx->redis, NULL, NULL, "EXPIRE %s 3600", key);
    sp_sandbox_unref(sb);
}

static void collect(const char *key, void *val, void *arg);

static int kept(const json_t *keep, const char *id)
{
    size_t i;
    json_t *v;

    json_array_foreach(keep, i, v)
        if (json_is_string(v) && !strcmp(json_string_value(v), id))
            return 1;
    return 0;
}

/* Every sandbox registered by owner (a worker that restarted) but those it names in keep
 * (it took them back: their listeners, rules and placeholders stay as they are). */
static void unregister_owner(sp_ctx *ctx, const char *owner, const json_t *keep,
                             sp_done_cb done, void *arg)
{
    size_t n = sf_map_len(ctx->sandboxes), dropped = 0;
    sp_sandbox **all = calloc(n + 1, sizeof(*all)), **p = all;

    if (!all) {
        answer(done, arg, err_reply(SF_MSG_PROXY_NOMEM "%s", NULL));
        return;
    }
    sf_map_foreach(ctx->sandboxes, collect, &p);
    for (size_t i = 0; i < n; i++)
        if (!strcmp(all[i]->owner, owner) && !kept(keep, all[i]->id)) {
            sf_info("msg=\"sandbox unregistered (its owner restarted)\" sandbox=%s owner=%s",
                    all[i]->id, owner);
            sandbox_drop(ctx, all[i]);
            dropped++;
        }
    free(all);
    answer(done, arg, json_pack("{s:b, s:I}", "ok", 1, "dropped", (json_int_t)dropped));
}

void sp_sandbox_unregister(sp_ctx *ctx, const json_t *req, sp_done_cb done, void *arg)
{
    const char *id = json_string_value(json_object_get(req, "sandbox"));
    const char *owner = json_string_value(json_object_get(req, "owner"));
    sp_sandbox *sb = id ? sf_map_get(ctx->sandboxes, id) : NULL;

    const json_t *keep = json_object_get(req, "keep");

    if (!id && owner && sf_id_valid(owner)) {
        if (keep && (!json_is_array(keep) ||
                     (int64_t)json_array_size(keep) > ctx->cfg.proxy_max_sandboxes)) {
            answer(done, arg, err_reply("'keep' must be an array of at most max_sandboxes "
                                        "sandbox ids.%s", NULL));
            return;
        }
        unregister_owner(ctx, owner, keep, done, arg);
        return;
    }
    if (!sb) { /* idempotent: the worker may retry a kill */
        answer(done, arg, json_pack("{s:b, s:b}", "ok", 1, "existed", 0));
        return;
    }
    sf_info("msg=\"sandbox unregistered\" sandbox=%s", sb->id);
    sandbox_drop(ctx, sb);
    answer(done, arg, json_pack("{s:b, s:b}", "ok", 1, "existed", 1));
}

static void collect(const char *key, void *val, void *arg)
{
    sp_sandbox ***p = arg;
    *(*p)++ = val;
}

void sp_sandboxes_free_all(sp_ctx *ctx)
{
    size_t n = sf_map_len(ctx->sandboxes);
    sp_sandbox **all = calloc(n + 1, sizeof(*all)), **p = all;

    if (!all)
        return;
    sf_map_foreach(ctx->sandboxes, collect, &p);
    for (size_t i = 0; i < n; i++)
        sandbox_drop(ctx, all[i]);
    free(all);
}

/* ---- periodic re-read of bound secrets (rotation, deletion) ---- */

typedef struct refresh {
    sp_sandbox *sb;
    uint64_t gen;
    size_t i;
} refresh;

static void on_refreshed(redisAsyncContext *ac, void *reply, void *priv)
{
    refresh *f = priv;
    sp_sandbox *sb = f->sb;

    if (reply && !sb->dead && sb->gen == f->gen && f->i < sb->bind_n) {
        sp_binding *b = &sb->bind[f->i];
        sf_secret s;
        sf_secret_init(&s);
        if (open_secret(sb->ctx, sb->team, b->secret, reply, &s)) {
            if (s.version != b->sec.version || !b->sec.value)
                sf_info("msg=\"secret reloaded\" sandbox=%s secret=%s version=%lld", sb->id,
                        b->secret, (long long)s.version);
            sf_secret_fini(&b->sec);
            b->sec = s;
        } else if (b->sec.value && ((redisReply *)reply)->type == REDIS_REPLY_ARRAY &&
                   ((redisReply *)reply)->elements == 0) {
            sf_info("msg=\"secret deleted: its placeholder is no longer swapped\" sandbox=%s "
                    "secret=%s", sb->id, b->secret);
            sodium_free(b->sec.value);
            b->sec.value = NULL;
            b->sec.value_len = 0;
        }
    }
    sp_sandbox_unref(sb);
    free(f);
}

static void refresh_one(const char *key, void *val, void *arg)
{
    sp_sandbox *sb = val;
    char k[200];

    for (size_t i = 0; i < sb->bind_n; i++) {
        refresh *f = calloc(1, sizeof(*f));
        if (!f)
            return;
        f->sb = sp_sandbox_ref(sb);
        f->gen = sb->gen;
        f->i = i;
        snprintf(k, sizeof(k), SF_RK_SECRET, sb->team, sb->bind[i].secret);
        if (sf_redis_cmd(sb->ctx->redis, on_refreshed, f, "HGETALL %s", k) < 0) {
            sp_sandbox_unref(sb);
            free(f);
            return;
        }
    }
}

static void on_refresh_timer(evutil_socket_t fd, short what, void *arg)
{
    sp_ctx *ctx = arg;

    sf_map_foreach(ctx->sandboxes, refresh_one, NULL);
}

int sp_refresh_start(sp_ctx *ctx)
{
    struct timeval tv = {ctx->cfg.secret_refresh_ms / 1000,
                         (ctx->cfg.secret_refresh_ms % 1000) * 1000};

    if (!(ctx->ev_refresh = event_new(ctx->d.base, -1, EV_PERSIST, on_refresh_timer, ctx)))
        return -ENOMEM;
    return event_add(ctx->ev_refresh, &tv) < 0 ? -EIO : 0;
}
