/* sf_schema: validates JSON values (jansson) against the JSON Schema subset that our tool
 * schemas (schemas/tools/) use, with errors an agent can act on.
 *
 * Supported keywords:
 *   type            "object" | "array" | "string" | "integer" | "number" | "boolean" | "null",
 *                   or an array of these
 *   properties, required, additionalProperties (true, false, or a schema: string maps),
 *   propertyNames (a schema applied to each key as a string), maxProperties, minProperties
 *   items (one schema for every element), minItems, maxItems
 *   enum, const     (compared with json_equal)
 *   minimum, maximum, exclusiveMinimum, exclusiveMaximum  (numbers, draft 6+ form)
 *   minLength, maxLength  (counted in Unicode code points of the UTF-8 text, as JSON
 *                   Schema specifies; jansson only hands out valid UTF-8)
 *   x-maxBytes      sandfleet's one enforced extension: the most bytes a string may take
 *                   in UTF-8 (stored strings are bounded in bytes; clients ignore x- keys);
 *                   on an object, the most bytes its keys and string values take together
 *   pattern         a POSIX extended regular expression (<regex.h>), unanchored like in
 *                   JSON Schema; compiled on first use and cached. ECMA-only escapes such
 *                   as \d are refused by sf_schema_check() (write [0-9]).
 *   $defs, $ref     named schemas at the top level, and references to them, only in the
 *                   form "#/$defs/NAME" (a $ref's sibling keywords apply too, as in 2020-12)
 * Ignored (annotations): description, title, default, examples, $schema, $id, $comment and
 * every other key that starts with "x-". Anything else is an unsupported keyword:
 * sf_schema_check() fails on it, sf_schema_validate() ignores it.
 * Boolean schemas are accepted: true accepts everything, false nothing.
 *
 * Integers: "integer" means a JSON number written without fraction or exponent (jansson's
 * integer); 1.0 and 1e3 are numbers but NOT integers. This is stricter than JSON Schema
 * (which calls 1.0 an integer) on purpose: the job codec keeps integer fields as integers.
 * Every integer is also a "number".
 *
 * Nesting: instances and schemas deeper than SF_SCHEMA_MAX_DEPTH levels are rejected.
 *
 * Thread safety: validation only reads the schema; the regex cache is locked.
 * Library code: nothing is logged. */
#ifndef SF_SCHEMA_H
#define SF_SCHEMA_H

#include <stddef.h>

#include <jansson.h>

#define SF_SCHEMA_MAX_DEPTH 32

/* Returns 0 if instance is valid; otherwise -EINVAL and writes one actionable sentence
 * naming the field into why (size whylen; why may be NULL), e.g.
 *   "Argument 'timeout_ms' must be an integer (got string)."
 *   "Argument 'command' is required."
 *   "Argument 'env.FOO' must be a string (got number)."
 *   "Unknown argument 'comand'; valid arguments are: sandbox_id, command, cwd, env, timeout_ms."
 *   "Argument 'timeout_ms' must be at most 600000."
 *   "Key 'A B' in argument 'env' must match the pattern ^[A-Za-z_][A-Za-z0-9_]*$."
 * Nested paths use dots and [i] ("allow_out[2]", "env.FOO"); the instance itself is
 * "Arguments". -ENOMEM when a regex could not be compiled for lack of memory, -EINVAL with
 * a "Schema error" sentence when the schema itself is broken (run sf_schema_check first). */
int sf_schema_validate(const json_t *schema, const json_t *instance, char *why, size_t whylen);

/* Checks that a schema only uses supported keywords with well-formed values (so a typo in
 * a schema file fails at start-up, not silently): 0, or -EINVAL and a sentence such as
 *   "Schema error at 'properties.timeout_ms': unsupported keyword 'minimun'." */
int sf_schema_check(const json_t *schema, char *why, size_t whylen);

/* Frees the cached compiled patterns (for a clean exit under leak checkers). */
void sf_schema_cache_clear(void);

#endif
