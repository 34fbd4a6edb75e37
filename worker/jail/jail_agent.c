/* The jail's side of the agent protocol (schemas/agent-protocol.md): the blocking first
 * ping on the pool thread that creates the jail, then the agent link shared with the qemu
 * driver (agent_link.c: requests matched to replies by id, worker-side deadlines,
 * everything the agent sends treated as untrusted) for exec, cancel and file requests. */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "agent_link.h"
#include "jail_int.h"
#include "sf_agentproto.h"
#include "sf_log.h"
#include "sf_util.h"
#include "sf_msg.h"

void wk_sandbox_release(wk_sandbox *sb)
{
    if (sb->killed && sb->depth == 0)
        free(sb);
}

static void on_link_down(void *arg, const char *why)
{
    wk_sandbox *sb = arg;

    if (!sb->killed)
        sf_warn("msg=\"sandbox agent gone\" sandbox=%s why=\"%s\"", sb->id, why);
}

static uint64_t oom_kills(void *arg)
{
    wk_sandbox *sb = arg;
    return wk_cgroup_oom_kills(&sb->cg, &sb->oom_fd);
}

int wk_agent_attach(wk_sandbox *sb, int fd)
{
    if (!(sb->link = wk_alink_new(sb->base, fd, sb->id)))
        return -ENOMEM;
    wk_alink_on_down(sb->link, on_link_down, sb);
    wk_alink_oom_probe(sb->link, oom_kills, sb);
    return 0;
}

void wk_agent_detach(wk_sandbox *sb, const char *error)
{
    if (!sb->link)
        return;
    wk_alink_close(sb->link, error);
    wk_alink_free(sb->link);
    sb->link = NULL;
    if (sb->oom_fd >= 0) /* the OOM probe's file: only the link's results read it */
        close(sb->oom_fd);
    sb->oom_fd = -1;
}

int wk_jail_exec(wk_sandbox *sb, const wk_exec_req *req, wk_exec_cb cb, void *arg)
{
    if (!sb || !req || !cb)
        return -EINVAL;
    if (sb->kept && !sb->killed)
        return -ESHUTDOWN; /* left for the next worker: this one is stopping */
    if (sb->killed || !sb->link)
        return -ESRCH;
    return wk_alink_exec(sb->link, req, cb, arg);
}

int wk_jail_exec_cancel(wk_sandbox *sb, void *arg)
{
    if (!sb || sb->killed || !sb->link)
        return -ENOENT;
    return wk_alink_cancel(sb->link, arg);
}

int wk_jail_exec_input(wk_sandbox *sb, void *arg, const char *data, size_t len, int eof)
{
    if (!sb || sb->killed || !sb->link)
        return -ENOENT;
    return wk_alink_input(sb->link, arg, data, len, eof);
}

int wk_jail_file(wk_sandbox *sb, const wk_file_req *req, wk_file_cb cb, void *arg)
{
    if (!sb || !req || !cb)
        return -EINVAL;
    if (sb->kept && !sb->killed)
        return -ESHUTDOWN; /* left for the next worker: this one is stopping */
    if (sb->killed || !sb->link)
        return -ESRCH;
    return wk_alink_file(sb->link, req, cb, arg);
}
