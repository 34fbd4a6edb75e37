#include "sf_tools.h"
#include "sf_schema.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOOLS_MAX 64

static int json_file(const struct dirent *d)
{
    size_t n = strlen(d->d_name);
    return n > 5 && !strcmp(d->d_name + n - 5, ".json");
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
    if (n == 0 || n > TOOLS_MAX || !(set->tools = calloc((size_t)n, sizeof(sf_tool)))) {
        snprintf(why, whylen, "%s must hold 1 to %d tool schemas.", dir, TOOLS_MAX);
        goto out;
    }
    for (int i = 0; i < n; i++) {
        char path[4096], swhy[256];
        json_error_t jerr;
        json_t *s;
        const char *name;

        snprintf(path, sizeof(path), "%s/%s", dir, ents[i]->d_name);
        if (!(s = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr))) {
            snprintf(why, whylen, "%s:%d: %s", path, jerr.line, jerr.text);
            goto out;
        }
        name = json_string_value(json_object_get(s, "title"));
        if (!name || sf_schema_check(s, swhy, sizeof(swhy)) < 0) {
            snprintf(why, whylen, "%s: %s", path,
                     name ? swhy : "'title' (the tool name) is missing");
            json_decref(s);
            goto out;
        }
        set->tools[set->n].name = strdup(name);
        set->tools[set->n].schema = s;
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
    for (size_t i = 0; i < set->n; i++) {
        free(set->tools[i].name);
        json_decref(set->tools[i].schema);
    }
    free(set->tools);
    memset(set, 0, sizeof(*set));
}

const sf_tool *sf_toolset_find(const sf_toolset *set, const char *name)
{
    for (size_t i = 0; i < set->n; i++)
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
        snprintf(why, whylen, "Unknown tool '%.64s'; call tools/list to see the tools.", name);
        return -ENOENT;
    }
    return sf_schema_validate(t->schema, args, why, whylen) < 0 ? -EINVAL : 0;
}
