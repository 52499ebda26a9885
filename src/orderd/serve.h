/* SPDX-License-Identifier: Apache-2.0 */
/*
 * serve.h - `orderd serve`: the server's whole life, from opening the store to a clean stop on
 * SIGINT or SIGTERM.
 */
#ifndef ORDERD_SERVE_H
#define ORDERD_SERVE_H

struct orderd_config;

/* Runs the server until a stop signal.  Returns the process exit status (0 after a clean stop). */
int serve_run(const struct orderd_config *cfg);

#endif /* ORDERD_SERVE_H */
