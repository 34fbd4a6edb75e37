/* sf_tools: the tool catalogue, read from schemas/tools/ (one .json per tool). Each file is the JSON
 * Schema of one tool's arguments, with the tool's name (title), description and MCP
 * annotations (x-annotations). The gateway serves it and validates calls with it; the
 * scheduler validates jobs from batch producers with it. */
#ifndef SF_TOOLS_H
#define SF_TOOLS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

typedef struct sf_tool {
    char *name;
    json_t *schema; /* the file as loaded */
} sf_tool;

typedef struct sf_toolset {
    sf_tool *tools;
    size_t n;
} sf_toolset;

/* Loads and checks every *.json in dir. 0, or -EINVAL with why naming the file. */
int sf_toolset_load(sf_toolset *set, const char *dir, char *why, size_t whylen);
void sf_toolset_fini(sf_toolset *set);
const sf_tool *sf_toolset_find(const sf_toolset *set, const char *name);
/* sandbox_exec's timeout: timeout_ms, or 60 s when absent or not positive, clamped to
 * 600 s (TOOLS.md). Gateway and worker both use it, so they agree on deadlines. */
#define SF_EXEC_TIMEOUT_DEFAULT_MS 60000
#define SF_EXEC_TIMEOUT_MAX_MS 600000
int64_t sf_exec_timeout_ms(const json_t *args);

/* The one answer for a sandbox id that is not the caller's, whether it never existed or
 * belongs to another team (the two must be indistinguishable). Writes into buf. */
const char *sf_msg_no_sandbox(char *buf, size_t n, const char *id);

/* 0; -ENOENT unknown tool; -EINVAL arguments invalid. why gets one actionable sentence. */
int sf_toolset_validate(const sf_toolset *set, const char *name, const json_t *args, char *why,
                        size_t whylen);

#endif
