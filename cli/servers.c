/* servers.c: `sandfleet servers add|list|show|remove|logs`: a team's hosted MCP servers
 * (issue 24), as the team of $SANDFLEET_API_KEY, through the gateway.
 *
 * add builds the server's image with the team's own tools over MCP, so it gets the same
 * checks and quotas as any client: a builder sandbox from --template, the code uploaded into
 * /root/mcp (an archive of at most 256 MiB, sent in parts of 6 MiB with sandbox_files_write:
 * the gateway passes each part by claim check), --setup run there once, then the sandbox
 * captured as the snapshot `mcp-NAME` (sessions start from it) and killed. Last, the entry
 * goes to the gateway's registry (PUT /v1/servers/NAME). list, show, remove and logs read
 * and change that registry. */
#include "cli.h"
#include "sf_msg.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define ANSWER_MAX (4 << 20)
#define UPLOAD_MAX (256ll << 20)
#define PART (6u << 20)
#define OPT_MAX 64
#define HTTP_BRIDGE "/root/.sandfleet/http-bridge.py"

#include "http_bridge.h" /* http_bridge_py: cli/http-bridge.py */

typedef struct mcp {
    CURL *easy;
    char url[1024];  /* the MCP endpoint */
    char base[1024]; /* the gateway's root */
    char auth[600];
    char session[256];
    char *buf;
    size_t len;
} mcp;

static size_t on_body(char *p, size_t size, size_t n, void *arg)
{
    mcp *m = arg;
    size_t add = size * n;
    char *nb;

    if (m->len + add > ANSWER_MAX || !(nb = realloc(m->buf, m->len + add + 1)))
        return 0;
    m->buf = nb;
    memcpy(m->buf + m->len, p, add);
    m->len += add;
    m->buf[m->len] = '\0';
    return add;
}

static size_t on_header(char *p, size_t size, size_t n, void *arg)
{
    mcp *m = arg;
    size_t len = size * n;
    static const char name[] = "mcp-session-id:";

    if (len > sizeof(name) && !strncasecmp(p, name, sizeof(name) - 1)) {
        const char *v = p + sizeof(name) - 1;
        size_t vl = len - (sizeof(name) - 1);
        while (vl && (*v == ' ' || *v == '\t'))
            v++, vl--;
        while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n' || v[vl - 1] == ' '))
            vl--;
        if (vl < sizeof(m->session)) {
            memcpy(m->session, v, vl);
            m->session[vl] = '\0';
        }
    }
    return len;
}

/* One HTTP request: method, url, body (NULL: none); *status the HTTP status. 0, or 1 after
 * printing why it could not be sent. */
static int http(mcp *m, const char *method, const char *url, const char *body, int is_mcp,
                long *status)
{
    struct curl_slist *h = NULL;
    char sess[300];
    CURLcode cc;

    free(m->buf);
    m->buf = NULL;
    m->len = 0;
    h = curl_slist_append(h, "Content-Type: application/json");
    h = curl_slist_append(h, "Accept: application/json, text/event-stream");
    h = curl_slist_append(h, m->auth);
    if (is_mcp) {
        h = curl_slist_append(h, "MCP-Protocol-Version: 2025-06-18");
        if (m->session[0]) {
            snprintf(sess, sizeof(sess), "Mcp-Session-Id: %s", m->session);
            h = curl_slist_append(h, sess);
        }
    }
    curl_easy_reset(m->easy);
    curl_easy_setopt(m->easy, CURLOPT_URL, url);
    curl_easy_setopt(m->easy, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(m->easy, CURLOPT_HTTPHEADER, h);
    if (body)
        curl_easy_setopt(m->easy, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(m->easy, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(m->easy, CURLOPT_WRITEDATA, m);
    curl_easy_setopt(m->easy, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(m->easy, CURLOPT_HEADERDATA, m);
    curl_easy_setopt(m->easy, CURLOPT_TIMEOUT, 900L);
    curl_easy_setopt(m->easy, CURLOPT_CONNECTTIMEOUT, 10L);
    cc = curl_easy_perform(m->easy);
    curl_slist_free_all(h);
    if (cc != CURLE_OK) {
        fprintf(stderr, SF_MSG_CLI_GATEWAY_UNREACHABLE_FMT, url, curl_easy_strerror(cc));
        return 1;
    }
    curl_easy_getinfo(m->easy, CURLINFO_RESPONSE_CODE, status);
    if (*status == 401 || *status == 403) {
        fprintf(stderr, SF_MSG_CLI_KEY_REFUSED_FMT,
                *status);
        return 1;
    }
    return 0;
}

/* The JSON-RPC message of an answer: the body itself, or the last SSE `data:` line. */
static json_t *answer_json(const char *body)
{
    const char *last = NULL, *p = body;

    if (!body)
        return NULL;
    if (body[0] == '{')
        return json_loads(body, 0, NULL);
    while ((p = strstr(p, "data:"))) {
        last = p + 5;
        p += 5;
    }
    return last ? json_loadb(last, strcspn(last, "\r\n"), 0, NULL) : NULL;
}

static int post(mcp *m, json_t *msg, json_t **out)
{
    char *body = json_dumps(msg, JSON_COMPACT);
    long status = 0;
    int rc;

    json_decref(msg);
    if (!body)
        return 1;
    rc = http(m, "POST", m->url, body, 1, &status);
    free(body);
    if (rc || !out)
        return rc;
    if (status != 200 || !(*out = answer_json(m->buf))) {
        fprintf(stderr, SF_MSG_CLI_NO_RESULT_FMT, status);
        return 1;
    }
    return 0;
}

static int mcp_open(mcp *m, int need_session)
{
    const char *key = getenv("SANDFLEET_API_KEY"), *url = getenv("SANDFLEET_URL");
    json_t *ans = NULL;
    size_t n;

    memset(m, 0, sizeof(*m));
    if (!key || !*key) {
        fputs(SF_MSG_CLI_KEY_UNSET, stderr);
        return 1;
    }
    if (strlen(key) > 512) {
        fputs(SF_MSG_CLI_KEY_TOO_LONG, stderr);
        return 1;
    }
    if (!url || !*url)
        url = cli_setting("SF_URL", CLI_DEFAULT_URL);
    snprintf(m->url, sizeof(m->url), "%s", url);
    snprintf(m->base, sizeof(m->base), "%s", url);
    n = strlen(m->base);
    if (n >= 4 && !strcmp(m->base + n - 4, "/mcp"))
        m->base[n - 4] = '\0';
    snprintf(m->auth, sizeof(m->auth), "Authorization: Bearer %s", key);
    if (!(m->easy = curl_easy_init()))
        return 1;
    if (!need_session)
        return 0;
    if (post(m, json_pack("{s:s, s:i, s:s, s:{s:s, s:{}, s:{s:s, s:s}}}", "jsonrpc", "2.0", "id",
                          1, "method", "initialize", "params", "protocolVersion", "2025-06-18",
                          "capabilities", "clientInfo", "name", "sandfleet-cli", "version",
                          "1"),
             &ans))
        return 1;
    json_decref(ans);
    return post(m, json_pack("{s:s, s:s}", "jsonrpc", "2.0", "method",
                             "notifications/initialized"), NULL);
}

static void mcp_close(mcp *m)
{
    if (m->easy)
        curl_easy_cleanup(m->easy);
    free(m->buf);
}

/* tools/call; *structured (may be NULL) gets structuredContent. 0, or 1 (printed why,
 * unless quiet). */
static int call_tool(mcp *m, const char *tool, json_t *args, json_t **structured, int quiet)
{
    static int id = 2;
    json_t *ans = NULL, *res;
    int ret = 1;

    if (post(m, json_pack("{s:s, s:i, s:s, s:{s:s, s:o}}", "jsonrpc", "2.0", "id", id++,
                          "method", "tools/call", "params", "name", tool, "arguments", args),
             &ans))
        return 1;
    res = json_object_get(ans, "result");
    if (!res) {
        if (!quiet)
            fprintf(stderr, "%s: %s\n", tool,
                    json_string_value(json_object_get(json_object_get(ans, "error"), "message"))
                        ?: "the call failed.");
    } else if (json_is_true(json_object_get(res, "isError"))) {
        json_t *c0 = json_array_get(json_object_get(res, "content"), 0);
        if (!quiet)
            fprintf(stderr, "%s: %s\n", tool,
                    json_string_value(json_object_get(c0, "text")) ?: "the call failed.");
    } else {
        if (structured)
            *structured = json_incref(json_object_get(res, "structuredContent"));
        ret = 0;
    }
    json_decref(ans);
    return ret;
}

/* A registry request; *out the answer (object). 0, or 1 after printing why. */
static int registry(mcp *m, const char *method, const char *name, const char *sub,
                    json_t *body, json_t **out)
{
    char url[1400];
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    long status = 0;
    json_t *ans;
    int rc;

    json_decref(body);
    snprintf(url, sizeof(url), "%s/v1/servers%s%s%s%s", m->base, name ? "/" : "",
             name ? name : "", sub ? "/" : "", sub ? sub : "");
    rc = http(m, method, url, text, 0, &status);
    free(text);
    if (rc)
        return 1;
    ans = m->buf ? json_loads(m->buf, 0, NULL) : NULL;
    if (status != 200) {
        fprintf(stderr, "%s\n", json_string_value(json_object_get(ans, "error"))
                                    ?: "The gateway refused the request; retry.");
        json_decref(ans);
        return 1;
    }
    *out = ans ? ans : json_object();
    return 0;
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
static int run_in(mcp *m, const char *sb, const char *cmd, const char *what)
{
    json_t *r = NULL;
    int ok;

    if (call_tool(m, "sandbox_exec", json_pack("{s:s, s:s, s:i}", "sandbox_id", sb, "command",
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

static int upload(mcp *m, const char *sb, const char *file)
{
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    struct stat st;
    unsigned char *buf = NULL;
    int part = 0, rc = 1;

    if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        fprintf(stderr, "Cannot read %s (%s); pass a readable archive.\n", file, strerror(errno));
        goto out;
    }
    if (st.st_size > UPLOAD_MAX) {
        fprintf(stderr, "The server's code is %lld MiB packed; the most is 256 MiB: leave out "
                "what it does not need (tests, .git, caches).\n", (long long)(st.st_size >> 20));
        goto out;
    }
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
        if (call_tool(m, "sandbox_files_write", json_pack("{s:s, s:s, s:s, s:s}", "sandbox_id", sb,
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
    json_t *allow = json_array(), *secrets = json_object(), *entry, *r = NULL;
    char tmp[] = "/tmp/sandfleet-server-XXXXXX", snap[80], sb[80] = "", cmd[512], httpspec[160],
         githost[256];
    const char *file = archive;
    int tmpfd = -1, rc = 1, sources = !!dir + !!archive + !!git;
    mcp m;

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
    if (cli_opt(argc, argv, "--vcpu") || cli_opt(argc, argv, "--memory_mib") ||
        cli_opt(argc, argv, "--disk_mib"))
        fputs("note: a server's sessions take the shape of --template (build a template with "
              "that shape first); --vcpu/--memory_mib/--disk_mib are not applied yet.\n", stderr);
    if (dir) {
        if ((tmpfd = mkstemp(tmp)) < 0 || tar_dir(dir, tmp) < 0) {
            fprintf(stderr, "Cannot pack %s with tar; check that it is a readable folder.\n", dir);
            goto fail;
        }
        file = tmp;
    }
    if (mcp_open(&m, 1)) {
        mcp_close(&m);
        goto fail;
    }
    snprintf(snap, sizeof(snap), "mcp-%s", name);
    fprintf(stderr, "building server %s: a builder sandbox from template %s\n", name,
            tpl ? tpl : "debian");
    {
        json_t *a = json_pack("{s:s, s:s}", "name", "sandfleet-server-build", "from_template",
                              tpl ? tpl : "debian");
        json_t *bal = json_copy(allow); /* the builder also reaches the repository's host */
        if (git)
            json_array_append_new(bal, json_string(githost));
        if (json_array_size(bal))
            json_object_set(a, "allow_out", bal);
        json_decref(bal);
        if (call_tool(&m, "sandbox_create", a, &r, 0))
            goto close;
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
                 "tar -x%sf - -C /root/mcp --no-same-owner; rm -rf /tmp/sf-upload",
                 gzipped(file) ? "z" : "");
        if (run_in(&m, sb, cmd, "Unpacking the server's code"))
            goto kill;
    }
    if (httpopt) {
        char *enc = b64((const unsigned char *)http_bridge_py, strlen(http_bridge_py));
        int bad = !enc || call_tool(&m, "sandbox_files_write",
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
    call_tool(&m, "sandbox_snapshot_delete", json_pack("{s:s}", "snapshot", snap), NULL, 1);
    if (call_tool(&m, "sandbox_snapshot", json_pack("{s:s, s:s}", "sandbox_id", sb, "name", snap),
                  NULL, 0))
        goto kill;
    entry = json_pack("{s:s, s:s, s:s, s:s, s:O, s:O}", "run", run, "snapshot", snap, "template",
                      tpl ? tpl : "debian", "cwd", "/root/mcp", "allow_out", allow, "secrets",
                      secrets);
    if (setup)
        json_object_set_new(entry, "setup", json_string(setup));
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
        printf("server %s registered: POST %s?name=%s (or %s/%s)\n", name, m.url, name, m.url,
               name);
        json_decref(r);
        rc = 0;
    }
kill:
    if (sb[0])
        call_tool(&m, "sandbox_kill", json_pack("{s:s}", "sandbox_id", sb), NULL, 1);
close:
    mcp_close(&m);
fail:
    if (tmpfd >= 0) {
        close(tmpfd);
        unlink(tmp);
    }
    json_decref(allow);
    json_decref(secrets);
    return rc;
usage:
    json_decref(allow);
    json_decref(secrets);
    return 2;
}

/* Kills the sandboxes of the server's live sessions (the team's sandboxes whose metadata
 * names it), page by page; how many. */
static int end_sessions(mcp *m, const char *name)
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
        if (call_tool(m, "sandbox_list", a, &r, 0))
            break;
        json_array_foreach(json_object_get(r, "sandboxes"), i, v) {
            const char *id = json_string_value(json_object_get(v, "id"));
            const char *st = json_string_value(json_object_get(v, "status"));
            if (id && (!st || strcmp(st, "killed")) &&
                !call_tool(m, "sandbox_kill", json_pack("{s:s}", "sandbox_id", id), NULL, 1))
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

static int usage_all(FILE *f)
{
    fputs("usage: sandfleet servers add NAME (--dir PATH | --archive FILE | --git URL [--ref REF])\n"
          "                         --run CMD [--http PORT[/PATH]]\n"
          "                         [--setup CMD]\n"
          "                         [--template T] [--allow-out HOST]... [--secret ENV=NAME]...\n"
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
    mcp m;
    int rc = 1;

    if (!sub || cli_wants_help(argc, argv))
        return usage_all(sub ? stdout : stderr);
    if (!strcmp(sub, "add"))
        return add(argc, argv);
    if (strcmp(sub, "list") && !name_ok(name))
        return usage_all(stderr);
    if (mcp_open(&m, !strcmp(sub, "remove"))) {
        mcp_close(&m);
        return 1;
    }
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
            call_tool(&m, "sandbox_snapshot_delete", json_pack("{s:s}", "snapshot", snap), NULL, 1);
            printf("server %s removed (%d live session%s ended)\n", name, ended,
                   ended == 1 ? "" : "s");
            rc = 0;
        }
    } else {
        rc = usage_all(stderr);
    }
    json_decref(r);
    mcp_close(&m);
    return rc;
}
