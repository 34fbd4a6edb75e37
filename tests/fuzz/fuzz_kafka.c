/* Fuzz harness for the embedded broker's request handling (ops/kafka): each input is the
 * byte stream of one client connection (size-prefixed requests of any API and version),
 * fed to a fresh broker; then the loop runs its pending turns (answers that came later,
 * waiting fetches woken by produced data) and every group member's session expires. The
 * codec must refuse what is malformed (the connection closes), never read past a request,
 * never allocate by a count it has not checked.
 *
 * The corpus in tests/fuzz/corpus/kafka/ holds librdkafka's own requests (ApiVersions,
 * Metadata, Produce, Fetch, ListOffsets, FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
 * OffsetCommit, OffsetFetch, LeaveGroup, CreateTopics, DeleteTopics), recorded from the
 * broker test. */
#include "broker.h"
#include "sf_log.h"
#include "sf_util.h"

#include <event2/event.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int once;
    struct event_base *base;
    kb_server_cfg cfg = {.host = "127.0.0.1", .port = 9092, .partitions = 4, .auto_partitions = 4,
                         .part_cap = 1 << 20, .max_request = 1 << 20};
    kb_server *s;
    kb_conn *c;
    int sv[2];

    if (!once) {
        once = 1;
        signal(SIGPIPE, SIG_IGN);
        sf_log_level = SF_LOG_ERROR + 1;
    }
    if (!(base = event_base_new()))
        return 0;
    if (!(s = kb_server_new(base, &cfg, -1))) {
        event_base_free(base);
        return 0;
    }
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) == 0) {
        char sink[65536];
        if ((c = kb_conn_new(s, sv[0]))) {
            /* (a bufferevent's input takes bytes from its socket only) */
            for (size_t off = 0; off < size;) {
                ssize_t n = write(sv[1], data + off, size - off);
                if (n <= 0)
                    break;
                off += (size_t)n;
                event_base_loop(base, EVLOOP_NONBLOCK);
                while (read(sv[1], sink, sizeof(sink)) > 0)
                    ;
            }
            for (int i = 0; i < 4; i++)
                event_base_loop(base, EVLOOP_NONBLOCK);
            kb_groups_tick(s->groups, sf_mono_ms() + 3600 * 1000);
            event_base_loop(base, EVLOOP_NONBLOCK);
        }
        close(sv[1]);
    }
    kb_server_free(s);
    event_base_free(base);
    return 0;
}
