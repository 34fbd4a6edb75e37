/* kb_group: the consumer-group coordinator and the committed offsets. Runs the group
 * protocol only (the assignment itself is the clients', e.g. cooperative-sticky):
 * generations, member ids, the join window (a rebalance completes as soon as every known
 * member rejoined, else when its rebalance timeout ends; members that did not rejoin are
 * dropped), SyncGroup hands the leader's assignments out, and a member heard from less
 * recently than its session timeout is dropped (its partitions move at the next join).
 *
 * Every handler decodes its request (0 after queuing or sending its answer, -EBADMSG when
 * malformed: the server closes that connection) and answers through the reply function,
 * at once or later (a JoinGroup waits for the others, a SyncGroup for the leader's). */
#ifndef KB_GROUP_H
#define KB_GROUP_H

#include "wire.h"

#include <stdint.h>

/* A request waiting for its answer: its connection, correlation id and version. */
typedef struct kb_req {
    void *conn;
    int32_t corr;
    int16_t ver;
} kb_req;

/* Sends body (the answer after its correlation id) for req. */
typedef void (*kb_reply_fn)(void *ctx, const kb_req *req, kb_wbuf *body);

typedef struct kb_groups kb_groups;

kb_groups *kb_groups_new(kb_reply_fn fn, void *ctx);
void kb_groups_free(kb_groups *gs);
int kb_group_join(kb_groups *gs, kb_rbuf *r, const kb_req *req, int64_t now);
int kb_group_sync(kb_groups *gs, kb_rbuf *r, const kb_req *req, int64_t now);
int kb_group_heartbeat(kb_groups *gs, kb_rbuf *r, const kb_req *req, int64_t now);
int kb_group_leave(kb_groups *gs, kb_rbuf *r, const kb_req *req, int64_t now);
int kb_group_offset_commit(kb_groups *gs, kb_rbuf *r, const kb_req *req, int64_t now);
int kb_group_offset_fetch(kb_groups *gs, kb_rbuf *r, const kb_req *req, int64_t now);
/* Session expiry and join deadlines; call every ~100 ms. */
void kb_groups_tick(kb_groups *gs, int64_t now);
/* conn closed: its waiting requests are forgotten (their members expire by session). */
void kb_groups_conn_gone(kb_groups *gs, void *conn);
/* Counts for the broker's statistics. */
void kb_groups_stats(const kb_groups *gs, long *groups, long *members, long *rebalances);

#endif
