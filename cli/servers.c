/* servers.c: `sandfleet servers add|list|show|remove|logs`: a team's hosted MCP servers
 * (issue 24), as the team of $SANDFLEET_API_KEY, through the gateway.
 *
 * add builds the server's image with the team's own tools over MCP, so it gets the same
 * checks and quotas as any client: with --setup or a shape, first the server's own template
 * mcp-NAME-XXXX from --template (a template build: jail hosts; a fleet of qemu hosts only
 * refuses it, and the CLI says what works there); a builder sandbox from that template (or
 * --template), the code uploaded into
 * /root/mcp (an archive of at most 256 MiB, sent in parts of 6 MiB with sandbox_files_write:
 * the gateway passes each part by claim check), --setup run there once, then the sandbox
 * captured as the snapshot `mcp-NAME` (sessions start from it) and killed. Last, the entry
 * goes to the gateway's registry (PUT /v1/servers/NAME). list, show, remove and logs read
 * and change that registry. */
#include "cli.h"
#include "gwcall.h"
#include "sf_util.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define UPLOAD_MAX (256ll << 20)
#define PART (6u << 20)
#define OPT_MAX 64
#define HTTP_BRIDGE "/root/.sandfleet/http-bridge.py"

#include "http_bridge.h" /* http_bridge_py: cli/http-bridge.py */

/* A registry request; *out the answer (object). 0, or 1 after printing why. */
static int registry_q(cli_gw *m, const char *method, const char *name, const char *sub,
                      json_t *body, json_t **out, int quiet)
{
    char url[1400];
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    long status = 0;
    json_t *ans;
    int rc;

    json_decref(body);
    snprintf(url, sizeof(url), "%s/v1/servers%s%s%s%s", m->base, name ? "/" : "",
             name ? name : "", sub ? "/" : "", sub ? sub : "");
    rc = cli_gw_http(m, method, url, text, 0, &status);
    free(text);
    if (rc)
        return 1;
    ans = m->buf ? json_loads(m->buf, 0, NULL) : NULL;
    if (status != 200) {
        if (!quiet)
            fprintf(stderr, "%s\n", json_string_value(json_object_get(ans, "error"))
                                        ?: "The gateway refused the request; retry.");
        json_decref(ans);
        return 1;
    }
    *out = ans ? ans : json_object();
    return 0;
}

static int registry(cli_gw *m, const char *method, const char *name, const char *sub,
                    json_t *body, json_t **out)
{
    return registry_q(m, method, name, sub, body, out, 0);
}

/* Fills the server's warm pool (the gateway makes its sandboxes; an older registration's
 * go) and says how full it is. */
static void fill_pool(cli_gw *m, const char *name, int show)
{
    json_t *r = NULL;

    if (show)
        fprintf(stderr, "filling the warm pool\n");
    if (registry_q(m, "POST", name, "warm", NULL, &r, 0))
        return;
    if (json_string_value(json_object_get(r, "error")))
        fprintf(stderr, "%s\n", json_string_value(json_object_get(r, "error")));
    else if (show)
        fprintf(stderr, "warm pool: %lld sandboxes ready\n",
                (long long)json_integer_value(json_object_get(r, "ready")));
    json_decref(r);
}

static int name_ok(const char *n)
{
    size_t len = n ? strlen(n) : 0;

    if (len == 0 || len > 55)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!((n[i] >= 'a' && n[i] <= 'z') || (n[i] >= '0' && n[i] <= '9') || n[i] == '-' ||
              n[i] == '_'))
            return 0;
    return 1;
}

/* tar -czf out -C dir . (no shell; tar stores symlinks as links, never follows them). */
static int tar_dir(const char *dir, const char *out)
{
    pid_t pid = fork();
    int status;

    if (pid < 0)
        return -1;
    if (pid == 0) {
        execlp("tar", "tar", "-czf", out, "-C", dir, ".", (char *)NULL);
        _exit(127);
    }
    if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return -1;
    return 0;
}

static char *b64(const unsigned char *p, size_t n)
{
    static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *o = malloc((n + 2) / 3 * 4 + 1), *w = o;

    if (!o)
        return NULL;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0) |
                     (i + 2 < n ? p[i + 2] : 0);
        *w++ = t[v >> 18 & 63];
        *w++ = t[v >> 12 & 63];
        *w++ = i + 1 < n ? t[v >> 6 & 63] : '=';
        *w++ = i + 2 < n ? t[v & 63] : '=';
    }
    *w = '\0';
    return o;
}

/* sandbox_exec; 0 when it ran and exited 0, else 1 (its output printed). */
static int run_in(cli_gw *m, const char *sb, const char *cmd, const char *what)
{
    json_t *r = NULL;
    int ok;

    if (cli_gw_call(m, "sandbox_exec", json_pack("{s:s, s:s, s:i}", "sandbox_id", sb, "command",
                                               cmd, "timeout_ms", 600000), &r, 0))
        return 1;
    ok = json_integer_value(json_object_get(r, "exit_code")) == 0;
    if (!ok)
        fprintf(stderr, "%s failed (exit %lld):\n%s%s", what,
                (long long)json_integer_value(json_object_get(r, "exit_code")),
                json_string_value(json_object_get(r, "stdout")) ?: "",
                json_string_value(json_object_get(r, "stderr")) ?: "");
    json_decref(r);
    return ok ? 0 : 1;
}

/* fd (file, opened) is a readable file of at most UPLOAD_MAX, the packed code: 0, or 1
 * after saying why. */
static int code_fd_ok(const char *file, int fd)
{
    struct stat st;
    int bad = fd < 0 || fstat(fd, &st) < 0;

    if (bad || !S_ISREG(st.st_mode)) {
        fprintf(stderr, "Cannot read %s (%s); pass a readable archive.\n", file,
                bad ? strerror(errno) : "not a regular file");
        return 1;
    }
    if (st.st_size > UPLOAD_MAX) {
        fprintf(stderr, "The server's code is %lld MiB packed; the most is 256 MiB: leave out "
                "what it does not need (tests, .git, caches).\n", (long long)(st.st_size >> 20));
        return 1;
    }
    return 0;
}

/* Checked before anything is made (upload checks the file it reads again). */
static int code_ok(const char *file)
{
    int fd = open(file, O_RDONLY | O_CLOEXEC), rc = code_fd_ok(file, fd);

    if (fd >= 0)
        close(fd);
    return rc;
}

static int upload(cli_gw *m, const char *sb, const char *file)
{
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    unsigned char *buf = NULL;
    int part = 0, rc = 1;

    if (code_fd_ok(file, fd))
        goto out;
    if (!(buf = malloc(PART)))
        goto out;
    for (;;) {
        ssize_t n = 0, r;
        char path[64], *enc;
        while ((size_t)n < PART && (r = read(fd, buf + n, PART - (size_t)n)) > 0)
            n += r;
        if (n == 0 && part > 0)
            break;
        if (!(enc = b64(buf, (size_t)n)))
            goto out;
        snprintf(path, sizeof(path), "/tmp/sf-upload/part.%04d", part++);
        fprintf(stderr, "uploading part %d (%zd bytes)\n", part, n);
        if (cli_gw_call(m, "sandbox_files_write", json_pack("{s:s, s:s, s:s, s:s}", "sandbox_id", sb,
                                                          "path", path, "content", enc,
                                                          "encoding", "base64"), NULL, 0)) {
            free(enc);
            goto out;
        }
        free(enc);
        if ((size_t)n < PART)
            break;
    }
    rc = 0;
out:
    free(buf);
    if (fd >= 0)
        close(fd);
    return rc;
}

/* --vcpu, --memory_mib, --disk_mib into shape (the bounds of sandbox_template_create). 0, or
 * -1 after printing which is out of bounds. */
static int shape_opts(int argc, char **argv, json_t *shape)
{
    static const struct {
        const char *opt;
        int64_t lo, hi;
        const char *unit;
    } f[] = {{"--vcpu", 1, 8, "vCPUs"}, {"--memory_mib", 64, 65536, "MiB"},
             {"--disk_mib", 64, 65536, "MiB"}};

    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
        const char *v = cli_opt(argc, argv, f[i].opt);
        int64_t n;
        if (!v)
            continue;
        if (sf_parse_i64(v, f[i].lo, f[i].hi, &n) < 0) {
            fprintf(stderr, "%s is a whole number of %s from %lld to %lld (each session's "
                    "sandbox gets it).\n", f[i].opt, f[i].unit, (long long)f[i].lo,
                    (long long)f[i].hi);
            return -1;
        }
        json_object_set_new(shape, f[i].opt + 2, json_integer(n));
    }
    return 0;
}

/* After a refusal that names the jail driver (a fleet of qemu hosts only): what needs one
 * and what works without. */
static void jail_hint(const cli_gw *m)
{
    if (strstr(m->err, "jail driver") || strstr(m->err, "jail host"))
        fputs("This fleet has no jail host: --setup, a server's shape (--vcpu/--memory_mib/"
              "--disk_mib) and a team --template are template builds, which run on jail hosts "
              "only. Register the server without them (its code is uploaded into a microVM "
              "whose snapshot each session starts from, with the shape of 'debian' or 'base'; "
              "ship its dependencies inside --dir/--archive, e.g. pip install --target) or ask "
              "the operator for a jail host.\n", stderr);
}

/* The server's own template, mcp-NAME-XXXX from --template, of the server's shape (a new
 * one each registration: live sessions keep the old one until the registry names the new):
 * --setup and a shape are template builds. Its name into out. 0, or 1 after printing why. */
static int shape_template(cli_gw *m, const char *name, const char *from, json_t *shape,
                          char *out, size_t n)
{
    json_t *a;
    unsigned r = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC), sized = json_object_size(shape) > 0;

    if (fd < 0 || read(fd, &r, sizeof(r)) != (ssize_t)sizeof(r))
        r = (unsigned)getpid() ^ (unsigned)time(NULL);
    if (fd >= 0)
        close(fd);
    snprintf(out, n, "mcp-%s-%04x", name, r & 0xffff);
    fprintf(stderr, "building template %s: the server's own%s, from %s\n", out,
            sized ? " shape" : " (--setup runs in a sandbox of it)", from);
    a = json_pack("{s:s, s:s}", "name", out, "from", from);
    json_object_update(a, shape);
    if (cli_gw_call(m, "sandbox_template_create", a, NULL, 0)) {
        jail_hint(m);
        if (strstr(m->err, "jail driver"))
            return 1;
    } else if (cli_gw_template_wait(m, out, 0) == 0) {
        return 0;
    }
    fprintf(stderr, "The server's template %s could not be built from %s; fix what the line "
            "above says%s.\n", out, from,
            sized ? ", or leave the shape out to use the template's own" : "");
    return 1;
}

/* --http PORT[/PATH] as "PORT/PATH" (PATH default /mcp). 0, or -1 when malformed. */
static int http_spec(const char *v, char *out, size_t n)
{
    char *end;
    long port = strtol(v, &end, 10);
    const char *path = *end ? end : "/mcp";

    if (end == v || port < 1 || port > 65535 || *path != '/' || strlen(path) > 128)
        return -1;
    for (const char *p = path; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '/' || *p == '-' || *p == '_' || *p == '.'))
            return -1;
    snprintf(out, n, "%ld%s", port, path);
    return 0;
}

/* --git URL [--ref REF]: the URL's host into host (for the builder's allow_out). 0, or -1
 * when either is malformed (both go into a shell command in single quotes). */
static int git_host(const char *url, const char *ref, char *host, size_t n)
{
    const char *h = !strncmp(url, "https://", 8) ? url + 8 : !strncmp(url, "http://", 7) ? url + 7
                                                                                         : NULL;
    size_t len;

    if (!h || strlen(url) > 1024 || strpbrk(url, "'\"\\ \t\n\r`$;&|<>") ||
        (ref && (!*ref || strlen(ref) > 200 || *ref == '-')))
        return -1;
    for (const char *p = ref; p && *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '.' || *p == '_' || *p == '-' || *p == '/'))
            return -1;
    len = strcspn(h, "/?#");
    if (memchr(h, '@', len)) /* user:password@: a credential does not belong in a URL */
        return -1;
    len = strcspn(h, "/:?#");
    if (len == 0 || len >= n)
        return -1;
    memcpy(host, h, len);
    host[len] = '\0';
    return 0;
}

static int gzipped(const char *file)
{
    unsigned char mg[2] = {0};
    int fd = open(file, O_RDONLY | O_CLOEXEC);

    if (fd < 0)
        return 0;
    if (read(fd, mg, 2) != 2)
        mg[0] = 0;
    close(fd);
    return mg[0] == 0x1f && mg[1] == 0x8b;
}

static int add(int argc, char **argv)
{
    const char *name = argc > 2 ? argv[2] : NULL, *dir = cli_opt(argc, argv, "--dir");
    const char *archive = cli_opt(argc, argv, "--archive"), *git = cli_opt(argc, argv, "--git");
    const char *run = cli_opt(argc, argv, "--run"), *setup = cli_opt(argc, argv, "--setup");
    const char *tpl = cli_opt(argc, argv, "--template"), *httpopt = cli_opt(argc, argv, "--http");
    const char *idle = cli_opt(argc, argv, "--idle-timeout"), *ref = cli_opt(argc, argv, "--ref");
    const char *maxs = cli_opt(argc, argv, "--max-sessions"), *warm = cli_opt(argc, argv, "--warm");
    json_t *allow = json_array(), *secrets = json_object(), *shape = json_object(), *entry,
           *r = NULL, *old = NULL;
    char tmp[] = "/tmp/sandfleet-server-XXXXXX", snap[80], sb[80] = "", cmd[512], httpspec[160],
         githost[256], stpl[80] = "";
    const char *file = archive;
    int tmpfd = -1, rc = 1, sources = !!dir + !!archive + !!git, fill = 0;
    cli_gw m;

    for (int i = 3; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--allow-out"))
            json_array_append_new(allow, json_string(argv[++i]));
        else if (!strcmp(argv[i], "--secret")) {
            const char *eq = strchr(argv[++i], '=');
            char env[128];
            if (!eq || eq == argv[i] || !eq[1] || (size_t)(eq - argv[i]) >= sizeof(env)) {
                fprintf(stderr, "--secret takes ENV=SECRET_NAME, e.g. --secret "
                        "API_TOKEN=weather-token.\n");
                goto usage;
            }
            memcpy(env, argv[i], (size_t)(eq - argv[i]));
            env[eq - argv[i]] = '\0';
            json_object_set_new(secrets, env, json_string(eq + 1));
        }
    }
    if (!name_ok(name) || !run || sources != 1) {
        fputs("servers add NAME (--dir PATH | --archive FILE | --git URL [--ref REF]) --run CMD "
              "needs a name (a-z, 0-9, '-', '_'; at most 55), exactly one source and the "
              "command that starts the server.\n", stderr);
        goto usage;
    }
    if (httpopt && http_spec(httpopt, httpspec, sizeof(httpspec)) < 0) {
        fputs("--http takes PORT[/PATH]: the port the server listens on inside its sandbox "
              "(1-65535) and its MCP path (default /mcp; letters, digits, '/', '-', '_', '.'), "
              "e.g. --http 8000/mcp.\n", stderr);
        goto usage;
    }
    if (git && git_host(git, ref, githost, sizeof(githost)) < 0) {
        fputs("--git takes an http(s) URL of at most 1024 bytes without quotes, spaces or "
              "credentials (e.g. --git https://github.com/org/server.git), and --ref a branch "
              "or tag of letters, digits, '.', '_', '-' and '/'.\n", stderr);
        goto usage;
    }
    if (shape_opts(argc, argv, shape) < 0)
        goto usage;
    {
        int64_t n;
        if (warm && sf_parse_i64(warm, 0, 16, &n) < 0) {
            fputs("--warm is how many sandboxes to keep ready for new sessions: 0 to 16 (they "
                  "count in your team's sandboxes).\n", stderr);
            goto usage;
        }
    }
    if (dir) {
        if ((tmpfd = mkstemp(tmp)) < 0 || tar_dir(dir, tmp) < 0) {
            fprintf(stderr, "Cannot pack %s with tar; check that it is a readable folder.\n", dir);
            goto fail;
        }
        file = tmp;
    }
    if (file && code_ok(file))
        goto fail;
    if (cli_gw_open(&m, 1)) {
        cli_gw_close(&m);
        goto fail;
    }
    m.timeout_s = 900; /* an exec of --setup may take its 10 minutes */
    snprintf(snap, sizeof(snap), "mcp-%s", name);
    /* --setup and a shape are template builds: the server's own template mcp-NAME-XXXX (of
     * its shape, from --template) is built first, on a jail host; the builder sandbox,
     * where the code and --setup go, is made from it. */
    if ((setup || json_object_size(shape)) &&
        shape_template(&m, name, tpl ? tpl : "debian", shape, stpl, sizeof(stpl)))
        goto kill; /* (a failed build's template goes there) */
    fprintf(stderr, "building server %s: a builder sandbox from template %s\n", name,
            stpl[0] ? stpl : tpl ? tpl : "debian");
    {
        json_t *a = json_pack("{s:s, s:s}", "name", "sandfleet-server-build", "from_template",
                              stpl[0] ? stpl : tpl ? tpl : "debian");
        json_t *bal = json_copy(allow); /* the builder also reaches the repository's host */
        if (git)
            json_array_append_new(bal, json_string(githost));
        if (json_array_size(bal))
            json_object_set(a, "allow_out", bal);
        json_decref(bal);
        if (cli_gw_call(&m, "sandbox_create", a, &r, 0)) {
            jail_hint(&m);
            if (stpl[0])
                fprintf(stderr, "The server's sessions would get that shape (--vcpu/--memory_mib/"
                        "--disk_mib): no host or quota of your team holds it; ask for less.\n");
            goto kill;
        }
        snprintf(sb, sizeof(sb), "%s", json_string_value(json_object_get(r, "id")) ?: "");
        json_decref(r);
        r = NULL;
    }
    if (git) {
        /* through the sandbox's egress proxy; a shallow clone, or a whole one from a server
         * that cannot serve shallow clones (dumb HTTP) */
        char *gc = NULL, rf[300] = "";
        if (ref)
            snprintf(rf, sizeof(rf), "--branch '%s' ", ref);
        fprintf(stderr, "cloning %s\n", git);
        if (asprintf(&gc, "git clone -q --depth 1 %s-- '%s' /root/mcp 2>/dev/null || "
                     "{ rm -rf /root/mcp; git clone -q %s-- '%s' /root/mcp; }", rf, git, rf,
                     git) < 0 ||
            run_in(&m, sb, gc, "Cloning the server's repository")) {
            free(gc);
            goto kill;
        }
        free(gc);
    } else {
        if (upload(&m, sb, file))
            goto kill;
        snprintf(cmd, sizeof(cmd), "set -e; mkdir -p /root/mcp; cat /tmp/sf-upload/part.* | "
                 "tar -x%sof - -C /root/mcp; rm -rf /tmp/sf-upload",
                 gzipped(file) ? "z" : "");
        if (run_in(&m, sb, cmd, "Unpacking the server's code"))
            goto kill;
    }
    if (httpopt) {
        char *enc = b64((const unsigned char *)http_bridge_py, strlen(http_bridge_py));
        int bad = !enc || cli_gw_call(&m, "sandbox_files_write",
                                    json_pack("{s:s, s:s, s:s, s:s}", "sandbox_id", sb, "path",
                                              HTTP_BRIDGE, "content", enc, "encoding", "base64"),
                                    NULL, 0);
        free(enc);
        if (bad)
            goto kill;
    }
    if (setup) {
        char *sc = NULL;
        fprintf(stderr, "running --setup\n");
        if (asprintf(&sc, "cd /root/mcp && %s", setup) < 0 || run_in(&m, sb, sc, "--setup")) {
            free(sc);
            goto kill;
        }
        free(sc);
    }
    cli_gw_call(&m, "sandbox_snapshot_delete", json_pack("{s:s}", "snapshot", snap), NULL, 1);
    if (cli_gw_call(&m, "sandbox_snapshot", json_pack("{s:s, s:s}", "sandbox_id", sb, "name", snap),
                  NULL, 0))
        goto kill;
    entry = json_pack("{s:s, s:s, s:s, s:s, s:O, s:O}", "run", run, "snapshot", snap, "template",
                      tpl ? tpl : "debian", "cwd", "/root/mcp", "allow_out", allow, "secrets",
                      secrets);
    if (setup)
        json_object_set_new(entry, "setup", json_string(setup));
    if (stpl[0]) {
        json_object_update(entry, shape);
        json_object_set_new(entry, "shape_template", json_string(stpl));
    }
    registry_q(&m, "GET", name, NULL, NULL, &old, 1); /* its old shape template goes after */
    if (httpopt)
        json_object_set_new(entry, "http", json_string(httpspec));
    json_object_set_new(entry, "source", json_string(dir ? dir : archive ? archive : git));
    if (git && ref)
        json_object_set_new(entry, "ref", json_string(ref));
    if (idle)
        json_object_set_new(entry, "idle_s", json_integer(strtoll(idle, NULL, 10)));
    if (maxs)
        json_object_set_new(entry, "max_sessions", json_integer(strtoll(maxs, NULL, 10)));
    if (warm)
        json_object_set_new(entry, "warm", json_integer(strtoll(warm, NULL, 10)));
    if (registry(&m, "PUT", name, NULL, entry, &r) == 0) {
        const char *was = json_string_value(json_object_get(old, "shape_template"));
        printf("server %s registered: POST %s?name=%s (or %s/%s)\n", name, m.url, name, m.url,
               name);
        json_decref(r);
        if (was && strcmp(was, stpl) != 0) /* refused while a live session uses it: kept */
            cli_gw_call(&m, "sandbox_template_delete", json_pack("{s:s}", "name", was), NULL, 1);
        fill = warm || json_integer_value(json_object_get(old, "warm")) > 0;
        stpl[0] = '\0';
        rc = 0;
    }
kill:
    if (sb[0])
        cli_gw_call(&m, "sandbox_kill", json_pack("{s:s}", "sandbox_id", sb), NULL, 1);
    if (stpl[0]) /* a failed registration leaves no template behind */
        cli_gw_call(&m, "sandbox_template_delete", json_pack("{s:s}", "name", stpl), NULL, 1);
    if (fill) /* after the builder went: it counted in the team's quota */
        fill_pool(&m, name, warm != NULL);
    cli_gw_close(&m);
fail:
    if (tmpfd >= 0) {
        close(tmpfd);
        unlink(tmp);
    }
    json_decref(allow);
    json_decref(secrets);
    json_decref(shape);
    json_decref(old);
    return rc;
usage:
    json_decref(allow);
    json_decref(secrets);
    json_decref(shape);
    return 2;
}

/* Kills the sandboxes of the server's live sessions (the team's sandboxes whose metadata
 * names it), page by page; how many. */
static int end_sessions(cli_gw *m, const char *name)
{
    char cursor[160] = "";
    int n = 0;

    for (int page = 0; page < 100; page++) {
        json_t *a = json_pack("{s:{s:s}, s:i}", "metadata", "sandfleet_hosted", name, "limit", 200);
        json_t *r = NULL, *v;
        const char *next;
        size_t i;
        if (cursor[0])
            json_object_set_new(a, "cursor", json_string(cursor));
        if (cli_gw_call(m, "sandbox_list", a, &r, 0))
            break;
        json_array_foreach(json_object_get(r, "sandboxes"), i, v) {
            const char *id = json_string_value(json_object_get(v, "id"));
            const char *st = json_string_value(json_object_get(v, "status"));
            if (id && (!st || strcmp(st, "killed")) &&
                !cli_gw_call(m, "sandbox_kill", json_pack("{s:s}", "sandbox_id", id), NULL, 1))
                n++;
        }
        next = json_string_value(json_object_get(r, "next_cursor"));
        snprintf(cursor, sizeof(cursor), "%s", next && strlen(next) < sizeof(cursor) ? next : "");
        json_decref(r);
        if (!cursor[0])
            break;
    }
    return n;
}

/* Deletes the server's shape templates (mcp-NAME-XXXX: four hex digits, so another
 * server's, mcp-NAME-more-XXXX, is never one); how many are left (in use). */
static int drop_shape_templates(cli_gw *m, const char *name)
{
    char prefix[80];
    json_t *r = NULL, *t;
    size_t i, pl;
    int left = 0;

    pl = (size_t)snprintf(prefix, sizeof(prefix), "mcp-%s-", name);
    if (cli_gw_call(m, "sandbox_template_list", json_pack("{s:s}", "name_prefix", prefix), &r, 1))
        return 0;
    json_array_foreach(json_object_get(r, "templates"), i, t) {
        const char *n = json_string_value(json_object_get(t, "name"));
        if (!n || strncmp(n, prefix, pl) || strlen(n + pl) != 4 || strspn(n + pl, "0123456789abcdef") != 4)
            continue;
        if (cli_gw_call(m, "sandbox_template_delete", json_pack("{s:s}", "name", n), NULL, 0))
            left++;
    }
    json_decref(r);
    return left;
}

static int usage_all(FILE *f)
{
    fputs("usage: sandfleet servers add NAME (--dir PATH | --archive FILE | --git URL [--ref REF])\n"
          "                         --run CMD [--http PORT[/PATH]]\n"
          "                         [--setup CMD]\n"
          "                         [--template T] [--vcpu N --memory_mib N --disk_mib N]\n"
          "                         [--allow-out HOST]... [--secret ENV=NAME]...\n"
          "                         [--idle-timeout S] [--max-sessions N] [--warm N]\n"
          "       sandfleet servers list | show NAME | remove NAME | logs NAME\n"
          "A registered server answers MCP at POST $SANDFLEET_URL?name=NAME (one sandbox per\n"
          "session), with the team's API key (SANDFLEET_API_KEY).\n",
          f);
    return f == stderr ? 2 : 0;
}

int cli_servers(int argc, char **argv)
{
    const char *sub = argc > 1 ? argv[1] : NULL, *name = argc > 2 ? argv[2] : NULL;
    json_t *r = NULL;
    cli_gw m;
    int rc = 1;

    if (!sub || cli_wants_help(argc, argv))
        return usage_all(sub ? stdout : stderr);
    if (!strcmp(sub, "add"))
        return add(argc, argv);
    if (strcmp(sub, "list") && !name_ok(name))
        return usage_all(stderr);
    if (cli_gw_open(&m, !strcmp(sub, "remove"))) {
        cli_gw_close(&m);
        return 1;
    }
    m.timeout_s = 900;
    if (!strcmp(sub, "list")) {
        if (registry(&m, "GET", NULL, NULL, NULL, &r) == 0) {
            size_t i;
            json_t *v;
            json_array_foreach(json_object_get(r, "servers"), i, v)
                printf("%s\n", json_string_value(v));
            rc = 0;
        }
    } else if (!strcmp(sub, "show")) {
        if (registry(&m, "GET", name, NULL, NULL, &r) == 0) {
            char *t = json_dumps(r, JSON_INDENT(2) | JSON_SORT_KEYS);
            printf("%s\n", t ? t : "{}");
            free(t);
            rc = 0;
        }
    } else if (!strcmp(sub, "logs")) {
        if (registry(&m, "GET", name, "logs", NULL, &r) == 0) {
            const char *log = json_string_value(json_object_get(r, "log"));
            printf("%s%s", log && *log ? log : "(no crash recorded)",
                   log && *log && log[strlen(log) - 1] == '\n' ? "" : "\n");
            rc = 0;
        }
    } else if (!strcmp(sub, "remove")) {
        if (registry(&m, "DELETE", name, NULL, NULL, &r) == 0) {
            char snap[80];
            int ended = end_sessions(&m, name);
            snprintf(snap, sizeof(snap), "mcp-%s", name);
            cli_gw_call(&m, "sandbox_snapshot_delete", json_pack("{s:s}", "snapshot", snap), NULL, 1);
            if (drop_shape_templates(&m, name))
                fprintf(stderr, "A template of the server's shape (mcp-%s-*) is still in use; "
                        "delete it later with `sandfleet templates delete`.\n", name);
            printf("server %s removed (%d live session%s ended)\n", name, ended,
                   ended == 1 ? "" : "s");
            rc = 0;
        }
    } else {
        rc = usage_all(stderr);
    }
    json_decref(r);
    cli_gw_close(&m);
    return rc;
}
