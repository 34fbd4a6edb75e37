#include "sf_mpjson.h"

#include <errno.h>
#include <string.h>

void sf_mp_pack_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

void sf_mp_pack_kv_str(msgpack_packer *pk, const char *k, const char *v)
{
    sf_mp_pack_str(pk, k);
    sf_mp_pack_str(pk, v);
}

static int pack_rec(msgpack_packer *pk, const json_t *v, int depth)
{
    if (depth > SF_MPJSON_MAX_DEPTH)
        return -EINVAL;
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *k;
        json_t *e;
        msgpack_pack_map(pk, json_object_size(v));
        json_object_foreach((json_t *)v, k, e) {
            sf_mp_pack_str(pk, k);
            if (pack_rec(pk, e, depth + 1) < 0)
                return -EINVAL;
        }
        return 0;
    }
    case JSON_ARRAY: {
        size_t i;
        json_t *e;
        msgpack_pack_array(pk, json_array_size(v));
        json_array_foreach(v, i, e) {
            if (pack_rec(pk, e, depth + 1) < 0)
                return -EINVAL;
        }
        return 0;
    }
    case JSON_STRING:
        msgpack_pack_str(pk, json_string_length(v));
        msgpack_pack_str_body(pk, json_string_value(v), json_string_length(v));
        return 0;
    case JSON_INTEGER:
        msgpack_pack_int64(pk, json_integer_value(v));
        return 0;
    case JSON_REAL:
        msgpack_pack_double(pk, json_real_value(v));
        return 0;
    case JSON_TRUE:
        msgpack_pack_true(pk);
        return 0;
    case JSON_FALSE:
        msgpack_pack_false(pk);
        return 0;
    case JSON_NULL:
        msgpack_pack_nil(pk);
        return 0;
    }
    return -EINVAL;
}

int sf_mpjson_pack(msgpack_packer *pk, const json_t *v)
{
    return pack_rec(pk, v, 0);
}

static int unpack_rec(const msgpack_object *o, json_t **out, const char **why, int depth)
{
    json_t *j = NULL;

    if (depth > SF_MPJSON_MAX_DEPTH) {
        *why = "value nested too deeply";
        return -EINVAL;
    }
    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
        j = json_null();
        break;
    case MSGPACK_OBJECT_BOOLEAN:
        j = json_boolean(o->via.boolean);
        break;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        if (o->via.u64 > (uint64_t)INT64_MAX) {
            *why = "integer out of range";
            return -EINVAL;
        }
        j = json_integer((json_int_t)o->via.u64);
        break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        j = json_integer(o->via.i64);
        break;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        j = json_real(o->via.f64);
        break;
    case MSGPACK_OBJECT_STR:
        j = json_stringn_nocheck(o->via.str.ptr, o->via.str.size);
        break;
    case MSGPACK_OBJECT_ARRAY:
        j = json_array();
        for (uint32_t i = 0; j && i < o->via.array.size; i++) {
            json_t *e;
            if (unpack_rec(&o->via.array.ptr[i], &e, why, depth + 1) < 0)
                goto fail;
            json_array_append_new(j, e);
        }
        break;
    case MSGPACK_OBJECT_MAP:
        j = json_object();
        for (uint32_t i = 0; j && i < o->via.map.size; i++) {
            const msgpack_object_kv *kv = &o->via.map.ptr[i];
            json_t *e;
            if (kv->key.type != MSGPACK_OBJECT_STR) {
                *why = "map key is not a string";
                goto fail;
            }
            if (unpack_rec(&kv->val, &e, why, depth + 1) < 0)
                goto fail;
            json_object_setn_new_nocheck(j, kv->key.via.str.ptr, kv->key.via.str.size, e);
        }
        break;
    default:
        *why = "binary and extension values are not accepted here";
        return -EINVAL;
    }
    if (!j) {
        *why = "out of memory";
        return -ENOMEM;
    }
    *out = j;
    return 0;
fail:
    json_decref(j);
    return -EINVAL;
}

int sf_mpjson_unpack(const msgpack_object *o, json_t **out, const char **why)
{
    return unpack_rec(o, out, why, 0);
}

const msgpack_object *sf_mp_map_get(const msgpack_object *map, const char *key)
{
    size_t klen = strlen(key);

    if (map->type != MSGPACK_OBJECT_MAP)
        return NULL;
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        const msgpack_object_kv *kv = &map->via.map.ptr[i];
        if (kv->key.type == MSGPACK_OBJECT_STR && kv->key.via.str.size == klen &&
            memcmp(kv->key.via.str.ptr, key, klen) == 0)
            return &kv->val;
    }
    return NULL;
}

int sf_mp_get_str(const msgpack_object *map, const char *key, char *dst, size_t n)
{
    const msgpack_object *v = sf_mp_map_get(map, key);

    if (!v || v->type == MSGPACK_OBJECT_NIL)
        return -ENOENT;
    if (v->type != MSGPACK_OBJECT_STR)
        return -EINVAL;
    if (v->via.str.size >= n)
        return -E2BIG;
    if (memchr(v->via.str.ptr, '\0', v->via.str.size))
        return -EINVAL;
    memcpy(dst, v->via.str.ptr, v->via.str.size);
    dst[v->via.str.size] = '\0';
    return 0;
}

int sf_mp_get_i64(const msgpack_object *map, const char *key, int64_t *out)
{
    const msgpack_object *v = sf_mp_map_get(map, key);

    if (!v || v->type == MSGPACK_OBJECT_NIL)
        return -ENOENT;
    if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (v->via.u64 > (uint64_t)INT64_MAX)
            return -EINVAL;
        *out = (int64_t)v->via.u64;
        return 0;
    }
    if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *out = v->via.i64;
        return 0;
    }
    return -EINVAL;
}

int sf_mp_get_bool(const msgpack_object *map, const char *key, int *out)
{
    const msgpack_object *v = sf_mp_map_get(map, key);

    if (!v || v->type == MSGPACK_OBJECT_NIL)
        return -ENOENT;
    if (v->type != MSGPACK_OBJECT_BOOLEAN)
        return -EINVAL;
    *out = v->via.boolean;
    return 0;
}
