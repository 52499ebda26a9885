/* SPDX-License-Identifier: Apache-2.0 */
/*
 * problem.h - RFC 9457 problem documents, as orderd and provider-sim both answer errors:
 * {"type":"/problems/<code>","title","status","detail","code"} with Content-Type
 * application/problem+json.  The title comes from one table keyed by the stable code, so the same
 * code carries the same title wherever it is raised and a client can switch on `code` alone.
 */
#ifndef IDEM_HTTP_PROBLEM_H
#define IDEM_HTTP_PROBLEM_H

#include <stddef.h>

#include <jansson.h>

#define CONTENT_TYPE_PROBLEM "application/problem+json"

/* The compact bytes of a problem document (new, free with free()). */
char *problem_body(int status, const char *code, const char *detail, size_t *len);
/* The same with the members of `extra` (borrowed, may be NULL) added after "code". */
char *problem_body_ext(int status, const char *code, const char *detail, const json_t *extra,
                       size_t *len);

#endif /* IDEM_HTTP_PROBLEM_H */
