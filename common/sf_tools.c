#include "sf_tools.h"
#include "sf_schema.h"
#include "sf_msg.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOOLS_MAX 64

/* sf.cancel (schemas/envelope.md): routed like a worker tool, never listed, never answered. */
static const char cancel_schema[] =
    "{\"title\": \"" SF_TOOL_CANCEL "\", \"description\": \"Cancel a running call.\","
    " \"type\": \"object\","
    " \"properties\": {\"job\": {\"type\": \"string\", \"minLength\": 1, \"maxLength\": 63},"
    "   \"sandbox_id\": {\"type\": \"string\", \"minLength\": 1, \"maxLength\": 63}},"
    " \"required\": [\"job\"], \"additionalProperties\": false,"
    " \"x-sandfleet\": {\"runs\": \"worker\", \"sandbox\": \"existing\"}}";

/* sf.template_build: the scheduler hands a team template's build to the host it chose
 * (sandbox_template_create answered the caller already): never listed, never answered. */
static const char build_schema[] =
    "{\"title\": \"" SF_TOOL_TEMPLATE_BUILD "\", \"description\": \"Build a team template.\","
    " \"type\": \"object\", \"required\": [\"name\", \"from\"],"
    " \"x-sandfleet\": {\"runs\": \"worker\", \"sandbox\": \"none\"}}";

/* sf.template_delete: the scheduler tells each host that holds a deleted team template to
 * remove its files (sandbox_template_delete answered the caller already). */
static const char delete_schema[] =
    "{\"title\": \"" SF_TOOL_TEMPLATE_DELETE "\", \"description\": \"Remove a team template.\","
    " \"type\": \"object\", \"required\": [\"name\"],"
    " \"x-sandfleet\": {\"runs\": \"worker\", \"sandbox\": \"none\"}}";

/* sf.hosted_*: the gateway's jobs for a hosted MCP server's session (gateway/hosted.c),
 * answered like any call; the sandbox is the session's. */
static const char hosted_start_schema[] =
    "{\"title\": \"" SF_TOOL_HOSTED_START "\", \"description\": \"Start a hosted MCP server.\","
    " \"type\": \"object\", \"required\": [\"sandbox_id\", \"run\"],"
    " \"properties\": {\"sandbox_id\": {\"type\": \"string\", \"maxLength\": 63},"
    "   \"run\": {\"type\": \"string\", \"minLength\": 1, \"maxLength\": 4096},"
    "   \"cwd\": {\"type\": \"string\", \"maxLength\": 4096},"
    "   \"idle_s\": {\"type\": \"integer\", \"minimum\": 1, \"maximum\": 604800}},"
    " \"x-sandfleet\": {\"runs\": \"worker\", \"sandbox\": \"existing\", \"resume\": true}}";
static const char hosted_send_schema[] =
    "{\"title\": \"" SF_TOOL_HOSTED_SEND "\", \"description\": \"One message to a hosted MCP server.\","
    " \"type\": \"object\", \"required\": [\"sandbox_id\", \"message\"],"
    " \"properties\": {\"sandbox_id\": {\"type\": \"string\", \"maxLength\": 63},"
    "   \"message\": {\"type\": \"string\", \"minLength\": 2},"
    "   \"id\": {\"type\": \"string\", \"maxLength\": 256},"
    "   \"token\": {\"type\": \"string\", \"maxLength\": 256},"
    "   \"idle_s\": {\"type\": \"integer\", \"minimum\": 1, \"maximum\": 604800},"
    "   \"wait_ms\": {\"type\": \"integer\", \"minimum\": 1, \"maximum\": 3600000}},"
    " \"x-sandfleet\": {\"runs\": \"worker\", \"sandbox\": \"existing\", \"resume\": true,"
    "   \"claim_check\": [\"message\"],"
    "   \"wait\": {\"arg\": \"wait_ms\", \"default\": 300000, \"max\": 3600000}}}";
static const char hosted_listen_schema[] =
    "{\"title\": \"" SF_TOOL_HOSTED_LISTEN "\", \"description\": \"What a hosted MCP server sends alone.\","
    " \"type\": \"object\", \"required\": [\"sandbox_id\"],"
    " \"properties\": {\"sandbox_id\": {\"type\": \"string\", \"maxLength\": 63},"
    "   \"wait_ms\": {\"type\": \"integer\", \"minimum\": 1, \"maximum\": 600000}},"
    " \"x-sandfleet\": {\"runs\": \"worker\", \"sandbox\": \"existing\", \"resume\": true,"
    "   \"wait\": {\"arg\": \"wait_ms\", \"default\": 30000, \"max\": 600000}}}";

static const char *const internal_schemas[] = {cancel_schema, build_schema, delete_schema,
                                               hosted_start_schema, hosted_send_schema,
                                               hosted_listen_schema};
static const char *const internal_names[] = {SF_TOOL_CANCEL, SF_TOOL_TEMPLATE_BUILD,
                                             SF_TOOL_TEMPLATE_DELETE, SF_TOOL_HOSTED_START,
                                             SF_TOOL_HOSTED_SEND, SF_TOOL_HOSTED_LISTEN};
#define N_INTERNAL (sizeof(internal_schemas) / sizeof(internal_schemas[0]))

static int json_file(const struct dirent *d)
{
    size_t n = strlen(d->d_name);
    return n > 5 && !strcmp(d->d_name + n - 5, ".json");
}

static void tool_fini(sf_tool *t)
{
    free(t->name);
    free(t->wait_arg);
    for (size_t i = 0; i < t->nclaims; i++)
        free(t->claims[i]);
    json_decref(t->schema);
    json_decref(t->output);
    memset(t, 0, sizeof(*t));
}

static int enum_of(const json_t *v, const char *const *names, size_t n, int *out)
{
    const char *s = json_string_value(v);

    for (size_t i = 0; s && i < n; i++)
        if (!strcmp(s, names[i])) {
            *out = (int)i;
            return 0;
        }
    return -1;
}

/* The x-sandfleet block (sf_tools.h) into t. -1 with why. */
static int parse_decl(sf_tool *t, const json_t *x, char *why, size_t whylen)
{
    static const char *const runs[] = {"gateway", "scheduler", "worker"};
    static const char *const sandbox[] = {"none", "new", "existing"};
    const json_t *props = json_object_get(t->schema, "properties");
    const char *key;
    json_t *v;
    int e;

    if (!json_is_object(x)) {
        snprintf(why, whylen, "'x-sandfleet' (where the tool runs) is missing or not an object");
        return -1;
    }
    t->sandbox = json_object_get(props, "sandbox_id") ? SF_SB_EXISTING : SF_SB_NONE;
    json_object_foreach((json_t *)x, key, v) {
        if (!strcmp(key, "runs")) {
            if (enum_of(v, runs, 3, &e) < 0)
                goto bad;
            t->runs = (sf_runs)e;
        } else if (!strcmp(key, "sandbox")) {
            if (enum_of(v, sandbox, 3, &e) < 0)
                goto bad;
            t->sandbox = (sf_tool_sandbox)e;
        } else if (!strcmp(key, "resume")) {
            if (!json_is_boolean(v))
                goto bad;
            t->resume = json_is_true(v);
        } else if (!strcmp(key, "wait")) {
            const char *arg = json_string_value(json_object_get(v, "arg"));
            json_t *d = json_object_get(v, "default"), *m = json_object_get(v, "max");
            if (!arg || !json_is_integer(d) || !json_is_integer(m) || json_integer_value(d) < 1 ||
                json_integer_value(m) < json_integer_value(d) || json_object_size(v) != 3 ||
                !json_is_object(json_object_get(props, arg)))
                goto bad;
            t->wait_arg = strdup(arg);
            t->wait_default_ms = json_integer_value(d);
            t->wait_max_ms = json_integer_value(m);
        } else if (!strcmp(key, "claim_check")) {
            size_t i;
            json_t *a;
            if (!json_is_array(v) || json_array_size(v) > SF_TOOL_CLAIMS_MAX)
                goto bad;
            json_array_foreach(v, i, a) {
                const char *s = json_string_value(a);
                if (!s || !json_is_object(json_object_get(props, s)))
                    goto bad;
                t->claims[t->nclaims++] = strdup(s);
            }
        } else if (!strcmp(key, "output")) {
            char swhy[256];
            if (!json_is_object(v) || sf_schema_check(v, swhy, sizeof(swhy)) < 0)
                goto bad;
            t->output = json_incref(v);
        } else if (!strcmp(key, "list_schema")) {
            /* tools/list keeps $schema in the inputSchema (gateway/tools.c) */
            if (!json_is_boolean(v))
                goto bad;
        } else if (!strcmp(key, "summary")) {
            /* the README's one-line description (docs/gen-tools.mjs); not served */
            if (!json_is_string(v) || json_string_length(v) > 2048)
                goto bad;
        } else {
            snprintf(why, whylen, "unknown key 'x-sandfleet.%s' (runs, sandbox, wait, resume, "
                     "claim_check, output, summary, list_schema)", key);
            return -1;
        }
    }
    if (!json_object_get(x, "runs")) {
        snprintf(why, whylen, "'x-sandfleet.runs' is required (gateway, scheduler or worker)");
        return -1;
    }
    if (t->sandbox == SF_SB_EXISTING && !json_object_get(props, "sandbox_id")) {
        snprintf(why, whylen, "a tool on an existing sandbox needs a 'sandbox_id' argument");
        return -1;
    }
    if (!t->output)
        t->output = json_pack("{s:s}", "type", "object");
    return 0;
bad:
    snprintf(why, whylen, "'x-sandfleet.%s' has a wrong value (see schemas/README.md)", key);
    return -1;
}

/* Takes s (a loaded schema file) as tool t. -1 with why. */
static int tool_init(sf_tool *t, json_t *s, int internal, char *why, size_t whylen)
{
    const char *name = json_string_value(json_object_get(s, "title"));
    char swhy[256];

    memset(t, 0, sizeof(*t));
    t->schema = s;
    t->internal = internal;
    if (!name) {
        snprintf(why, whylen, "'title' (the tool name) is missing");
        return -1;
    }
    /* The catalogue-only block is checked here; the validator skips x- keys. */
    if (sf_schema_check(s, swhy, sizeof(swhy)) < 0) {
        snprintf(why, whylen, "%s", swhy);
        return -1;
    }
    t->name = strdup(name);
    if (!t->name)
        return -1;
    return parse_decl(t, json_object_get(s, "x-sandfleet"), why, whylen);
}

int sf_toolset_load(sf_toolset *set, const char *dir, char *why, size_t whylen)
{
    struct dirent **ents = NULL;
    int n = scandir(dir, &ents, json_file, alphasort), rc = -EINVAL;

    memset(set, 0, sizeof(*set));
    if (n < 0) {
        snprintf(why, whylen, "Cannot read the tool schemas in %s; set schemas_dir.", dir);
        return -EINVAL;
    }
    if (n == 0 || n > TOOLS_MAX || !(set->tools = calloc((size_t)n + N_INTERNAL, sizeof(sf_tool)))) {
        snprintf(why, whylen, "%s must hold 1 to %d tool schemas.", dir, TOOLS_MAX);
        goto out;
    }
    for (int i = 0; i < n; i++) {
        char path[4096], twhy[384];
        json_error_t jerr;
        json_t *s;

        snprintf(path, sizeof(path), "%s/%s", dir, ents[i]->d_name);
        if (!(s = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr))) {
            snprintf(why, whylen, "%s:%d: %s", path, jerr.line, jerr.text);
            goto out;
        }
        if (tool_init(&set->tools[set->n], s, 0, twhy, sizeof(twhy)) < 0) {
            snprintf(why, whylen, "%s: %s", path, twhy);
            tool_fini(&set->tools[set->n]);
            goto out;
        }
        if (sf_toolset_find(set, set->tools[set->n].name)) {
            snprintf(why, whylen, "%s: a tool named '%s' is declared twice", path,
                     set->tools[set->n].name);
            tool_fini(&set->tools[set->n]);
            goto out;
        }
        set->n++;
    }
    for (size_t i = 0; i < N_INTERNAL; i++) {
        char twhy[384];
        json_t *sc = json_loads(internal_schemas[i], 0, NULL);
        const char *iname = internal_names[i];
        if (sf_toolset_find(set, iname)) {
            snprintf(why, whylen, "%s: a tool named '%s' is declared twice (it is built in)",
                     dir, iname);
            json_decref(sc);
            goto out;
        }
        if (!sc || tool_init(&set->tools[set->n], sc, 1, twhy, sizeof(twhy)) < 0) {
            snprintf(why, whylen, "the built-in %s declaration: %s", iname,
                     sc ? twhy : "out of memory");
            if (sc)
                tool_fini(&set->tools[set->n]);
            goto out;
        }
        set->tools[set->n].answered = !strncmp(iname, "sf.hosted_", 10);
        set->n++;
    }
    rc = 0;
out:
    for (int i = 0; i < n; i++)
        free(ents[i]);
    free(ents);
    if (rc < 0)
        sf_toolset_fini(set);
    return rc;
}

void sf_toolset_fini(sf_toolset *set)
{
    for (size_t i = 0; i < set->n; i++)
        tool_fini(&set->tools[i]);
    free(set->tools);
    memset(set, 0, sizeof(*set));
}

const sf_tool *sf_toolset_find(const sf_toolset *set, const char *name)
{
    for (size_t i = 0; name && i < set->n; i++)
        if (!strcmp(set->tools[i].name, name))
            return &set->tools[i];
    return NULL;
}

int64_t sf_exec_timeout_ms(const json_t *args)
{
    const json_t *t = json_object_get(args, "timeout_ms");
    json_int_t ms = json_is_integer(t) ? json_integer_value(t) : 0;

    if (ms <= 0)
        return SF_EXEC_TIMEOUT_DEFAULT_MS;
    return ms > SF_EXEC_TIMEOUT_MAX_MS ? SF_EXEC_TIMEOUT_MAX_MS : ms;
}

int64_t sf_tool_wait_ms(const sf_tool *t, const json_t *args, int64_t base_ms, int64_t margin_ms)
{
    const json_t *v;
    json_int_t ms;

    if (!t || !t->wait_arg)
        return base_ms;
    v = json_object_get(args, t->wait_arg);
    ms = json_is_integer(v) ? json_integer_value(v) : 0;
    if (ms <= 0)
        ms = t->wait_default_ms;
    if (ms > t->wait_max_ms)
        ms = t->wait_max_ms;
    return ms + margin_ms;
}

int sf_tool_claimable(const sf_tool *t, const char *arg)
{
    for (size_t i = 0; t && i < t->nclaims; i++)
        if (!strcmp(t->claims[i], arg))
            return 1;
    return 0;
}

const char *sf_msg_no_sandbox(char *buf, size_t n, const char *id)
{
    snprintf(buf, n, "No sandbox with id '%.63s' exists for your team; call sandbox_list to see "
             "your sandboxes, or sandbox_create to make one.", id);
    return buf;
}

int sf_toolset_validate(const sf_toolset *set, const char *name, const json_t *args, char *why,
                        size_t whylen)
{
    const sf_tool *t = sf_toolset_find(set, name);

    if (!t) {
        snprintf(why, whylen, SF_MSG_UNKNOWN_TOOL_FMT, name);
        return -ENOENT;
    }
    return sf_schema_validate(t->schema, args, why, whylen) < 0 ? -EINVAL : 0;
}

const sf_tool_handler *sf_tool_handler_find(const sf_tool_handler *h, size_t n, const char *name)
{
    for (size_t i = 0; name && i < n; i++)
        if (!strcmp(h[i].name, name))
            return &h[i];
    return NULL;
}

int sf_toolset_check_handlers(const sf_toolset *set, sf_runs where, const sf_tool_handler *h,
                              size_t n, char *why, size_t whylen)
{
    static const char *const names[] = {"gateway", "scheduler", "worker"};

    for (size_t i = 0; i < set->n; i++) {
        const sf_tool *t = &set->tools[i];
        if (t->runs == where && !sf_tool_handler_find(h, n, t->name)) {
            snprintf(why, whylen, "tool %s declares runs: %s, but this %s has no handler for it; "
                     "deploy the matching build of every daemon", t->name, names[where],
                     names[where]);
            return -EINVAL;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const sf_tool *t = sf_toolset_find(set, h[i].name);
        if (!t || t->runs != where) {
            snprintf(why, whylen, "this %s handles %s, which the tool schemas do not declare to "
                     "run here; point schemas_dir at this build's schemas", names[where],
                     h[i].name);
            return -EINVAL;
        }
    }
    return 0;
}
