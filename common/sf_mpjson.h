/* sf_mpjson: jansson values <-> msgpack, with strict, bounded decoding. */
#ifndef SF_MPJSON_H
#define SF_MPJSON_H

#include <jansson.h>
#include <msgpack.h>

#define SF_MPJSON_MAX_DEPTH 32

/* Packs a JSON value (object -> map, array -> array, string -> str, integer -> int,
 * real -> float64, bool, null -> nil). 0 or -EINVAL (too deep / unsupported). */
int sf_mpjson_pack(msgpack_packer *pk, const json_t *v);
/* Converts a msgpack object to JSON. Map keys must be strings, bin and ext are
 * rejected. 0 and *out (new reference), or -EINVAL with *why. */
int sf_mpjson_unpack(const msgpack_object *o, json_t **out, const char **why);

/* Small accessors for decoding msgpack maps strictly. */
const msgpack_object *sf_mp_map_get(const msgpack_object *map, const char *key);
/* Copies a str field into dst (size n). 0, -ENOENT (absent/nil), -EINVAL (wrong type), -E2BIG. */
int sf_mp_get_str(const msgpack_object *map, const char *key, char *dst, size_t n);
/* Reads an integer field. 0, -ENOENT, -EINVAL. */
int sf_mp_get_i64(const msgpack_object *map, const char *key, int64_t *out);
int sf_mp_get_bool(const msgpack_object *map, const char *key, int *out);
void sf_mp_pack_str(msgpack_packer *pk, const char *s);
void sf_mp_pack_kv_str(msgpack_packer *pk, const char *k, const char *v);

#endif
