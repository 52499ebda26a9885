/* SPDX-License-Identifier: Apache-2.0 */
/*
 * log.c - writes a program's log lines (orderd, idem-gateway) to stderr.  Each line is assembled in
 * memory first and written with one call, so lines written at once (event loops, workers,
 * background threads) never interleave.  Paths come from strangers: the text form escapes anything
 * that is not visible ASCII (a path with a space or a newline must not forge a second log line);
 * the JSON form lets jansson escape.
 */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "strbuf.h"
#include "util.h"
#include "banned.h"

/*
 * One write(2) per line, not stdio: stderr's FILE lock would be held across the system call, so
 * concurrent requests queued on it (a futex sleep and wake-up each) while one line reached the
 * disk's page cache.  The kernel keeps one write's bytes together (a regular file's offset is
 * taken and advanced under the file's lock; a pipe keeps writes of up to PIPE_BUF whole).
 */
static void write_all(const char *buf, size_t len)
{
    size_t off = 0;
    ssize_t n;

    while (off < len) {
        n = write(STDERR_FILENO, buf + off, len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break; /* nowhere to log to: the request still gets its answer */
        off += (size_t)n;
    }
}

/*
 * An event loop thread's held-back lines (log_thread_flush): whole lines only, written in one
 * call when the loop is about to wait, or as soon as they pass HOLD_MAX.
 */
#define HOLD_MAX 65536
static _Thread_local struct {
    int on;
    struct strbuf lines;
} held;

static void write_line(struct strbuf *sb)
{
    strbuf_addch(sb, '\n');
    if (!held.on) {
        write_all(sb->buf, sb->len);
        return;
    }
    strbuf_add(&held.lines, sb->buf, sb->len);
    if (held.lines.len >= HOLD_MAX) {
        write_all(held.lines.buf, held.lines.len);
        strbuf_reset(&held.lines);
    }
}

void log_thread_flush(int keep_holding)
{
    if (held.lines.len > 0)
        write_all(held.lines.buf, held.lines.len);
    strbuf_reset(&held.lines);
    held.on = keep_holding;
    if (!keep_holding)
        strbuf_release(&held.lines);
}

void log_before_wait(void *ctx, int last)
{
    (void)ctx;
    log_thread_flush(!last);
}

static void add_escaped(struct strbuf *sb, const char *s)
{
    static const char digits[] = "0123456789ABCDEF";
    const unsigned char *p;

    for (p = (const unsigned char *)s; *p != '\0'; p++) {
        if (*p > 0x20 && *p < 0x7f && *p != '%') {
            strbuf_addch(sb, (char)*p);
        } else {
            strbuf_addch(sb, '%');
            strbuf_addch(sb, digits[*p >> 4]);
            strbuf_addch(sb, digits[*p & 0x0f]);
        }
    }
}

/* Spaces stay; a message may quote a provider's error text or a client's string (log.h). */
void log_escape_text(struct strbuf *sb, const char *s)
{
    static const char digits[] = "0123456789ABCDEF";

    for (const unsigned char *p = (const unsigned char *)s; *p != '\0'; p++) {
        if (*p >= 0x20 && *p < 0x7f && *p != '\\') {
            strbuf_addch(sb, (char)*p);
        } else {
            strbuf_add(sb, "\\x", 2);
            strbuf_addch(sb, digits[*p >> 4]);
            strbuf_addch(sb, digits[*p & 0x0f]);
        }
    }
}

static void add_json_line(struct strbuf *sb, json_t *obj)
{
    char *text = xcheck(json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII |
                                            JSON_REAL_PRECISION(12)));

    strbuf_adds(sb, text);
    free(text);
}

void log_request(const struct logger *lg, const char *method, const char *path, int status,
                 const char *outcome, double duration_ms, const char *principal)
{
    struct strbuf sb = STRBUF_INIT;
    char ts[ISO8601_LEN + 1];
    json_t *obj = NULL;
    unsigned long long us;

    if (lg->format == LOG_JSON) {
        iso8601_ms(clock_wall_ms(), ts);
        obj = xcheck(json_object());
        json_object_set_new(obj, "ts", xcheck(json_string(ts)));
        json_object_set_new(obj, "method", xcheck(json_string(method)));
        /* A path that is not UTF-8 cannot be a JSON string; escape it like the text form. */
        if (json_object_set_new(obj, "path", json_string(path)) != 0) {
            struct strbuf esc = STRBUF_INIT;
            add_escaped(&esc, path);
            json_object_set_new(obj, "path", xcheck(json_string(esc.buf ? esc.buf : "")));
            strbuf_release(&esc);
        }
        json_object_set_new(obj, "status", xcheck(json_integer(status)));
        json_object_set_new(obj, "outcome", xcheck(json_string(outcome)));
        /* Whole microseconds: more digits would only be noise. */
        json_object_set_new(
            obj, "duration_ms",
            xcheck(json_real((double)(int64_t)(duration_ms * 1000.0 + 0.5) / 1000.0)));
        json_object_set_new(obj, "principal",
                            principal ? xcheck(json_string(principal)) : json_null());
        add_json_line(&sb, obj);
        json_decref(obj);
    } else {
        add_escaped(&sb, method);
        strbuf_addch(&sb, ' ');
        add_escaped(&sb, path);
        /* By hand, not printf: this runs for every request (duration in whole microseconds). */
        us = duration_ms > 0 ? (unsigned long long)(duration_ms * 1000.0 + 0.5) : 0;
        strbuf_addch(&sb, ' ');
        strbuf_add_uint(&sb, status > 0 ? (unsigned)status : 0);
        strbuf_addch(&sb, ' ');
        strbuf_adds(&sb, outcome);
        strbuf_addch(&sb, ' ');
        strbuf_add_uint(&sb, us / 1000);
        strbuf_addch(&sb, '.');
        strbuf_addch(&sb, (char)('0' + us / 100 % 10));
        strbuf_addch(&sb, (char)('0' + us / 10 % 10));
        strbuf_addch(&sb, (char)('0' + us % 10));
        strbuf_addch(&sb, ' ');
        add_escaped(&sb, principal ? principal : "-");
    }
    write_line(&sb);
    strbuf_release(&sb);
}

void log_msg(const struct logger *lg, const char *level, const char *fmt, ...)
{
    struct strbuf sb = STRBUF_INIT;
    char msg[1024];
    char ts[ISO8601_LEN + 1];
    json_t *obj = NULL;
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (lg->format == LOG_JSON) {
        iso8601_ms(clock_wall_ms(), ts);
        obj = xcheck(json_object());
        json_object_set_new(obj, "ts", xcheck(json_string(ts)));
        json_object_set_new(obj, "level", xcheck(json_string(level)));
        if (json_object_set_new(obj, "msg", json_string(msg)) != 0)
            json_object_set_new(obj, "msg", xcheck(json_string("(message is not UTF-8)")));
        add_json_line(&sb, obj);
        json_decref(obj);
    } else {
        strbuf_addf(&sb, "%s: %s: ", program_name, level);
        log_escape_text(&sb, msg);
    }
    write_line(&sb);
    strbuf_release(&sb);
}
