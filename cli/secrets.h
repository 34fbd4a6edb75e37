/* sandfleet secrets: the admin side of the secrets store (state/sf_secrets.h). */
#ifndef SF_CLI_SECRETS_H
#define SF_CLI_SECRETS_H

/* argv[0] is "secrets". Returns the process exit code. */
int cli_secrets(int argc, char **argv);

#endif
