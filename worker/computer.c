/* computer.c: sandbox_computer: one GUI action in a 'desktop' sandbox (worker/templates/
 * tpl/build-desktop), then a fresh screenshot. The work inside the sandbox is the
 * worker's tpl/desktop/sandfleet-computer (xdotool, xrandr, scrot on the display :0),
 * read once beside sandfleet-worker and sent as each action's command through the driver's
 * exec (so it changes with the worker, not the template); the PNG comes back through the driver's file operation (the agent
 * reads it inside the sandbox) and leaves as MCP image content: the reply's `_image_png`
 * (base64) and `_text` fields, which the gateway turns into content items
 * (schemas/envelope.md); a large one travels by claim check like a big file read.
 *
 * Bounded: actions are rate-limited per sandbox (CU_RATE_MS, CU_BURST), a screenshot is
 * at most CU_SHOT_MAX bytes of PNG (past it the template's program downscales it), `wait`
 * at most CU_WAIT_MAX_MS, `type` at most 2048 characters (the schema). */
#include "worker.h"
#include "sf_log.h"
#include "sf_msg.h"
#include "sf_pvtoken.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CU_RATE_MS 100            /* on average one action per 100 ms per sandbox... */
#define CU_BURST 20               /* ...with bursts of up to 20 */
#define CU_SETTLE_MS 300          /* an input action's effect, before the screenshot */
#define CU_SHOT_MAX (32u << 20)   /* bytes of PNG in one answer */
#define CU_ACTION_MS 15000        /* an action's own time (input, settling)... */
#define CU_SHOT_MS 15000          /* ...and its screenshot's (both within the call's deadline) */
#define CU_WAIT_MAX_MS 10000
#define CU_WAIT_DEFAULT_MS 1000
#define CU_TYPE_MS_PER_BYTE 10    /* xdotool type's pace (6 ms a key), with room */
#define CU_KEYS_MAX 32            /* key combinations in one `key` */
#define CU_KEY_NAME_MAX 48
#define CU_CMD_MAX 4096
#define CU_PROG_MAX (16u << 10) /* tpl/desktop/sandfleet-computer, sent with each action */
#define CU_MSG_SHOT_LARGE                                                                     \
    "The screenshot stayed over 32 MiB even downscaled; resize the display smaller (action "  \
    "resize) and take another one."

typedef struct cu_op {
    wk_call *c;
    wk_ctx *ctx;
    char sandbox[SF_ID_MAX];
    char path[128];               /* the screenshot in the sandbox ("" = none asked) */
    char what[200];               /* "Clicked the left button at (640, 400)" */
    int input;                    /* the action sends input (its failure may be partial) */
    long w, h;                    /* the display's size */
    sf_buf png;
    uint64_t size;
} cu_op;

static void op_free(cu_op *o)
{
    if (!o)
        return;
    sf_buf_fini(&o->png);
    free(o);
}

static void fail(cu_op *o, const char *code, const char *message)
{
    wk_reply_error(o->c, code, message);
    op_free(o);
}

static wk_sandbox *sandbox_of(cu_op *o)
{
    wk_box *b = sf_map_get(o->ctx->sandboxes, o->sandbox);
    return b && b->state == WK_BOX_RUNNING ? b->sb : NULL;
}

static void input_failed(cu_op *o, const char *detail)
{
    char text[SF_MESSAGE_MAX];

    snprintf(text, sizeof(text), "The action may have been delivered, in full or in part (%s); "
             "take a screenshot before repeating it.", detail);
    fail(o, SF_ERR_UNAVAILABLE, text);
}

/* The action program (tpl/desktop/sandfleet-computer beside sandfleet-worker), read on
 * first use; NULL when it is missing. Loop thread only. */
static const char *program(void)
{
    static char *prog;
    static int tried;
    char path[4096];
    ssize_t len;
    char *slash;
    FILE *f;
    size_t n;

    if (tried)
        return prog;
    tried = 1;
    if ((len = readlink("/proc/self/exe", path, sizeof(path) - 64)) <= 0)
        return NULL;
    path[len] = '\0';
    if (!(slash = strrchr(path, '/')))
        return NULL;
    snprintf(slash + 1, 64, "tpl/desktop/sandfleet-computer");
    if (!(f = fopen(path, "re")))
        return NULL;
    if ((prog = malloc(CU_PROG_MAX + 1))) {
        n = fread(prog, 1, CU_PROG_MAX + 1, f);
        if (n == 0 || n > CU_PROG_MAX) {
            free(prog);
            prog = NULL;
        } else {
            prog[n] = '\0';
        }
    }
    fclose(f);
    if (!prog)
        sf_error("msg=\"tpl/desktop/sandfleet-computer beside sandfleet-worker is missing or "
                 "too large; sandbox_computer cannot run\" path=%s", path);
    return prog;
}

/* ---- key names ------------------------------------------------------------- */

/* The usual names agents use, as X key names (xdotool's). */
static const struct {
    const char *alias, *x;
} key_alias[] = {
    {"enter", "Return"}, {"return", "Return"}, {"esc", "Escape"}, {"escape", "Escape"},
    {"tab", "Tab"}, {"backspace", "BackSpace"}, {"delete", "Delete"}, {"del", "Delete"},
    {"space", "space"}, {"up", "Up"}, {"down", "Down"}, {"left", "Left"}, {"right", "Right"},
    {"pageup", "Page_Up"}, {"page_up", "Page_Up"}, {"pgup", "Page_Up"},
    {"pagedown", "Page_Down"}, {"page_down", "Page_Down"}, {"pgdn", "Page_Down"},
    {"home", "Home"}, {"end", "End"}, {"insert", "Insert"}, {"ins", "Insert"},
    {"cmd", "super"}, {"command", "super"}, {"win", "super"}, {"windows", "super"},
    {"super", "super"}, {"meta", "super"}, {"ctrl", "ctrl"}, {"control", "ctrl"},
    {"alt", "alt"}, {"option", "alt"}, {"shift", "shift"}, {"capslock", "Caps_Lock"},
    {"printscreen", "Print"}, {"print", "Print"}, {"menu", "Menu"},
};

/* One key name: an alias's X name, F1-F35 in any case, else itself when it is a plausible
 * X key name ([A-Za-z0-9_] or one printable character; sandfleet-keycheck checks it is
 * real). NULL when it cannot be one. */
static const char *key_name(const char *name, size_t len, char *buf, size_t n)
{
    if (!len || len >= n || len > CU_KEY_NAME_MAX)
        return NULL;
    memcpy(buf, name, len);
    buf[len] = '\0';
    for (size_t i = 0; i < SF_ARRAY_LEN(key_alias); i++)
        if (!strcasecmp(buf, key_alias[i].alias))
            return key_alias[i].x;
    if ((buf[0] == 'f' || buf[0] == 'F') && len >= 2 && len <= 3 && isdigit((unsigned char)buf[1]) &&
        (len == 2 || isdigit((unsigned char)buf[2]))) {
        buf[0] = 'F';
        return buf;
    }
    if (len == 1)
        return isgraph((unsigned char)buf[0]) ? buf : NULL;
    for (size_t i = 0; i < len; i++)
        if (!isalnum((unsigned char)buf[i]) && buf[i] != '_')
            return NULL;
    return buf;
}

/* text ("ctrl+s", "enter", "ctrl+shift+t alt+Tab") as xdotool's words, each single-quoted,
 * into out. 0, or -1 with the offending name in bad. */
static int keys_words(const char *text, char *out, size_t n, char *bad, size_t badn)
{
    const char *p = text;
    size_t len = 0;
    int combos = 0;

    out[0] = '\0';
    while (*p) {
        const char *end;
        while (*p == ' ' || *p == '\t' || *p == '\n')
            p++;
        if (!*p)
            break;
        end = p;
        while (*end && *end != ' ' && *end != '\t' && *end != '\n')
            end++;
        if (++combos > CU_KEYS_MAX) {
            snprintf(bad, badn, "(more than %d keys)", CU_KEYS_MAX);
            return -1;
        }
        if (len + 2 >= n)
            goto toolong;
        out[len++] = ' ';
        out[len++] = '\'';
        for (const char *q = p; q < end;) {
            /* a part ends at '+', except a '+' that is itself the key ("ctrl++") */
            const char *plus = q + 1 < end ? memchr(q + 1, '+', (size_t)(end - q - 1)) : NULL;
            size_t plen = (size_t)((plus ? plus : end) - q);
            char buf[CU_KEY_NAME_MAX + 2];
            const char *x = key_name(q, plen, buf, sizeof(buf));
            if (!x || !strcmp(x, "'")) {
                snprintf(bad, badn, "%.*s", (int)(plen > 48 ? 48 : plen), q);
                return -1;
            }
            if (len + strlen(x) + 3 >= n)
                goto toolong;
            if (q != p)
                out[len++] = '+';
            memcpy(out + len, x, strlen(x));
            len += strlen(x);
            q = plus ? plus + 1 : end;
        }
        out[len++] = '\'';
        out[len] = '\0';
        p = end;
    }
    if (!combos) {
        snprintf(bad, badn, "(none)");
        return -1;
    }
    return 0;
toolong:
    snprintf(bad, badn, "(too many keys)");
    return -1;
}

/* ---- the screenshot -------------------------------------------------------- */

static void on_dropped(void *arg, const wk_file_result *res)
{
    (void)arg, (void)res;
}

/* The answer: the image, its line of text, {width, height} (display pixels). */
static void answer(cu_op *o)
{
    char text[320];
    json_t *r;

    snprintf(text, sizeof(text), "%s (%ldx%ld)", o->what, o->w, o->h);
    r = json_pack("{s:I, s:I, s:s}", "width", (json_int_t)o->w, "height", (json_int_t)o->h,
                  "_text", text);
    if (r && o->png.len) {
        json_t *img = wk_json_base64(o->png.p, o->png.len);
        if (!img) {
            json_decref(r);
            fail(o, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
            return;
        }
        json_object_set_new(r, "_image_png", img);
    }
    if (!r) {
        fail(o, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
        return;
    }
    wk_touch(o->ctx, o->sandbox);
    wk_reply_result(o->c, r);
    op_free(o);
}

static void read_next(cu_op *o);

static void on_read(void *arg, const wk_file_result *res)
{
    cu_op *o = arg;
    wk_sandbox *sb;

    if (res->error) {
        char d[SF_MESSAGE_MAX - 160];
        snprintf(d, sizeof(d), "The screenshot could not be read back (%s); take another one.",
                 res->error);
        fail(o, SF_ERR_UNAVAILABLE, d);
        return;
    }
    if (res->size > CU_SHOT_MAX || o->png.len + res->data_len > CU_SHOT_MAX) {
        fail(o, SF_ERR_LIMIT, CU_MSG_SHOT_LARGE);
        return;
    }
    if (sf_buf_append(&o->png, res->data ? res->data : "", res->data_len) < 0) {
        fail(o, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
        return;
    }
    if (res->data_len && o->png.len < o->size) {
        read_next(o);
        return;
    }
    if ((sb = sandbox_of(o))) { /* the file goes (best effort) */
        wk_file_req del = {.op = WK_FILE_DELETE, .path = o->path};
        o->ctx->ops->file(sb, &del, on_dropped, NULL);
    }
    if (o->png.len < 24 || memcmp(o->png.p, "\x89PNG\r\n\x1a\n", 8) != 0) {
        fail(o, SF_ERR_UNAVAILABLE, "The screenshot is not a PNG (the desktop's screenshot "
                                    "program failed); take another one.");
        return;
    }
    if (o->w == 0 || o->h == 0) { /* a plain screenshot: the display's size is the PNG's */
        const unsigned char *p = (const unsigned char *)o->png.p + 16;
        o->w = (long)((uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]);
        o->h = (long)((uint32_t)p[4] << 24 | (uint32_t)p[5] << 16 | (uint32_t)p[6] << 8 | p[7]);
    }
    answer(o);
}

static void read_next(cu_op *o)
{
    wk_sandbox *sb = sandbox_of(o);
    wk_file_req req = {.op = WK_FILE_READ, .path = o->path, .off = o->png.len,
                       .len = WK_FILE_CHUNK, .flags = WK_FILE_NOFOLLOW};
    int rc;

    if (!sb) {
        fail(o, SF_ERR_NOT_FOUND, "The sandbox was killed; create a new one with sandbox_create.");
        return;
    }
    if ((rc = o->ctx->ops->file(sb, &req, on_read, o)) < 0)
        fail(o, rc == -EBUSY ? SF_ERR_LIMIT : SF_ERR_UNAVAILABLE,
             rc == -EBUSY ? "The sandbox has too many file requests in flight; retry in a moment."
                          : "The sandbox did not accept the screenshot's read; take another "
                            "screenshot, or create a new sandbox.");
}

/* ---- stream_url ------------------------------------------------------------- */

/* The live view: noVNC served by websockify in the sandbox (tpl/desktop/sandfleet-desktop:
 * 127.0.0.1:6080 for a viewer that may use the desktop, 6081 through a filter that drops
 * every key, pointer, clipboard and resize message for view_only) through a preview URL
 * of that port (preview.c), under the sandbox's preview policy: a public sandbox's URL,
 * or a private one's signed link, good for an hour (its token only in that first URL; the
 * gateway trades it for a host-only cookie). The VNC server has no password: nothing but
 * the preview ingress reaches it, so no URL carries a reusable secret. */
#define CU_STREAM_PORT 6080
#define CU_STREAM_VIEW_PORT 6081
#define CU_STREAM_EXPIRES_S 3600

static void on_stream_published(wk_call *c, const char *url, const char *token, int64_t exp)
{
    int view_only = json_is_true(json_object_get(c->job.args, "view_only"));
    char full[SF_PV_URL_MAX + SF_PV_TOKEN_MAX + 128], at[32];
    json_t *r;
    int n;

    /* noVNC's own page: connect at once, scale to the window (never resize the display the
     * agent sees), the WebSocket on the same host */
    n = snprintf(full, sizeof(full), "%svnc.html?autoconnect=1&resize=scale&reconnect=1&"
                 "path=websockify%s%s%s", url, view_only ? "&view_only=1" : "",
                 token ? "&sf_token=" : "", token ? token : "");
    if (n < 0 || (size_t)n >= sizeof(full)) {
        wk_reply_error(c, SF_ERR_INTERNAL, "The live view's URL is too long; set a shorter "
                       "preview_domain on the worker.");
        return;
    }
    r = json_pack("{s:s, s:b, s:s}", "url", full, "view_only", view_only, "_text", full);
    if (r && token) {
        time_t t = (time_t)exp;
        struct tm tm;
        gmtime_r(&t, &tm);
        strftime(at, sizeof(at), "%Y-%m-%dT%H:%M:%SZ", &tm);
        json_object_set_new(r, "expires_at", json_string(at));
    }
    if (!r) {
        wk_reply_error(c, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
        return;
    }
    wk_touch(c->ctx, c->job.sandbox);
    wk_reply_result(c, r);
}

static void stream_url(wk_call *c, wk_box *b)
{
    int view_only = json_is_true(json_object_get(c->job.args, "view_only"));

    if (wk_preview_publish(c, b, view_only ? CU_STREAM_VIEW_PORT : CU_STREAM_PORT,
                           CU_STREAM_EXPIRES_S, on_stream_published) < 0)
        wk_reply_error(c, SF_ERR_INTERNAL, "The live view could not be published; retry.");
}

/* ---- the action ------------------------------------------------------------ */

static void on_action_done(void *arg, const wk_exec_result *res)
{
    cu_op *o = arg;

    sf_buf_reset(&o->png);
    char line[128] = "", text[SF_MESSAGE_MAX], word[16] = "";
    const char *last;
    unsigned long long bytes = 0;
    long w = 0, h = 0;

    if (res->error) {
        if (o->input)
            input_failed(o, res->error);
        else
            fail(o, SF_ERR_UNAVAILABLE, res->error);
        return;
    }
    /* the last line of its output says what happened (tpl/desktop/sandfleet-computer) */
    if (res->out_len) {
        size_t n = res->out_len;
        while (n && res->out[n - 1] == '\n')
            n--;
        last = res->out + n;
        while (last > res->out && last[-1] != '\n')
            last--;
        n = (size_t)(res->out + n - last);
        snprintf(line, sizeof(line), "%.*s", (int)(n < sizeof(line) ? n : sizeof(line) - 1), last);
    }
    sscanf(line, "%15s %ld %ld %llu", word, &w, &h, &bytes);
    if (res->timed_out) {
        if (o->input)
            input_failed(o, "the desktop did not answer in time");
        else
            fail(o, SF_ERR_UNAVAILABLE, "The desktop did not answer in time; retry, and check "
                                        "its load with sandbox_exec (ps aux).");
        return;
    }
    if (res->exit_code == 3 && !strcmp(word, "offscreen")) {
        snprintf(text, sizeof(text), "A coordinate is off the screen: the display is %ldx%ld, "
                 "so x goes from 0 to %ld and y from 0 to %ld (display pixels); take a "
                 "screenshot to see it. Nothing was sent.", w, h, w - 1, h - 1);
        fail(o, SF_ERR_INVALID, text);
        return;
    }
    if (res->exit_code == 4 && !strcmp(word, "nokey")) {
        snprintf(text, sizeof(text), "Unknown key name '%.48s'; use X key names or the usual "
                 "aliases (Return or enter, Escape or esc, Tab, BackSpace, Delete, Up, "
                 "Page_Down, F5, ctrl+s, alt+Tab, cmd or win for super). Nothing was typed.",
                 line + 6);
        fail(o, SF_ERR_INVALID, text);
        return;
    }
    if (res->exit_code == 5 || res->exit_code == 127 || !strcmp(word, "nodisplay")) {
        fail(o, SF_ERR_UNAVAILABLE, "The sandbox's display is not running (it was stopped, or "
                                    "is still starting); start it again with sandbox_exec "
                                    "'sandfleet-desktop', then retry.");
        return;
    }
    if (res->exit_code != 0 || (strcmp(word, "shot") && strcmp(word, "done")) || w < 0 ||
        h < 0 || (!strcmp(word, "done") && (w == 0 || h == 0))) {
        char d[200];
        snprintf(d, sizeof(d), "the input program failed: %.*s", (int)(res->err_len > 120 ? 120
                 : res->err_len), res->err ? res->err : "");
        for (char *p = d; *p; p++)
            if (*p == '\n' || *p == '\r')
                *p = ' ';
        if (o->input)
            input_failed(o, d);
        else
            fail(o, SF_ERR_UNAVAILABLE, "The screenshot failed; retry, and check the desktop "
                                        "with sandbox_exec (ps aux).");
        return;
    }
    o->w = w;
    o->h = h;
    if (!strcmp(word, "done")) {
        answer(o);
        return;
    }
    if (bytes == 0 || bytes > CU_SHOT_MAX) {
        fail(o, SF_ERR_LIMIT, CU_MSG_SHOT_LARGE);
        return;
    }
    o->size = bytes;
    read_next(o);
}

/* coordinate-like argument [x, y] into x, y: 1 when given, 0 when absent. */
static int coord(const json_t *a, const char *name, long *x, long *y)
{
    json_t *v = json_object_get(a, name);

    if (!json_is_array(v) || json_array_size(v) != 2)
        return 0;
    *x = (long)json_integer_value(json_array_get(v, 0));
    *y = (long)json_integer_value(json_array_get(v, 1));
    return 1;
}

/* 0 when the sandbox may run one more action now (GCRA: CU_RATE_MS apart on average,
 * CU_BURST at once), else the milliseconds to wait. */
static int64_t rate_wait(wk_box *b)
{
    int64_t now = sf_mono_ms(), tat = b->computer_tat_ms > now ? b->computer_tat_ms : now;

    if (tat - now > (int64_t)(CU_BURST - 1) * CU_RATE_MS)
        return tat - now - (int64_t)(CU_BURST - 1) * CU_RATE_MS;
    b->computer_tat_ms = tat + CU_RATE_MS;
    return 0;
}

static void do_computer(wk_call *c, wk_box *b)
{
    json_t *a = c->job.args;
    const char *act = json_string_value(json_object_get(a, "action"));
    const char *text = json_string_value(json_object_get(a, "text"));
    int shot = !json_is_false(json_object_get(a, "screenshot_after"));
    char cmd[CU_CMD_MAX], args[CU_CMD_MAX - 256] = "", msg[SF_MESSAGE_MAX], bad[64];
    long x = 0, y = 0, sx = 0, sy = 0;
    int has = coord(a, "coordinate", &x, &y);
    int64_t timeout = CU_ACTION_MS, left, wait;
    wk_exec_req req = {0};
    cu_op *o;
    int rc;

    if (!act)
        act = "";
    if (strcmp(b->template_name, "desktop") != 0) {
        if (!(c->ctx->ops->caps & WK_CAP_DESKTOP))
            snprintf(msg, sizeof(msg), "Sandbox %s runs on a %s host, which has no desktop: "
                     "sandbox_computer needs a sandbox made from the 'desktop' template, which "
                     "runs on jail hosts only; ask the operator for one.", b->id,
                     c->ctx->ops->name);
        else
            snprintf(msg, sizeof(msg), "Sandbox %s was made from the '%.63s' template, which "
                     "has no desktop: sandbox_computer needs a sandbox made from the 'desktop' "
                     "template (sandbox_create with from_template 'desktop').", b->id,
                     b->template_name);
        wk_reply_error(c, SF_ERR_INVALID, msg);
        return;
    }
    if (!strcmp(act, "stream_url")) {
        stream_url(c, b);
        return;
    }
    if ((wait = rate_wait(b)) > 0) {
        snprintf(msg, sizeof(msg), "Too many sandbox_computer actions on sandbox %s (at most "
                 "%d a second, %d at once); retry in %lld ms.", b->id, 1000 / CU_RATE_MS,
                 CU_BURST, (long long)wait);
        wk_reply_error(c, SF_ERR_LIMIT, msg);
        return;
    }
    if (!(o = calloc(1, sizeof(*o)))) {
        wk_reply_error(c, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
        return;
    }
    o->c = c;
    o->ctx = c->ctx;
    snprintf(o->sandbox, sizeof(o->sandbox), "%s", b->id);
    sf_buf_init(&o->png, CU_SHOT_MAX);
    o->input = 1;
#define NEED_COORD(what)                                                                     \
    do {                                                                                     \
        if (!has) {                                                                          \
            fail(o, SF_ERR_INVALID, "Action " what " needs coordinate [x, y] (display "      \
                                    "pixels; take a screenshot to find them).");             \
            return;                                                                          \
        }                                                                                    \
    } while (0)
#define AT(buf, n) (has ? snprintf(buf, n, " %ld %ld", x, y) : snprintf(buf, n, "%s", ""))
    if (!strcmp(act, "screenshot")) {
        o->input = 0;
        shot = 1;
        snprintf(args, sizeof(args), "shot");
        snprintf(o->what, sizeof(o->what), "Took a screenshot");
    } else if (!strcmp(act, "left_click") || !strcmp(act, "right_click") ||
               !strcmp(act, "middle_click") || !strcmp(act, "double_click") ||
               !strcmp(act, "triple_click")) {
        int button = act[0] == 'r' ? 3 : act[0] == 'm' ? 2 : 1;
        int count = act[0] == 'd' ? 2 : act[0] == 't' ? 3 : 1;
        char at[48];
        static const char *const times[] = {"", "Clicked", "Double-clicked", "Triple-clicked"};
        AT(at, sizeof(at));
        snprintf(args, sizeof(args), "click %d %d%s", button, count, at);
        if (has)
            snprintf(o->what, sizeof(o->what), "%s the %s button at (%ld, %ld)", times[count],
                     button == 3 ? "right" : button == 2 ? "middle" : "left", x, y);
        else
            snprintf(o->what, sizeof(o->what), "%s the %s button", times[count],
                     button == 3 ? "right" : button == 2 ? "middle" : "left");
    } else if (!strcmp(act, "left_click_drag")) {
        if (!has || !coord(a, "start_coordinate", &sx, &sy)) {
            fail(o, SF_ERR_INVALID, "Action left_click_drag needs start_coordinate [x, y] and "
                                    "coordinate [x, y] (where the drag starts and ends).");
            return;
        }
        snprintf(args, sizeof(args), "drag %ld %ld %ld %ld", sx, sy, x, y);
        snprintf(o->what, sizeof(o->what), "Dragged from (%ld, %ld) to (%ld, %ld)", sx, sy, x, y);
    } else if (!strcmp(act, "left_mouse_down") || !strcmp(act, "left_mouse_up")) {
        int down = !strcmp(act, "left_mouse_down");
        char at[48];
        AT(at, sizeof(at));
        snprintf(args, sizeof(args), "%s%s", down ? "down" : "up", at);
        snprintf(o->what, sizeof(o->what), "%s the left button", down ? "Pressed" : "Released");
        if (has)
            snprintf(o->what, sizeof(o->what), "%s the left button at (%ld, %ld)",
                     down ? "Pressed" : "Released", x, y);
    } else if (!strcmp(act, "mouse_move")) {
        NEED_COORD("mouse_move");
        snprintf(args, sizeof(args), "move %ld %ld", x, y);
        snprintf(o->what, sizeof(o->what), "Moved the mouse to (%ld, %ld)", x, y);
    } else if (!strcmp(act, "key")) {
        if (!text || !*text) {
            fail(o, SF_ERR_INVALID, "Action key needs text: the key or combination, e.g. "
                                    "'Return', 'ctrl+s' or 'alt+Tab'.");
            return;
        }
        if (keys_words(text, args + 4, sizeof(args) - 4, bad, sizeof(bad)) < 0) {
            snprintf(msg, sizeof(msg), "Unknown key name '%s' in text; use X key names or "
                     "the usual aliases (Return or enter, Escape or esc, Tab, BackSpace, Up, "
                     "Page_Down, F5, ctrl+s, alt+Tab, cmd or win for super). Nothing was "
                     "typed.", bad);
            fail(o, SF_ERR_INVALID, msg);
            return;
        }
        memcpy(args, "key ", 4); /* "key " + " 'ctrl+s'" */
        snprintf(o->what, sizeof(o->what), "Pressed %.160s", text);
    } else if (!strcmp(act, "type")) {
        if (!text || !*text) {
            fail(o, SF_ERR_INVALID, "Action type needs text: the characters to type.");
            return;
        }
        req.has_stdin = 1;
        req.stdin_data = text;
        req.stdin_len = strlen(text);
        timeout += (int64_t)req.stdin_len * CU_TYPE_MS_PER_BYTE;
        snprintf(args, sizeof(args), "type");
        snprintf(o->what, sizeof(o->what), "Typed %zu characters", json_string_length(
                 json_object_get(a, "text")));
    } else if (!strcmp(act, "scroll")) {
        const char *dir = json_string_value(json_object_get(a, "scroll_direction"));
        json_int_t n = json_integer_value(json_object_get(a, "scroll_amount"));
        int button = !dir ? 0 : !strcmp(dir, "up") ? 4 : !strcmp(dir, "down") ? 5
                   : !strcmp(dir, "left") ? 6 : !strcmp(dir, "right") ? 7 : 0;
        char at[48];
        if (!button) {
            fail(o, SF_ERR_INVALID, "Action scroll needs scroll_direction: up, down, left or "
                                    "right.");
            return;
        }
        if (!json_object_get(a, "scroll_amount"))
            n = 3;
        AT(at, sizeof(at));
        snprintf(args, sizeof(args), "scroll %d %lld%s", button, (long long)n, at);
        if (has)
            snprintf(o->what, sizeof(o->what), "Scrolled %s by %lld at (%ld, %ld)", dir,
                     (long long)n, x, y);
        else
            snprintf(o->what, sizeof(o->what), "Scrolled %s by %lld", dir, (long long)n);
    } else if (!strcmp(act, "wait")) {
        json_t *d = json_object_get(a, "duration_ms");
        json_int_t ms = d ? json_integer_value(d) : CU_WAIT_DEFAULT_MS;
        if (ms > CU_WAIT_MAX_MS)
            ms = CU_WAIT_MAX_MS;
        if (ms < 0)
            ms = 0;
        o->input = 0;
        timeout += ms;
        snprintf(args, sizeof(args), "wait %lld", (long long)ms);
        snprintf(o->what, sizeof(o->what), "Waited %lld ms%s", (long long)ms,
                 d && json_integer_value(d) > CU_WAIT_MAX_MS ? " (the most a wait takes)" : "");
    } else if (!strcmp(act, "resize")) {
        json_t *wj = json_object_get(a, "width"), *hj = json_object_get(a, "height");
        json_int_t w = json_integer_value(wj), h = json_integer_value(hj);
        if (!json_is_integer(wj) || !json_is_integer(hj) || w < 320 || w > 8192 || w % 8 ||
            h < 200 || h > 8192) {
            fail(o, SF_ERR_INVALID, "Action resize needs width (a multiple of 8 from 320 to "
                                    "8192) and height (200 to 8192), in pixels.");
            return;
        }
        snprintf(args, sizeof(args), "resize %lld %lld", (long long)w, (long long)h);
        snprintf(o->what, sizeof(o->what), "Resized the display to %lldx%lld", (long long)w,
                 (long long)h);
    } else {
        fail(o, SF_ERR_INVALID, "Unknown action; use screenshot, left_click, right_click, "
                                "middle_click, double_click, triple_click, left_click_drag, "
                                "left_mouse_down, left_mouse_up, mouse_move, key, type, scroll, "
                                "wait, resize or stream_url.");
        return;
    }
#undef NEED_COORD
#undef AT
    if (shot)
        snprintf(o->path, sizeof(o->path), "/tmp/.sandfleet-computer/%s.png", c->job.id);
    for (const char *p = o->path; *p; p++) /* (job ids are [A-Za-z0-9_-]; keep it so) */
        if (!isalnum((unsigned char)*p) && !strchr("/._-", *p)) {
            fail(o, SF_ERR_INVALID, "The job id cannot name a file; send the call again.");
            return;
        }
    if (!program()) {
        fail(o, SF_ERR_INTERNAL, "This host's worker is missing its sandbox_computer program "
                                 "(tpl/desktop/sandfleet-computer); tell the operator.");
        return;
    }
    snprintf(cmd, sizeof(cmd), "set -- '%s' %d %u %s\n", shot ? o->path : "-",
             o->input ? CU_SETTLE_MS : 0, CU_SHOT_MAX, args);
    if (sf_buf_append(&o->png, cmd, strlen(cmd)) < 0 ||
        sf_buf_append(&o->png, program(), strlen(program()) + 1) < 0) {
        fail(o, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
        return;
    }
    if (shot) /* a large display's screenshot (grabbed, encoded, maybe downscaled) takes
                 seconds, and more on a loaded host */
        timeout += CU_SHOT_MS;
    left = c->job.deadline_ms - sf_now_ms() - 200; /* the caller stops waiting then */
    if (timeout > left)
        timeout = left > 1 ? left : 1;
    req.command = o->png.p; /* (the buffer holds the command until the PNG comes) */
    req.timeout_ms = (uint32_t)timeout;
    if ((rc = c->ctx->ops->exec(b->sb, &req, on_action_done, o)) < 0)
        fail(o, rc == -EBUSY ? SF_ERR_LIMIT : SF_ERR_UNAVAILABLE,
             rc == -EBUSY ? "The sandbox already runs 64 commands, so the action cannot start; "
                            "wait for some to finish, then retry."
                          : "The sandbox did not accept the action; retry, or create a new "
                            "sandbox.");
}

WK_HANDLERS({"sandbox_computer", do_computer});
