/* Shared by the guest agent's files (agent.c: the protocol loop and the
 * commands; agent_vm.c: what differs inside a microVM). */
#ifndef AGENT_INT_H
#define AGENT_INT_H

#include "sf_agentproto.h"

/* Finds the virtio-serial port named SF_AP_VIRTIO_PORT and opens it
 * (non-blocking); waits up to 5 s for it to appear. fd or -errno. */
int agent_vm_open(void);

/* Applies what a ping carries: clock, entropy (credited, then a reseed of the
 * kernel's generator), hostname. Failures are reported on stderr only. */
void agent_vm_ping(const sf_ap_msg *m);

/* agent.c: queue a frame for the worker (the agent exits if its queue overflows). */
void agent_send(const sf_ap_msg *m);
/* An `error` answer to request id: one sentence, and the errno behind it (0: none). */
void agent_send_error(uint32_t id, int errnum, const char *msg);

/* agent_fs.c: answers one fread, fwrite, flist, fmove or fdel request (never blocks:
 * regular files only, opened O_NONBLOCK; bounded pages). */
void agent_fs_request(const sf_ap_msg *m);

#endif
