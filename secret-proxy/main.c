/* sandfleet-secret-proxy: parse config, build objects, run the loop, tear down. */
#include "proxy.h"
#include "sf_log.h"

#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const sf_cfg_entry cfg_table[] = {
    SF_COMMON_CFG_ENTRIES(sp_cfg),
    SF_CFG_S(sp_cfg, proxy_control_socket, "/var/lib/sandfleet/proxy.sock",
             "Unix socket the worker registers sandboxes on (mode 0600)"),
    SF_CFG_S(sp_cfg, secrets_key_file, "/var/lib/sandfleet/secrets.key",
             "master key that opens sealed secrets (created 0600 when absent)"),
    SF_CFG_S(sp_cfg, proxy_ca_cert_file, "/var/lib/sandfleet/egress-ca.pem",
             "the deployment's egress CA certificate (sandboxes trust it)"),
    SF_CFG_S(sp_cfg, proxy_ca_key_file, "/var/lib/sandfleet/egress-ca.key",
             "the egress CA's private key (created 0600 with the certificate)"),
    SF_CFG_S(sp_cfg, proxy_upstream_ca_file, "",
             "PEM bundle that upstream certificates are checked against (empty: system's)"),
    SF_CFG_S(sp_cfg, proxy_resolv_conf, "/etc/resolv.conf", "nameservers the proxy asks"),
    SF_CFG_S(sp_cfg, proxy_hosts_file, "/etc/hosts", "hosts file read before DNS (empty: none)"),
    SF_CFG_S(sp_cfg, egress_default, "deny",
             "deny: a sandbox reaches only what allow_out opens; allow: everything not denied"),
    SF_CFG_S(sp_cfg, proxy_platform_addrs, "",
             "IPv4 addresses/CIDRs of the platform's services (Redis, Kafka, gateway), "
             "unreachable unless allowed by address; this host's own are always added"),
    SF_CFG_B(sp_cfg, proxy_refuse_unmatched, "0",
             "refuse (403) requests carrying a placeholder to a host its secret is not for, "
             "instead of sending the placeholder unchanged"),
    SF_CFG_I(sp_cfg, proxy_http_port, "3128", 1, 65535, "explicit proxy port in each sandbox"),
    SF_CFG_I(sp_cfg, proxy_transparent_port, "3129", 1, 65535,
             "port that nftables redirects a sandbox's TCP to"),
    SF_CFG_I(sp_cfg, proxy_dns_port, "53", 1, 65535, "DNS port in each sandbox"),
    SF_CFG_I(sp_cfg, proxy_max_sandboxes, "1024", 1, 100000, "sandboxes this proxy serves"),
    SF_CFG_I(sp_cfg, proxy_max_conns, "256", 1, 100000, "open connections per sandbox"),
    SF_CFG_I(sp_cfg, netlog_cap, "1000", 10, 100000, "network log entries kept per sandbox"),
    SF_CFG_I(sp_cfg, secret_refresh_ms, "2000", 100, 3600000,
             "bound secrets are re-read this often (rotation and deletion take effect)"),
    SF_CFG_I(sp_cfg, proxy_idle_timeout_ms, "300000", 1000, 86400000,
             "a connection idle this long is closed"),
    SF_CFG_I(sp_cfg, proxy_connect_timeout_ms, "10000", 100, 600000, "upstream connect timeout"),
    SF_CFG_I(sp_cfg, proxy_sniff_timeout_ms, "1000", 10, 60000,
             "a transparent connection silent this long is treated as plain TCP"),
};

int main(int argc, char **argv)
{
    static sp_ctx ctx;
    char why[512];
    int rc = 1;

    ctx.host_netns = -1;
    switch (sf_config_main(argc, argv, "sandfleet-secret-proxy", cfg_table,
                           SF_ARRAY_LEN(cfg_table), &ctx.cfg)) {
    case 1:
        return 0;
    case -1:
        return 2;
    }
    if (strcmp(ctx.cfg.egress_default, "deny") && strcmp(ctx.cfg.egress_default, "allow")) {
        fprintf(stderr, "sandfleet-secret-proxy: egress_default must be deny or allow.\n");
        return 2;
    }
    if (sf_daemon_init(&ctx.d, "secret-proxy", &ctx.cfg.common) < 0)
        goto out;
    ctx.policy.default_allow = !strcmp(ctx.cfg.egress_default, "allow");
    if (sp_policy_add_platform(&ctx.policy, ctx.cfg.proxy_platform_addrs, why, sizeof(why)) < 0 ||
        sf_secrets_key_load(ctx.cfg.secrets_key_file, ctx.master_key, why, sizeof(why)) < 0 ||
        !(ctx.tls = sp_tls_new(&ctx.cfg, why, sizeof(why))) ||
        !(ctx.resolver = sp_resolver_new(ctx.d.base, ctx.cfg.proxy_resolv_conf,
                                         ctx.cfg.proxy_hosts_file, why, sizeof(why))) ||
        !(ctx.redis = sf_redis_new(ctx.d.base, ctx.cfg.common.redis_url, why, sizeof(why)))) {
        sf_error("msg=\"cannot start\" err=\"%s\"", why);
        goto out;
    }
    sp_policy_add_host_addrs(&ctx.policy);
    sf_id_new(ctx.instance, "sp_");
    if ((ctx.host_netns = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC)) < 0) {
        sf_error("msg=\"cannot open the proxy's own network namespace\"");
        goto out;
    }
    if (!(ctx.sandboxes = sf_map_new((size_t)ctx.cfg.proxy_max_sandboxes)) ||
        sp_refresh_start(&ctx) < 0 || sp_ctl_start(&ctx, why, sizeof(why)) < 0) {
        sf_error("msg=\"cannot start\" err=\"%s\"", why);
        goto out;
    }
    sf_info("msg=\"secret-proxy up\" control=%s default=%s redis=%s ca=%s instance=%s",
            ctx.cfg.proxy_control_socket, ctx.cfg.egress_default, ctx.cfg.common.redis_url,
            ctx.cfg.proxy_ca_cert_file, ctx.instance);
    sf_daemon_ready();
    event_base_dispatch(ctx.d.base);
    rc = 0;
out:
    if (ctx.sandboxes)
        sp_sandboxes_free_all(&ctx);
    sf_redis_free(ctx.redis); /* answers registrations still waiting for secrets */
    sp_ctl_stop(&ctx);
    sp_resolver_free(ctx.resolver);
    sp_tls_free(ctx.tls);
    sf_map_free(ctx.sandboxes);
    if (ctx.ev_refresh)
        event_free(ctx.ev_refresh);
    if (ctx.host_netns >= 0)
        close(ctx.host_netns);
    sp_policy_fini(&ctx.policy);
    sodium_memzero(ctx.master_key, sizeof(ctx.master_key));
    sf_daemon_fini(&ctx.d);
    sf_config_free(cfg_table, SF_ARRAY_LEN(cfg_table), &ctx.cfg);
    return rc;
}
