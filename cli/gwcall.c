/* gwcall.c: the CLI's MCP client of the gateway (gwcall.h), shared by `templates` and
 * `servers`. */
#include "gwcall.h"
#include "cli.h"
#include "sf_msg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define ANSWER_MAX (4 << 20)

static size_t on_body(char *p, size_t size, size_t n, void *arg)
{
    cli_gw *m = arg;
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
    cli_gw *m = arg;
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

int cli_gw_http(cli_gw *m, const char *method, const char *url, const char *body, int is_mcp,
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
    curl_easy_setopt(m->easy, CURLOPT_TIMEOUT, m->timeout_s);
    curl_easy_setopt(m->easy, CURLOPT_CONNECTTIMEOUT, 10L);
    cc = curl_easy_perform(m->easy);
    curl_slist_free_all(h);
    if (cc != CURLE_OK) {
        fprintf(stderr, SF_MSG_CLI_GATEWAY_UNREACHABLE_FMT, url, curl_easy_strerror(cc));
        return 1;
    }
    curl_easy_getinfo(m->easy, CURLINFO_RESPONSE_CODE, status);
    if (*status == 401 || *status == 403) {
        fprintf(stderr, SF_MSG_CLI_KEY_REFUSED_FMT, *status);
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

/* One POST of msg (stolen) to the MCP endpoint; *out (NULL for a notification) the
 * JSON-RPC answer. 0, or 1 after printing why. */
static int post(cli_gw *m, json_t *msg, json_t **out)
{
    char *body = json_dumps(msg, JSON_COMPACT);
    long status = 0;
    int rc;

    json_decref(msg);
    if (!body)
        return 1;
    rc = cli_gw_http(m, "POST", m->url, body, 1, &status);
    free(body);
    if (rc || !out)
        return rc;
    if (status != 200 || !(*out = answer_json(m->buf))) {
        fprintf(stderr, SF_MSG_CLI_NO_RESULT_FMT, status);
        return 1;
    }
    return 0;
}

int cli_gw_open(cli_gw *m, int need_session)
{
    const char *key = getenv("SANDFLEET_API_KEY"), *url = getenv("SANDFLEET_URL");
    json_t *ans = NULL;
    size_t n;

    memset(m, 0, sizeof(*m));
    m->timeout_s = 120;
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

void cli_gw_close(cli_gw *m)
{
    if (m->easy)
        curl_easy_cleanup(m->easy);
    m->easy = NULL;
    free(m->buf);
    m->buf = NULL;
}

int cli_gw_call(cli_gw *m, const char *tool, json_t *args, json_t **structured, int quiet)
{
    static int id = 2;
    json_t *ans = NULL, *res;
    int ret = 1;

    if (post(m, json_pack("{s:s, s:i, s:s, s:{s:s, s:o}}", "jsonrpc", "2.0", "id", id++,
                          "method", "tools/call", "params", "name", tool, "arguments", args),
             &ans))
        return 1;
    res = json_object_get(ans, "result");
    m->err[0] = '\0';
    if (!res || json_is_true(json_object_get(res, "isError"))) {
        const char *why = res ? json_string_value(json_object_get(
                                    json_array_get(json_object_get(res, "content"), 0), "text"))
                              : json_string_value(
                                    json_object_get(json_object_get(ans, "error"), "message"));
        snprintf(m->err, sizeof(m->err), "%s", why ? why : "The call failed.");
        if (!quiet)
            fprintf(stderr, "%s\n", m->err);
    } else {
        if (structured)
            *structured = json_incref(json_object_get(res, "structuredContent"));
        ret = 0;
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

int cli_gw_template_wait(cli_gw *m, const char *name, int show)
{
    int tty = show && isatty(2);
    time_t t0 = time(NULL);
    char last[64] = "";
    json_t *res = NULL;
    int ret = 1;

    for (;;) {
        json_t *t;
        const char *status, *step;
        if (cli_gw_call(m, "sandbox_template_list", json_pack("{s:s}", "name_prefix", name), &res,
                        0))
            break;
        if (!(t = find_template(res, name))) {
            fprintf(stderr, "%sTemplate '%s' is no longer listed; build it again.\n",
                    tty ? "\n" : "", name);
            break;
        }
        status = json_string_value(json_object_get(t, "status")) ?: "";
        step = json_string_value(json_object_get(t, "step"));
        if (strcmp(status, "building") != 0) {
            if (tty)
                fputc('\n', stderr);
            if (!strcmp(status, "ready")) {
                ret = 0;
            } else {
                printf("%s %s: %s\n", name, status,
                       json_string_value(json_object_get(t, "error")) ?: "");
            }
            break;
        }
        if (show && (tty || strcmp(last, step ? step : "") != 0))
            progress(step, t0, tty);
        snprintf(last, sizeof(last), "%s", step ? step : "");
        json_decref(res);
        res = NULL;
        usleep(500 * 1000);
    }
    json_decref(res);
    return ret;
}
