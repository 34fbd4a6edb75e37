/* templates.c: `sandfleet templates build|list|delete|logs`. build, list and delete act as
 * the team of $SANDFLEET_API_KEY through the gateway (MCP over HTTP: initialize, then
 * tools/call sandbox_template_create / _list / _delete), so they get the same checks as any
 * client; build then polls the list and draws a progress bar on stderr until the template
 * is ready or failed. logs is an operator view: the build log kept in Redis. */
#include "cli.h"
#include "sf_msg.h"
#include "sf_redis.h"
#include "sf_templates.h"
#include "sf_util.h"

#include <curl/curl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define ANSWER_MAX (4 << 20)

typedef struct mcp {
    CURL *easy;
    const char *url;
    char auth[600];
    char session[256];
    char *buf;
    size_t len;
    int too_big;
} mcp;

static size_t on_body(char *p, size_t size, size_t n, void *arg)
{
    mcp *m = arg;
    size_t add = size * n;
    char *nb;

    if (m->len + add > ANSWER_MAX) {
        m->too_big = 1;
        return 0;
    }
    if (!(nb = realloc(m->buf, m->len + add + 1)))
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

/* The JSON-RPC message of an answer: the body itself, or the last SSE `data:` line. */
static json_t *answer_json(const char *body)
{
    const char *last = NULL, *p = body;

    if (body[0] == '{')
        return json_loads(body, 0, NULL);
    while ((p = strstr(p, "data:"))) {
        last = p + 5;
        p += 5;
    }
    if (!last)
        return NULL;
    {
        size_t n = strcspn(last, "\r\n");
        return json_loadb(last, n, 0, NULL);
    }
}

/* One POST of msg (stolen); *out gets the JSON-RPC answer (NULL for notifications). 0, or
 * 1 after printing why. */
static int post(mcp *m, json_t *msg, json_t **out)
{
    struct curl_slist *h = NULL;
    char sess[300];
    char *body = json_dumps(msg, JSON_COMPACT);
    long status = 0;
    CURLcode cc;

    json_decref(msg);
    if (!body)
        return 1;
    free(m->buf);
    m->buf = NULL;
    m->len = 0;
    h = curl_slist_append(h, "Content-Type: application/json");
    h = curl_slist_append(h, "Accept: application/json, text/event-stream");
    h = curl_slist_append(h, "MCP-Protocol-Version: 2025-06-18");
    h = curl_slist_append(h, m->auth);
    if (m->session[0]) {
        snprintf(sess, sizeof(sess), "Mcp-Session-Id: %s", m->session);
        h = curl_slist_append(h, sess);
    }
    curl_easy_setopt(m->easy, CURLOPT_URL, m->url);
    curl_easy_setopt(m->easy, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(m->easy, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(m->easy, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(m->easy, CURLOPT_WRITEDATA, m);
    curl_easy_setopt(m->easy, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(m->easy, CURLOPT_HEADERDATA, m);
    curl_easy_setopt(m->easy, CURLOPT_TIMEOUT, 120L);
    curl_easy_setopt(m->easy, CURLOPT_CONNECTTIMEOUT, 10L);
    cc = curl_easy_perform(m->easy);
    curl_slist_free_all(h);
    free(body);
    if (cc != CURLE_OK) {
        fprintf(stderr, SF_MSG_CLI_GATEWAY_UNREACHABLE_FMT, m->url, curl_easy_strerror(cc));
        return 1;
    }
    curl_easy_getinfo(m->easy, CURLINFO_RESPONSE_CODE, &status);
    if (status == 401 || status == 403) {
        fprintf(stderr, SF_MSG_CLI_KEY_REFUSED_FMT,
                status);
        return 1;
    }
    if (!out)
        return 0;
    if (status != 200 || !m->buf || !(*out = answer_json(m->buf))) {
        fprintf(stderr, SF_MSG_CLI_NO_RESULT_FMT, status);
        return 1;
    }
    return 0;
}

static int mcp_open(mcp *m)
{
    const char *key = getenv("SANDFLEET_API_KEY");
    json_t *ans = NULL;

    memset(m, 0, sizeof(*m));
    if (!key || !*key) {
        fputs(SF_MSG_CLI_KEY_UNSET, stderr);
        return 1;
    }
    if (strlen(key) > 512) {
        fputs(SF_MSG_CLI_KEY_TOO_LONG, stderr);
        return 1;
    }
    m->url = getenv("SANDFLEET_URL");
    if (!m->url || !*m->url)
        m->url = cli_setting("SF_URL", CLI_DEFAULT_URL);
    snprintf(m->auth, sizeof(m->auth), "Authorization: Bearer %s", key);
    if (!(m->easy = curl_easy_init()))
        return 1;
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

/* tools/call; *structured gets the result's structuredContent. 0, 1 (printed why). */
static int call_tool(mcp *m, const char *tool, json_t *args, json_t **structured)
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
        fprintf(stderr, "%s\n", json_string_value(json_object_get(json_object_get(ans, "error"),
                                                                   "message")) ?: "The call failed.");
    } else if (json_is_true(json_object_get(res, "isError"))) {
        json_t *c0 = json_array_get(json_object_get(res, "content"), 0);
        fprintf(stderr, "%s\n", json_string_value(json_object_get(c0, "text")) ?: "The call failed.");
    } else {
        *structured = json_incref(json_object_get(res, "structuredContent"));
        ret = *structured ? 0 : 1;
    }
    json_decref(ans);
    return ret;
}

static json_t *find_template(json_t *list, const char *name)
{
    size_t i;
    json_t *t;

    json_array_foreach(json_object_get(list, "templates"), i, t)
        if (!strcmp(json_string_value(json_object_get(t, "name")) ?: "", name))
            return t;
    return NULL;
}

/* [#####-----] step 3/5 (12 s), redrawn in place on a terminal. */
static void progress(const char *step, time_t t0, int tty)
{
    int done = 0, total = 0, filled = 0;
    char bar[32];

    if (step && sscanf(step, "%d/%d", &done, &total) == 2 && total > 0)
        filled = (done - 1) * 20 / total;
    for (int i = 0; i < 20; i++)
        bar[i] = i < filled ? '#' : '-';
    bar[20] = '\0';
    fprintf(stderr, "%s[%s] %s%-12s (%lds)%s", tty ? "\r" : "", bar,
            step && total ? "step " : "", step ? step : "starting", (long)(time(NULL) - t0),
            tty ? "" : "\n");
    fflush(stderr);
}

static int parse_int(const char *s, const char *what, json_t *args)
{
    int64_t v;
    if (!s)
        return 0;
    if (sf_parse_i64(s, 1, 1 << 20, &v) < 0) {
        fprintf(stderr, "%s must be a positive number.\n", what);
        return -1;
    }
    json_object_set_new(args, what + 2, json_integer(v));
    return 0;
}

static int build(int argc, char **argv)
{
    const char *name = argc > 2 && argv[2][0] != '-' ? argv[2] : NULL;
    const char *from = cli_opt(argc, argv, "--from");
    json_t *args, *steps = json_array(), *res = NULL;
    int tty = isatty(2), ret = 1;
    time_t t0 = time(NULL);
    char last[64] = "";
    mcp m;

    if (!name || !from) {
        fputs("usage: sandfleet templates build NAME --from TEMPLATE [--step CMD]... [--vcpu N]\n"
              "         [--memory_mib N] [--disk_mib N] [--start-cmd CMD] [--ready-cmd CMD] [--no-wait]\n",
              stderr);
        json_decref(steps);
        return 2;
    }
    for (int i = 3; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--step"))
            json_array_append_new(steps, json_string(argv[++i]));
    args = json_pack("{s:s, s:s, s:o}", "name", name, "from", from, "run_steps", steps);
    if (cli_opt(argc, argv, "--start-cmd"))
        json_object_set_new(args, "start_cmd", json_string(cli_opt(argc, argv, "--start-cmd")));
    if (cli_opt(argc, argv, "--ready-cmd"))
        json_object_set_new(args, "ready_cmd", json_string(cli_opt(argc, argv, "--ready-cmd")));
    if (parse_int(cli_opt(argc, argv, "--vcpu"), "--vcpu", args) < 0 ||
        parse_int(cli_opt(argc, argv, "--memory_mib"), "--memory_mib", args) < 0 ||
        parse_int(cli_opt(argc, argv, "--disk_mib"), "--disk_mib", args) < 0) {
        json_decref(args);
        return 2;
    }
    if (mcp_open(&m) || call_tool(&m, "sandbox_template_create", args, &res))
        goto out;
    json_decref(res);
    res = NULL;
    fprintf(stderr, "building template '%s' from '%s'\n", name, from);
    if (cli_flag(argc, argv, "--no-wait")) {
        ret = 0;
        goto out;
    }
    for (;;) {
        json_t *t;
        const char *status, *step;
        if (call_tool(&m, "sandbox_template_list", json_pack("{s:s}", "name_prefix", name), &res))
            goto out;
        if (!(t = find_template(res, name))) {
            fprintf(stderr, "\nTemplate '%s' is no longer listed; build it again.\n", name);
            goto out;
        }
        status = json_string_value(json_object_get(t, "status")) ?: "";
        step = json_string_value(json_object_get(t, "step"));
        if (strcmp(status, "building") != 0) {
            if (tty)
                fputc('\n', stderr);
            if (!strcmp(status, "ready")) {
                printf("%s ready\n", name);
                ret = 0;
            } else {
                printf("%s %s: %s\n", name, status,
                       json_string_value(json_object_get(t, "error")) ?: "");
            }
            goto out;
        }
        if (tty || strcmp(last, step ? step : "") != 0)
            progress(step, t0, tty);
        snprintf(last, sizeof(last), "%s", step ? step : "");
        json_decref(res);
        res = NULL;
        usleep(500 * 1000);
    }
out:
    json_decref(res);
    mcp_close(&m);
    return ret;
}

static int list(int argc, char **argv)
{
    const char *prefix = cli_opt(argc, argv, "--prefix");
    json_t *res = NULL, *t;
    size_t i;
    mcp m;
    int ret = 1;

    if (mcp_open(&m) ||
        call_tool(&m, "sandbox_template_list",
                  prefix ? json_pack("{s:s}", "name_prefix", prefix) : json_object(), &res))
        goto out;
    printf("%-24s %-9s %-12s %-5s %-7s %-7s %s\n", "NAME", "STATUS", "FROM", "VCPU", "MEM_MIB",
           "DISK", "ERROR");
    json_array_foreach(json_object_get(res, "templates"), i, t)
        printf("%-24s %-9s %-12s %-5lld %-7lld %-7lld %.100s\n",
               json_string_value(json_object_get(t, "name")) ?: "",
               json_string_value(json_object_get(t, "status")) ?: "",
               json_string_value(json_object_get(t, "from")) ?: "-",
               (long long)json_integer_value(json_object_get(t, "vcpu")),
               (long long)json_integer_value(json_object_get(t, "memory_mib")),
               (long long)json_integer_value(json_object_get(t, "disk_mib")),
               json_string_value(json_object_get(t, "error")) ?: "");
    ret = 0;
out:
    json_decref(res);
    mcp_close(&m);
    return ret;
}

static int delete(int argc, char **argv)
{
    const char *name = argc > 2 && argv[2][0] != '-' ? argv[2] : NULL;
    json_t *res = NULL;
    mcp m;
    int ret = 1;

    if (!name) {
        fputs("usage: sandfleet templates delete NAME   delete one of your team's templates\n",
              stderr);
        return 2;
    }
    if (mcp_open(&m) ||
        call_tool(&m, "sandbox_template_delete", json_pack("{s:s}", "name", name), &res))
        goto out;
    printf("%s deleted\n", name);
    ret = 0;
out:
    json_decref(res);
    mcp_close(&m);
    return ret;
}

static int logs(int argc, char **argv)
{
    const char *team = cli_opt(argc, argv, "--team");
    const char *name = argc > 2 && argv[2][0] != '-' ? argv[2] : NULL;
    redisContext *rc;
    redisReply *r;
    char key[256];

    if (!team || !name) {
        fputs("usage: sandfleet templates logs NAME --team TEAM   the build log (operator)\n",
              stderr);
        return 2;
    }
    if (!(rc = cli_redis()))
        return 1;
    snprintf(key, sizeof(key), SF_RK_TEMPLATE_LOG, team, name);
    r = sf_redis_sync_cmd(rc, "GET %s", key);
    if (!cli_reply_ok(rc, r)) {
        sf_redis_sync_free(rc);
        return 1;
    }
    if (r->type != REDIS_REPLY_STRING) {
        fprintf(stderr, "Team '%s' has no build log for template '%s' (check the names with "
                "sandfleet templates list).\n", team, name);
        freeReplyObject(r);
        sf_redis_sync_free(rc);
        return 1;
    }
    fwrite(r->str, 1, r->len, stdout);
    freeReplyObject(r);
    sf_redis_sync_free(rc);
    return 0;
}

int cli_templates(int argc, char **argv)
{
    if (argc < 2 || cli_wants_help(argc, argv)) {
        fputs("usage: sandfleet templates build NAME --from TEMPLATE [--step CMD]... [--vcpu N]\n"
              "           [--memory_mib N] [--disk_mib N] [--start-cmd CMD] [--ready-cmd CMD]\n"
              "           [--no-wait]     build a team template (progress until ready or failed)\n"
              "       sandfleet templates list [--prefix P]   the team's templates and the built-ins\n"
              "       sandfleet templates delete NAME   delete one of the team's templates\n"
              "       sandfleet templates logs NAME --team TEAM   a build's log (operator)\n"
              "build, list and delete act as the team of $SANDFLEET_API_KEY through the gateway\n"
              "($SANDFLEET_URL, else SF_URL); logs reads Redis (SF_REDIS_URL).\n",
              argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "build"))
        return build(argc, argv);
    if (!strcmp(argv[1], "list"))
        return list(argc, argv);
    if (!strcmp(argv[1], "logs"))
        return logs(argc, argv);
    if (!strcmp(argv[1], "delete"))
        return delete(argc, argv);
    fprintf(stderr, "Unknown templates command '%s'; use build, list, delete or logs.\n", argv[1]);
    return 2;
}
