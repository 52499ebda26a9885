/* SPDX-License-Identifier: Apache-2.0 */
/*
 * log.h - a program's log on stderr (orderd's, idem-gateway's): one line per request (what a person
 * tails, or a collector parses in the JSON form), and a few lines about the process itself (start,
 * stop, sweeps, failures).  stdout is kept for the one "listening on" line and for command output.
 */
#ifndef IDEM_UTIL_LOG_H
#define IDEM_UTIL_LOG_H

enum log_format { LOG_TEXT = 0, LOG_JSON = 1 };

struct logger {
    enum log_format format;
};

/*
 * One request: text "METHOD PATH STATUS OUTCOME DURATION_MS PRINCIPAL", or a JSON object with
 * ts, method, path, status, outcome, duration_ms and principal.  `principal` may be NULL ("-").
 */
void log_request(const struct logger *lg, const char *method, const char *path, int status,
                 const char *outcome, double duration_ms, const char *principal);

/*
 * Appends `s` for a person's terminal: control bytes (a newline forging a line, ESC driving the
 * terminal), backslashes and every byte outside ASCII (C1 controls among them) as \xNN.  The text
 * log lines use it; so does any command that prints what a user or a provider wrote.
 */
struct strbuf;
void log_escape_text(struct strbuf *sb, const char *s);

/*
 * For an event loop thread, which calls it each time before it waits for events: writes the lines
 * the thread held back, in one write(2); then, with keep_holding 1, holds back its next lines
 * until the next call (or until they pass 64 KiB), so a busy loop writes its request log once per
 * turn rather than once per request.  A line is held for one turn of the loop at most: a crash
 * loses the lines of that turn only.  With keep_holding 0 (the loop ends) lines go out at once
 * again.  Threads that never call it write each line at once.
 */
void log_thread_flush(int keep_holding);
/* log_thread_flush(!last), in the shape of http_server_options.before_wait (ctx unused). */
void log_before_wait(void *ctx, int last);

/* A line about the process: "<program_name>: LEVEL: message" or {"ts","level","msg"}. */
void log_msg(const struct logger *lg, const char *level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* IDEM_UTIL_LOG_H */
