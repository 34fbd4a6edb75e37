/* sf_jsonrpc: one JSON-RPC 2.0 message from an MCP client, parsed and checked the same
 * way whichever transport carried it (the gateway's HTTP paths; the fuzz harness
 * tests/fuzz/fuzz_jsonrpc.c drives this exact code). Batches are not accepted (MCP
 * 2025-06-18 removed them). Library code: no logging. */
#ifndef SF_JSONRPC_H
#define SF_JSONRPC_H

#include <jansson.h>
#include <stddef.h>

/* JSON-RPC error codes. */
#define SF_RPC_PARSE_ERROR -32700
#define SF_RPC_INVALID_REQUEST -32600
#define SF_RPC_METHOD_NOT_FOUND -32601
#define SF_RPC_INVALID_PARAMS -32602
#define SF_RPC_INTERNAL_ERROR -32603

typedef enum sf_rpc_kind {
    SF_RPC_REQUEST = 1, /* method and id: wants exactly one answer */
    SF_RPC_NOTIFICATION, /* method, no id (or a null id): no answer */
    SF_RPC_RESPONSE,     /* result or error: an answer to something we sent */
} sf_rpc_kind;

typedef struct sf_rpc_msg {
    json_t *msg;        /* owns what id, method and params point into: the whole message,
                           or only the id when a fixed shape was read without jansson
                           (ping, tools/list); NULL when the body was not JSON */
    sf_rpc_kind kind;
    json_t *id;         /* borrowed from msg: a string or an integer; NULL when there is
                           none to echo (a notification, or an id of the wrong type) */
    const char *method; /* borrowed from msg (requests and notifications) */
    json_t *params;     /* borrowed from msg: an object, or NULL when absent */
} sf_rpc_msg;

/* Parses body[0..len). 0 and a filled message, or a negative JSON-RPC error code
 * (SF_RPC_PARSE_ERROR, SF_RPC_INVALID_REQUEST, SF_RPC_INVALID_PARAMS) with one actionable
 * sentence in why; m->id then holds the id the error answer must carry, if any. Either
 * way release m with sf_rpc_msg_fini. */
int sf_rpc_parse(const char *body, size_t len, sf_rpc_msg *m, char *why, size_t whylen);
void sf_rpc_msg_fini(sf_rpc_msg *m);

#endif
