/* netns: what the worker does to a sandbox's network namespace so that all its egress
 * goes through the secret-proxy, and the files the sandbox needs (its resolver, the
 * egress CA in a trust bundle). Library code: no logging; blocking (it runs `ip` and
 * `nft` in a child that entered the namespace), so call it off the event loop.
 *
 * After sp_netns_setup() the namespace holds: lo up; a veth pair sf0/sf1 with both ends
 * inside it, sf0 (169.254.77.2/30) carrying the default route, so connects reach the
 * nftables hooks and go nowhere else (nothing links the namespace to the host: there is no
 * path out of it but the proxy's listeners);
 * IPv6 disabled; table "ip sandfleet": every TCP connection redirected to the transparent
 * listener, every UDP/53 packet to the proxy's resolver, everything else dropped (also for
 * traffic entering from a VM's tap, which may also reach the explicit proxy and the
 * resolver at the namespace's own addresses); table "ip6 sandfleet6" drops all IPv6.
 * One exception: a socket the worker made in the namespace with SO_MARK
 * SP_NETNS_PREVIEW_MARK (CAP_NET_ADMIN or CAP_NET_RAW over the namespace sets it;
 * a jail's may: its CAP_NET_RAW allows it, and such a connect still reaches nothing)
 * reaches SP_NETNS_PREVIEW_GUEST:SP_NETNS_PREVIEW_PORT as it is: the preview ingress to a
 * VM guest agent's relay (worker/driver/driver.h preview_addr). */
#ifndef SP_NETNS_H
#define SP_NETNS_H

#include <jansson.h>
#include <stddef.h>

#define SP_NETNS_BUNDLE "sandfleet-ca-bundle.pem" /* under etc/ssl/certs/ in the sandbox */
/* sf0's address: where a sandbox reaches the explicit proxy (HTTP_PROXY), from a jail (a
 * local address) and from a VM behind a tap in the namespace alike. */
#define SP_NETNS_PROXY_ADDR "169.254.77.2"
/* = the worker's WK_PREVIEW_MARK and WK_PREVIEW_RELAY_PORT (worker/preview.c checks) */
#define SP_NETNS_PREVIEW_MARK "0x53465056"
#define SP_NETNS_PREVIEW_PORT "49983"
#define SP_NETNS_PREVIEW_GUEST "169.254.78.2" /* a VM guest's side of its link */

typedef struct sp_netns_opts {
    int transparent_port; /* the proxy's proxy_transparent_port (3129) */
    int dns_port;         /* the proxy's proxy_dns_port (53) */
    int http_port;        /* the proxy's proxy_http_port (3128): open to a VM's tap */
} sp_netns_opts;

/* 0, or a negative errno with the failing step's message in why. */
int sp_netns_setup(int netns_fd, const sp_netns_opts *o, char *why, size_t whylen);

/* Writes etc_dir/resolv.conf ("nameserver 127.0.0.1") and
 * etc_dir/ssl/certs/SP_NETNS_BUNDLE (the system's CA bundle, when present, plus ca_file),
 * creating the folders. 0 or -errno with why. */
int sp_netns_write_files(const char *etc_dir, const char *ca_file, char *why, size_t whylen);

/* The environment a sandbox gets besides the proxy variables from the register reply:
 * SSL_CERT_FILE, REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE, NODE_EXTRA_CA_CERTS, GIT_SSL_CAINFO,
 * all pointing at /etc/ssl/certs/SP_NETNS_BUNDLE. A new JSON object. */
json_t *sp_netns_ca_env(void);

#endif
