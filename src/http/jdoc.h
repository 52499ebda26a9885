/* SPDX-License-Identifier: Apache-2.0 */
/*
 * jdoc.h - JSON documents in and out of the programs: the compact text of a document, and
 * untrusted text parsed with its nesting bounded first by libidem's scan (idem_json_nesting), so
 * jansson never recurses deeper than IDEM_JSON_MAX_DEPTH on a worker's stack.  Part of idem_http
 * (src/http/), which may use libidem; src/util may not.
 */
#ifndef IDEM_HTTP_JDOC_H
#define IDEM_HTTP_JDOC_H

#include <stddef.h>

#include <jansson.h>

/* Compact JSON text of `doc`, members in insertion order (new, free()); `len` may be NULL. */
char *jdoc_text(const json_t *doc, size_t *len);

/*
 * json_loadb() for untrusted text: nesting deeper than IDEM_JSON_MAX_DEPTH (64) is refused before
 * jansson recurses into it (it would go 2048 levels deep on a worker's stack), with a sentence in
 * err->text like any parse error.
 */
json_t *jdoc_load(const char *text, size_t len, size_t flags, json_error_t *err);

#endif /* IDEM_HTTP_JDOC_H */
