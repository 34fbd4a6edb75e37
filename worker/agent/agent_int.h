/* Shared by the guest agent's files (agent.c: the protocol loop and the
 * commands; agent_vm.c: what differs inside a microVM). */
#ifndef AGENT_INT_H
#define AGENT_INT_H

#include <stdint.h>
#include <sys/types.h>

#include "sf_agentproto.h"

/* Finds the virtio-serial port named SF_AP_VIRTIO_PORT and opens it
 * (non-blocking); waits up to 5 s for it to appear. fd or -errno. */
int agent_vm_open(void);

/* Applies what a ping carries: clock, entropy (credited, then a reseed of the
 * kernel's generator), hostname. Failures are reported on stderr only. */
void agent_vm_ping(const sf_ap_msg *m);

/* agent_relay.c: inside a microVM, forks the preview relay (TCP 49983: "<port>\n", then
 * the guest's 127.0.0.1:<port>). Returns at once in the agent. */
void agent_relay_start(void);

/* agent.c: queue a frame for the worker (the agent exits if its queue overflows). */
void agent_send(const sf_ap_msg *m);
/* An `error` answer to request id: one sentence, and the errno behind it (0: none). */
void agent_send_error(uint32_t id, int errnum, const char *msg);

/* agent_fs.c: answers one fread, fwrite, flist, fmove or fdel request (never blocks:
 * regular files only, opened O_NONBLOCK; bounded pages). */
void agent_fs_request(const sf_ap_msg *m);

/* agent_proc.c: background commands (their logs), stdin feeders, process requests. */
#define AGENT_BG_MAX 64         /* background commands running at once */
struct pollfd;
/* 1 while another background command may start. */
int agent_bg_room(void);
/* Registers background command pid, its merged output's read end fd (taken), or a
 * detached command's stdout fd and stderr fd2 (-1: none), killed with its process group
 * at deadline_ms (sf_mono_ms; 0: never). 0, or -1 when no slot is free (fds not taken). */
int agent_bg_add(pid_t pid, int fd, int fd2, int64_t deadline_ms);
/* The loop reaped pid: 1 when it was a background command (its status kept). */
int agent_bg_reaped(pid_t pid, int status);
/* Holds the stdin of exec id (fd: its pipe's write end, taken). 0, or -1 (no room). */
int agent_in_add(uint32_t id, int fd);
/* input, plist, pkill, plogs */
void agent_proc_request(const sf_ap_msg *m);
/* The fds to poll (at most room); then their events. */
int agent_proc_fds(struct pollfd *pfd, int room);
void agent_proc_events(const struct pollfd *pfd, int n);
/* The worker's connection went (a new one may come): pending kills answer nobody, the
 * stdins it fed close. */
void agent_proc_disconnected(void);
/* Pending kills; returns when to be called again (-1: nothing pending). */
int64_t agent_proc_tick(int64_t now);

#endif
