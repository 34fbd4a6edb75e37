/* files.c: the file tools (sandbox_files_read, _write, _list, _download_dir). The work
 * inside the sandbox is the agent's (driver.h's file operation: the agent, pid 1 of the
 * sandbox, opens the paths in the sandbox's own mount namespace and root); the worker
 * only moves bytes in chunks, enforces the limits (docs/contract.md) and builds the ZIP with
 * libzip, on the thread pool. Large answers leave as claim checks (wk_reply_result).
 *
 * Each call is a chain of agent requests on the loop. A kill of the sandbox answers the
 * request in flight with an error, which ends the chain; no chain keeps the sandbox's
 * pointer across anything but a driver request. */
#include "worker.h"
#include "sf_log.h"
#include "sf_msg.h"

#include <errno.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zip.h>

#define READ_MAX (1u << 20)          /* sandbox_files_read: the largest file */
#define WRITE_MAX (8u << 20)         /* sandbox_files_write: the largest content */
#define LIST_MAX 10000               /* sandbox_files_list: entries in one answer */
#define LIST_BYTES (768u * 1024)     /* ...and their JSON, so the answer fits one message */
#define ZIP_MAX (10u << 20)          /* sandbox_files_download_dir: the largest ZIP */
#define UNSAFE_LIST_MAX 100          /* download_dir: unsafe names named in the answer */
#define ZIP_RAW_MAX (64u << 20)      /* ...and the most file bytes read to build one */
#define ZIP_FILES_MAX 10000
#define ZIP_DIRS_MAX 10000
#define PAGE 4096                    /* entries asked per list request */
#define PATH_MAX_SB SF_AP_PATH_MAX

typedef struct zfile {
    char *rel;                       /* path inside the archive; directories end in '/' */
    int dir;
    int64_t mtime;
    char *data;                      /* the file's bytes, read from the sandbox */
    size_t len;
} zfile;

typedef struct fop {
    wk_call *c;
    wk_ctx *ctx;
    char sandbox[SF_ID_MAX];
    char path[PATH_MAX_SB + 1];      /* absolute, in the sandbox */
    char tmp[PATH_MAX_SB + 64];      /* write: the temporary file beside it */
    int base64;
    sf_buf buf;                      /* read: the content; write: the bytes to write */
    uint64_t off, size;
    int64_t mtime;
    /* list */
    json_t *entries;
    size_t list_bytes;
    int truncated;
    /* download */
    zfile *files;
    size_t nfiles, cap_files, next_file, ndirs;
    char **queue;                    /* directories still to list (relative, "" = the top) */
    size_t nqueue, cap_queue, qhead;
    uint64_t raw;                    /* file bytes read so far */
    size_t skipped;                  /* symlinks and special files left out */
    size_t unsafe;                   /* names unsafe on Windows (\\, ':', ".."), left out */
    json_t *unsafe_names;            /* the first UNSAFE_LIST_MAX of them (relative) */
    int zipping;                     /* counted in ctx->zips_running */
    char *zip;                       /* the archive (pool thread) */
    size_t zip_len;
    const char *zip_err;
} fop;

/* ---- small things ---------------------------------------------------------- */

static void fop_free(fop *f)
{
    if (!f)
        return;
    if (f->zipping)
        f->ctx->zips_running--;
    sf_buf_fini(&f->buf);
    json_decref(f->entries);
    json_decref(f->unsafe_names);
    for (size_t i = 0; i < f->nfiles; i++) {
        free(f->files[i].rel);
        free(f->files[i].data);
    }
    free(f->files);
    for (size_t i = 0; i < f->nqueue; i++)
        free(f->queue[i]);
    free(f->queue);
    free(f->zip);
    free(f);
}

static void fail(fop *f, const char *code, const char *message)
{
    wk_reply_error(f->c, code, message);
    fop_free(f);
}

static void done(fop *f, json_t *result)
{
    wk_touch(f->ctx, f->sandbox);
    wk_reply_result(f->c, result);
    fop_free(f);
}

/* The sandbox of f, while it still runs (NULL: being killed, or gone). */
static wk_sandbox *sandbox_of(fop *f)
{
    wk_box *b = sf_map_get(f->ctx->sandboxes, f->sandbox);
    return b && b->state == WK_BOX_RUNNING ? b->sb : NULL;
}

static fop *fop_new(wk_call *c, wk_box *b)
{
    fop *f = calloc(1, sizeof(*f));

    if (!f) {
        wk_reply_error(c, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
        return NULL;
    }
    f->c = c;
    f->ctx = c->ctx;
    snprintf(f->sandbox, sizeof(f->sandbox), "%s", b->id);
    sf_buf_init(&f->buf, WRITE_MAX + 1);
    return f;
}

/* The path argument as an absolute path in the sandbox: a relative one is under /root
 * (where commands start). -1 (answered) when it is unusable. */
static int take_path(fop *f, const char *arg)
{
    const json_t *v = json_object_get(f->c->job.args, arg);
    const char *p = json_string_value(v);
    size_t n = p ? json_string_length(v) : 0;
    char text[160];

    if (!p || n == 0 || strlen(p) != n) {
        snprintf(text, sizeof(text), "Argument '%s' must be a path without NUL characters.", arg);
        fail(f, SF_ERR_INVALID, text);
        return -1;
    }
    if ((p[0] == '/' ? n : n + 6) > PATH_MAX_SB) {
        fail(f, SF_ERR_INVALID, "The path is longer than 4096 bytes; use a shorter one.");
        return -1;
    }
    snprintf(f->path, sizeof(f->path), "%s%s", p[0] == '/' ? "" : "/root/", p);
    return 0;
}

/* The agent's error as the caller's sentence: what went wrong with which path, and what
 * to do. */
static void fail_fs(fop *f, const wk_file_result *res, const char *doing)
{
    char text[SF_MESSAGE_MAX];
    const char *path = f->path;

    switch (res->err) {
    case ENOENT:
        snprintf(text, sizeof(text), "%.300s does not exist in the sandbox; check the path "
                 "with sandbox_files_list.", path);
        break;
    case ENOTDIR:
        snprintf(text, sizeof(text), "%.300s, or a part of its path, is not a directory; "
                 "check the path with sandbox_files_list (read a file with "
                 "sandbox_files_read).", path);
        break;
    case EISDIR:
        snprintf(text, sizeof(text), "%.300s is a directory; %s", path,
                 !strcmp(doing, "list") ? "" : "list it with sandbox_files_list, or download "
                 "it with sandbox_files_download_dir.");
        break;
    case EACCES:
    case EPERM:
    case EROFS:
        snprintf(text, sizeof(text), "The sandbox may not %s %.300s (permission denied); "
                 "use a path under /root, /tmp or /home, or one you created.", doing, path);
        break;
    case ENOSPC:
    case EDQUOT:
        snprintf(text, sizeof(text), "The sandbox's disk is full, so %.300s could not be "
                 "written; delete files with sandbox_exec, or create a sandbox with a larger "
                 "disk.", path);
        break;
    case EINVAL:
        snprintf(text, sizeof(text), "%.300s is not a regular file (a device, pipe or "
                 "socket); only regular files can be %s.", path,
                 !strcmp(doing, "read") ? "read" : "written");
        break;
    case ELOOP:
        snprintf(text, sizeof(text), "%.300s has too many levels of symbolic links.", path);
        break;
    default:
        snprintf(text, sizeof(text), "%s", res->error ? res->error : "The file request failed.");
        break;
    }
    fail(f, res->err ? SF_ERR_INVALID : SF_ERR_UNAVAILABLE, text);
}

/* Sends a file request on f's sandbox; -1 (answered) when it cannot go. */
static int request(fop *f, const wk_file_req *req, wk_file_cb cb)
{
    wk_sandbox *sb = sandbox_of(f);
    char text[200];
    int rc;

    if (!sb) {
        snprintf(text, sizeof(text), SF_MSG_SANDBOX_KILLED_DURING_CALL_FMT, f->sandbox);
        fail(f, SF_ERR_NOT_FOUND, text);
        return -1;
    }
    if ((rc = f->ctx->ops->file(sb, req, cb, f)) == 0)
        return 0;
    fail(f, rc == -EBUSY ? SF_ERR_LIMIT : SF_ERR_UNAVAILABLE,
         rc == -EBUSY ? SF_MSG_TOO_MANY_CALLS
                      : "The sandbox did not accept the file request; retry, or create a new "
                        "sandbox.");
    return -1;
}

static char *iso8601(int64_t t, char out[32])
{
    time_t tt = (time_t)t;
    struct tm tm;

    gmtime_r(&tt, &tm);
    strftime(out, 32, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return out;
}

json_t *wk_json_base64(const char *p, size_t n)
{
    size_t len = sodium_base64_ENCODED_LEN(n, sodium_base64_VARIANT_ORIGINAL);
    char *out = malloc(len);
    json_t *s;

    if (!out)
        return NULL;
    sodium_bin2base64(out, len, (const unsigned char *)p, n, sodium_base64_VARIANT_ORIGINAL);
    s = json_stringn(out, len - 1);
    free(out);
    return s;
}

/* ---- sandbox_files_read --------------------------------------------------- */

static void read_next(fop *f);

static void on_read(void *arg, const wk_file_result *res)
{
    fop *f = arg;
    char text[SF_MESSAGE_MAX];

    if (res->error) {
        fail_fs(f, res, "read");
        return;
    }
    if (f->off == 0)
        f->size = res->size;
    f->mtime = res->mtime;
    if (res->size > READ_MAX || f->off + res->data_len > READ_MAX) {
        snprintf(text, sizeof(text), "%.300s is %llu bytes, over the 1 MiB (1048576 bytes) "
                 "limit of sandbox_files_read; read a part with sandbox_exec (head -c 1000000 "
                 "FILE, or tail -c), or download its directory with sandbox_files_download_dir.",
                 f->path, (unsigned long long)(res->size > READ_MAX ? res->size : f->off + res->data_len));
        fail(f, SF_ERR_LIMIT, text);
        return;
    }
    if (sf_buf_append(&f->buf, res->data ? res->data : "", res->data_len) < 0) {
        fail(f, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
        return;
    }
    f->off += res->data_len;
    if (res->data_len == 0 || f->off >= f->size) { /* the end (or it shrank meanwhile) */
        json_t *content = f->base64 ? wk_json_base64(f->buf.p, f->buf.len) : json_stringn(f->buf.p ? f->buf.p : "", f->buf.len);
        char when[32];
        if (!content) {
            fail(f, SF_ERR_INVALID, f->base64 ? SF_MSG_HOST_NOMEM
                 : "The file is not UTF-8 text; read it with encoding 'base64'.");
            return;
        }
        done(f, json_pack("{s:s, s:o, s:s, s:I, s:s}", "path", f->path, "content", content,
                          "encoding", f->base64 ? "base64" : "text", "bytes",
                          (json_int_t)f->buf.len, "modified_at", iso8601(f->mtime, when)));
        return;
    }
    read_next(f);
}

static void read_next(fop *f)
{
    wk_file_req req = {.op = WK_FILE_READ, .path = f->path, .off = f->off, .len = WK_FILE_CHUNK};

    request(f, &req, on_read);
}

static void files_read(wk_call *c, wk_box *b)
{
    const char *enc = json_string_value(json_object_get(c->job.args, "encoding"));
    fop *f = fop_new(c, b);

    if (!f || take_path(f, "path") < 0)
        return;
    f->base64 = enc && !strcmp(enc, "base64");
    read_next(f);
}

/* ---- sandbox_files_write -------------------------------------------------- */

static void write_next(fop *f);

static void on_tmp_dropped(void *arg, const wk_file_result *res)
{
    (void)arg;
    (void)res;
}

/* The temporary file goes (best effort), then the caller hears why. */
static void write_fail(fop *f, const wk_file_result *res, const char *doing)
{
    wk_sandbox *sb = sandbox_of(f);
    wk_file_req del = {.op = WK_FILE_DELETE, .path = f->tmp};

    if (sb) /* ENOENT when it was never created: harmless */
        f->ctx->ops->file(sb, &del, on_tmp_dropped, NULL);
    fail_fs(f, res, doing);
}

static void on_moved(void *arg, const wk_file_result *res)
{
    fop *f = arg;

    if (res->error) {
        write_fail(f, res, "write");
        return;
    }
    done(f, json_pack("{s:s, s:I}", "path", f->path, "bytes", (json_int_t)f->buf.len));
}

static void on_written(void *arg, const wk_file_result *res)
{
    fop *f = arg;

    if (res->error) {
        write_fail(f, res, "write");
        return;
    }
    f->off = res->size;
    if (f->off < f->buf.len) {
        write_next(f);
        return;
    }
    {
        wk_file_req mv = {.op = WK_FILE_MOVE, .path = f->tmp, .to = f->path};
        request(f, &mv, on_moved);
    }
}

static void write_next(fop *f)
{
    size_t n = f->buf.len - f->off;
    wk_file_req req = {.op = WK_FILE_WRITE, .path = f->tmp, .off = f->off, .data = f->buf.p + f->off};

    req.data_len = n > WK_FILE_CHUNK ? WK_FILE_CHUNK : n;
    if (f->off == 0)
        req.flags = WK_FILE_CREATE | WK_FILE_EXCL | WK_FILE_MKDIRS;
    request(f, &req, on_written);
}

static void files_write(wk_call *c, wk_box *b)
{
    json_t *a = c->job.args, *content = json_object_get(a, "content");
    const char *enc = json_string_value(json_object_get(a, "encoding"));
    const char *slash;
    fop *f = fop_new(c, b);
    char text[SF_MESSAGE_MAX];
    size_t n;

    if (!f || take_path(f, "path") < 0)
        return;
    if (!json_is_string(content)) {
        fail(f, SF_ERR_INVALID, "Argument 'content' is required.");
        return;
    }
    n = json_string_length(content);
    if (enc && !strcmp(enc, "base64")) {
        size_t max = n / 4 * 3 + 3, got = 0;
        const char *end = NULL;
        unsigned char *bin = malloc(max + 1);
        if (!bin || sodium_base642bin(bin, max, json_string_value(content), n, " \t\r\n", &got,
                                      &end, sodium_base64_VARIANT_ORIGINAL) < 0 ||
            (end && *end)) {
            free(bin);
            fail(f, SF_ERR_INVALID, "Argument 'content' is not valid base64 (standard alphabet, "
                 "with padding); encode the bytes again, or send text with encoding 'text'.");
            return;
        }
        f->buf.p = (char *)bin;
        f->buf.len = got;
        f->buf.cap = max + 1;
        bin[got] = '\0';
    } else if (sf_buf_append(&f->buf, json_string_value(content), n) < 0 && n <= WRITE_MAX) {
        fail(f, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
        return;
    }
    if (n > WRITE_MAX * 2u || f->buf.len > WRITE_MAX || (!f->buf.p && n > 0)) {
        snprintf(text, sizeof(text), "The content is %llu bytes, over the 8 MiB (8388608 bytes) "
                 "limit of sandbox_files_write; write the file in parts (several files joined "
                 "with cat in sandbox_exec), or produce it inside the sandbox.",
                 (unsigned long long)(f->buf.len > WRITE_MAX ? f->buf.len : n));
        fail(f, SF_ERR_LIMIT, text);
        return;
    }
    if (f->path[strlen(f->path) - 1] == '/') {
        fail(f, SF_ERR_INVALID, "The path names a directory (it ends in '/'); add the file's "
             "name.");
        return;
    }
    slash = strrchr(f->path, '/');
    snprintf(f->tmp, sizeof(f->tmp), "%.*s/.sf-write-%s", (int)(slash - f->path), f->path,
             c->job.id);
    write_next(f);
}

/* ---- sandbox_files_list --------------------------------------------------- */

static const char *type_name(char t)
{
    return t == 'f' ? "file" : t == 'd' ? "directory" : t == 'l' ? "symlink" : "other";
}

static int by_name(const void *a, const void *b)
{
    const char *x = json_string_value(json_object_get(*(json_t *const *)a, "name"));
    const char *y = json_string_value(json_object_get(*(json_t *const *)b, "name"));
    return strcmp(x, y);
}

static void list_next(fop *f);

static void list_finish(fop *f)
{
    size_t n = json_array_size(f->entries);
    json_t **v = calloc(n ? n : 1, sizeof(*v)), *sorted = json_array(), *r;

    for (size_t i = 0; v && i < n; i++)
        v[i] = json_array_get(f->entries, i);
    if (v)
        qsort(v, n, sizeof(*v), by_name);
    for (size_t i = 0; v && i < n; i++)
        json_array_append(sorted, v[i]);
    free(v);
    r = json_pack("{s:s, s:o, s:I}", "path", f->path, "entries", sorted, "count",
                  (json_int_t)n);
    if (f->truncated)
        json_object_set_new(r, "truncated", json_true());
    done(f, r);
}

static void on_listed(void *arg, const wk_file_result *res)
{
    fop *f = arg;
    char when[32];

    if (res->error) {
        fail_fs(f, res, "list");
        return;
    }
    for (size_t i = 0; i < res->n_entries; i++) {
        const wk_file_entry *e = &res->entries[i];
        if (json_array_size(f->entries) >= LIST_MAX || f->list_bytes > LIST_BYTES) {
            f->truncated = 1;
            break;
        }
        f->list_bytes += strlen(e->name) * 6 + 96;
        json_array_append_new(f->entries,
                              json_pack("{s:s, s:s, s:I, s:s}", "name", e->name, "type",
                                        type_name(e->type), "size", (json_int_t)e->size,
                                        "modified_at", iso8601(e->mtime, when)));
    }
    f->off += res->n_entries;
    if (f->truncated || !res->more) {
        f->truncated |= res->more;
        list_finish(f);
        return;
    }
    list_next(f);
}

static void list_next(fop *f)
{
    wk_file_req req = {.op = WK_FILE_LIST, .path = f->path, .off = f->off, .len = PAGE};

    request(f, &req, on_listed);
}

static void files_list(wk_call *c, wk_box *b)
{
    fop *f = fop_new(c, b);

    if (!f || take_path(f, "path") < 0)
        return;
    f->entries = json_array();
    list_next(f);
}

/* ---- sandbox_files_download_dir ------------------------------------------- */

static void zip_walk(fop *f);
static void zip_read_next(fop *f);

static int queue_push(fop *f, char *rel)
{
    if (f->nqueue == f->cap_queue) {
        size_t cap = f->cap_queue ? f->cap_queue * 2 : 16;
        char **q = realloc(f->queue, cap * sizeof(*q));
        if (!q)
            return -ENOMEM;
        f->queue = q;
        f->cap_queue = cap;
    }
    f->queue[f->nqueue++] = rel;
    return 0;
}

static int file_push(fop *f, char *rel, int dir, int64_t mtime, uint64_t size)
{
    if (f->nfiles == f->cap_files) {
        size_t cap = f->cap_files ? f->cap_files * 2 : 64;
        zfile *z = realloc(f->files, cap * sizeof(*z));
        if (!z)
            return -ENOMEM;
        f->files = z;
        f->cap_files = cap;
    }
    f->files[f->nfiles++] = (zfile){.rel = rel, .dir = dir, .mtime = mtime, .len = (size_t)size};
    return 0;
}

/* The directory being listed: f->path + "/" + its relative path, in f->tmp. */
static void zip_dir_path(fop *f)
{
    const char *rel = f->queue[f->qhead];
    size_t n = strlen(f->path);

    snprintf(f->tmp, sizeof(f->tmp), "%s%s%s", f->path,
             rel[0] ? (n && f->path[n - 1] == '/' ? "" : "/") : "", rel);
}

static void zip_fail_limit(fop *f, const char *what)
{
    char text[SF_MESSAGE_MAX];

    snprintf(text, sizeof(text), "%.300s holds more than %s, too much for one "
             "sandbox_files_download_dir (a ZIP of at most 10 MiB); download its "
             "subdirectories one by one, or pack and split it in the sandbox (tar czf, split) "
             "and read the parts with sandbox_files_read.", f->path, what);
    fail(f, SF_ERR_LIMIT, text);
}

/* 1 when an archive entry of this name could land outside the folder it is unpacked
 * into on Windows: a backslash (a separator there), a ':' (a drive, "C:x", or an NTFS
 * stream, "a:b"), or a name that is "..". ('/' cannot be in a name.) */
static int zip_name_unsafe(const char *name)
{
    return strchr(name, '\\') || strchr(name, ':') || strcmp(name, "..") == 0 ||
           strcmp(name, ".") == 0;
}

/* Counts child (relative, malloc'd; freed here) as left out for its name, and names the
 * first UNSAFE_LIST_MAX in the answer (bytes outside printable ASCII as '?', so any name
 * can go into JSON). */
static void zip_unsafe(fop *f, char *child)
{
    f->unsafe++;
    if (!f->unsafe_names)
        f->unsafe_names = json_array();
    if (f->unsafe_names && json_array_size(f->unsafe_names) < UNSAFE_LIST_MAX) {
        for (char *p = child; *p; p++)
            if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e)
                *p = '?';
        json_array_append_new(f->unsafe_names, json_string(child));
    }
    free(child);
}

static void on_zip_listed(void *arg, const wk_file_result *res)
{
    fop *f = arg;
    const char *rel = f->queue[f->qhead];

    if (res->error) {
        if (f->qhead == 0) { /* the top itself: the caller's path is wrong */
            fail_fs(f, res, "list");
            return;
        }
        f->skipped++; /* a subdirectory that went away or cannot be read */
        f->qhead++;
        f->off = 0;
        zip_walk(f);
        return;
    }
    for (size_t i = 0; i < res->n_entries; i++) {
        const wk_file_entry *e = &res->entries[i];
        char *child;

        if (e->type != 'f' && e->type != 'd') {
            f->skipped++; /* symlinks and special files are left out */
            continue;
        }
        if (asprintf(&child, "%s%s%s", rel, rel[0] ? "/" : "", e->name) < 0) {
            fail(f, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
            return;
        }
        if (strlen(child) + strlen(f->path) + 2 > PATH_MAX_SB) {
            free(child);
            f->skipped++;
            continue;
        }
        if (zip_name_unsafe(e->name)) { /* a directory: not descended into either */
            zip_unsafe(f, child);
            continue;
        }
        if (e->type == 'd') {
            if (++f->ndirs > ZIP_DIRS_MAX) {
                free(child);
                zip_fail_limit(f, "10000 directories");
                return;
            }
            if (queue_push(f, child) < 0) {
                free(child);
                fail(f, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
                return;
            }
            continue;
        }
        f->raw += e->size;
        if (f->nfiles >= ZIP_FILES_MAX || f->raw > ZIP_RAW_MAX) {
            free(child);
            zip_fail_limit(f, f->raw > ZIP_RAW_MAX ? "64 MiB of files" : "10000 files");
            return;
        }
        if (file_push(f, child, 0, e->mtime, e->size) < 0) {
            free(child);
            fail(f, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
            return;
        }
    }
    f->off += res->n_entries;
    if (!res->more) {
        if (rel[0]) { /* a directory of its own in the archive (kept when empty) */
            char *d;
            if (asprintf(&d, "%s/", rel) < 0 || file_push(f, d, 1, 0, 0) < 0) {
                fail(f, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
                return;
            }
        }
        f->qhead++;
        f->off = 0;
    }
    zip_walk(f);
}

/* Lists the queue's directories one page at a time; then reads the files. */
static void zip_walk(fop *f)
{
    wk_file_req req = {.op = WK_FILE_LIST, .len = PAGE};

    if (f->qhead == f->nqueue) {
        f->next_file = 0;
        f->raw = 0;
        zip_read_next(f);
        return;
    }
    zip_dir_path(f);
    req.path = f->tmp;
    req.off = f->off;
    request(f, &req, on_zip_listed);
}

static void zip_build(void *arg);
static void zip_built(void *arg);

static void on_zip_read(void *arg, const wk_file_result *res)
{
    fop *f = arg;
    zfile *z = &f->files[f->next_file];

    if (res->error) { /* went away, or became something else: left out */
        f->skipped++;
        z->len = 0;
        free(z->data);
        z->data = NULL;
        z->dir = -1;
        f->next_file++;
        f->off = 0;
        zip_read_next(f);
        return;
    }
    if (f->raw + res->data_len > ZIP_RAW_MAX) {
        zip_fail_limit(f, "64 MiB of files");
        return;
    }
    if (f->off + res->data_len > z->len) { /* it grew since it was listed */
        char *p = realloc(z->data, f->off + res->data_len);
        if (!p) {
            fail(f, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
            return;
        }
        z->data = p;
        z->len = f->off + res->data_len;
    }
    memcpy(z->data + f->off, res->data, res->data_len);
    f->off += res->data_len;
    f->raw += res->data_len;
    z->mtime = res->mtime;
    if (res->data_len == 0 || f->off >= res->size) {
        z->len = f->off;
        f->next_file++;
        f->off = 0;
    }
    zip_read_next(f);
}

static void zip_read_next(fop *f)
{
    wk_file_req req = {.op = WK_FILE_READ, .len = WK_FILE_CHUNK, .flags = WK_FILE_NOFOLLOW};
    zfile *z;
    size_t n = strlen(f->path);

    while (f->next_file < f->nfiles && f->files[f->next_file].dir)
        f->next_file++;
    if (f->next_file == f->nfiles) {
        if (wk_pool_run(f->ctx->pool, zip_build, zip_built, f) < 0)
            fail(f, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
        return;
    }
    z = &f->files[f->next_file];
    if (f->off == 0) {
        free(z->data);
        if (!(z->data = malloc(z->len ? z->len : 1))) {
            fail(f, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
            return;
        }
    }
    snprintf(f->tmp, sizeof(f->tmp), "%s%s%s", f->path, n && f->path[n - 1] == '/' ? "" : "/",
             z->rel);
    req.path = f->tmp;
    req.off = f->off;
    request(f, &req, on_zip_read);
}

/* Pool thread: the archive, in memory (deflate; directories as entries). */
static void zip_build(void *arg)
{
    fop *f = arg;
    zip_error_t ze;
    zip_source_t *src, *fs;
    zip_t *za;
    zip_stat_t st;

    zip_error_init(&ze);
    f->zip_err = "The archive could not be built (libzip failed); retry.";
    if (!(src = zip_source_buffer_create(NULL, 0, 0, &ze)))
        goto out;
    zip_source_keep(src);
    if (!(za = zip_open_from_source(src, ZIP_TRUNCATE, &ze))) {
        zip_source_free(src);
        goto out;
    }
    for (size_t i = 0; i < f->nfiles; i++) {
        zfile *z = &f->files[i];
        zip_int64_t idx;

        if (z->dir < 0)
            continue;
        if (z->dir) {
            idx = zip_dir_add(za, z->rel, ZIP_FL_ENC_GUESS);
        } else {
            if (!(fs = zip_source_buffer(za, z->data, z->len, 0)))
                break;
            if ((idx = zip_file_add(za, z->rel, fs, ZIP_FL_ENC_GUESS | ZIP_FL_OVERWRITE)) < 0)
                zip_source_free(fs);
        }
        if (idx >= 0 && z->mtime > 0)
            zip_file_set_mtime(za, (zip_uint64_t)idx, (time_t)z->mtime, 0);
    }
    if (zip_close(za) < 0) {
        zip_discard(za);
        zip_source_free(src);
        goto out;
    }
    if (zip_source_stat(src, &st) == 0 && (st.valid & ZIP_STAT_SIZE) &&
        zip_source_open(src) == 0) {
        f->zip_len = (size_t)st.size;
        if ((f->zip = malloc(f->zip_len ? f->zip_len : 1)) &&
            zip_source_read(src, f->zip, st.size) == (zip_int64_t)st.size)
            f->zip_err = NULL;
        zip_source_close(src);
    }
    zip_source_free(src);
out:
    zip_error_fini(&ze);
    /* the bytes are in the archive now */
    for (size_t i = 0; i < f->nfiles; i++) {
        free(f->files[i].data);
        f->files[i].data = NULL;
    }
}

static void zip_built(void *arg)
{
    fop *f = arg;
    char text[SF_MESSAGE_MAX];
    size_t nf = 0;
    json_t *content, *r;

    if (f->zip_err) {
        fail(f, SF_ERR_INTERNAL, f->zip_err);
        return;
    }
    if (f->zip_len > ZIP_MAX) {
        snprintf(text, sizeof(text), "The ZIP of %.300s would be %.1f MiB, over the 10 MiB "
                 "limit of sandbox_files_download_dir; download its subdirectories one by one, "
                 "or pack and split it in the sandbox (tar czf, split) and read the parts with "
                 "sandbox_files_read.", f->path, (double)f->zip_len / (1 << 20));
        fail(f, SF_ERR_LIMIT, text);
        return;
    }
    for (size_t i = 0; i < f->nfiles; i++)
        nf += f->files[i].dir == 0;
    if (!(content = wk_json_base64(f->zip, f->zip_len))) {
        fail(f, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
        return;
    }
    r = json_pack("{s:s, s:o, s:s, s:I, s:I, s:I}", "path", f->path, "content", content,
                  "encoding", "base64", "bytes", (json_int_t)f->zip_len, "files",
                  (json_int_t)nf, "skipped", (json_int_t)f->skipped);
    if (r && f->unsafe) {
        int one = f->unsafe == 1;
        snprintf(text, sizeof(text), "%zu %s left out of the ZIP: %s a '\\', a ':' or a "
                 "'..' that would unpack outside the target folder on Windows (see "
                 "unsafe_names); rename %s in the sandbox (mv) and download again.",
                 f->unsafe, one ? "entry was" : "entries were",
                 one ? "its name has" : "their names have", one ? "it" : "them");
        json_object_set_new(r, "unsafe_skipped", json_integer((json_int_t)f->unsafe));
        if (f->unsafe_names)
            json_object_set(r, "unsafe_names", f->unsafe_names);
        json_object_set_new(r, "note", json_string(text));
    }
    done(f, r);
}

static void files_download(wk_call *c, wk_box *b)
{
    fop *f;
    char *top;

    if (c->ctx->zips_running >= c->ctx->cfg.zips) {
        wk_reply_error(c, SF_ERR_UNAVAILABLE, "This host is building other downloads right now; "
                       "retry in a few seconds.");
        return;
    }
    if (!(f = fop_new(c, b)))
        return;
    f->zipping = 1;
    c->ctx->zips_running++;
    if (take_path(f, "path") < 0)
        return;
    if (!(top = strdup("")) || queue_push(f, top) < 0) {
        free(top);
        fail(f, SF_ERR_INTERNAL, SF_MSG_HOST_NOMEM);
        return;
    }
    zip_walk(f);
}

WK_HANDLERS({"sandbox_files_read", files_read}, {"sandbox_files_write", files_write},
            {"sandbox_files_list", files_list}, {"sandbox_files_download_dir", files_download});
