/* kb_broker: what the broker's server modules share: the server and connection structs,
 * the API and error codes, and the request handlers' contract. Internal to ops/kafka
 * (server.c dispatches, conn.c reads and frames, topics.c and records.c answer); the fuzz
 * harness uses it too.
 *
 * A handler decodes its request's body in one validating pass into a parsed struct (a
 * malformed request changes nothing), then answers from that struct into w. It returns
 * KB_ANSWER (send w now), KB_SILENT (no answer: Produce with acks 0), KB_PARKED (answered
 * later: a waiting Fetch), or -errno to close the connection. */
#ifndef KB_BROKER_H
#define KB_BROKER_H

#include "group.h"
#include "log.h"
#include "server.h"
#include "wire.h"

#include <event2/event.h>
#include <stdint.h>

#define KB_NODE_ID 1
#define KB_OUT_MAX (64u << 20)   /* a connection's unsent answers before it is read again */
#define KB_CONNS_MAX 4096
#define KB_TOPICS_MAX 16384
#define KB_FETCH_RESP_MAX (256u << 20)

enum { API_PRODUCE = 0, API_FETCH = 1, API_LIST_OFFSETS = 2, API_METADATA = 3,
       API_OFFSET_COMMIT = 8, API_OFFSET_FETCH = 9, API_FIND_COORDINATOR = 10,
       API_JOIN_GROUP = 11, API_HEARTBEAT = 12, API_LEAVE_GROUP = 13, API_SYNC_GROUP = 14,
       API_API_VERSIONS = 18, API_CREATE_TOPICS = 19, API_DELETE_TOPICS = 20, API_MAX = 21 };

enum { ERR_NONE = 0, ERR_OFFSET_OUT_OF_RANGE = 1, ERR_CORRUPT_MESSAGE = 2,
       ERR_UNKNOWN_TOPIC_OR_PARTITION = 3, ERR_INVALID_TOPIC = 17,
       ERR_RECORD_LIST_TOO_LARGE = 18, ERR_UNSUPPORTED_VERSION = 35,
       ERR_TOPIC_ALREADY_EXISTS = 36, ERR_INVALID_PARTITIONS = 37,
       ERR_INVALID_REPLICATION_FACTOR = 38, ERR_INVALID_REQUEST = 42,
       ERR_KAFKA_STORAGE = 56, ERR_INVALID_CONFIG = 40 };

enum { KB_ANSWER = 0, KB_SILENT = 1, KB_PARKED = 2 };

typedef struct kb_conn kb_conn;
typedef struct kb_fetch kb_fetch;

struct kb_conn {
    kb_server *s;
    struct bufferevent *bev;
    struct event *resume;
    int parked;       /* a request waits for its answer: later ones wait */
    int dead;         /* to be closed by its next turn */
    kb_fetch *fetch;  /* that request, when it is a Fetch */
    kb_conn *prev, *next;
};

typedef struct kb_stats {
    long req[API_MAX];
    long fetch_now, fetch_woken, fetch_empty;
    long produced_batches, produced_bytes, fetched_bytes;
    long bytes_in, bytes_out, malformed, conns;
} kb_stats;

struct kb_server {
    struct event_base *base;
    kb_server_cfg cfg;
    struct evconnlistener *lis;
    struct event *tick, *wake;
    kb_log *log;
    kb_groups *groups;
    kb_conn *conns;
    long nconns;
    kb_fetch *fetches;    /* waiting fetches */
    kb_rtopics rt;        /* the request being answered (its arrays reused; a waiting fetch
                           * takes them with it) */
    kb_stats st;
    char cluster_id[40];  /* new at every start: clients tell a restarted broker by it */
};

typedef int (*kb_handler)(kb_conn *c, kb_rbuf *r, const kb_req *req, kb_wbuf *w);

/* server.c: one request (its bytes after the size): 0, or -errno to close the connection. */
int kb_server_request(kb_conn *c, const uint8_t *p, size_t len);

/* conn.c */
/* A connection on fd (owned from here on); NULL when refused (too many, no memory). */
kb_conn *kb_conn_new(kb_server *s, evutil_socket_t fd);
void kb_conn_free(kb_conn *c);
/* Queues one answer: its size, the correlation id, body. */
void kb_conn_send(kb_conn *c, int32_t corr, const kb_wbuf *body);
/* An answer that came later was sent: the connection's next requests run next turn. */
void kb_conn_answered(kb_conn *c);
/* The group module's reply function (ctx unused). */
void kb_conn_group_reply(void *ctx, const kb_req *req, kb_wbuf *body);

/* topics.c */
int kb_h_metadata(kb_conn *c, kb_rbuf *r, const kb_req *req, kb_wbuf *w);
int kb_h_create_topics(kb_conn *c, kb_rbuf *r, const kb_req *req, kb_wbuf *w);
int kb_h_delete_topics(kb_conn *c, kb_rbuf *r, const kb_req *req, kb_wbuf *w);
int kb_h_list_offsets(kb_conn *c, kb_rbuf *r, const kb_req *req, kb_wbuf *w);
/* The topic, created with the default partition count when allowed and missing; else
 * NULL and *err the error code for the caller's answer (ERR_NONE with a topic). */
kb_topic *kb_topic_get(kb_server *s, const char *name, size_t n, int create, int16_t *err);

/* records.c */
int kb_h_produce(kb_conn *c, kb_rbuf *r, const kb_req *req, kb_wbuf *w);
int kb_h_fetch(kb_conn *c, kb_rbuf *r, const kb_req *req, kb_wbuf *w);
void kb_fetch_free(kb_fetch *f);
/* s->wake's callback: data arrived or topics went, each waiting fetch is evaluated again. */
void kb_fetches_wake(evutil_socket_t fd, short what, void *arg);

#endif
