/* toml.h: the one TOML edit `sandfleet connect codex` makes — set a table's string keys in
 * a TOML text and keep everything else (other tables, comments, the table's other keys).
 * Not a TOML parser: a scanner that knows strings (all four kinds), arrays and inline
 * tables well enough to tell table headers and key lines from values. */
#ifndef CLI_TOML_H
#define CLI_TOML_H

#include <stddef.h>

typedef struct cli_toml_kv {
    const char *key;   /* a bare key */
    const char *value; /* written as a basic string */
} cli_toml_kv;

/* Returns in *out (malloc'd, NUL-terminated) `text` with table `table` (dotted bare keys,
 * e.g. "mcp_servers.sandfleet") holding kv: keys of kv and of drop are removed from the
 * table (and its sub-tables named in drop, e.g. "env"), its other keys stay, and kv is
 * written under its header (the table is appended when absent).
 * 0; -EEXIST when the table is defined another way (dotted keys, an inline table, an array
 * of tables) and -EINVAL when the text cannot be scanned (an unterminated string or
 * array), both with why; -ENOMEM. */
int cli_toml_set_table(const char *text, size_t len, const char *table, const cli_toml_kv *kv,
                       size_t nkv, const char *const *drop, size_t ndrop, char **out, char *why,
                       size_t whylen);

#endif
