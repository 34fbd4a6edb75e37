/* proxy_relay.bpf.c: the kernel relay of tests/bench/proxy's "relay (sockmap)" row.
 * Both sockets of a relayed connection sit in one sockhash, each under the other's
 * socket cookie; this stream verdict program sends every segment a socket receives out of
 * its peer (bpf_sk_redirect_hash, egress), so no byte of a request or response passes
 * through user space. Built with clang -target bpf, loaded by sp_relay through libbpf. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct {
    __uint(type, BPF_MAP_TYPE_SOCKHASH);
    __uint(max_entries, 4096);
    __type(key, __u64);   /* the socket cookie of one side */
    __type(value, __u64); /* the other side's socket */
} sp_pairs SEC(".maps");

SEC("sk_skb/stream_verdict")
int sp_relay_verdict(struct __sk_buff *skb)
{
    __u64 self = bpf_get_socket_cookie(skb);

    return bpf_sk_redirect_hash(skb, &sp_pairs, &self, 0);
}

char LICENSE[] SEC("license") = "GPL";
