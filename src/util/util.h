/* SPDX-License-Identifier: Apache-2.0 */
/*
 * util.h - the small helpers orderd and provider-sim both lean on: allocation that dies with a
 * message instead of returning NULL (a service that cannot allocate a few bytes cannot answer
 * anyone truthfully), hex, random bytes, clocks, UTC timestamps, strict number parsing of
 * untrusted text.  Part of idem_util (src/util/), the programs' static library, which links
 * nothing of idem's: JSON text in and out is src/http/jdoc.h.
 */
#ifndef IDEM_UTIL_UTIL_H
#define IDEM_UTIL_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "ascii.h" /* hex_encode, hex_value, ascii_ncaseeq */

/*
 * The name die() and the log lines start with ("orderd", "provider-sim").  Each program defines
 * it once; it is a constant, not state.
 */
extern const char program_name[];

/* Prints "<program_name>: fatal: <message>" on stderr and exits with status 1. */
void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/*
 * Ends the whole process at once with `status`, as kill -9 would end it: no atexit handlers, no
 * flushing, and the other threads do nothing more.  _exit() alone does not promise the last part
 * under ThreadSanitizer, whose _exit() keeps every thread running for its atexit_sleep_ms (1 s by
 * default) before the process ends.  For orderd's crash test hooks.
 */
void exit_at_once(int status) __attribute__((noreturn));

/* Allocators that never return NULL: they die on failure. */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *xstrndup(const char *s, size_t n);
/* Dies with "out of memory" when `p` is NULL; returns `p` (for jansson's constructors). */
void *xcheck(void *p);

/*
 * Decodes the hex text `in` (an even number of hex digits) into `out`, at most `cap` bytes.
 * Returns 0 and *out_len, or -1 for bad digits, an odd length or too much data.
 */
int hex_decode(const char *in, unsigned char *out, size_t cap, size_t *out_len);

/* Fills `buf` with `n` bytes from OpenSSL's CSPRNG; dies if it cannot (no entropy: no tokens). */
void random_bytes(unsigned char *buf, size_t n);

/*
 * The SHA-256 of `len` bytes at `data` into `out` (OpenSSL, its digest fetched once: cheaper than
 * SHA256() or EVP_sha256() on every call).  Dies if OpenSSL fails, which it only does without
 * memory.
 */
#define SHA256_BYTES 32
void sha256_bytes(const void *data, size_t len, unsigned char out[SHA256_BYTES]);

/* The clocks and the sleep: common/clock.h's clock_mono_ms(), clock_wall_ms()... */
#include "clock.h"

/*
 * Waits until `fd` is ready for `events` (poll(2)'s) or the clock_mono_ms() deadline passes,
 * going on after signals: 1 ready, 0 timed out, -1 with errno.
 */
int fd_wait(int fd, short events, int64_t deadline_ms);

/*
 * Reads `fd` to its end into a new NUL-terminated buffer of at most `max` bytes: 0 with *out and
 * *len, or -1 with errno (EFBIG: more than `max` bytes; else the read's own).  A buffer given up
 * is wiped first, since what it held may be a secret.  Dies if memory runs out.
 */
int read_fd_capped(int fd, size_t max, char **out, size_t *len);

/*
 * read_fd_capped() of the file at `path`: 0, or -1 with errno (the open's, or the read's).  With
 * READ_FILE_REGULAR, a path that is not a regular file (a FIFO or a device, which could block or
 * never end; a directory) is refused with EINVAL, and the open itself never waits for a FIFO's
 * writer.  Without it, anything that can be read is: `-d @<(cmd)` reads a pipe.
 */
#define READ_FILE_REGULAR 1u
int read_file_capped(const char *path, size_t max, unsigned flags, char **out, size_t *len);

/* Moves `*iov` (`*n` buffers) past `done` bytes a writev() or sendmsg() took. */
struct iovec;
void iov_advance(struct iovec **iov, int *n, size_t done);

#define ISO8601_LEN 24 /* "2026-12-02T13:00:00.000Z" */
/* Formats `ms` since the epoch as ISO-8601 UTC with milliseconds into `out` (ISO8601_LEN + 1). */
void iso8601_ms(int64_t ms, char out[ISO8601_LEN + 1]);

/*
 * Parses the whole of `s` as a decimal integer in [min, max]: digits with an optional leading
 * '-', no spaces, no '+', no trailing bytes.  Returns 0 and *out, or -1.
 */
int parse_int64(const char *s, int64_t min, int64_t max, int64_t *out);

/*
 * Parses the whole of `s` as a finite decimal number in [min, max] ("0.5", "-1", "2e3"; not
 * " 1", "inf" or "1x").  Returns 0 and *out, or -1.
 */
int parse_double(const char *s, double min, double max, double *out);

/* Number of code points of the UTF-8 string `s` (continuation bytes are not counted). */
size_t utf8_length(const char *s);

#endif /* IDEM_UTIL_UTIL_H */
