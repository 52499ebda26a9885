/* SPDX-License-Identifier: Apache-2.0 */
/*
 * report.c - the verdicts of a run and their two renderings: a table for people, and one JSON
 * object for machines (CI, dashboards), both carrying the evidence each verdict rests on so that
 * a FAIL can be understood without re-running anything.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "check.h"
#include "banned.h"

const char *ck_verdict_name(enum ck_verdict v)
{
    switch (v) {
    case CK_PASS:
        return "PASS";
    case CK_FAIL:
        return "FAIL";
    case CK_WARN:
        return "WARN";
    case CK_SKIP:
        return "SKIP";
    }
    return "?";
}

struct ck_result *ck_report_add(struct ck_report *rep, const char *id, const char *title,
                                enum ck_verdict v, const char *fmt, ...)
{
    struct ck_result *r;
    va_list ap;

    if (rep->n == sizeof(rep->results) / sizeof(rep->results[0])) {
        fputs("idem-check: too many results (internal limit)\n", stderr);
        exit(CK_EXIT_FAIL);
    }
    r = &rep->results[rep->n++];
    r->id = id;
    r->title = title;
    r->verdict = v;
    va_start(ap, fmt);
    if (vsnprintf(r->evidence, sizeof(r->evidence), fmt, ap) < 0)
        r->evidence[0] = '\0';
    va_end(ap);
    return r;
}

int ck_report_failed(const struct ck_report *rep)
{
    for (size_t i = 0; i < rep->n; i++)
        if (rep->results[i].verdict == CK_FAIL)
            return 1;
    return 0;
}

static void count(const struct ck_report *rep, size_t counts[4])
{
    memset(counts, 0, 4 * sizeof(counts[0]));
    for (size_t i = 0; i < rep->n; i++)
        counts[rep->results[i].verdict]++;
}

void ck_report_print_table(const struct ck_report *rep, const char *target)
{
    size_t c[4];

    printf("idem-check conformance: %s\n\n", target);
    printf("%-6s %-22s %s\n", "RESULT", "CHECK", "EXPECTED / EVIDENCE");
    for (size_t i = 0; i < rep->n; i++) {
        const struct ck_result *r = &rep->results[i];
        printf("%-6s %-22s %s\n", ck_verdict_name(r->verdict), r->id, r->title);
        printf("%-6s %-22s   %s\n", "", "", r->evidence);
    }
    count(rep, c);
    printf("\n%zu checks: %zu PASS, %zu FAIL, %zu WARN, %zu SKIP\n", rep->n, c[CK_PASS], c[CK_FAIL],
           c[CK_WARN], c[CK_SKIP]);
}

void ck_report_print_json(const struct ck_report *rep, const char *target, int exit_code)
{
    json_t *root = json_object();
    json_t *checks = json_array();
    json_t *summary = json_object();
    size_t c[4];
    char *text;

    if (!root || !checks || !summary) {
        fputs("idem-check: out of memory\n", stderr);
        exit(CK_EXIT_FAIL);
    }
    for (size_t i = 0; i < rep->n; i++) {
        const struct ck_result *r = &rep->results[i];
        json_array_append_new(checks, json_pack("{s:s, s:s, s:s, s:s}", "id", r->id, "title",
                                                r->title, "result", ck_verdict_name(r->verdict),
                                                "evidence", r->evidence));
    }
    count(rep, c);
    json_object_set_new(summary, "pass", json_integer((json_int_t)c[CK_PASS]));
    json_object_set_new(summary, "fail", json_integer((json_int_t)c[CK_FAIL]));
    json_object_set_new(summary, "warn", json_integer((json_int_t)c[CK_WARN]));
    json_object_set_new(summary, "skip", json_integer((json_int_t)c[CK_SKIP]));
    json_object_set_new(root, "tool", json_string("idem-check"));
    json_object_set_new(root, "mode", json_string("conformance"));
    json_object_set_new(root, "target", json_string(target));
    json_object_set_new(root, "checks", checks);
    json_object_set_new(root, "summary", summary);
    json_object_set_new(root, "exitCode", json_integer(exit_code));
    text = json_dumps(root, JSON_INDENT(2) | JSON_ENSURE_ASCII);
    if (!text) {
        fputs("idem-check: cannot render the JSON report\n", stderr);
        exit(CK_EXIT_FAIL);
    }
    puts(text);
    free(text);
    json_decref(root);
}
