#include "sf_jsonrpc.h"

#include <stdio.h>
#include <string.h>

static int fail(char *why, size_t whylen, int code, const char *text)
{
    snprintf(why, whylen, "%s", text);
    return code;
}

int sf_rpc_parse(const char *body, size_t len, sf_rpc_msg *m, char *why, size_t whylen)
{
    json_error_t jerr;
    json_t *id, *params;
    const char *version;

    memset(m, 0, sizeof(*m));
    if (!(m->msg = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr))) {
        snprintf(why, whylen, "Parse error: the body is not valid JSON (%s at line %d).",
                 jerr.text, jerr.line);
        return SF_RPC_PARSE_ERROR;
    }
    if (json_is_array(m->msg))
        return fail(why, whylen, SF_RPC_INVALID_REQUEST,
                    "Invalid Request: JSON-RPC batches are not supported; send one message per "
                    "request.");
    version = json_string_value(json_object_get(m->msg, "jsonrpc"));
    if (!json_is_object(m->msg) || !version || strcmp(version, "2.0") != 0)
        return fail(why, whylen, SF_RPC_INVALID_REQUEST,
                    "Invalid Request: send a JSON-RPC 2.0 object with \"jsonrpc\": \"2.0\".");
    id = json_object_get(m->msg, "id");
    if (id && !json_is_null(id) && !json_is_string(id) && !json_is_integer(id))
        return fail(why, whylen, SF_RPC_INVALID_REQUEST,
                    "Invalid Request: 'id' must be a string or an integer.");
    m->id = json_is_null(id) ? NULL : id;
    m->method = json_string_value(json_object_get(m->msg, "method"));
    if (!m->method) {
        if (json_object_get(m->msg, "method"))
            return fail(why, whylen, SF_RPC_INVALID_REQUEST,
                        "Invalid Request: 'method' must be a string.");
        if (json_object_get(m->msg, "result") || json_object_get(m->msg, "error")) {
            m->kind = SF_RPC_RESPONSE;
            return 0;
        }
        return fail(why, whylen, SF_RPC_INVALID_REQUEST, "Invalid Request: 'method' is missing.");
    }
    m->kind = m->id ? SF_RPC_REQUEST : SF_RPC_NOTIFICATION;
    params = json_object_get(m->msg, "params");
    if (json_is_object(params))
        m->params = params;
    else if (params && m->kind == SF_RPC_REQUEST) /* a notification is never answered */
        return fail(why, whylen, SF_RPC_INVALID_PARAMS,
                    "Invalid params: 'params' must be an object.");
    return 0;
}

void sf_rpc_msg_fini(sf_rpc_msg *m)
{
    if (!m)
        return;
    json_decref(m->msg);
    memset(m, 0, sizeof(*m));
}
