/* SPDX-License-Identifier: Apache-2.0 */
/*
 * http_limits_options.h - the HTTP limit flags every serving program takes (--max-connections,
 * --head-timeout-ms... http_server.h's HTTP_LIMITS_FLAGS) as a group of rows of its option table
 * (src/util/options.h): OPT_HTTP_LIMITS(&limits) among the rows adds their block of --help and
 * one row a flag, each value checked by http_limits_flag().
 */
#ifndef IDEM_HTTP_HTTP_LIMITS_OPTIONS_H
#define IDEM_HTTP_HTTP_LIMITS_OPTIONS_H

#include "http_server.h"
#include "options.h"

/*
 * A limit row's callback.  The rows of a group carry no pointer of their own: the group's last
 * row (its --help block) holds the struct http_limits, found by walking on over the group.
 */
option_callback http_limits_option;

#define HTTP_LIMITS_OPTION_ROW(flag, field, min, max)                                              \
    OPT_CALLBACK(0, flag, NULL, "N", NULL, http_limits_option),

/* The group: `limits` (struct http_limits *) receives the flags' values. */
#define OPT_HTTP_LIMITS(limits)                                                                    \
    HTTP_LIMITS_FLAGS(HTTP_LIMITS_OPTION_ROW)                                                      \
    {                                                                                              \
        .kind = OPTION_TEXT, .help = http_limits_help, .value = (limits)                           \
    }

/*
 * HTTPS for the listener: --tls-cert and --tls-key into `limits` (struct http_limits *), whose
 * server then makes its TLS context (http_server.h); SIGHUP reads them again
 * (http_server_reload_tls) in the programs that take these rows.
 */
#define OPT_HTTP_TLS(limits)                                                                       \
    OPT_STRING(0, "tls-cert", &(limits)->tls_cert_file, "FILE",                                    \
               "serve HTTPS with this certificate chain (PEM, leaf first;\n"                       \
               "ECDSA or RSA), with --tls-key; SIGHUP reads both again"),                          \
        OPT_STRING(0, "tls-key", &(limits)->tls_key_file, "FILE",                                  \
                   "the private key (PEM) of --tls-cert")

#endif /* IDEM_HTTP_HTTP_LIMITS_OPTIONS_H */
