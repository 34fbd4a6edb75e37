/* connect.c: `sandfleet connect CLIENT [--write]` — the configuration that connects an MCP
 * client to sandfleet: printed (stdout: exactly the file's content or the command line;
 * stderr: where it goes and what to set), or with --write merged into the client's file
 * without touching anything else in it. Keys stay out of files wherever the client can
 * read them from elsewhere: an environment variable (Claude Code, Cursor, Windsurf, Codex)
 * or a password prompt (VS Code). Only Claude Desktop, which can do neither, gets the key
 * in its (private, 0600) user file. */
#include "cli.h"
#include "sf_util.h"
#include "toml.h"
#include "sf_msg.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FILE_MAX (4u << 20) /* a client config file we are willing to edit */
#define KEY_ENV "SANDFLEET_API_KEY"
#define VSCODE_INPUT "sandfleet-api-key"
#define SERVER_NAME "sandfleet"

typedef struct conn {
    const char *url;
    const char *key;      /* NULL when unknown */
    char program[PATH_MAX]; /* this sandfleet, for clients that start mcp-stdio */
    int global;
} conn;

typedef struct client {
    const char *id, *title;
    const char *section;                      /* JSON: the servers object; NULL: TOML */
    json_t *(*entry)(const conn *c);          /* the server's entry */
    int (*path)(const conn *c, char *out, size_t n); /* where --write merges; -ENOENT: none */
    const char *after;                        /* what to do once it is in place */
} client;

static const char usage[] =
    "usage: sandfleet connect CLIENT [--write] [--global] [--file PATH] [--url URL] [--key KEY]\n"
    "  Prints the configuration that connects CLIENT to sandfleet; --write merges it into\n"
    "  the client's file (or --file PATH), keeping everything else there.\n"
    "  claude-code     Claude Code: a `claude mcp add` line; --write: ./.mcp.json\n"
    "  claude-desktop  Claude Desktop, through sandfleet mcp-stdio: its user config file\n"
    "  cursor          Cursor: ./.cursor/mcp.json (--global: ~/.cursor/mcp.json)\n"
    "  vscode          VS Code: ./.vscode/mcp.json (--global: the user mcp.json); asks for the\n"
    "                  key with a password prompt\n"
    "  windsurf        Windsurf: ~/.codeium/windsurf/mcp_config.json\n"
    "  codex           Codex: a `codex mcp add` line and its TOML; --write: ~/.codex/config.toml\n"
    "  URL: --url, else $SANDFLEET_URL, else SF_URL from $SF_HOME/env, else " CLI_DEFAULT_URL "\n"
    "  key: --key, else $" KEY_ENV ". Files get a reference to $" KEY_ENV " (VS Code: a\n"
    "  prompt), never the key, except Claude Desktop's, which cannot read either.\n";

/* ---- paths ---- */

static int home_path(char *out, size_t n, const char *rest)
{
    const char *home = getenv("HOME");

    if (!home || !*home)
        return -ENOENT;
    return snprintf(out, n, "%s/%s", home, rest) < (int)n ? 0 : -ENAMETOOLONG;
}

static int config_path(char *out, size_t n, const char *rest) /* $XDG_CONFIG_HOME or ~/.config */
{
    const char *xdg = getenv("XDG_CONFIG_HOME");
    char sub[PATH_MAX];

    if (xdg && *xdg == '/')
        return snprintf(out, n, "%s/%s", xdg, rest) < (int)n ? 0 : -ENAMETOOLONG;
#ifdef __APPLE__
    snprintf(sub, sizeof(sub), "Library/Application Support/%s", rest);
#else
    snprintf(sub, sizeof(sub), ".config/%s", rest);
#endif
    return home_path(out, n, sub);
}

static int project_path(char *out, size_t n, const char *rest)
{
    return snprintf(out, n, "%s", rest) < (int)n ? 0 : -ENAMETOOLONG;
}

static int path_claude_code(const conn *c, char *out, size_t n)
{
    return c->global ? -ENOENT : project_path(out, n, ".mcp.json");
}

static int path_claude_desktop(const conn *c, char *out, size_t n)
{
    return config_path(out, n, "Claude/claude_desktop_config.json");
}

static int path_cursor(const conn *c, char *out, size_t n)
{
    return c->global ? home_path(out, n, ".cursor/mcp.json") : project_path(out, n, ".cursor/mcp.json");
}

static int path_vscode(const conn *c, char *out, size_t n)
{
    return c->global ? config_path(out, n, "Code/User/mcp.json")
                     : project_path(out, n, ".vscode/mcp.json");
}

static int path_windsurf(const conn *c, char *out, size_t n)
{
    return home_path(out, n, ".codeium/windsurf/mcp_config.json");
}

static int path_codex(const conn *c, char *out, size_t n)
{
    const char *ch = getenv("CODEX_HOME");

    if (ch && *ch)
        return snprintf(out, n, "%s/config.toml", ch) < (int)n ? 0 : -ENAMETOOLONG;
    return home_path(out, n, ".codex/config.toml");
}

/* ---- entries ---- */

static json_t *entry_claude_code(const conn *c)
{
    return json_pack("{s:s, s:s, s:{s:s}}", "type", "http", "url", c->url, "headers",
                     "Authorization", "Bearer ${" KEY_ENV "}");
}

static json_t *entry_claude_desktop(const conn *c)
{
    return json_pack("{s:s, s:[s, s], s:{s:s}}", "command", c->program, "args", "mcp-stdio",
                     c->url, "env", KEY_ENV, c->key ? c->key : "sf_live_...");
}

static json_t *entry_cursor(const conn *c)
{
    return json_pack("{s:s, s:{s:s}}", "url", c->url, "headers", "Authorization",
                     "Bearer ${env:" KEY_ENV "}");
}

static json_t *entry_vscode(const conn *c)
{
    return json_pack("{s:s, s:s, s:{s:s}}", "type", "http", "url", c->url, "headers",
                     "Authorization", "Bearer ${input:" VSCODE_INPUT "}");
}

static json_t *entry_windsurf(const conn *c)
{
    return json_pack("{s:s, s:{s:s}}", "serverUrl", c->url, "headers", "Authorization",
                     "Bearer ${env:" KEY_ENV "}");
}

static json_t *vscode_input(void)
{
    return json_pack("{s:s, s:s, s:s, s:b}", "type", "promptString", "id", VSCODE_INPUT,
                     "description", "sandfleet API key (sf_live_...)", "password", 1);
}

static const client clients[] = {
    {"claude-code", "Claude Code", "mcpServers", entry_claude_code, path_claude_code,
     "Claude Code reads the key from $" KEY_ENV " (export it before starting claude)."},
    {"claude-desktop", "Claude Desktop", "mcpServers", entry_claude_desktop, path_claude_desktop,
     "Restart Claude Desktop. It starts sandfleet mcp-stdio, which forwards to the gateway."},
    {"cursor", "Cursor", "mcpServers", entry_cursor, path_cursor,
     "Cursor reads the key from $" KEY_ENV ": set it where Cursor starts from."},
    {"vscode", "VS Code", "servers", entry_vscode, path_vscode,
     "VS Code asks for the key once (a password prompt) and keeps it in its secret storage."},
    {"windsurf", "Windsurf", "mcpServers", entry_windsurf, path_windsurf,
     "Windsurf reads the key from $" KEY_ENV ": set it where Windsurf starts from."},
    {"codex", "Codex", NULL, NULL, path_codex,
     "Codex reads the key from $" KEY_ENV " (bearer_token_env_var): export it before codex."},
};

/* ---- printing ---- */

/* The argument as the shell reads it back unchanged. */
static void shell_word(FILE *f, const char *s)
{
    if (s[0] && strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
                          "_./:@%+=,-") == strlen(s)) {
        fputs(s, f);
        return;
    }
    fputc('\'', f);
    for (; *s; s++)
        if (*s == '\'')
            fputs("'\\''", f);
        else
            fputc(*s, f);
    fputc('\'', f);
}

static void toml_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20 || ch == 0x7f)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static void print_claude_add(FILE *f, const conn *c)
{
    fputs("claude mcp add --transport http " SERVER_NAME " ", f);
    shell_word(f, c->url);
    if (c->key)
        fprintf(f, " --header \"Authorization: Bearer %s\"\n", c->key);
    else
        fputs(" --header \"Authorization: Bearer $" KEY_ENV "\"\n", f);
}

static void print_codex_add(FILE *f, const conn *c)
{
    fputs("codex mcp add " SERVER_NAME " --url ", f);
    shell_word(f, c->url);
    fputs(" --bearer-token-env-var " KEY_ENV "\n", f);
}

/* The whole JSON document a client's file would hold with only sandfleet in it. */
static json_t *document(const client *cl, const conn *c)
{
    json_t *doc = json_object(), *servers = json_object(), *entry = cl->entry(c);

    if (!doc || !servers || !entry) {
        json_decref(doc);
        json_decref(servers);
        json_decref(entry);
        return NULL;
    }
    if (!strcmp(cl->id, "vscode"))
        json_object_set_new(doc, "inputs", json_pack("[o]", vscode_input()));
    json_object_set_new(servers, SERVER_NAME, entry);
    json_object_set_new(doc, cl->section, servers);
    return doc;
}

static int print_config(const client *cl, const conn *c)
{
    char path[PATH_MAX];
    int has_path = cl->path(c, path, sizeof(path)) == 0;

    if (!strcmp(cl->id, "claude-code")) {
        print_claude_add(stdout, c);
        fprintf(stderr, "# Claude Code: run the line above (add --scope user for every "
                        "project)%s.\n", c->key ? "" : ", with $" KEY_ENV " exported");
        fprintf(stderr, "# Or: sandfleet connect claude-code --write puts it in ./.mcp.json "
                        "with a reference to $" KEY_ENV ", never the key.\n");
        return 0;
    }
    if (!cl->section) { /* codex: the command as a comment, then the TOML (still valid TOML) */
        printf("# ");
        print_codex_add(stdout, c);
        printf("[mcp_servers." SERVER_NAME "]\nurl = ");
        toml_string(stdout, c->url);
        printf("\nbearer_token_env_var = \"" KEY_ENV "\"\n");
    } else {
        json_t *doc = document(cl, c);
        if (!doc || json_dumpf(doc, stdout, JSON_INDENT(2)) < 0) {
            json_decref(doc);
            fprintf(stderr, SF_MSG_CLI_NOMEM);
            return 1;
        }
        putchar('\n');
        json_decref(doc);
    }
    fprintf(stderr, "# %s: %s%s (or: sandfleet connect %s --write%s).\n", cl->title,
            has_path ? "merge this into " : "put this in its configuration", has_path ? path : "",
            cl->id, c->global ? " --global" : "");
    fprintf(stderr, "# %s\n", cl->after);
    if (!strcmp(cl->id, "claude-desktop") && !c->key)
        fprintf(stderr, "# Put your key in place of sf_live_... (or run with --key KEY).\n");
    return 0;
}

/* Says on stderr which URL it uses and where it found it; without any, that no stack was
 * found and what to do (the default port may not be the stack's). */
static void say_url(const conn *c, int argc, char **argv)
{
    char where[4200];
    const char *w = NULL;
    int found;
    const char *file = cli_env_file(&found);

    if (cli_opt(argc, argv, "--url"))
        w = "--url";
    else if (!(w = cli_setting_where("SANDFLEET_URL", where, sizeof(where))))
        w = cli_setting_where("SF_URL", where, sizeof(where));
    if (w) {
        fprintf(stderr, "# URL %s, from %s.\n", c->url, w);
        return;
    }
    fprintf(stderr, "# URL %s: the default, as no stack was found (%s %s); if ops/run "
            "printed another URL, pass --url URL, or set SF_HOME to the state folder it "
            "ran with.\n", c->url, file, found ? "names no SF_URL" : "does not exist");
}

/* ---- writing ---- */

static int read_file(const char *path, char **out, size_t *len, char *why, size_t whylen)
{
    FILE *f = fopen(path, "re");
    char *buf;
    size_t n;

    *out = NULL;
    *len = 0;
    if (!f) {
        if (errno == ENOENT)
            return 0; /* a new file */
        snprintf(why, whylen, "cannot read %s: %s.", path, strerror(errno));
        return -errno;
    }
    if (!(buf = malloc(FILE_MAX + 1))) {
        fclose(f);
        snprintf(why, whylen, "out of memory.");
        return -ENOMEM;
    }
    n = fread(buf, 1, FILE_MAX + 1, f);
    fclose(f);
    if (n > FILE_MAX) {
        free(buf);
        snprintf(why, whylen, "%s is over %u MiB; edit it by hand.", path, FILE_MAX >> 20);
        return -EFBIG;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return 0;
}

static int mkdirs(const char *path, mode_t mode)
{
    char dir[PATH_MAX];
    char *slash;

    snprintf(dir, sizeof(dir), "%s", path);
    if (!(slash = strrchr(dir, '/')) || slash == dir)
        return 0;
    *slash = '\0';
    for (char *p = dir + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            if (mkdir(dir, mode) < 0 && errno != EEXIST)
                return -errno;
            *p = '/';
        }
    return mkdir(dir, mode) < 0 && errno != EEXIST ? -errno : 0;
}

/* Replaces path's content at once (a temporary file beside it, then rename): a crash
 * leaves the old file or the new one, never half of one. Keeps an existing file's mode. */
static int write_atomic(const char *path, const char *data, size_t len, mode_t mode, char *why,
                        size_t whylen)
{
    char tmp[PATH_MAX + 32];
    struct stat st;
    int fd, rc = 0;
    FILE *f;

    if (stat(path, &st) == 0)
        mode = st.st_mode & 07777;
    if ((rc = mkdirs(path, 0755)) < 0) {
        snprintf(why, whylen, "cannot create the folder of %s: %s.", path, strerror(-rc));
        return rc;
    }
    snprintf(tmp, sizeof(tmp), "%s.sandfleet-XXXXXX", path);
    if ((fd = mkstemp(tmp)) < 0) {
        snprintf(why, whylen, "cannot write beside %s: %s.", path, strerror(errno));
        return -errno;
    }
    if (fchmod(fd, mode) < 0 || !(f = fdopen(fd, "w"))) {
        rc = -errno;
        close(fd);
        goto fail;
    }
    if (fwrite(data, 1, len, f) != len || fflush(f) != 0 || fsync(fileno(f)) < 0)
        rc = -EIO;
    if (fclose(f) != 0 && rc == 0)
        rc = -EIO;
    if (rc == 0 && rename(tmp, path) < 0)
        rc = -errno;
    if (rc == 0)
        return 0;
fail:
    unlink(tmp);
    snprintf(why, whylen, "cannot write %s: %s.", path, strerror(-rc));
    return rc;
}

/* Where the file really is: a symlinked config (dotfiles) is edited where it points. */
static void resolve_link(char *path, size_t n)
{
    char real[PATH_MAX];
    struct stat st;

    if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode) && realpath(path, real))
        snprintf(path, n, "%s", real);
}

static int merge_json(const client *cl, const conn *c, const char *path, char *why,
                      size_t whylen)
{
    char *text = NULL, *out = NULL;
    size_t len;
    json_error_t jerr;
    json_t *root = NULL, *servers, *entry = NULL, *old;
    int rc, changed = 1;

    if ((rc = read_file(path, &text, &len, why, whylen)) < 0)
        return rc;
    if (!text || strspn(text, " \t\r\n") == len)
        root = json_object();
    else if (!(root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr))) {
        snprintf(why, whylen, "%.512s is not plain JSON (line %d: %s), perhaps comments; nothing "
                 "was changed. Add the entry printed by `sandfleet connect %s` by hand.", path,
                 jerr.line, jerr.text, cl->id);
        rc = -EINVAL;
        goto out;
    }
    free(text);
    text = NULL;
    if (!json_is_object(root) ||
        ((servers = json_object_get(root, cl->section)) && !json_is_object(servers))) {
        snprintf(why, whylen, "%.512s does not hold a JSON object with a \"%s\" object; nothing was "
                 "changed. Fix it, or add the entry printed by `sandfleet connect %s` by hand.",
                 path, cl->section, cl->id);
        rc = -EINVAL;
        goto out;
    }
    if (!servers) {
        servers = json_object();
        json_object_set_new(root, cl->section, servers);
    }
    if (!(entry = cl->entry(c))) {
        rc = -ENOMEM;
        goto out;
    }
    old = json_object_get(servers, SERVER_NAME);
    if (old && json_equal(old, entry))
        changed = 0;
    json_object_set(servers, SERVER_NAME, entry);
    if (!strcmp(cl->id, "vscode")) {
        json_t *inputs = json_object_get(root, "inputs"), *in;
        size_t i;
        int have = 0;

        if (inputs && !json_is_array(inputs)) {
            snprintf(why, whylen, "\"inputs\" in %.512s is not an array; nothing was changed.",
                     path);
            rc = -EINVAL;
            goto out;
        }
        if (!inputs) {
            inputs = json_array();
            json_object_set_new(root, "inputs", inputs);
        }
        json_array_foreach(inputs, i, in)
            have |= !strcmp(json_string_value(json_object_get(in, "id")) ?: "", VSCODE_INPUT);
        if (!have) {
            json_array_append_new(inputs, vscode_input());
            changed = 1;
        }
    }
    if (!changed) {
        fprintf(stderr, SF_MSG_CLI_ENTRY_SAME_FMT, path);
        rc = 0;
        goto out;
    }
    if (!(out = json_dumps(root, JSON_INDENT(2)))) {
        rc = -ENOMEM;
        goto out;
    }
    len = strlen(out);
    out[len] = '\n'; /* json_dumps leaves room: its NUL */
    rc = write_atomic(path, out, len + 1, !strcmp(cl->id, "claude-desktop") ? 0600 : 0644, why,
                      whylen);
    if (rc == 0)
        fprintf(stderr, SF_MSG_CLI_ENTRY_DONE_FMT,
                old ? "Updated" : "Added", path);
out:
    free(text);
    free(out);
    json_decref(entry);
    json_decref(root);
    return rc;
}

static int merge_toml(const conn *c, const char *path, char *why, size_t whylen)
{
    static const char *const drop[] = {"command", "args", "env", "env_vars", "cwd", "bearer_token",
                                       "http_headers", "env_http_headers"};
    cli_toml_kv kv[] = {{"url", c->url}, {"bearer_token_env_var", KEY_ENV}};
    char *text = NULL, *out = NULL;
    size_t len;
    int rc;

    if ((rc = read_file(path, &text, &len, why, whylen)) < 0)
        return rc;
    rc = cli_toml_set_table(text ? text : "", len, "mcp_servers." SERVER_NAME, kv,
                            SF_ARRAY_LEN(kv), drop, SF_ARRAY_LEN(drop), &out, why, whylen);
    if (rc < 0) {
        char inner[512];
        snprintf(inner, sizeof(inner), "%.500s", why);
        snprintf(why, whylen, "%.512s: %s Nothing was changed.", path, inner);
    } else if (text && !strcmp(text, out)) {
        fprintf(stderr, SF_MSG_CLI_ENTRY_SAME_FMT, path);
    } else if ((rc = write_atomic(path, out, strlen(out), 0600, why, whylen)) == 0) {
        fprintf(stderr, SF_MSG_CLI_ENTRY_DONE_FMT,
                text && strstr(text, "[mcp_servers." SERVER_NAME "]") ? "Updated" : "Added", path);
    }
    free(text);
    free(out);
    return rc;
}

static int write_config(const client *cl, const conn *c, const char *file)
{
    char path[PATH_MAX], why[2048];
    int rc;

    if (file)
        snprintf(path, sizeof(path), "%s", file);
    else if (cl->path(c, path, sizeof(path)) < 0) {
        fprintf(stderr, "sandfleet: %s has no file for this%s; run `sandfleet connect %s` and use "
                        "what it prints, or give --file PATH.\n", cl->title,
                c->global ? " with --global" : "", cl->id);
        return 2;
    }
    if (!strcmp(cl->id, "claude-desktop") && !c->key) {
        fprintf(stderr, "sandfleet: Claude Desktop's file must hold the key: give --key KEY or "
                        "set " KEY_ENV ".\n");
        return 2;
    }
    resolve_link(path, sizeof(path));
    rc = cl->section ? merge_json(cl, c, path, why, sizeof(why))
                     : merge_toml(c, path, why, sizeof(why));
    if (rc < 0) {
        fprintf(stderr, "sandfleet: %s\n", why);
        return 1;
    }
    fprintf(stderr, "%s\n", cl->after);
    return 0;
}

/* ---- set-up ---- */

/* This program's path for a client to start: as found on the PATH when run by name (so a
 * /usr/local/bin link survives rebuilds), else made absolute. */
static void find_program(char *out, size_t n)
{
    const char *argv0 = cli_program ? cli_program : "sandfleet", *path = getenv("PATH");
    char cand[PATH_MAX];

    if (strchr(argv0, '/')) {
        if (argv0[0] == '/' || !realpath(argv0, cand))
            snprintf(out, n, "%s", argv0);
        else
            snprintf(out, n, "%s", cand);
        return;
    }
    while (path && *path) {
        const char *colon = strchr(path, ':');
        size_t dl = colon ? (size_t)(colon - path) : strlen(path);
        if (dl > 0 && snprintf(cand, sizeof(cand), "%.*s/%s", (int)dl, path, argv0) <
                          (int)sizeof(cand) &&
            cand[0] == '/' && access(cand, X_OK) == 0) {
            snprintf(out, n, "%s", cand);
            return;
        }
        path = colon ? colon + 1 : NULL;
    }
    ssize_t r = readlink("/proc/self/exe", cand, sizeof(cand) - 1);
    cand[r > 0 ? r : 0] = '\0';
    snprintf(out, n, "%s", r > 0 ? cand : argv0);
}

int cli_connect(int argc, char **argv)
{
    const char *id = NULL, *file = cli_opt(argc, argv, "--file");
    const client *cl = NULL;
    conn c;
    int write = 0;

    memset(&c, 0, sizeof(c));
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--write"))
            write = 1;
        else if (!strcmp(argv[i], "--global"))
            c.global = 1;
        else if ((!strcmp(argv[i], "--file") || !strcmp(argv[i], "--url") ||
                  !strcmp(argv[i], "--key")) && i + 1 < argc)
            i++;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help") ||
                 !strcmp(argv[i], "--list")) {
            fputs(usage, stdout);
            return 0;
        } else if (argv[i][0] != '-' && !id)
            id = argv[i];
        else {
            fprintf(stderr, "sandfleet connect: unexpected argument '%s'.\n%s", argv[i], usage);
            return 2;
        }
    }
    for (size_t i = 0; id && i < SF_ARRAY_LEN(clients); i++)
        if (!strcmp(id, clients[i].id))
            cl = &clients[i];
    if (!cl) {
        if (id)
            fprintf(stderr, "sandfleet connect: no client named '%s'.\n", id);
        fputs(usage, stderr);
        return 2;
    }
    c.url = cli_opt(argc, argv, "--url");
    if (!c.url)
        c.url = cli_setting("SANDFLEET_URL", cli_setting("SF_URL", CLI_DEFAULT_URL));
    if (strncmp(c.url, "http://", 7) != 0 && strncmp(c.url, "https://", 8) != 0) {
        fprintf(stderr, "sandfleet connect: the URL must start with http:// or https:// (got "
                        "'%s').\n", c.url);
        return 2;
    }
    say_url(&c, argc, argv);
    c.key = cli_opt(argc, argv, "--key");
    if (!c.key && getenv(KEY_ENV) && *getenv(KEY_ENV))
        c.key = getenv(KEY_ENV);
    find_program(c.program, sizeof(c.program));
    return write ? write_config(cl, &c, file) : print_config(cl, &c);
}
