/*
 * util.h - the small helpers of provider-sim: allocation that dies instead of returning NULL (a
 * simulator that cannot allocate a few bytes has nothing truthful to say), random numbers from
 * OpenSSL, clocks, strict number parsing, ids, JSON text and the log on stderr.
 */
#ifndef SIM_UTIL_H
#define SIM_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

/* Prints "provider-sim: fatal: <message>" on stderr and exits with status 1. */
void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

void *xmalloc(size_t n);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
/* Dies with "out of memory" when `p` is NULL; returns `p` (for jansson's constructors). */
void *xcheck(void *p);

/* One line "provider-sim: LEVEL: message" on stderr, written with one call. */
void log_msg(const char *level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Writes 2*n lowercase hex digits of `in` and a NUL into `out`. */
void hex_encode(const unsigned char *in, size_t n, char *out);

/* `prefix` and 24 random hex digits: "ch_3f9c...".  `out` holds at least strlen(prefix) + 25. */
void new_id(const char *prefix, char *out, size_t cap);

/* A uniform random number in [0, 1) from OpenSSL's CSPRNG. */
double random_unit(void);

int64_t wall_ms(void);
int64_t mono_ms(void);
void sleep_ms(int64_t ms);

/* The whole of `s` as a decimal integer in [min, max]; 0 and *out, or -1. */
int parse_int64(const char *s, int64_t min, int64_t max, int64_t *out);
/* The whole of `s` as a number in [0, 1]; 0 and *out, or -1. */
int parse_rate(const char *s, double *out);

/* Compact JSON text of `doc`, members in insertion order (new, free with free()). */
char *json_text(const json_t *doc, size_t *len);

/* A JSON number that is a whole number in [min, max] (jansson integers or reals). */
int json_whole(const json_t *v, int64_t min, int64_t max, int64_t *out);

#endif /* SIM_UTIL_H */
